//! The process outside an isolated run: an isolation that includes the parent (`--isolate shm`, `pid`,
//! `container`, ...) runs in a child of the process the user started, which stays in the user's own
//! namespaces and
//! - passes its stop signals on to the run (which is in a process group of its own, so that a signal to
//!   the user's job reaches it once, through this process);
//! - passes job control on: Ctrl-Z (SIGTSTP, and SIGTTIN or SIGTTOU) stops every process of the run
//!   (SIGSTOP), then this process, so that the shell's stopped job is the whole run; once continued
//!   (SIGCONT, `fg`), it continues them. The time stopped does not count against its deadline, and a run
//!   whose own watchdog ended it for the time it was stopped says so. While it is stopped, a keeper (a
//!   process of its own group, outside the user's job) waits for this one's death: `kill -9 %1` of the
//!   stopped job leaves no run stopped for good, as the keeper continues it and it stops in order;
//! - stops the run at its deadline (`--timeout` and a grace for the run to stop itself): whatever the run
//!   started is killed, and the verdict names a stopped process, where one is (a SIGSTOPped init of the
//!   run's PID namespace cannot reap, and the run would never end);
//! - writes the run's `--json` document where the user asked (the run hands it back through a pipe, as a
//!   run of `--ipc all` does): not into the run's private `/dev/shm`, and with the user's own rights, which
//!   a user namespace's root lacks; with `--json -`, to the standard output the user gave, which only this
//!   process holds (the run's lines go to standard error, as its descriptor 1 is standard error's copy);
//! - says the verdict, after the document was written (a run whose document could not be written is no
//!   pass), and exits with the run's status.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid, getppid, pipe2, setpgid};

use crate::report::{self, Status};
use crate::timings::Timeout;

/// How long past `--timeout` the run has to stop itself (its watchdog stops its processes within about a
/// second and a half) before the process outside stops it.
const STOP_GRACE: Duration = Duration::from_secs(4);

/// What the process outside knows of the run: its `--timeout`, and whether its document goes to a pipe
/// (a run of the matrix), whose reader says the verdict.
#[derive(Clone, Copy)]
struct Outside {
    timeout: Option<Duration>,
    to_a_pipe: bool,
}

/// Forks the run (`asked`: its mode and options, for its document), which returns from here (and then
/// enters its namespaces); this process stays outside and never returns (see the module's doc). Call it
/// while this process has one thread.
/// `document`: the run's, written by this process once the run is over; in the run, the pipe to it.
pub fn stay_outside(
    timeout: Timeout,
    to_a_pipe: bool,
    asked: (report::document::Mode, report::document::Options),
    document: &mut Option<report::Opened>,
) -> Result<()> {
    let outside = Outside { timeout: timeout.limit(), to_a_pipe };
    let (from_run, document_end) = pipe2(OFlag::O_CLOEXEC).context("pipe2 for an isolated run's document")?;
    let me = getpid();
    let passed_on = super::enter::passed_on_signals()?;
    super::enter::ensure_one_thread()?;
    // SAFETY: this process has one thread (checked just above), so the child may run any code.
    match unsafe { fork() }.context("fork of an isolated run")? {
        ForkResult::Parent { child } => {
            drop(document_end);
            watch(outside, child, from_run, passed_on, document.take())
        }
        ForkResult::Child => {
            drop(from_run);
            // A group of its own: a signal to the user's job reaches the run once, through the process
            // outside; if that process is killed, the run stops in order.
            setpgid(Pid::from_raw(0), Pid::from_raw(0)).context("setpgid of an isolated run")?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).context("prctl(PR_SET_PDEATHSIG)")?;
            if getppid() != me {
                anyhow::bail!("the process outside the isolated run ended before the run began");
            }
            *document = Some(report::hand_over(std::fs::File::from(document_end), asked));
            Ok(())
        }
    }
}

/// The process outside: waits for the run, passing stop signals on and reading its document, until it
/// ends or its deadline has passed; then writes the document, says the verdict and exits.
/// `opened`: the run's document, as the user asked for it.
fn watch(
    outside: Outside,
    run: Pid,
    document: OwnedFd,
    passed_on: SigSet,
    opened: Option<report::Opened>,
) -> ! {
    let started = Instant::now();
    let mut deadline = outside.timeout.map(|t| started + t + STOP_GRACE);
    // How long the user held the run stopped (Ctrl-Z until `fg`).
    let mut held = Duration::ZERO;
    let mut waited = passed_on;
    waited.add(Signal::SIGCHLD);
    // Job control, unless the invoker left it ignored (a shell without job control): passed on, not
    // suffered (blocked, a SIGTSTP would stop nothing; unblocked, it would stop this process alone).
    for signal in JOB_CONTROL {
        if !crate::signals::is_ignored(signal).unwrap_or(true) {
            waited.add(signal);
        }
    }
    waited.add(Signal::SIGCONT);
    let signals = waited
        .thread_block()
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(SignalFd::with_flags(&waited, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?));
    let signals = match signals {
        Ok(signals) => signals,
        Err(e) => {
            let _ = kill(run, Signal::SIGKILL);
            let _ = waitpid(run, None);
            let e = e.context("the process outside an isolated run: signalfd");
            end(outside, Err(e), started, held, opened)
        }
    };
    let _ = fcntl(&document, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    let mut got = Vec::new();
    let mut open = true;
    let ended = loop {
        match waitpid(run, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => break Ok(code),
            Ok(WaitStatus::Signaled(_, signal, _)) => break Ok(128 + signal as i32),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => break Err(anyhow::Error::from(e).context("waiting for the isolated run")),
        }
        if let Some(deadline) = deadline
            && Instant::now() > deadline
        {
            let stopped = stopped_among(run);
            kill_all(run);
            let timeout = outside.timeout.unwrap_or_default().as_secs();
            let what = match stopped {
                Some(who) => format!("{who} is stopped"),
                None => "it did not stop itself".to_owned(),
            };
            break Err(anyhow::anyhow!(
                "the isolated run (pid {run}) did not end within --timeout {timeout} s and {} s more: {what}; \
                 the process outside stopped it and all it started",
                STOP_GRACE.as_secs()
            ));
        }
        let mut fds = [
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
            PollFd::new(document.as_fd(), PollFlags::POLLIN),
        ];
        let watched = if open { 2 } else { 1 };
        let _ = poll(&mut fds[..watched], PollTimeout::from(100u8));
        if open {
            open = read_some(&document, &mut got);
        }
        while let Ok(Some(info)) = signals.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) | Err(_) => {}
                Ok(signal) if JOB_CONTROL.contains(&signal) => {
                    let stopped = hold(run);
                    held += stopped;
                    deadline = deadline.map(|d| d + stopped);
                }
                // Continued after a SIGSTOP of this process alone (which it cannot see): the run goes on too.
                Ok(Signal::SIGCONT) => signal_all(run, Signal::SIGCONT),
                Ok(signal) => {
                    let _ = kill(run, signal);
                }
            }
        }
    };
    if open {
        read_some(&document, &mut got);
    }
    let ended = ended.map(|code| (code, report::document::parse(&got)));
    end(outside, ended, started, held, opened)
}

/// The signals of job control that the process outside passes on to the whole run.
const JOB_CONTROL: [Signal; 3] = [Signal::SIGTSTP, Signal::SIGTTIN, Signal::SIGTTOU];

/// Ctrl-Z: stops every process of the run, then this process (the shell sees its job stopped); returns,
/// once continued, after continuing the run, how long it was held.
fn hold(run: Pid) -> Duration {
    let at = Instant::now();
    // The keeper first: this process killed while it stops the run (Ctrl-Z, then kill -9 a moment later)
    // must not leave the run stopped with nobody to continue it.
    let keeper = keeper(run);
    signal_all(run, Signal::SIGSTOP);
    // What a process of the run started while the others were being stopped.
    signal_all(run, Signal::SIGSTOP);
    // Delivered before kill returns: this process stops here until SIGCONT.
    let _ = kill(getpid(), Signal::SIGSTOP);
    if let Some(keeper) = keeper {
        let _ = kill(keeper, Signal::SIGKILL);
        let _ = waitpid(keeper, None);
    }
    signal_all(run, Signal::SIGCONT);
    at.elapsed()
}

/// The name a keeper goes by (`/proc/PID/comm`).
pub const KEEPER_NAME: &std::ffi::CStr = c"sipc-keeper";

/// A process that outlives this one only to continue the run if this one dies while holding it stopped
/// (`kill -9 %1` of the stopped job): stopped, the run could not act on the SIGTERM its parent's death sends
/// it (`PR_SET_PDEATHSIG`), and would stay stopped for good. In a process group of its own, outside the
/// job, so that a signal to the job does not reach it; killed by this process once it is continued. `None`
/// where it cannot be made (the run is then held as before).
fn keeper(run: Pid) -> Option<Pid> {
    let me = getpid();
    super::enter::ensure_one_thread().ok()?;
    // SAFETY: this process has one thread (checked just above), so the child may run any code.
    match unsafe { fork() }.ok()? {
        ForkResult::Parent { child } => Some(child),
        ForkResult::Child => {
            let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
            let _ = nix::sys::prctl::set_name(KEEPER_NAME);
            let mut death = SigSet::empty();
            death.add(Signal::SIGTERM);
            let _ = death.thread_block();
            if nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).is_ok() && getppid() == me {
                let _ = death.wait();
            }
            // This process's parent is gone while the run is held: continue it, so that it stops in order.
            signal_all(run, Signal::SIGCONT);
            // SAFETY: leaves the forked child without running the parent's exit handlers or destructors.
            unsafe { nix::libc::_exit(0) }
        }
    }
}

/// Sends `signal` to `top` and everything it started (the init of a PID namespace and the guardian are in
/// sessions of their own: a signal to the run's process group would not reach them).
fn signal_all(top: Pid, signal: Signal) {
    let _ = kill(top, signal);
    for pid in crate::proc_stat::descendants(top) {
        let _ = kill(pid, signal);
    }
}

/// Reads what the pipe holds now into `got`; false at its end (or on an error).
fn read_some(pipe: &OwnedFd, got: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match nix::unistd::read(pipe, &mut chunk) {
            Ok(0) => return false,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(Errno::EAGAIN | Errno::EINTR) => return true,
            Err(_) => return false,
        }
    }
}

/// Writes the document (the run's, or one of this process's own where the run gave none), says the
/// verdict after it, and exits.
fn end(
    outside: Outside,
    ended: Result<(i32, Option<report::Document>)>,
    started: Instant,
    held: Duration,
    opened: Option<report::Opened>,
) -> ! {
    let (mut status, mut reason, mut code, summary, written) = match ended {
        Ok((code, Some(mut document))) => {
            // A run past its --timeout whose watchdog counted the time the user held it stopped: say so.
            let timed_out = outside.timeout.is_some_and(|t| started.elapsed() > t);
            if document.status == Status::Failed && timed_out && held >= Duration::from_millis(100) {
                let why = document.reason.take().unwrap_or_default();
                let (first, rest) = why.split_once('\n').unwrap_or((&why, ""));
                let note = format!(
                    "; the run was held stopped by job control (Ctrl-Z until continued) for {:.1} s, which its \
                     --timeout counted",
                    held.as_secs_f64()
                );
                let rest = if rest.is_empty() { String::new() } else { format!("\n{rest}") };
                document.reason = Some(format!("{first}{note}{rest}"));
            }
            let said = (document.status, document.reason.clone(), document.summary.clone());
            let code = u8::try_from(code).unwrap_or(crate::outcome::EXIT_FAILURE);
            (said.0, said.1, code, said.2, report::finish_document(opened, document))
        }
        Ok((code, None)) => {
            let why = match code {
                0 => "the isolated run ended without its document".to_owned(),
                code if code > 128 => {
                    format!("the isolated run was stopped (exit status {code}) before its document")
                }
                code => format!("the isolated run ended with exit status {code} without its document"),
            };
            let code = match u8::try_from(code) {
                Ok(0) | Err(_) => crate::outcome::EXIT_FAILURE,
                Ok(code) => code,
            };
            let status = if code > 128 { Status::Interrupted } else { Status::Failed };
            let written =
                report::finish(opened, &report::Verdict::of(status, &why, code), Default::default());
            (status, Some(why), code, None, written)
        }
        Err(e) => {
            let why = format!("{e:#}");
            warn!("simple-ipc: {why}");
            let code = crate::outcome::EXIT_FAILURE;
            let written =
                report::finish(opened, &report::Verdict::of(Status::Failed, &why, code), Default::default());
            (Status::Failed, Some(why), code, None, written)
        }
    };
    if let Err(e) = written {
        if e.chain().any(crate::verdict::is_reader_gone) {
            // `--json - | head -c 10`: 141, and nothing more said, as for a C program killed by SIGPIPE.
            code = crate::output::READER_GONE_STATUS;
        } else {
            warn!("simple-ipc: {e:#}");
            if code == crate::outcome::EXIT_SUCCESS || status == Status::Waived {
                status = Status::Failed;
                reason = Some(format!("{e:#}"));
                code = crate::outcome::EXIT_FAILURE;
            }
        }
    }
    if !outside.to_a_pipe && code != crate::output::READER_GONE_STATUS {
        let line =
            crate::verdict::line(status, reason.as_deref(), summary.as_deref(), code, started.elapsed());
        match crate::output::verdict(&line) {
            Ok(()) => {}
            // The reader went away before the last line: 141, quietly (the document was written already).
            Err(e) if e.chain().any(crate::verdict::is_reader_gone) => {
                code = crate::output::READER_GONE_STATUS
            }
            Err(e) => warn!("simple-ipc: {e:#}"),
        }
    }
    std::process::exit(i32::from(code))
}

/// A stopped process among `top` and what it started, named: `the init of a PID namespace of the run (pid
/// N)`.
pub(super) fn stopped_among(top: Pid) -> Option<String> {
    let stopped = std::iter::once(top)
        .chain(crate::proc_stat::descendants(top))
        .find(|pid| crate::proc_stat::read(pid.as_raw()).is_some_and(|s| matches!(s.state, 'T' | 't')))?;
    let status = std::fs::read_to_string(format!("/proc/{stopped}/status")).unwrap_or_default();
    let inner =
        status.lines().find_map(|l| l.strip_prefix("NSpid:")).and_then(|l| l.split_whitespace().last());
    Some(match inner {
        Some("1") => format!("the init of a PID namespace of the run (pid {stopped}, pid 1 in it)"),
        _ => format!("process {stopped} of the run"),
    })
}

/// Kills `top` and everything it started (SIGKILL reaches a stopped process; the init of a PID namespace
/// takes its namespace with it), and reaps `top`.
fn kill_all(top: Pid) {
    for pid in crate::proc_stat::descendants(top).into_iter().rev() {
        let _ = kill(pid, Signal::SIGKILL);
    }
    let _ = kill(top, Signal::SIGKILL);
    let _ = waitpid(top, None);
}
