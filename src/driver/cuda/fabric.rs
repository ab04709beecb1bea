//! Fabric handles: `cuMemCreate` allocations exportable as a 64-byte `CUmemFabricHandle` instead of a
//! descriptor. The CUDA 11.4 bindings this
//! program is built with (so that old drivers still load it) lack the few names this needs; they are
//! defined here, with the values of CUDA 12.3's `cuda.h`, where fabric handles came in.
//!
//! Every call here is `sys`: cudarc's `result` layer has none of the virtual memory management calls nor
//! `cuGetProcAddress`, and its `device::get_attribute` takes the 11.4 enum, which lacks the attribute.

use std::ffi::{c_int, c_void};

use anyhow::{Result, bail};
use cudarc::driver::sys::{self, CUresult};

use super::{CudaDriver, allocation_prop, check};
use crate::driver::fabric::Fabric;
use crate::driver::handles::{IPC_HANDLE_SIZE, IpcHandleBytes, RawAllocation};

/// `CU_MEM_HANDLE_TYPE_FABRIC = 0x8` of `CUmemAllocationHandleType` (CUDA 12.3 `cuda.h`).
const HANDLE_TYPE_FABRIC: sys::CUmemAllocationHandleType = sys::CUmemAllocationHandleType(0x8);

/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 128` of `CUdevice_attribute` (CUDA 12.3 `cuda.h`).
/// The 11.4 bindings' `CUdevice_attribute` is a Rust enum without it, so it is passed as the C int it is,
/// through an entry point of that signature (see [`attribute_by_number`]).
const ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: c_int = 128;

/// `CUmemFabricHandle` (CUDA 12.3 `cuda.h`): `struct CUmemFabricHandle_st { unsigned char
/// data[CU_IPC_HANDLE_SIZE]; }`, 64 bytes, what the segment's slot carries.
#[repr(C)]
struct CUmemFabricHandle {
    data: [u8; IPC_HANDLE_SIZE],
}

/// `cuDeviceGetAttribute` with the attribute as a C int: `CUresult (int *, CUdevice_attribute, CUdevice)`.
type GetAttribute = unsafe extern "C" fn(*mut c_int, c_int, sys::CUdevice) -> CUresult;

/// `attribute` of `device`, by its number: `None` where the driver does not know the attribute (drivers
/// older than CUDA 12.3 answer `CUDA_ERROR_INVALID_VALUE`).
pub(super) fn attribute_by_number(device: i32, attribute: c_int) -> Result<Option<i32>> {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    // SAFETY: the name is NUL-terminated; the driver writes one function pointer or leaves it null.
    let rc = unsafe { sys::cuGetProcAddress(c"cuDeviceGetAttribute".as_ptr(), &mut pfn, 11040, 0) };
    check(rc, "cuGetProcAddress(\"cuDeviceGetAttribute\", CUDA 11.4)")?;
    if pfn.is_null() {
        bail!("this driver has no cuDeviceGetAttribute");
    }
    // SAFETY: cuGetProcAddress returned the entry point of that name, whose C signature is
    // CUresult (int *, CUdevice_attribute, CUdevice), and a C enum is passed as an int.
    let get = unsafe { std::mem::transmute::<*mut c_void, GetAttribute>(pfn) };
    let mut value: c_int = 0;
    // SAFETY: writes one int; an unknown attribute or device is reported as an error.
    let rc = unsafe { get(&mut value, attribute, device) };
    if rc == CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(None);
    }
    check(rc, &format!("cuDeviceGetAttribute(attribute {attribute}, device {device})"))?;
    Ok(Some(value))
}

/// Whether `device` reports fabric handles; no where the driver does not know the attribute.
pub(super) fn supported(device: i32) -> Result<bool> {
    Ok(attribute_by_number(device, ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)?.is_some_and(|v| v != 0))
}

impl Fabric for CudaDriver {
    fn fabric_granularity(&self, device: i32) -> Result<usize> {
        let prop = allocation_prop(device, HANDLE_TYPE_FABRIC);
        let mut granularity = 0usize;
        let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: reads the structure, writes one size.
        let rc = unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, minimum) };
        check(rc, "cuMemGetAllocationGranularity(fabric)")?;
        Ok(granularity.max(1))
    }

    fn fabric_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        let prop = allocation_prop(device, HANDLE_TYPE_FABRIC);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: reads the structure, writes one handle, released by its owner.
        let rc = unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) };
        check(rc, &format!("cuMemCreate({bytes} bytes on device {device}, fabric handle)"))?;
        Ok(RawAllocation(handle as u64))
    }

    unsafe fn fabric_export(&self, allocation: RawAllocation) -> Result<IpcHandleBytes> {
        let mut fabric = CUmemFabricHandle { data: [0; IPC_HANDLE_SIZE] };
        // SAFETY: for a fabric handle the driver writes one CUmemFabricHandle; the caller keeps the
        // allocation alive.
        let rc = unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fabric as *mut CUmemFabricHandle).cast(),
                allocation.0 as _,
                HANDLE_TYPE_FABRIC,
                0,
            )
        };
        check(rc, "cuMemExportToShareableHandle(fabric)")?;
        Ok(fabric.data)
    }

    fn fabric_import(&self, handle: &IpcHandleBytes) -> Result<RawAllocation> {
        let mut fabric = CUmemFabricHandle { data: *handle };
        let mut allocation: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: for a fabric handle the driver reads one CUmemFabricHandle at the pointer (a forged one is
        // an error) and writes one allocation handle, released by its owner.
        let rc = unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut allocation,
                (&mut fabric as *mut CUmemFabricHandle).cast(),
                HANDLE_TYPE_FABRIC,
            )
        };
        check(rc, "cuMemImportFromShareableHandle(fabric)")?;
        Ok(RawAllocation(allocation as u64))
    }
}
