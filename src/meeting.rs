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

use crate::ipc::diagnose::Diagnosis;
use crate::ipc::refused::Refused;
use crate::placement::Place;
use crate::wire::{self, Message, Round, RunEnd};

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

/// A joiner asks to join, saying where it stands: until it has asked, a connection is nobody (a probe, a
/// stray client) and takes no place. `bench_only`: the joiner takes part only in a benchmark (`--join
/// --bench`), and is refused by any other run.
pub fn ask_to_join(connection: &OwnedFd, bench_only: bool, place: &Place) -> Result<()> {
    let ask = Message::Ask { bench_only, place: Some(Box::new(place.clone())) };
    wire::send(connection, &ask, &[]).context("asking to join")
}

/// The server admits a joiner: its index, the count, and the descriptors.
pub fn admit(
    connection: &OwnedFd,
    index: usize,
    processes: usize,
    segment: BorrowedFd,
    descriptor_socket: Option<BorrowedFd>,
    round: Option<Round>,
) -> Result<()> {
    let fds: Vec<BorrowedFd> = std::iter::once(segment).chain(descriptor_socket).collect();
    let admit = Message::Admit { index, processes, round };
    wire::send(connection, &admit, &fds).context("admitting a joiner")
}

/// The server refuses a joiner, saying why.
pub fn refuse(connection: &OwnedFd, why: &str) -> Result<()> {
    wire::send(connection, &Message::Refuse(why.to_owned()), &[]).context("refusing a joiner")
}

/// The top parent of a served sequence tells a joiner how each of its runs ended, in order.
pub fn say_sequence_ended(connection: &OwnedFd, ends: &[RunEnd]) -> Result<()> {
    wire::send(connection, &Message::SequenceEnded(ends.to_vec()), &[])
        .context("telling a joiner how the served sequence ended")
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

/// The server tells a joiner how the whole run ended.
pub fn say_run_ended(connection: &OwnedFd, end: &RunEnd) -> Result<()> {
    wire::send(connection, &Message::RunEnded(end.clone()), &[]).context("telling a joiner how the run ended")
}

/// The joiner says how it ended: its exit status and, if it failed, why (the server's verdict names it),
/// with the diagnosis of its failure where there is one (the server's `--json` document carries it).
/// Where the driver refused a handle in it, the refusal too, as typed facts: the server's document and its
/// forecast against the outcome read it.
pub fn say_ended(
    connection: &OwnedFd,
    status: u8,
    why: &str,
    diagnosis: Option<&Diagnosis>,
    refused: Option<&Refused>,
) -> Result<()> {
    let ended = Message::Ended(status, why.to_owned(), diagnosis.cloned(), refused.cloned().map(Box::new));
    wire::send(connection, &ended, &[]).context("telling the server how this process ended")
}

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
    use crate::wire::Heard;

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        assert_eq!(Address::parse("/tmp/s").unwrap(), Address::Path("/tmp/s".into()));
        assert_eq!(Address::parse("@run").unwrap(), Address::Abstract("run".into()));
        assert!(Address::parse("@").is_err());
        assert!(Address::parse("").is_err());
        assert_eq!(Address::parse("@run").unwrap().to_string(), "@run");
    }

    fn pair() -> (OwnedFd, OwnedFd) {
        nix::sys::socket::socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .unwrap()
    }

    /// Each step of the conversation comes over whole, with its descriptors (the wire's own round trips
    /// are `wire`'s tests).
    #[test]
    fn the_messages_come_over_whole_with_their_descriptors() {
        let (a, b) = pair();
        let (x, _y) = nix::unistd::pipe().unwrap();
        let here = Place::here();
        ask_to_join(&b, true, &here).unwrap();
        let Heard::Said(Message::Ask { bench_only: true, place: Some(place) }, _) =
            wire::hear(&a, 1000).unwrap()
        else {
            panic!("not asked")
        };
        assert_eq!(*place, here);
        let round = Some(Round { number: 2, of: 4 });
        admit(&a, 3, 5, x.as_fd(), Some(x.as_fd()), round).unwrap();
        let Heard::Said(Message::Admit { index, processes, round: heard }, fds) =
            wire::hear(&b, 1000).unwrap()
        else {
            panic!("not admitted")
        };
        let admission = Admission::of(index, processes, heard, fds).unwrap();
        assert_eq!((admission.index, admission.processes, admission.round), (3, 5, round));
        assert!(admission.descriptor_socket.is_some());
        assert!(Admission::of(0, 1, None, Vec::new()).is_err(), "an admission without the segment");
        let (c, d) = nix::unistd::pipe().unwrap();
        hand_back(&a, &[c, d]).unwrap();
        assert!(
            matches!(wire::hear(&b, 1000).unwrap(), Heard::Said(Message::HandBack, fds) if fds.len() == 2)
        );
        refuse(&a, "the run has all the processes it needs").unwrap();
        assert!(
            matches!(wire::hear(&b, 1000).unwrap(), Heard::Said(Message::Refuse(why), _) if why.contains("all"))
        );
        say_sequence_ended(&a, &[RunEnd::Passed]).unwrap();
        assert!(
            matches!(wire::hear(&b, 1000).unwrap(), Heard::Said(Message::SequenceEnded(e), _) if e == [RunEnd::Passed])
        );
        say_run_ended(&a, &RunEnd::Waived("no fabric here".into())).unwrap();
        assert!(matches!(
            wire::hear(&b, 1000).unwrap(),
            Heard::Said(Message::RunEnded(RunEnd::Waived(_)), _)
        ));
        let diagnosis = Diagnosis::new("both pid 2".into(), "; what fixes it: ", "one PID namespace".into());
        say_ended(&b, 1, "opening: both pid 2", Some(&diagnosis), None).unwrap();
        assert!(matches!(
            wire::hear(&a, 1000).unwrap(),
            Heard::Said(Message::Ended(1, why, Some(d), None), _) if d == diagnosis && why.ends_with("pid 2")
        ));
        assert!(matches!(wire::hear(&a, 0).unwrap(), Heard::Nothing));
        assert!(!peer_is_gone(&a));
        drop(b);
        assert!(peer_is_gone(&a));
        assert!(matches!(wire::hear(&a, 1000).unwrap(), Heard::Closed));
    }

    /// A refusal said at once, by a peer that closed with the joiner's question unread, is still heard.
    #[test]
    fn what_was_said_before_a_reset_is_heard() {
        let (a, b) = pair();
        ask_to_join(&b, false, &Place::here()).unwrap();
        refuse(&a, "not of this user").unwrap();
        drop(a);
        assert!(
            matches!(wire::hear(&b, 1000).unwrap(), Heard::Said(Message::Refuse(why), _) if why == "not of this user")
        );
        assert!(matches!(wire::hear(&b, 1000).unwrap(), Heard::Closed));
    }
}
