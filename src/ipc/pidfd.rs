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

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use anyhow::Result;
use nix::errno::Errno;

use super::diagnose::Diagnosis;
use crate::placement::Place;

/// What else needs neither a shared PID namespace nor ptrace permission.
const SOCKET_FIX: &str = "or --fds socket, which needs neither";

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
    match getfd(me, probe) {
        Err((call, Errno::ENOSYS)) => Some(format!(
            "--fds pidfd: this kernel has no {call} (ENOSYS: pidfd_getfd needs Linux 5.6 or later); --fds \
             socket needs neither"
        )),
        _ => None,
    }
}

/// Descriptor `fd` of the exporter, whose pid as this process sees it is `pid` (0: not visible from here),
/// for the buffer of process `owner`.
pub fn fetch(pid: u32, fd: i32, owner: usize) -> Result<OwnedFd> {
    let what = format!("fetching descriptor {fd} of process {owner}'s buffer from pid {pid} (pidfd_getfd)");
    if pid == 0 {
        let seen = "the exporter's pid is 0 as this process sees it (SO_PEERCRED), where pidfd_open can only \
                    answer ESRCH";
        return Err(anyhow::Error::new(not_visible(seen)).context(what));
    }
    let failed = match getfd(pid as i32, fd) {
        Ok(fetched) => return Ok(fetched),
        Err(failed) => failed,
    };
    let (call, errno) = failed;
    let said = format!("{call}: {} ({errno:?})", errno.desc());
    let error = match errno {
        Errno::ESRCH => anyhow::Error::new(not_visible(&format!("{said}: pid {pid} is no process here"))),
        Errno::EPERM => anyhow::Error::new(refused(&said, pid, &Place::here())),
        Errno::ENOSYS => anyhow::Error::new(Diagnosis::new(
            format!("{said}: this kernel lacks the call (pidfd_getfd needs Linux 5.6 or later)"),
            "; what fixes it: ",
            "a newer kernel, or --fds socket, which needs no such call".into(),
        )),
        _ => anyhow::anyhow!("{said}"),
    };
    Err(error.context(what))
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

/// Ptrace refused: which of the kernel's conditions this process fails, read from /proc.
fn refused(said: &str, pid: u32, here: &Place) -> Diagnosis {
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
    let ptrace = here.capabilities.sys_ptrace;
    if !ptrace {
        let their_uid = field("Uid").and_then(|u| u.split_whitespace().next().map(str::to_owned));
        if let Some(uid) = their_uid.filter(|u| *u != here.uid.to_string()) {
            why.push(format!("the exporter is uid {uid}, this process uid {}", here.uid));
        }
        if let (Some(theirs), Some(mine)) = (hex(field("CapPrm")), hex(my_field("CapPrm")))
            && theirs & !mine != 0
        {
            why.push(format!(
                "the exporter holds capabilities this process lacks (CapPrm {theirs:#x} against {mine:#x})"
            ));
        }
        match here.ptrace_scope {
            Some(1) => {
                why.push("Yama's ptrace_scope is 1: a process may fetch only from its descendants".to_owned())
            }
            Some(2) => why.push("Yama's ptrace_scope is 2: only with CAP_SYS_PTRACE".to_owned()),
            _ => {}
        }
        if here.seccomp == Some(2) {
            why.push(
                "a seccomp filter is on this process (Docker's default profile allows pidfd_getfd only with \
                 CAP_SYS_PTRACE)"
                    .to_owned(),
            );
        }
        why.push("this process lacks CAP_SYS_PTRACE, which would override the rest".to_owned());
    }
    if here.ptrace_scope == Some(3) {
        why.push("Yama's ptrace_scope is 3: no process may, whatever its capabilities".to_owned());
    }
    if field("Uid").is_none() {
        why.push(format!("/proc/{pid}/status cannot be read here"));
    }
    Diagnosis::new(
        format!("{said}: ptrace permission refused: {}", why.join("; ")),
        "; what fixes it: ",
        format!(
            "give the importer CAP_SYS_PTRACE (Docker --cap-add SYS_PTRACE, Kubernetes \
             securityContext.capabilities.add: [SYS_PTRACE]), {SOCKET_FIX}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor of this process's own is fetched for real; a pid that is no process is ESRCH, named.
    #[test]
    fn a_descriptor_is_fetched_and_a_missing_pid_named() {
        let file = tempfile::tempfile().unwrap();
        let fetched = fetch(std::process::id(), file.as_raw_fd(), 0).unwrap();
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (file.metadata().unwrap(), std::fs::File::from(fetched).metadata().unwrap());
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "the same file");
        assert_eq!(unsupported(), None, "this kernel has the calls");
        let error = fetch(0, 3, 1).unwrap_err();
        let diagnosis = error.downcast_ref::<Diagnosis>().expect("a diagnosis");
        assert!(diagnosis.cause.contains("not visible from here"), "{diagnosis:?}");
        assert!(diagnosis.fix.contains("--pid=container:NAME") && diagnosis.fix.contains("--fds socket"));
        let far = format!("{:#}", fetch(i32::MAX as u32 - 1, 3, 1).unwrap_err());
        assert!(far.contains("ESRCH") && far.contains("shareProcessNamespace: true"), "{far}");
    }

    #[test]
    fn a_refusal_names_what_this_process_lacks() {
        let mut here = Place::here();
        here.capabilities.sys_ptrace = false;
        here.ptrace_scope = Some(1);
        here.seccomp = Some(2);
        let said =
            refused("pidfd_getfd: Operation not permitted (EPERM)", std::process::id(), &here).to_string();
        for words in [
            "ptrace_scope is 1",
            "seccomp filter",
            "lacks CAP_SYS_PTRACE",
            "--cap-add SYS_PTRACE",
            "capabilities.add: [SYS_PTRACE]",
            "--fds socket",
        ] {
            assert!(said.contains(words), "{words}: {said}");
        }
    }
}
