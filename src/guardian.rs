//! What outlives a killed parent: a small process the parent starts (this program again, with a hidden
//! role) that waits for the parent to be gone, however it went (even `kill -9`), and then removes the files
//! the CUDA driver made in `/dev/shm` for the parent's interprocess events (see `driver_files`), which the
//! driver removes only when the exporter exits normally. The parent ends it on its way out.
//!
//! It is started by exec, so it is safe whatever threads the parent has (a tool such as compute-sanitizer
//! injects some), and with an empty environment, so that no such tool follows it: it makes no CUDA call.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use nix::errno::Errno;

use crate::driver_files;

/// The parent's handle on its guardian: the write end of the pipe the guardian watches, and the process.
pub struct Guardian {
    watched: Option<OwnedFd>,
    process: Child,
}

impl Guardian {
    /// Starts the guardian of this process's driver files.
    pub fn start() -> Result<Self> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2 for the guardian")?;
        let fd = read.as_raw_fd();
        let mut command = Command::new("/proc/self/exe");
        command
            .args(["--guardian-for", &std::process::id().to_string(), "--guardian-fd", &fd.to_string()])
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: runs in the forked child before exec; fcntl is async-signal-safe and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
                nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
        let process = command.spawn().context("starting the guardian (/proc/self/exe)")?;
        drop(read);
        Ok(Self { watched: Some(write), process })
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        self.watched.take();
        let _ = self.process.wait();
    }
}

/// The guardian's life: it waits for end of file on `fd` (every copy of the write end is closed: the parent
/// exited or was killed), then removes the event files of process `parent`.
pub fn watch(parent: u32, fd: RawFd) -> Result<()> {
    let mut byte = [0u8; 1];
    // SAFETY: the descriptor was handed to this process for this use alone; reading does not close it.
    let read = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    // EINTR: a stop signal for the whole process group, which the parent handles; wait on.
    while let Err(Errno::EINTR) = nix::unistd::read(read, &mut byte) {}
    driver_files::remove_event_files_of(parent).map(drop)
}
