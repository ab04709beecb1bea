//! The processes an isolated run's parent starts: this program again as `join SOCKET --isolated KINDS`,
//! one per process of the run, meeting the parent at an abstract socket, or, where the processes have
//! network namespaces of their own, at a socket in a private directory (mode 0700, removed with the run;
//! the socket's file goes as soon as every process has joined). They are the parent's own:
//! once the run has ended, each that has not ended within a grace is killed and every one is reaped.
//! Each hands back its `--json` document through a pipe (`--report-fd`), as a run of `--ipc all` does: a
//! driver's refusal of a handle in a process that joined is in this run's document as typed facts.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::fcntl::{FcntlArg, OFlag, fcntl};

use super::enter::Unavailable;
use super::{Isolation, Kind};
use crate::guardian::{Guardian, MadePath};
use crate::meeting::Address;
use crate::outcome::EXIT_WAIVED;
use crate::role::{Isolated, Joiner, Role, Timeout};

/// How long a started process gets to end by itself after the run ended (it stops within 0.5 s of the
/// server's end); then it is killed, and its init stops what it runs.
const END_GRACE: Duration = Duration::from_millis(700);

/// The private directory of the run's socket, removed on drop; the guardian removes it (and the socket in
/// it) should the run be killed.
struct SocketDir<'g> {
    path: PathBuf,
    guardian: &'g Guardian,
    /// What was made (device, inode), as the guardian was told.
    made: Option<MadePath>,
}

impl<'g> SocketDir<'g> {
    fn make(guardian: &'g Guardian) -> Result<Self> {
        let base = std::env::temp_dir();
        let mut attempt = 0u32;
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = base.join(format!("simple-ipc-{}-{nanos:x}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {
                    let made = MadePath::of(&dir);
                    if let Some(made) = &made {
                        guardian.cover_path(made);
                    }
                    return Ok(Self { path: dir, guardian, made });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => attempt += 1,
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("making a private directory in {}", base.display()));
                }
            }
        }
    }

    fn socket(&self) -> PathBuf {
        self.path.join("run.sock")
    }
}

impl Drop for SocketDir<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        if let Some(made) = &self.made {
            self.guardian.forget_path(made);
        }
    }
}

/// The processes started for an isolated run, and the directory of the socket they meet at (removed once
/// they have ended).
pub struct Launched<'g> {
    processes: Vec<Child>,
    /// The reading end of each process's document, in the order of `processes`.
    documents: Vec<OwnedFd>,
    /// `None` for an abstract socket.
    dir: Option<SocketDir<'g>>,
}

impl<'g> Launched<'g> {
    /// Chooses where the run is served for `isolation`: an abstract socket, which leaves nothing behind
    /// whatever happens, unless the processes have network namespaces of their own (an abstract socket is
    /// in one), then a socket in a private directory, which `guardian` removes should the run be killed.
    /// Nothing is started yet.
    pub fn prepare(isolation: &Isolation, guardian: &'g Guardian) -> Result<Self> {
        let dir = if isolation.has(Kind::Net) { Some(SocketDir::make(guardian)?) } else { None };
        Ok(Self { processes: Vec::new(), documents: Vec::new(), dir })
    }

    /// Where the run is to be served.
    pub fn address(&self) -> Address {
        match &self.dir {
            Some(dir) => Address::Path(dir.socket()),
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                Address::Abstract(format!("simple-ipc-{}-{nanos:x}", std::process::id()))
            }
        }
    }

    /// Starts `n` processes that join the run at `address`, each in namespaces of `isolation`'s kinds.
    pub fn start(
        &mut self,
        address: &Address,
        n: usize,
        isolation: &Isolation,
        timeout: Timeout,
        quiet: bool,
    ) -> Result<()> {
        let joiner = Joiner { address: address.clone(), timeout, quiet, bench: false };
        for _ in 0..n {
            let (document, document_end) =
                nix::unistd::pipe2(OFlag::O_CLOEXEC).context("pipe2 for an isolated process's document")?;
            // Read once the process has ended: what is there, without waiting for more.
            fcntl(&document, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).context("fcntl(O_NONBLOCK)")?;
            let fd = document_end.as_raw_fd();
            let isolated = Isolated { isolation: isolation.clone(), report_fd: fd, joiner: joiner.clone() };
            let mut command = Command::new("/proc/self/exe");
            command
                .arg0(std::env::args_os().next().unwrap_or_else(|| "simple-ipc".into()))
                .args(Role::Isolated(isolated).to_args())
                .stdin(Stdio::null());
            // It must not outlive this process: SIGKILL to the process outside, whose init then stops what
            // runs inside in order.
            // SAFETY: runs in the forked child before exec; prctl and fcntl are async-signal-safe and
            // allocate nothing.
            unsafe {
                command.pre_exec(move || {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                        .map_err(std::io::Error::from)?;
                    crate::inherit::keep_across_exec(fd)
                });
            }
            let child = command.spawn().context("starting an isolated process (/proc/self/exe)")?;
            drop(document_end);
            self.processes.push(child);
            self.documents.push(document);
        }
        Ok(())
    }

    /// The pids of the processes started.
    pub fn pids(&self) -> Vec<i32> {
        self.processes.iter().map(|child| child.id() as i32).collect()
    }

    /// The first started process that has ended with another status than success, if one has: an
    /// [`Unavailable`] (a waiver) if it could not enter its namespaces. Called at every look of the
    /// server's wait; once the socket's file is gone (every process has joined), its directory goes too,
    /// so that a parent killed from then on leaves nothing.
    pub fn ended_early(&mut self) -> Option<anyhow::Error> {
        if self.dir.as_ref().is_some_and(|dir| !dir.socket().exists()) {
            self.dir = None;
        }
        self.processes.iter_mut().find_map(|child| {
            let pid = child.id();
            let status = child.try_wait().ok().flatten()?;
            match status.code() {
                Some(0) => None,
                Some(code) if code == i32::from(EXIT_WAIVED) => Some(
                    Unavailable(format!(
                        "a process started in namespaces of its own (pid {pid}) could not enter them (its \
                         message is above)"
                    ))
                    .into(),
                ),
                _ => Some(anyhow::anyhow!(
                    "a process started in namespaces of its own (pid {pid}) ended with {}",
                    describe(status)
                )),
            }
        })
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (_, Some(signal)) => format!("signal {signal}"),
        _ => status.to_string(),
    }
}

/// What a process that ended wrote through its document's pipe, read back (`None` where it wrote none
/// whole).
fn document_of(pipe: &OwnedFd) -> Option<crate::report::Document> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while let Ok(n @ 1..) = nix::unistd::read(pipe, &mut chunk) {
        got.extend_from_slice(&chunk[..n]);
    }
    crate::report::document::parse(&got)
}

impl Drop for Launched<'_> {
    fn drop(&mut self) {
        let until = Instant::now() + END_GRACE;
        for (child, document) in self.processes.iter_mut().zip(&self.documents) {
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            if matches!(child.try_wait(), Ok(None)) {
                // What it started too: the init of its PID namespace may be stopped (SIGSTOP), and then
                // could neither stop the run in order nor reap it; SIGKILL takes the namespace with it.
                let pid = nix::unistd::Pid::from_raw(child.id() as i32);
                for started in super::outside::descendants(pid).into_iter().rev() {
                    let _ = nix::sys::signal::kill(started, nix::sys::signal::Signal::SIGKILL);
                }
                let _ = child.kill();
                let _ = child.wait();
            }
            // The driver's refusal in a process that joined is this run's to report, as typed facts.
            if let Some(refused) = document_of(document).and_then(|d| d.refused) {
                crate::report::note_refused(refused);
            }
        }
    }
}
