//! `--ipc all`: each mechanism as a whole run of its own, one after another (this program again, with the
//! user's own arguments, less `--ipc` and `--json`, and `--ipc <mechanism>`), then a table of mechanism,
//! result (passed, failed, or waived and why), wall time and the time a child took to open one process's
//! buffer and event. Exit 1 if any failed, 2 if all were waived, 0 otherwise; `--json` carries the same.
//! Pool under `--sync memops` is waived without a run: memops cannot order pool memory.
//!
//! This module owns those runs while they last: each gets the write end of a pipe (`--report-fd`) for its
//! JSON document, so nothing goes through TMPDIR; the top parent passes the run's output on as it comes, in
//! one poll loop that also watches its stop flag and its own standard output. A run gets SIGTERM
//! (`PR_SET_PDEATHSIG`) if the top parent dies; a stop signal to the top parent goes on to the run at once,
//! and a reader of the top parent's output that goes away (`| head -1`) stops the run; either way the top
//! parent then exits 128+N without starting the next run.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

use anyhow::{Result, anyhow};

use crate::cli::{Cli, Sync};
use crate::ipc::{Mechanism, memops_refusal};
use crate::outcome::{Outcome, Waiver};
use crate::report::document::{Document, MechanismResult};
use crate::report::{Ran, Results, Status};
use crate::signals;

mod served;
mod sub_run;
mod table;

pub(crate) use sub_run::run_one;
pub(crate) use table::ending_word;
pub use table::table;

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
    /// `None` where the mechanism was not run.
    pub wall_ms: Option<f64>,
    /// The median over the children of their time to open every handle, divided by the process count.
    pub open_one_ms: Option<f64>,
    /// The run's own `--json` document, read back; `None` where it was not run or wrote none.
    pub document: Option<Box<Document>>,
}

impl Row {
    /// The row of a mechanism not run (its ending to be set).
    fn not_run(mechanism: Mechanism) -> Self {
        let ending = Ending::Waived(String::new());
        Row { mechanism, ending, wall_ms: None, open_one_ms: None, document: None }
    }

    /// The row as the `--json` document carries it.
    fn result(&self) -> MechanismResult {
        let ending = match &self.ending {
            Ending::Passed => (Status::Passed, None),
            Ending::Failed(why) => (Status::Failed, Some(why.clone())),
            Ending::Waived(why) => (Status::Waived, Some(why.clone())),
        };
        let document = self.document.clone();
        MechanismResult::new(self.mechanism.name(), ending, self.wall_ms, self.open_one_ms, document)
    }
}

pub fn run(cli: &Cli) -> Result<Ran> {
    let mut rows = Vec::new();
    // Served (`--serve SOCKET --ipc all`), each mechanism's run is one of a sequence, which the joiners
    // follow from one to the next over the one listener this process holds (see `served`); its `--timeout`
    // bounds the whole sequence.
    let runs = Mechanism::ALL.into_iter().filter(|&m| cannot_run(cli, m).is_none()).count() as u32;
    let mut sequence = match &cli.serve {
        Some(address) => Some(served::Sequence::open(address, runs, cli.timeout())?),
        None => None,
    };
    let set_here: &[&str] =
        if sequence.is_some() { &[&SET_HERE[..], &["--timeout"]].concat() } else { &SET_HERE };
    let passed_on = passed_on_less(std::env::args_os().skip(1), set_here);
    let bar = crate::progress::Bar::start(Mechanism::ALL.len() as u64, "--ipc all", cli.quiet);
    for mechanism in Mechanism::ALL {
        bar.doing(format!("--ipc {}", mechanism.name()));
        say!("== --ipc {}", mechanism.name())?;
        let row = match (cannot_run(cli, mechanism), &mut sequence) {
            (Some(reason), _) => {
                say!("{reason}")?;
                Row { ending: Ending::Waived(reason), ..Row::not_run(mechanism) }
            }
            (None, Some(sequence)) => sequence.run(&passed_on, mechanism)?,
            (None, None) => run_one(&passed_on, mechanism, &[], true, cli.timeout())?,
        };
        rows.push(row);
        bar.step_done();
        signals::check()?;
    }
    drop(bar);
    if let Some(sequence) = sequence {
        sequence.end();
    }
    crate::output::text(&table(&rows))?;
    Ok(Ran::with(outcome(&rows), Results::Mechanisms(rows.iter().map(Row::result).collect())))
}

/// 1 if any failed, 2 if all were waived, 0 otherwise, with what each run did.
pub fn outcome(rows: &[Row]) -> Outcome {
    let failed: Vec<&str> =
        rows.iter().filter(|r| matches!(r.ending, Ending::Failed(_))).map(|r| r.mechanism.name()).collect();
    if !failed.is_empty() {
        return Outcome::Failed(anyhow!("--ipc all: {} failed", failed.join(", ")));
    }
    if rows.iter().all(|r| matches!(r.ending, Ending::Waived(_))) {
        return Outcome::Waived(Waiver("nothing can run here".into()));
    }
    let said: Vec<String> =
        rows.iter().map(|r| format!("{} {}", r.mechanism.name(), table::ending_word(&r.ending))).collect();
    Outcome::passed(format!("every mechanism: {}", said.join(", ")))
}

/// The options `--ipc all` sets itself for each run: every other argument goes on as the user gave it, so
/// that no option, today's or a future one, can be dropped on the way.
const SET_HERE: [&str; 5] = ["--ipc", "--json", "--report-fd", "--serve-round", "--served-fds"];

/// The user's arguments (without the program's name) less those in [`SET_HERE`], in both their forms
/// (`--ipc vmm` and `--ipc=vmm`).
pub fn passed_on(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    passed_on_less(args, &SET_HERE)
}

/// The user's arguments less those in `set_here` (a served sequence sets each run's `--timeout` too).
fn passed_on_less(args: impl IntoIterator<Item = OsString>, set_here: &[&str]) -> Vec<OsString> {
    let mut args = args.into_iter();
    let mut kept = Vec::new();
    while let Some(arg) = args.next() {
        if arg == "--" {
            kept.push(arg);
            kept.extend(args);
            break;
        }
        let bytes = arg.as_bytes();
        if set_here.iter().any(|option| bytes == option.as_bytes()) {
            args.next(); // its value
        } else if !set_here
            .iter()
            .any(|option| bytes.strip_prefix(option.as_bytes()).is_some_and(|rest| rest.starts_with(b"=")))
        {
            kept.push(arg);
        }
    }
    kept
}

/// Why `mechanism` cannot run with the user's options whatever the devices, if so: a property of the
/// mechanism, so its row is waived with the reason (`main` refuses `--ipc pool --sync memops` as an error).
fn cannot_run(cli: &Cli, mechanism: Mechanism) -> Option<String> {
    (cli.sync == Sync::Memops && mechanism.spec().refuses_memops.is_some()).then(|| memops_refusal(mechanism))
}

#[cfg(test)]
mod tests {
    use super::table::open_one_ms;
    use super::*;

    fn row(mechanism: Mechanism, ending: Ending) -> Row {
        Row { mechanism, ending, wall_ms: Some(1.0), open_one_ms: Some(0.25), document: None }
    }

    #[test]
    fn exit_1_if_any_failed_2_if_all_waived_0_otherwise() {
        let waived = || Ending::Waived("no".into());
        let all_waived = [row(Mechanism::Legacy, waived()), row(Mechanism::Vmm, waived())];
        assert!(matches!(outcome(&all_waived), Outcome::Waived(_)));
        let one_passed = [row(Mechanism::Legacy, Ending::Passed), row(Mechanism::Vmm, waived())];
        let Outcome::Passed(Some(summary)) = outcome(&one_passed) else { panic!("passed") };
        assert_eq!(
            summary, "every mechanism: legacy passed, vmm waived",
            "each run's ending, for the verdict"
        );
        let one_failed =
            [row(Mechanism::Legacy, Ending::Passed), row(Mechanism::Pool, Ending::Failed("x".into()))];
        let Outcome::Failed(e) = outcome(&one_failed) else { panic!("failed") };
        assert!(e.to_string().contains("pool failed"));
    }

    /// A run of one mechanism gets the user's options as the user gave them, its own `--ipc` and no `--json`.
    /// Every option of the command line is in one of the cases, so a new option fails this test until it is
    /// added here.
    #[test]
    fn every_option_but_ipc_and_json_is_passed_on() {
        use clap::{CommandFactory, Parser};
        let cases: &[&[&str]] = &[
            &["--ipc", "all", "--sync", "memops", "--procs-per-device", "3", "--timings", "--json", "x.json"],
            &["--ipc=all", "--json=x.json", "--sequential", "--timeout=5", "--bind-numa", "--fds", "pidfd"],
            &["--timeout", "0", "--ipc", "legacy", "--bench", "--bench-max-bytes", "8192"],
            &["--ipc", "all", "--quiet"],
            &["--ipc", "all", "--report-fd", "7"],
        ];
        let program = || std::iter::once(OsString::from("simple-ipc"));
        let mut seen = std::collections::BTreeSet::new();
        for case in cases {
            let user = Cli::try_parse_from(program().chain(case.iter().map(OsString::from))).unwrap();
            let args = passed_on(case.iter().map(OsString::from));
            let own = ["--ipc", "vmm", "--report-fd", "9"].map(OsString::from);
            let sub = Cli::try_parse_from(program().chain(args).chain(own)).unwrap();
            let expected = Cli { ipc: crate::cli::IpcArg::Vmm, json: None, report_fd: Some(9), ..user };
            assert_eq!(sub, expected, "{case:?}");
            seen.extend(case.iter().filter_map(|a| a.strip_prefix("--")?.split('=').next()));
        }
        for arg in Cli::command().get_arguments().filter(|arg| !arg.is_hide_set()) {
            let long = arg.get_long().unwrap_or_default();
            assert!(
                // --serve and --join are refused with --ipc all (one mechanism at a time), and --topology with
                // any --ipc; with --isolate, --ipc all is the container matrix, which sets each run's options
                // itself.
                ["help", "version", "serve", "join", "isolate", "topology"].contains(&long)
                    || seen.contains(long),
                "--{long} is in no case of this test"
            );
        }
    }

    #[test]
    fn the_open_time_is_the_childrens_median_per_process() {
        use crate::report::document::{ChildResult, ParentResult, PhaseTimes, RunResults};
        let child = |index, open: f64| ChildResult {
            index,
            device: 0,
            phases: PhaseTimes(vec![("open_handles".into(), open), ("total".into(), 9.0)]),
            descriptors_before_open: 5,
            descriptors_after_close: 5,
        };
        let run = RunResults {
            unit: "ms".into(),
            processes: 2,
            buffer_bytes: 4096,
            parent_checked_every_buffer: false,
            parent: ParentResult { phases: PhaseTimes::default() },
            children: vec![child(0, 4.0), child(1, 2.0), child(2, 100.0)],
        };
        assert_eq!(open_one_ms(Some(&run)), Some(2.0));
        assert_eq!(open_one_ms(Some(&RunResults { children: Vec::new(), ..run })), None);
        assert_eq!(open_one_ms(None), None);
    }
}
