//! The door for learners: NVIDIA's `simpleIPC.cu` as this program tells it, and nothing else. The original
//! is one file, `parentProcess` and `childProcess` beside the shared `shmStruct` and `barrierWait`; here
//! are its nine steps, in its order, each in one place (the paths under `src/`):
//!
//! 1. segment, in `parentProcess` (`sample/parent.rs`, `parent_process`): `sharedMemoryCreate` of
//!    `shmStruct` in `setup::segment_and_guardian` (the layout, the original's fields first:
//!    `segment/mod.rs`); `describe_run` fills `nprocesses` and `devices`.
//! 2. device filter (`parent_process`): unified addressing, the default compute mode, peers both ways
//!    (`devices::select`), then the mechanism's own needs (`fit_devices`); with none left, "No CUDA devices
//!    support IPC" waives the run. The original's `cudaDeviceEnablePeerAccess` in that loop is done once the
//!    handles are published, off the children's path (`devices::enable_peers`, from `export.rs`).
//! 3. export: `cudaMalloc` + `cudaIpcGetMemHandle` and `cudaEventCreate(cudaEventInterprocess)` +
//!    `cudaIpcGetEventHandle`, per process (`sample/export.rs`, `Exporter::export_device`, which makes the
//!    event first). The calls
//!    themselves are three steps down: `ipc::ExportedBuffer::allocate` picks the mechanism, `ipc/legacy.rs`
//!    `export` makes the handle, and the driver's `cuIpcGetMemHandle` is in `driver/cuda/ipc.rs`; the
//!    event's in `ipc/events.rs` (`IpcEvent::create`).
//! 4. spawn: `spawnProcess`, this program again once per process (`sample/children.rs`, `Children::spawn`);
//!    the first device's processes are started early, at the end of step 1 (before the devices are chosen),
//!    so that their `cuInit` runs beside the parent's, and wait in the segment for the plan
//!    (`attach::wait_for_the_plan`).
//! 5. wait: `waitProcess`, "Process %d failed!" (`parent_process`; `Children` through `peers::wait`).
//! 6. open, in `childProcess` (`sample/child.rs`: `child_process` does `sharedMemoryOpen`, `take_part` the
//!    rest): `cudaIpcOpenMemHandle` and `cudaIpcOpenEventHandle` for every process.
//! 7. round-robin (`take_part`): per step `cudaStreamWaitEvent`, `simpleKernel`, `cudaEventRecord`
//!    (`Events`), then `barrierWait` (`segment/barrier.rs`, `Barrier::wait`) and "Step %d done".
//! 8. verify (`take_part`): wait for the last writer (`wait_for_writes`, the step's `cudaStreamWaitEvent`),
//!    copy back, compare every byte with `(id + 1) % n` (`sample/verify.rs`).
//! 9. clean-up order: each child closes what it opened before it says it finished (`take_part`'s end); then
//!    the parent synchronises and destroys the events, frees the buffers and reaps the children
//!    (`parent_process`'s end). `cudaIpcCloseMemHandle`, `cudaEventDestroy` and `cudaFree` are the drops of
//!    the values that own them (an opened handle's view closes it; an export's owner frees it), so the
//!    order is the order those values are declared in, which the comments there say.
//!
//! What the port adds to the story itself: the segment is an anonymous memfd that the children inherit,
//! the children start before the parent has chosen the devices (the first device's) or while it exports
//! (`--sequential`: the original's order), every wait can be
//! stopped (`attach`, `barrier`), and there are mechanisms besides the original's legacy handles (`--ipc
//! vmm`, `pool`, `fabric`, in `ipc`). The tool's branches (serving and isolation, pidfd descriptors, memops
//! ordering, NUMA, test faults, MPS, the report) are outside, in `tool`, and reach the story only through
//! the seams of [`extras`]: the story never asks which option is on.

pub(crate) mod attach;
pub(crate) mod child;
pub(crate) mod children;
mod export;
pub(crate) mod extras;
pub(crate) mod parent;
pub(crate) mod verify;
