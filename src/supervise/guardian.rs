//! What outlives a killed run: a small process the parent starts (this program again, in the internal role
//! `guardian --fd FD`) that removes the files the CUDA driver made in `/dev/shm` for the run's interprocess
//! events once the parent is gone, however it went (even `kill -9` of the whole process group). The driver
//! removes them only when their exporter exits normally, and the parent removes their names once every
//! child has opened the events (see `ipc::events`); the guardian is for the ways out that run no code.
//! It removes the socket file and private directory of a served or isolated run too (`made_path`): the
//! parent tells it of each once made (path, device, inode), and that it removed it itself, if it did.
//!
//! - It acts on what its parent told it and on nothing else: each file as the exporter maps it (name,
//!   device, inode: see `driver_files`), over a `SOCK_SEQPACKET` socket whose peer must be its own parent,
//!   and it removes a name only while it is still that file. Its command line names no process and no file,
//!   so typed by hand it removes nothing, and it never touches another run's file of the same name.
//! - It leaves the run's session and process group before it runs (`setsid`), so a signal to the group
//!   (Ctrl-C, Ctrl-\, `timeout -s KILL`, `kill -KILL -PGID`) does not reach it, and it ignores the signals
//!   a terminal or a job control shell sends.
//! - Nothing it does or suffers can hang, kill or silence the run: the parent sends without blocking and
//!   without SIGPIPE, says once if the guardian is gone, and never waits on it for long.
//!
//! It is started by exec, so it is safe whatever threads the parent has (a tool such as compute-sanitizer
//! injects some), and with an empty environment, so that no such tool follows it: it makes no CUDA call.
//!
//! What the parent tells it is a typed [`Note`] of `wire::guardian`: sent without blocking and never
//! answered, read until end of file by a reader that never fails (what is not a note is skipped).

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::sys::signal::{SigHandler, Signal, signal};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, socketpair, sockopt::PeerCredentials, sockopt::SockType as SocketType,
};

use crate::os::driver_files::{self, EventFile};
use crate::os::made_path::MadePath;
use crate::supervise::relaunch::{OnDrop, Process, Relaunch, Streams};
use crate::wire::{self, guardian::Note};

/// How long the parent waits, on its way out, for the guardian to end; past it the guardian is left to
/// finish on its own (a stopped one does its work once it is continued).
const REAP_WITHIN: Duration = Duration::from_millis(100);

/// The parent's handle on its guardian: its end of the socket the guardian reads, and the process (waited
/// for [`REAP_WITHIN`] once the socket is closed, then left to finish).
pub struct Guardian {
    socket: Option<OwnedFd>,
    process: Process,
    /// Set once the parent has said that the guardian is gone, so that it says so once.
    lost: std::sync::atomic::AtomicBool,
}

impl Guardian {
    /// Starts the guardian of this run's driver files.
    pub fn start() -> Result<Self> {
        let (ours, theirs) =
            socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .context("socketpair for the guardian")?;
        let fd = theirs.as_raw_fd();
        let process = Relaunch::new("the guardian")
            .args(crate::role::Role::Guardian { fd }.to_args())
            .give(theirs)
            .new_session()
            .env_clear()
            .streams(Streams::Null)
            .on_drop(OnDrop::Leave { within: REAP_WITHIN })
            .spawn()?;
        Ok(Self { socket: Some(ours), process, lost: false.into() })
    }

    /// Has the guardian remove these files too, should the run end without removing them. Never fails the
    /// run: a guardian that is gone or not reading is said once, as a warning.
    pub fn cover(&self, files: &[EventFile]) {
        for file in files {
            self.tell(&Note::File(file.clone()));
        }
    }

    /// Runs `make`, which makes one event file (it exports an event), under the guardian's eye: the guardian
    /// hears before that it is coming and after which file it is (or that none came), so that a parent
    /// killed in between still leaves nothing (see [`watch`]).
    pub fn covering<T>(
        &self,
        make: impl FnOnce() -> Result<T>,
        file_of: impl Fn(&T) -> Option<&EventFile>,
    ) -> Result<T> {
        self.tell(&Note::Making(driver_files::named_by_pid(std::process::id())));
        let made = make();
        self.tell(&Note::Made(made.as_ref().ok().and_then(&file_of).cloned()));
        made
    }

    /// Has the guardian remove `made` (a socket file or directory the run made), should the run end
    /// without removing it. Never fails the run, as [`cover`](Self::cover).
    pub fn cover_path(&self, made: &MadePath) {
        self.tell(&Note::Path(made.clone()));
    }

    /// Tells the guardian that a directory is about to be made at `dir` (and, with `made` false, that it was
    /// not): a parent killed between the making and [`cover_path`](Self::cover_path) leaves it to the
    /// guardian too.
    pub fn making_dir(&self, dir: &std::path::Path, made: bool) {
        let note = if made { Note::MakingDir(dir.to_owned()) } else { Note::NotMadeDir(dir.to_owned()) };
        self.tell(&note);
    }

    /// Tells the guardian that the run removed `made` itself: it is not to be looked at again (its name may
    /// be another's by then).
    pub fn forget_path(&self, made: &MadePath) {
        self.tell(&Note::Forget(made.clone()));
    }

    fn tell(&self, note: &Note) {
        if let Some(Err(e)) = self.socket.as_ref().map(|socket| wire::guardian::tell(socket, note)) {
            self.say_lost(e);
        }
    }

    fn say_lost(&self, error: Errno) {
        if self.lost.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let pid = self.process.pid();
        let why = match error {
            Errno::EAGAIN => "is not reading (stopped?)".to_owned(),
            Errno::EPIPE | Errno::ECONNRESET => "is gone".to_owned(),
            other => format!("cannot be told ({other})"),
        };
        eprint_line!(
            "warning: the guardian of this run's driver files (pid {pid}) {why}: should this run be killed, \
             the driver's files for its events stay in /dev/shm"
        );
    }
}

impl Drop for Guardian {
    /// The socket closes first: that is what ends the guardian's watch. Then `process` waits for it.
    fn drop(&mut self) {
        self.socket.take();
    }
}

/// The guardian's life: it reads the files it is told of from `fd` until end of file (the parent, the one
/// process that holds the other end, exited or was killed), then removes each name that is still that file.
///
/// A parent killed while it made an event file (between `Making` and `Made`) could not say which file it
/// made. For that case the parent listed, with `Making`, the names of the driver's shape with its pid number
/// that existed before it made one; those that were not there then, and are there at the end, were made
/// while only the parent was making one under that number in this PID namespace, and go too. (A process of
/// the same pid number in another PID namespace sharing /dev/shm would have to make the same name within the
/// same moments for this to touch its file.)
pub fn watch(fd: RawFd) -> Result<()> {
    for stray in [Signal::SIGHUP, Signal::SIGINT, Signal::SIGQUIT, Signal::SIGTERM, Signal::SIGPIPE] {
        // SAFETY: ignoring a signal installs no handler.
        let _ = unsafe { signal(stray, SigHandler::SigIgn) };
    }
    let socket = crate::os::inherit::take(fd, "guardian socket")?;
    // The parent's pid from the socket, not getppid(): a parent killed before this look has left the
    // guardian to the reaper already.
    let parent = check_peer_is_parent(&socket)?;
    let mut files = Vec::new();
    let mut paths: Vec<MadePath> = Vec::new();
    // Directories announced and not yet said made (or not made).
    let mut making_dirs: Vec<std::path::PathBuf> = Vec::new();
    let mut making = 0usize;
    // What existed before the oldest making still under way; `None`: not known (nothing is guessed).
    let mut before_making: Option<Vec<EventFile>> = None;
    for note in wire::guardian::notes(&socket) {
        match note {
            Note::File(file) => files.push(file),
            Note::Making(listed) => {
                if making == 0 {
                    before_making = listed;
                }
                making += 1;
            }
            Note::Made(file) => {
                making = making.saturating_sub(1);
                files.extend(file);
            }
            Note::Path(made) => {
                making_dirs.retain(|dir| *dir != made.path);
                paths.push(made);
            }
            Note::Forget(gone) => paths.retain(|p| *p != gone),
            Note::MakingDir(dir) => making_dirs.push(dir),
            Note::NotMadeDir(dir) => making_dirs.retain(|d| *d != dir),
        }
    }
    // A directory the parent was making when it died: removed only if it is an empty directory (no link)
    // of this user's, as the parent's would be.
    for dir in making_dirs {
        use std::os::unix::fs::MetadataExt;
        let ours = std::fs::symlink_metadata(&dir)
            .is_ok_and(|m| m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw());
        if ours {
            let _ = std::fs::remove_dir(&dir);
        }
    }
    if making > 0
        && let Some(before) = before_making
    {
        let now = driver_files::named_by_pid(parent).unwrap_or_default();
        files.extend(now.into_iter().filter(|f| !before.contains(f)));
    }
    for file in files {
        let _ = file.remove_if_ours();
    }
    // The latest first: a socket before the directory it is in.
    for path in paths.iter().rev() {
        path.remove_if_same();
    }
    Ok(())
}

/// The guardian serves the process that started it, and only over a socket of the kind that process makes.
/// Returns the parent's pid (in this namespace), as the socket's peer credentials say.
fn check_peer_is_parent(socket: &OwnedFd) -> Result<u32> {
    let kind = nix::sys::socket::getsockopt(&socket.as_fd(), SocketType)
        .context("the guardian's descriptor is not a socket")?;
    if kind != SockType::SeqPacket {
        bail!("the guardian's descriptor is not the socket its parent makes");
    }
    let peer = nix::sys::socket::getsockopt(&socket.as_fd(), PeerCredentials)
        .context("the guardian's socket has no peer")?;
    let parent = nix::unistd::getppid().as_raw();
    // A parent killed before this look is the guardian's parent no longer (it is gone, or a zombie its own
    // parent has not reaped yet); its last words are still in the socket.
    let peer_is_gone =
        crate::os::proc_stat::read(peer.pid()).is_none_or(|stat| matches!(stat.state, 'Z' | 'X'));
    if peer.pid() != parent && !peer_is_gone {
        bail!("the guardian serves only the process that started it (its peer is pid {})", peer.pid());
    }
    Ok(peer.pid() as u32)
}
