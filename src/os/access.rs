//! What the kernel weighs before one process reaches into another (ptrace's access check, which
//! `pidfd_getfd` makes): this process's user, its capabilities, whether it has a user namespace of its own,
//! Yama's `ptrace_scope` and its seccomp mode, read from /proc. A leaf: `placement` reports these facts of
//! each process, and `ipc::pidfd` names which of them refused a descriptor.

/// This process's side of the ptrace access check, as /proc says it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Access {
    /// The effective uid.
    pub uid: u32,
    /// `CAP_SYS_PTRACE` (bit 19), which passes the uid and Yama checks in its own user namespace.
    pub sys_ptrace: bool,
    /// `CAP_SYS_NICE` (bit 23) and `CAP_IPC_LOCK` (bit 14), which the placement reports beside it.
    pub sys_nice: bool,
    pub ipc_lock: bool,
    /// In a user namespace whose uid map is not the node's own.
    pub in_user_namespace: bool,
    /// `/proc/sys/kernel/yama/ptrace_scope`, where Yama is there.
    pub ptrace_scope: Option<u8>,
    /// The `Seccomp` field of /proc/self/status: 0 none, 1 strict, 2 a filter.
    pub seccomp: Option<u8>,
}

impl Access {
    /// Read now.
    pub(crate) fn here() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| status_field(&status, name);
        let effective = field("CapEff").and_then(|hex| u64::from_str_radix(&hex, 16).ok()).unwrap_or(0);
        let has = |bit: u32| effective & (1u64 << bit) != 0;
        Self {
            uid: nix::unistd::geteuid().as_raw(),
            sys_ptrace: has(19),
            sys_nice: has(23),
            ipc_lock: has(14),
            in_user_namespace: read_trimmed("/proc/self/uid_map").is_some_and(|map| !is_identity_map(&map)),
            ptrace_scope: read_trimmed("/proc/sys/kernel/yama/ptrace_scope").and_then(|s| s.parse().ok()),
            seccomp: field("Seccomp").and_then(|s| s.parse().ok()),
        }
    }
}

/// The value of field `name` in a /proc/PID/status text.
pub(crate) fn status_field(status: &str, name: &str) -> Option<String> {
    status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Whether a uid map is the node's own: every uid to itself (`0 0 4294967295`).
pub(crate) fn is_identity_map(map: &str) -> bool {
    let fields: Vec<&str> = map.split_whitespace().collect();
    fields == ["0", "0", "4294967295"]
}

/// Whether this process is in a user namespace of its own in which it is root while its user outside is
/// not (`/proc/self/uid_map` maps 0 to another uid): what `enter` gives a user who is not root with any
/// isolation. Read, not remembered: the answer is the kernel's.
pub fn in_user_namespace_as_another_user() -> bool {
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let first: Vec<&str> = map.split_whitespace().take(3).collect();
    matches!(first.as_slice(), ["0", outer, _] if *outer != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_facts_are_this_processs() {
        let here = Access::here();
        assert_eq!(here.uid, nix::unistd::geteuid().as_raw());
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(here.seccomp, status_field(&status, "Seccomp").and_then(|s| s.parse().ok()));
    }

    #[test]
    fn only_the_identity_of_every_uid_is_the_nodes_own_user_namespace() {
        assert!(is_identity_map("         0          0 4294967295\n"));
        assert!(!is_identity_map("0 1000 1"));
        assert!(!is_identity_map("0 0 65536"));
    }
}
