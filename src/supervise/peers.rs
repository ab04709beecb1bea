//! The parent's peers: the other processes of its run, whether it started them (`children`) or they joined
//! it (`joiners`). Both are one kind to the parent: [`wait`] is the one loop that watches them until each
//! has ended well, stopping them all at the first failure, a stop signal or the watchdog's deadline, and
//! [`PeerFailed`] is how one of either kind ended badly.
//!
//! The parent decides the run's status, and not every peer that ends early has failed: one that ended by
//! SIGPIPE (killed by it, or exit 141) while the run's shared output has lost its reader ended because the
//! reader went away, and the run ends with 141 too; one that ended by a stop signal (exit 130, 143, 129)
//! that the parent also received was stopped with the whole group, and the run ends with the parent's 128+N.
//! Neither can make a pass: only a run whose every peer ended well passes.

use std::time::{Duration, Instant};

use anyhow::Result;
use nix::sys::signal::Signal;

use crate::os::signals::{self, Interrupted};
use crate::output::{self, ReaderGone};

/// How often the parent looks at its peers while they run.
const POLL: Duration = Duration::from_millis(1);
/// How long the parent waits for a stop signal of its own after a peer ended by one: a signal to the whole
/// group reaches every process at once, but the parent's handler may run a moment after the peer is gone,
/// and a sender that signals the processes one by one (a supervisor, a script) may be slower still on a
/// loaded machine (100 ms was seen to be too short beside another test suite on 2 cores). Only a peer
/// stopped by a signal alone waits this long before it is named.
const GROUP_SIGNAL_GRACE: Duration = Duration::from_millis(300);

/// A peer that ended badly: which, and how.
#[derive(Debug)]
pub(crate) struct PeerFailed {
    pub index: usize,
    pub how: String,
    /// The signal it ended by: killed by it, or exited 128 + its number after an orderly stop.
    pub by: Option<Signal>,
    /// A joiner's diagnosis of its failure, where it had one (for the `--json` document).
    pub diagnosis: Option<crate::ipc::diagnose::Diagnosis>,
    /// The driver's refusal of a handle in a joiner, where that was why (its word: it fails the run).
    pub refused: Option<crate::ipc::refused::Refused>,
}

impl PeerFailed {
    pub(crate) fn new(index: usize, how: String) -> Self {
        Self { index, how, by: None, diagnosis: None, refused: None }
    }

    /// What the peer's ending means for the run (see the module's doc): [`ReaderGone`], the parent's own
    /// [`Interrupted`], or this failure.
    pub(crate) fn verdict(self) -> anyhow::Error {
        match self.by {
            Some(Signal::SIGPIPE) if output::reader_gone() => ReaderGone.into(),
            Some(signal) if signals::STOP_SIGNALS.contains(&signal) => {
                match signals::wait_received(GROUP_SIGNAL_GRACE) {
                    Some(ours) => Interrupted(ours).into(),
                    None => self.into(),
                }
            }
            _ => self.into(),
        }
    }
}

impl std::fmt::Display for PeerFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Process {} failed! ({})", self.index, self.how)
    }
}

impl std::error::Error for PeerFailed {}

/// What the parent asks of its peers of one kind.
pub(crate) trait Peers {
    /// What [`wait`] says it did once one failed: "every process stopped".
    const STOPPED: &'static str;
    /// Whether every peer has ended well (a joiner: has come, and said so).
    fn all_ended(&self) -> bool;
    /// `Err` once the watchdog's deadline has passed, naming where each peer is.
    fn check_deadline(&self) -> Result<()>;
    /// One look at the peers (and, for joiners, at the door): the first that ended badly.
    fn look(&mut self) -> Result<Option<PeerFailed>>;
    /// Aborts the run and stops the peers still there (`failed`: because of that one).
    fn stop(&mut self, failed: Option<usize>);
}

/// Waits until every peer has ended well, or until `enough()`, calling `tick` at every look. The first that
/// fails, a stop signal, the watchdog or `ended_early` (a process the parent started for the peers has ended
/// badly) aborts the run: the others are stopped and the error says who failed and how.
pub(crate) fn wait<P: Peers>(
    peers: &mut P,
    enough: impl Fn() -> bool,
    mut tick: impl FnMut(),
    mut ended_early: impl FnMut() -> Option<anyhow::Error>,
) -> Result<()> {
    while !peers.all_ended() {
        tick();
        if enough() {
            return Ok(());
        }
        look_once(peers, &mut ended_early)?;
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// One look of [`wait`], for a process that works while its peers run (the parent while it exports): a stop
/// signal or the deadline stops them all; the first peer that failed stops the others and is the error,
/// said as `wait` says it.
pub(crate) fn look_once<P: Peers>(
    peers: &mut P,
    mut ended_early: impl FnMut() -> Option<anyhow::Error>,
) -> Result<()> {
    if let Err(stopped) = signals::check().and_then(|()| peers.check_deadline()) {
        peers.stop(None);
        return Err(stopped);
    }
    if let Some(failure) = peers.look()? {
        let seen = Instant::now();
        let verdict = failure.verdict();
        let Some(failure) = verdict.downcast_ref::<PeerFailed>() else {
            // The reader went away, or the whole group was stopped: no peer is to blame.
            peers.stop(None);
            return Err(verdict);
        };
        peers.stop(Some(failure.index));
        eprint_line!(
            "simple-ipc: {} {:.0} ms after process {} was seen to fail",
            P::STOPPED,
            seen.elapsed().as_secs_f64() * 1e3,
            failure.index
        );
        return Err(verdict);
    }
    if let Some(failure) = ended_early() {
        peers.stop(None);
        return Err(failure);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Peers that end well after `looks` looks, or one that fails at its last.
    struct Fake {
        looks: usize,
        failing: Option<PeerFailed>,
        stopped: Vec<Option<usize>>,
    }

    impl Peers for Fake {
        const STOPPED: &'static str = "every fake stopped";
        fn all_ended(&self) -> bool {
            self.looks == 0
        }
        fn check_deadline(&self) -> Result<()> {
            Ok(())
        }
        fn look(&mut self) -> Result<Option<PeerFailed>> {
            self.looks -= 1;
            Ok(if self.looks == 0 { self.failing.take() } else { None })
        }
        fn stop(&mut self, failed: Option<usize>) {
            self.stopped.push(failed);
        }
    }

    #[test]
    fn the_wait_ends_when_every_peer_has_and_at_the_first_failure_stops_the_others() {
        let mut well = Fake { looks: 3, failing: None, stopped: vec![] };
        let mut ticks = 0;
        wait(&mut well, || false, || ticks += 1, || None).unwrap();
        assert_eq!(
            (well.looks, ticks, well.stopped.len()),
            (0, 3, 0),
            "looked until all ended, none stopped"
        );

        let mut enough = Fake { looks: 3, failing: None, stopped: vec![] };
        wait(&mut enough, || true, || {}, || None).unwrap();
        assert_eq!(enough.looks, 3, "enough before any look");

        // Killed by SIGKILL, or by SIGPIPE while the run's output still has its reader: a failure of its own.
        assert!(!output::reader_gone(), "this test's output has its reader");
        for by in [None, Some(Signal::SIGKILL), Some(Signal::SIGPIPE)] {
            let failing = PeerFailed { by, ..PeerFailed::new(2, "exit 1".into()) };
            let mut one = Fake { looks: 2, failing: Some(failing), stopped: vec![] };
            let error = wait(&mut one, || false, || {}, || None).unwrap_err();
            assert_eq!(error.to_string(), "Process 2 failed! (exit 1)");
            assert!(error.is::<PeerFailed>(), "{by:?}: {error:?}");
            assert_eq!(one.stopped, [Some(2)], "the others stopped because of process 2");
        }

        let mut early = Fake { looks: 3, failing: None, stopped: vec![] };
        let error =
            wait(&mut early, || false, || {}, || Some(anyhow::anyhow!("the guardian ended"))).unwrap_err();
        assert_eq!(error.to_string(), "the guardian ended");
        assert_eq!(early.stopped, [None]);
    }
}
