//! Whether a process is an MPS client, and of which daemon: CUDA's client looks for the control daemon in
//! its pipe directory (`CUDA_MPS_PIPE_DIRECTORY`, else `/tmp/nvidia-mps`); where a daemon's `control` socket
//! there accepts a connection, its CUDA contexts are the daemon's clients. A pipe directory without a daemon
//! (no socket, or one nothing listens on) runs without MPS, and says nothing of it: this says which.
//!
//! The check is a non-blocking `connect` of each kind of socket (the daemon's is `SOCK_SEQPACKET`, seen on
//! the H200 host with driver 580), closed at once: it never waits, and a daemon whose backlog is full
//! (`EAGAIN`) is a daemon.

use std::os::unix::fs::FileTypeExt;

use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
use serde::{Deserialize, Serialize};

/// The variable that names the pipe directory.
pub const PIPE_DIRECTORY_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// The pipe directory where the variable is unset.
pub const DEFAULT_PIPE_DIRECTORY: &str = "/tmp/nvidia-mps";

/// A process's MPS: the daemon it would be a client of, and whether it is there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mps {
    /// The pipe directory its CUDA looks in.
    pub pipe_directory: String,
    /// Whether `CUDA_MPS_PIPE_DIRECTORY` chose it (else it is the default).
    pub from_env: bool,
    /// A daemon's `control` socket there accepts a connection: it is an MPS client.
    pub client: bool,
}

impl Mps {
    /// This process's, read now.
    pub fn here() -> Self {
        let from_env = std::env::var_os(PIPE_DIRECTORY_ENV).filter(|d| !d.is_empty());
        let pipe_directory = from_env
            .as_ref()
            .map_or_else(|| DEFAULT_PIPE_DIRECTORY.to_owned(), |d| d.to_string_lossy().into_owned());
        let client = control_accepts(&std::path::Path::new(&pipe_directory).join("control"));
        Self { pipe_directory, from_env: from_env.is_some(), client }
    }

    /// In words, for the verdict line and `--bench`: `under MPS (the daemon of /tmp/nvidia-mps)`, or `None`.
    pub fn under(&self) -> Option<String> {
        self.client.then(|| format!("under MPS (the daemon of {})", self.pipe_directory))
    }
}

/// Whether the socket at `path` accepts a connection, without waiting.
fn control_accepts(path: &std::path::Path) -> bool {
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        return false;
    }
    let Ok(address) = UnixAddr::new(path) else { return false };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    // Whichever kind of socket the daemon listens on: a connect of another kind is EPROTOTYPE.
    [SockType::Stream, SockType::SeqPacket, SockType::Datagram].into_iter().any(|kind| {
        let Ok(probe) = socket(AddressFamily::Unix, kind, flags, None) else { return false };
        // The socket closes when `probe` is dropped.
        matches!(connect(std::os::fd::AsRawFd::as_raw_fd(&probe), &address), Ok(()) | Err(Errno::EAGAIN))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon is a `control` socket that accepts; a socket nothing listens on, or a file, is none.
    #[test]
    fn a_daemon_is_a_control_socket_that_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("control");
        assert!(!control_accepts(&control), "nothing there");
        std::fs::write(&control, b"").unwrap();
        assert!(!control_accepts(&control), "a file");
        std::fs::remove_file(&control).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(&control).unwrap();
        assert!(control_accepts(&control), "a listening socket");
        drop(listener);
        assert!(!control_accepts(&control), "a socket left by a daemon that is gone");
        // NVIDIA's daemon (driver 580, the H200 host) listens on a SOCK_SEQPACKET socket.
        std::fs::remove_file(&control).unwrap();
        let daemon = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).unwrap();
        nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&daemon), &UnixAddr::new(&control).unwrap())
            .unwrap();
        nix::sys::socket::listen(&daemon, nix::sys::socket::Backlog::new(4).unwrap()).unwrap();
        assert!(control_accepts(&control), "a daemon's SOCK_SEQPACKET control socket");
    }
}
