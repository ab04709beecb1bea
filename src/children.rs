//! The parent's children: started by re-executing this program (`/proc/self/exe`) with their index and the
//! segment's descriptor, watched until they all exit, and stopped together as soon as one fails, a signal
//! comes or the watchdog's deadline passes. Dropping [`Children`] stops and reaps whatever still runs, so no
//! path out of the parent leaves a child behind.
//!
//! The parent decides the run's status, and not every child that ends early has failed: one that ended by
//! SIGPIPE (killed by it, or exit 141) while the run's shared output has lost its reader ended because the
//! reader went away, and the run ends with 141 too; one that ended by a stop signal (exit 130, 143, 129)
//! that the parent also received was stopped with the whole group, and the run ends with the parent's 128+N.
//! Neither can make a pass: only a run whose every child exited 0 passes.

use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;

use crate::inherit;
use crate::output::{self, ReaderGone};
use crate::role::{Child, Role};
use crate::segment::{Segment, SharedState};
use crate::signals::{self, Interrupted};
use crate::timings::progress_of;

/// How long stopped children get to close what they opened before they are killed: every wait of a child
/// looks at the abort flag at least every 10 ms, so one that has not left by then is hung or stopped.
const GRACE: Duration = Duration::from_millis(300);
/// How often the parent looks at its children while they run.
const POLL: Duration = Duration::from_millis(1);

/// A child process that has not been reaped yet.
struct Running {
    index: usize,
    pid: Pid,
}

/// A child that ended badly: which, and how.
#[derive(Debug)]
pub struct ChildFailed {
    pub index: usize,
    pub how: String,
    /// The signal it ended by: killed by it, or exited 128 + its number after an orderly stop.
    pub by: Option<Signal>,
}

/// How long the parent waits for a stop signal of its own after a child ended by one: a signal to the whole
/// group reaches every process at once, but the parent's handler may run a moment after the child is gone.
const GROUP_SIGNAL_GRACE: Duration = Duration::from_millis(100);

impl ChildFailed {
    fn of(index: usize, status: WaitStatus) -> Option<Self> {
        let (how, by) = match status {
            WaitStatus::Exited(_, 0) => return None,
            WaitStatus::Exited(_, code) => {
                (format!("exit code {code}"), code.checked_sub(128).and_then(|n| Signal::try_from(n).ok()))
            }
            WaitStatus::Signaled(_, signal, _) => (format!("killed by {signal}"), Some(signal)),
            other => (format!("{other:?}"), None),
        };
        Some(Self { index, how, by })
    }

    /// What the child's ending means for the run (see the module's doc): [`ReaderGone`], the parent's own
    /// [`Interrupted`], or this failure.
    fn verdict(self) -> anyhow::Error {
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

impl std::fmt::Display for ChildFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Process {} failed! ({})", self.index, self.how)
    }
}

impl std::error::Error for ChildFailed {}

/// The running children of one run, with the segment they share.
pub struct Children<'s> {
    state: &'s SharedState,
    running: Vec<Running>,
    /// When the watchdog stops the run (`--timeout`); `None`: never.
    deadline: Option<(Instant, Duration)>,
}

impl<'s> Children<'s> {
    /// Starts a child for each index (the benchmark's producer where `bench`, printing only its verdict where
    /// `quiet`), with the segment's descriptor, and, where `sockets` has one for it (the first for the first index), its end of a descriptor socket. Each gets SIGKILL if the parent dies
    /// (`PR_SET_PDEATHSIG`). With a `timeout`, [`Children::wait`] stops the run once that long has passed
    /// since `started`.
    pub fn spawn(
        segment: &'s Segment,
        indices: Range<usize>,
        bench: bool,
        quiet: bool,
        sockets: &[OwnedFd],
        started: Instant,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        let state = segment.state();
        // A limit past what the clock can count (`--timeout` up to u64::MAX seconds) never comes: no deadline.
        let deadline = timeout.and_then(|t| Some((started.checked_add(t)?, t)));
        let mut children = Self { state, running: Vec::with_capacity(indices.len()), deadline };
        let argv0 = std::env::args_os().next().unwrap_or_else(|| "simple-ipc".into());
        let fd = segment.fd();
        let first = indices.start;
        for index in indices {
            let socket = sockets.get(index - first).map(|s| s.as_raw_fd());
            let child = Child { index: index as u32, segment_fd: Some(fd), socket_fd: socket, bench, quiet };
            let mut command = Command::new("/proc/self/exe");
            command.arg0(&argv0).args(Role::Child(child).to_args()).stdin(Stdio::null());
            // SAFETY: runs in the forked child before exec; prctl and fcntl are async-signal-safe and
            // allocate nothing.
            unsafe {
                command.pre_exec(move || {
                    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
                    inherit::keep_across_exec(fd)?;
                    socket.map_or(Ok(()), inherit::keep_across_exec)
                });
            }
            // On error, `children` is dropped here and stops the ones already started.
            let child =
                command.spawn().with_context(|| format!("starting process {index} (/proc/self/exe)"))?;
            children.running.push(Running { index, pid: Pid::from_raw(child.id() as i32) });
        }
        Ok(children)
    }

    /// Waits until every child has exited 0, or until `enough()`, calling `tick` at every look. The first
    /// that fails, or a stop signal, aborts the run: the others are stopped (see [`Children::stop`]) and the
    /// error says who failed and how.
    pub fn wait(&mut self, enough: impl Fn() -> bool, mut tick: impl FnMut()) -> Result<()> {
        while !self.running.is_empty() {
            tick();
            if enough() {
                return Ok(());
            }
            if let Err(interrupted) = signals::check() {
                self.stop(None);
                return Err(interrupted);
            }
            if let Err(late) = self.check_deadline() {
                self.stop(None);
                return Err(late);
            }
            if let Some(failure) = self.reap(WaitPidFlag::WNOHANG) {
                let seen = Instant::now();
                let verdict = failure.verdict();
                let Some(failure) = verdict.downcast_ref::<ChildFailed>() else {
                    // The reader went away, or the whole group was stopped: no child is to blame.
                    self.stop(None);
                    return Err(verdict);
                };
                self.stop(Some(failure.index));
                warn!(
                    "simple-ipc: every process stopped {:.0} ms after process {} was seen to fail",
                    seen.elapsed().as_secs_f64() * 1e3,
                    failure.index
                );
                return Err(verdict);
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    /// Which children are still running, and the phase each one reported last.
    fn where_each_one_is(&self) -> String {
        let places: Vec<String> = self
            .running
            .iter()
            .map(|child| {
                let word = self.state.progress[child.index].load(std::sync::atomic::Ordering::Acquire);
                let stopped = if is_stopped(child.pid) { ", stopped (SIGSTOP)" } else { "" };
                format!("process {} was {}{stopped}", child.index, progress_of(word))
            })
            .collect();
        format!("Not finished: {}.", places.join("; "))
    }

    /// Reaps the children that have exited; returns the first failure among them.
    fn reap(&mut self, flags: WaitPidFlag) -> Option<ChildFailed> {
        let mut failure = None;
        self.running.retain(|child| {
            let ended = match waitpid(child.pid, Some(flags)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => return true,
                Ok(status) => ChildFailed::of(child.index, status),
                // ECHILD: someone else reaped our child (SIGCHLD ignored, or a stray `waitpid(-1)`). Its
                // status is lost, so it cannot count as a pass.
                Err(e) => Some(ChildFailed {
                    index: child.index,
                    how: format!("its exit status was lost: {e}"),
                    by: None,
                }),
            };
            if ended.is_some() && failure.is_none() {
                failure = ended;
            }
            false
        });
        failure
    }

    /// `Err` once the watchdog's deadline has passed, naming where each child still running is.
    pub fn check_deadline(&self) -> Result<()> {
        match self.deadline {
            Some((deadline, timeout)) if Instant::now() >= deadline => Err(anyhow!(
                "the run did not finish within {} s (--timeout); stopped it. {}",
                timeout.as_secs_f64(),
                self.where_each_one_is()
            )),
            _ => Ok(()),
        }
    }

    /// `Err` once any child has exited (without reaping it, so that [`Children::wait`] still reports how),
    /// or the watchdog's deadline has passed: the stop check of a parent that works while its children run.
    pub fn check_all_alive(&self) -> Result<()> {
        self.check_deadline()?;
        for child in &self.running {
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            match waitid(Id::Pid(child.pid), flags) {
                Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
                // Ended by the run's reader going away, or stopped with the group: the run's status, not a
                // failure of this child.
                Ok(status) => match ChildFailed::of(child.index, status).map(ChildFailed::verdict) {
                    Some(verdict) if !verdict.is::<ChildFailed>() => return Err(verdict),
                    _ => bail!("process {} has ended", child.index),
                },
                Err(_) => bail!("process {} has ended", child.index),
            }
        }
        Ok(())
    }

    /// Aborts the run, gives the children [`GRACE`] to leave in order, then kills and reaps the rest.
    pub fn stop(&mut self, failed: Option<usize>) {
        if self.running.is_empty() {
            return;
        }
        self.state.abort();
        let deadline = Instant::now() + GRACE;
        while !self.running.is_empty() && Instant::now() < deadline {
            self.reap(WaitPidFlag::WNOHANG);
            std::thread::sleep(POLL);
        }
        for child in &self.running {
            let _ = kill(child.pid, Signal::SIGKILL);
            if let Some(failed) = failed {
                warn!("Process {} did not stop after process {failed} failed: killed", child.index);
            }
        }
        for child in self.running.drain(..) {
            let _ = waitpid(child.pid, None);
        }
    }
}

/// Whether the process is stopped by a signal (its state in `/proc/<pid>/stat` is `T`).
fn is_stopped(pid: Pid) -> bool {
    crate::proc_stat::read(pid.as_raw()).is_some_and(|stat| stat.state == 'T')
}

impl Drop for Children<'_> {
    fn drop(&mut self) {
        self.stop(None);
    }
}
