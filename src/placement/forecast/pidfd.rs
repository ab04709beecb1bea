//! The kernel's rule for `pidfd_open` and `pidfd_getfd` between two processes (`--fds pidfd`, PyTorch's
//! expandable segments, UCX's POSIX descriptors): PID namespaces, ptrace's access check, Yama, seccomp.

use super::super::Place;
use super::super::share::{Fact, Sameness};
use super::{Fix, IMPORTER_IS_ANCESTOR, fact, same_pid_number_fix};

/// Why the kernel would refuse the importer `pidfd_getfd` of the exporter's descriptor (`--fds pidfd`,
/// PyTorch's expandable segments, UCX's POSIX descriptors): the errno, why, and the least change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::placement) struct PidfdRefused {
    pub errno: &'static str,
    pub why: &'static str,
    pub fix: Fix,
    /// Whether the refusal is not known, only possible (a seccomp filter read from outside).
    pub not_known: bool,
}

/// `pidfd_getfd_itself` of a process read from outside under a seccomp filter: whether the filter allows
/// `pidfd_getfd` is not known (its rules are readable only by a tracer that stops the process).
pub const UNDER_A_FILTER: &str = "not known: a seccomp filter";

/// What else needs neither a shared PID namespace nor ptrace permission.
pub(super) const BY_SOCKET: &str = "--fds socket: the descriptor over the run's Unix socket (SCM_RIGHTS), which needs \
    neither";

/// The kernel's conditions for `pidfd_open` and `pidfd_getfd` (`PTRACE_MODE_ATTACH_REALCREDS`: the same
/// uid and no capability the importer lacks, or `CAP_SYS_PTRACE` in the exporter's user namespace; Yama's
/// `ptrace_scope`; Docker's default seccomp profile), for `exporter` and `importer`, whose shared facts are
/// `facts`; `None` where it would hand the descriptor over.
pub(in crate::placement) fn pidfd_getfd_refused(
    exporter: &Place,
    importer: &Place,
    facts: &[Fact],
) -> Option<PidfdRefused> {
    let ptrace_fix = || Fix {
        docker: "--cap-add SYS_PTRACE (in one PID namespace: --pid=container:NAME)".into(),
        kubernetes: "securityContext.capabilities.add: [SYS_PTRACE] (with shareProcessNamespace: true)"
            .into(),
        option: Some(BY_SOCKET.into()),
    };
    let eperm = |why| Some(PidfdRefused { errno: "EPERM", why, fix: ptrace_fix(), not_known: false });
    if fact(facts, "pid_namespace") != Sameness::Same {
        return Some(PidfdRefused {
            errno: "ESRCH",
            why: "the exporter's pid is not visible from the importer's PID namespace (unless the importer's is \
                  an ancestor of the exporter's, as a node's is of a container's)",
            fix: Fix { option: Some(BY_SOCKET.into()), ..same_pid_number_fix() },
            not_known: false,
        });
    }
    if importer.ptrace_scope == Some(3) {
        return eperm("Yama's ptrace_scope is 3: no process may, whatever its capabilities");
    }
    if fact(facts, "user_namespace") == Sameness::Differs && importer.in_user_namespace {
        return Some(PidfdRefused {
            errno: "EPERM",
            why: "the importer's capabilities are those of a user namespace of its own, not the exporter's",
            fix: Fix {
                docker: "--userns=host (one user namespace), with --cap-add SYS_PTRACE".into(),
                kubernetes: "hostUsers: true (the node's user namespace for both pods)".into(),
                option: Some(BY_SOCKET.into()),
            },
            not_known: false,
        });
    }
    // Tried by the importer on itself where it could be (ptrace allows a process itself: only a filter or
    // the kernel refuses); inferred from its seccomp mode where it was not.
    match importer.pidfd_getfd_itself.as_deref() {
        Some("allowed") => {}
        Some("ENOSYS") => {
            return Some(PidfdRefused {
                errno: "ENOSYS",
                why: "the importer's kernel has no pidfd_getfd (Linux 5.6 or later has it)",
                fix: Fix {
                    docker: "a node with Linux >= 5.6".into(),
                    kubernetes: "a node with Linux >= 5.6".into(),
                    option: Some(BY_SOCKET.into()),
                },
                not_known: false,
            });
        }
        Some(UNDER_A_FILTER) => {
            return Some(PidfdRefused {
                errno: "EPERM",
                why: "the importer runs under a seccomp filter, read from outside: whether it allows pidfd_getfd \
                      is not known (a filter's rules are readable only by a tracer that stops the process; \
                      Docker's default allows it only with CAP_SYS_PTRACE)",
                fix: ptrace_fix(),
                not_known: true,
            });
        }
        Some(_) => return eperm("a seccomp filter refuses pidfd_getfd (the importer tried it on itself)"),
        None if importer.seccomp == Some(2) && !importer.capabilities.sys_ptrace => {
            return eperm("a seccomp filter (Docker's default) allows pidfd_getfd only with CAP_SYS_PTRACE");
        }
        None => {}
    }
    if importer.capabilities.sys_ptrace {
        return None;
    }
    let (theirs, mine) = (exporter.capabilities, importer.capabilities);
    if exporter.uid != importer.uid {
        eperm("another uid, and no CAP_SYS_PTRACE")
    } else if (theirs.sys_ptrace && !mine.sys_ptrace)
        || (theirs.sys_nice && !mine.sys_nice)
        || (theirs.ipc_lock && !mine.ipc_lock)
    {
        eperm("the exporter holds capabilities the importer lacks, and the importer no CAP_SYS_PTRACE")
    } else if importer.ptrace_scope == Some(1) && fact(facts, IMPORTER_IS_ANCESTOR) == Sameness::Same {
        None
    } else if importer.ptrace_scope == Some(1) && fact(facts, IMPORTER_IS_ANCESTOR) == Sameness::Differs {
        eperm(
            "Yama's ptrace_scope is 1: a process reaches only its descendants (and those that named it with \
             PR_SET_PTRACER, which cannot be read from outside), and the importer is no ancestor of the exporter",
        )
    } else if matches!(importer.ptrace_scope, Some(1 | 2)) {
        eperm(
            "Yama's ptrace_scope >= 1 lets a process reach only its descendants (and those that named it with \
             PR_SET_PTRACER): a served run's joiner is no ancestor of its server, nor a container of another's",
        )
    } else {
        None
    }
}
