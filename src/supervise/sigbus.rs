//! A process of the run killed by SIGBUS: its likely cause (a full /dev/shm), with /dev/shm's size and room
//! as this process sees it, and the fix, for the failure the parent says and the `--json` document.
//!
//! The parent learns it from its child's exit status; a server cannot (its joiners are not its children, or,
//! isolated, are its children's children). So a joiner leaves its last word before its part begins
//! ([`leave_last_word`]): the message that says so, made ready, which a handler sends on its connection should
//! SIGBUS come, before the process dies of it as ever.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

use crate::ipc::diagnose::Diagnosis;

/// The handler's own copy of the connection, and the message, whole, that it sends.
static LAST_WORD: OnceLock<(OwnedFd, Vec<u8>)> = OnceLock::new();

/// Should SIGBUS come, `message` (encoded whole) is sent on `connection`, then the process dies of SIGBUS as
/// it would have. The handler sends on a copy of the connection of its own, open for the process's life: the
/// caller's may be closed and its number given to another file (the `--json` document) before a SIGBUS
/// comes (from a `kill`), which must not get the message. Once per process: a later call (the next run of a
/// served sequence, on the same connection) changes nothing.
pub(crate) fn leave_last_word(connection: BorrowedFd, message: Vec<u8>) -> Result<()> {
    if LAST_WORD.get().is_some() {
        return Ok(());
    }
    let own = connection
        .try_clone_to_owned()
        .context("keeping a copy of the connection for the last word on SIGBUS")?;
    if LAST_WORD.set((own, message)).is_err() {
        return Ok(());
    }
    // Reset to the default as it runs: the SIGBUS it raises again ends the process.
    let action = SigAction::new(SigHandler::Handler(say_and_die), SaFlags::SA_RESETHAND, SigSet::empty());
    // SAFETY: the handler calls only send(2) and raise(3), which are async-signal-safe, on data set before
    // it was installed and never changed (a `OnceLock` read is an atomic load).
    unsafe { sigaction(Signal::SIGBUS, &action) }.context("installing a handler for SIGBUS")?;
    Ok(())
}

extern "C" fn say_and_die(_signal: nix::libc::c_int) {
    if let Some((connection, message)) = LAST_WORD.get() {
        // SAFETY: `message` lives for the process's life; a connection already gone is an error, ignored.
        let _ = unsafe {
            nix::libc::send(
                connection.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                nix::libc::MSG_NOSIGNAL,
            )
        };
    }
    // SAFETY: raise is async-signal-safe; SIGBUS is held until the handler returns, then ends the process
    // (its disposition is the default again), whether it came from a fault or from kill(2).
    unsafe { nix::libc::raise(nix::libc::SIGBUS) };
}

/// The likely cause of a process of the run killed by SIGBUS, with /dev/shm's size and room as this
/// process sees it now, and the fix. A file in a tmpfs that is full does not fail to grow: its pages are
/// given as they are touched, and a page tmpfs cannot give is SIGBUS to whoever touches it (a file that
/// `ftruncate` sized, mapped and written: the CUDA driver's interprocess events in /dev/shm, NCCL's buffers),
/// never an error a program could say. Docker gives a container 64 MiB of /dev/shm.
pub(crate) fn diagnosis() -> Diagnosis {
    let shm = crate::placement::dev_shm(std::path::Path::new("/dev/shm"));
    diagnosis_with(shm.map(|shm| (shm.size_bytes, shm.free_bytes)))
}

/// [`diagnosis`] for /dev/shm of `room`: its size and free bytes, where it could be read.
fn diagnosis_with(room: Option<(u64, u64)>) -> Diagnosis {
    let room = match room {
        Some((size, free)) => {
            format!("here /dev/shm is {}, {} of it free now", size_text(size), size_text(free))
        }
        None => "/dev/shm could not be read here (statvfs)".to_owned(),
    };
    Diagnosis::new(
        format!(
            "most likely a full /dev/shm, where the CUDA driver keeps a file for each interprocess event: a \
             page that a full tmpfs cannot give is SIGBUS, not an error; {room}"
        ),
        "; what fixes it: ",
        "a larger /dev/shm: Docker --shm-size=1g; Kubernetes an emptyDir of medium: Memory, sizeLimit: 1Gi, \
         mounted at /dev/shm"
            .to_owned(),
    )
}

/// `bytes` as people write a size: 4 KiB, 64 MiB, 1 GiB (rounded down), or bytes below 1 KiB.
fn size_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// In a forked process (the handler ends it): the caller's connection closed and its number taken by
    /// another file before SIGBUS comes, the last word still reaches the other end, and the process dies of
    /// SIGBUS.
    #[test]
    fn the_last_word_reaches_the_server_after_the_callers_connection_is_closed() {
        let (server, joiner) = crate::wire::descriptors::pair().unwrap();
        // SAFETY: (test) the forked child only installs the handler, closes and opens a descriptor and
        // raises SIGBUS; every path ends it with _exit or the signal.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let number = joiner.as_raw_fd();
                let left = leave_last_word(joiner.as_fd(), b"bus".to_vec());
                drop(joiner);
                let reused = std::fs::File::open("/dev/null");
                let took_its_number = reused.as_ref().is_ok_and(|f| f.as_raw_fd() == number);
                if left.is_err() || !took_its_number {
                    // SAFETY: _exit ends the forked child at once.
                    unsafe { nix::libc::_exit(3) };
                }
                let _ = nix::sys::signal::raise(Signal::SIGBUS);
                // SAFETY: as above.
                unsafe { nix::libc::_exit(4) };
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert!(
                    matches!(status, nix::sys::wait::WaitStatus::Signaled(_, Signal::SIGBUS, _)),
                    "{status:?}"
                );
                let mut said = [0u8; 8];
                let flags = nix::sys::socket::MsgFlags::MSG_DONTWAIT;
                let n = nix::sys::socket::recv(server.as_raw_fd(), &mut said, flags).unwrap();
                assert_eq!(&said[..n], b"bus");
            }
        }
    }

    /// The diagnosis names /dev/shm, its size and room (or that it could not be read), and the fix.
    #[test]
    fn names_dev_shm_its_room_and_the_fix() {
        let why = diagnosis_with(Some((64 << 10, 0)));
        assert!(
            why.cause.contains("full /dev/shm")
                && why.cause.ends_with("here /dev/shm is 64 KiB, 0 bytes of it free now"),
            "{why}"
        );
        assert!(
            why.fix.contains("Docker --shm-size=1g") && why.fix.contains("medium: Memory, sizeLimit"),
            "{why}"
        );
        assert!(diagnosis_with(None).cause.ends_with("/dev/shm could not be read here (statvfs)"));
        assert_eq!(size_text(3 << 30), "3 GiB");
        assert_eq!(size_text(1536), "1 KiB");
    }
}
