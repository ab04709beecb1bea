//! File descriptors from the parent to each child, over a Unix domain socket with SCM_RIGHTS: how the VMM
//! and pool mechanisms share memory by default. `--fds pidfd` fetches them with `pidfd_getfd` instead (see
//! `pidfd`), which needs a shared PID namespace and ptrace permission, and containers' default seccomp profile
//! blocks without `CAP_SYS_PTRACE`.
//! Each child gets one end of a socket pair of its own, inherited at its start (no name, nothing to leave
//! behind); the parent sends it one message: a header and one descriptor per process. A child checks what it
//! receives against what the segment says it should get, and owns every descriptor it received from the
//! moment it has them, so that all are closed, also on error.

use std::os::fd::{BorrowedFd, OwnedFd};

use anyhow::{Context, Result, bail, ensure};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use super::{Heard, Message};
use crate::os::stop::StopCheck;
use crate::phases::fault::DescriptorFault;
use crate::wire;

/// How long a child waits on the socket, in milliseconds, before it looks at its stop check again.
const SLICE_MS: u16 = 10;

/// A connected pair: the parent keeps the first end, the child inherits the second.
pub fn pair() -> Result<(OwnedFd, OwnedFd)> {
    socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .context("socketpair(AF_UNIX, SOCK_SEQPACKET) for the descriptors")
}

/// Sends the one message: which mechanism, how many descriptors come, and `fds`.
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

fn send_message(socket: &OwnedFd, mechanism: u32, count: usize, fds: &[BorrowedFd]) -> Result<()> {
    wire::send(socket, &Message::Descriptors { mechanism, count }, fds)
        .context("sending descriptors over the socket (SCM_RIGHTS)")
}

/// Receives the one message: exactly `expected` descriptors for `mechanism`, or an error that says what
/// came instead. Asks `stop` while it waits.
pub fn receive(
    socket: BorrowedFd,
    mechanism: u32,
    expected: usize,
    stop: &dyn StopCheck,
) -> Result<Vec<OwnedFd>> {
    let (kind, declared, received) = loop {
        stop.check()?;
        match wire::hear(&socket, SLICE_MS).context("receiving descriptors (SCM_RIGHTS)")? {
            Heard::Nothing => continue,
            Heard::Closed => bail!("the parent closed the descriptor socket before sending any descriptor"),
            Heard::Said(Message::Descriptors { mechanism, count }, fds) => break (mechanism, count, fds),
            Heard::Said(..) => bail!("the descriptor message is malformed"),
        }
    };
    ensure!(kind == mechanism, "the descriptors are for mechanism {kind}, the segment says {mechanism}");
    ensure!(
        declared == expected && received.len() == expected,
        "expected {expected} descriptors (one per process), received {} (the message declares {declared})",
        received.len()
    );
    Ok(received)
}
