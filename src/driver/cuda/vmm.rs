//! Virtual memory management (`memMapIPCDrv`): shareable physical allocations, exported and imported as
//! POSIX file descriptors, mapped in address ranges of their own.
//!
//! Every call here is `sys`: cudarc's `result` layer has none of the virtual memory management calls
//! (`cuMemCreate`, export and import, `cuMemMap` and the rest) nor `cuGetProcAddress`.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use anyhow::Result;
use cudarc::driver::sys;

use super::{CudaDriver, check, own, ptr, read_write, shareable_allocation};
use crate::driver::handles::{DevicePtr, RawAllocation};
use crate::driver::vmm::Vmm;

impl Vmm for CudaDriver {
    fn vmm_granularity(&self, device: i32) -> Result<usize> {
        let prop = shareable_allocation(device);
        let mut granularity = 0usize;
        let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: reads the structure, writes one size.
        let rc = unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, minimum) };
        check(rc, "cuMemGetAllocationGranularity")?;
        Ok(granularity.max(1))
    }

    fn vmm_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        let prop = shareable_allocation(device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: reads the structure, writes one handle, released by its owner.
        let rc = unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) };
        check(rc, &format!("cuMemCreate({bytes} bytes on device {device}, POSIX file descriptor)"))?;
        Ok(RawAllocation(handle as u64))
    }

    unsafe fn vmm_export(&self, allocation: RawAllocation) -> Result<OwnedFd> {
        let mut fd: c_int = -1;
        let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for a POSIX descriptor the driver writes one int; the caller keeps the allocation alive.
        let rc = unsafe {
            sys::cuMemExportToShareableHandle((&mut fd as *mut c_int).cast(), allocation.0 as _, posix, 0)
        };
        check(rc, "cuMemExportToShareableHandle")?;
        own(fd, "cuMemExportToShareableHandle")
    }

    fn vmm_import(&self, fd: BorrowedFd) -> Result<RawAllocation> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for a POSIX descriptor the driver takes the int itself as the "pointer"; it does not close
        // it.
        let rc = unsafe {
            sys::cuMemImportFromShareableHandle(&mut handle, fd.as_raw_fd() as usize as *mut c_void, posix)
        };
        check(rc, "cuMemImportFromShareableHandle")?;
        Ok(RawAllocation(handle as u64))
    }

    unsafe fn vmm_map(&self, allocation: RawAllocation, bytes: usize, device: i32) -> Result<DevicePtr> {
        let mut address: sys::CUdeviceptr = 0;
        // SAFETY: writes one address; the range is freed by vmm_unmap or below.
        check(unsafe { sys::cuMemAddressReserve(&mut address, bytes, 0, 0, 0) }, "cuMemAddressReserve")?;
        // SAFETY: the caller promises a live allocation of `bytes`; the range was just reserved.
        let mapped = check(unsafe { sys::cuMemMap(address, bytes, 0, allocation.0 as _, 0) }, "cuMemMap");
        let access = read_write(device);
        let usable = mapped.and_then(|()| {
            // SAFETY: the range is mapped; one access descriptor is read.
            let rc = unsafe { sys::cuMemSetAccess(address, bytes, &access, 1) };
            check(rc, "cuMemSetAccess")
        });
        if let Err(e) = usable {
            // SAFETY: undoes what succeeded above, on a range nothing else knows.
            unsafe {
                sys::cuMemUnmap(address, bytes);
                sys::cuMemAddressFree(address, bytes);
            }
            return Err(e);
        }
        Ok(DevicePtr(address as u64))
    }

    unsafe fn vmm_unmap(&self, p: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the caller promises one live mapping of `bytes` at `p`, with no work pending.
        check(unsafe { sys::cuMemUnmap(ptr(p), bytes) }, "cuMemUnmap")?;
        // SAFETY: the range was reserved by vmm_map and is unmapped now.
        check(unsafe { sys::cuMemAddressFree(ptr(p), bytes) }, "cuMemAddressFree")
    }

    unsafe fn vmm_release(&self, allocation: RawAllocation) -> Result<()> {
        // SAFETY: the caller releases each allocation once.
        check(unsafe { sys::cuMemRelease(allocation.0 as _) }, "cuMemRelease")
    }

    unsafe fn vmm_granularity_of(&self, allocation: RawAllocation) -> Result<usize> {
        // SAFETY: the structure is plain data for which all zeroes is a valid value; the driver fills it.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: the caller promises a live allocation; the driver writes one structure.
        let rc = unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&mut prop, allocation.0 as _) };
        check(rc, "cuMemGetAllocationPropertiesFromHandle")?;
        let mut granularity = 0usize;
        let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        // SAFETY: reads the structure, writes one size.
        let rc = unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, minimum) };
        check(rc, "cuMemGetAllocationGranularity")?;
        Ok(granularity.max(1))
    }
}
