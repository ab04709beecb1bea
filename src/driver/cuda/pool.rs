//! Memory pools (`streamOrderedAllocationIPC`): pools exportable as POSIX file descriptors, allocations
//! from them, and their pointers' export data.
//!
//! cudarc's `result` layer has the pool's creation, allocation, freeing and destruction; the export and
//! import of pools and pointers and the pool's access call `sys`, which alone has them.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use anyhow::Result;
use cudarc::driver::{result, sys};

use super::{CudaDriver, Named, check, on_device, own, pool, ptr, read_write};
use crate::driver::handles::{DevicePtr, IpcHandleBytes, RawPool};
use crate::driver::pool::Pools;

impl Pools for CudaDriver {
    fn pool_create(&self, device: i32) -> Result<RawPool> {
        // SAFETY: the structure is plain data for which all zeroes is a valid value.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        props.location = on_device(device);
        // SAFETY: reads the structure, writes one pool, destroyed by its owner.
        let created = unsafe { result::mem_pool::create(&props) }
            .named(&format!("cuMemPoolCreate(device {device}, POSIX file descriptor)"))?;
        Ok(RawPool(created as u64))
    }

    unsafe fn pool_export(&self, p: RawPool) -> Result<OwnedFd> {
        let mut fd: c_int = -1;
        let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // `sys`: no pool export in the result layer. SAFETY: for a POSIX descriptor the driver writes one
        // int; the caller keeps the pool alive.
        let rc = unsafe {
            sys::cuMemPoolExportToShareableHandle((&mut fd as *mut c_int).cast(), pool(p), posix, 0)
        };
        check(rc, "cuMemPoolExportToShareableHandle")?;
        own(fd, "cuMemPoolExportToShareableHandle")
    }

    fn pool_import(&self, fd: BorrowedFd, device: i32) -> Result<RawPool> {
        let mut imported: sys::CUmemoryPool = std::ptr::null_mut();
        let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let handle = fd.as_raw_fd() as usize as *mut c_void;
        // `sys`: no pool import in the result layer. SAFETY: for a POSIX descriptor the driver takes the int
        // itself as the "pointer"; it does not close it.
        let rc = unsafe { sys::cuMemPoolImportFromShareableHandle(&mut imported, handle, posix, 0) };
        check(rc, "cuMemPoolImportFromShareableHandle")?;
        let mut location = on_device(device);
        let mut flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        // `sys`: no pool access in the result layer. SAFETY: the pool was just imported; reads one location,
        // writes one flag value.
        check(unsafe { sys::cuMemPoolGetAccess(&mut flags, imported, &mut location) }, "cuMemPoolGetAccess")?;
        if flags != sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE {
            let access = read_write(device);
            // SAFETY: as above; reads one access descriptor.
            check(unsafe { sys::cuMemPoolSetAccess(imported, &access, 1) }, "cuMemPoolSetAccess")?;
        }
        Ok(RawPool(imported as u64))
    }

    unsafe fn pool_alloc(&self, p: RawPool, bytes: usize) -> Result<DevicePtr> {
        let null_stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the caller keeps the pool alive; writes one address, freed by pool_free.
        let address = unsafe { result::mem_pool::alloc_async(pool(p), bytes, null_stream) }
            .named(&format!("cuMemAllocFromPoolAsync({bytes} bytes)"))?;
        // SAFETY: the null stream exists as long as the context.
        unsafe { result::stream::synchronize(null_stream) }.named("cuStreamSynchronize")?;
        Ok(DevicePtr(address as u64))
    }

    unsafe fn pool_export_pointer(&self, p: DevicePtr) -> Result<IpcHandleBytes> {
        let mut data = MaybeUninit::<sys::CUmemPoolPtrExportData>::zeroed();
        // `sys`: no pointer export in the result layer. SAFETY: writes the 64 bytes of export data; the
        // caller promises a live pool allocation.
        check(unsafe { sys::cuMemPoolExportPointer(data.as_mut_ptr(), ptr(p)) }, "cuMemPoolExportPointer")?;
        // SAFETY: zero-initialised and filled by the driver; export data is plain bytes.
        Ok(unsafe { data.assume_init() }.reserved)
    }

    unsafe fn pool_import_pointer(&self, p: RawPool, data: &IpcHandleBytes) -> Result<DevicePtr> {
        let mut raw = sys::CUmemPoolPtrExportData { reserved: *data };
        let mut address: sys::CUdeviceptr = 0;
        // `sys`: no pointer import in the result layer. SAFETY: the caller promises an imported pool; reads
        // the export data, writes one address.
        let rc = unsafe { sys::cuMemPoolImportPointer(&mut address, pool(p), &mut raw) };
        check(rc, "cuMemPoolImportPointer")?;
        Ok(DevicePtr(address as u64))
    }

    unsafe fn pool_free(&self, p: DevicePtr) -> Result<()> {
        // A process's first cuMemFreeAsync costs 8-12 ms on driver 580, on any stream; cuMemFree is quicker
        // for an imported pointer, but compute-sanitizer then counts the import as leaked (H200 host, see
        // docs/measurements.md), so the documented free it is.
        let null_stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the caller frees each pointer once, with no work pending on it.
        unsafe { result::free_async(ptr(p), null_stream) }.named("cuMemFreeAsync")?;
        // SAFETY: the null stream exists as long as the context.
        unsafe { result::stream::synchronize(null_stream) }.named("cuStreamSynchronize")
    }

    unsafe fn pool_destroy(&self, p: RawPool) -> Result<()> {
        // SAFETY: the caller destroys each pool once, after freeing its allocations.
        unsafe { result::mem_pool::destroy(pool(p)) }.named("cuMemPoolDestroy")
    }
}
