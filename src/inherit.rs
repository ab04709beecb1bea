//! What a program started by exec inherits from the process that forked it: descriptors are opened
//! close-on-exec everywhere in this program, and this is the one place that lets one through. A leaf.

use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{Context, Result, ensure};
use nix::fcntl::{FcntlArg, FdFlag, fcntl};

/// Clears FD_CLOEXEC on `fd`, so that the program about to be exec'd gets it. Call it between fork and
/// exec only (it is async-signal-safe and allocates nothing).
pub fn keep_across_exec(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: between fork and exec, `fd` is one of the forking process's open descriptors, copied by fork;
    // clearing FD_CLOEXEC changes nothing else.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).map(drop).map_err(std::io::Error::from)
}

/// Takes ownership of descriptor `fd`, which the parent let this process inherit (`what` it is, for
/// messages), after checking that it is open, not a standard descriptor, and inherited: an inherited one is
/// not close-on-exec until it is taken, so one taken already (a number given twice on a command line typed
/// by hand), or one this process opened itself, is refused rather than owned twice and closed twice (which
/// Rust's IO safety answers with an abort). It is inherited no further.
pub fn take(fd: RawFd, what: &str) -> Result<OwnedFd> {
    ensure!(fd > 2, "descriptor {fd} is not the {what} (it is standard input, output or error)");
    // SAFETY: only asks whether the number is an open descriptor; nothing is owned or closed.
    let open = fcntl(unsafe { BorrowedFd::borrow_raw(fd) }, FcntlArg::F_GETFD);
    let flags = open.with_context(|| format!("fstat({what} descriptor {fd}): it is not open"))?;
    ensure!(
        !FdFlag::from_bits_truncate(flags).contains(FdFlag::FD_CLOEXEC),
        "descriptor {fd} is not the {what}: it is given twice, or was not inherited (it is close-on-exec)"
    );
    // SAFETY: the descriptor is open (checked) and was given to this process to own: the parent let it
    // through exec for this process alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    fcntl(&fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).context("fcntl(FD_CLOEXEC)")?;
    Ok(fd)
}
