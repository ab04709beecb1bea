//! `--ipc all`: each mechanism as a whole run of its own, one after another (this program again, with
//! `--ipc <mechanism>` and the user's other options), then a table of mechanism, result (passed, failed, or
//! waived and why), wall time and the time a child took to open one process's buffer and event. Exit 1 if
//! any failed, 2 if all were waived, 0 otherwise; `--json` carries the same.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::Outcome;
use crate::cli::Cli;
use crate::ipc::Mechanism;
use crate::output::JsonFile;
use crate::signals::{self, Interrupted};

/// How one mechanism's run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    Passed,
    Failed(String),
    Waived(String),
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub mechanism: Mechanism,
    pub ending: Ending,
    pub wall_ms: f64,
    /// The median over the children of their time to open every handle, divided by the process count.
    pub open_one_ms: Option<f64>,
}

pub fn run(cli: &Cli) -> Result<Outcome> {
    let json = cli.json.as_deref().map(JsonFile::create).transpose()?;
    let mut rows = Vec::new();
    for mechanism in Mechanism::ALL {
        say!("== --ipc {}", mechanism.name())?;
        rows.push(run_one(cli, mechanism)?);
        signals::check()?;
    }
    crate::output::text(&table(&rows))?;
    if let Some(json) = json {
        json.write(&json_document(&rows))?;
    }
    outcome(&rows)
}

/// 1 if any failed, 2 if all were waived, 0 otherwise.
pub fn outcome(rows: &[Row]) -> Result<Outcome> {
    let failed: Vec<&str> =
        rows.iter().filter(|r| matches!(r.ending, Ending::Failed(_))).map(|r| r.mechanism.name()).collect();
    if !failed.is_empty() {
        bail!("--ipc all: {} failed", failed.join(", "));
    }
    if rows.iter().all(|r| matches!(r.ending, Ending::Waived(_))) {
        return Ok(Outcome::Waived);
    }
    Ok(Outcome::Passed)
}

/// Runs this program with `--ipc <mechanism>` and the user's options; prints its output as it was.
fn run_one(cli: &Cli, mechanism: Mechanism) -> Result<Row> {
    let json =
        std::env::temp_dir().join(format!("simple-ipc-all-{}-{}.json", std::process::id(), mechanism.name()));
    let mut command = Command::new("/proc/self/exe");
    command.args(["--ipc", mechanism.name(), "--json"]).arg(&json);
    command.args([
        "--procs-per-device",
        &cli.procs_per_device.to_string(),
        "--timeout",
        &cli.timeout.to_string(),
    ]);
    for (on, flag) in
        [(cli.sequential, "--sequential"), (cli.bind_numa, "--bind-numa"), (cli.timings, "--timings")]
    {
        if on {
            command.arg(flag);
        }
    }
    // A descriptor fault is meant for the mechanisms that send descriptors; legacy's run would refuse it.
    if crate::fault::needs_descriptors() && !mechanism.uses_descriptors() {
        command.env_remove(crate::fault::FAULT_ENV);
    }
    let start = Instant::now();
    let out = command.output().context("starting a run of one mechanism (/proc/self/exe)")?;
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    crate::output::text(&stdout)?;
    if !stderr.is_empty() {
        warn!("{}", stderr.trim_end());
    }
    let document = std::fs::read_to_string(&json).unwrap_or_default();
    let _ = std::fs::remove_file(&json);
    let result = match out.status.code() {
        Some(0) => Ending::Passed,
        Some(2) => Ending::Waived(
            stdout
                .lines()
                .rev()
                .find(|l| l.starts_with("No CUDA devices support IPC"))
                .unwrap_or("waived")
                .to_owned(),
        ),
        Some(code) if code > 128 => {
            if let Some(signal) = signals::received() {
                return Err(Interrupted(signal).into());
            }
            Ending::Failed(format!("stopped by signal {}", code - 128))
        }
        other => Ending::Failed(
            stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map_or_else(|| format!("exit status {other:?}"), |line| line.trim().to_owned()),
        ),
    };
    Ok(Row { mechanism, ending: result, wall_ms, open_one_ms: open_one_ms(&document) })
}

/// From a run's JSON: the median over the children of `open_handles`, divided by the process count.
pub fn open_one_ms(document: &str) -> Option<f64> {
    let processes: f64 = number_after(document, "\"processes\": ")?;
    let children = document.split("\"children\": [").nth(1)?.split(']').next()?;
    let mut opens: Vec<f64> =
        children.split('}').filter_map(|child| number_after(child, "\"open_handles\": ")).collect();
    opens.sort_by(f64::total_cmp);
    let median = *opens.get(opens.len().checked_sub(1)? / 2)?;
    (processes > 0.0).then(|| median / processes)
}

fn number_after(text: &str, key: &str) -> Option<f64> {
    let rest = text.split(key).nth(1)?;
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn result_text(result: &Ending) -> String {
    match result {
        Ending::Passed => "passed".into(),
        Ending::Failed(why) => format!("FAILED: {why}"),
        Ending::Waived(why) => format!("waived: {why}"),
    }
}

/// The table printed at the end.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!("{:<10}{:>10}{:>20}  {}\n", "mechanism", "wall ms", "open one, ms", "result");
    for row in rows {
        let open = row.open_one_ms.map_or_else(|| "-".into(), |ms| format!("{ms:.3}"));
        out.push_str(&format!(
            "{:<10}{:>10.1}{:>20}  {}\n",
            row.mechanism.name(),
            row.wall_ms,
            open,
            result_text(&row.ending)
        ));
    }
    out
}

fn json_string(text: &str) -> String {
    let escaped: String = text
        .chars()
        .flat_map(|c| match c {
            '"' => "\\\"".chars().collect::<Vec<_>>(),
            '\\' => "\\\\".chars().collect(),
            c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32).chars().collect(),
            c => vec![c],
        })
        .collect();
    format!("\"{escaped}\"")
}

/// The same as [`table`], as one JSON document.
pub fn json_document(rows: &[Row]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|row| {
            let (result, why) = match &row.ending {
                Ending::Passed => ("passed", None),
                Ending::Failed(why) => ("failed", Some(why)),
                Ending::Waived(why) => ("waived", Some(why)),
            };
            format!(
                "{{\"mechanism\": \"{}\", \"result\": \"{result}\", \"reason\": {}, \"wall_ms\": {:.3}, \"open_one_ms\": {}}}",
                row.mechanism.name(),
                why.map_or_else(|| "null".into(), |w| json_string(w)),
                row.wall_ms,
                row.open_one_ms.map_or_else(|| "null".into(), |ms| format!("{ms:.4}"))
            )
        })
        .collect();
    format!("{{\"mechanisms\": [{}]}}\n", rows.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mechanism: Mechanism, ending: Ending) -> Row {
        Row { mechanism, ending, wall_ms: 1.0, open_one_ms: Some(0.25) }
    }

    #[test]
    fn exit_1_if_any_failed_2_if_all_waived_0_otherwise() {
        let waived = || Ending::Waived("no".into());
        let all_waived = [row(Mechanism::Legacy, waived()), row(Mechanism::Vmm, waived())];
        assert_eq!(outcome(&all_waived).unwrap(), Outcome::Waived);
        let one_passed = [row(Mechanism::Legacy, Ending::Passed), row(Mechanism::Vmm, waived())];
        assert_eq!(outcome(&one_passed).unwrap(), Outcome::Passed);
        let one_failed =
            [row(Mechanism::Legacy, Ending::Passed), row(Mechanism::Pool, Ending::Failed("x".into()))];
        assert!(outcome(&one_failed).unwrap_err().to_string().contains("pool failed"));
    }

    #[test]
    fn the_open_time_is_the_childrens_median_per_process_and_json_escapes_reasons() {
        let doc = r#"{"unit": "ms", "parent": {"total": 9.0}, "children": [{"open_handles": 4.0}, {"open_handles": 2.0}, {"open_handles": 100.0}], "processes": 2}"#;
        assert_eq!(open_one_ms(doc), Some(2.0));
        assert_eq!(open_one_ms("{}"), None);
        let json = json_document(&[row(Mechanism::Vmm, Ending::Failed("a \"quoted\"\nline".into()))]);
        assert!(json.contains(r#""reason": "a \"quoted\"\u000aline""#), "{json}");
        assert!(
            json.contains(r#""result": "failed""#) && json.contains(r#""open_one_ms": 0.2500"#),
            "{json}"
        );
    }
}
