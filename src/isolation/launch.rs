//! The processes an isolated run's parent starts: this program again as `join SOCKET --isolated KINDS`,
//! one per process of the run, meeting the parent at an abstract socket, or, where the processes have
//! network namespaces of their own, at a socket in a private directory (mode 0700, removed with the run;
//! the socket's file goes as soon as every process has joined). They are the parent's own:
//! once the run has ended, each that has not ended within a grace is killed and every one is reaped.
//! Each hands back its `--json` document through a pipe (`--report-fd`), as a run of `--ipc all` does: a
//! driver's refusal of a handle in a process that joined is in this run's document as typed facts.

use std::cell::RefCell;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::signal::Signal;

use crate::isolation::{Isolation, Kind};
use crate::meeting::Address;
use crate::os::made_path::MadePath;
use crate::outcome::EXIT_WAIVED;
use crate::outcome::Waiver;
use crate::phases::timings::Timeout;
use crate::report::Refused;
use crate::role::{Isolated, Joiner, Role};
use crate::supervise::guardian::Guardian;
use crate::supervise::relaunch::{Ended, OnDrop, Process, Relaunch};

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
    /// Makes it: at `wanted` (the path the process outside an isolated run chose, which it removes should
    /// the run leave it), or else, as where that is taken, under a name of its own in TMPDIR.
    fn make(guardian: &'g Guardian, mut wanted: Option<&Path>) -> Result<Self> {
        let base = std::env::temp_dir();
        let mut attempt = 0u32;
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = match wanted.take() {
                Some(wanted) => wanted.to_owned(),
                None => base.join(format!("simple-ipc-{}-{nanos:x}", std::process::id())),
            };
            // Announced first: a run killed between the making and the covering leaves it to the guardian.
            guardian.making_dir(&dir, true);
            let created = std::fs::DirBuilder::new().mode(0o700).create(&dir);
            if created.is_err() {
                guardian.making_dir(&dir, false);
            }
            match created {
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
    /// Each hands back its document through a pipe of its own.
    processes: Vec<Process>,
    /// `None` for an abstract socket.
    dir: Option<SocketDir<'g>>,
    /// Where a refusal that a process reported in its document goes, the first one kept.
    refused: &'g RefCell<Option<Refused>>,
}

impl<'g> Launched<'g> {
    /// Chooses where the run is served for `isolation`: an abstract socket, which leaves nothing behind
    /// whatever happens, unless the processes have network namespaces of their own (an abstract socket is
    /// in one), then a socket in a private directory, which `guardian` removes should the run be killed.
    /// Nothing is started yet.
    /// A refusal that a process reports goes to `refused`; the directory is made at `socket_dir` where the
    /// process outside this run chose one (see [`SocketDir::make`]).
    pub fn prepare(
        isolation: &Isolation,
        guardian: &'g Guardian,
        refused: &'g RefCell<Option<Refused>>,
        socket_dir: Option<&Path>,
    ) -> Result<Self> {
        // A socket under /dev/shm cannot reach processes with a /dev/shm of their own: said as such, with the
        // fix, not as an isolated process that ended with exit status 1.
        let tmp = std::env::temp_dir();
        if isolation.has(Kind::Net) && isolation.has(Kind::Shm) && tmp.starts_with("/dev/shm") {
            anyhow::bail!(
                "the run's socket would be in TMPDIR ({}), under /dev/shm, which the processes of --isolate \
                 {} do not see (they have a /dev/shm of their own): set TMPDIR to a directory outside \
                 /dev/shm (TMPDIR=/tmp)",
                tmp.display(),
                isolation.described()
            );
        }
        let dir = match isolation.has(Kind::Net) {
            true => Some(SocketDir::make(guardian, socket_dir)?),
            false => None,
        };
        Ok(Self { processes: Vec::new(), dir, refused })
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

    /// Starts `n` processes that join the run at `address`, each in namespaces of `isolation`'s kinds
    /// (`matrix_row`: the importer of a row of the container matrix, not a process of the sample).
    pub fn start(
        &mut self,
        address: &Address,
        n: usize,
        isolation: &Isolation,
        timeout: Timeout,
        quiet: bool,
        matrix_row: bool,
    ) -> Result<()> {
        let joiner = Joiner { address: address.clone(), timeout, quiet, bench: false };
        for _ in 0..n {
            let mut start = Relaunch::new("an isolated process");
            let fd = start.report_pipe()?;
            let outside_fd = start.outside_socket()?;
            let isolation = isolation.clone();
            let isolated =
                Isolated { isolation, report_fd: fd, outside_fd, joiner: joiner.clone(), matrix_row };
            start.args(Role::Isolated(isolated).to_args());
            // It must not outlive this process: SIGKILL to it until it hands its PID namespace's init over
            // to this process; the init then stops what runs inside in order when this process's end of
            // the socket closes. Once the run has ended, it gets a grace to end by itself (it stops within
            // 0.5 s of the server's end), then SIGKILL to it and to what it started.
            start.death_signal(Signal::SIGKILL).killing_what_it_started();
            start.on_drop(OnDrop::Stop { signal: None, grace: END_GRACE });
            self.processes.push(start.spawn()?);
        }
        Ok(())
    }

    /// The first started process that has ended with another status than success, if one has: an
    /// [`Waiver`] if it could not enter its namespaces. Called at every look of the
    /// server's wait; once the socket's file is gone (every process has joined), its directory goes too,
    /// so that a parent killed from then on leaves nothing.
    pub fn ended_early(&mut self) -> Option<anyhow::Error> {
        if self.dir.as_ref().is_some_and(|dir| !dir.socket().exists()) {
            self.dir = None;
        }
        self.processes.iter_mut().find_map(|process| {
            let pid = process.pid();
            match process.try_wait()? {
                Ended::Exited(0) => None,
                Ended::Exited(code) if code == i32::from(EXIT_WAIVED) => Some(
                    Waiver(format!(
                        "a process started in namespaces of its own (pid {pid}) could not enter them (its \
                         message is above)"
                    ))
                    .into(),
                ),
                ended => Some(anyhow::anyhow!(
                    "a process started in namespaces of its own (pid {pid}) ended with {}",
                    match ended {
                        Ended::Exited(code) => format!("exit status {code}"),
                        Ended::Killed(signal) => format!("signal {}", signal as i32),
                        Ended::Lost(e) => format!("its exit status lost ({e})"),
                    }
                )),
            }
        })
    }
}

impl Drop for Launched<'_> {
    fn drop(&mut self) {
        crate::supervise::relaunch::stop_all(&mut self.processes);
        for process in &mut self.processes {
            // The driver's refusal in a process that joined is this run's to report, as typed facts.
            if let Some(refused) = process.document().and_then(|d| d.refused) {
                self.refused.borrow_mut().get_or_insert(refused);
            }
        }
    }
}
