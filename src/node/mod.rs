//! What the node says of a run, beside what the run saw itself: NVIDIA's Xid errors that the kernel logged
//! for the run's GPUs while it ran (`kmsg` reads the kernel's log from the run's start, `xid` finds the Xid
//! lines of the run's GPUs and names them as NVIDIA's catalogue does, `processes` says whose process each
//! names).

mod catalogue;
pub(crate) mod kmsg;
pub(crate) mod processes;
pub(crate) mod xid;

pub use kmsg::{RunStart, simulated_pci_bus_id, test_hook_said, test_log};
pub(crate) use processes::note as note_run_process;
pub use xid::{Gpu, KernelLog, Xid, look};
