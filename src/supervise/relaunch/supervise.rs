//! Following a started process of this program until it ends, as its starter's [`Policies`] say: its output
//! passed on as it comes ([`Output`]), its result read as it comes (the report pipe), the first stop signal
//! this process receives passed on (then a grace, then SIGKILL to it and all it started), a deadline past
//! which it and all it started are killed, and job control for a process that holds a whole run (the
//! process outside an isolated run): Ctrl-Z stops the run, then this process, and `fg` continues both.
//! A run of `--ipc all` and an isolated run are followed by this one loop.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, poll};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{Ended, Process};
use crate::os::signals;

/// How often the loop looks at the process while it waits for output.
const LOOK_MS: u8 = 10;
/// How long the output of a process that has exited is still read (what it started may still be writing as
/// it dies); a grandchild that keeps the pipes open cannot hold this process longer.
const DRAIN: Duration = Duration::from_secs(1);

/// How a process is followed.
pub(crate) struct Policies {
    /// Past it, the process and all it started are killed: it could not stop itself (stopped, frozen).
    pub deadline: Option<Instant>,
    /// How long it has to end after a stop signal was passed on.
    pub stop_grace: Duration,
    /// Ctrl-Z holds it, and all it started, stopped with this process (see [`signals::take_job_control`]).
    pub job_control: bool,
}

/// How a followed process ended.
pub(crate) struct Followed {
    pub ended: Ended,
    /// The stop signal this process received and passed on (SIGPIPE where the reader of its standard output
    /// went away: the process was then stopped with SIGTERM).
    pub stopped_by: Option<Signal>,
    /// Killed at its deadline: `Some(what was stopped then)`, named where a process of it was.
    pub late: Option<Option<String>>,
    /// How long job control held it stopped.
    pub held: Duration,
}

/// Follows `process` until it has ended and its `outputs` are at their end (or [`DRAIN`] has passed since).
/// Dropped before it has ended (this process's own output failed), the process is stopped and reaped as its
/// handle says.
pub(crate) fn follow(process: &mut Process, policies: &Policies, outputs: &mut [Output]) -> Result<Followed> {
    let stdout = std::io::stdout();
    let mut deadline = policies.deadline;
    let mut exited: Option<(Ended, Instant)> = None;
    let mut stopped: Option<(Signal, Instant)> = None;
    let (mut reader_gone, mut killed) = (false, false);
    let mut late = None;
    let mut held = Duration::ZERO;
    loop {
        if let Some(at) = deadline
            && exited.is_none()
            && !killed
            && Instant::now() >= at
        {
            late = Some(stopped_among(process.pid()));
            process.kill_all();
            killed = true;
        }
        if policies.job_control && exited.is_none() && signals::hold_asked() {
            let stopped_for = hold(process.pid());
            held += stopped_for;
            deadline = deadline.map(|d| d + stopped_for);
        }
        // Continued after a SIGSTOP of this process alone (which it cannot see): the run goes on too.
        if policies.job_control && signals::continued() && exited.is_none() {
            signal_all(process.pid(), Signal::SIGCONT);
        }
        let cause = signals::received().or(reader_gone.then_some(Signal::SIGPIPE));
        if let Some(cause) = cause.filter(|_| stopped.is_none()) {
            if exited.is_none() {
                process.signal(if cause == Signal::SIGPIPE { Signal::SIGTERM } else { cause });
            }
            stopped = Some((cause, Instant::now()));
        }
        if let Some((_, since)) = stopped
            && exited.is_none()
            && !killed
            && since.elapsed() > policies.stop_grace
        {
            process.kill_all();
            killed = true;
        }
        process.read_report()?;
        if exited.is_none() {
            exited = process.try_wait().map(|status| (status, Instant::now()));
        }
        if let Some((ended, at)) = exited
            && (outputs.iter().all(|output| output.fd.is_none()) || at.elapsed() > DRAIN)
        {
            process.read_report()?;
            return Ok(Followed { ended, stopped_by: stopped.map(|(cause, _)| cause), late, held });
        }
        let mut polled: Vec<PollFd> = outputs
            .iter()
            .filter_map(|output| output.fd.as_ref())
            .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
            .collect();
        // Our own standard output, for POLLERR alone (a pipe whose reader has gone), where the process's
        // output is passed on to it.
        let watch_stdout = !reader_gone && outputs.iter().any(|output| matches!(output.echo, Echo::Stdout));
        if watch_stdout {
            polled.push(PollFd::new(stdout.as_fd(), PollFlags::empty()));
        }
        match poll(&mut polled, LOOK_MS) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e).context("poll on the output of a process of this program"),
        }
        let mut ready: Vec<bool> = polled.iter().map(|p| p.any().unwrap_or(false)).collect();
        if watch_stdout {
            let revents = polled.last().and_then(PollFd::revents).unwrap_or(PollFlags::empty());
            reader_gone = revents.contains(PollFlags::POLLERR);
            ready.pop();
        }
        drop(polled);
        if reader_gone {
            // What the process still writes there is read (so that it does not block) and kept only.
            for output in outputs.iter_mut().filter(|output| matches!(output.echo, Echo::Stdout)) {
                output.echo = Echo::Keep;
            }
        }
        let open = outputs.iter_mut().filter(|output| output.fd.is_some());
        for (output, _) in open.zip(ready).filter(|(_, ready)| *ready) {
            output.read()?;
        }
    }
}

/// Ctrl-Z: stops every process of the run below `top` (and `top`), then this process (the shell sees its
/// job stopped); returns, once continued, after continuing the run, how long it was held. The leaders of
/// sessions of their own (the init of a PID namespace, the guardian) only wait, and are left awake: the init
/// continues the run and stops it in order should this process die while it holds it (`kill -9 %1`), and
/// the kernel does the same for a run without one (an orphaned process group with stopped members gets
/// SIGHUP and SIGCONT). An init that has not started its process yet is held too: awake, it would start
/// it while the run is held (a joiner ran on through Ctrl-Z that way, 3 times in 60 on a loaded host), and
/// an init held before it forks forks once continued.
fn hold(top: Pid) -> Duration {
    let at = Instant::now();
    stop_the_run(top);
    // Delivered before kill returns: this process stops here until SIGCONT.
    let _ = kill(nix::unistd::getpid(), Signal::SIGSTOP);
    signal_all(top, Signal::SIGCONT);
    let _ = signals::continued();
    at.elapsed()
}

/// [`hold`]'s stopping of `top` and every process below it but the leaders of sessions (an init that has not
/// started its process yet stopped too).
pub(super) fn stop_the_run(top: Pid) {
    // Pass after pass, until one finds no process the last did not, and stopped no init that was awake (it
    // may have forked its process since the pass looked): what a process of the run started while the
    // others were being stopped is stopped by the next.
    let mut seen: Vec<Pid> = Vec::new();
    for _ in 0..HOLD_PASSES {
        let below = crate::os::proc_stat::descendants(top);
        let mut stopped_an_init = false;
        // Each process's stat, read once a pass (a process that ended meanwhile is left out).
        let stats: Vec<(Pid, crate::os::proc_stat::ProcStat)> = std::iter::once(top)
            .chain(below.iter().copied())
            .filter_map(|pid| Some((pid, crate::os::proc_stat::read(pid.as_raw())?)))
            .collect();
        for (pid, stat) in &stats {
            let leads_a_session = stat.session == pid.as_raw();
            let has_a_child = || stats.iter().any(|(_, other)| other.parent == pid.as_raw());
            let init_yet_to_start =
                leads_a_session && crate::os::proc_stat::innermost_pid(*pid) == Some(1) && !has_a_child();
            if !leads_a_session || init_yet_to_start {
                let _ = kill(*pid, Signal::SIGSTOP);
            }
            stopped_an_init |= init_yet_to_start && !matches!(stat.state, 'T' | 't');
        }
        if below == seen && !stopped_an_init {
            break;
        }
        seen = below;
    }
}

/// At most this many passes of [`hold`] (a run starts a few processes at a time; two passes that find the
/// same ones end it sooner).
const HOLD_PASSES: usize = 8;

/// Sends `signal` to `top` and everything it started (the init of a PID namespace and the guardian are in
/// sessions of their own: a signal to the run's process group would not reach them).
fn signal_all(top: Pid, signal: Signal) {
    let _ = kill(top, signal);
    for pid in crate::os::proc_stat::descendants(top) {
        let _ = kill(pid, signal);
    }
}

/// A stopped process among `top` and what it started, named: `the init of a PID namespace of the run (pid
/// N)`.
fn stopped_among(top: Pid) -> Option<String> {
    let stopped = std::iter::once(top)
        .chain(crate::os::proc_stat::descendants(top))
        .find(|pid| crate::os::proc_stat::read(pid.as_raw()).is_some_and(|s| matches!(s.state, 'T' | 't')))?;
    Some(match crate::os::proc_stat::innermost_pid(stopped) {
        Some(1) => format!("the init of a PID namespace of the run (pid {stopped}, pid 1 in it)"),
        _ => format!("process {stopped} of the run"),
    })
}

/// Where this process passes on what comes through one of a process's output pipes.
#[derive(Clone, Copy)]
pub(crate) enum Echo {
    Stdout,
    Stderr,
    /// Nowhere: kept only.
    Keep,
}

/// One output pipe of a followed process, and all that came through it so far.
pub(crate) struct Output {
    /// `None` once at its end.
    fd: Option<OwnedFd>,
    echo: Echo,
    got: Vec<u8>,
    /// How much of `got` has been passed on.
    echoed: usize,
}

impl Output {
    pub(crate) fn new(fd: Option<OwnedFd>, echo: Echo) -> Self {
        Self { fd, echo, got: Vec::new(), echoed: 0 }
    }

    /// Passes on what came and was not passed on yet: all of it, or while a progress bar is drawn (which
    /// is drawn again after each write, and would land inside a line) its whole lines.
    fn echo_lines(&mut self) -> Result<()> {
        let fresh = &self.got[self.echoed..];
        let upto = match crate::output::progress::drawing() {
            true => fresh.iter().rposition(|&b| b == b'\n').map_or(0, |last| last + 1),
            false => fresh.len(),
        };
        self.echo(upto)
    }

    /// Passes on all that came and was not passed on yet, a last line without its end too.
    pub(crate) fn echo_rest(&mut self) -> Result<()> {
        self.echo(self.got.len() - self.echoed)
    }

    /// Passes on the next `len` bytes of what came.
    fn echo(&mut self, len: usize) -> Result<()> {
        let bytes = &self.got[self.echoed..self.echoed + len];
        if bytes.is_empty() {
            return Ok(());
        }
        match self.echo {
            Echo::Stdout => crate::output::progress::suspend(|| {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes).and_then(|()| out.flush())
            })
            .context("writing to standard output")?,
            // As `eprint_line!`: standard error cannot fail the run.
            Echo::Stderr => crate::output::progress::suspend(|| drop(std::io::stderr().write_all(bytes))),
            Echo::Keep => {}
        }
        self.echoed += len;
        Ok(())
    }

    /// Reads what `poll` said is there, passes it on and keeps it.
    fn read(&mut self) -> Result<()> {
        let Some(fd) = &self.fd else { return Ok(()) };
        let mut chunk = [0u8; 16 * 1024];
        let n = match nix::unistd::read(fd, &mut chunk) {
            Ok(n) => n,
            Err(Errno::EINTR | Errno::EAGAIN) => return Ok(()),
            Err(e) => return Err(e).context("reading the output of a process of this program"),
        };
        if n == 0 {
            self.fd = None;
            return self.echo_rest();
        }
        self.got.extend_from_slice(&chunk[..n]);
        self.echo_lines()
    }
}
