//! What a program started by exec inherits from the process that forked it: descriptors are opened
//! close-on-exec everywhere in this program, and this is the one place that lets one through. A leaf.

use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};

use anyhow::{Context, Result, ensure};
use nix::fcntl::{FcntlArg, FdFlag, fcntl};

/// Clears FD_CLOEXEC on `fd`, so that the program about to be exec'd gets it. Call it between fork and
/// exec only (it is async-signal-safe and allocates nothing).
fn keep_across_exec(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: between fork and exec, `fd` is one of the forking process's open descriptors, copied by fork;
    // clearing FD_CLOEXEC changes nothing else.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).map(drop).map_err(std::io::Error::from)
}

/// Lets through exec only the descriptors in `kept` (and the standard three): every other one is made
/// close-on-exec first, whoever opened it. A descriptor the invoker left open (a shell's, an IDE's, a job
/// server's pipe) then stays in this process, where it is harmless, and reaches none of the programs it
/// starts: none of them keeps the invoker's pipe open past the run, and none takes one for its own. Call it
/// between fork and exec only (async-signal-safe, allocates nothing).
pub fn only_these_across_exec(kept: &[RawFd]) -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC closes nothing: it sets a flag on open descriptors.
    if unsafe { nix::libc::close_range(3, u32::MAX, nix::libc::CLOSE_RANGE_CLOEXEC as i32) } != 0 {
        // Linux before 5.11: one descriptor at a time, up to the limit on their number.
        let mut limit = nix::libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the struct it is given.
        unsafe { nix::libc::getrlimit(nix::libc::RLIMIT_NOFILE, &mut limit) };
        let last = limit.rlim_cur.clamp(1024, 1 << 20) as RawFd;
        for fd in 3..last {
            // SAFETY: sets a flag on `fd` if it is open (EBADF, ignored, if it is not); closes nothing.
            unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC) };
        }
    }
    kept.iter().try_for_each(|&fd| keep_across_exec(fd))
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
