//! Memory pools (NVIDIA's `streamOrderedAllocationIPC`): what cudarc and most frameworks allocate comes from
//! a stream-ordered pool, which legacy handles cannot export. The exporter creates a pool exportable as a
//! POSIX file descriptor, allocates from it and exports the pointer (64 bytes of export data, in the
//! segment); the pool's descriptor travels over a Unix socket. The importer imports the pool, grants its
//! device access, and imports the pointer. Importers free their pointers before the exporter frees its
//! allocation and destroys the pool (the parent waits for every child before it drops its exports).

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};

use super::warn_on_error;
use crate::driver::{DevicePtr, Driver, IpcHandleBytes, RawPool};

/// A pool this process created or imported: destroyed on drop.
struct Pool<'d> {
    driver: &'d dyn Driver,
    raw: RawPool,
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        // SAFETY: created by this driver, destroyed only here, after what was allocated from it was freed.
        warn_on_error("destroying a memory pool", unsafe { self.driver.pool_destroy(self.raw) });
    }
}

/// An allocation from a pool, or a pointer imported from one: freed on drop.
struct Allocation<'d> {
    driver: &'d dyn Driver,
    ptr: DevicePtr,
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated or imported once, freed only here; an importer frees before the exporter.
        warn_on_error("freeing a pool allocation", unsafe { self.driver.pool_free(self.ptr) });
    }
}

/// The exporter's side. The allocation is declared first: freed before the pool is destroyed.
pub struct Export<'d> {
    allocation: Allocation<'d>,
    _pool: Pool<'d>,
    pub handle: IpcHandleBytes,
    pub descriptor: OwnedFd,
}

impl<'d> Export<'d> {
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        driver.use_device(device)?;
        let pool = Pool { driver, raw: driver.pool_create(device)? };
        // SAFETY: the pool is alive (owned by `pool`).
        let descriptor = unsafe { driver.pool_export(pool.raw) }.context("exporting a memory pool")?;
        // SAFETY: as above.
        let allocation = Allocation { driver, ptr: unsafe { driver.pool_alloc(pool.raw, bytes) }? };
        // SAFETY: the allocation is alive (owned by `allocation`).
        let handle =
            unsafe { driver.pool_export_pointer(allocation.ptr) }.context("exporting a pool allocation")?;
        Ok(Self { allocation, _pool: pool, handle, descriptor })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.allocation.ptr
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
        device: i32,
    ) -> Result<Self> {
        let pool = Pool { driver, raw: driver.pool_import(descriptor.as_fd(), device)? };
        drop(descriptor);
        // SAFETY: the pool was just imported and is alive (owned by `pool`).
        let ptr = unsafe { driver.pool_import_pointer(pool.raw, handle) }?;
        Ok(Self { allocation: Allocation { driver, ptr }, _pool: pool })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.allocation.ptr
    }
}
