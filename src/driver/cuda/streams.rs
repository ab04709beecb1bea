//! Streams and the work put on them: event records and waits, the kernel (loaded once per context),
//! device copies and fills, and the `_v2` stream memory operations, found through `cuGetProcAddress`.

use std::ffi::{CStr, c_int, c_uint, c_void};

use anyhow::{Result, anyhow, bail};
use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::sys::{self, CUresult};

use super::{CudaDriver, Named, check, event, ptr, ready, stream};
use crate::driver::{DevicePtr, RawEvent, RawFunction, RawStream};

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
    pub(super) fn memops(&self) -> Result<&StreamMemops> {
        let found = self.memops.get_or_init(|| {
            let write = proc_address(c"cuStreamWriteValue32").map_err(|e| format!("{e:#}"))?;
            let wait = proc_address(c"cuStreamWaitValue32").map_err(|e| format!("{e:#}"))?;
            Ok(StreamMemops { write, wait })
        });
        found.as_ref().map_err(|e| anyhow!("{e}"))
    }
}

pub(super) unsafe fn record_event(e: RawEvent, s: RawStream) -> Result<()> {
    // SAFETY: both handles are alive (borrowed from their owners by the caller).
    unsafe { result::event::record(event(e), stream(s)) }.named("cuEventRecord")
}

pub(super) fn create_non_blocking_stream() -> Result<RawStream> {
    // Destroyed by its owner.
    let s = result::stream::create(StreamKind::NonBlocking).named("cuStreamCreate(NonBlocking)")?;
    Ok(RawStream(s as u64))
}

pub(super) unsafe fn destroy_stream(s: RawStream) -> Result<()> {
    // SAFETY: the owner destroys the stream once.
    unsafe { result::stream::destroy(stream(s)) }.named("cuStreamDestroy")
}

pub(super) unsafe fn wait_event(s: RawStream, e: RawEvent) -> Result<()> {
    let flags = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
    // SAFETY: both handles are alive; the flags are 0.
    unsafe { result::stream::wait_event(stream(s), event(e), flags) }.named("cuStreamWaitEvent")
}

pub(super) unsafe fn query_stream(s: RawStream) -> Result<bool> {
    // `sys`: the result layer has no cuStreamQuery. SAFETY: the caller keeps the stream alive.
    ready(unsafe { sys::cuStreamQuery(stream(s)) }.result(), "cuStreamQuery")
}

pub(super) fn load_kernel(d: &CudaDriver, image: &[u8], name: &CStr) -> Result<RawFunction> {
    let ctx = d.current_context()?;
    let mut kernels = d.kernels.lock().map_err(|_| anyhow!("kernel table poisoned"))?;
    if let Some(&(_, f)) = kernels.get(&ctx) {
        return Ok(f);
    }
    const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    let fatbin = image.len() >= 16 && image[..4] == FATBIN_MAGIC;
    if !fatbin && image.last() != Some(&0) {
        bail!("a kernel image must be a fatbin or NUL-terminated PTX");
    }
    // The image is copied to 8-byte aligned memory: a fatbin must be aligned, include_bytes! is not.
    let mut aligned = vec![0u64; image.len().div_ceil(8)];
    // SAFETY: `aligned` has at least image.len() bytes, and u64 has no invalid bit patterns.
    unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), image.len()) };
    // SAFETY: the image is a fatbin (its header gives its size) or NUL-terminated PTX (both checked
    // above), so the driver reads no further than it; it copies what it needs.
    let module = unsafe { result::module::load_data(aligned.as_ptr().cast::<c_void>()) }
        .named(&format!("cuModuleLoadData({name:?})"))?;
    // SAFETY: the module was just loaded; the function lives as long as it (unloaded in Drop).
    let found = unsafe { result::module::get_function(module, name.to_owned()) }
        .named(&format!("cuModuleGetFunction({name:?})"));
    let f = match found {
        Ok(f) => f,
        Err(e) => {
            // SAFETY: the module was just loaded and nothing refers to it; the first error is the one told.
            let _ = unsafe { result::module::unload(module) };
            return Err(e);
        }
    };
    kernels.insert(ctx, (module as usize, RawFunction(f as u64)));
    Ok(RawFunction(f as u64))
}

pub(super) unsafe fn max_active_blocks_per_multiprocessor(kernel: RawFunction, block: u32) -> Result<u32> {
    let function = kernel.0 as sys::CUfunction;
    // SAFETY: the caller promises the function comes from load_kernel, whose module is still loaded; no
    // dynamic shared memory.
    let blocks =
        unsafe { result::occupancy::max_active_block_per_multiprocessor(function, block as c_int, 0) }
            .named("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
    Ok(blocks.max(0) as u32)
}

pub(super) unsafe fn launch_ptr_int_char(
    kernel: RawFunction,
    grid: u32,
    block: u32,
    s: RawStream,
    (target, size, value): (DevicePtr, i32, u8),
) -> Result<()> {
    let mut target = ptr(target);
    let mut size: c_int = size;
    let mut value = value as std::ffi::c_char;
    let mut params: [*mut c_void; 3] = [
        (&mut target as *mut sys::CUdeviceptr).cast(),
        (&mut size as *mut c_int).cast(),
        (&mut value as *mut std::ffi::c_char).cast(),
    ];
    let function = kernel.0 as sys::CUfunction;
    // SAFETY: the caller promises a (char *, int, char) kernel and a live range; the parameters outlive
    // the call (the driver copies them at launch). No shared memory, no `extra`.
    unsafe { result::launch_kernel(function, (grid, 1, 1), (block, 1, 1), 0, stream(s), &mut params) }
        .named("cuLaunchKernel(simpleKernel)")
}

pub(super) unsafe fn copy_device_to_device(
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    s: RawStream,
) -> Result<()> {
    // SAFETY: both are live device allocations or mappings of at least `bytes` bytes, held by the caller
    // until the stream is synchronised.
    unsafe { result::memcpy_dtod_async(ptr(dst), ptr(src), bytes, stream(s)) }.named("cuMemcpyDtoDAsync")
}

pub(super) unsafe fn fill(dst: DevicePtr, value: u8, bytes: usize, s: RawStream) -> Result<()> {
    // SAFETY: `dst` is a live device allocation or mapping of at least `bytes` bytes, held by the caller.
    unsafe { result::memset_d8_async(ptr(dst), value, bytes, stream(s)) }.named("cuMemsetD8Async")
}

pub(super) fn memops_unsupported(d: &CudaDriver, device: i32) -> Result<Option<String>> {
    // The v2 operations are the driver's, for every device (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS
    // concerns the v1 ones, which driver 580 refuses); what can be missing is the entry points.
    Ok(d.memops().err().map(|e| format!("device {device}: no stream memory operations: {e:#}")))
}

pub(super) unsafe fn write_u32(d: &CudaDriver, s: RawStream, p: DevicePtr, value: u32) -> Result<()> {
    let write = d.memops()?.write;
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as c_uint;
    // An entry point from cuGetProcAddress: the result layer has no stream memory operations.
    // SAFETY: the caller keeps the stream and the 4-aligned word alive until the write has run.
    check(unsafe { write(stream(s), ptr(p), value, flags) }, "cuStreamWriteValue32_v2")
}

pub(super) unsafe fn wait_u32_geq(d: &CudaDriver, s: RawStream, p: DevicePtr, value: u32) -> Result<()> {
    let wait = d.memops()?.wait;
    let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as c_uint;
    // SAFETY: as above.
    check(unsafe { wait(stream(s), ptr(p), value, flags) }, "cuStreamWaitValue32_v2")
}
