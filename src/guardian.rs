//! What outlives a killed parent: a small process forked at the parent's start that waits for the parent to
//! be gone, however it went (even `kill -9`), and then removes the files the CUDA driver made in `/dev/shm`
//! for the parent's interprocess events (see `driver_files`), which the driver removes only when the exporter
//! exits normally. The parent ends it on its way out.

use std::os::fd::OwnedFd;

use anyhow::{Context, Result, ensure};
use nix::errno::Errno;
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid, fork, pipe2};

use crate::driver_files;

/// The guardian of this process's driver files: the write end of a pipe it watches, and its pid.
pub struct Guardian {
    watched: Option<OwnedFd>,
    pid: Pid,
}

impl Guardian {
    /// Forks the guardian. Call it while this process has a single thread (before CUDA starts): the forked
    /// process runs Rust code, which is safe only if no other thread held a lock at the fork.
    pub fn start() -> Result<Self> {
        let threads = std::fs::read_dir("/proc/self/task").map(|t| t.count()).unwrap_or(0);
        ensure!(threads == 1, "the guardian must be forked while the parent has one thread, not {threads}");
        let parent = std::process::id();
        let (read, write) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2 for the guardian")?;
        // SAFETY: this process has a single thread (checked), so the forked copy may run any code.
        match unsafe { fork() }.context("forking the guardian")? {
            ForkResult::Child => {
                drop(write);
                watch(&read, parent);
                // SAFETY: leaves without running the parent's exit handlers or destructors twice.
                unsafe { nix::libc::_exit(0) }
            }
            ForkResult::Parent { child } => {
                drop(read);
                Ok(Self { watched: Some(write), pid: child })
            }
        }
    }
}

/// The guardian's life: it waits for end of file (every copy of the write end is closed: the parent exited
/// or was killed), then removes the parent's event files.
fn watch(read: &OwnedFd, parent: u32) {
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        // The guardian prints nothing and holds none of the parent's output pipes open.
        let _ = nix::unistd::dup2_stdin(&null);
        let _ = nix::unistd::dup2_stdout(&null);
        let _ = nix::unistd::dup2_stderr(&null);
    }
    let mut byte = [0u8; 1];
    // EINTR: a stop signal for the whole group, which the parent handles; wait on.
    while let Err(Errno::EINTR) = nix::unistd::read(read, &mut byte) {}
    let _ = driver_files::remove_event_files_of(parent);
}

impl Drop for Guardian {
    fn drop(&mut self) {
        self.watched.take();
        let _ = waitpid(self.pid, None);
    }
}
