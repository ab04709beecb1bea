//! Descriptors fetched from their exporter with `pidfd_open` and `pidfd_getfd` (`--fds pidfd`), as
//! PyTorch's expandable segments and UCX's cuda_ipc do, instead of passed over a socket. The exporter
//! publishes each descriptor's number in the segment; the importer fetches it from the exporter's pid as
//! the importer sees it (a child: its parent's; a joiner: the server's, as its connection's peer
//! credentials say, 0 where the server is outside the joiner's PID namespace). That needs what the socket
//! does not, and each failure says which and the least change:
//! - `ESRCH`: the pid is not visible from here (another PID namespace);
//! - `EPERM`: ptrace refused (`PTRACE_MODE_ATTACH_REALCREDS`): another uid, capabilities the exporter holds
//!   that this process lacks, Yama's `ptrace_scope`, or a seccomp filter (Docker's default profile allows
//!   the call only with `CAP_SYS_PTRACE`) without `CAP_SYS_PTRACE`;
//! - `ENOSYS`: a kernel before 5.6; the parent asks by trial first and waives.
//!
//! Each refusal is typed ([`KernelRefused`], with [`PidfdRefusal`] and its [`Obstacle`]s), under the
//! [`Diagnosis`] that words it, so that `Refused::of` carries it across the wire into the server's verdict
//! and document, and the container matrix counts it as refused by its type.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use anyhow::Result;
use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use super::diagnose::Diagnosis;
use crate::os::access::Access;

/// What else needs neither a shared PID namespace nor ptrace permission.
const SOCKET_FIX: &str = "or --fds socket, which needs neither";

/// Why the kernel refused to hand over a descriptor (`--fds pidfd`), as facts: what a [`Refused`] of the
/// kernel's carries (its `error` is the errno), across the wire and into the `--json` document.
///
/// [`Refused`]: super::refused::Refused
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "why")]
pub enum PidfdRefusal {
    /// `ESRCH`: the exporter's pid is not visible from here (another PID namespace); `pid` is the number
    /// this process has for it (0: none, as `SO_PEERCRED` says of a peer outside its PID namespace).
    NotVisible { pid: u32 },
    /// `EPERM`: ptrace permission refused, for each of these.
    Ptrace { obstacles: Vec<Obstacle> },
    /// `ENOSYS`: this kernel lacks the call (`pidfd_getfd` is Linux 5.6).
    NoSuchCall,
}

/// One of ptrace's conditions (`PTRACE_MODE_ATTACH_REALCREDS`) that the importer fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "obstacle")]
pub enum Obstacle {
    /// Another uid (and no `CAP_SYS_PTRACE`).
    OtherUid { exporter: u32, importer: u32 },
    /// The exporter holds capabilities this process lacks (`CapPrm`).
    MoreCapabilities { exporter: u64, importer: u64 },
    /// Yama's `ptrace_scope` (1: descendants only; 2: `CAP_SYS_PTRACE` only; 3: nobody).
    YamaScope { scope: u8 },
    /// A seccomp filter: Docker's default profile allows `pidfd_getfd` only with `CAP_SYS_PTRACE`.
    Seccomp,
    /// This process lacks `CAP_SYS_PTRACE`, which would override uid, capabilities and scope 1.
    NoCapSysPtrace,
    /// This process's capabilities are those of a user namespace of its own, not the exporter's.
    OwnUserNamespace,
    /// The exporter's `/proc/<pid>/status` cannot be read here.
    ExporterUnreadable,
}

impl std::fmt::Display for Obstacle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OtherUid { exporter, importer } => {
                write!(f, "the exporter is uid {exporter}, this process uid {importer}")
            }
            Self::MoreCapabilities { exporter, importer } => write!(
                f,
                "the exporter holds capabilities this process lacks (CapPrm {exporter:#x} against {importer:#x})"
            ),
            Self::YamaScope { scope: 1 } => {
                f.write_str("Yama's ptrace_scope is 1: a process may fetch only from its descendants")
            }
            Self::YamaScope { scope: 2 } => f.write_str("Yama's ptrace_scope is 2: only with CAP_SYS_PTRACE"),
            Self::YamaScope { scope } => {
                write!(f, "Yama's ptrace_scope is {scope}: no process may, whatever its capabilities")
            }
            Self::Seccomp => f.write_str(
                "a seccomp filter is on this process (Docker's default profile allows pidfd_getfd only with \
                 CAP_SYS_PTRACE)",
            ),
            Self::NoCapSysPtrace => f.write_str("this process lacks CAP_SYS_PTRACE, which would override the rest"),
            Self::OwnUserNamespace => f.write_str(
                "this process's capabilities (CAP_SYS_PTRACE among them) are those of a user namespace of its \
                 own, which the exporter's is not",
            ),
            Self::ExporterUnreadable => f.write_str("the exporter's /proc/<pid>/status cannot be read here"),
        }
    }
}

/// The kernel's refusal of a fetch, typed: the call, its errno and why. It is a context of the failure
/// (under it, the [`Diagnosis`] with the fix), so that `Refused::of` finds it whatever wraps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRefused {
    pub call: &'static str,
    pub errno: Errno,
    pub why: PidfdRefusal,
}

impl std::fmt::Display for KernelRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({:?})", self.call, self.errno.desc(), self.errno)
    }
}

/// Whether the simulation was told that this kernel lacks `pidfd_getfd` (`no-pidfd`).
fn simulated_without_the_call() -> bool {
    crate::driver::host::kernel_lacks_pidfd_getfd()
}

/// `pidfd_open(pid)`, then `pidfd_getfd` of its descriptor `fd`: a duplicate of it here (close-on-exec), or
/// which call failed and its errno.
fn getfd(pid: i32, fd: RawFd) -> std::result::Result<OwnedFd, (&'static str, Errno)> {
    // SAFETY: two system calls on plain integers that write no memory of ours; each descriptor they return
    // is new and this process's alone, owned at once so that it is closed on every path.
    unsafe {
        let pidfd = nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return Err(("pidfd_open", Errno::last()));
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        // A kernel of 5.3 to 5.5 has pidfd_open, not pidfd_getfd: what the simulation's `no-pidfd` is.
        if simulated_without_the_call() {
            return Err(("pidfd_getfd", Errno::ENOSYS));
        }
        let got = nix::libc::syscall(nix::libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if got < 0 {
            return Err(("pidfd_getfd", Errno::last()));
        }
        Ok(OwnedFd::from_raw_fd(got as RawFd))
    }
}

/// Why this kernel cannot fetch descriptors by pidfd, asked by fetching one of this process's own (which
/// ptrace always permits); `None` if it can.
pub fn unsupported() -> Option<String> {
    let me = std::process::id() as i32;
    let probe = std::io::stdin().as_raw_fd();
    let simulated = if simulated_without_the_call() { " (simulated: no-pidfd)" } else { "" };
    match getfd(me, probe) {
        Err((call, Errno::ENOSYS)) => Some(format!(
            "--fds pidfd: this kernel has no {call}{simulated} (ENOSYS: pidfd_getfd needs Linux 5.6 or later); \
             --fds socket needs no such call"
        )),
        _ => None,
    }
}

/// `pidfd_getfd` of one of this process's own descriptors: `allowed`, or the errno's name (`EPERM`: a
/// seccomp filter, as Docker's default profile without CAP_SYS_PTRACE; `ENOSYS`: a kernel before 5.6).
/// Ptrace always allows a process itself, so this tries what a filter would refuse, not infers it.
pub fn tried_on_itself() -> String {
    match getfd(std::process::id() as i32, std::io::stdin().as_raw_fd()) {
        Ok(_fetched) => "allowed".to_owned(),
        Err((_, errno)) => format!("{errno:?}"),
    }
}

/// Descriptor `fd` of the exporter, whose pid as this process sees it is `pid` (0: not visible from here),
/// for the buffer of process `owner`. A refusal is a [`KernelRefused`] over its [`Diagnosis`].
pub fn fetch(pid: u32, fd: i32, owner: usize) -> Result<OwnedFd> {
    let what = format!("fetching descriptor {fd} of process {owner}'s buffer from pid {pid} (pidfd_getfd)");
    if pid == 0 {
        let seen = "not asked: the exporter's pid is 0 as this process sees it (SO_PEERCRED), for which \
                    pidfd_open can only answer ESRCH";
        let refused =
            KernelRefused { call: "pidfd_open", errno: Errno::ESRCH, why: PidfdRefusal::NotVisible { pid } };
        return Err(anyhow::Error::new(not_visible(seen)).context(refused).context(what));
    }
    let (call, errno) = match getfd(pid as i32, fd) {
        Ok(fetched) => return Ok(fetched),
        Err(failed) => failed,
    };
    let (why, diagnosis) = match errno {
        Errno::ESRCH => {
            (PidfdRefusal::NotVisible { pid }, not_visible(&format!("pid {pid} is no process here")))
        }
        Errno::EPERM => {
            let obstacles = obstacles(pid, &Access::here());
            let diagnosis = ptrace_refused(&obstacles);
            (PidfdRefusal::Ptrace { obstacles }, diagnosis)
        }
        Errno::ENOSYS => (
            PidfdRefusal::NoSuchCall,
            Diagnosis::new(
                "this kernel lacks the call (pidfd_getfd needs Linux 5.6 or later)".into(),
                "; what fixes it: ",
                "a newer kernel, or --fds socket, which needs no such call".into(),
            ),
        ),
        _ => return Err(anyhow::anyhow!("{call}: {} ({errno:?})", errno.desc()).context(what)),
    };
    Err(anyhow::Error::new(diagnosis).context(KernelRefused { call, errno, why }).context(what))
}

/// The exporter's pid as this process sees it, for a joiner whose connection's peer has pid `peer` here (0:
/// outside this PID namespace) and whose exporter says it is `published` in its own namespace. In a served
/// run the two are one process. In a served sequence the peer is the sequence's top parent and the exporter
/// a run it started: found below the peer, as a process whose pid is `published` both here and in its own
/// namespace (one namespace with this process), never taken on its word alone, so that no other process's
/// descriptor of that number is fetched.
pub fn exporter_seen_from(peer: u32, published: u32) -> Result<u32> {
    if peer == 0 || peer == published {
        return Ok(peer);
    }
    let status = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
    let field = |text: &str, name: &str| {
        text.lines().find_map(|l| Some(l.strip_prefix(name)?.strip_prefix(':')?.trim().to_owned()))
    };
    let own_pid_is_published = status(published)
        .and_then(|text| field(&text, "NSpid"))
        .is_some_and(|nspid| nspid.split_whitespace().collect::<Vec<_>>() == [published.to_string()]);
    let mut at = published;
    // Up from the candidate, at most a few generations (the sequence's runs are its children).
    for _ in 0..8 {
        let parent = status(at).and_then(|text| field(&text, "PPid")?.parse::<u32>().ok()).unwrap_or(0);
        if parent == peer && own_pid_is_published {
            return Ok(published);
        }
        if parent <= 1 {
            break;
        }
        at = parent;
    }
    anyhow::bail!(
        "the exporter is pid {published} in its own PID namespace, which is no process below the server's \
         (pid {peer} as this process sees it) here: its pid cannot be told from here, so no descriptor is \
         fetched by pidfd_getfd; --fds socket needs no pid"
    )
}

/// The exporter's pid is not visible from this process.
fn not_visible(seen: &str) -> Diagnosis {
    Diagnosis::new(
        format!(
            "{seen}: the exporter's pid is not visible from here: it is in another PID namespace, which \
             pidfd_open cannot reach"
        ),
        "; what fixes it: ",
        format!(
            "one PID namespace for both (Docker --pid=container:NAME, Kubernetes shareProcessNamespace: \
             true), {SOCKET_FIX}"
        ),
    )
}

/// Which of the kernel's ptrace conditions this process (`here`) fails towards the exporter `pid`, read
/// from /proc.
fn obstacles(pid: u32, here: &Access) -> Vec<Obstacle> {
    let theirs = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        theirs.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
    };
    let mine = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let my_field = |name: &str| {
        mine.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
    };
    let hex = |v: Option<String>| v.and_then(|h| u64::from_str_radix(&h, 16).ok());
    let mut why = Vec::new();
    if !here.sys_ptrace {
        let their_uid = field("Uid").and_then(|u| u.split_whitespace().next()?.parse::<u32>().ok());
        if let Some(uid) = their_uid.filter(|u| *u != here.uid) {
            why.push(Obstacle::OtherUid { exporter: uid, importer: here.uid });
        }
        if let (Some(exporter), Some(importer)) = (hex(field("CapPrm")), hex(my_field("CapPrm")))
            && exporter & !importer != 0
        {
            why.push(Obstacle::MoreCapabilities { exporter, importer });
        }
        if let Some(scope @ (1 | 2)) = here.ptrace_scope {
            why.push(Obstacle::YamaScope { scope });
        }
        if here.seccomp == Some(2) {
            why.push(Obstacle::Seccomp);
        }
        why.push(Obstacle::NoCapSysPtrace);
    } else if here.in_user_namespace {
        why.push(Obstacle::OwnUserNamespace);
    }
    if here.ptrace_scope == Some(3) {
        why.push(Obstacle::YamaScope { scope: 3 });
    }
    if field("Uid").is_none() {
        why.push(Obstacle::ExporterUnreadable);
    }
    why
}

/// Ptrace refused, for `obstacles`, with the least change.
fn ptrace_refused(obstacles: &[Obstacle]) -> Diagnosis {
    let said: Vec<String> = obstacles.iter().map(Obstacle::to_string).collect();
    // A capability of its own user namespace does not reach the exporter's: one namespace is the change.
    let fix = if obstacles.contains(&Obstacle::OwnUserNamespace) {
        format!(
            "one user namespace for both, the importer with CAP_SYS_PTRACE in it (Docker --userns=host \
             --cap-add SYS_PTRACE, Kubernetes hostUsers: true and securityContext.capabilities.add: \
             [SYS_PTRACE]), {SOCKET_FIX}"
        )
    } else {
        format!(
            "give the importer CAP_SYS_PTRACE (Docker --cap-add SYS_PTRACE, Kubernetes \
             securityContext.capabilities.add: [SYS_PTRACE]), {SOCKET_FIX}"
        )
    };
    Diagnosis::new(format!("ptrace permission refused: {}", said.join("; ")), "; what fixes it: ", fix)
}

#[cfg(test)]
mod tests;
