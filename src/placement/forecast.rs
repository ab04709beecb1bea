//! The forecast for a pair of processes: from what they share ([`share::compare`]) and the container matrix
//! measured on the H200 host (docs/measurements.md, driver 580), whether each kind of handle will cross
//! between them, the rule it comes from, and the least change where it will not, in the words a user
//! deploys with: the Docker flag, the Kubernetes pod-spec field, or the program's option where that is
//! cheaper. A forecast never says "works" for what nobody measured: that is [`Verdict::NotKnown`].

use serde::{Deserialize, Serialize};

mod gpus;
mod pidfd;

use super::Place;
pub use super::share::{EXPORTERS_NUMBER_THERE, IMPORTER_IS_ANCESTOR};
use super::share::{Fact, Sameness};
use gpus::{platform_rows, unseen_gpus};
pub use pidfd::UNDER_A_FILTER;
pub(super) use pidfd::pidfd_getfd_refused;

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

#[cfg(test)]
mod tests;
