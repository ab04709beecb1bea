//! The served run's door: who may join (credentials read at accept: a stranger is refused and closed at once,
//! a bounded number of connections per process), admitting each that asks with its index, the segment and
//! its descriptors, and saying where they stand once all have joined.

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::sys::socket::{accept4, sockopt::PeerCredentials};

use super::{DOOR_PER_LOOK, Joined, Joiners, MAX_WAITING, PER_PEER, Waiting};
use crate::meeting;
use crate::placement::{Place, Placement};
use crate::wire::{self, Heard, Message};

impl Joiners<'_> {
    /// Admits or refuses whoever is at the socket now.
    pub(super) fn answer_the_door(&mut self) -> Result<()> {
        // Take a bounded number of new connections a look, so that a flood cannot hold the server (its
        // watchdog, its signals, its joiners) at the door.
        for _ in 0..DOOR_PER_LOOK {
            let Some(listener) = &self.listener else { break };
            let connection = match accept4(listener, nix::sys::socket::SockFlag::SOCK_CLOEXEC) {
                Ok(fd) => fd,
                Err(Errno::EAGAIN | Errno::EINTR) => break,
                Err(e) => return Err(e).context("accepting a joiner"),
            };
            self.arrived(connection);
        }
        // Those that have asked to join by now are admitted; the silent ones are let go after a while, and
        // one that says anything else, or leaves, takes no place.
        let mut still = Vec::new();
        for mut waiting in std::mem::take(&mut self.waiting) {
            match wire::hear(&waiting.connection, 0) {
                Ok(Heard::Said(Message::Ask { bench_only, place }, _)) => {
                    match &waiting.refusal.clone().or_else(|| {
                        let bench = self.state().options.load(std::sync::atomic::Ordering::Relaxed)
                            & crate::segment::OPTION_BENCH
                            != 0;
                        (bench_only && !bench)
                            .then(|| "this run is not the benchmark (join it without --bench)".to_owned())
                    }) {
                        // Refused once it has asked, so that the answer is read, not lost with the close.
                        Some(why) => {
                            eprint_line!(
                                "simple-ipc: a process (pid {}) asked to join: refused: {why}",
                                waiting.pid
                            );
                            let _ = meeting::refuse(&waiting.connection, why);
                        }
                        None => self.admit(waiting.connection, waiting.pid, place)?,
                    }
                }
                Ok(Heard::Nothing) if waiting.look() => still.push(waiting),
                _ => {}
            }
        }
        self.waiting = still;
        Ok(())
    }

    /// A new connection at the door: who it is, before anything it says is trusted. A stranger (another
    /// user, not root) is refused and closed at once; one more of a process that has [`PER_PEER`] waiting
    /// already, or beyond [`MAX_WAITING`], is dropped; the rest wait to ask.
    pub(super) fn arrived(&mut self, connection: OwnedFd) {
        let Ok(peer) = nix::sys::socket::getsockopt(&connection.as_fd(), PeerCredentials) else { return };
        if let Some(why) = stranger(peer.uid()) {
            let _ = wire::hear(&connection, 0); // what it said already, so that the refusal is read
            let _ = meeting::refuse(&connection, &why);
            return;
        }
        let refusal = self.only_started_by.as_ref().and_then(|ours| {
            (!started_by(peer.pid(), ours)).then(|| {
                "this run admits only the processes it started in their namespaces (--isolate)".to_owned()
            })
        });
        let of_this_peer = self.waiting.iter().filter(|w| w.pid == peer.pid()).count();
        if self.waiting.len() >= MAX_WAITING || of_this_peer >= PER_PEER {
            return; // dropped: too many connections that have not asked yet
        }
        self.waiting.push(Waiting::new(connection, peer.pid(), refusal));
    }

    /// Admits a process that asked to join, or refuses it when the run has all its processes.
    pub(super) fn admit(&mut self, connection: OwnedFd, pid: i32, place: Option<Box<Place>>) -> Result<()> {
        let position = self.joined.len();
        let index = self.first + position;
        if position >= self.expected() {
            let why = format!("the run has all the {} processes it needs", self.processes);
            eprint_line!("simple-ipc: a process (pid {pid}) asked to join: refused: {why}");
            let _ = meeting::refuse(&connection, &why);
            return Ok(());
        }
        let socket = self.descriptor_sockets[position].as_ref().map(|s| s.as_fd());
        let fds: Vec<_> = std::iter::once(self.segment.fd_borrowed()).chain(socket).collect();
        let admit = Message::Admit { index, processes: self.processes, round: self.round };
        if let Err(e) = wire::send(&connection, &admit, &fds) {
            // It left while it was being admitted: it takes no place.
            eprint_line!("simple-ipc: a process (pid {pid}) that asked to join is gone: {e:#}");
            return Ok(());
        }
        self.descriptor_sockets[position] = None;
        print_line!("Process {index} joined (pid {pid})")?;
        // One of the run's processes, should the kernel log an Xid of it (its pid as this process sees it).
        crate::node::note_run_process(pid.unsigned_abs());
        self.joined.push(Joined { index, pid, connection: Some(connection), done: false, place });
        if self.joined.len() == self.expected() {
            self.report_placement()?;
        }
        // A run of a sequence closes its door once full: a joiner that comes now waits at the sequence's
        // listener for the next run. So does an isolated run, and removes its socket: nobody else is to come.
        if self.joined.len() == self.expected() && (self.round.is_some() || self.remove_when_full) {
            self.remove_socket_file();
            self.listener = None;
        }
        Ok(())
    }

    /// Once every process has joined, before anything runs (or, where the run ends first, once it ends, for
    /// those that joined): what each shares with the server and the forecast for each pair (`placement`),
    /// in the output and the document. A joiner that said no place is left out of it.
    pub(super) fn report_placement(&self) -> Result<()> {
        let places: Vec<(usize, Place)> =
            self.joined.iter().filter_map(|j| Some((j.index, (**j.place.as_ref()?).clone()))).collect();
        if places.is_empty() {
            return Ok(());
        }
        let placement = Placement::of(Place::here(), places);
        if self.joined.len() < self.expected() {
            print_line!(
                "Only {} of the {} processes joined before the run ended: where those stand, and their forecast.",
                self.joined.len(),
                self.expected()
            )?;
        }
        print_line!("{}", placement.text().trim_end())?;
        if let Some(at_end) = self.at_end {
            at_end.placement.replace(Some(placement));
        }
        Ok(())
    }
}

/// Why a process of user `uid` may not join a run of this user: `None` for this user or root.
pub(crate) fn stranger(uid: u32) -> Option<String> {
    let me = nix::unistd::geteuid().as_raw();
    (uid != me && uid != 0).then(|| {
        format!("this run admits processes of its own user (uid {me}) or root; this one is uid {uid}")
    })
}

/// Whether process `pid` (as this process sees it; 0 for one outside its PID namespace) is one of `pids` or
/// was started by one of them, up to a few generations (the process that entered its namespaces, until it
/// hands over, its init, the process itself).
pub(crate) fn started_by(pid: i32, pids: &[i32]) -> bool {
    let mut current = pid;
    for _ in 0..4 {
        if current <= 1 {
            return false;
        }
        if pids.contains(&current) {
            return true;
        }
        match crate::os::proc_stat::read(current) {
            Some(stat) => current = stat.parent,
            None => return false,
        }
    }
    false
}
