//! Memory pools (NVIDIA's `streamOrderedAllocationIPC`): what cudarc and most frameworks allocate comes from
//! a stream-ordered pool, which legacy handles cannot export. The exporter creates a pool exportable as a
//! POSIX file descriptor, allocates from it and exports the pointer (64 bytes of export data, in the
//! segment); the pool's descriptor travels over a Unix socket. The importer imports the pool, grants its
//! device access, and imports the pointer. Importers free their pointers before the exporter frees its
//! allocation and destroys the pool (the parent waits for every child before it drops its exports).

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};

use super::{Export as ExportRecord, Spec, ToOpen};
use crate::driver::{Capability, DevicePtr, Driver, IpcHandleBytes, RawPool};
use crate::gpu::{DeviceMemory, warn_on_error};

/// NVIDIA's `streamOrderedAllocationIPC`: a memory pool per buffer, shared as a POSIX file descriptor, and
/// the allocation as pointer export data.
pub const SPEC: Spec = Spec {
    name: "pool",
    needs: &[Capability::MemoryPools, Capability::PoolPosixFdHandles],
    descriptors: true,
    refuses_memops: Some("stream memory operations refuse it (CUDA_ERROR_INVALID_VALUE on driver 580)"),
    probe: None,
    allocate,
    open,
};

fn allocate<'d>(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Box<dyn ExportRecord + 'd>> {
    Ok(Box::new(Export::allocate(driver, device, bytes)?))
}

fn open<'d>(driver: &'d dyn Driver, mut opening: ToOpen) -> Result<Box<dyn DeviceMemory + 'd>> {
    let descriptor = opening.take_descriptor(SPEC.name)?;
    Ok(Box::new(View::open(driver, opening.handle, descriptor, opening.bytes, opening.device)?))
}

/// A pool this process created or imported for `device`: destroyed on drop.
struct Pool<'d> {
    driver: &'d dyn Driver,
    device: i32,
    raw: RawPool,
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        let d = self.driver;
        // SAFETY: created by this driver, destroyed only here, after what was allocated from it was freed.
        let destroyed = d.use_device(self.device).and_then(|()| unsafe { d.pool_destroy(self.raw) });
        warn_on_error("destroying a memory pool", destroyed);
    }
}

/// An allocation of `bytes` from a pool, or a pointer imported from one: freed on drop.
struct Allocation<'d> {
    driver: &'d dyn Driver,
    device: i32,
    ptr: DevicePtr,
    bytes: usize,
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        let d = self.driver;
        // SAFETY: allocated or imported once, freed only here; an importer frees before the exporter.
        let freed = d.use_device(self.device).and_then(|()| unsafe { d.pool_free(self.ptr) });
        warn_on_error("freeing a pool allocation", freed);
    }
}

/// The exporter's side. The allocation is declared first: freed before the pool is destroyed.
pub struct Export<'d> {
    allocation: Allocation<'d>,
    _pool: Pool<'d>,
    handle: IpcHandleBytes,
    descriptor: OwnedFd,
}

impl<'d> Export<'d> {
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        driver.use_device(device)?;
        let pool = Pool { driver, device, raw: driver.pool_create(device)? };
        // SAFETY: the pool is alive (owned by `pool`).
        let descriptor = unsafe { driver.pool_export(pool.raw) }.context("exporting a memory pool")?;
        // SAFETY: as above.
        let ptr = unsafe { driver.pool_alloc(pool.raw, bytes) }?;
        let allocation = Allocation { driver, device, ptr, bytes };
        // SAFETY: the allocation is alive (owned by `allocation`).
        let handle =
            unsafe { driver.pool_export_pointer(allocation.ptr) }.context("exporting a pool allocation")?;
        Ok(Self { allocation, _pool: pool, handle, descriptor })
    }
}

// SAFETY: the allocation lives until the export is dropped.
unsafe impl DeviceMemory for Export<'_> {
    fn ptr(&self) -> DevicePtr {
        self.allocation.ptr
    }
    fn bytes(&self) -> usize {
        self.allocation.bytes
    }
}

impl ExportRecord for Export<'_> {
    fn handle(&self) -> &IpcHandleBytes {
        &self.handle
    }
    fn descriptor(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.descriptor.as_fd())
    }
}

/// The importer's side: the imported pointer, freed on drop, then the imported pool, released; the
/// descriptor is closed once imported.
pub struct View<'d> {
    allocation: Allocation<'d>,
    _pool: Pool<'d>,
}

impl<'d> View<'d> {
    pub fn open(
        driver: &'d dyn Driver,
        handle: &IpcHandleBytes,
        descriptor: OwnedFd,
        bytes: usize,
        device: i32,
    ) -> Result<Self> {
        driver.use_device(device)?;
        let pool = Pool { driver, device, raw: driver.pool_import(descriptor.as_fd(), device)? };
        drop(descriptor);
        // SAFETY: the pool was just imported and is alive (owned by `pool`).
        let ptr = unsafe { driver.pool_import_pointer(pool.raw, handle) }?;
        Ok(Self { allocation: Allocation { driver, device, ptr, bytes }, _pool: pool })
    }
}

// SAFETY: the imported pointer lives until the view is dropped; the exporter's allocation has the bytes the
// segment declares, and is freed only after every view is closed.
unsafe impl DeviceMemory for View<'_> {
    fn ptr(&self) -> DevicePtr {
        self.allocation.ptr
    }
    fn bytes(&self) -> usize {
        self.allocation.bytes
    }
}
