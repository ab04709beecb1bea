//! What outlives a killed parent: a small process the parent starts (this program again, with a hidden
//! role) that waits for the parent to be gone, however it went (even `kill -9`), and then removes the files
//! the CUDA driver made in `/dev/shm` for the interprocess events of the parent and of every child it was
//! told of (see `driver_files`), which the driver removes only when the exporter exits normally. The parent
//! tells it each child's pid over the pipe it watches, and ends it on its way out.
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
        // SAFETY: runs in the forked child before exec; keep_across_exec is async-signal-safe.
        unsafe {
            command.pre_exec(move || crate::inherit::keep_across_exec(fd));
        }
        let process = command.spawn().context("starting the guardian (/proc/self/exe)")?;
        drop(read);
        Ok(Self { watched: Some(write), process })
    }
}

impl Guardian {
    /// Has the guardian remove the driver's files of these processes too, should they outlive nothing.
    pub fn cover(&self, pids: impl IntoIterator<Item = u32>) -> Result<()> {
        let Some(pipe) = &self.watched else { return Ok(()) };
        let bytes: Vec<u8> = pids.into_iter().flat_map(u32::to_le_bytes).collect();
        let mut written = 0;
        while written < bytes.len() {
            match nix::unistd::write(pipe, &bytes[written..]) {
                Ok(n) => written += n,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(e).context("telling the guardian the children's pids"),
            }
        }
        Ok(())
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        self.watched.take();
        let _ = self.process.wait();
    }
}

/// The guardian's life: it reads the pids of the children from `fd` until end of file (every copy of the
/// write end is closed: the parent exited or was killed), then removes the event files of process `parent`
/// and of those children.
pub fn watch(parent: u32, fd: RawFd) -> Result<()> {
    // SAFETY: the descriptor was handed to this process for this use alone; reading does not close it.
    let read = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut received = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        match nix::unistd::read(read, &mut chunk) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&chunk[..n]),
            // EINTR: a stop signal for the whole process group, which the parent handles; wait on.
            Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    let children = received.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    for pid in std::iter::once(parent).chain(children) {
        let _ = driver_files::remove_event_files_of(pid);
    }
    Ok(())
}
