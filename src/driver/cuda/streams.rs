//! Streams and the work put on them: event records and waits, device copies and fills, and the `_v2`
//! stream memory operations, found through `cuGetProcAddress`.

use std::ffi::{CStr, c_uint, c_void};

use anyhow::{Result, anyhow, bail};
use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::sys::{self, CUresult};

use super::{CudaDriver, Named, check, event, ptr, ready, stream};
use crate::driver::handles::{DevicePtr, RawEvent, RawStream};
use crate::driver::streams::Streams;

/// `cuStreamWriteValue32_v2` / `cuStreamWaitValue32_v2`.
type StreamValue32 = unsafe extern "C" fn(sys::CUstream, sys::CUdeviceptr, u32, c_uint) -> CUresult;

/// The `_v2` stream memory operations, found through `cuGetProcAddress` (so that a driver without them is a
/// reason to waive, not a missing symbol), or why they are not there.
pub(super) struct StreamMemops {
    write: StreamValue32,
    wait: StreamValue32,
}

/// Looks `symbol` up at the CUDA 12.0 version of its API (the `_v2` one for the stream memory operations).
fn proc_address(symbol: &CStr) -> Result<StreamValue32> {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    // `sys`: the result layer has no cuGetProcAddress. SAFETY: the name is NUL-terminated; the driver
    // writes one function pointer or leaves it null.
    let rc = unsafe { sys::cuGetProcAddress(symbol.as_ptr(), &mut pfn, 12000, 0) };
    check(rc, &format!("cuGetProcAddress({symbol:?}, CUDA 12.0)"))?;
    if pfn.is_null() {
        bail!("this driver has no CUDA 12.0 version of {symbol:?}");
    }
    // SAFETY: cuGetProcAddress returned the entry point of that name and version, whose C signature is
    // CUresult (CUstream, CUdeviceptr, cuuint32_t, unsigned int).
    Ok(unsafe { std::mem::transmute::<*mut c_void, StreamValue32>(pfn) })
}

impl CudaDriver {
    fn memops(&self) -> Result<&StreamMemops> {
        let found = self.memops.get_or_init(|| {
            let write = proc_address(c"cuStreamWriteValue32").map_err(|e| format!("{e:#}"))?;
            let wait = proc_address(c"cuStreamWaitValue32").map_err(|e| format!("{e:#}"))?;
            Ok(StreamMemops { write, wait })
        });
        found.as_ref().map_err(|e| anyhow!("{e}"))
    }
}

impl Streams for CudaDriver {
    fn create_non_blocking_stream(&self) -> Result<RawStream> {
        // Destroyed by its owner.
        let s = result::stream::create(StreamKind::NonBlocking).named("cuStreamCreate(NonBlocking)")?;
        Ok(RawStream(s as u64))
    }

    unsafe fn destroy_stream(&self, s: RawStream) -> Result<()> {
        // SAFETY: the owner destroys the stream once.
        unsafe { result::stream::destroy(stream(s)) }.named("cuStreamDestroy")
    }

    unsafe fn query_stream(&self, s: RawStream) -> Result<bool> {
        // `sys`: the result layer has no cuStreamQuery. SAFETY: the caller keeps the stream alive.
        ready(unsafe { sys::cuStreamQuery(stream(s)) }.result(), "cuStreamQuery")
    }

    unsafe fn record_event(&self, e: RawEvent, s: RawStream) -> Result<()> {
        // SAFETY: both handles are alive (borrowed from their owners by the caller).
        unsafe { result::event::record(event(e), stream(s)) }.named("cuEventRecord")
    }

    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        let flags = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: both handles are alive; the flags are 0.
        unsafe { result::stream::wait_event(stream(s), event(e), flags) }.named("cuStreamWaitEvent")
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: both are live device allocations or mappings of at least `bytes` bytes, held by the caller
        // until the stream is synchronised.
        unsafe { result::memcpy_dtod_async(ptr(dst), ptr(src), bytes, stream(s)) }.named("cuMemcpyDtoDAsync")
    }

    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, s: RawStream) -> Result<()> {
        // SAFETY: `dst` is a live device allocation or mapping of at least `bytes` bytes, held by the caller.
        unsafe { result::memset_d8_async(ptr(dst), value, bytes, stream(s)) }.named("cuMemsetD8Async")
    }

    fn stream_memops_unsupported(&self, device: i32) -> Result<Option<String>> {
        // The v2 operations are the driver's, for every device (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS
        // concerns the v1 ones, which driver 580 refuses); what can be missing is the entry points.
        Ok(self.memops().err().map(|e| format!("device {device}: no stream memory operations: {e:#}")))
    }

    unsafe fn stream_write_u32(&self, s: RawStream, p: DevicePtr, value: u32) -> Result<()> {
        let write = self.memops()?.write;
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as c_uint;
        // An entry point from cuGetProcAddress: the result layer has no stream memory operations.
        // SAFETY: the caller keeps the stream and the 4-aligned word alive until the write has run.
        check(unsafe { write(stream(s), ptr(p), value, flags) }, "cuStreamWriteValue32_v2")
    }

    unsafe fn stream_wait_u32_geq(&self, s: RawStream, p: DevicePtr, value: u32) -> Result<()> {
        let wait = self.memops()?.wait;
        let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as c_uint;
        // SAFETY: as above.
        check(unsafe { wait(stream(s), ptr(p), value, flags) }, "cuStreamWaitValue32_v2")
    }
}
