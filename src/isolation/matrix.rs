//! `--ipc all --isolate KINDS`: the container matrix of this host, from real runs. Each row is one boundary
//! between the exporter (the serving parent) and the importers (the processes that join it), each column
//! one kind of handle that has to cross it; each cell is a whole isolated run of this program, with the
//! user's other options, that tries that handle alone:
//! - a legacy memory handle: `--ipc legacy --sync memops` (no event);
//! - a legacy event handle: `--ipc vmm --sync events` (the memory goes by descriptor, so only the event is
//!   a legacy handle);
//! - a VMM descriptor: `--ipc vmm --sync memops`;
//! - a pool descriptor: `--ipc pool --sync events` (memops cannot order pool memory, so its event comes
//!   too: a failure of the event is said as such);
//! - a fabric handle: `--ipc fabric --sync memops`.
//!
//! Each failing cell is named by the driver's error from the run, and the table ends with each cause and the
//! least sharing that fixes it, as the run diagnosed it. Exit 1 only if a run in the same namespaces failed
//! (then nothing else can be read from the table), 2 if every run was waived, 0 otherwise: a boundary that
//! the driver refuses is a fact of the host, which the table reports.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use nix::sys::signal::Signal;

use super::{Isolation, Kind};
use crate::cli::Cli;
use crate::ipc::Mechanism;
use crate::outcome::Outcome;
use crate::signals;

/// One kind of handle: the run that tries it.
struct Column {
    title: &'static str,
    mechanism: Mechanism,
    sync: &'static str,
}

const COLUMNS: [Column; 5] = [
    Column { title: "legacy memory", mechanism: Mechanism::Legacy, sync: "memops" },
    Column { title: "legacy event", mechanism: Mechanism::Vmm, sync: "events" },
    Column { title: "VMM fd", mechanism: Mechanism::Vmm, sync: "memops" },
    Column { title: "pool fd", mechanism: Mechanism::Pool, sync: "events" },
    Column { title: "fabric", mechanism: Mechanism::Fabric, sync: "memops" },
];

/// One boundary: the `--isolate` of its runs.
struct Boundary {
    title: String,
    isolate: String,
}

/// The boundaries of a container, one at a time, then all of Docker's default set together.
const BOUNDARIES: [(&str, &str, &[Kind]); 7] = [
    ("same namespaces", "none", &[]),
    ("own PID namespaces, other pid numbers", "joiners:pid", &[Kind::Pid]),
    ("own PID namespaces, the same pid number", "pid", &[Kind::Pid]),
    ("own /dev/shm", "shm", &[Kind::Shm]),
    (
        "own SysV IPC, net, UTS, cgroup",
        "ipc,net,uts,cgroup",
        &[Kind::Ipc, Kind::Net, Kind::Uts, Kind::Cgroup],
    ),
    ("own user namespace (root mapped)", "user", &[Kind::User]),
    ("Docker's default set (container)", "container", &Kind::CONTAINER),
];

/// The rows for `asked`: the same namespaces, every boundary made only of asked kinds, and the asked set
/// itself where no row is it.
fn boundaries(asked: &Isolation) -> Vec<Boundary> {
    let mut rows: Vec<Boundary> = BOUNDARIES
        .iter()
        .filter(|(_, _, kinds)| kinds.iter().all(|k| asked.has(*k)))
        .map(|(title, isolate, _)| Boundary { title: (*title).to_owned(), isolate: (*isolate).to_owned() })
        .collect();
    let is_asked = |row: &Boundary| {
        Isolation::parse(&row.isolate).is_ok_and(|i| i.kinds == asked.kinds && !i.joiners_only)
    };
    if !asked.kinds.is_empty() && !rows.iter().any(is_asked) {
        rows.push(Boundary { title: format!("own {}", asked.kinds_arg()), isolate: asked.to_string() });
    }
    rows
}

/// How one cell's run ended.
#[derive(Clone, Debug, PartialEq)]
enum Cell {
    Ok,
    Waived,
    /// The simulation does not model this boundary for this handle.
    NotSimulated,
    /// The driver's error (`CUDA_ERROR_...`, or how the run ended), whether it was the event's, and the
    /// least sharing that fixes it, where the run said.
    Failed {
        error: String,
        event: bool,
        fix: Option<String>,
    },
}

impl Cell {
    fn word(&self) -> String {
        match self {
            Cell::Ok => "ok".to_owned(),
            Cell::Waived => "waived".to_owned(),
            Cell::NotSimulated => "not simulated".to_owned(),
            Cell::Failed { error, event: true, .. } => format!("{} (event)", short(error)),
            Cell::Failed { error, .. } => short(error).to_owned(),
        }
    }
}

/// `INVALID_CONTEXT` for `CUDA_ERROR_INVALID_CONTEXT`: the table's cells are narrow, its notes say it whole.
fn short(error: &str) -> &str {
    error.strip_prefix("CUDA_ERROR_").unwrap_or(error)
}

/// What a failed run's messages say: the driver's error, which handle, and the fix the run gave.
fn classify(code: Option<i32>, output: &str) -> Cell {
    match code {
        Some(0) => return Cell::Ok,
        Some(2) => return Cell::Waived,
        _ => {}
    }
    if output.contains(crate::driver::host::BEYOND_THE_SIMULATION) {
        return Cell::NotSimulated;
    }
    let error = output
        .find("CUDA_ERROR_")
        .map(|at| {
            let rest = &output[at..];
            let end = rest.find(|c: char| !(c.is_ascii_uppercase() || c == '_')).unwrap_or(rest.len());
            rest[..end].to_owned()
        })
        .unwrap_or_else(|| match code {
            Some(code) if code > 128 => format!("stopped (exit {code})"),
            Some(code) => format!("failed (exit {code})"),
            None => "killed".to_owned(),
        });
    let event = output.contains("cuIpcOpenEventHandle");
    let fix = output.find("what fixes it: ").map(|at| {
        let rest = &output[at + "what fixes it: ".len()..];
        let end = rest.find(": cu").or_else(|| rest.find('\n')).unwrap_or(rest.len());
        rest[..end].trim().to_owned()
    });
    Cell::Failed { error, event, fix }
}

pub fn run(cli: &Cli) -> Result<Outcome> {
    let Some(asked) = &cli.isolate else { bail!("internal error: the matrix needs --isolate") };
    let passed_on = passed_on(std::env::args_os().skip(1));
    let json = crate::report::JsonFile::requested();
    let rows = boundaries(asked);
    say!(
        "The container matrix ({} boundaries by {} kinds of handle, each an isolated run of its own)",
        rows.len(),
        COLUMNS.len()
    )?;
    let mut cells: Vec<Vec<Cell>> = Vec::new();
    let bar =
        crate::progress::Bar::start((rows.len() * COLUMNS.len()) as u64, "--ipc all --isolate", cli.quiet);
    for row in &rows {
        let mut line = Vec::new();
        for column in &COLUMNS {
            bar.doing(format!("{} / {}", row.title, column.title));
            let cell = run_cell(&passed_on, row, column)?;
            say!("  {} / {}: {}", row.title, column.title, cell.word())?;
            bar.step_done();
            line.push(cell);
            signals::check()?;
        }
        cells.push(line);
    }
    drop(bar);
    crate::output::text(&table(&rows, &cells))?;
    if !nix::unistd::geteuid().is_root() {
        // (The matrix's own process enters no namespace: it is still the user who started it.)
        say!(
            "(Not root: every isolated run here is in a user namespace of its own too, which the kernel needs.)"
        )?;
    }
    if let Some(json) = json {
        json.write(crate::report::Results::Matrix(document(&rows, &cells)))?;
    }
    let failed = cells.iter().flatten().filter(|c| matches!(c, Cell::Failed { .. })).count();
    let ran = cells.iter().flatten().filter(|c| !matches!(c, Cell::Waived)).count();
    crate::report::note_summary(format!(
        "the container matrix: {} boundaries by {} handles, {failed} of {ran} runs refused across a boundary",
        rows.len(),
        COLUMNS.len()
    ));
    let baseline_failed: Vec<&str> = COLUMNS
        .iter()
        .zip(&cells[0])
        .filter(|(_, cell)| matches!(cell, Cell::Failed { .. }))
        .map(|(column, _)| column.title)
        .collect();
    if !baseline_failed.is_empty() {
        bail!(
            "in the same namespaces, {} failed: nothing across a boundary can be read",
            baseline_failed.join(", ")
        );
    }
    if cells.iter().flatten().all(|c| matches!(c, Cell::Waived)) {
        return Ok(Outcome::Waived);
    }
    Ok(Outcome::Passed)
}

/// The user's arguments less those each cell sets itself.
fn passed_on(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let own = crate::every_mechanism::passed_on(args);
    let mut kept = Vec::new();
    let mut args = own.into_iter();
    while let Some(arg) = args.next() {
        let bytes = arg.as_encoded_bytes();
        if bytes == b"--sync" || bytes == b"--isolate" {
            args.next();
        } else if !(bytes.starts_with(b"--sync=") || bytes.starts_with(b"--isolate=")) {
            kept.push(arg);
        }
    }
    kept
}

/// One isolated run, its output kept (the cell says what it showed), stopped with this process.
fn run_cell(passed_on: &[std::ffi::OsString], row: &Boundary, column: &Column) -> Result<Cell> {
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0(std::env::args_os().next().unwrap_or_else(|| "simple-ipc".into()))
        .args(passed_on)
        .args(["--ipc", column.mechanism.name(), "--sync", column.sync, "--isolate", &row.isolate])
        .stdin(Stdio::null());
    // SAFETY: runs in the forked child before exec; prctl is async-signal-safe and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            // The run must not outlive this process: SIGTERM, which it handles as an orderly stop.
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
        });
    }
    let what = format!("the run of --ipc {} --isolate {}", column.mechanism.name(), row.isolate);
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what} (/proc/self/exe)"))?;
    // Its output is kept as it comes, on threads, so that this process can watch its own stop signals: a
    // signal to it goes on to the run, which stops in order, and then this process stops too.
    let streams: [Option<Box<dyn std::io::Read + Send>>; 2] = [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ];
    let readers: Vec<std::thread::JoinHandle<Vec<u8>>> = streams
        .into_iter()
        .flatten()
        .map(|mut stream| {
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let _ = stream.read_to_end(&mut got);
                got
            })
        })
        .collect();
    let status = loop {
        if let Some(status) = child.try_wait().with_context(|| format!("waiting for {what}"))? {
            break status;
        }
        if let Some(signal) = signals::received() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
            let _ = child.wait();
            return Err(signals::Interrupted(signal).into());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let text: String = readers
        .into_iter()
        .map(|reader| String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned())
        .collect();
    Ok(classify(status.code(), &text))
}

/// The cells for the `--json` document.
fn document(rows: &[Boundary], cells: &[Vec<Cell>]) -> Vec<crate::report::MatrixCell> {
    let mut out = Vec::new();
    for (row, line) in rows.iter().zip(cells) {
        for (column, cell) in COLUMNS.iter().zip(line) {
            let (result, error, event_refused, fix) = match cell {
                Cell::Ok => ("ok", None, None, None),
                Cell::Waived => ("waived", None, None, None),
                Cell::NotSimulated => ("not_simulated", None, None, None),
                Cell::Failed { error, event, fix } => {
                    ("failed", Some(error.clone()), Some(*event), fix.clone())
                }
            };
            out.push(crate::report::MatrixCell {
                boundary: row.title.clone(),
                isolate: row.isolate.clone(),
                handle: column.title.to_owned(),
                ipc: column.mechanism.name().to_owned(),
                sync: column.sync.to_owned(),
                result: result.to_owned(),
                error,
                event_refused,
                fix,
            });
        }
    }
    out
}

/// The table, then each cause with the least sharing that fixes it.
fn table(rows: &[Boundary], cells: &[Vec<Cell>]) -> String {
    let first = rows.iter().map(|r| r.title.len()).max().unwrap_or(0).max("importer vs exporter".len());
    let widths: Vec<usize> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, c)| cells.iter().map(|line| line[i].word().len()).max().unwrap_or(0).max(c.title.len()))
        .collect();
    let mut text = format!("{:<first$}", "importer vs exporter");
    for (column, width) in COLUMNS.iter().zip(&widths) {
        text.push_str(&format!("  {:<width$}", column.title));
    }
    text.push('\n');
    for (row, line) in rows.iter().zip(cells) {
        text.push_str(&format!("{:<first$}", row.title));
        for (cell, width) in line.iter().zip(&widths) {
            text.push_str(&format!("  {:<width$}", cell.word()));
        }
        text.push('\n');
    }
    let mut fixes: Vec<(String, String, Vec<String>)> = Vec::new();
    for (row, line) in rows.iter().zip(cells) {
        for (column, cell) in COLUMNS.iter().zip(line) {
            let Cell::Failed { error, event, fix } = cell else { continue };
            let handle = if *event { "legacy event" } else { column.title };
            let fix = fix.clone().unwrap_or_else(|| "(the run gave no diagnosis: see its output)".to_owned());
            let key = format!("{error} opening a {handle} handle");
            match fixes.iter_mut().find(|(k, f, _)| *k == key && *f == fix) {
                Some((_, _, wheres)) => wheres.push(row.title.clone()),
                None => fixes.push((key, fix, vec![row.title.clone()])),
            }
        }
    }
    for (key, fix, wheres) in fixes {
        let mut wheres = wheres;
        wheres.dedup();
        text.push_str(&format!("\n{key} ({}): what fixes it: {fix}\n", wheres.join("; ")));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_named_by_the_drivers_error_and_its_fix() {
        assert_eq!(classify(Some(0), ""), Cell::Ok);
        assert_eq!(classify(Some(2), "No CUDA devices"), Cell::Waived);
        let said = "Process 0 failed! (exit code 1: opening the event of process 0: the event's file is in its \
                    exporter's /dev/shm: what fixes it: share /dev/shm, or --sync memops: cuIpcOpenEventHandle \
                    failed: CUDA_ERROR_MAP_FAILED (205))";
        let Cell::Failed { error, event, fix } = classify(Some(1), said) else { panic!("a failure") };
        assert_eq!((error.as_str(), event), ("CUDA_ERROR_MAP_FAILED", true));
        assert_eq!(fix.as_deref(), Some("share /dev/shm, or --sync memops"));
        let bare = classify(Some(1), "something else");
        assert_eq!(bare, Cell::Failed { error: "failed (exit 1)".into(), event: false, fix: None });
        let simulated = format!("{}: it opens", crate::driver::host::BEYOND_THE_SIMULATION);
        assert_eq!(classify(Some(1), &simulated), Cell::NotSimulated);
    }

    #[test]
    fn the_rows_are_the_boundaries_made_of_the_asked_kinds() {
        let titles = |asked: &str| -> Vec<String> {
            boundaries(&Isolation::parse(asked).unwrap()).into_iter().map(|b| b.isolate).collect()
        };
        assert_eq!(
            titles("container"),
            ["none", "joiners:pid", "pid", "shm", "ipc,net,uts,cgroup", "container"]
        );
        assert_eq!(titles("pid"), ["none", "joiners:pid", "pid"]);
        assert_eq!(titles("net"), ["none", "net"], "a set that is no row is a row of its own");
        assert_eq!(titles("container,user").len(), 8, "every row, and the asked set whole");
    }

    #[test]
    fn each_cell_sets_its_own_ipc_sync_and_isolate() {
        let args = ["--isolate", "pid", "--sync=memops", "--ipc", "all", "--timeout", "5", "--isolate=shm"];
        let kept = passed_on(args.map(std::ffi::OsString::from));
        assert_eq!(kept, ["--timeout", "5"].map(std::ffi::OsString::from));
    }
}
