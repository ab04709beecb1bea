//! How a started process ended: a value, from `waitpid`'s answer for its pid alone.

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;

/// How a process ended, as `waitpid` said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    Exited(i32),
    Killed(Signal),
    /// Someone else reaped it (SIGCHLD ignored, a stray `waitpid(-1)`): its status is lost.
    Lost(Errno),
}

impl Ended {
    pub(super) fn of(status: nix::Result<WaitStatus>) -> Option<Self> {
        match status {
            Ok(WaitStatus::Exited(_, code)) => Some(Ended::Exited(code)),
            Ok(WaitStatus::Signaled(_, signal, _)) => Some(Ended::Killed(signal)),
            Ok(_) | Err(Errno::EINTR) => None,
            Err(e) => Some(Ended::Lost(e)),
        }
    }
}
