//! SIGINT, SIGTERM and SIGHUP become a flag that the waits of every process look at, so that an interrupted
//! run stops in order: children close what they opened, the parent frees what it exported, the segment goes.
//!
//! What the invoker left in place is respected where it is a choice and undone where it would falsify the
//! verdict: a stop signal it ignores (`nohup`, a shell's background job) stays ignored, in this process and,
//! since an ignored disposition survives exec, in every child; an ignored SIGCHLD, which would make the kernel
//! reap our children itself and lose their exit statuses, is put back to the default.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

use anyhow::{Context, Result};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static RECEIVED: AtomicI32 = AtomicI32::new(0);
static CONTINUES: AtomicU32 = AtomicU32::new(0);

extern "C" fn count_continue(_signal: nix::libc::c_int) {
    // Adding to an atomic is async-signal-safe.
    CONTINUES.fetch_add(1, Ordering::SeqCst);
}

/// How many times this process was continued (SIGCONT) since it began: a wait that sees the count change
/// was held stopped meanwhile (see `held`).
pub fn continues() -> u32 {
    CONTINUES.load(Ordering::SeqCst)
}

extern "C" fn remember(signal: nix::libc::c_int) {
    // Only the first signal counts; storing an atomic is async-signal-safe.
    let _ = RECEIVED.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
}

/// The signals that stop a run in order.
pub const STOP_SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Installs the handlers (without SA_RESTART, so that a blocking wait returns early) for each stop signal
/// that this process did not inherit as ignored: `nohup simple-ipc`, or a background job whose SIGINT the
/// shell ignores, must not be stopped by it, as no other program would be. Then unblocks the stop signals:
/// a process of this program starts with them blocked (`relaunch`), so that one sent before its handlers
/// were there is taken now, and a mask the invoker left cannot hide them.
pub fn install() -> Result<()> {
    let action = SigAction::new(SigHandler::Handler(remember), SaFlags::empty(), SigSet::empty());
    for signal in STOP_SIGNALS {
        if is_ignored(signal)? {
            continue;
        }
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }
            .with_context(|| format!("installing a handler for {signal}"))?;
    }
    // SIGCONT is counted, with SA_RESTART: it interrupts no call, as without a handler.
    let counted = SigAction::new(SigHandler::Handler(count_continue), SaFlags::SA_RESTART, SigSet::empty());
    // SAFETY: the handler only adds to an atomic, which is async-signal-safe.
    unsafe { sigaction(Signal::SIGCONT, &counted) }.context("installing a handler for SIGCONT")?;
    let stop: SigSet = STOP_SIGNALS.into_iter().collect();
    stop.thread_unblock().context("unblocking the stop signals")
}

/// Whether `signal` is ignored now, asked without changing it (installing and restoring would leave a moment
/// in which the signal counts).
pub fn is_ignored(signal: Signal) -> Result<bool> {
    // SAFETY: `sigaction` is plain C data, for which all zeroes is a valid value.
    let mut current: nix::libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: with a null new action, sigaction only writes the current one into `current`, which is valid
    // for writes.
    let rc = unsafe { nix::libc::sigaction(signal as nix::libc::c_int, std::ptr::null(), &mut current) };
    nix::errno::Errno::result(rc).with_context(|| format!("asking the disposition of {signal}"))?;
    Ok(current.sa_sigaction == nix::libc::SIG_IGN)
}

/// Puts SIGCHLD back to its default, whatever the invoker left (a supervisor's `signal(SIGCHLD, SIG_IGN)` is
/// inherited across exec): ignored, the kernel reaps the children itself, `waitpid` answers ECHILD and their
/// exit statuses, which are the verdict, are lost. Call it before any child is started.
pub fn keep_child_statuses() -> Result<()> {
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: the default disposition installs no handler.
    unsafe { sigaction(Signal::SIGCHLD, &default) }
        .context("restoring the default disposition of SIGCHLD")?;
    Ok(())
}

static HOLD_ASKED: AtomicBool = AtomicBool::new(false);
static CONTINUED: AtomicBool = AtomicBool::new(false);

extern "C" fn remember_job_control(signal: nix::libc::c_int) {
    // Storing an atomic is async-signal-safe.
    if signal == nix::libc::SIGCONT {
        CONTINUED.store(true, Ordering::SeqCst);
    } else {
        HOLD_ASKED.store(true, Ordering::SeqCst);
    }
}

/// The signals of job control: Ctrl-Z, and a background job that reads or writes its terminal.
pub const JOB_CONTROL: [Signal; 3] = [Signal::SIGTSTP, Signal::SIGTTIN, Signal::SIGTTOU];

/// Takes job control on for a process that holds others (the process outside an isolated run): each of
/// [`JOB_CONTROL`] that the invoker did not leave ignored (a shell without job control) becomes a request
/// to hold ([`hold_asked`]) instead of stopping this process alone, and SIGCONT is noted ([`continued`]).
pub fn take_job_control() -> Result<()> {
    let action = SigAction::new(SigHandler::Handler(remember_job_control), SaFlags::empty(), SigSet::empty());
    for signal in JOB_CONTROL.into_iter().chain([Signal::SIGCONT]) {
        if signal != Signal::SIGCONT && is_ignored(signal)? {
            continue;
        }
        // SAFETY: the handler only stores into atomics, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }
            .with_context(|| format!("installing a handler for {signal}"))?;
    }
    Ok(())
}

/// Whether a signal of job control came since the last call.
pub fn hold_asked() -> bool {
    HOLD_ASKED.swap(false, Ordering::SeqCst)
}

/// Whether SIGCONT came since the last call.
pub fn continued() -> bool {
    CONTINUED.swap(false, Ordering::SeqCst)
}

/// The first stop signal received, if any.
pub fn received() -> Option<Signal> {
    Signal::try_from(RECEIVED.load(Ordering::SeqCst)).ok()
}

/// The first stop signal received, waiting up to `limit` for one to come.
pub fn wait_received(limit: std::time::Duration) -> Option<Signal> {
    let start = std::time::Instant::now();
    loop {
        if let Some(signal) = received() {
            return Some(signal);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The error of a run stopped by a signal; `main` turns it into the exit status 128 + signal number.
#[derive(Debug)]
pub struct Interrupted(pub Signal);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}", self.0)
    }
}

impl std::error::Error for Interrupted {}

/// `Err(Interrupted)` once a stop signal has come.
pub fn check() -> Result<()> {
    match received() {
        Some(signal) => Err(Interrupted(signal).into()),
        None => Ok(()),
    }
}
