//! The run of one mechanism, as `--ipc all` starts it: this program again with the user's options of the
//! run and its own mechanism (`Role::MechanismRun`), its output passed on as it comes, its result read from
//! an inherited pipe (`--report-fd`), and stopped with the top parent (see the parent module's doc).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, poll};
use nix::sys::signal::Signal;

use super::{Ending, Row, table};
use crate::ipc::Mechanism;
use crate::relaunch::{Ended, OnDrop, Process, Relaunch, Streams};
use crate::role::{MechanismRun, Role, Run, Served};
use crate::signals::{self, Interrupted};

/// How often the top parent looks at the run of one mechanism while it waits for output.
const LOOK_MS: u8 = 10;
/// How long the output of a run that has exited is still read (the run's own children may still be writing
/// as they die); a grandchild that keeps the pipes open cannot hold the top parent longer.
const DRAIN: Duration = Duration::from_secs(1);
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
    run_one_inheriting(run, mechanism, None, echo, Vec::new())
}

/// [`run_one`], the run one of a served sequence (`served`), inheriting the descriptors `given` too
/// (which `served` names), closed here once it has started: the run is then their only holder.
pub(crate) fn run_one_inheriting(
    run: &Run,
    mechanism: Mechanism,
    served: Option<Served>,
    echo: bool,
    given: Vec<OwnedFd>,
) -> Result<Row> {
    let timeout = run.timeout.limit();
    let mut launch = Relaunch::new(format!("the run of --ipc {}", mechanism.name()));
    let fd = launch.report_pipe()?;
    launch
        .args(
            Role::MechanismRun(MechanismRun { mechanism, run: run.clone(), report_fd: fd, served }).to_args(),
        )
        .streams(Streams::Piped)
        // The run must not outlive the top parent: SIGTERM, which it handles as an orderly stop.
        .death_signal(Signal::SIGTERM)
        .on_drop(OnDrop::Stop { signal: Some(Signal::SIGTERM), grace: STOP_GRACE });
    for fd in given {
        launch.give(fd);
    }
    // A descriptor fault is meant for the mechanisms that send descriptors; legacy's run would refuse it.
    if crate::fault::needs_descriptors() && !mechanism.uses_descriptors() {
        launch.env_remove(crate::fault::FAULT_ENV);
    }
    let start = Instant::now();
    // Declared before the pipes: on an early return they close first, so the run cannot block writing to
    // them while it is being stopped.
    let mut run = launch.spawn()?;
    let (stdout, stderr) = run.take_output();
    let (to_stdout, to_stderr) = if echo { (Echo::Stdout, Echo::Stderr) } else { (Echo::Keep, Echo::Keep) };
    let mut pipes = [Pipe::new(stdout, to_stdout), Pipe::new(stderr, to_stderr)];
    let deadline = timeout.map(|t| start + t + PAST_ITS_TIMEOUT);
    let (status, stopped, late) = follow(&mut run, deadline, &mut pipes)?;
    for pipe in &mut pipes {
        pipe.echo_rest()?;
    }
    if late {
        let why = format!(
            "stopped by this process: it did not end within its --timeout ({} s) and {} s more (was it stopped \
             or frozen?)",
            timeout.map_or(0.0, |t| t.as_secs_f64()),
            PAST_ITS_TIMEOUT.as_secs()
        );
        say!("{why}")?;
        let wall_ms = Some(start.elapsed().as_secs_f64() * 1e3);
        return Ok(Row {
            mechanism,
            ending: Ending::Failed(why),
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
fn ending_of(status: Ended, document: Option<&crate::report::Document>) -> Ending {
    let said = document.and_then(|d| d.reason.clone());
    let unsaid = |how: String| format!("{how}, without its document");
    match status {
        Ended::Exited(0) => Ending::Passed,
        Ended::Exited(2) => {
            Ending::Waived(said.unwrap_or_else(|| unsaid("waived (exit status 2)".to_owned())))
        }
        Ended::Exited(code) if code > 128 => {
            Ending::Failed(format!("stopped by {}", signal_name(code - 128)))
        }
        Ended::Killed(signal) => Ending::Failed(format!("killed by {signal}")),
        Ended::Exited(code) => Ending::Failed(said.unwrap_or_else(|| unsaid(format!("exit status {code}")))),
        Ended::Lost(e) => Ending::Failed(unsaid(format!("its exit status lost ({e})"))),
    }
}

/// Where the top parent passes on what comes through one of a run's pipes.
#[derive(Clone, Copy)]
enum Echo {
    Stdout,
    Stderr,
    /// Nowhere: the result, kept only.
    Keep,
}

/// One pipe from the run of one mechanism, and all that came through it so far.
struct Pipe {
    /// `None` once at its end.
    fd: Option<OwnedFd>,
    echo: Echo,
    got: Vec<u8>,
    /// How much of `got` has been passed on.
    echoed: usize,
}

impl Pipe {
    fn new(fd: Option<OwnedFd>, echo: Echo) -> Self {
        Self { fd, echo, got: Vec::new(), echoed: 0 }
    }

    /// Passes on what came and was not passed on yet: all of it, or while a progress bar is drawn (which
    /// is drawn again after each write, and would land inside a line) its whole lines.
    fn echo_lines(&mut self) -> Result<()> {
        let fresh = &self.got[self.echoed..];
        let upto = match crate::progress::drawing() {
            true => fresh.iter().rposition(|&b| b == b'\n').map_or(0, |last| last + 1),
            false => fresh.len(),
        };
        self.echo(upto)
    }

    /// Passes on all that came and was not passed on yet, a last line without its end too.
    fn echo_rest(&mut self) -> Result<()> {
        self.echo(self.got.len() - self.echoed)
    }

    /// Passes on the next `len` bytes of what came.
    fn echo(&mut self, len: usize) -> Result<()> {
        let bytes = &self.got[self.echoed..self.echoed + len];
        if bytes.is_empty() {
            return Ok(());
        }
        match self.echo {
            Echo::Stdout => crate::progress::suspend(|| {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes).and_then(|()| out.flush())
            })
            .context("writing to standard output")?,
            // As `warn!`: standard error cannot fail the run.
            Echo::Stderr => crate::progress::suspend(|| drop(std::io::stderr().write_all(bytes))),
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
            Err(e) => return Err(e).context("reading the output of a run of one mechanism"),
        };
        if n == 0 {
            self.fd = None;
            return self.echo_rest();
        }
        self.got.extend_from_slice(&chunk[..n]);
        self.echo_lines()
    }
}

/// Passes on the run's output as it comes, until it has exited and its pipes are at their end (or
/// [`DRAIN`] has passed since it exited). Returns how it exited and, where the top parent was stopped
/// meanwhile, why: a stop signal it received, which is passed on to the run at once, or SIGPIPE when the
/// reader of its standard output went away (`| head -1`), and the run is stopped with SIGTERM. A run that
/// has not stopped [`STOP_GRACE`] after that is killed, and so is one still there at its deadline (the
/// last part of what this returns says so). Past its `deadline` (its `--timeout` and [`PAST_ITS_TIMEOUT`]),
/// it is killed: it could not stop itself. Dropped before it has ended (the top parent's own output
/// failed), it is stopped and reaped.
fn follow(
    run: &mut Process,
    deadline: Option<Instant>,
    pipes: &mut [Pipe],
) -> Result<(Ended, Option<Signal>, bool)> {
    let stdout = std::io::stdout();
    let mut exited: Option<(Ended, Instant)> = None;
    let mut stopped: Option<(Signal, Instant)> = None;
    let mut reader_gone = false;
    let mut killed = false;
    let mut late = false;
    loop {
        if let Some(deadline) = deadline
            && exited.is_none()
            && !killed
            && Instant::now() >= deadline
        {
            run.signal(Signal::SIGKILL);
            (killed, late) = (true, true);
        }
        let cause = signals::received().or(reader_gone.then_some(Signal::SIGPIPE));
        if let Some(cause) = cause.filter(|_| stopped.is_none()) {
            let signal = if cause == Signal::SIGPIPE { Signal::SIGTERM } else { cause };
            if exited.is_none() {
                run.signal(signal);
            }
            stopped = Some((cause, Instant::now()));
        }
        if let Some((_, since)) = stopped
            && exited.is_none()
            && !killed
            && since.elapsed() > STOP_GRACE
        {
            run.signal(Signal::SIGKILL);
            killed = true;
        }
        run.read_report()?;
        if exited.is_none() {
            exited = run.try_wait().map(|status| (status, Instant::now()));
        }
        if let Some((status, at)) = exited
            && (pipes.iter().all(|pipe| pipe.fd.is_none()) || at.elapsed() > DRAIN)
        {
            return Ok((status, stopped.map(|(cause, _)| cause), late));
        }
        let mut polled: Vec<PollFd> = pipes
            .iter()
            .filter_map(|pipe| pipe.fd.as_ref())
            .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
            .collect();
        // Our own standard output, for POLLERR alone: a pipe whose reader has gone.
        let watch_stdout = !reader_gone;
        if watch_stdout {
            polled.push(PollFd::new(stdout.as_fd(), PollFlags::empty()));
        }
        match poll(&mut polled, LOOK_MS) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e).context("poll on the output of a run of one mechanism"),
        }
        let mut ready: Vec<bool> = polled.iter().map(|p| p.any().unwrap_or(false)).collect();
        if watch_stdout {
            let revents = polled.last().and_then(PollFd::revents).unwrap_or(PollFlags::empty());
            reader_gone = revents.contains(PollFlags::POLLERR);
            ready.pop();
        }
        drop(polled);
        if reader_gone {
            // What the run still writes there is read (so that it does not block) and kept only.
            for pipe in pipes.iter_mut().filter(|pipe| matches!(pipe.echo, Echo::Stdout)) {
                pipe.echo = Echo::Keep;
            }
        }
        let open = pipes.iter_mut().filter(|pipe| pipe.fd.is_some());
        for (pipe, _) in open.zip(ready).filter(|(_, ready)| *ready) {
            pipe.read()?;
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
            Ending::Waived("No CUDA devices support IPC (the document's words)".into())
        );
        assert_eq!(
            ending_of(exited(2), None),
            Ending::Waived("waived (exit status 2), without its document".into())
        );
        assert_eq!(ending_of(exited(1), None), Ending::Failed("exit status 1, without its document".into()));
        assert_eq!(ending_of(exited(143), None), Ending::Failed("stopped by SIGTERM".into()));
        assert_eq!(
            ending_of(Ended::Killed(Signal::SIGKILL), None),
            Ending::Failed("killed by SIGKILL".into())
        );
        assert_eq!(ending_of(exited(0), Some(&document)), Ending::Passed);
    }
}
