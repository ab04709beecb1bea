//! Step 4, spawnProcess, and step 5, waitProcess: the parent's children, started by re-executing this
//! program (`/proc/self/exe`) with their index and the segment's descriptor, watched until they all exit,
//! and stopped together as soon as one fails, a signal comes or the watchdog's deadline passes. Dropping
//! [`Children`] stops and reaps whatever still runs, so no path out of the parent leaves a child behind.
//! They are the parent's peers (`peers`), as joiners are: both are [`Processes`] to the parent.

use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use nix::sys::signal::Signal;

use super::extras::Processes;
use crate::phases::timings::{Timeout, progress_of};
use crate::role::{Child, Role};
use crate::segment::Segment;
use crate::supervise::peers::{self, PeerFailed, Peers};
use crate::supervise::relaunch::{Ended, OnDrop, Process, Relaunch};
use crate::supervise::sigbus;

/// How long stopped children get to close what they opened before they are killed: every wait of a child
/// looks at the abort flag at least every 10 ms, so one that has not left by then is hung or stopped.
const GRACE: Duration = Duration::from_millis(300);
/// A child process that has not been reaped yet.
struct Running {
    index: usize,
    process: Process,
}

/// How a child ended, if badly (see `peers` for what that means for the run). One killed by SIGBUS is
/// said with its likely cause and fix (`sigbus`), which the `--json` document carries as fields.
fn failed(index: usize, ended: Ended) -> Option<PeerFailed> {
    let (how, by) = match ended {
        Ended::Exited(0) => return None,
        Ended::Exited(code) => {
            (format!("exit code {code}"), code.checked_sub(128).and_then(|n| Signal::try_from(n).ok()))
        }
        Ended::Killed(Signal::SIGBUS) => {
            let why = sigbus::diagnosis();
            let how = format!("killed by SIGBUS: {why}");
            return Some(PeerFailed {
                by: Some(Signal::SIGBUS),
                diagnosis: Some(why),
                ..PeerFailed::new(index, how)
            });
        }
        Ended::Killed(signal) => (format!("killed by {signal}"), Some(signal)),
        // Someone else reaped our child (SIGCHLD ignored, or a stray `waitpid(-1)`). Its status is lost,
        // so it cannot count as a pass.
        Ended::Lost(e) => (format!("its exit status was lost: {e}"), None),
    };
    Some(PeerFailed { by, ..PeerFailed::new(index, how) })
}

/// The running children of one run, with the segment they share.
pub struct Children<'s> {
    segment: &'s Segment,
    running: Vec<Running>,
    /// When the watchdog stops the run (`--timeout`); `None`: never.
    deadline: Option<(Instant, Duration)>,
    /// How long this process was held stopped while it waited (said where the deadline passes).
    held: crate::supervise::held::Held,
    /// The benchmark's producer, and `--quiet`: what each child is told.
    bench: bool,
    quiet: bool,
}

impl<'s> Children<'s> {
    /// Starts a child for each index (the benchmark's producer where `bench`, printing only its verdict where
    /// `quiet`), with the segment's descriptor, and, where `sockets` has one for it (the first for the first
    /// index), its end of a descriptor socket. Each gets SIGKILL if the parent dies (`PR_SET_PDEATHSIG`).
    /// With a `timeout`, `peers::wait` stops the run once that long has passed since `started`.
    pub fn spawn(
        segment: &'s Segment,
        indices: Range<usize>,
        bench: bool,
        quiet: bool,
        sockets: &[OwnedFd],
        started: Instant,
        timeout: Timeout,
    ) -> Result<Self> {
        let deadline = timeout.deadline_from(started);
        let held = crate::supervise::held::Held::new();
        let mut children = Self { segment, running: Vec::new(), deadline, held, bench, quiet };
        // On error, `children` is dropped here and stops the ones already started.
        children.spawn_more(indices, sockets)?;
        Ok(children)
    }

    /// Starts a child for each index more, as [`Children::spawn`] does: the first device's children start
    /// before the devices are chosen, the others once they are.
    pub fn spawn_more(&mut self, indices: Range<usize>, sockets: &[OwnedFd]) -> Result<()> {
        let fd = self.segment.fd();
        let first = indices.start;
        self.running.reserve(indices.len());
        for index in indices {
            let socket = sockets.get(index - first).map(AsRawFd::as_raw_fd);
            let child = Child {
                index: index as u32,
                segment_fd: Some(fd),
                socket_fd: socket,
                bench: self.bench,
                quiet: self.quiet,
            };
            let mut start = Relaunch::new(format!("process {index}"));
            start.args(Role::Child(child).to_args()).keep(fd);
            if let Some(socket) = socket {
                start.keep(socket);
            }
            // Stopped by the abort flag in the segment (see `stop`), then killed.
            start.death_signal(Signal::SIGKILL);
            start.on_drop(OnDrop::Stop { signal: None, grace: GRACE });
            self.running.push(Running { index, process: start.spawn()? });
        }
        Ok(())
    }

    /// Which children are still running, and the phase each one reported last.
    fn where_each_one_is(&self) -> String {
        let places: Vec<String> = self
            .running
            .iter()
            .map(|child| {
                let word =
                    self.segment.state().progress[child.index].load(std::sync::atomic::Ordering::Acquire);
                let stopped = if child.process.is_stopped() { ", stopped (SIGSTOP)" } else { "" };
                format!("process {} was {}{stopped}", child.index, progress_of(word))
            })
            .collect();
        // No full stop at the end: a context may follow it.
        format!("Not finished: {}", places.join("; "))
    }

    /// Reaps the children that have exited; returns the first failure among them.
    fn reap(&mut self) -> Option<PeerFailed> {
        let mut failure = None;
        self.running.retain_mut(|child| {
            let Some(ended) = child.process.try_wait() else { return true };
            let ended = failed(child.index, ended);
            if ended.is_some() && failure.is_none() {
                failure = ended;
            }
            false
        });
        failure
    }

    /// `Err` once the watchdog's deadline has passed, naming where each child still running is.
    fn check_deadline(&self) -> Result<()> {
        self.held.look();
        match self.deadline {
            Some((deadline, timeout)) if Instant::now() >= deadline => Err(anyhow!(
                "the run did not finish within {} s (--timeout); stopped it.{} {}",
                timeout.as_secs_f64(),
                self.held.said(),
                self.where_each_one_is()
            )),
            _ => Ok(()),
        }
    }

    /// `Err` once any child has exited (without reaping it, so that `peers::wait` still reports how),
    /// or the watchdog's deadline has passed: the stop check of a parent that works while its children run.
    pub fn check_all_alive(&self) -> Result<()> {
        self.check_deadline()?;
        for child in &self.running {
            let Some(ended) = child.process.peek() else { continue };
            // Ended by the run's reader going away, or stopped with the group: the run's status, not a
            // failure of this child.
            match failed(child.index, ended).map(PeerFailed::verdict) {
                Some(verdict) if !verdict.is::<PeerFailed>() => return Err(verdict),
                _ => bail!("process {} has ended", child.index),
            }
        }
        Ok(())
    }

    /// Aborts the run, gives the children [`GRACE`] to leave in order, then kills and reaps the rest.
    pub fn stop(&mut self, failed: Option<usize>) {
        if self.running.is_empty() {
            return;
        }
        self.segment.state().abort();
        let killed =
            crate::supervise::relaunch::stop_all(self.running.iter_mut().map(|child| &mut child.process));
        for (child, _) in self.running.drain(..).zip(killed).filter(|(_, killed)| *killed) {
            if let Some(failed) = failed {
                eprint_line!("Process {} did not stop after process {failed} failed: killed", child.index);
            }
        }
    }
}

impl Processes for Children<'_> {
    fn wait(&mut self, enough: &dyn Fn() -> bool, tick: &mut dyn FnMut()) -> Result<()> {
        peers::wait(self, enough, tick, || None)
    }

    fn check_alive(&mut self) -> Result<()> {
        peers::look_once(self, || None)
    }

    fn stop(&mut self) {
        Children::stop(self, None);
    }
}

impl Peers for Children<'_> {
    const STOPPED: &'static str = "every process stopped";

    fn all_ended(&self) -> bool {
        self.running.is_empty()
    }

    fn check_deadline(&self) -> Result<()> {
        Children::check_deadline(self)
    }

    fn look(&mut self) -> Result<Option<PeerFailed>> {
        Ok(self.reap())
    }

    fn stop(&mut self, failed: Option<usize>) {
        Children::stop(self, failed);
    }
}

impl Drop for Children<'_> {
    fn drop(&mut self) {
        self.stop(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child killed by SIGBUS is said with /dev/shm and the fix, in its words and as the diagnosis the
    /// `--json` document carries; any other signal is said as it was.
    #[test]
    fn a_child_killed_by_sigbus_names_dev_shm_and_the_fix() {
        let failure = failed(1, Ended::Killed(Signal::SIGBUS)).expect("a failure");
        let said = failure.to_string();
        assert!(
            said.starts_with("Process 1 failed! (killed by SIGBUS: most likely a full /dev/shm"),
            "{said}"
        );
        assert!(said.contains("what fixes it: a larger /dev/shm: Docker --shm-size=1g"), "{said}");
        assert_eq!(failure.by, Some(Signal::SIGBUS));
        assert!(failure.diagnosis.is_some_and(|d| d.fix.contains("--shm-size")));
        let killed = failed(2, Ended::Killed(Signal::SIGSEGV)).expect("a failure");
        assert_eq!(
            (killed.to_string().as_str(), killed.diagnosis),
            ("Process 2 failed! (killed by SIGSEGV)", None)
        );
    }
}
