//! `--ipc all`: each mechanism as a whole run of its own, one after another (this program again, with the
//! user's options of the run, and its own mechanism), then a table of mechanism,
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

use anyhow::{Result, anyhow};

use crate::ipc::Mechanism;
use crate::os::signals;
use crate::outcome::RunEnd;
use crate::outcome::{Outcome, Waiver};
use crate::report::document::{Document, MechanismResult};
use crate::report::{Results, RoleEnd, Status};
use crate::role::{EveryMechanism, Run};

mod served;
mod sub_run;
mod table;

pub(crate) use sub_run::{run_matrix_row, run_one};
pub(crate) use table::ending_word;
pub use table::table;

/// One row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub mechanism: Mechanism,
    pub ending: RunEnd,
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
        let ending = RunEnd::Waived(String::new());
        Row { mechanism, ending, wall_ms: None, open_one_ms: None, document: None }
    }

    /// The row as the `--json` document carries it.
    fn result(&self) -> MechanismResult {
        let ending = match &self.ending {
            RunEnd::Passed => (Status::Passed, None),
            RunEnd::Failed { why, .. } => (Status::Failed, Some(why.clone())),
            RunEnd::Waived(why) => (Status::Waived, Some(why.clone())),
        };
        let document = self.document.clone();
        MechanismResult::new(self.mechanism.name(), ending, self.wall_ms, self.open_one_ms, document)
    }
}

pub fn run(every: &EveryMechanism) -> Result<RoleEnd> {
    let run = &every.run;
    let mut rows = Vec::new();
    // Served (`--serve SOCKET --ipc all`), each mechanism's run is one of a sequence, which the joiners
    // follow from one to the next over the one listener this process holds (see `served`); its `--timeout`
    // bounds the whole sequence.
    let runs = Mechanism::ALL.into_iter().filter(|&m| every.why_not_run(m).is_none()).count() as u32;
    let mut sequence = match &run.serve {
        Some(address) => Some(served::Sequence::open(address, runs, run.timeout)?),
        None => None,
    };
    // Each run's document comes back through its pipe.
    let each = Run { json: None, ..run.clone() };
    let bar = crate::output::progress::Bar::start(Mechanism::ALL.len() as u64, "--ipc all", run.quiet);
    for mechanism in Mechanism::ALL {
        bar.doing(format!("--ipc {}", mechanism.name()));
        print_line!("== --ipc {}", mechanism.name())?;
        // A mechanism the options cannot run whatever the devices (the parse found it) is waived, not run.
        let row = match (every.why_not_run(mechanism), &mut sequence) {
            (Some(reason), _) => {
                print_line!("{reason}")?;
                Row { ending: RunEnd::Waived(reason.to_owned()), ..Row::not_run(mechanism) }
            }
            (None, Some(sequence)) => sequence.run(&each, mechanism)?,
            (None, None) => run_one(&each, mechanism, true)?,
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
    Ok(RoleEnd::with(outcome(&rows), Results::Mechanisms(rows.iter().map(Row::result).collect())))
}

/// 1 if any failed, 2 if all were waived, 0 otherwise, with what each run did.
pub fn outcome(rows: &[Row]) -> Outcome {
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| matches!(r.ending, RunEnd::Failed { .. }))
        .map(|r| r.mechanism.name())
        .collect();
    if !failed.is_empty() {
        return Outcome::Failed(anyhow!("--ipc all: {} failed", failed.join(", ")));
    }
    let waived: Vec<(&str, &str)> = rows
        .iter()
        .filter_map(|r| match &r.ending {
            RunEnd::Waived(why) => Some((r.mechanism.name(), why.as_str())),
            _ => None,
        })
        .collect();
    if waived.len() == rows.len() {
        // The verdict names the cause (no driver, no GPU in a container, ...): once where every mechanism
        // was waived for it, else each mechanism's.
        let why = match waived.split_first() {
            Some(((_, first), rest)) if rest.iter().all(|(_, why)| why == first) => (*first).to_owned(),
            _ => waived.iter().map(|(name, why)| format!("{name}: {why}")).collect::<Vec<_>>().join("; "),
        };
        return Outcome::Waived(Waiver(format!("every mechanism waived: {why}")));
    }
    let said: Vec<String> =
        rows.iter().map(|r| format!("{} {}", r.mechanism.name(), table::ending_word(&r.ending))).collect();
    Outcome::passed(format!("every mechanism: {}", said.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::table::open_one_ms;
    use super::*;

    fn row(mechanism: Mechanism, ending: RunEnd) -> Row {
        Row { mechanism, ending, wall_ms: Some(1.0), open_one_ms: Some(0.25), document: None }
    }

    #[test]
    fn exit_1_if_any_failed_2_if_all_waived_0_otherwise() {
        let waived = || RunEnd::Waived("no".into());
        let all_waived = [row(Mechanism::Legacy, waived()), row(Mechanism::Vmm, waived())];
        assert!(matches!(outcome(&all_waived), Outcome::Waived(_)));
        let one_passed = [row(Mechanism::Legacy, RunEnd::Passed), row(Mechanism::Vmm, waived())];
        let Outcome::Passed(Some(summary)) = outcome(&one_passed) else { panic!("passed") };
        assert_eq!(
            summary, "every mechanism: legacy passed, vmm waived",
            "each run's ending, for the verdict"
        );
        let one_failed = [
            row(Mechanism::Legacy, RunEnd::Passed),
            row(Mechanism::Pool, RunEnd::Failed { process: None, why: "x".into() }),
        ];
        let Outcome::Failed(e) = outcome(&one_failed) else { panic!("failed") };
        assert!(e.to_string().contains("pool failed"));
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
