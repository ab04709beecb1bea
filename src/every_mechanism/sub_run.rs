//! The run of one mechanism, as `--ipc all` starts it: this program again with the user's options of the
//! run and its own mechanism (`Role::MechanismRun`), its output passed on as it comes, its result read from
//! an inherited pipe (`--report-fd`), and stopped with the top parent (see the parent module's doc).

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use anyhow::Result;
use nix::sys::signal::Signal;

use super::{Row, table};
use crate::ipc::Mechanism;
use crate::os::signals::Interrupted;
use crate::outcome::RunEnd;
use crate::role::{MechanismRun, Role, Run, Served};
use crate::supervise::relaunch::{
    Echo, Ended, Followed, OnDrop, Output, Policies, Relaunch, Streams, follow,
};

/// How long a run of one mechanism gets to stop in order (it stops its children within 300 ms) before it is
/// killed.
const STOP_GRACE: Duration = Duration::from_secs(1);
/// How long past its own `--timeout` a run has to stop itself (its watchdog stops its processes within
/// about a second and a half) before this process stops it: a run that is stopped (SIGSTOP) or frozen
/// cannot keep its own watchdog.
const PAST_ITS_TIMEOUT: Duration = Duration::from_secs(6);

/// Runs this program as the run of `mechanism` with `run`'s options; passes its output on as it comes
/// (where `echo`; otherwise it is kept only) and reads its result (its `--json` document, parsed back) from
/// a pipe it inherits (`--report-fd`): no file. How it ended, and why, is what its document says (with its
/// exit status); nothing it printed is read. Past the run's own `--timeout` (and a grace), this process
/// stops it.
pub(crate) fn run_one(run: &Run, mechanism: Mechanism, echo: bool) -> Result<Row> {
    run_one_inheriting(run, mechanism, None, echo, Vec::new(), false)
}

/// [`run_one`] of a row of the container matrix (`matrix::row`): every kind of handle, one importer; its
/// output kept, not shown.
pub(crate) fn run_matrix_row(run: &Run) -> Result<Row> {
    run_one_inheriting(run, Mechanism::Legacy, None, false, Vec::new(), true)
}

/// [`run_one`], the run one of a served sequence (`served`), inheriting the descriptors `given` too
/// (which `served` names), closed here once it has started: the run is then their only holder.
pub(crate) fn run_one_inheriting(
    run: &Run,
    mechanism: Mechanism,
    served: Option<Served>,
    echo: bool,
    given: Vec<OwnedFd>,
    matrix_row: bool,
) -> Result<Row> {
    let timeout = run.timeout.limit();
    let mut launch = Relaunch::new(format!("the run of --ipc {}", mechanism.name()));
    let fd = launch.report_pipe()?;
    launch
        .args(
            Role::MechanismRun(MechanismRun {
                mechanism,
                run: run.clone(),
                report_fd: fd,
                served,
                outside_fd: None,
                matrix_row,
            })
            .to_args(),
        )
        .streams(Streams::Piped)
        // The run must not outlive the top parent: SIGTERM, which it handles as an orderly stop (SIGKILL
        // where the invoker left SIGTERM ignored).
        .stopped_at_death()?
        .on_drop(OnDrop::Stop { signal: Some(Signal::SIGTERM), grace: STOP_GRACE });
    for fd in given {
        launch.give(fd);
    }
    // A descriptor fault is meant for the mechanisms that send descriptors; legacy's run would refuse it.
    if crate::phases::fault::needs_descriptors() && !mechanism.uses_descriptors() {
        launch.env_remove(crate::phases::fault::FAULT_ENV);
    }
    let start = Instant::now();
    // Declared before the pipes: on an early return they close first, so the run cannot block writing to
    // them while it is being stopped.
    let mut run = launch.spawn()?;
    let (stdout, stderr) = run.take_output();
    let (to_stdout, to_stderr) = if echo { (Echo::Stdout, Echo::Stderr) } else { (Echo::Keep, Echo::Keep) };
    let mut outputs = [Output::new(stdout, to_stdout), Output::new(stderr, to_stderr)];
    let policies = Policies {
        deadline: timeout.map(|t| start + t + PAST_ITS_TIMEOUT),
        stop_grace: STOP_GRACE,
        job_control: false,
    };
    let Followed { ended: status, stopped_by: stopped, late, .. } =
        follow(&mut run, &policies, &mut outputs)?;
    for output in &mut outputs {
        output.echo_rest()?;
    }
    if late.is_some() {
        let why = format!(
            "stopped by this process: it did not end within its --timeout ({} s) and {} s more (was it stopped \
             or frozen?)",
            timeout.map_or(0.0, |t| t.as_secs_f64()),
            PAST_ITS_TIMEOUT.as_secs()
        );
        print_line!("{why}")?;
        let wall_ms = Some(start.elapsed().as_secs_f64() * 1e3);
        return Ok(Row {
            mechanism,
            ending: RunEnd::Failed { process: None, why },
            wall_ms,
            open_one_ms: None,
            document: None,
        });
    }
    if let Some(signal) = stopped {
        return Err(Interrupted(signal).into());
    }
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    // The run's own document says why it failed or was waived; a run that wrote none is named by how it
    // ended.
    let document = run.document().map(Box::new);
    let ending = ending_of(status, document.as_deref());
    let open_one_ms = table::open_one_ms(document.as_ref().and_then(|d| d.run.as_ref()));
    Ok(Row { mechanism, ending, wall_ms: Some(wall_ms), open_one_ms, document })
}

/// How a run ended: its exit status, and why as its own document says (a run that wrote none is named by
/// how it ended); never what it printed.
fn ending_of(status: Ended, document: Option<&crate::report::Document>) -> RunEnd {
    let said = document.and_then(|d| d.reason.clone());
    let unsaid = |how: String| format!("{how}, without its document");
    match status {
        Ended::Exited(0) => RunEnd::Passed,
        Ended::Exited(2) => {
            RunEnd::Waived(said.unwrap_or_else(|| unsaid("waived (exit status 2)".to_owned())))
        }
        Ended::Exited(code) if code > 128 => {
            RunEnd::Failed { process: None, why: format!("stopped by {}", signal_name(code - 128)) }
        }
        Ended::Killed(signal) => RunEnd::Failed { process: None, why: format!("killed by {signal}") },
        Ended::Exited(code) => RunEnd::Failed {
            process: None,
            why: said.unwrap_or_else(|| unsaid(format!("exit status {code}"))),
        },
        Ended::Lost(e) => {
            RunEnd::Failed { process: None, why: unsaid(format!("its exit status lost ({e})")) }
        }
    }
}

/// `SIGTERM` for 15; the number where it is no signal.
fn signal_name(number: i32) -> String {
    Signal::try_from(number).map_or_else(|_| format!("signal {number}"), |signal| signal.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reason is the document's: a waived or failed run is not read from what it printed.
    #[test]
    fn a_runs_reason_is_its_documents() {
        let exited = Ended::Exited;
        let mut document = crate::report::document::example();
        document.reason = Some("No CUDA devices support IPC (the document's words)".into());
        assert_eq!(
            ending_of(exited(2), Some(&document)),
            RunEnd::Waived("No CUDA devices support IPC (the document's words)".into())
        );
        assert_eq!(
            ending_of(exited(2), None),
            RunEnd::Waived("waived (exit status 2), without its document".into())
        );
        assert_eq!(
            ending_of(exited(1), None),
            RunEnd::Failed { process: None, why: "exit status 1, without its document".into() }
        );
        assert_eq!(
            ending_of(exited(143), None),
            RunEnd::Failed { process: None, why: "stopped by SIGTERM".into() }
        );
        assert_eq!(
            ending_of(Ended::Killed(Signal::SIGKILL), None),
            RunEnd::Failed { process: None, why: "killed by SIGKILL".into() }
        );
        assert_eq!(ending_of(exited(0), Some(&document)), RunEnd::Passed);
    }
}
