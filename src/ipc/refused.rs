//! A refusal to open a handle another process made, as typed facts: by the driver (the call, its
//! `CUresult`, whether the handle was the interprocess event's), or by the kernel, which refused to hand
//! over a descriptor (`--fds pidfd`: the call, its errno, why as [`PidfdRefusal`]); with the fix where the
//! run diagnosed it. It travels in the `--json` document and, from a process that joined, over the run's
//! socket (`wire::Message::Ended`), so that the server's verdict, its document and the container matrix
//! name it by type.

use serde::{Deserialize, Serialize};

use super::diagnose::Diagnosis;
use super::pidfd::{KernelRefused, PidfdRefusal};

/// The driver's refusal to open a handle that another process made: the call, its error, whether the
/// handle was the interprocess event's, and the least sharing that fixes it where the run diagnosed it.
/// Filled from the driver's typed error (`driver::CallFailed`) and `ipc::diagnose::Diagnosis`, never
/// from text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// `cuIpcOpenEventHandle`, say (`pidfd_getfd` where the kernel refused).
    pub call: String,
    /// The `CUresult`, and its name (`CUDA_ERROR_MAP_FAILED`); or, where the kernel refused, the errno and
    /// its name (`ESRCH`).
    pub code: u32,
    pub error: String,
    /// The handle refused was the interprocess event's (not the memory's).
    pub event: bool,
    pub fix: Option<String>,
    /// The simulation answered so because this is beyond what it models: not the driver's answer.
    #[serde(default)]
    pub beyond_the_simulation: bool,
    /// Where the kernel refused a descriptor's fetch (`--fds pidfd`), not the driver: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidfd: Option<PidfdRefusal>,
}

/// The calls that open a handle another process made: a driver's error in one of them is a refusal of
/// that handle (across whatever lies between the two processes).
const OPENING_CALLS: [&str; 5] = [
    "cuIpcOpenMemHandle",
    "cuIpcOpenEventHandle",
    "cuMemImportFromShareableHandle",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolImportPointer",
];

impl Refused {
    /// Who refused: the driver, the simulation beyond what it models, or the kernel (a descriptor's fetch).
    pub fn by(&self) -> crate::placement::RefusedBy {
        use crate::placement::RefusedBy;
        match (self.pidfd.is_some(), self.beyond_the_simulation) {
            (true, _) => RefusedBy::Kernel,
            (false, true) => RefusedBy::BeyondTheSimulation,
            (false, false) => RefusedBy::Driver,
        }
    }

    /// The refusal that `error` is, if a driver call that opens another process's handle made it: from
    /// the driver's typed error and the diagnosis under it, not from their text.
    pub fn of(error: &anyhow::Error) -> Option<Self> {
        // (anyhow finds a context's own type through every layer; `chain` finds the errors under them.)
        let diagnosis = error
            .downcast_ref::<Diagnosis>()
            .or_else(|| error.chain().find_map(|cause| cause.downcast_ref::<Diagnosis>()));
        if let Some(kernel) = error.downcast_ref::<KernelRefused>() {
            return Some(Self {
                call: kernel.call.to_owned(),
                code: kernel.errno as u32,
                error: format!("{:?}", kernel.errno),
                event: false,
                fix: diagnosis.map(|d| d.fix.clone()),
                beyond_the_simulation: false,
                pidfd: Some(kernel.why.clone()),
            });
        }
        let failed = error.chain().find_map(|cause| cause.downcast_ref::<crate::driver::CallFailed>())?;
        if !OPENING_CALLS.contains(&failed.call.as_str()) {
            return None;
        }
        let (name, _) = crate::driver::code::name_and_words(failed.code);
        let error_name = match name {
            "CUDA_ERROR_UNKNOWN" if failed.code != 999 => format!("CUresult {}", failed.code),
            _ => name.to_owned(),
        };
        Some(Self {
            call: failed.call.clone(),
            code: failed.code,
            error: error_name,
            event: failed.call == "cuIpcOpenEventHandle",
            fix: diagnosis.map(|d| d.fix.clone()),
            beyond_the_simulation: failed.beyond_the_simulation,
            pidfd: None,
        })
    }
}
