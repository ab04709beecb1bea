//! Fabric handles: VMM allocations shared as 64 bytes (`CUmemFabricHandle`), no descriptor ([`Fabric`]).
//! Mapped, unmapped and released with the calls of [`Vmm`](super::Vmm).

use anyhow::Result;

use super::handles::{IpcHandleBytes, RawAllocation};

/// `cuMemCreate` allocations exported and imported as fabric handles.
pub trait Fabric {
    /// The allocation granularity of `device` for fabric-shareable allocations.
    fn fabric_granularity(&self, device: i32) -> Result<usize>;
    /// `cuMemCreate` of `bytes` (a multiple of the granularity) on `device`, exportable as a fabric handle.
    /// Where the device has fabric handles but the process no IMEX channel, `CUDA_ERROR_NOT_PERMITTED`.
    fn fabric_create(&self, device: i32, bytes: usize) -> Result<RawAllocation>;
    /// `cuMemExportToShareableHandle` with `CU_MEM_HANDLE_TYPE_FABRIC`: the allocation's 64-byte handle.
    /// # Safety
    /// `allocation` came from [`Fabric::fabric_create`] and is not released.
    unsafe fn fabric_export(&self, allocation: RawAllocation) -> Result<IpcHandleBytes>;
    /// `cuMemImportFromShareableHandle` of a fabric handle. A forged handle is an error.
    fn fabric_import(&self, handle: &IpcHandleBytes) -> Result<RawAllocation>;
}
