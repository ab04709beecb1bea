//! Plain device memory (`cuMemAlloc`), the synchronous copy out of it to the host, and pinned host memory.

use anyhow::Result;
use cudarc::driver::result;
use cudarc::driver::sys::{self, CUresult};

use super::{CudaDriver, Named, check, ptr};
use crate::driver::handles::DevicePtr;
use crate::driver::memory::Memory;

impl Memory for CudaDriver {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        // SAFETY: writes one device address; freed by the owner through `free`.
        let p = unsafe { result::malloc_sync(bytes) }.named(&format!("cuMemAlloc({bytes} bytes)"))?;
        Ok(DevicePtr(p as u64))
    }

    unsafe fn free(&self, p: DevicePtr) -> Result<()> {
        // SAFETY: the caller (gpu::DeviceBuffer) frees each allocation once.
        unsafe { result::free_sync(ptr(p)) }.named("cuMemFree")
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: `dst` is exclusively borrowed for the call, and cuMemcpyDtoH returns only once the copy has
        // completed or failed, so the device never writes into `dst` after the borrow ends; the caller
        // promises `src` has dst.len() bytes.
        unsafe { result::memcpy_dtoh_sync(dst, ptr(src)) }.named("cuMemcpyDtoH")
    }

    unsafe fn pin_host_memory(&self, host: &mut [u8]) -> Result<bool> {
        // `sys`: the result layer has no host registration. SAFETY: registers a live host range; the caller
        // unregisters it before the memory goes away.
        let rc = unsafe { sys::cuMemHostRegister_v2(host.as_mut_ptr().cast(), host.len(), 0) };
        if rc == CUresult::CUDA_ERROR_NOT_SUPPORTED || rc == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Ok(false);
        }
        check(rc, "cuMemHostRegister")?;
        Ok(true)
    }

    unsafe fn unpin_host_memory(&self, host: &mut [u8]) -> Result<()> {
        // `sys`, as above. SAFETY: the range was registered by pin_host_memory.
        check(unsafe { sys::cuMemHostUnregister(host.as_mut_ptr().cast()) }, "cuMemHostUnregister")
    }
}
