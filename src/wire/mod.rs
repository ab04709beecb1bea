//! The one wire between processes of this program over `SOCK_SEQPACKET` sockets (each message whole): the
//! typed [`Message`], its `encode` and `decode`, and the one place that sends and receives it with the
//! descriptors beside it (`SCM_RIGHTS`, as nix's `ControlMessage` carries them), owning each received one at
//! once; and [`guardian::Note`], what a parent tells its guardian, which is never answered and carries no
//! descriptors (see there).
//!
//! A message is an 8-byte ASCII tag, which names it and the layout of its body (a new layout takes a new
//! tag): the numbers and typed facts as JSON; the texts of a refusal, of a joiner's end and of a sequence's
//! end as bytes, as hand-made clients (and the tests' hostile ones) write them. Every text is cut to a
//! bound on the way out, so that each message fits the reader's buffer, and made [`printable`] on the way
//! in; what is not a message of this program is an error that says what was wrong, never a panic.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{Context, Result, bail, ensure};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

use crate::ipc::diagnose::Diagnosis;
use crate::ipc::refused::Refused;
use crate::output::printable;
use crate::placement::Place;

/// The longest reason a process gives for its failure (the rest is cut at a character's boundary).
const MAX_REASON: usize = 3000;
/// The largest message: the reader's buffer (texts are cut well below it, JSON's escapes included).
const MAX_MESSAGE: usize = 64 * 1024;
/// The most descriptors one message carries (one per process of a run); more is an error.
pub(crate) const MAX_FDS: usize = crate::segment::MAX_PROCESSES;
/// The most descriptors Linux passes in one message (`SCM_MAX_FD`).
const SCM_MAX_FD: usize = 253;

const TAGS: [(&[u8; 8], &str); 9] = [
    (b"SIPCHELO", "a request to join"),
    (b"SIPCHELB", "a request to join a benchmark"),
    (b"SIPCJOIN", "an admission"),
    (b"SIPCFULL", "a refusal"),
    (b"SIPCDONE", "a joiner's end"),
    (b"SIPCOVER", "a run's end"),
    (b"SIPCLAST", "a sequence's end"),
    (b"SIPCBACK", "connections handed back"),
    (b"SIPCFDS1", "the buffers' descriptors"),
];

/// Where a served run is one of a sequence (`--serve SOCKET --ipc all`: one run per mechanism): its number
/// from 1, and how many runs the sequence has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

pub use crate::outcome::RunEnd;

impl RunEnd {
    /// The same end, its reason through `why`.
    fn with_why(&self, why: impl Fn(&str) -> String) -> Self {
        match self {
            Self::Passed => Self::Passed,
            Self::Failed { process, why: was } => Self::Failed { process: *process, why: why(was) },
            Self::Waived(was) => Self::Waived(why(was)),
        }
    }
}

/// Every message between processes of this program; the descriptors travel beside it (see [`send`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A joiner asks to join (`bench_only`: only a benchmark, `--join --bench`), saying where it stands, the
    /// joiner's word: it goes into the forecast, never into a verdict.
    Ask { bench_only: bool, place: Option<Box<Place>> },
    /// The server admits a joiner: its index, the process count, the run's place in a sequence; with the
    /// segment's descriptor and, for vmm and pool, its end of the descriptor socket.
    Admit { index: usize, processes: usize, round: Option<Round> },
    /// The server refuses a joiner, saying why.
    Refuse(String),
    /// A joiner's exit status, why it failed (empty when it did not say), its diagnosis, if it had one, and
    /// the driver's refusal of a handle, where that was why.
    Ended(u8, String, Option<Diagnosis>, Option<Box<Refused>>),
    /// How the whole run ended (the server says it to each joiner at the end).
    RunEnded(RunEnd),
    /// How every run of a served sequence ended, in order (its top parent says it at the end).
    SequenceEnded(Vec<RunEnd>),
    /// A run of a served sequence hands the connections beside it back to the sequence's top parent.
    HandBack,
    /// The buffers' descriptors of `mechanism` (vmm, pool), `count` of them beside it, one per process.
    Descriptors { mechanism: u32, count: usize },
}

/// `text`, cut to at most `most` bytes at a character's boundary, without NULs (they separate fields).
fn cut(text: &str, most: usize) -> String {
    let mut end = text.len().min(most);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].replace('\0', " ")
}

impl Message {
    fn tag(&self) -> &'static [u8; 8] {
        let at = match self {
            Self::Ask { bench_only, .. } => usize::from(*bench_only),
            Self::Admit { .. } => 2,
            Self::Refuse(_) => 3,
            Self::Ended(..) => 4,
            Self::RunEnded(_) => 5,
            Self::SequenceEnded(_) => 6,
            Self::HandBack => 7,
            Self::Descriptors { .. } => 8,
        };
        TAGS[at].0
    }

    /// The message as it goes over the wire, its texts cut to their bounds; at most [`MAX_MESSAGE`] bytes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let mut bytes = self.tag().to_vec();
        match self {
            // A place is a few hundred bytes; one too long for the server's reader is sent without it.
            Self::Ask { place: Some(place), .. } => bytes
                .extend(serde_json::to_vec(place).ok().filter(|j| j.len() <= MAX_REASON).unwrap_or_default()),
            Self::Ask { place: None, .. } | Self::HandBack => {}
            Self::Admit { index, processes, round } => {
                bytes.extend(serde_json::to_vec(&(index, processes, round))?)
            }
            Self::Refuse(why) => bytes.extend_from_slice(cut(why, MAX_REASON).as_bytes()),
            Self::Ended(status, why, diagnosis, refused) => {
                bytes.push(*status);
                bytes.extend_from_slice(cut(why, MAX_REASON).as_bytes());
                let (cause, fix) =
                    diagnosis.as_ref().map_or(("", ""), |d| (d.cause.as_str(), d.fix.as_str()));
                for part in [cause, fix] {
                    bytes.push(0);
                    bytes.extend_from_slice(cut(part, MAX_REASON / 2).as_bytes());
                }
                if let Some(json) = refused
                    .as_ref()
                    .and_then(|r| serde_json::to_vec(r).ok())
                    .filter(|j| j.len() <= MAX_REASON / 2)
                {
                    bytes.push(0);
                    bytes.extend(json);
                }
            }
            Self::RunEnded(end) => {
                bytes.extend(serde_json::to_vec(&end.with_why(|why| cut(why, 2 * MAX_REASON)))?)
            }
            Self::SequenceEnded(ends) => {
                let most = (2 * MAX_REASON) / ends.len().max(1);
                for end in ends {
                    let (kind, why) = match end {
                        RunEnd::Passed => (b'p', ""),
                        RunEnd::Failed { why, .. } => (b'f', why.as_str()),
                        RunEnd::Waived(why) => (b'w', why.as_str()),
                    };
                    bytes.push(kind);
                    bytes.extend_from_slice(cut(why, most).as_bytes());
                    bytes.push(0);
                }
            }
            Self::Descriptors { mechanism, count } => bytes.extend(serde_json::to_vec(&(mechanism, count))?),
        }
        ensure!(
            bytes.len() <= MAX_MESSAGE,
            "{} of {} bytes is over the wire's {MAX_MESSAGE}",
            self.name(),
            bytes.len()
        );
        Ok(bytes)
    }

    /// The message `bytes` are, with every text in it made [`printable`]; an error that names what is
    /// wrong where they are none.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let Some(&(tag, name)) = TAGS.iter().find(|(tag, _)| bytes.starts_with(*tag)) else {
            let start = String::from_utf8_lossy(&bytes[..bytes.len().min(8)]).into_owned();
            bail!("a message that simple-ipc does not send (it starts {:?})", printable(&start));
        };
        let body = &bytes[8..];
        let malformed = |what: &str| format!("{name} whose {what} is not what simple-ipc sends");
        Ok(match tag {
            b"SIPCHELO" | b"SIPCHELB" => {
                Self::Ask { bench_only: tag == b"SIPCHELB", place: place_said(body).map(Box::new) }
            }
            b"SIPCJOIN" => {
                let (index, processes, round) =
                    serde_json::from_slice(body).with_context(|| malformed("body"))?;
                Self::Admit { index, processes, round }
            }
            b"SIPCFULL" => Self::Refuse(said(body)),
            b"SIPCDONE" => {
                let mut parts = body.get(1..).unwrap_or_default().split(|&b| b == 0);
                let why = said(parts.next().unwrap_or_default());
                let diagnosis = match (parts.next(), parts.next()) {
                    (Some(cause), Some(fix)) if !cause.is_empty() || !fix.is_empty() => {
                        Some(Diagnosis::new(said(cause), "; what fixes it: ", said(fix)))
                    }
                    _ => None,
                };
                let refused = parts.next().and_then(refused_said).map(Box::new);
                Self::Ended(body.first().copied().unwrap_or(1), why, diagnosis, refused)
            }
            b"SIPCOVER" => {
                let end: RunEnd = serde_json::from_slice(body).with_context(|| malformed("end"))?;
                Self::RunEnded(end.with_why(printable))
            }
            b"SIPCLAST" => {
                let records = body.split(|&b| b == 0).filter(|r| !r.is_empty());
                let ends = records.map(|record| match record[0] {
                    b'p' => Ok(RunEnd::Passed),
                    b'f' => Ok(RunEnd::Failed { process: None, why: said(&record[1..]) }),
                    b'w' => Ok(RunEnd::Waived(said(&record[1..]))),
                    kind => bail!("{name} with a run's end of kind {kind} that simple-ipc does not send"),
                });
                Self::SequenceEnded(ends.collect::<Result<_>>()?)
            }
            b"SIPCBACK" => Self::HandBack,
            _ => {
                let (mechanism, count) = serde_json::from_slice(body).with_context(|| malformed("body"))?;
                Self::Descriptors { mechanism, count }
            }
        })
    }

    /// What the message is, in words.
    fn name(&self) -> &'static str {
        TAGS.iter().find(|(tag, _)| *tag == self.tag()).map_or("a message", |(_, name)| name)
    }
}

/// Text that came over the socket, lossily decoded and made [`printable`].
fn said(bytes: &[u8]) -> String {
    printable(&String::from_utf8_lossy(bytes))
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
/// what is not one. A place whose field holds more than it can truly hold (a 60 KB hostname: see
/// `Place::received`) is not taken either: the server says so, naming the field, and the joiner is left out
/// of where the processes stand (its place is its word, for the forecast: never part of a verdict).
fn place_said(bytes: &[u8]) -> Option<Place> {
    let place: Place = serde_json::from_slice(bytes).ok()?;
    match place.received() {
        Ok(place) => Some(place),
        Err(why) => {
            eprint_line!(
                "simple-ipc: a process that asked to join said where it stands, but {why}: no place of \
                 simple-ipc's (its sender is broken or lying), so it is left out of where the processes stand"
            );
            None
        }
    }
}

/// Sends `message` with `fds` beside it (`SCM_RIGHTS`); a peer that is gone is an error, not SIGPIPE.
pub fn send(socket: &impl AsFd, message: &Message, fds: &[BorrowedFd]) -> Result<()> {
    let bytes = message.encode()?;
    ensure!(fds.len() <= MAX_FDS, "{} descriptors for one message, more than {MAX_FDS}", fds.len());
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let control: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
    let fd = socket.as_fd().as_raw_fd();
    sendmsg::<()>(fd, &[IoSlice::new(&bytes)], control, MsgFlags::MSG_NOSIGNAL, None)
        .with_context(|| format!("sending {} (sendmsg)", message.name()))?;
    Ok(())
}

/// What came over a socket.
pub enum Heard {
    /// A message (its texts made [`printable`]) and the descriptors that came with it, owned.
    Said(Message, Vec<OwnedFd>),
    /// The connection closed: the other side is gone.
    Closed,
    /// Nothing yet.
    Nothing,
}

/// Reads the next message, waiting at most `wait_ms`; the descriptors that come with it are owned at once
/// (closed on exec), and a message or control data cut short is an error.
pub fn hear(socket: &impl AsFd, wait_ms: u16) -> Result<Heard> {
    hear_once(socket.as_fd(), wait_ms, false)
}

/// [`hear`]; `after_reset`: the last read said the peer closed with something of ours unread, which is
/// reported once, ahead of what it sent before it closed (a refusal said at once): that is read now.
fn hear_once(socket: BorrowedFd, wait_ms: u16, after_reset: bool) -> Result<Heard> {
    let mut fds = [PollFd::new(socket, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(wait_ms)) {
        Ok(0) | Err(Errno::EINTR) => return Ok(Heard::Nothing),
        Ok(_) => {}
        Err(e) => return Err(e).context("poll on a socket of the run"),
    }
    let mut buffer = vec![0u8; MAX_MESSAGE];
    // Room for as many as the kernel passes in one message, so that none is left unowned by a cut.
    let mut space = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let mut iov = [IoSliceMut::new(&mut buffer)];
    let flags = MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT;
    let received = match recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), flags) {
        Ok(received) => received,
        Err(Errno::ECONNRESET) if !after_reset => return hear_once(socket, 0, true),
        Err(Errno::ECONNRESET) => return Ok(Heard::Closed),
        Err(Errno::EAGAIN) => return Ok(Heard::Nothing),
        Err(e) => return Err(e).context("reading a socket of the run (recvmsg)"),
    };
    let (bytes, flags) = (received.bytes, received.flags);
    ensure!(!flags.contains(MsgFlags::MSG_CTRUNC), "a message whose control data was cut (MSG_CTRUNC)");
    let mut owned = Vec::new();
    for message in received.cmsgs().context("the control messages of a socket of the run")? {
        if let ControlMessageOwned::ScmRights(raw) = message {
            // SAFETY: SCM_RIGHTS made these descriptors in this process for us alone.
            owned.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let n = owned.len();
    ensure!(n <= MAX_FDS, "{n} descriptors came with a message, more than the {MAX_FDS} a run can have");
    ensure!(
        !flags.contains(MsgFlags::MSG_TRUNC),
        "a message longer than the {MAX_MESSAGE} bytes simple-ipc sends"
    );
    if bytes == 0 {
        return Ok(Heard::Closed);
    }
    Ok(Heard::Said(Message::decode(&buffer[..bytes])?, owned))
}

pub(crate) mod descriptors;
pub(crate) mod guardian;
#[cfg(test)]
mod tests;
