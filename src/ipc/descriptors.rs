//! File descriptors from the parent to each child, over a Unix domain socket with SCM_RIGHTS: how the VMM
//! and pool mechanisms share memory by default. `--fds pidfd` fetches them with `pidfd_getfd` instead (see
//! `pidfd`), which needs a shared PID namespace and ptrace permission, and containers' default seccomp profile
//! blocks without `CAP_SYS_PTRACE`.
//! Each child gets one end of a socket pair of its own, inherited at its start (no name, nothing to leave
//! behind); the parent sends it one message: a header and one descriptor per process. A child checks what it
//! receives against what the segment says it should get, and owns every descriptor it received from the
//! moment it has them, so that all are closed, also on error.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg, sendmsg,
    socketpair,
};

use crate::fault::DescriptorFault;
use crate::segment::MAX_PROCESSES;
use crate::stop::StopCheck;

const MAGIC: u32 = u32::from_le_bytes(*b"FDS1");
/// How long a child waits on the socket before it looks at its stop check again.
const SLICE: Duration = Duration::from_millis(10);

/// The header of the one message: the magic, which mechanism, and how many descriptors follow.
fn header(mechanism: u32, count: usize) -> [u8; 12] {
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[4..8].copy_from_slice(&mechanism.to_le_bytes());
    bytes[8..].copy_from_slice(&(count as u32).to_le_bytes());
    bytes
}

/// A connected pair: the parent keeps the first end, the child inherits the second.
pub fn pair() -> Result<(OwnedFd, OwnedFd)> {
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .context("socketpair(AF_UNIX, SOCK_SEQPACKET) for the descriptors")
}

/// Sends the one message: the header, which says how many descriptors come, and `fds`.
pub fn send(socket: &OwnedFd, mechanism: u32, fds: &[BorrowedFd]) -> Result<()> {
    send_message(socket, mechanism, fds.len(), fds)
}

/// A test fault (`SIMPLE_IPC_TEST_FAULT=parent@allocate-export:...`): the message with one descriptor fewer
/// than it declares, or none, or no message at all, so that the tests see every receiver refuse it.
pub fn send_wrong(
    socket: &OwnedFd,
    mechanism: u32,
    fds: &[BorrowedFd],
    fault: DescriptorFault,
) -> Result<()> {
    match fault {
        DescriptorFault::CloseSocket => Ok(()),
        DescriptorFault::SendNone => send_message(socket, mechanism, fds.len(), &[]),
        DescriptorFault::SendFewer => {
            send_message(socket, mechanism, fds.len(), &fds[..fds.len().saturating_sub(1)])
        }
    }
}

fn send_message(socket: &OwnedFd, mechanism: u32, declared: usize, fds: &[BorrowedFd]) -> Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let head = header(mechanism, declared);
    let iov = [IoSlice::new(&head)];
    let rights = [ControlMessage::ScmRights(&raw)];
    let control: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
    // MSG_NOSIGNAL: a child that is gone is an error here, not SIGPIPE.
    sendmsg::<()>(socket.as_raw_fd(), &iov, control, MsgFlags::MSG_NOSIGNAL, None)
        .context("sending descriptors over the socket (SCM_RIGHTS)")?;
    Ok(())
}

/// Receives the one message: exactly `expected` descriptors for `mechanism`, or an error that says what
/// came instead. Asks `stop` while it waits.
pub fn receive(
    socket: BorrowedFd,
    mechanism: u32,
    expected: usize,
    stop: &dyn StopCheck,
) -> Result<Vec<OwnedFd>> {
    let mut fds = [PollFd::new(socket, PollFlags::POLLIN)];
    loop {
        stop.check()?;
        match poll(&mut fds, PollTimeout::try_from(SLICE).unwrap_or(PollTimeout::ZERO)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => break,
            Err(e) => return Err(e).context("poll on the descriptor socket"),
        }
    }
    let mut head = [0u8; 12];
    let mut iov = [IoSliceMut::new(&mut head)];
    let mut space = nix::cmsg_space!([RawFd; MAX_PROCESSES]);
    let message = recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .context("receiving descriptors (SCM_RIGHTS)")?;
    // Own every descriptor at once, so that each is closed whatever happens next.
    let mut received = Vec::new();
    for cmsg in message.cmsgs().context("reading the control messages")? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: the kernel just installed these descriptors in this process for us alone.
            received.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let bytes = message.bytes;
    if bytes == 0 {
        bail!("the parent closed the descriptor socket before sending any descriptor");
    }
    ensure!(!message.flags.contains(MsgFlags::MSG_CTRUNC), "more descriptors came than a run can have");
    ensure!(bytes == head.len() && head[..4] == MAGIC.to_le_bytes(), "the descriptor message is malformed");
    let kind = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let declared = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
    ensure!(kind == mechanism, "the descriptors are for mechanism {kind}, the segment says {mechanism}");
    ensure!(
        declared == expected && received.len() == expected,
        "expected {expected} descriptors (one per process), received {} (the message declares {declared})",
        received.len()
    );
    Ok(received)
}
