//! Ownership of what crosses process boundaries, for each IPC mechanism: the exporter owns its buffer and
//! frees it on drop; an importer holds a view that unmaps, frees or closes what it opened on drop, and can
//! free nothing of the exporter's. Each mechanism is a file of its own: its [`Spec`] (facts and trial), an
//! `export` that hands back the exporter's memory with what travels for it, and an `open` that hands back
//! the importer's view. [`ExportedBuffer`] and [`OpenedBuffer`] are the one interface over them, each a
//! `match` on the [`Mechanism`], so that the parent and the children read the same whatever the mechanism:
//! - [`legacy`]: `cudaIpcGetMemHandle` / `cudaIpcOpenMemHandle`, the original's;
//! - [`vmm`]: `cuMemCreate` allocations shared as file descriptors;
//! - [`pool`]: allocations of a memory pool shared as a file descriptor and pointer export data;
//! - [`fabric`]: `cuMemCreate` allocations shared as 64-byte fabric handles (an IMEX channel needed).
//!
//! Exporting a buffer is three steps down: [`ExportedBuffer::allocate`], the mechanism's `export`, the
//! driver's call. vmm, pool and fabric hold memory resting on a base (an allocation, a pool), written once
//! in `held`. The descriptors of vmm and pool travel over [`descriptors`], or are fetched by [`pidfd`]
//! (`--fds pidfd`). The interprocess [`events`] are the same for all four; the device memory owners below
//! them are in `gpu`. Where CUDA IPC cannot work at all (MIG across GPU instances, legacy on WSL2),
//! [`platform`] says so.

pub mod diagnose;
pub mod events;
pub mod fabric;
mod held;
pub mod legacy;
pub mod pidfd;
pub mod platform;
pub mod pool;
pub mod refused;
mod spec;
pub mod vmm;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use anyhow::{Result, anyhow};

use crate::driver::{DevicePtr, Driver, IpcHandleBytes};
pub use crate::gpu::{DeviceBuffer, DeviceMemory, Event, Slice};
pub use events::{ExportedEvent, OpenedEvent};
pub use spec::Spec;

/// How the buffers are shared between processes (`--ipc`). What each one is and does is in its own file:
/// a new mechanism is a file, a variant here and a line in each `match` on it ([`Mechanism::spec`],
/// [`ExportedBuffer::allocate`], [`OpenedBuffer::open`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Legacy,
    Vmm,
    Pool,
    Fabric,
}

/// `--sync`: how the round-robin hands a buffer from one writer to the next (the segment carries it as its
/// `OPTION_SYNC_MEMOPS` bit, decoded by `SharedState::sync`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Sync {
    /// `cudaStreamWaitEvent` on the buffer's interprocess event, `cudaEventRecord` after the kernel.
    #[default]
    Events,
    /// `cuStreamWaitValue32` on the buffer's flag before the kernel, `cuStreamWriteValue32` after it.
    Memops,
}

impl Sync {
    /// `events` or `memops`, as `--sync` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Sync::Events => "events",
            Sync::Memops => "memops",
        }
    }
}

/// `--fds`: how the descriptors of vmm and pool buffers reach the importers.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fds {
    /// Over a Unix socket, with SCM_RIGHTS.
    #[default]
    Socket,
    /// Fetched by each importer with `pidfd_open` and `pidfd_getfd`.
    Pidfd,
}

impl Mechanism {
    pub const ALL: [Mechanism; 4] = [Mechanism::Legacy, Mechanism::Vmm, Mechanism::Pool, Mechanism::Fabric];

    pub fn spec(self) -> &'static Spec {
        match self {
            Mechanism::Legacy => &legacy::SPEC,
            Mechanism::Vmm => &vmm::SPEC,
            Mechanism::Pool => &pool::SPEC,
            Mechanism::Fabric => &fabric::SPEC,
        }
    }

    pub fn name(self) -> &'static str {
        self.spec().name
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
        self.spec().descriptors
    }

    /// Why `device` cannot use this mechanism, asked of the device; `None` if it can. A mechanism with a
    /// trial (legacy, fabric) makes a small allocation, which needs the device's context.
    pub fn unsupported(self, driver: &dyn Driver, device: i32) -> Result<Option<String>> {
        match self.unsupported_by_attributes(driver, device)? {
            Some(reason) => Ok(Some(reason)),
            None => self.spec().probe.map_or(Ok(None), |probe| probe(driver, device)),
        }
    }

    /// The part of [`Mechanism::unsupported`] that the device's attributes answer, without a context (so
    /// without the time it takes to create one).
    pub fn unsupported_by_attributes(self, driver: &dyn Driver, device: i32) -> Result<Option<String>> {
        for &capability in self.spec().needs {
            if !driver.supports(device, capability)? {
                return Ok(Some(format!("device {device} does not report {}", capability.attribute())));
            }
        }
        Ok(None)
    }
}

/// Why `--sync memops` cannot order `mechanism`'s memory, said the same everywhere.
pub fn memops_refusal(mechanism: Mechanism) -> String {
    let why = mechanism.spec().refuses_memops.unwrap_or("it is not known to");
    format!("--sync memops cannot order {} memory: {why}", mechanism.name())
}

/// A buffer allocated and exported by this process, by any mechanism: freed on drop.
pub struct ExportedBuffer<'d> {
    export: spec::Export<'d>,
    bytes: usize,
}

impl<'d> ExportedBuffer<'d> {
    /// Allocates `bytes` on `device` and exports them by `mechanism`.
    pub fn allocate(driver: &'d dyn Driver, mechanism: Mechanism, device: i32, bytes: usize) -> Result<Self> {
        let export = match mechanism {
            Mechanism::Legacy => legacy::export(driver, device, bytes),
            Mechanism::Vmm => vmm::export(driver, device, bytes),
            Mechanism::Pool => pool::export(driver, device, bytes),
            Mechanism::Fabric => fabric::export(driver, device, bytes),
        }?;
        Ok(Self { export, bytes })
    }

    /// The 64 bytes the segment carries for it.
    pub fn handle(&self) -> &IpcHandleBytes {
        &self.export.handle
    }

    /// The descriptor that must travel with the handle, for the mechanisms that have one.
    pub fn descriptor(&self) -> Option<BorrowedFd<'_>> {
        self.export.descriptor.as_ref().map(AsFd::as_fd)
    }
}

// SAFETY: each mechanism's export owns its memory until it is dropped, with at least the bytes asked for.
unsafe impl DeviceMemory for ExportedBuffer<'_> {
    fn ptr(&self) -> DevicePtr {
        self.export.memory.ptr()
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Another process's buffer, opened in this one by any mechanism: unmapped, freed or closed on drop.
pub struct OpenedBuffer<'d> {
    view: Box<dyn DeviceMemory + 'd>,
    bytes: usize,
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
        let descriptor =
            || descriptor.ok_or_else(|| anyhow!("no descriptor came for this {} buffer", mechanism.name()));
        let view: Box<dyn DeviceMemory + 'd> = match mechanism {
            Mechanism::Legacy => Box::new(legacy::View::open(driver, device, handle, bytes, exporter)?),
            Mechanism::Vmm => Box::new(vmm::open(driver, device, handle, descriptor()?, bytes)?),
            Mechanism::Pool => Box::new(pool::open(driver, device, handle, descriptor()?, bytes)?),
            Mechanism::Fabric => Box::new(fabric::open(driver, device, handle, bytes)?),
        };
        Ok(Self { view, bytes })
    }
}

// SAFETY: each mechanism's view keeps its mapping until it is dropped.
unsafe impl DeviceMemory for OpenedBuffer<'_> {
    fn ptr(&self) -> DevicePtr {
        self.view.ptr()
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// What one process exports: its buffer and, unless the round-robin is ordered by stream memory operations,
/// its event (each knows its device). The event is declared first, so it is destroyed before the buffer is
/// freed.
pub struct ProcessExports<'d> {
    pub event: Option<ExportedEvent<'d>>,
    pub buffer: ExportedBuffer<'d>,
}
