//! Virtual memory management (`memMapIPCDrv`): physical allocations shared as file descriptors, mapped in
//! address ranges of their own ([`Vmm`]). Fabric allocations ([`Fabric`](super::Fabric)) are mapped,
//! unmapped and released by these calls too.

use std::os::fd::{BorrowedFd, OwnedFd};

use anyhow::Result;

use super::handles::{DevicePtr, RawAllocation};

/// `cuMemCreate` allocations exported and imported as POSIX file descriptors, and their mappings.
pub trait Vmm {
    /// The allocation granularity of `device` for shareable allocations.
    fn vmm_granularity(&self, device: i32) -> Result<usize>;
    /// `cuMemCreate` of `bytes` (a multiple of the granularity) on `device`, exportable as a descriptor.
    fn vmm_create(&self, device: i32, bytes: usize) -> Result<RawAllocation>;
    /// `cuMemExportToShareableHandle`: a new descriptor for the allocation, owned by the caller.
    /// # Safety
    /// `allocation` came from this driver and is not released.
    unsafe fn vmm_export(&self, allocation: RawAllocation) -> Result<OwnedFd>;
    /// `cuMemImportFromShareableHandle`; the descriptor stays the caller's to close.
    fn vmm_import(&self, fd: BorrowedFd) -> Result<RawAllocation>;
    /// Reserves an address range of `bytes`, maps `allocation` there and lets `device` read and write it.
    /// # Safety
    /// `allocation` came from this driver, is not released, and has `bytes` bytes.
    unsafe fn vmm_map(&self, allocation: RawAllocation, bytes: usize, device: i32) -> Result<DevicePtr>;
    /// Unmaps `bytes` at `ptr` and frees the address range.
    /// # Safety
    /// `ptr` and `bytes` came from one [`Vmm::vmm_map`], unmapped once, with no work pending on it.
    unsafe fn vmm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// # Safety
    /// `allocation` came from this driver and is released once; its mappings may outlive it.
    unsafe fn vmm_release(&self, allocation: RawAllocation) -> Result<()>;
    /// The granularity of an allocation made or imported here, from its own properties
    /// (`cuMemGetAllocationPropertiesFromHandle`): what its exporter rounded its size up to.
    /// # Safety
    /// `allocation` came from this driver and is not released.
    unsafe fn vmm_granularity_of(&self, allocation: RawAllocation) -> Result<usize>;
}
