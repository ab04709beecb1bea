//! What a row's exporter and importer say to each other, over their `SOCK_SEQPACKET` connection: one
//! message each way, JSON, the offer's descriptors beside it (`SCM_RIGHTS`). What came from the other
//! process is read as data, never as a verdict: each cell is what the importer's own calls answered.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Serialize, de::DeserializeOwned};

/// The longest message either side sends (the offer is a few kilobytes).
const MAX_MESSAGE: usize = 1 << 16;
/// The most descriptors an offer carries (one for each column's buffer, at most).
const MAX_FDS: usize = 8;

/// Sends `message` with `fds` beside it; a peer that is gone is an error, not SIGPIPE.
pub(super) fn send(socket: &impl AsFd, message: &impl Serialize, fds: &[BorrowedFd]) -> Result<()> {
    let bytes = serde_json::to_vec(message).context("encoding a message of the matrix's row")?;
    ensure!(bytes.len() <= MAX_MESSAGE, "a message of {} bytes, more than {MAX_MESSAGE}", bytes.len());
    ensure!(fds.len() <= MAX_FDS, "{} descriptors for one message, more than {MAX_FDS}", fds.len());
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let control: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
    sendmsg::<()>(socket.as_fd().as_raw_fd(), &[IoSlice::new(&bytes)], control, MsgFlags::MSG_NOSIGNAL, None)
        .context("sending to the other process of the matrix's row (sendmsg)")?;
    Ok(())
}

/// The next message and the descriptors that came with it (owned at once, closed on exec), waiting until
/// `deadline` at most and asking `look` between slices of the wait (a stop signal, a process that ended).
pub(super) fn hear<T: DeserializeOwned>(
    socket: &impl AsFd,
    deadline: Option<Instant>,
    look: &mut dyn FnMut() -> Result<()>,
) -> Result<(T, Vec<OwnedFd>)> {
    loop {
        look()?;
        if deadline.is_some_and(|at| Instant::now() >= at) {
            bail!("the other process of the matrix's row said nothing within --timeout");
        }
        let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(50u16)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => break,
            Err(e) => return Err(e).context("poll on the matrix row's connection"),
        }
    }
    let mut buffer = vec![0u8; MAX_MESSAGE];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(&mut buffer)];
    let flags = MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT;
    let received = recvmsg::<()>(socket.as_fd().as_raw_fd(), &mut iov, Some(&mut space), flags)
        .context("reading the matrix row's connection (recvmsg)")?;
    let (bytes, flags) = (received.bytes, received.flags);
    let mut owned = Vec::new();
    for message in received.cmsgs().context("the control messages of the matrix row's connection")? {
        if let ControlMessageOwned::ScmRights(raw) = message {
            // SAFETY: SCM_RIGHTS made these descriptors in this process for us alone.
            owned.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    ensure!(!flags.contains(MsgFlags::MSG_CTRUNC), "a message whose descriptors were cut (MSG_CTRUNC)");
    ensure!(!flags.contains(MsgFlags::MSG_TRUNC), "a message longer than {MAX_MESSAGE} bytes");
    ensure!(bytes > 0, "the other process of the matrix's row closed the connection");
    let message = serde_json::from_slice(&buffer[..bytes]).context("a message of the matrix's row")?;
    Ok((message, owned))
}
