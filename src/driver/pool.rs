//! Memory pools (`streamOrderedAllocationIPC`): a pool shared as a descriptor, its allocations' pointers as
//! 64 bytes of export data ([`Pools`]).

use std::os::fd::{BorrowedFd, OwnedFd};

use anyhow::Result;

use super::handles::{DevicePtr, IpcHandleBytes, RawPool};

/// Memory pools exportable as POSIX file descriptors, and the pointers of their allocations.
pub trait Pools {
    /// `cuMemPoolCreate` on `device`, exportable as a POSIX file descriptor.
    fn pool_create(&self, device: i32) -> Result<RawPool>;
    /// `cuMemPoolExportToShareableHandle`: a new descriptor for the pool, owned by the caller.
    /// # Safety
    /// `pool` was created by this driver and is not destroyed.
    unsafe fn pool_export(&self, pool: RawPool) -> Result<OwnedFd>;
    /// `cuMemPoolImportFromShareableHandle`, then read-write access for `device`; the descriptor stays the
    /// caller's to close.
    fn pool_import(&self, fd: BorrowedFd, device: i32) -> Result<RawPool>;
    /// Allocates `bytes` from `pool`, and waits for the allocation.
    /// # Safety
    /// `pool` was created by this driver and is not destroyed.
    unsafe fn pool_alloc(&self, pool: RawPool, bytes: usize) -> Result<DevicePtr>;
    /// `cuMemPoolExportPointer`: the export data of an allocation of `pool`.
    /// # Safety
    /// `ptr` came from [`Pools::pool_alloc`] and is not freed.
    unsafe fn pool_export_pointer(&self, ptr: DevicePtr) -> Result<IpcHandleBytes>;
    /// `cuMemPoolImportPointer` from an imported pool.
    /// # Safety
    /// `pool` came from [`Pools::pool_import`].
    unsafe fn pool_import_pointer(&self, pool: RawPool, data: &IpcHandleBytes) -> Result<DevicePtr>;
    /// Frees an allocation or an imported pointer, and waits for it (an importer frees before the exporter).
    /// # Safety
    /// `ptr` came from [`Pools::pool_alloc`] or [`Pools::pool_import_pointer`], freed once, no work pending.
    unsafe fn pool_free(&self, ptr: DevicePtr) -> Result<()>;
    /// Destroys a pool this process created, or releases one it imported.
    /// # Safety
    /// `pool` was created or imported by this driver, every allocation from it (or pointer imported from
    /// it) is freed, and it is destroyed once.
    unsafe fn pool_destroy(&self, pool: RawPool) -> Result<()>;
}
