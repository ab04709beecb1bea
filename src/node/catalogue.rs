//! NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors), for the numbers a run of CUDA IPC can meet:
//! what each means, what to do, and whose fault it most likely is.

use serde::{Deserialize, Serialize};

/// Whose the fault an Xid reports most likely is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Whose {
    /// The program's (or a process of the run's): a bad address, a fault of its kernel, a process that ended
    /// with work in flight. The GPU goes on serving others.
    Program,
    /// The node's: its GPU memory, its bus, its links or its firmware. The node needs attention (drain,
    /// reset, replace), not the program.
    Node,
    /// A number this program does not know.
    NotKnown,
}

/// What NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors) says Xid `number` means, what to do,
/// and whose the fault most likely is.
pub fn catalogue(number: u32) -> (&'static str, &'static str, Whose) {
    const NODE_ECC: &str = "the node needs attention, not the program: drain the GPU, reset it (nvidia-smi \
                            -r) and read nvidia-smi -q -d ECC,ROW_REMAPPER; if it repeats, replace the GPU";
    const GSP: &str = "the node needs attention, not the program: drain it and reset the GPU (or reboot); if \
                       it repeats, update the driver and the GPU's firmware";
    match number {
        13 => (
            "graphics engine exception: a kernel faulted (an illegal address or instruction, an out-of-range \
             access), most often the program's own bug",
            "run the program under compute-sanitizer; if other programs raise it on this GPU too, run the \
             GPU's diagnostics (dcgmi diag -r 3)",
            Whose::Program,
        ),
        31 => (
            "GPU memory page fault (MMU fault): the GPU was asked for an address that is not mapped; after \
             an IPC failure, a mapping used after its exporter freed the memory or ended",
            "make every exporter outlive its importers' use of the mapping (importers close first, then the \
             exporter frees), and look for a process of the run that died first; a bad pointer shows under \
             compute-sanitizer; if it repeats with working programs, the driver or the GPU",
            Whose::Program,
        ),
        43 => (
            "GPU stopped processing: the driver stopped a program's work after a fault of its own (often \
             beside Xid 13 or 31); the GPU goes on serving others",
            "look at the program named in the line (its pid); the node needs nothing unless it repeats \
             across programs",
            Whose::Program,
        ),
        45 => (
            "preemptive cleanup: the driver removed a program's GPU channels because it ended (was killed, \
             or exited) with work in flight, or after an earlier error",
            "expected where a process of the run was killed or failed; otherwise read the Xid before it",
            Whose::Program,
        ),
        48 => {
            ("double-bit ECC error: the GPU's memory returned an uncorrectable error", NODE_ECC, Whose::Node)
        }
        63 => (
            "ECC page retirement or row remapping recorded: a failing row of the GPU's memory is to be \
             retired or remapped",
            "the node needs attention, not the program: the remapping takes effect when the GPU is reset; \
             drain and reset it when it is idle",
            Whose::Node,
        ),
        64 => (
            "ECC page retirement or row remapping failed: a failing row of the GPU's memory could not be \
             recorded",
            NODE_ECC,
            Whose::Node,
        ),
        74 => (
            "NVLink error: a link between GPUs (or to an NVSwitch) failed",
            "the node needs attention, not the program: read nvidia-smi nvlink -e, reset the GPUs; if it \
             repeats, the hardware",
            Whose::Node,
        ),
        79 => (
            "GPU has fallen off the bus: the GPU no longer answers on PCIe",
            "the node needs attention, not the program: the GPU is gone until it is reset or the node \
             rebooted; drain the node, and check its power, cooling and PCIe slot (the kernel's lines around \
             the Xid); if it repeats, the hardware",
            Whose::Node,
        ),
        94 => (
            "contained ECC error: an uncorrectable memory error, contained to the programs that used that \
             memory; the GPU goes on for the others",
            "the node needs attention, not the program: reset the GPU when it is idle, so that the row is \
             remapped",
            Whose::Node,
        ),
        95 => (
            "uncontained ECC error: an uncorrectable memory error that reached every program on the GPU",
            NODE_ECC,
            Whose::Node,
        ),
        119 => (
            "GSP RPC timeout: the GPU's System Processor did not answer the driver in time",
            GSP,
            Whose::Node,
        ),
        120 => ("GSP error: the GPU's System Processor's firmware failed", GSP, Whose::Node),
        _ => (
            "an Xid this program does not know",
            "look its number up in NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors)",
            Whose::NotKnown,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Xid the issue names is in the catalogue with whose fault it is; any other number says so.
    #[test]
    fn the_catalogue_names_each_xid_and_says_so_of_one_it_lacks() {
        for number in [13, 31, 43, 45] {
            assert_eq!(catalogue(number).2, Whose::Program, "Xid {number}");
        }
        for number in [48, 63, 64, 74, 79, 94, 95, 119, 120] {
            let (meaning, action, whose) = catalogue(number);
            assert_eq!(whose, Whose::Node, "Xid {number}");
            assert!(action.starts_with("the node needs attention, not the program"), "{number}: {action}");
            assert!(!meaning.contains("does not know"), "{number}");
        }
        let (meaning, action, whose) = catalogue(9999);
        assert_eq!((meaning, whose), ("an Xid this program does not know", Whose::NotKnown));
        assert!(action.contains("xid-errors"), "{action}");
    }
}
