//! Ownership of what crosses process boundaries, for each IPC mechanism: the exporter owns its buffer and
//! frees it on drop; an importer holds a view that unmaps, frees or closes what it opened on drop, and can
//! free nothing of the exporter's. [`ExportedBuffer`] and [`OpenedBuffer`] are the one interface over the
//! three mechanisms, so that the parent and the children read the same whatever the mechanism:
//! - [`legacy`]: `cudaIpcGetMemHandle` / `cudaIpcOpenMemHandle`, the original's;
//! - [`vmm`]: `cuMemCreate` allocations shared as file descriptors;
//! - [`pool`]: allocations of a memory pool shared as a file descriptor and pointer export data.
//!
//! The descriptors of the last two travel over [`descriptors`]. The interprocess [`events`] are the same
//! for all three. [`DeviceMemory`] and [`Event`] are what streams and kernels accept, so that no raw handle
//! leaves these owners.

pub mod descriptors;
pub mod diagnose;
pub mod events;
pub mod legacy;
pub mod pool;
pub mod vmm;

use std::os::fd::{BorrowedFd, OwnedFd};

use anyhow::{Context, Result, anyhow};

use crate::driver::{Capability, DevicePtr, Driver, IpcHandleBytes};
pub use events::{Event, ExportedEvent, OpenedEvent};

fn warn_on_error(what: &str, result: Result<()>) {
    if let Err(e) = result {
        warn!("warning: {what}: {e:#}");
    }
}

/// How the buffers are shared between processes (`--ipc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Legacy,
    Vmm,
    Pool,
}

impl Mechanism {
    pub const ALL: [Mechanism; 3] = [Mechanism::Legacy, Mechanism::Vmm, Mechanism::Pool];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Legacy => "legacy",
            Mechanism::Vmm => "vmm",
            Mechanism::Pool => "pool",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Its number in the segment and in the descriptor message.
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.code() == code)
    }

    /// Whether each buffer comes with a file descriptor that must travel over a socket.
    pub fn uses_descriptors(self) -> bool {
        self != Mechanism::Legacy
    }

    /// Why `device` cannot use this mechanism, asked of the device; `None` if it can. For legacy this exports
    /// a small allocation, which needs the device's context.
    pub fn unsupported(self, driver: &dyn Driver, device: i32) -> Result<Option<String>> {
        match self {
            Mechanism::Legacy => legacy::unsupported(driver, device),
            _ => self.unsupported_by_attributes(driver, device),
        }
    }

    /// The part of [`Mechanism::unsupported`] that the device's attributes answer, without a context (so
    /// without the time it takes to create one); `None` for legacy, which only an export can tell.
    pub fn unsupported_by_attributes(self, driver: &dyn Driver, device: i32) -> Result<Option<String>> {
        let needs: &[Capability] = match self {
            Mechanism::Legacy => return Ok(None),
            Mechanism::Vmm => &[Capability::VirtualMemory, Capability::PosixFdHandles],
            Mechanism::Pool => &[Capability::MemoryPools, Capability::PoolPosixFdHandles],
        };
        for &capability in needs {
            if !driver.supports(device, capability)? {
                return Ok(Some(format!("device {device} does not report {}", capability.attribute())));
            }
        }
        Ok(None)
    }
}

/// The error of a mechanism found missing on a device while the run was under way: the run is waived.
#[derive(Debug)]
pub struct Missing(pub String);

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Missing {}

/// Device memory that stays allocated or mapped while it is borrowed.
pub trait DeviceMemory {
    /// The device address. Only for the driver's `unsafe fn`s, whose contract the owner upholds.
    fn ptr(&self) -> DevicePtr;
    /// Bytes at [`DeviceMemory::ptr`].
    fn bytes(&self) -> usize;
}

/// A part of some device memory (`bytes` from `offset`), borrowed from its owner: a flag after a buffer's
/// data, say.
pub struct Slice<'m> {
    ptr: DevicePtr,
    bytes: usize,
    _owner: std::marker::PhantomData<&'m ()>,
}

impl<'m> Slice<'m> {
    pub fn of(memory: &'m (impl DeviceMemory + ?Sized), offset: usize, bytes: usize) -> Result<Self> {
        let end = offset.checked_add(bytes).filter(|end| *end <= memory.bytes());
        end.ok_or_else(|| anyhow!("{bytes} bytes at {offset} do not fit a buffer of {}", memory.bytes()))?;
        let ptr = memory.ptr().offset(offset).ok_or_else(|| anyhow!("device address overflow"))?;
        Ok(Self { ptr, bytes, _owner: std::marker::PhantomData })
    }
}

impl DeviceMemory for Slice<'_> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A device buffer this process allocated (`cudaMalloc`): freed on drop.
pub struct DeviceBuffer<'d> {
    driver: &'d dyn Driver,
    device: i32,
    ptr: DevicePtr,
    len: usize,
}

impl<'d> DeviceBuffer<'d> {
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        driver.use_device(device)?;
        let ptr =
            driver.alloc(bytes).with_context(|| format!("allocating {bytes} bytes on device {device}"))?;
        Ok(Self { driver, device, ptr, len: bytes })
    }
}

impl DeviceMemory for DeviceBuffer<'_> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn bytes(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `alloc` and is freed only here, once; cuMemFree waits for work that
        // still uses it (and the simulation keeps it mapped until that work has run).
        let freed = self.driver.use_device(self.device).and_then(|()| unsafe { self.driver.free(self.ptr) });
        warn_on_error("freeing a device buffer", freed);
    }
}

/// A buffer allocated and exported by this process, by any mechanism: freed on drop.
pub struct ExportedBuffer<'d> {
    kind: Exported<'d>,
    bytes: usize,
}

enum Exported<'d> {
    Legacy(legacy::Export<'d>),
    Vmm(vmm::Export<'d>),
    Pool(pool::Export<'d>),
}

impl<'d> ExportedBuffer<'d> {
    /// Allocates `bytes` on `device` and exports them by `mechanism`.
    pub fn allocate(driver: &'d dyn Driver, mechanism: Mechanism, device: i32, bytes: usize) -> Result<Self> {
        let kind = match mechanism {
            Mechanism::Legacy => Exported::Legacy(legacy::Export::allocate(driver, device, bytes)?),
            Mechanism::Vmm => Exported::Vmm(vmm::Export::allocate(driver, device, bytes)?),
            Mechanism::Pool => Exported::Pool(pool::Export::allocate(driver, device, bytes)?),
        };
        Ok(Self { kind, bytes })
    }

    /// The 64 bytes the segment carries for it.
    pub fn handle(&self) -> &IpcHandleBytes {
        match &self.kind {
            Exported::Legacy(e) => &e.handle,
            Exported::Vmm(e) => &e.handle,
            Exported::Pool(e) => &e.handle,
        }
    }

    /// The descriptor that must travel with the handle, for the mechanisms that have one.
    pub fn descriptor(&self) -> Option<BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        match &self.kind {
            Exported::Legacy(_) => None,
            Exported::Vmm(e) => Some(e.descriptor.as_fd()),
            Exported::Pool(e) => Some(e.descriptor.as_fd()),
        }
    }
}

impl DeviceMemory for ExportedBuffer<'_> {
    fn ptr(&self) -> DevicePtr {
        match &self.kind {
            Exported::Legacy(e) => e.buffer.ptr(),
            Exported::Vmm(e) => e.ptr(),
            Exported::Pool(e) => e.ptr(),
        }
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Another process's buffer, opened in this one by any mechanism: unmapped, freed or closed on drop.
pub struct OpenedBuffer<'d> {
    kind: Opened<'d>,
    bytes: usize,
}

enum Opened<'d> {
    Legacy(legacy::View<'d>),
    Vmm(vmm::View<'d>),
    Pool(pool::View<'d>),
}

impl<'d> OpenedBuffer<'d> {
    /// Opens the buffer of `bytes` bytes that `handle` (and, for vmm and pool, `descriptor`) describe, for
    /// use on `device`; `exporter` is what this process knows of the process that made it, for the message
    /// of a failure. The descriptor is closed whatever happens.
    pub fn open(
        driver: &'d dyn Driver,
        mechanism: Mechanism,
        handle: &IpcHandleBytes,
        descriptor: Option<OwnedFd>,
        bytes: usize,
        device: i32,
        exporter: &diagnose::Exporter,
    ) -> Result<Self> {
        let missing = || anyhow!("no descriptor came for this {} buffer", mechanism.name());
        let kind = match mechanism {
            Mechanism::Legacy => Opened::Legacy(legacy::View::open(driver, handle, exporter)?),
            Mechanism::Vmm => {
                Opened::Vmm(vmm::View::open(driver, handle, descriptor.ok_or_else(missing)?, bytes, device)?)
            }
            Mechanism::Pool => {
                Opened::Pool(pool::View::open(driver, handle, descriptor.ok_or_else(missing)?, device)?)
            }
        };
        Ok(Self { kind, bytes })
    }
}

impl DeviceMemory for OpenedBuffer<'_> {
    fn ptr(&self) -> DevicePtr {
        match &self.kind {
            Opened::Legacy(view) => view.ptr,
            Opened::Vmm(view) => view.ptr(),
            Opened::Pool(view) => view.ptr(),
        }
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// What one process exports: its buffer and, unless the round-robin is ordered by stream memory operations,
/// its event, on `device`. The event is declared first, so it is destroyed before the buffer is freed.
pub struct ProcessExports<'d> {
    pub device: i32,
    pub event: Option<ExportedEvent<'d>>,
    pub buffer: ExportedBuffer<'d>,
}
