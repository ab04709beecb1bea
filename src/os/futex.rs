//! Sleeping on a 32-bit word in shared memory until another process changes it (Linux futexes). A leaf:
//! it knows nothing of the segment or the barrier that use it.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Wakes every process sleeping in [`wait`] on `word`, after the caller changed it.
pub fn wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only reads the address of a live, aligned 32-bit word; no memory is written.
    unsafe {
        nix::libc::syscall(nix::libc::SYS_futex, word.as_ptr(), nix::libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Sleeps while `word` still holds `expected`, for at most `timeout` (or until woken, or a signal).
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let timeout = nix::libc::timespec {
        tv_sec: timeout.as_secs() as nix::libc::time_t,
        tv_nsec: timeout.subsec_nanos() as nix::libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the live, aligned 32-bit word and the timespec, which outlive the call. The
    // word is in shared memory, so this is the non-private futex: other processes' wakes reach it.
    unsafe {
        nix::libc::syscall(
            nix::libc::SYS_futex,
            word.as_ptr(),
            nix::libc::FUTEX_WAIT,
            expected,
            &timeout as *const nix::libc::timespec,
        );
    }
}
