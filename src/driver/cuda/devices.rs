//! The devices: their count, names and attributes, peer access, and the primary context made current on
//! the calling thread; what a device offers before a mechanism is used.

use std::ffi::{CStr, c_int};

use anyhow::Result;
use cudarc::driver::sys::{self, CUresult};

use super::{CudaDriver, check};
use crate::driver::{Capability, DeviceInfo};

pub(super) fn version() -> Result<i32> {
    let mut version: c_int = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion")?;
    Ok(version)
}

pub(super) fn device_count() -> Result<i32> {
    let mut count: c_int = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceGetCount(&mut count) }, "cuDeviceGetCount")?;
    Ok(count)
}

pub(super) fn device_info(d: &CudaDriver, device: i32) -> Result<DeviceInfo> {
    use sys::CUdevice_attribute::*;
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most `len` bytes, NUL included.
    check(unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, device) }, "cuDeviceGetName")?;
    // SAFETY: cuDeviceGetName NUL-terminated the buffer.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
    let mut bus = [0 as std::ffi::c_char; 32];
    // SAFETY: as above; a device without a PCI address answers with an error, kept as None.
    let pci_bus_id = (unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 32, device) }
        == CUresult::CUDA_SUCCESS)
        // SAFETY: the call succeeded and NUL-terminated the buffer.
        .then(|| unsafe { CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned());
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: writes one 16-byte UUID.
    check(unsafe { sys::cuDeviceGetUuid(&mut uuid, device) }, "cuDeviceGetUuid")?;
    Ok(DeviceInfo {
        name,
        uuid: uuid.bytes.map(|b| b as u8),
        unified_addressing: d.attribute(device, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0,
        default_compute_mode: d.attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)?
            == sys::CUcomputemode::CU_COMPUTEMODE_DEFAULT as i32,
        multiprocessors: d.attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as u32,
        pci_bus_id,
        l2_cache_bytes: d.attribute(device, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as u64,
    })
}

pub(super) fn can_access_peer(device: i32, peer: i32) -> Result<bool> {
    let mut can: c_int = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, peer) }, "cuDeviceCanAccessPeer")?;
    Ok(can != 0)
}

pub(super) fn enable_peer_access(d: &CudaDriver, peer: i32) -> Result<()> {
    let peer_ctx = d.primary_context(peer)?;
    // SAFETY: both contexts are retained primary contexts; flags must be 0.
    let rc = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
    if rc == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check(rc, &format!("cuCtxEnablePeerAccess(peer device {peer})"))
}

pub(super) fn use_device(d: &CudaDriver, device: i32) -> Result<()> {
    let ctx = d.primary_context(device)?;
    // SAFETY: ctx is a primary context this driver retained.
    check(unsafe { sys::cuCtxSetCurrent(ctx) }, &format!("cuCtxSetCurrent(device {device})"))
}

pub(super) fn supports(d: &CudaDriver, device: i32, what: Capability) -> Result<bool> {
    use sys::CUdevice_attribute::*;
    Ok(match what {
        Capability::VirtualMemory => {
            d.attribute(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? != 0
        }
        Capability::PosixFdHandles => {
            d.attribute(device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)? != 0
        }
        Capability::MemoryPools => d.attribute(device, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0,
        Capability::PoolPosixFdHandles => {
            let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as i32;
            d.attribute(device, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES)? & posix != 0
        }
        Capability::FabricHandles => super::fabric::supported(d, device)?,
    })
}
