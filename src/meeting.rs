//! The socket where a served run and the processes that join it meet (`--serve SOCKET`, `--join SOCKET`):
//! its address (a path, or `@NAME` for an abstract socket, which containers that share a network namespace
//! can both reach), and the three messages of the protocol, over `SOCK_SEQPACKET` so that each is whole:
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

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{Context, Result, bail, ensure};

use crate::ipc::diagnose::Diagnosis;
use crate::ipc::refused::Refused;
use crate::placement::Place;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr, recvmsg,
    sendmsg, socket,
};

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

const ADMIT: &[u8; 8] = b"SIPCJOIN";
const REFUSE: &[u8; 8] = b"SIPCFULL";
const ENDED: &[u8; 8] = b"SIPCDONE";
const HELLO: &[u8; 8] = b"SIPCHELO";
/// A joiner asks to join, and only a benchmark (`--join --bench`).
const HELLO_BENCH: &[u8; 8] = b"SIPCHELB";
const RUN_ENDED: &[u8; 8] = b"SIPCOVER";
const SEQUENCE_ENDED: &[u8; 8] = b"SIPCLAST";
/// A run of a served sequence hands its connections back to the sequence's top parent.
const HANDED_BACK: &[u8; 8] = b"SIPCBACK";

/// Where a served run is one of a sequence (`--serve SOCKET --ipc all`: one run per mechanism): its number
/// from 1, and how many runs the sequence has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    pub number: u32,
    pub of: u32,
}

impl Round {
    /// `2/3`, as `--serve-round` takes it.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once('/').map(|(k, m)| (k.parse(), m.parse())) {
            Some((Ok(number), Ok(of))) if number >= 1 && number <= of => Ok(Self { number, of }),
            _ => Err(format!("'{text}' is not K/M with 1 <= K <= M")),
        }
    }
}

impl std::fmt::Display for Round {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.number, self.of)
    }
}

fn round_bytes(round: Option<Round>) -> [u8; 8] {
    let (k, m) = round.map_or((0, 0), |r| (r.number, r.of));
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&k.to_le_bytes());
    bytes[4..].copy_from_slice(&m.to_le_bytes());
    bytes
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

/// A joiner asks to join, saying where it stands (its [`Place`], as JSON): until it has asked, a connection
/// is nobody (a probe, a stray client) and takes no place. `bench_only`: the joiner takes part only in a
/// benchmark (`--join --bench`), and is refused by any other run.
pub fn ask_to_join(connection: &OwnedFd, bench_only: bool, place: &Place) -> Result<()> {
    let mut message = if bench_only { HELLO_BENCH } else { HELLO }.to_vec();
    // A place is a few hundred bytes; one too long for the server's reader is sent without it.
    match serde_json::to_vec(place) {
        Ok(json) if json.len() <= MAX_REASON => message.extend_from_slice(&json),
        _ => {}
    }
    send(connection, &message, &[]).context("asking to join")
}

/// A joiner's refusal by its driver, as it said it, with every text made [`printable`].
fn refused_said(bytes: &[u8]) -> Option<Refused> {
    let mut refused: Refused = serde_json::from_slice(bytes).ok()?;
    refused.call = printable(&refused.call);
    refused.error = printable(&refused.error);
    refused.fix = refused.fix.as_deref().map(printable);
    Some(refused)
}

/// A joiner's place, as it said it, with every text made [`printable`]; `None` where it said none or
/// what is not one. It is the joiner's word: it goes into the forecast, never into a verdict.
fn place_said(bytes: &[u8]) -> Option<Box<Place>> {
    let mut place: Place = serde_json::from_slice(bytes).ok()?;
    place.hostname = printable(&place.hostname);
    for text in [&mut place.boot_id, &mut place.cuda_visible_devices, &mut place.nvidia_visible_devices]
        .into_iter()
        .chain([&mut place.nccl_hostid])
        .flatten()
    {
        *text = printable(text);
    }
    if let Some(shm) = place.dev_shm.as_mut() {
        shm.file_system = printable(&shm.file_system);
    }
    for gpu in place.gpus.iter_mut().flatten() {
        *gpu = printable(gpu);
    }
    Some(Box::new(place))
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
    let mut message = ADMIT.to_vec();
    message.extend_from_slice(&(index as u32).to_le_bytes());
    message.extend_from_slice(&(processes as u32).to_le_bytes());
    message.extend_from_slice(&round_bytes(round));
    let fds: Vec<RawFd> =
        std::iter::once(segment).chain(descriptor_socket).map(|fd| fd.as_raw_fd()).collect();
    send(connection, &message, &fds).context("admitting a joiner")
}

/// The server refuses a joiner, saying why.
pub fn refuse(connection: &OwnedFd, why: &str) -> Result<()> {
    let mut message = REFUSE.to_vec();
    message.extend_from_slice(why.as_bytes());
    send(connection, &message, &[]).context("refusing a joiner")
}

/// The top parent of a served sequence tells a joiner how each of its runs ended, in order: one record
/// each, a kind byte and the reason, separated by NULs.
pub fn say_sequence_ended(connection: &OwnedFd, ends: &[RunEnd]) -> Result<()> {
    let mut message = SEQUENCE_ENDED.to_vec();
    let most = (2 * MAX_REASON) / ends.len().max(1);
    for end in ends {
        let (kind, why) = match end {
            RunEnd::Passed => (b'p', ""),
            RunEnd::Failed { why, .. } => (b'f', why.as_str()),
            RunEnd::Waived(why) => (b'w', why.as_str()),
        };
        message.push(kind);
        message.extend_from_slice(cut(why, most).as_bytes());
        message.push(0);
    }
    send(connection, &message, &[]).context("telling a joiner how the served sequence ended")
}

/// A run of a served sequence hands `connections` back to the sequence's top parent over `back`.
pub fn hand_back(back: &OwnedFd, connections: &[OwnedFd]) -> Result<()> {
    for some in connections.chunks(MAX_HANDED) {
        let fds: Vec<RawFd> = some.iter().map(|c| c.as_raw_fd()).collect();
        send(back, HANDED_BACK, &fds).context("handing the joiners' connections back to the top parent")?;
    }
    Ok(())
}

/// Connections handed back in one message at most.
const MAX_HANDED: usize = 16;

/// The longest reason a joiner gives for its failure (the rest is cut at a character's boundary).
const MAX_REASON: usize = 3000;

/// `text`, cut to at most `most` bytes at a character's boundary, without NULs (they separate fields).
fn cut(text: &str, most: usize) -> String {
    let mut end = text.len().min(most);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].replace('\0', " ")
}

/// How a whole run ended, as its server tells each joiner once the run is over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    Passed,
    /// It failed: because process `process` failed, where one did, and why (the server's verdict).
    Failed {
        process: Option<usize>,
        why: String,
    },
    /// It was waived after the joiner was admitted (a mechanism the devices lack, found at the export).
    Waived(String),
}

/// The server tells a joiner how the whole run ended.
pub fn say_run_ended(connection: &OwnedFd, end: &RunEnd) -> Result<()> {
    let (kind, process, why) = match end {
        RunEnd::Passed => (0u8, 0u32, ""),
        RunEnd::Failed { process, why } => (1, process.map_or(0, |p| p as u32 + 1), why.as_str()),
        RunEnd::Waived(why) => (2, 0, why.as_str()),
    };
    let mut message = RUN_ENDED.to_vec();
    message.push(kind);
    message.extend_from_slice(&process.to_le_bytes());
    message.extend_from_slice(cut(why, 2 * MAX_REASON).as_bytes());
    send(connection, &message, &[]).context("telling a joiner how the run ended")
}

/// The joiner says how it ended: its exit status and, if it failed, why (the server's verdict names it),
/// with the diagnosis of its failure where there is one (the server's `--json` document carries it).
/// Where the driver refused a handle in it, the refusal too, as typed facts (JSON): the server's document
/// and its forecast against the outcome read it.
pub fn say_ended(
    connection: &OwnedFd,
    status: u8,
    why: &str,
    diagnosis: Option<&Diagnosis>,
    refused: Option<&Refused>,
) -> Result<()> {
    let mut message = ENDED.to_vec();
    message.push(status);
    message.extend_from_slice(cut(why, MAX_REASON).as_bytes());
    let (cause, fix) = diagnosis.map_or(("", ""), |d| (d.cause.as_str(), d.fix.as_str()));
    for part in [cause, fix] {
        message.push(0);
        message.extend_from_slice(cut(part, MAX_REASON / 2).as_bytes());
    }
    if let Some(json) = refused.and_then(|r| serde_json::to_vec(r).ok()).filter(|j| j.len() <= MAX_REASON / 2)
    {
        message.push(0);
        message.extend_from_slice(&json);
    }
    send(connection, &message, &[]).context("telling the server how this process ended")
}

fn send(connection: &OwnedFd, message: &[u8], fds: &[RawFd]) -> Result<()> {
    let iov = [IoSlice::new(message)];
    let rights = [ControlMessage::ScmRights(fds)];
    let control: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    // MSG_NOSIGNAL: a peer that is gone is an error here, not SIGPIPE.
    sendmsg::<()>(connection.as_raw_fd(), &iov, control, MsgFlags::MSG_NOSIGNAL, None)?;
    Ok(())
}

/// `text` from another process, fit to print: each control character (ESC, CR, BEL, a newline, C1 codes)
/// and each bidirectional-text control is written as its escape (`\u{1b}`, `\r`, `\n`), so that nothing
/// said over the socket can move the cursor, recolour, retitle or rewrite a line of a terminal or a verdict;
/// the rest is kept as it is, to stay readable. Every text that [`hear`] returns has been through it.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if bidi {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// Text that came over the socket, lossily decoded and made [`printable`].
fn said(bytes: &[u8]) -> String {
    printable(&String::from_utf8_lossy(bytes))
}

/// What came over a connection (its texts made [`printable`]).
pub enum Heard {
    Admitted(Admission),
    Refused(String),
    /// A joiner's exit status, why it failed (empty when it did not say), its diagnosis, if it had one, and
    /// the driver's refusal of a handle, where that was why.
    Ended(u8, String, Option<Diagnosis>, Option<Box<Refused>>),
    /// A process asks to join (`true`: only a benchmark), where it stands if it said.
    Asked(bool, Option<Box<Place>>),
    /// How every run of a served sequence ended, in order (the top parent says it at the end).
    SequenceEnded(Vec<RunEnd>),
    /// Connections a run of a served sequence handed back to its top parent.
    HandedBack(Vec<OwnedFd>),
    /// How the whole run ended (the server says it to each joiner at the end).
    RunEnded(RunEnd),
    /// The connection closed: the other side is gone.
    Closed,
    /// Nothing yet.
    Nothing,
}

/// Reads the next message, waiting at most `wait_ms`; the descriptors that come with it are owned at once.
pub fn hear(connection: &OwnedFd, wait_ms: u16) -> Result<Heard> {
    hear_once(connection, wait_ms, false)
}

/// [`hear`]; `after_reset`: the last read said the peer closed with something of ours unread, which is
/// reported once, ahead of what it sent before it closed (a refusal said at once): that is read now.
fn hear_once(connection: &OwnedFd, wait_ms: u16, after_reset: bool) -> Result<Heard> {
    let mut fds = [PollFd::new(connection.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(wait_ms)) {
        Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(Heard::Nothing),
        Ok(_) => {}
        Err(e) => return Err(e).context("poll on the run's socket"),
    }
    let mut buffer = [0u8; 16 + 2 * MAX_REASON + 2 + 2 * crate::ipc::Mechanism::ALL.len()];
    let mut space = nix::cmsg_space!([RawFd; MAX_HANDED]);
    let mut iov = [IoSliceMut::new(&mut buffer)];
    let flags = MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT;
    let received = match recvmsg::<()>(connection.as_raw_fd(), &mut iov, Some(&mut space), flags) {
        Ok(received) => received,
        Err(nix::errno::Errno::ECONNRESET) if !after_reset => return hear_once(connection, 0, true),
        Err(nix::errno::Errno::ECONNRESET) => return Ok(Heard::Closed),
        Err(nix::errno::Errno::EAGAIN) => return Ok(Heard::Nothing),
        Err(e) => return Err(e).context("reading the run's socket"),
    };
    let mut owned = Vec::new();
    for message in received.cmsgs().context("the control messages of the run's socket")? {
        if let ControlMessageOwned::ScmRights(raw) = message {
            // SAFETY: SCM_RIGHTS made these descriptors in this process for us alone.
            owned.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let bytes = received.bytes;
    let text = &buffer[..bytes];
    if bytes == 0 {
        return Ok(Heard::Closed);
    }
    let word = |at: usize| -> Result<usize> {
        let raw = text.get(at..at + 4).context("a short message on the run's socket")?;
        Ok(u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize)
    };
    match text.get(..8) {
        Some(tag) if tag == ADMIT => {
            let mut fds = owned.into_iter();
            let segment = fds.next().context("the server admitted this process without the segment")?;
            let round = match (word(16), word(20)) {
                (Ok(number), Ok(of)) if number >= 1 => Some(Round { number: number as u32, of: of as u32 }),
                _ => None,
            };
            Ok(Heard::Admitted(Admission {
                index: word(8)?,
                processes: word(12)?,
                segment,
                descriptor_socket: fds.next(),
                round,
            }))
        }
        Some(tag) if tag == REFUSE => Ok(Heard::Refused(said(&text[8..]))),
        Some(tag) if tag == ENDED => {
            let mut parts = text.get(9..).unwrap_or_default().split(|&b| b == 0);
            let why = said(parts.next().unwrap_or_default());
            let diagnosis = match (parts.next(), parts.next()) {
                (Some(cause), Some(fix)) if !cause.is_empty() || !fix.is_empty() => {
                    Some(Diagnosis::new(said(cause), "; what fixes it: ", said(fix)))
                }
                _ => None,
            };
            let refused = parts.next().and_then(refused_said).map(Box::new);
            Ok(Heard::Ended(text.get(8).copied().unwrap_or(1), why, diagnosis, refused))
        }
        Some(tag) if tag == HELLO => Ok(Heard::Asked(false, place_said(&text[8..]))),
        Some(tag) if tag == HELLO_BENCH => Ok(Heard::Asked(true, place_said(&text[8..]))),
        Some(tag) if tag == SEQUENCE_ENDED => {
            let records = text[8..].split(|&b| b == 0).filter(|r| !r.is_empty());
            let ends = records.map(|record| match record[0] {
                b'p' => Ok(RunEnd::Passed),
                b'f' => Ok(RunEnd::Failed { process: None, why: said(&record[1..]) }),
                b'w' => Ok(RunEnd::Waived(said(&record[1..]))),
                _ => bail!("a sequence's end on the run's socket that simple-ipc does not send"),
            });
            Ok(Heard::SequenceEnded(ends.collect::<Result<_>>()?))
        }
        Some(tag) if tag == HANDED_BACK => Ok(Heard::HandedBack(owned)),
        Some(tag) if tag == RUN_ENDED => {
            let why = said(text.get(13..).unwrap_or_default());
            match (text.get(8), word(9)?) {
                (Some(0), _) => Ok(Heard::RunEnded(RunEnd::Passed)),
                (Some(1), process) => {
                    Ok(Heard::RunEnded(RunEnd::Failed { process: process.checked_sub(1), why }))
                }
                (Some(2), _) => Ok(Heard::RunEnded(RunEnd::Waived(why))),
                _ => bail!("a run's end on the run's socket that simple-ipc does not send"),
            }
        }
        _ => bail!("a message on the run's socket that simple-ipc does not send"),
    }
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

    #[test]
    fn a_round_is_k_of_m() {
        assert_eq!(Round::parse("2/4"), Ok(Round { number: 2, of: 4 }));
        for bad in ["0/3", "4/3", "x", "1/", "1/2/3", "4/4/3"] {
            assert!(Round::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Round::parse("2/4").unwrap().to_string(), "2/4");
    }

    #[test]
    fn printable_escapes_control_characters_only() {
        assert_eq!(
            printable("exit code 1: CUDA_ERROR_MAP_FAILED (é, 中)"),
            "exit code 1: CUDA_ERROR_MAP_FAILED (é, 中)"
        );
        assert_eq!(printable("\x1b[32mPASSED\x1b[0m"), "\\u{1b}[32mPASSED\\u{1b}[0m");
        assert_eq!(printable("a\rb\nc\td\x07e\0f\x7f"), "a\\rb\\nc\\td\\u{7}e\\0f\\u{7f}");
        assert_eq!(printable("\u{9b}31m"), "\\u{9b}31m", "a C1 control (CSI)");
        assert_eq!(printable("abc\u{202e}fed"), "abc\\u{202e}fed", "a bidirectional override");
        assert!(printable("\x1b]0;title\x07").chars().all(|c| !c.is_control()));
    }

    /// Every text that comes over the socket is made printable as it is read.
    #[test]
    fn text_from_the_wire_is_heard_printable() {
        let (a, b) = nix::sys::socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let evil = "\x1b[2K\rPASSED\x1b]0;t\x07";
        let escaped = "\\u{1b}[2K\\rPASSED\\u{1b}]0;t\\u{7}";
        refuse(&a, evil).unwrap();
        assert!(matches!(hear(&b, 1000).unwrap(), Heard::Refused(why) if why == escaped));
        say_sequence_ended(&a, &[RunEnd::Waived(evil.into())]).unwrap();
        let Heard::SequenceEnded(ends) = hear(&b, 1000).unwrap() else { panic!("not the end") };
        assert_eq!(ends, [RunEnd::Waived(escaped.into())]);
        let diagnosis = Diagnosis::new(evil.into(), "; what fixes it: ", evil.into());
        say_ended(&b, 1, evil, Some(&diagnosis), None).unwrap();
        let Heard::Ended(1, why, Some(d), _) = hear(&a, 1000).unwrap() else { panic!("not ended") };
        assert_eq!(why, escaped);
        assert_eq!((d.cause.as_str(), d.fix.as_str()), (escaped, escaped));
    }

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        assert_eq!(Address::parse("/tmp/s").unwrap(), Address::Path("/tmp/s".into()));
        assert_eq!(Address::parse("@run").unwrap(), Address::Abstract("run".into()));
        assert!(Address::parse("@").is_err());
        assert!(Address::parse("").is_err());
        assert_eq!(Address::parse("@run").unwrap().to_string(), "@run");
    }

    #[test]
    fn the_messages_come_over_whole_with_their_descriptors() {
        let (a, b) = nix::sys::socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (x, _y) = nix::unistd::pipe().unwrap();
        let mut here = Place::here();
        ask_to_join(&b, false, &here).unwrap();
        assert!(matches!(hear(&a, 1000).unwrap(), Heard::Asked(false, Some(place)) if *place == here));
        ask_to_join(&b, true, &here).unwrap();
        assert!(
            matches!(hear(&a, 1000).unwrap(), Heard::Asked(true, _)),
            "a joiner that wants the benchmark"
        );
        here.hostname = "\u{1b}]0;evil\u{7}".into();
        ask_to_join(&b, false, &here).unwrap();
        let Heard::Asked(_, Some(said)) = hear(&a, 1000).unwrap() else { panic!("no place") };
        assert_eq!(said.hostname, "\\u{1b}]0;evil\\u{7}", "a hostname from the wire is made printable");
        send(&b, b"SIPCHELOnot json", &[]).unwrap();
        assert!(matches!(hear(&a, 1000).unwrap(), Heard::Asked(false, None)), "a place that is none is none");
        admit(&a, 3, 5, x.as_fd(), None, None).unwrap();
        let Heard::Admitted(admission) = hear(&b, 1000).unwrap() else { panic!("not admitted") };
        assert_eq!((admission.index, admission.processes, admission.round), (3, 5, None));
        assert!(admission.descriptor_socket.is_none());
        let round = Round { number: 2, of: 4 };
        admit(&a, 1, 2, x.as_fd(), None, Some(round)).unwrap();
        let Heard::Admitted(admission) = hear(&b, 1000).unwrap() else { panic!("not admitted") };
        assert_eq!(admission.round, Some(round), "a run of a sequence says its place");
        let ends = [
            RunEnd::Waived("no legacy here".into()),
            RunEnd::Passed,
            RunEnd::Failed { process: None, why: "Process 1 failed!".into() },
        ];
        say_sequence_ended(&a, &ends).unwrap();
        assert!(matches!(hear(&b, 1000).unwrap(), Heard::SequenceEnded(heard) if heard == ends));
        let (c, d) = nix::unistd::pipe().unwrap();
        hand_back(&a, &[c, d]).unwrap();
        assert!(matches!(hear(&b, 1000).unwrap(), Heard::HandedBack(fds) if fds.len() == 2));
        refuse(&a, "the run has all the processes it needs").unwrap();
        assert!(matches!(hear(&b, 1000).unwrap(), Heard::Refused(why) if why.contains("all the processes")));
        say_ended(&b, 1, "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_CONTEXT", None, None).unwrap();
        assert!(
            matches!(hear(&a, 1000).unwrap(), Heard::Ended(1, why, None, None) if why.ends_with("INVALID_CONTEXT")),
            "the reason comes with the status"
        );
        let diagnosis = Diagnosis::new("both pid 2".into(), "; what fixes it: ", "one PID namespace".into());
        say_ended(&b, 1, "opening: both pid 2", Some(&diagnosis), None).unwrap();
        assert!(
            matches!(hear(&a, 1000).unwrap(), Heard::Ended(1, _, Some(d), None) if d == diagnosis),
            "and its diagnosis, in its parts"
        );
        let refused = Refused {
            call: "cuIpcOpenEventHandle".into(),
            code: 205,
            error: "CUDA_ERROR_MAP_FAILED".into(),
            event: true,
            fix: Some("--sync memops".into()),
            beyond_the_simulation: false,
        };
        say_ended(&b, 1, "opening the event", None, Some(&refused)).unwrap();
        assert!(
            matches!(hear(&a, 1000).unwrap(), Heard::Ended(1, _, None, Some(r)) if *r == refused),
            "and the driver's refusal, as typed facts"
        );
        for end in [
            RunEnd::Passed,
            RunEnd::Failed { process: Some(1), why: "Process 1 failed! (exit code 1: corrupt)".into() },
            RunEnd::Failed { process: None, why: "the run did not finish within 2 s".into() },
            RunEnd::Waived("no fabric here".into()),
        ] {
            say_run_ended(&a, &end).unwrap();
            assert!(matches!(hear(&b, 1000).unwrap(), Heard::RunEnded(heard) if heard == end), "{end:?}");
        }
        assert!(matches!(hear(&a, 0).unwrap(), Heard::Nothing));
        assert!(!peer_is_gone(&a));
        drop(b);
        assert!(peer_is_gone(&a));
        assert!(matches!(hear(&a, 1000).unwrap(), Heard::Closed));
    }

    /// A refusal said at once, by a peer that closed with the joiner's question unread, is still heard.
    #[test]
    fn what_was_said_before_a_reset_is_heard() {
        let (a, b) = nix::sys::socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        ask_to_join(&b, false, &Place::here()).unwrap();
        refuse(&a, "not of this user").unwrap();
        drop(a);
        assert!(matches!(hear(&b, 1000).unwrap(), Heard::Refused(why) if why == "not of this user"));
        assert!(matches!(hear(&b, 1000).unwrap(), Heard::Closed));
    }
}
