//! The devices: their count, names and attributes, peer access, and the primary context made current on
//! the calling thread; what a device offers before a mechanism is used.

use std::ffi::{CStr, c_int};

use anyhow::Result;
use cudarc::driver::result;
use cudarc::driver::sys::{self, CUresult};

use super::{CudaDriver, Named, check};
use crate::driver::devices::{Capability, DeviceInfo, Devices, mig_device_named};

/// `cuDriverGetVersion`, which needs no initialised driver: [`super::symbols`] asks it too.
pub(super) fn driver_version() -> Result<i32> {
    let mut version: c_int = 0;
    // `sys`: the result layer has no cuDriverGetVersion. SAFETY: writes one int.
    check(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion")?;
    Ok(version)
}

impl Devices for CudaDriver {
    /// The contexts and modules are left to the process's exit, which reclaims them as its descriptors of
    /// the driver close: on the H200 host a run of 16 processes ended about 60 ms sooner (cold and warm)
    /// than when each child released its context first, as each release waits its turn in the driver.
    fn end_with_the_process(self: Box<Self>) {
        std::mem::forget(self)
    }

    fn version(&self) -> Result<i32> {
        driver_version()
    }

    fn device_count(&self) -> Result<i32> {
        result::device::get_count().named("cuDeviceGetCount")
    }

    fn device_info(&self, device: i32) -> Result<DeviceInfo> {
        use sys::CUdevice_attribute::*;
        // Up to 127 bytes of the name (the driver truncates and NUL-terminates it; device names are short).
        let name = result::device::get_name(device).named("cuDeviceGetName")?;
        let mut bus = [0 as std::ffi::c_char; 32];
        // `sys`: the result layer has no cuDeviceGetPCIBusId. SAFETY: the driver writes at most `len` bytes,
        // NUL included; a device without a PCI address answers with an error, kept as None.
        let pci_bus_id = (unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 32, device) }
            == CUresult::CUDA_SUCCESS)
            // SAFETY: the call succeeded and NUL-terminated the buffer.
            .then(|| unsafe { CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned());
        let uuid = result::device::get_uuid(device).named("cuDeviceGetUuid")?;
        Ok(DeviceInfo {
            name,
            uuid: uuid.bytes.map(|b| b as u8),
            unified_addressing: self.attribute(device, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0,
            default_compute_mode: self.attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)?
                == sys::CUcomputemode::CU_COMPUTEMODE_DEFAULT as i32,
            multiprocessors: self.attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as u32,
            pci_bus_id,
            l2_cache_bytes: self.attribute(device, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as u64,
            mig: mig_device_named(device),
        })
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        let mut can: c_int = 0;
        // `sys`: the result layer has no peer access. SAFETY: writes one int.
        check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, peer) }, "cuDeviceCanAccessPeer")?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        let peer_ctx = self.primary_context(peer)?;
        // `sys`: the result layer has no peer access. SAFETY: both contexts are retained primary contexts;
        // flags must be 0.
        let rc = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
        if rc == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(rc, &format!("cuCtxEnablePeerAccess(peer device {peer})"))
    }

    fn use_device(&self, device: i32) -> Result<()> {
        let ctx = self.primary_context(device)?;
        // SAFETY: ctx is a primary context this driver retained.
        unsafe { result::ctx::set_current(ctx) }.named(&format!("cuCtxSetCurrent(device {device})"))
    }

    fn supports(&self, device: i32, what: Capability) -> Result<bool> {
        use sys::CUdevice_attribute::*;
        Ok(match what {
            Capability::VirtualMemory => {
                self.attribute(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED)? != 0
            }
            Capability::PosixFdHandles => {
                self.attribute(device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)? != 0
            }
            Capability::MemoryPools => {
                self.attribute(device, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0
            }
            Capability::PoolPosixFdHandles => {
                let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as i32;
                self.attribute(device, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES)? & posix != 0
            }
            Capability::FabricHandles => super::fabric::supported(device)?,
            // CU_DEVICE_ATTRIBUTE_MPS_ENABLED (133, CUDA 12.x): by number, as the crate's CUDA 11.4 bindings
            // lack it; a driver that does not know it has no word, taken as no.
            Capability::MpsEnabled => {
                super::fabric::attribute_by_number(device, 133)?.is_some_and(|v| v != 0)
            }
        })
    }
}
