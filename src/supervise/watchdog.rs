//! The last word on a process's `--timeout`: a thread that ends the process where its own checks cannot. Every
//! wait of the program looks at the deadline and stops a run in order; but a call that never returns (a
//! `cuInit` or another driver call that hangs, a set-up thread that does not come back) would keep the
//! process, and the processes that wait for it, past `--timeout` for good. Once the deadline has passed and
//! a grace more, counted only while the process runs (a run held by Ctrl-Z and continued late still gets its
//! grace to stop in order), the thread says why, writes the run's `--json` and `--metrics` documents as a
//! failure for that reason (the [`LastWord`] that `main` left it, so that a node's files never keep the
//! previous run's pass), prints the verdict line and ends the process (exit 1): the kernel and the driver
//! release what it held, its children die with it (`PR_SET_PDEATHSIG`), and its guardian removes its files.
//!
//! The last word is the one thing of the run's end kept outside `main`: the main thread may be the one stuck
//! in the call, so the watchdog cannot hand it back a value. It carries no result, only where the documents
//! go; one lock orders it with the watchdog's disarming, so that a run that finished in time writes its own
//! documents and never also the watchdog's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long past the deadline a process has to stop in order before the watchdog ends it.
pub(crate) const GRACE: Duration = Duration::from_secs(3);
/// How often the thread looks; a look that comes later than twice this counts as this (the process was
/// stopped meanwhile).
const TICK: Duration = Duration::from_millis(50);

pub(crate) use crate::report::LastWord;

/// Where this process's documents go, left by `main` ([`leave_last_word`]); its lock is held while a watchdog
/// is disarmed and while one ends the process, so that only one of them says how the run ended.
static LAST_WORD: Mutex<Option<LastWord>> = Mutex::new(None);

/// Leaves the watchdog what writes this process's documents, should it have to end the process.
pub(crate) fn leave_last_word(write: LastWord) {
    *LAST_WORD.lock().unwrap_or_else(PoisonError::into_inner) = Some(write);
}

/// The watchdog of one process; dropped, it ends (a process that finished in time needs it no more).
pub(crate) struct Watchdog {
    disarmed: Arc<AtomicBool>,
}

impl Watchdog {
    /// Starts the watchdog for `deadline`, `timeout` after the start (`None`: `--timeout 0`, no watchdog).
    pub(crate) fn start(deadline: Option<(Instant, Duration)>) -> Option<Self> {
        let (at, timeout) = deadline?;
        let disarmed = Arc::new(AtomicBool::new(false));
        let flag = disarmed.clone();
        let started = Instant::now();
        let spawned = std::thread::Builder::new().name("watchdog".into()).spawn(move || {
            let mut overdue = Duration::ZERO;
            while overdue < GRACE {
                let before = Instant::now();
                std::thread::sleep(TICK);
                if flag.load(Ordering::Acquire) {
                    return;
                }
                if Instant::now() >= at {
                    overdue += before.elapsed().min(2 * TICK);
                }
            }
            let last_word = LAST_WORD.lock().unwrap_or_else(PoisonError::into_inner);
            // Disarmed meanwhile: the process finished in time after all, and says so itself.
            if flag.load(Ordering::Acquire) {
                return;
            }
            give_up(timeout, started.elapsed(), last_word.as_ref());
        });
        // Without its thread a process still has its own checks: it goes on.
        spawned.ok().map(|_| Self { disarmed })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Under the last word's lock: a watchdog ending the process holds it until the process is gone.
        let _ordered = LAST_WORD.lock().unwrap_or_else(PoisonError::into_inner);
        self.disarmed.store(true, Ordering::Release);
    }
}

/// Says why, writes the documents (`last_word`) and the verdict line, and ends the process at once.
fn give_up(timeout: Duration, ran: Duration, last_word: Option<&LastWord>) -> ! {
    let why = format!(
        "this process did not finish within --timeout {} s (nor {} s more to stop in order): its own \
         watchdog ended it",
        timeout.as_secs_f64(),
        GRACE.as_secs()
    );
    eprint_line!("simple-ipc: {why}");
    // The documents first, as `main` writes them: the verdict line is the run's last word.
    if let Some(write) = last_word
        && let Err(e) = write(&why)
    {
        eprint_line!("simple-ipc: {e:#}");
    }
    let line = crate::report::verdict::line(crate::report::Status::Failed, Some(&why), None, 1, ran);
    let _ = crate::output::verdict(&line);
    // SAFETY: ends the process at once, without the destructors of a main thread stuck in a call; the kernel
    // and the driver release what it held.
    unsafe { nix::libc::_exit(1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that finished in time drops its watchdog, which then ends nothing, even with its deadline
    /// long past (were it not disarmed, it would end this test's process, and the whole test run with it).
    #[test]
    fn a_watchdog_dropped_in_time_ends_nothing() {
        let past = Instant::now().checked_sub(Duration::from_secs(1)).unwrap_or_else(Instant::now);
        let dog = Watchdog::start(Some((past, Duration::from_secs(1))));
        assert!(dog.is_some(), "its thread started");
        drop(dog);
        std::thread::sleep(GRACE + 4 * TICK);
        assert!(Watchdog::start(None).is_none(), "--timeout 0: no watchdog");
    }
}
