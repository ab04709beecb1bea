//! `--between EXPORTER IMPORTER`: the forecast between two running processes this program did not start,
//! read from outside ([`outside`]): for an operator on the node (root, or a pod with `hostPID`) whose two pods
//! run images without this program in them. Each process's place is read from `/proc`, the pair is compared
//! as a served run compares its joiners with its server ([`Placement`]), and the forecast of every kind of
//! handle and every library path is given both ways (each process as the exporter), with the least change in
//! Docker's and Kubernetes' words. No GPU and no CUDA: nothing of either process is entered, signalled,
//! stopped or run. `--json` writes the same as data.

use std::process::ExitCode;

use anyhow::Result;
use serde::Serialize;

use crate::outcome::EXIT_FAILURE;
use crate::output::READER_GONE_STATUS;
use crate::placement::outside::with_outside;
use crate::placement::outside::{self, Loaded, Observed, ProcDir};
use crate::placement::share::compare;
use crate::placement::{Placement, ProcessPlacement};
use crate::report::OwnDocument;
use crate::report::verdict::is_reader_gone;

/// What `--between` answers, as `--json` writes it.
#[derive(Serialize)]
struct Answer {
    status: &'static str,
    /// Each process as read from outside.
    processes: [Observed; 2],
    /// Each direction: the exporter's place and the importer's, as in a served run's `placement`.
    directions: Vec<Placement>,
}

/// What `--between` is asked: the two pids as this process sees them, and its output.
pub(crate) struct Asked<'a> {
    pub exporter: i32,
    pub importer: i32,
    pub json: Option<&'a std::path::Path>,
    pub quiet: bool,
}

/// Runs `--between`: 0 with its answer, 1 where a process cannot be read (which fact, and why), or where
/// the answer cannot be written; 141 where the reader of standard output went away, as for a run. The
/// `--json` path is checked before anything is read, as a run's is (`report::OwnDocument`).
pub(crate) fn main(asked: &Asked) -> ExitCode {
    let json = match asked.json.map(OwnDocument::checked).transpose() {
        Ok(json) => json,
        Err(e) => {
            eprint_line!("simple-ipc: {e:#}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let (text, document) = match answer(asked) {
        Ok(answered) => answered,
        Err(e) => {
            eprint_line!("simple-ipc: --between: {e:#}");
            if let Some(json) = &json {
                let failed = serde_json::json!({ "status": "failed", "reason": format!("{e:#}") });
                if let Err(e) = json.write(&failed) {
                    eprint_line!("simple-ipc: {e:#}");
                }
            }
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match say(&text, &document, json.as_ref(), asked.quiet) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.chain().any(is_reader_gone) => ExitCode::from(READER_GONE_STATUS),
        Err(e) => {
            eprint_line!("simple-ipc: --between: {e:#}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// The answer, in words and as the document.
fn answer(asked: &Asked) -> Result<(String, Answer)> {
    if asked.exporter == asked.importer {
        anyhow::bail!("pid {} is both processes: CUDA IPC is between two", asked.exporter);
    }
    // Each held by its /proc directory from the first read to the last: the pair's facts (an ancestor, a
    // pid number) are read by pid, which names these two processes only while both still run.
    let held = [ProcDir::open(asked.exporter)?, ProcDir::open(asked.importer)?];
    let first = outside::observe_in(&held[0])?;
    let second = outside::observe_in(&held[1])?;
    let directions = vec![direction(&first, &second), direction(&second, &first)];
    for process in &held {
        process.running()?;
    }
    let mut text = format!(
        "Between pid {} ({}) and pid {} ({}), read from /proc: neither was entered, signalled or stopped\n",
        first.pid, first.name, second.pid, second.name
    );
    for process in [&first, &second] {
        text.push_str(&format!("  pid {} ({}): {}\n", process.pid, process.name, libraries_said(process)));
    }
    for (placement, (exporter, importer)) in directions.iter().zip([(&first, &second), (&second, &first)]) {
        text.push_str(&format!("\nWith pid {} exporting to pid {}:\n", exporter.pid, importer.pid));
        text.push_str(&placement.text_between());
    }
    Ok((text, Answer { status: "answered", processes: [first, second], directions }))
}

/// Writes the answer: the document where `--json` asked for it, and the text on standard output (on
/// standard error, where the document has standard output; nowhere with `--quiet`).
fn say(text: &str, document: &Answer, json: Option<&OwnDocument>, quiet: bool) -> Result<()> {
    if let Some(json) = json {
        json.write(document)?;
    }
    match json {
        _ if quiet => Ok(()),
        // Beside the document, as every other line of a run is: its errors are not the answer's.
        Some(json) if json.is_standard_output() => {
            eprint_line!("{}", text.trim_end_matches('\n'));
            Ok(())
        }
        _ => crate::output::text(text),
    }
}

/// The placement of `importer` against `exporter`: the served run's comparison and forecast, with the facts
/// of the pair that only the outside reads (whether the importer is an ancestor of the exporter, the process
/// at the exporter's pid number in the importer's namespace).
fn direction(exporter: &Observed, importer: &Observed) -> Placement {
    let seen = outside::pair(exporter, importer);
    let shares = with_outside(compare(&exporter.place, &importer.place), &seen);
    let process = ProcessPlacement::forecast_for(
        &exporter.place,
        importer.pid.unsigned_abs() as usize,
        importer.place.clone(),
        shares,
    );
    Placement { server: exporter.place.clone(), processes: vec![process], against: None }
}

/// The libraries a process has loaded, and the settings it started with, in words.
fn libraries_said(process: &Observed) -> String {
    let Loaded { nccl, ucx, torch } = &process.loaded;
    let one = |name: &str, mapped: &Option<outside::Mapped>| match mapped {
        Some(m) => format!("{name} {} ({})", m.version.as_deref().unwrap_or("of a version not read"), m.path),
        None => format!("{name} not loaded"),
    };
    let mut said = vec![one("NCCL", nccl), one("UCX", ucx), one("PyTorch", torch)];
    let settings: Vec<String> = process.place.settings.iter().map(|(n, v)| format!("{n}={v}")).collect();
    if !settings.is_empty() {
        said.push(format!("started with {}", settings.join(" ")));
    }
    if let Some(filters) = process.seccomp_filters.filter(|n| *n > 0) {
        said.push(format!("{filters} seccomp filter(s), whose rules cannot be read from outside"));
    }
    said.join("; ")
}
