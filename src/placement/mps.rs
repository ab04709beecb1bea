//! Whether a process is an MPS client, and of which daemon: CUDA's client looks for the control daemon in
//! its pipe directory (`CUDA_MPS_PIPE_DIRECTORY`, else `/tmp/nvidia-mps`); where a daemon's `control` socket
//! there accepts a connection, its CUDA contexts are the daemon's clients. A pipe directory without a daemon
//! (no socket, or one nothing listens on) runs without MPS, and says nothing of it: this says which.
//!
//! The check is a non-blocking `connect` of each kind of socket (the daemon's is `SOCK_SEQPACKET`, seen on
//! the H200 host with driver 580), closed at once: it never waits, and a daemon whose backlog is full
//! (`EAGAIN`) is a daemon. A socket that answers is not taken on its word: the process that listens (its
//! credentials, `SO_PEERCRED`) must be NVIDIA's control daemon, `nvidia-cuda-mps-control` by its
//! executable (or, where that cannot be read, its name). Measured on the H200 host: CUDA runs without MPS,
//! silently, beside a `control` socket of another program, so such a socket makes no client here either.
//! A daemon whose process this PID namespace cannot see (pid 0) is taken as one, and said so.

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, UnixAddr, connect, getsockopt, socket, sockopt::PeerCredentials,
};
use nix::sys::stat::SFlag;
use serde::{Deserialize, Serialize};

use super::root::{Found, Root};

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
    /// What answered at the `control` socket where it was not NVIDIA's daemon, or a daemon this PID
    /// namespace cannot see: in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered: Option<String>,
}

impl Mps {
    /// This process's, read now.
    pub fn here() -> Self {
        let from_env = std::env::var_os(PIPE_DIRECTORY_ENV);
        let from_env = from_env.as_deref().map(|d| d.to_string_lossy());
        Self::of(from_env.as_deref(), Root::here().ok().as_ref(), nix::unistd::geteuid().as_raw())
    }

    /// The MPS of a process whose `CUDA_MPS_PIPE_DIRECTORY` is `from_env` (`None`: unset), whose root is
    /// `root` (another process's: its pipe directory is a path in its own mounts, resolved as it resolves
    /// it), and whose user is `user` (as this process's user namespace sees it: a daemon serves its own
    /// user's clients); no root to look in, no daemon.
    pub fn of(from_env: Option<&str>, root: Option<&Root>, user: u32) -> Self {
        let from_env = from_env.filter(|d| !d.is_empty());
        let pipe_directory =
            from_env.map_or_else(|| DEFAULT_PIPE_DIRECTORY.to_owned(), |d| d.escape_debug().to_string());
        let control = format!("{}/control", from_env.unwrap_or(DEFAULT_PIPE_DIRECTORY));
        let control = root.and_then(|root| root.find(&control, false).ok());
        let (client, answered) =
            match control.map_or(Answer::Nothing, |control| control_answer(&control, user)) {
                Answer::Nothing => (false, None),
                Answer::Daemon => (true, None),
                Answer::Unseen => (true, Some("a process this PID namespace cannot see".to_owned())),
                Answer::Other(what) => (false, Some(format!("{what}, not NVIDIA's control daemon"))),
                Answer::AnotherUser(what) => (false, Some(what)),
            };
        Self { pipe_directory, from_env: from_env.is_some(), client, answered }
    }

    /// In words, for the verdict line and `--bench`: `under MPS (the daemon of /tmp/nvidia-mps)`, or `None`.
    /// Only where the driver says so (`driver_says`: `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` of the run's devices):
    /// a socket in a directory another user can make (`/tmp/nvidia-mps`) may only explain whose daemon.
    pub fn under(&self, driver_says: bool) -> Option<String> {
        let unseen = self.answered.as_ref().map(|what| format!(", {what}")).unwrap_or_default();
        match (driver_says, self.client) {
            (false, _) => None,
            (true, true) => Some(format!("under MPS (the daemon of {}{unseen})", self.pipe_directory)),
            (true, false) => Some(format!("under MPS (no daemon answered at {})", self.pipe_directory)),
        }
    }

    /// What to say where the socket looked like a daemon's but the driver says there is no MPS.
    pub fn not_confirmed(&self, driver_says: bool) -> Option<String> {
        (!driver_says && self.client).then(|| {
            format!(
                "MPS: a control socket in {} answers as NVIDIA's daemon would, but the driver says this run's \
                 contexts are no MPS clients (CU_DEVICE_ATTRIBUTE_MPS_ENABLED is 0): no MPS",
                self.pipe_directory.escape_debug()
            )
        })
    }
}

/// What answered at a `control` socket.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// No socket, or nothing listens on it.
    Nothing,
    /// NVIDIA's control daemon (or one whose backlog is full, which answers no credentials).
    Daemon,
    /// A listener whose process this PID namespace cannot see.
    Unseen,
    /// Another program: its name and pid.
    Other(String),
    /// A listener of another user (not this one, not root), whose clients this user's processes are not: in
    /// words.
    AnotherUser(String),
}

/// The executable NVIDIA's control daemon runs.
const DAEMON: &str = "nvidia-cuda-mps-control";

/// What answers at the socket `control` (found in a root, not followed) for a process of user `user`,
/// without waiting.
fn control_answer(control: &Found, user: u32) -> Answer {
    if control.kind().ok() != Some(SFlag::S_IFSOCK) {
        return Answer::Nothing;
    }
    // The socket itself, by the path the kernel follows to it: as short as a path to a socket must be.
    let Ok(address) = UnixAddr::new(&control.path()) else { return Answer::Nothing };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    // Whichever kind of socket the daemon listens on: a connect of another kind is EPROTOTYPE.
    for kind in [SockType::Stream, SockType::SeqPacket, SockType::Datagram] {
        let Ok(probe) = socket(AddressFamily::Unix, kind, flags, None) else { continue };
        // The socket closes when `probe` is dropped.
        match connect(std::os::fd::AsRawFd::as_raw_fd(&probe), &address) {
            Ok(()) => {}
            Err(Errno::EAGAIN) => return Answer::Daemon,
            Err(_) => continue,
        }
        let Ok(peer) = getsockopt(&probe, PeerCredentials) else { return Answer::Unseen };
        // A daemon serves its own user's clients (root's serves every user's): another user's listener in a
        // directory anyone can make (/tmp/nvidia-mps) makes no client of the process, whatever it runs.
        if peer.uid() != user && peer.uid() != 0 {
            let pid = peer.pid();
            return Answer::AnotherUser(format!(
                "a listener of another user (uid {}, pid {pid}), whose daemon would not serve this user",
                peer.uid()
            ));
        }
        return match peer.pid() {
            0 => Answer::Unseen,
            pid => match program_of(pid) {
                Some(name) if name == DAEMON || (name.len() == 15 && DAEMON.starts_with(&name)) => {
                    Answer::Daemon
                }
                // Another user's file name reaches this user's terminal: escaped.
                Some(name) => Answer::Other(format!("{} (pid {pid})", name.escape_debug())),
                None => Answer::Other(format!("pid {pid}, which has gone")),
            },
        };
    }
    Answer::Nothing
}

/// The program process `pid` runs: its executable's name, or, where that cannot be read (another user's
/// process), its name as the kernel keeps it (15 bytes at most).
fn program_of(pid: i32) -> Option<String> {
    if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        let name = exe.file_name()?.to_string_lossy().into_owned();
        return Some(name.strip_suffix(" (deleted)").map(str::to_owned).unwrap_or(name));
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end().to_owned())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// NVIDIA's control daemon as far as this check can tell: a copy of python3 named
    /// `nvidia-cuda-mps-control` that listens on a `SOCK_SEQPACKET` socket `control` in `dir` (as the
    /// daemon does on the H200 host) until it is killed. Needs python3.
    pub(crate) fn stand_in_daemon(dir: &std::path::Path) -> std::process::Child {
        stand_in_daemon_of(dir, None)
    }

    /// [`stand_in_daemon`], run as user `uid` where given (root only).
    fn stand_in_daemon_of(dir: &std::path::Path, uid: Option<u32>) -> std::process::Child {
        use std::os::unix::process::CommandExt as _;
        let python = std::process::Command::new("python3")
            .args(["-c", "import os, sys; print(os.path.realpath(sys.executable))"])
            .output()
            .expect("python3, for a stand-in of NVIDIA's daemon");
        let copy = dir.join(DAEMON);
        std::fs::copy(String::from_utf8_lossy(&python.stdout).trim(), &copy).unwrap();
        let script = "import socket, sys, time\n\
                      s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
                      s.bind(sys.argv[1]); s.listen(64); print('ready', flush=True)\n\
                      while True: time.sleep(1)\n";
        let mut command = std::process::Command::new(&copy);
        command.args(["-c", script]).arg(dir.join("control")).stdout(std::process::Stdio::piped());
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        // A process another test forked while the copy was written holds it open for writing until it
        // execs (ETXTBSY): tried again.
        let mut child = (0..100)
            .find_map(|_| match command.spawn() {
                Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    None
                }
                spawned => Some(spawned.unwrap()),
            })
            .expect("the stand-in daemon starts");
        let mut ready = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut ready)
            .unwrap();
        assert_eq!(ready.trim(), "ready");
        child
    }

    /// A daemon is a `control` socket that accepts, where NVIDIA's daemon listens; a socket nothing listens
    /// on, or a file, is none, and another program's socket (here this test's own) is named, not trusted.
    /// What answers at `path`.
    fn control_answer_at(path: &std::path::Path) -> Answer {
        let found = Root::here().unwrap().find(&path.to_string_lossy(), false);
        found.map_or(Answer::Nothing, |control| control_answer(&control, nix::unistd::geteuid().as_raw()))
    }

    #[test]
    fn a_daemon_is_nvidias_control_socket_that_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("control");
        assert_eq!(control_answer_at(&control), Answer::Nothing, "nothing there");
        std::fs::write(&control, b"").unwrap();
        assert_eq!(control_answer_at(&control), Answer::Nothing, "a file");
        std::fs::remove_file(&control).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(&control).unwrap();
        let me = program_of(std::process::id() as i32).unwrap();
        let impostor = Answer::Other(format!("{me} (pid {})", std::process::id()));
        assert_eq!(control_answer_at(&control), impostor, "another program's socket");
        drop(listener);
        // A process that another test forks holds a copy of the listener until it execs: its end is awaited.
        let gone = (0..200).any(|_| {
            let nothing = control_answer_at(&control) == Answer::Nothing;
            if !nothing {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            nothing
        });
        assert!(gone, "a socket left by a daemon that is gone: {:?}", control_answer_at(&control));
        std::fs::remove_file(&control).unwrap();
        let mut daemon = stand_in_daemon(dir.path());
        assert_eq!(control_answer_at(&control), Answer::Daemon, "NVIDIA's, on a SOCK_SEQPACKET socket");
        let _ = daemon.kill();
        let _ = daemon.wait();
        let mps =
            Mps { answered: Some("python3 (pid 9), not NVIDIA's control daemon".into()), ..here_at(&dir) };
        assert_eq!(
            mps.under(true),
            Some(format!("under MPS (no daemon answered at {})", mps.pipe_directory))
        );
        assert_eq!(mps.under(false), None, "no client of another program");
    }

    /// A daemon serves its own user's clients (and root's every user's): the user that counts is the
    /// process's, given (read from outside, `--between`, it is not this process's). A daemon of `nobody`
    /// makes a client of a process of `nobody`, which root, reading it from outside, once took for a
    /// process of its own (root) and said no daemon of that user would serve.
    #[test]
    fn a_daemon_serves_the_processes_of_its_own_user() {
        use std::os::unix::fs::PermissionsExt as _;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED a_daemon_serves_the_processes_of_its_own_user: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut daemon = stand_in_daemon_of(dir.path(), Some(65534));
        let root = Root::here().unwrap();
        let directory = dir.path().to_string_lossy().into_owned();
        let (nobodys, others) =
            (Mps::of(Some(&directory), Some(&root), 65534), Mps::of(Some(&directory), Some(&root), 1000));
        let _ = daemon.kill();
        let _ = daemon.wait();
        assert!(nobodys.client && nobodys.answered.is_none(), "{nobodys:?}");
        assert!(!others.client, "{others:?}");
        assert!(others.answered.is_some_and(|a| a.starts_with("a listener of another user (uid 65534")));
    }

    /// `Mps::here` for the pipe directory `dir`.
    fn here_at(dir: &tempfile::TempDir) -> Mps {
        Mps {
            pipe_directory: dir.path().display().to_string(),
            from_env: true,
            client: false,
            answered: None,
        }
    }
}
