//! The one way to start a process of this program: this program again (`/proc/self/exe`, under the name it
//! was started by) with the arguments its caller built, and the policies the caller chose as values: the
//! signal it gets should this process die (`PR_SET_PDEATHSIG`, refused if this process is already gone), a
//! session of its own, the descriptors it inherits, its standard streams, its environment, and how it is
//! stopped when its handle goes ([`OnDrop`]).
//!
//! A [`Process`] is waited for by its pid only (never `waitpid(-1)`, which could take another's status), and
//! its status is a value ([`Ended`]). Dropped while it runs, it is stopped with grace, then killed and
//! reaped, so that no process of ours is left behind; only one whose caller chose [`OnDrop::Leave`] (the
//! guardian, which is to outlive the run) is left to end on its own. A process that hands back a result
//! writes it to a pipe of its own ([`Relaunch::report_pipe`], its `--report-fd`), which this module reads and
//! parses: never what the process printed.
//!
//! A process that enters a PID namespace of its own hands its place to the namespace's init and ends
//! ([`Relaunch::outside_socket`]): this process, a child subreaper, adopts the init, and the handle follows it
//! from then on, so that the process tree has no level that only passes signals on. Every signal the handle
//! sent to the process that handed over is sent to the init too: that process holds the stop signals
//! blocked while it forks the init and ends without taking them, so one sent in that window would be lost.
//!
//! Signals: the child starts with SIGPIPE at its default (std's spawn does that), and exec puts every handled
//! signal back to its default; a stop signal the invoker left ignored stays ignored, as `signals` wants. A
//! process of this program starts with the stop signals blocked, and nothing else: one that comes before its
//! handlers are there (`signals::install`, which unblocks them) waits for them instead of ending it unheard.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill};
use nix::sys::wait::{Id, WaitPidFlag, waitid, waitpid};
use nix::unistd::Pid;

/// How often a stop looks whether its processes have ended.
const LOOK: Duration = Duration::from_millis(2);

/// What becomes of a process whose handle is dropped while it runs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OnDrop {
    /// `signal` (none: the caller has asked it to stop its own way), `grace` to end, then SIGKILL; reaped.
    Stop { signal: Option<Signal>, grace: Duration },
    /// Waited for up to `within`, then left to end on its own.
    Leave { within: Duration },
}

/// Where a started process's standard output and error go, if not to this process's own (its standard
/// input is always `/dev/null`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Streams {
    Null,
    /// Pipes, taken with [`Process::take_output`].
    Piped,
}

/// A process of this program about to be started.
pub(crate) struct Relaunch {
    what: String,
    command: Command,
    death: Option<Signal>,
    session: bool,
    /// Descriptors it inherits: the caller's, and those in `given` and the report pipe's end.
    kept: Vec<RawFd>,
    /// Descriptors that are its alone: closed here once it has started.
    given: Vec<OwnedFd>,
    report: Option<OwnedFd>,
    on_drop: OnDrop,
    tree: bool,
    group: bool,
    /// This process's end of the socket on which it may say the pid of the init it hands over to.
    outside: Option<OwnedFd>,
    /// The signals it starts with blocked (this program's stop signals, until its handlers are there).
    blocked: SigSet,
}

impl Relaunch {
    /// This program again; `what` names it in errors ("process 3", "the guardian").
    pub(crate) fn new(what: impl Into<String>) -> Self {
        let mut launch = Self::of("/proc/self/exe", what);
        launch.command.arg0(std::env::args_os().next().unwrap_or_else(|| "simple-ipc".into()));
        launch.blocked = crate::os::signals::STOP_SIGNALS.into_iter().collect();
        launch
    }

    /// Another program, with the same policies (the module's tests start `sh`).
    fn of(program: &str, what: impl Into<String>) -> Self {
        let mut command = Command::new(program);
        command.stdin(Stdio::null());
        Self {
            what: what.into(),
            command,
            death: None,
            session: false,
            kept: Vec::new(),
            given: Vec::new(),
            report: None,
            on_drop: OnDrop::Stop { signal: Some(Signal::SIGTERM), grace: Duration::from_secs(1) },
            tree: false,
            group: false,
            outside: None,
            blocked: SigSet::empty(),
        }
    }

    pub(crate) fn args<S: AsRef<OsStr>>(&mut self, args: impl IntoIterator<Item = S>) -> &mut Self {
        self.command.args(args);
        self
    }

    /// The signal it gets should the thread that starts it die.
    pub(crate) fn death_signal(&mut self, signal: Signal) -> &mut Self {
        self.death = Some(signal);
        self
    }

    /// Its death signal is SIGTERM, which it takes as an orderly stop, unless the invoker left SIGTERM
    /// ignored (which it would inherit, and `signals` keeps): then SIGKILL, so that it never outlives this
    /// process.
    pub(crate) fn stopped_at_death(&mut self) -> Result<&mut Self> {
        let heard = !crate::os::signals::is_ignored(Signal::SIGTERM)?;
        Ok(self.death_signal(if heard { Signal::SIGTERM } else { Signal::SIGKILL }))
    }

    /// A session and process group of its own: a signal to this run's group does not reach it.
    pub(crate) fn new_session(&mut self) -> &mut Self {
        self.session = true;
        self
    }

    /// A process group of its own (in this session): a signal to this run's group does not reach it, and the
    /// kernel continues it and hangs it up should this process die while it is stopped (an orphaned group).
    pub(crate) fn own_group(&mut self) -> &mut Self {
        self.group = true;
        self
    }

    /// A socket to this process (its `--outside-fd`), on which it may say the pid of the init of a PID
    /// namespace it entered, and end: this process, made a child subreaper, adopts that init, and the
    /// [`Process`] follows it from then on. The init knows that this process lives while the socket is open.
    pub(crate) fn outside_socket(&mut self) -> Result<RawFd> {
        nix::sys::prctl::set_child_subreaper(true).context("prctl(PR_SET_CHILD_SUBREAPER)")?;
        let (ours, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .with_context(|| format!("socketpair for {}", self.what))?;
        fcntl(&ours, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).context("fcntl(O_NONBLOCK)")?;
        self.outside = Some(ours);
        let fd = theirs.as_raw_fd();
        self.give(theirs);
        Ok(fd)
    }

    /// It inherits `fd`, which stays this process's too.
    pub(crate) fn keep(&mut self, fd: RawFd) -> &mut Self {
        self.kept.push(fd);
        self
    }

    /// It inherits `fd`, which is closed here once it has started: it is then its only holder here.
    pub(crate) fn give(&mut self, fd: OwnedFd) -> &mut Self {
        self.kept.push(fd.as_raw_fd());
        self.given.push(fd);
        self
    }

    /// A pipe for its result: returns the descriptor it writes to (its `--report-fd`); [`Process::document`]
    /// reads what came.
    pub(crate) fn report_pipe(&mut self) -> Result<RawFd> {
        let (ours, theirs) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
            .with_context(|| format!("pipe2 for the result of {}", self.what))?;
        fcntl(&ours, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).context("fcntl(O_NONBLOCK)")?;
        self.report = Some(ours);
        let fd = theirs.as_raw_fd();
        self.give(theirs);
        Ok(fd)
    }

    pub(crate) fn streams(&mut self, streams: Streams) -> &mut Self {
        let (out, err) = match streams {
            Streams::Null => (Stdio::null(), Stdio::null()),
            Streams::Piped => (Stdio::piped(), Stdio::piped()),
        };
        self.command.stdout(out).stderr(err);
        self
    }

    pub(crate) fn env_clear(&mut self) -> &mut Self {
        self.command.env_clear();
        self
    }

    pub(crate) fn env_remove(&mut self, key: &str) -> &mut Self {
        self.command.env_remove(key);
        self
    }

    pub(crate) fn on_drop(&mut self, on_drop: OnDrop) -> &mut Self {
        self.on_drop = on_drop;
        self
    }

    /// Its SIGKILL goes first to what it started, the deepest first: the init of a PID namespace that is
    /// stopped (SIGSTOP) could neither stop its run in order nor reap it.
    pub(crate) fn killing_what_it_started(&mut self) -> &mut Self {
        self.tree = true;
        self
    }

    pub(crate) fn spawn(&mut self) -> Result<Process> {
        let (death, session, group, kept) = (self.death, self.session, self.group, self.kept.clone());
        let blocked = self.blocked;
        let parent = nix::unistd::getpid();
        // SAFETY: runs in the forked child before exec (after std emptied its signal mask); sigprocmask, setsid,
        // setpgid, prctl, getppid, close_range and fcntl are async-signal-safe, and nothing here allocates
        // (`kept` is the closure's own, only read).
        unsafe {
            self.command.pre_exec(move || {
                nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None)
                    .map_err(std::io::Error::from)?;
                if session {
                    nix::unistd::setsid().map_err(std::io::Error::from)?;
                } else if group {
                    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0)).map_err(std::io::Error::from)?;
                }
                if let Some(signal) = death {
                    nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from)?;
                    if nix::unistd::getppid() != parent {
                        return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH)); // died before it
                    }
                }
                crate::os::inherit::only_these_across_exec(&kept)
            });
        }
        let program = self.command.get_program().to_string_lossy().into_owned();
        let mut child =
            self.command.spawn().with_context(|| format!("starting {} ({program})", self.what))?;
        self.given.clear();
        let output = (child.stdout.take().map(OwnedFd::from), child.stderr.take().map(OwnedFd::from));
        // One of the run's processes, should the kernel log an Xid of it.
        crate::node::note_run_process(child.id());
        Ok(Process {
            pid: Pid::from_raw(child.id() as i32),
            ended: None,
            on_drop: self.on_drop,
            tree: self.tree,
            output,
            report: self.report.take().map(|fd| Report { fd: Some(fd), got: Vec::new() }),
            outside: self.outside.take(),
            sent: Vec::new(),
        })
    }
}

/// A started process of this program; see the module's doc for what its drop does.
pub(crate) struct Process {
    pid: Pid,
    ended: Option<Ended>,
    on_drop: OnDrop,
    tree: bool,
    output: (Option<OwnedFd>, Option<OwnedFd>),
    report: Option<Report>,
    /// See [`Relaunch::outside_socket`]: open while the init it may hand over to lives.
    outside: Option<OwnedFd>,
    /// The signals sent to it, in order, while it may still hand over (sent again to the init).
    sent: Vec<Signal>,
}

impl Process {
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// How it ended, reaping it, if it has ended.
    pub(crate) fn try_wait(&mut self) -> Option<Ended> {
        if self.ended.is_none() {
            self.ended = Ended::of(waitpid(self.pid, Some(WaitPidFlag::WNOHANG)));
            self.follow_hand_over();
        }
        self.ended
    }

    /// Waits until it has ended, and says how.
    pub(crate) fn wait(&mut self) -> Ended {
        loop {
            if self.ended.is_none() {
                self.ended = Ended::of(waitpid(self.pid, None));
                self.follow_hand_over();
            }
            if let Some(ended) = self.ended {
                return ended;
            }
        }
    }

    /// How it ended, if it has, without reaping it (a later [`try_wait`](Self::try_wait) still says it). Not
    /// for a process that may hand over to an init ([`Relaunch::outside_socket`]): its hand-over is an end
    /// only to this call.
    pub(crate) fn peek(&self) -> Option<Ended> {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        self.ended.or_else(|| Ended::of(waitid(Id::Pid(self.pid), flags)))
    }

    /// Where it ended with success after saying the pid of the init it handed over to, the handle follows
    /// that init (this process adopted it, as a child subreaper).
    fn follow_hand_over(&mut self) {
        let (Some(Ended::Exited(0)), Some(socket)) = (self.ended, &self.outside) else { return };
        let mut pid = [0u8; 4];
        if let Ok(4) = nix::unistd::read(socket, &mut pid) {
            let init = i32::from_ne_bytes(pid);
            if init > 0 {
                (self.pid, self.ended) = (Pid::from_raw(init), None);
                crate::node::note_run_process(init.unsigned_abs());
                // What the process that handed over held blocked and ended without taking.
                for signal in std::mem::take(&mut self.sent) {
                    let _ = kill(self.pid, signal);
                }
            }
        }
    }

    /// Sends `signal`, unless it has been reaped (its pid may be another's by then); where it may still hand
    /// over to an init, the init gets it too once it does.
    pub(crate) fn signal(&mut self, signal: Signal) {
        if self.ended.is_none() {
            let _ = kill(self.pid, signal);
            if self.outside.is_some() && !self.sent.contains(&signal) {
                self.sent.push(signal);
            }
        }
    }

    /// Whether it is stopped by a signal (its state in `/proc/<pid>/stat` is `T`).
    pub(crate) fn is_stopped(&self) -> bool {
        crate::os::proc_stat::read(self.pid.as_raw()).is_some_and(|stat| stat.state == 'T')
    }

    /// Its standard output and error, where they are pipes ([`Streams::Piped`]).
    pub(crate) fn take_output(&mut self) -> (Option<OwnedFd>, Option<OwnedFd>) {
        std::mem::take(&mut self.output)
    }

    /// Reads what has come of its result so far (call it while it runs: a long result fills the pipe).
    pub(crate) fn read_report(&mut self) -> Result<()> {
        self.report.as_mut().map_or(Ok(()), Report::read)
    }

    /// Its result, the `--json` document it wrote to its report pipe (read to what is there now); `None`
    /// where it wrote none whole.
    pub(crate) fn document(&mut self) -> Option<crate::report::Document> {
        let report = self.report.as_mut()?;
        let _ = report.read();
        crate::report::document::parse(&report.got)
    }

    /// SIGKILL to it (and, with [`Relaunch::killing_what_it_started`], first to all it started).
    pub(crate) fn kill_all(&mut self) {
        if self.tree && self.ended.is_none() {
            for started in crate::os::proc_stat::descendants(self.pid).into_iter().rev() {
                let _ = kill(started, Signal::SIGKILL);
            }
        }
        self.signal(Signal::SIGKILL);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        stop_all([self]);
    }
}

#[cfg(test)]
mod tests;

mod ended;
mod report_pipe;
mod stopping;
mod supervise;
pub(crate) use ended::Ended;
use report_pipe::Report;
pub(crate) use stopping::stop_all;
pub(crate) use supervise::{Echo, Followed, Output, Policies, follow};
