//! The socket where a served run and the processes that join it meet (`--serve SOCKET`, `--join SOCKET`):
//! its address (a path, or `@NAME` for an abstract socket, which containers that share a network namespace
//! can both reach), and the conversation, in `wire`'s messages over `SOCK_SEQPACKET`:
//! - the server admits a joiner with its index and the process count, and hands it the segment's
//!   descriptor (and, for vmm and pool, its end of a descriptor socket) by `SCM_RIGHTS`;
//! - or refuses it, with the reason;
//! - the joiner, at its end, says how it ended (its exit status, and why it failed, if it did);
//! - the server, once the whole run is over, tells each joiner still connected how the run ended (a
//!   joiner's verdict is the run's, not its own part's);
//! - in a served sequence (`--serve --ipc all`) a joiner keeps its one connection: it asks again after each
//!   run, a run hands the connections it holds back to the sequence's top parent at its end, and the top
//!   parent, once the last run is over, tells each how every run of the sequence ended.
//!
//! The connection is also how each side knows the other lives: a closed connection is a process gone.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use anyhow::{Context, Result, bail, ensure};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, socket};

use crate::wire::{self, Message, Round};

/// Where a run is served: a path in the file system, or a name in the abstract namespace (`@NAME`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    Path(std::path::PathBuf),
    Abstract(String),
}

impl Address {
    pub fn parse(text: &str) -> Result<Self> {
        ensure!(!text.is_empty(), "the socket's address is empty");
        match text.strip_prefix('@') {
            Some("") => bail!("an abstract socket needs a name after '@'"),
            Some(name) => Ok(Self::Abstract(name.to_owned())),
            None => Ok(Self::Path(text.into())),
        }
    }

    pub fn unix(&self) -> Result<UnixAddr> {
        match self {
            Self::Path(path) => UnixAddr::new(path).with_context(|| format!("{}: not a socket path", self)),
            Self::Abstract(name) => UnixAddr::new_abstract(name.as_bytes())
                .with_context(|| format!("{}: not an abstract socket name", self)),
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Path(path) => write!(f, "{}", path.display()),
            Self::Abstract(name) => write!(f, "@{name}"),
        }
    }
}

/// A `SOCK_SEQPACKET` Unix socket, closed on exec.
pub fn seqpacket() -> Result<OwnedFd> {
    socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)
        .context("socket(AF_UNIX, SOCK_SEQPACKET)")
}

/// What a joiner is given: its index among the run's processes, their count, the segment and, for vmm and
/// pool, its end of the socket its buffers' descriptors come over.
pub struct Admission {
    pub index: usize,
    pub processes: usize,
    pub segment: OwnedFd,
    pub descriptor_socket: Option<OwnedFd>,
    /// The run's place in a sequence of runs, if it is one.
    pub round: Option<Round>,
}

impl Admission {
    /// The admission [`Message::Admit`] says, with the descriptors that came beside it.
    pub fn of(index: usize, processes: usize, round: Option<Round>, fds: Vec<OwnedFd>) -> Result<Self> {
        let mut fds = fds.into_iter();
        let segment = fds.next().context("the server admitted this process without the segment")?;
        Ok(Self { index, processes, segment, descriptor_socket: fds.next(), round })
    }
}

/// The server refuses a joiner, saying why.
pub fn refuse(connection: &OwnedFd, why: &str) -> Result<()> {
    wire::send(connection, &Message::Refuse(why.to_owned()), &[]).context("refusing a joiner")
}

/// A run of a served sequence hands `connections` back to the sequence's top parent over `back`.
pub fn hand_back(back: &OwnedFd, connections: &[OwnedFd]) -> Result<()> {
    for some in connections.chunks(MAX_HANDED) {
        let fds: Vec<BorrowedFd> = some.iter().map(|c| c.as_fd()).collect();
        wire::send(back, &Message::HandBack, &fds)
            .context("handing the joiners' connections back to the top parent")?;
    }
    Ok(())
}

/// Connections handed back in one message at most.
const MAX_HANDED: usize = 16;

/// Whether the other side of `connection` is gone (it closed, or died), without reading what it said.
pub fn peer_is_gone(connection: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(connection.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) | Err(_) => false,
        Ok(_) => {
            let revents = fds[0].revents().unwrap_or(PollFlags::empty());
            if revents.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
                return true;
            }
            // Readable: a message waits, or the end of the stream (a read of 0 bytes).
            let mut byte = [0u8; 1];
            let peek = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
            matches!(nix::sys::socket::recv(connection.as_raw_fd(), &mut byte, peek), Ok(0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        assert_eq!(Address::parse("/tmp/s").unwrap(), Address::Path("/tmp/s".into()));
        assert_eq!(Address::parse("@run").unwrap(), Address::Abstract("run".into()));
        assert!(Address::parse("@").is_err());
        assert!(Address::parse("").is_err());
        assert_eq!(Address::parse("@run").unwrap().to_string(), "@run");
    }

    /// An admission comes over with its descriptors, connections are handed back in messages of a bounded
    /// number, and a peer gone is seen gone (the wire's own round trips are `wire`'s tests).
    #[test]
    fn admissions_and_connections_come_with_their_descriptors() {
        let (a, b) = nix::sys::socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (x, _y) = nix::unistd::pipe().unwrap();
        let round = Some(Round { number: 2, of: 4 });
        wire::send(&a, &Message::Admit { index: 3, processes: 5, round }, &[x.as_fd(), x.as_fd()]).unwrap();
        let wire::Heard::Said(Message::Admit { index, processes, round: heard }, fds) =
            wire::hear(&b, 1000).unwrap()
        else {
            panic!("not admitted")
        };
        let admission = Admission::of(index, processes, heard, fds).unwrap();
        assert_eq!((admission.index, admission.processes, admission.round), (3, 5, round));
        assert!(admission.descriptor_socket.is_some());
        assert!(Admission::of(0, 1, None, Vec::new()).is_err(), "an admission without the segment");
        let connections: Vec<OwnedFd> = (0..MAX_HANDED + 1).map(|_| x.try_clone().unwrap()).collect();
        hand_back(&a, &connections).unwrap();
        for count in [MAX_HANDED, 1] {
            let heard = wire::hear(&b, 1000).unwrap();
            assert!(matches!(heard, wire::Heard::Said(Message::HandBack, fds) if fds.len() == count));
        }
        assert!(!peer_is_gone(&a));
        drop(b);
        assert!(peer_is_gone(&a));
    }
}
