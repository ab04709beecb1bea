//! A refusal by the driver to open a handle another process made, as typed facts: the call, its error,
//! whether the handle was the interprocess event's, and the fix where the run diagnosed it. It travels in
//! the `--json` document and, from a process that joined, over the run's socket.

use serde::{Deserialize, Serialize};

use super::diagnose::Diagnosis;

/// The driver's refusal to open a handle that another process made: the call, its error, whether the
/// handle was the interprocess event's, and the least sharing that fixes it where the run diagnosed it.
/// Filled from the driver's typed error (`driver::CallFailed`) and `ipc::diagnose::Diagnosis`, never
/// from text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// `cuIpcOpenEventHandle`, say.
    pub call: String,
    /// The `CUresult`, and its name (`CUDA_ERROR_MAP_FAILED`).
    pub code: u32,
    pub error: String,
    /// The handle refused was the interprocess event's (not the memory's).
    pub event: bool,
    pub fix: Option<String>,
    /// The simulation answered so because this is beyond what it models: not the driver's answer.
    #[serde(default)]
    pub beyond_the_simulation: bool,
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
    /// The refusal that `error` is, if a driver call that opens another process's handle made it: from
    /// the driver's typed error and the diagnosis under it, not from their text.
    pub fn of(error: &anyhow::Error) -> Option<Self> {
        let failed = error.chain().find_map(|cause| cause.downcast_ref::<crate::driver::CallFailed>())?;
        if !OPENING_CALLS.contains(&failed.call.as_str()) {
            return None;
        }
        let (name, _) = crate::driver::code::name_and_words(failed.code);
        let error_name = match name {
            "CUDA_ERROR_UNKNOWN" if failed.code != 999 => format!("CUresult {}", failed.code),
            _ => name.to_owned(),
        };
        // (anyhow finds a context's own type through every layer; `chain` finds the errors under them.)
        let diagnosis = error
            .downcast_ref::<Diagnosis>()
            .or_else(|| error.chain().find_map(|cause| cause.downcast_ref::<Diagnosis>()));
        Some(Self {
            call: failed.call.clone(),
            code: failed.code,
            error: error_name,
            event: failed.call == "cuIpcOpenEventHandle",
            fix: diagnosis.map(|d| d.fix.clone()),
            beyond_the_simulation: failed.beyond_the_simulation,
        })
    }
}
