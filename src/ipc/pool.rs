//! Memory pools (NVIDIA's `streamOrderedAllocationIPC`): what cudarc and most frameworks allocate comes from
//! a stream-ordered pool, which legacy handles cannot export. The exporter creates a pool exportable as a
//! POSIX file descriptor, allocates from it and exports the pointer (64 bytes of export data, in the
//! segment); the pool's descriptor travels over a Unix socket. The importer imports the pool, grants its
//! device access, and imports the pointer. Importers free their pointers before the exporter frees its
//! allocation and destroys the pool (the parent waits for every child before it drops its exports).

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};

use super::held::{HeldBase, MemoryOn};
use super::spec::{Export, Spec};
use crate::driver::{Capability, Driver, IpcHandleBytes, RawPool};

/// NVIDIA's `streamOrderedAllocationIPC`: a memory pool per buffer, shared as a POSIX file descriptor, and
/// the allocation as pointer export data.
pub const SPEC: Spec = Spec {
    name: "pool",
    needs: &[Capability::MemoryPools, Capability::PoolPosixFdHandles],
    descriptors: true,
    refuses_memops: Some("stream memory operations refuse it (CUDA_ERROR_INVALID_VALUE on driver 580)"),
    probe: None,
};

/// A pool this process created or imported for `device`: destroyed on drop.
type Pool<'d> = HeldBase<'d, RawPool>;

/// An allocation of `bytes` from a pool, or a pointer imported from one, with the pool: what the exporter
/// and each importer hold of a pool buffer. Freed on drop, then the pool is destroyed (or released).
pub(super) type Allocation<'d> = MemoryOn<'d, RawPool>;

/// The exporter's side: a new pool (its descriptor travels) and an allocation from it (its export data in
/// the segment).
pub(super) fn export<'d>(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Export<'d>> {
    driver.use_device(device)?;
    let pool = Pool { driver, device, raw: driver.pool_create(device)? };
    // SAFETY: the pool is alive (owned by `pool`).
    let descriptor = unsafe { driver.pool_export(pool.raw) }.context("exporting a memory pool")?;
    // SAFETY: as above.
    let ptr = unsafe { driver.pool_alloc(pool.raw, bytes) }?;
    let allocation = Allocation { base: pool, ptr, bytes };
    // SAFETY: the allocation is alive (owned by `allocation`).
    let handle =
        unsafe { driver.pool_export_pointer(allocation.ptr) }.context("exporting a pool allocation")?;
    Ok(Export { memory: Box::new(allocation), handle, descriptor: Some(descriptor) })
}

/// The importer's side: the pool imported, then the pointer; the descriptor is closed once imported.
pub(super) fn open<'d>(
    driver: &'d dyn Driver,
    device: i32,
    handle: &IpcHandleBytes,
    descriptor: OwnedFd,
    bytes: usize,
) -> Result<Allocation<'d>> {
    driver.use_device(device)?;
    let pool = Pool { driver, device, raw: driver.pool_import(descriptor.as_fd(), device)? };
    drop(descriptor);
    // SAFETY: the pool was just imported and is alive (owned by `pool`).
    let ptr = unsafe { driver.pool_import_pointer(pool.raw, handle) }?;
    Ok(Allocation { base: pool, ptr, bytes })
}
