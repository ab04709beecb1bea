//! The forecast for a pair of processes: from what they share ([`share::compare`]) and the container matrix
//! measured on the H200 host (docs/measurements.md, driver 580), whether each kind of handle will cross
//! between them, the rule it comes from, and the least change where it will not, in the words a user
//! deploys with: the Docker flag, the Kubernetes pod-spec field, or the program's option where that is
//! cheaper. A forecast never says "works" for what nobody measured: that is [`Verdict::NotKnown`].

use serde::{Deserialize, Serialize};

use super::Place;
use super::share::{Fact, Sameness};

/// What a forecast says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "verdict", content = "detail")]
pub enum Verdict {
    Works,
    /// It will fail, with this driver error.
    Fails(String),
    /// A library will not take this path, and silently takes this slower one instead.
    FallsBack(String),
    /// Nobody measured it for this pair.
    NotKnown,
}

/// The least change that makes a failing path work.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fix {
    pub docker: String,
    pub kubernetes: String,
    /// The option of this program (or of the library) that needs no change of the containers.
    pub option: Option<String>,
}

/// The forecast for one kind of handle (or library path) between the exporter and one importer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forecast {
    /// `legacy memory`, `VMM fd`, ...: the container matrix's column.
    pub path: String,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// Why: the rule, and where it was measured or read.
    pub rule: String,
    pub fix: Option<Fix>,
    /// A library path's row that rests on a primitive this run measured (not only forecast).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measured: bool,
}

/// The matrix's columns, as `--ipc all --isolate` names them.
pub const PATHS: [&str; 6] =
    ["legacy memory", "legacy event", "VMM fd", "pool fd", "fabric", "VMM fd by pidfd_getfd"];

const MEASURED: &str = "measured on the H200 host, driver 580 (docs/measurements.md)";
/// The kernel's answer, whatever the GPU: the simulation makes the calls for real.
const MEASURED_BY_THE_KERNEL: &str = "the kernel's rule, measured by the container matrix on the simulation \
    in CI, which makes the calls for real on host memory descriptors; not yet measured on the H200 host \
    (docs/measurements.md)";

/// Why the kernel would refuse the importer `pidfd_getfd` of the exporter's descriptor (`--fds pidfd`,
/// PyTorch's expandable segments, UCX's POSIX descriptors): the errno, why, and the least change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct PidfdRefused {
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
const BY_SOCKET: &str = "--fds socket: the descriptor over the run's Unix socket (SCM_RIGHTS), which needs \
    neither";

/// The kernel's conditions for `pidfd_open` and `pidfd_getfd` (`PTRACE_MODE_ATTACH_REALCREDS`: the same
/// uid and no capability the importer lacks, or `CAP_SYS_PTRACE` in the exporter's user namespace; Yama's
/// `ptrace_scope`; Docker's default seccomp profile), for `exporter` and `importer`, whose shared facts are
/// `facts`; `None` where it would hand the descriptor over.
pub(super) fn pidfd_getfd_refused(
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

pub(super) fn same_pid_number_fix() -> Fix {
    Fix {
        docker: "--pid=container:NAME (one PID namespace)".into(),
        kubernetes: "shareProcessNamespace: true (both containers in one pod), or hostPID: true".into(),
        option: Some("--ipc vmm or pool (memory by descriptor), with --sync memops (no event)".into()),
    }
}

pub(super) fn dev_shm_fix() -> Fix {
    Fix {
        docker: "--ipc=container:NAME (its /dev/shm), or one volume mounted at /dev/shm in both".into(),
        kubernetes: "both containers in one pod, with an emptyDir of medium: Memory mounted at /dev/shm; or hostIPC: true"
            .into(),
        option: Some("--sync memops (no interprocess event)".into()),
    }
}

/// A fact of the pair beyond the table's (`share::compare` adds it): the importer is an ancestor of the
/// exporter (`same`), or is not (`differs`); known only from outside (`--between`), where both pids are.
pub const IMPORTER_IS_ANCESTOR: &str = "importer_is_ancestor";
/// A fact of the pair beyond the table's: where their PID namespaces differ, a process of the importer's
/// namespace has the exporter's own pid number (`same`, its name the detail), or none has (`differs`).
/// Known of any namespace's pid 1 (its init), and from outside of every number.
pub const EXPORTERS_NUMBER_THERE: &str = "exporters_pid_number_taken_there";

pub(super) fn fact(facts: &[Fact], name: &str) -> Sameness {
    facts.iter().find(|f| f.fact == name).map_or(Sameness::Unknown, |f| f.same)
}

/// The forecast of every path of [`PATHS`] for `exporter` and `importer`, whose shared facts are `facts`.
pub fn forecast(exporter: &Place, importer: &Place, facts: &[Fact]) -> Vec<Forecast> {
    let same_pid_number = exporter.pid == importer.pid;
    let pid = fact(facts, "pid_namespace");
    let shm = fact(facts, "dev_shm");
    let imex = facts.iter().find(|f| f.fact == "imex_channel");
    let node = fact(facts, "boot_id");
    let make = |path: &str, verdict: Verdict, rule: String, fix: Option<Fix>| Forecast {
        path: path.to_owned(),
        verdict,
        rule,
        fix,
        measured: false,
    };
    if node == Sameness::Differs {
        let rule = "the two processes are on different nodes (boot ids differ): CUDA IPC is within one node"
            .to_owned();
        let both_imex = exporter.imex_channel && importer.imex_channel;
        return PATHS
            .iter()
            .map(|&p| match (p, both_imex) {
                // Made for this: fabric handles cross nodes through IMEX (not measured here).
                ("fabric", true) => make(
                    p,
                    Verdict::NotKnown,
                    "different nodes, both with an IMEX channel: fabric handles cross nodes of one IMEX domain \
                     (NVLink), which was not measured here"
                        .into(),
                    None,
                ),
                _ => make(p, Verdict::Fails("not on one node".into()), rule.clone(), None),
            })
            .collect();
    }
    if let Some(rows) = platform_rows(exporter, importer) {
        return rows;
    }
    // The driver takes a legacy handle whose exporter has the importer's own pid number for one of its own.
    let collision = match pid {
        Sameness::Differs if same_pid_number => Some(true),
        Sameness::Same | Sameness::Differs => Some(false),
        Sameness::Unknown => None,
    };
    let legacy = |path: &str, also_shm: bool| match (collision, shm) {
        (Some(true), _) => make(
            path,
            Verdict::Fails("CUDA_ERROR_INVALID_CONTEXT".into()),
            format!(
                "different PID namespaces and the same pid number: the driver takes the handle for one of its own; {MEASURED}"
            ),
            Some(same_pid_number_fix()),
        ),
        (Some(false), Sameness::Differs) if also_shm => make(
            path,
            Verdict::Fails("CUDA_ERROR_MAP_FAILED".into()),
            format!(
                "an interprocess event's file lives in the exporter's /dev/shm, which the importer does not see; {MEASURED}"
            ),
            Some(dev_shm_fix()),
        ),
        (Some(false), Sameness::Same | Sameness::Differs)
            if also_shm && event_file_unopenable(exporter, importer) =>
        {
            make(
                path,
                Verdict::Fails("CUDA_ERROR_MAP_FAILED".into()),
                format!(
                    "the event's file is /dev/shm/cuda.shm.<uid>.<pid>.<n>, mode 0600, named by the exporter's uid as \
                     it sees itself ({}); the importer's driver looks for it under its own ({}{}), and opens it only \
                     as its owner or as root of the node's user namespace; {MEASURED} (2026-12-07)",
                    exporter.uid,
                    importer.uid,
                    if importer.in_user_namespace { ", in a user namespace of its own" } else { "" }
                ),
                Some(same_uid_fix()),
            )
        }
        (Some(false), Sameness::Same | Sameness::Differs) => make(
            path,
            Verdict::Works,
            format!(
                "no pid number collides{}; {MEASURED}",
                if also_shm { " and /dev/shm is one" } else { "" }
            ),
            None,
        ),
        _ => make(path, Verdict::NotKnown, "a PID namespace or /dev/shm could not be read".into(), None),
    };
    let by_descriptor = |path: &str| {
        make(
            path,
            Verdict::Works,
            format!("the descriptor crosses every namespace boundary over the run's Unix socket; {MEASURED}"),
            None,
        )
    };
    let fabric = match imex.map(|f| (f.same, f.detail.as_deref())) {
        Some((Sameness::Same, None)) => make(
            "fabric",
            Verdict::NotKnown,
            "both have an IMEX channel; fabric handles were not measured here (the H200 host has no IMEX channel)".into(),
            None,
        ),
        _ => make(
            "fabric",
            Verdict::Fails("CUDA_ERROR_NOT_PERMITTED".into()),
            "a fabric handle needs an IMEX channel (/dev/nvidia-caps-imex-channels/) on both sides".into(),
            Some(Fix {
                docker: "--device /dev/nvidia-caps-imex-channels/channel0 (with the IMEX daemon on the node)".into(),
                kubernetes: "an IMEX channel from NVIDIA's DRA driver (ComputeDomain) for both pods".into(),
                option: Some("--ipc vmm (a POSIX descriptor, within one node)".into()),
            }),
        ),
    };
    let by_pidfd = match pidfd_getfd_refused(exporter, importer, facts) {
        None => make(
            PATHS[5],
            Verdict::Works,
            format!("one PID namespace, and ptrace allows the importer; {MEASURED_BY_THE_KERNEL}"),
            None,
        ),
        Some(refused) if refused.not_known => make(
            PATHS[5],
            Verdict::NotKnown,
            format!("{}; {MEASURED_BY_THE_KERNEL}", refused.why),
            Some(refused.fix),
        ),
        Some(refused) => make(
            PATHS[5],
            Verdict::Fails(refused.errno.into()),
            format!("{}; {MEASURED_BY_THE_KERNEL}", refused.why),
            Some(refused.fix),
        ),
    };
    let rows = vec![
        legacy(PATHS[0], false),
        legacy(PATHS[1], true),
        by_descriptor(PATHS[2]),
        by_descriptor(PATHS[3]),
        fabric,
        by_pidfd,
    ];
    unseen_gpus(rows, exporter, importer, facts)
}

/// Whether the importer cannot open the exporter's event file (measured on the H200 host, 2026-12-07): the
/// driver names the file by the exporter's uid as it sees itself and looks for it under the importer's own,
/// and the file is the exporter's, mode 0600: the two uids must be one, and the importer the file's owner on
/// the node or root of the node's user namespace. Where the node's uids are not known, the uids as each sees
/// itself decide alone.
fn event_file_unopenable(exporter: &Place, importer: &Place) -> bool {
    let node_root = importer.uid == 0 && !importer.in_user_namespace;
    let owner = match (exporter.node_uid, importer.node_uid) {
        (Some(theirs), Some(mine)) => theirs == mine,
        _ => true,
    };
    exporter.uid != importer.uid || !(owner || node_root)
}

fn same_uid_fix() -> Fix {
    Fix {
        docker: "--user with the exporter's uid (and --userns=host, or the same user namespace mapping)"
            .into(),
        kubernetes: "the exporter's uid as runAsUser of both pods' securityContext, and hostUsers: true"
            .into(),
        option: Some("--sync memops (no interprocess event)".into()),
    }
}

/// Where the exporter or the importer runs on WSL2 or Tegra, which have no legacy CUDA IPC: its rows, the
/// others not known (nobody measured descriptors there).
fn platform_rows(exporter: &Place, importer: &Place) -> Option<Vec<Forecast>> {
    let (name, why, source) = [exporter, importer].iter().find_map(|p| match &p.platform {
        super::Platform::Linux => None,
        super::Platform::Wsl2(why) => Some(("WSL2", why.clone(), "CUDA on WSL's documentation, Limitations")),
        super::Platform::Tegra(why) => {
            Some(("Tegra", why.clone(), "CUDA for Tegra's documentation, Memory Management: no cudaIpc*"))
        }
    })?;
    let rows = PATHS
        .iter()
        .map(|&path| {
            let legacy = path.starts_with("legacy");
            Forecast {
                path: path.to_owned(),
                verdict: if legacy {
                    Verdict::Fails("CUDA_ERROR_NOT_SUPPORTED".into())
                } else {
                    Verdict::NotKnown
                },
                rule: match legacy {
                    true => format!("{name} ({why}) has no legacy CUDA IPC ({source})"),
                    false => {
                        format!("{name} ({why}): descriptors and fabric handles were not measured there")
                    }
                },
                fix: None,
                measured: false,
            }
        })
        .collect();
    Some(rows)
}

/// Where the importer does not see a GPU the exporter's memory may be on, no memory path "works": legacy
/// handles are reported to fail there with "invalid argument" (and NCCL still selects P2P for such a peer,
/// src/transport/p2p.cc p2pCanConnect), which nobody measured here (one GPU on the H200 host).
fn unseen_gpus(rows: Vec<Forecast>, exporter: &Place, importer: &Place, facts: &[Fact]) -> Vec<Forecast> {
    let Some(lacks) = facts.iter().find(|f| f.fact == "gpus" && f.same == Sameness::Differs) else {
        return rows;
    };
    let memory = |path: &str| path != "legacy event";
    // No GPU at all (`CUDA_VISIBLE_DEVICES=` or none given): no context, so nothing opens (measured on the
    // H200 host: a joiner with `CUDA_VISIBLE_DEVICES=` fails with CUDA_ERROR_NO_DEVICE).
    if importer.gpus.as_ref().is_some_and(Vec::is_empty) {
        return rows
            .into_iter()
            .map(|row| Forecast {
                verdict: Verdict::Fails("CUDA_ERROR_NO_DEVICE".into()),
                rule: "the importer sees no GPU at all (its CUDA_VISIBLE_DEVICES, or its container's GPUs): it has \
                       no CUDA context to open anything in; measured on the H200 host"
                    .into(),
                fix: Some(gpus_fix()),
                ..row
            })
            .collect();
    }
    // A GPU its container does not have at all (no device node, not in its driver's view): no memory of it
    // can be mapped there, whatever the handle: the cause to name before any other.
    let absent: Vec<&String> = match (&exporter.gpus, &importer.gpus_present) {
        (Some(theirs), Some(present)) => theirs.iter().filter(|g| !present.contains(g)).collect(),
        _ => Vec::new(),
    };
    if !absent.is_empty() {
        let names = absent.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(", ");
        return rows
            .into_iter()
            .map(|row| match memory(&row.path) {
                true => Forecast {
                    verdict: Verdict::Fails("the importer's container has no such GPU".into()),
                    rule: format!(
                        "the importer's container does not have {names} (no device node in its root, or not in its \
                         driver's view): no memory of it can be mapped there, by any kind of handle"
                    ),
                    fix: Some(gpus_fix()),
                    ..row
                },
                false => row,
            })
            .collect();
    }
    // Hidden only by CUDA_VISIBLE_DEVICES: the container has the GPU.
    let present = importer.gpus_present.is_some();
    let what = lacks.detail.clone().unwrap_or_default();
    rows.into_iter()
        .map(|row| match row.verdict {
            Verdict::Works if present && row.path == "legacy memory" => Forecast {
                rule: format!(
                    "the importer {what} only by its CUDA_VISIBLE_DEVICES (its container has the GPU): a legacy handle \
                     opens on a device the importer does not see (cuIpcOpenMemHandle's documentation), not measured \
                     here; {}",
                    row.rule
                ),
                ..row
            },
            Verdict::Works if row.path != "legacy event" => Forecast {
                verdict: Verdict::NotKnown,
                rule: format!(
                    "the importer {what} (its CUDA_VISIBLE_DEVICES or its container's GPUs): a memory handle of a \
                     GPU it does not see is reported to fail (legacy IPC: invalid argument), not measured here"
                ),
                fix: Some(gpus_fix()),
                ..row
            },
            _ => row,
        })
        .collect()
}

fn gpus_fix() -> Fix {
    Fix {
        docker: "--gpus all (or the same --gpus device list) in both".into(),
        kubernetes: "the same GPUs for both containers (one pod, or a shared ResourceClaim)".into(),
        option: Some("CUDA_VISIBLE_DEVICES that names the exporter's GPU in the importer".into()),
    }
}

#[cfg(test)]
mod tests;
