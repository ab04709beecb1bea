//! What outlives a killed run: a small process the parent starts (this program again, in the internal role
//! `guardian --fd FD`) that removes the files the CUDA driver made in `/dev/shm` for the run's interprocess
//! events once the parent is gone, however it went (even `kill -9` of the whole process group). The driver
//! removes them only when their exporter exits normally, and the parent removes their names once every
//! child has opened the events (see `ipc::events`); the guardian is for the ways out that run no code.
//! It removes the socket file and private directory of a served or isolated run too ([`MadePath`]): the
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
//! Its socket is not on `wire`: its messages carry no descriptors and no text to print, are the fixed
//! records `driver_files` defines (a kind byte before each), are sent without blocking and never answered,
//! and its reader never fails: it keeps what it can read until end of file and ignores the rest.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::sys::signal::{SigHandler, Signal, signal};
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockType, recv, send, socketpair, sockopt::PeerCredentials,
    sockopt::SockType as SocketType,
};

use crate::driver_files::{self, EventFile};
use crate::relaunch::{OnDrop, Process, Relaunch, Streams};

mod made_path;
pub use made_path::MadePath;

/// How long the parent waits, on its way out, for the guardian to end; past it the guardian is left to
/// finish on its own (a stopped one does its work once it is continued).
const REAP_WITHIN: Duration = Duration::from_millis(100);

/// What a message to the guardian says; a record of a file (`driver_files::RECORD_BYTES`) follows.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Message {
    /// Remove this file at the end, if it is still that file.
    File = b'F',
    /// An event file is about to be made; the records that follow are the names of the driver's shape with
    /// the parent's pid number that exist now (the parent looks, so that what it makes next is not among them).
    Making = b'M',
    /// The event file announced by `Making` is this one (an empty record: none was made).
    Made = b'D',
    /// Remove this path at the end (a [`MadePath`] follows), if it is still what was made.
    Path = b'P',
    /// The parent removed this path itself (a [`MadePath`] follows): the guardian forgets it.
    PathGone = b'G',
}

const MESSAGE_BYTES: usize = 1 + driver_files::RECORD_BYTES;
/// The most records a `Making` message lists; with more, the guardian removes nothing it was not told of.
const MAX_LISTED: usize = 256;
/// The longest path a [`MadePath`] message carries (Linux's `PATH_MAX`); a longer one is cut, names nothing
/// made, and is left alone.
const PATH_MAX: usize = 4096;

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
            self.tell(Message::File, &file.to_record());
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
        let existing = driver_files::named_by_pid(std::process::id());
        let mut message = vec![Message::Making as u8];
        match existing {
            Some(existing) if existing.len() <= MAX_LISTED => {
                message.extend(existing.iter().flat_map(EventFile::to_record));
            }
            // Too many to list, or not known: the guardian will not guess.
            _ => message.push(b'!'),
        }
        self.send(&message);
        let made = make();
        let record = made
            .as_ref()
            .ok()
            .and_then(&file_of)
            .map_or([0; driver_files::RECORD_BYTES], EventFile::to_record);
        self.tell(Message::Made, &record);
        made
    }

    /// Has the guardian remove `made` (a socket file or directory the run made), should the run end
    /// without removing it. Never fails the run, as [`cover`](Self::cover).
    pub fn cover_path(&self, made: &MadePath) {
        let message = made.to_message(Message::Path);
        if message.len() <= 34 + PATH_MAX {
            self.send(&message);
        }
    }

    /// Tells the guardian that the run removed `made` itself: it is not to be looked at again (its name may
    /// be another's by then).
    pub fn forget_path(&self, made: &MadePath) {
        self.send(&made.to_message(Message::PathGone));
    }

    fn tell(&self, kind: Message, record: &[u8; driver_files::RECORD_BYTES]) {
        let mut message = [0u8; MESSAGE_BYTES];
        message[0] = kind as u8;
        message[1..].copy_from_slice(record);
        self.send(&message);
    }

    fn send(&self, message: &[u8]) {
        let Some(socket) = &self.socket else { return };
        let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
        let sent = loop {
            match send(socket.as_raw_fd(), message, flags) {
                Err(Errno::EINTR) => continue,
                other => break other,
            }
        };
        if let Err(e) = sent {
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
        warn!(
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
    let socket = crate::inherit::take(fd, "guardian socket")?;
    // The parent's pid from the socket, not getppid(): a parent killed before this look has left the
    // guardian to the reaper already.
    let parent = check_peer_is_parent(&socket)?;
    let mut files = Vec::new();
    let mut paths: Vec<MadePath> = Vec::new();
    let mut making = 0usize;
    // What existed before the oldest making still under way; `None`: not known (nothing is guessed).
    let mut before_making: Option<Vec<EventFile>> = None;
    let mut message = vec![0u8; (2 + MAX_LISTED * driver_files::RECORD_BYTES).max(64 + PATH_MAX)];
    loop {
        let n = match recv(socket.as_raw_fd(), &mut message, MsgFlags::empty()) {
            Ok(0) => break,
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        };
        let records = || {
            message[1..n].chunks_exact(driver_files::RECORD_BYTES).map(|chunk| {
                let mut record = [0u8; driver_files::RECORD_BYTES];
                record.copy_from_slice(chunk);
                EventFile::from_record(&record)
            })
        };
        match message[0] {
            b'M' => {
                if making == 0 {
                    let listed = (n - 1) % driver_files::RECORD_BYTES == 0;
                    before_making = listed.then(|| records().flatten().collect());
                }
                making += 1;
            }
            b'D' => {
                making = making.saturating_sub(1);
                files.extend(records().flatten());
            }
            b'P' => paths.extend(MadePath::from_message(&message[1..n])),
            b'G' => {
                if let Some(gone) = MadePath::from_message(&message[1..n]) {
                    paths.retain(|p| *p != gone);
                }
            }
            _ => files.extend(records().flatten()),
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
    let peer_is_gone = crate::proc_stat::read(peer.pid()).is_none_or(|stat| matches!(stat.state, 'Z' | 'X'));
    if peer.pid() != parent && !peer_is_gone {
        bail!("the guardian serves only the process that started it (its peer is pid {})", peer.pid());
    }
    Ok(peer.pid() as u32)
}
