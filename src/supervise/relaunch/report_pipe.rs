//! The pipe a started process writes its result to (its `--report-fd`), read without blocking as it comes:
//! a long result must not fill the pipe and hold the process.

use std::os::fd::OwnedFd;

use anyhow::{Context, Result};
use nix::errno::Errno;

/// The reading end of the pipe a process writes its result to, read without blocking.
pub(super) struct Report {
    /// `None` once at its end.
    pub(super) fd: Option<OwnedFd>,
    pub(super) got: Vec<u8>,
}

impl Report {
    /// Reads all that the pipe holds now.
    pub(super) fn read(&mut self) -> Result<()> {
        let Some(fd) = &self.fd else { return Ok(()) };
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match nix::unistd::read(fd, &mut chunk) {
                Ok(0) => {
                    self.fd = None;
                    return Ok(());
                }
                Ok(n) => self.got.extend_from_slice(&chunk[..n]),
                Err(Errno::EAGAIN) => return Ok(()),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e).context("reading the result of a process of this program"),
            }
        }
    }
}
