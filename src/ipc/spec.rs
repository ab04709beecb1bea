//! The two shapes every mechanism fills in: [`Spec`], what it declares of itself (its facts and its trial),
//! and [`Export`], what its export hands back. The one interface over the mechanisms is `ipc`'s
//! `ExportedBuffer` and `OpenedBuffer`, which choose the mechanism's file by a `match`.

use std::os::fd::OwnedFd;

use anyhow::Result;

use crate::driver::{Capability, Driver, IpcHandleBytes};
use crate::gpu::DeviceMemory;

/// One mechanism's facts, and the trial that tells whether a device can use it.
pub struct Spec {
    pub name: &'static str,
    /// What each device must report (the attributes; legacy is asked by a trial export instead, fabric by
    /// a trial allocation as well).
    pub needs: &'static [Capability],
    /// Whether each buffer comes with a file descriptor that must travel over a socket.
    pub descriptors: bool,
    /// Why stream memory operations cannot order this mechanism's memory, if they cannot.
    pub refuses_memops: Option<&'static str>,
    /// A trial that tells whether `device` can use it, beyond its attributes (it needs a context).
    pub probe: Option<Probe>,
}

/// Why `device` cannot use a mechanism, found by trial; `None` if it can.
pub type Probe = fn(&dyn Driver, i32) -> Result<Option<String>>;

/// What a mechanism's export of a buffer is: the exporter's memory, which frees or releases all it holds on
/// drop; the 64 bytes the segment carries for it; and, for the mechanisms with descriptors (vmm, pool), the
/// descriptor that travels with them. The memory is declared first: it goes before the descriptor is closed.
pub struct Export<'d> {
    pub memory: Box<dyn DeviceMemory + Send + 'd>,
    pub handle: IpcHandleBytes,
    pub descriptor: Option<OwnedFd>,
}
