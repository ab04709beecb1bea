//! The verdict line, the last a run a user started prints: `PASSED: <what it did> in <seconds> s`, or
//! `FAILED`, `WAIVED` or `STOPPED` with the exit status and the reason; and how a run whose reader went
//! away ends (141, quietly). Said by `entry` or, for an isolated run, by the process outside it.

use nix::sys::signal::Signal;

use crate::os::signals::Interrupted;
use crate::output::{READER_GONE_STATUS, ReaderGone};
use crate::report::Status;

/// Whether `cause` is the reader of standard output gone: [`ReaderGone`], or a run of `--ipc all` stopped
/// because of it (`Interrupted(SIGPIPE)`: SIGPIPE is ignored, so no signal of that name stops a run).
pub(crate) fn is_reader_gone(cause: &(dyn std::error::Error + 'static)) -> bool {
    cause.is::<ReaderGone>() || cause.downcast_ref::<Interrupted>().is_some_and(|i| i.0 == Signal::SIGPIPE)
}

/// How a run whose reader went away ends: interrupted, with [`ReaderGone`]'s reason, status 141.
pub(crate) fn reader_gone() -> (Status, Option<String>, u8) {
    (Status::Interrupted, Some(ReaderGone.to_string()), READER_GONE_STATUS)
}

/// The verdict line: `PASSED: <what the run did> in <seconds> s`, or `FAILED`, `WAIVED` or `STOPPED` with the
/// exit status and the reason (its first line).
pub(crate) fn line(
    status: Status,
    reason: Option<&str>,
    summary: Option<&str>,
    code: u8,
    took: std::time::Duration,
) -> String {
    let reason = reason.and_then(|r| r.lines().next()).unwrap_or("");
    match status {
        Status::Passed => {
            let what = summary.unwrap_or("the run ended well");
            format!("PASSED: {what} in {:.2} s", took.as_secs_f64())
        }
        // No run says its verdict while still running: were one to, it did not pass.
        Status::Failed | Status::Running => format!("FAILED (exit {code}): {reason}"),
        Status::Waived => {
            // A mechanism this host lacks is not a host without IPC: the others may work. A run that is
            // simulated already needs no hint to simulate.
            let next = if reason.starts_with("every mechanism waived") && reason.contains(" with --") {
                None
            } else if reason.contains(" with --sync memops") {
                // Every mechanism orders its writes the same way: --ipc all would waive them all alike.
                Some("--sync events orders the writes by interprocess events instead".to_owned())
            } else if reason.contains(" with --ipc ") || reason.contains(" with --sync ") {
                Some("--ipc all tries every mechanism".to_owned())
            } else if crate::driver::host::requested() {
                None
            } else {
                let variable = crate::driver::host::SIMULATE_ENV;
                // As the container's own program (pid 1: `docker run IMAGE`), as its engine passes a
                // variable to it; in a shell in a container, as anywhere else.
                let how = match crate::os::container::engine().filter(|_| std::process::id() == 1) {
                    Some(engine) => engine.simulation_hint(variable),
                    None => format!("{variable}=ok,ok {}", this_program()),
                };
                Some(format!("To see the protocol run without a GPU: {how}"))
            };
            let said = format!("WAIVED (exit {code}, not a failure: nothing here to test): {reason}.");
            match next {
                Some(next) => format!("{said} {next}"),
                None => said,
            }
        }
        Status::Interrupted => format!("STOPPED (exit {code}): {reason}"),
    }
}

/// This program as it was started (its `argv[0]`, as given: `target/release/simple-ipc`, or `simple-ipc`
/// from PATH), quoted for a shell where it needs it, so that a hint to run it again can be pasted.
fn this_program() -> String {
    let started = std::env::args_os().next().map(|arg0| arg0.to_string_lossy().into_owned());
    quoted(started.filter(|name| !name.is_empty()).unwrap_or_else(|| "simple-ipc".to_owned()))
}

/// `name`, quoted for a shell where it needs it.
fn quoted(name: String) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:@%,=".contains(c);
    if name.chars().all(plain) { name } else { format!("'{}'", name.replace('\'', r"'\''")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_reader_gone_is_its_error_or_a_run_stopped_by_sigpipe() {
        assert!(is_reader_gone(&ReaderGone));
        assert!(is_reader_gone(&Interrupted(Signal::SIGPIPE)));
        assert!(!is_reader_gone(&Interrupted(Signal::SIGTERM)), "a stop signal is not the reader gone");
        assert!(!is_reader_gone(&*anyhow::anyhow!("a socket closed")));
        let (status, reason, code) = reader_gone();
        assert_eq!((status, reason, code), (Status::Interrupted, Some(ReaderGone.to_string()), 141));
    }

    #[test]
    fn each_verdict_says_its_status_exit_and_the_first_line_of_its_reason() {
        let took = Duration::from_millis(1234);
        let line = |status, reason, summary, code| line(status, reason, summary, code, took);
        assert_eq!(line(Status::Passed, None, Some("2 processes"), 0), "PASSED: 2 processes in 1.23 s");
        assert_eq!(line(Status::Passed, None, None, 0), "PASSED: the run ended well in 1.23 s");
        assert_eq!(line(Status::Failed, Some("it broke\nat 3"), None, 1), "FAILED (exit 1): it broke");
        assert_eq!(line(Status::Failed, None, None, 1), "FAILED (exit 1): ");
        assert_eq!(line(Status::Interrupted, Some("SIGTERM"), None, 143), "STOPPED (exit 143): SIGTERM");
        let waived = "WAIVED (exit 2, not a failure: nothing here to test)";
        let missing = "no pidfd with --ipc vmm";
        assert_eq!(
            line(Status::Waived, Some(missing), None, 2),
            format!("{waived}: {missing}. --ipc all tries every mechanism")
        );
        // Every mechanism orders its writes alike: the way out of a memops waiver is the other ordering.
        let missing = "no memops with --sync memops";
        assert_eq!(
            line(Status::Waived, Some(missing), None, 2),
            format!("{waived}: {missing}. --sync events orders the writes by interprocess events instead")
        );
        let no_gpu = line(Status::Waived, Some("no GPU\nat all"), None, 2);
        // The hint runs this program again as it was started: here, this test binary.
        let this_test_binary = std::env::args().next().unwrap();
        if crate::driver::host::requested() {
            assert_eq!(no_gpu, format!("{waived}: no GPU."), "simulated already: no hint");
        } else {
            let hint = format!(
                "To see the protocol run without a GPU: {}=ok,ok ",
                crate::driver::host::SIMULATE_ENV
            );
            assert_eq!(no_gpu, format!("{waived}: no GPU. {hint}{}", quoted(this_test_binary)));
        }
    }

    #[test]
    fn the_program_is_quoted_for_a_shell_where_it_needs_it() {
        assert_eq!(quoted("target/release/simple-ipc".into()), "target/release/simple-ipc");
        assert_eq!(quoted("/a_b.c-d+e:f@g%h,i=j".into()), "/a_b.c-d+e:f@g%h,i=j");
        assert_eq!(quoted("my dir/simple-ipc".into()), "'my dir/simple-ipc'");
        assert_eq!(quoted("it's".into()), r"'it'\''s'");
        assert_eq!(quoted("$HOME/x".into()), "'$HOME/x'");
    }
}
