//! SIGINT, SIGTERM and SIGHUP become a flag that the waits of every process look at, so that an interrupted
//! run stops in order: children close what they opened, the parent frees what it exported, the segment goes.

use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, Result};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn remember(signal: nix::libc::c_int) {
    // Only the first signal counts; storing an atomic is async-signal-safe.
    let _ = RECEIVED.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
}

/// Installs the handlers (without SA_RESTART, so that a blocking wait returns early).
pub fn install() -> Result<()> {
    let action = SigAction::new(SigHandler::Handler(remember), SaFlags::empty(), SigSet::empty());
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }
            .with_context(|| format!("installing a handler for {signal}"))?;
    }
    Ok(())
}

/// The first stop signal received, if any.
pub fn received() -> Option<Signal> {
    Signal::try_from(RECEIVED.load(Ordering::SeqCst)).ok()
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
