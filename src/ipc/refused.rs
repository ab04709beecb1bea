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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::CallFailed;

    fn failed(call: &str, code: u32, beyond_the_simulation: bool) -> anyhow::Error {
        let failed = CallFailed { call: call.into(), code, text: "words".into(), beyond_the_simulation };
        anyhow::Error::new(failed).context("opening the buffer of process 1")
    }

    /// A driver call that opens another's handle is a refusal, typed from its error and the diagnosis over
    /// it: which call, the code's name (a number the driver has no name for by its number), whether it was
    /// the event's, and who refused.
    #[test]
    fn a_refusal_is_the_driver_call_that_opened_anothers_handle() {
        let fix = "one IPC namespace";
        let diagnosed = failed("cuIpcOpenEventHandle", 205, false).context(Diagnosis::new(
            "another IPC namespace".into(),
            ": ",
            fix.into(),
        ));
        let refused = Refused::of(&diagnosed).expect("a refusal");
        assert_eq!(
            refused,
            Refused {
                call: "cuIpcOpenEventHandle".into(),
                code: 205,
                error: "CUDA_ERROR_MAP_FAILED".into(),
                event: true,
                fix: Some(fix.into()),
                beyond_the_simulation: false,
                pidfd: None,
            }
        );
        assert!(!refused.beyond_the_simulation && refused.pidfd.is_none(), "the driver's");
        let memory = Refused::of(&failed("cuIpcOpenMemHandle", 999, true)).expect("a refusal");
        assert_eq!((memory.error.as_str(), memory.event, &memory.fix), ("CUDA_ERROR_UNKNOWN", false, &None));
        assert!(memory.beyond_the_simulation, "the simulation's");
        let unnamed = Refused::of(&failed("cuMemPoolImportPointer", 4242, false)).expect("a refusal");
        assert_eq!(unnamed.error, "CUresult 4242");
        assert_eq!(Refused::of(&failed("cuMemAlloc", 2, false)), None, "not a call that opens a handle");
    }
}
