//! The [`Driver`] of real GPUs: the CUDA driver API through cudarc's raw bindings, loaded at run time.
//!
//! This module is where the program's CUDA `unsafe` lives. Each call goes through [`check`], which turns a
//! `CUresult` into an error that names the call and the driver's own words for what went wrong.

use std::collections::HashMap;
use std::ffi::{CStr, c_int, c_uint, c_void};
use std::mem::MaybeUninit;
use std::sync::Mutex;

use anyhow::{Result, anyhow, bail};
use cudarc::driver::sys::{self, CUresult};

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::{
    CallFailed, Capability, DeviceInfo, DevicePtr, Driver, IpcHandleBytes, RawAllocation, RawEvent,
    RawFunction, RawPool, RawStream, Unavailable,
};

/// `cuStreamWriteValue32_v2` / `cuStreamWaitValue32_v2`.
type StreamValue32 = unsafe extern "C" fn(sys::CUstream, sys::CUdeviceptr, u32, c_uint) -> CUresult;

/// The `_v2` stream memory operations, found through `cuGetProcAddress` (so that a driver without them is a
/// reason to waive, not a missing symbol), or why they are not there.
struct StreamMemops {
    write: StreamValue32,
    wait: StreamValue32,
}

/// Looks `symbol` up at the CUDA 12.0 version of its API (the `_v2` one for the stream memory operations).
fn proc_address(symbol: &CStr) -> Result<StreamValue32> {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    // SAFETY: the name is NUL-terminated; the driver writes one function pointer or leaves it null.
    let rc = unsafe { sys::cuGetProcAddress(symbol.as_ptr(), &mut pfn, 12000, 0) };
    check(rc, &format!("cuGetProcAddress({symbol:?}, CUDA 12.0)"))?;
    if pfn.is_null() {
        bail!("this driver has no CUDA 12.0 version of {symbol:?}");
    }
    // SAFETY: cuGetProcAddress returned the entry point of that name and version, whose C signature is
    // CUresult (CUstream, CUdeviceptr, cuuint32_t, unsigned int).
    Ok(unsafe { std::mem::transmute::<*mut c_void, StreamValue32>(pfn) })
}

/// The CUDA driver, initialised, with the primary contexts this process retained.
pub struct CudaDriver {
    /// Primary context of each device used so far, released on drop.
    contexts: Mutex<HashMap<i32, usize>>,
    /// Loaded `simpleKernel` per context (one module per device the process uses).
    kernels: Mutex<HashMap<usize, (usize, RawFunction)>>,
    /// The stream memory operations, looked up on first use.
    memops: std::sync::OnceLock<Result<StreamMemops, String>>,
}

/// Turns a driver result into an error naming `what` was called.
fn check(result: CUresult, what: &str) -> Result<()> {
    if result == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(CallFailed { call: what.to_owned(), code: result as u32, text: describe(result) }.into())
}

/// A query's answer: done (`Ok(true)`), not yet (`CUDA_ERROR_NOT_READY`), or an error.
fn ready(result: CUresult, what: &str) -> Result<bool> {
    if result == CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check(result, what).map(|()| true)
}

/// `CUDA_ERROR_INVALID_VALUE (1): invalid argument`, in the driver's words.
pub fn describe(result: CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both calls only write a pointer to a static string into the out-parameter, or leave it null.
    let (name_rc, text_rc) =
        unsafe { (sys::cuGetErrorName(result, &mut name), sys::cuGetErrorString(result, &mut text)) };
    let read = |rc: CUresult, p: *const std::ffi::c_char| {
        if rc != CUresult::CUDA_SUCCESS || p.is_null() {
            None
        } else {
            // SAFETY: the driver returned a pointer to a NUL-terminated static string.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    };
    let code = result as u32;
    match (read(name_rc, name), read(text_rc, text)) {
        (Some(n), Some(t)) => format!("{n} ({code}): {t}"),
        (Some(n), None) => format!("{n} ({code})"),
        _ => format!("CUDA error {code}"),
    }
}

/// Results of `cuInit` that mean "no usable GPU or driver here": the run is waived, not failed. By number,
/// since the oldest bindings lack some names: STUB_LIBRARY (34), DEVICE_UNAVAILABLE (46), NO_DEVICE (100),
/// SYSTEM_DRIVER_MISMATCH (803), COMPAT_NOT_SUPPORTED_ON_DEVICE (804).
fn means_no_gpu(result: CUresult) -> bool {
    matches!(result as u32, 34 | 46 | 100 | 803 | 804)
}

impl CudaDriver {
    /// Loads `libcuda` and initialises it; `Unavailable` when this machine has no usable GPU.
    pub fn load() -> Result<Self> {
        // SAFETY: only tries to dlopen the library by its usual names; nothing is called through it.
        if !unsafe { sys::is_culib_present() } {
            return Err(Unavailable("no CUDA driver library (libcuda.so) on this machine".into()).into());
        }
        // SAFETY: cuInit takes flags (must be 0) and has no other preconditions.
        let rc = unsafe { sys::cuInit(0) };
        if means_no_gpu(rc) {
            return Err(Unavailable(format!("the CUDA driver has no GPU to offer: {}", describe(rc))).into());
        }
        check(rc, "cuInit")?;
        Ok(Self {
            contexts: Mutex::new(HashMap::new()),
            kernels: Mutex::new(HashMap::new()),
            memops: std::sync::OnceLock::new(),
        })
    }

    fn attribute(&self, device: i32, attribute: sys::CUdevice_attribute) -> Result<i32> {
        let mut value: c_int = 0;
        // SAFETY: writes one int; an invalid device is reported as an error.
        check(unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, device) }, "cuDeviceGetAttribute")?;
        Ok(value)
    }

    fn primary_context(&self, device: i32) -> Result<sys::CUcontext> {
        let mut contexts = self.contexts.lock().map_err(|_| anyhow!("context table poisoned"))?;
        if let Some(&ctx) = contexts.get(&device) {
            return Ok(ctx as sys::CUcontext);
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle, released in Drop.
        let rc = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, device) };
        check(rc, &format!("cuDevicePrimaryCtxRetain(device {device})"))?;
        contexts.insert(device, ctx as usize);
        Ok(ctx)
    }

    fn memops(&self) -> Result<&StreamMemops> {
        let found = self.memops.get_or_init(|| {
            let write = proc_address(c"cuStreamWriteValue32").map_err(|e| format!("{e:#}"))?;
            let wait = proc_address(c"cuStreamWaitValue32").map_err(|e| format!("{e:#}"))?;
            Ok(StreamMemops { write, wait })
        });
        found.as_ref().map_err(|e| anyhow!("{e}"))
    }

    fn current_context(&self) -> Result<usize> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle (null when none is current).
        check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
        if ctx.is_null() {
            bail!("no device is current on this thread");
        }
        Ok(ctx as usize)
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        for (module, _) in kernels.drain().map(|(_, v)| v) {
            // SAFETY: the module was loaded by this driver and no launch can follow: the driver is going away.
            unsafe { sys::cuModuleUnload(module as sys::CUmodule) };
        }
        let mut contexts = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        for (device, _) in contexts.drain() {
            // SAFETY: balances the one cuDevicePrimaryCtxRetain made for this device.
            unsafe { sys::cuDevicePrimaryCtxRelease_v2(device) };
        }
    }
}

/// Where a device's memory is, for the VMM and pool structures.
fn on_device(device: i32) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device }
}

/// A shareable allocation on `device`: pinned device memory, exportable as a POSIX file descriptor.
fn shareable_allocation(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: the structure is plain data for which all zeroes is a valid value (no flags, null pointers).
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = on_device(device);
    prop
}

/// Read and write access for `device`.
fn read_write(device: i32) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: on_device(device),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// Takes ownership of a descriptor the driver returned as an int.
fn own(fd: c_int, what: &str) -> Result<OwnedFd> {
    if fd < 0 {
        bail!("{what} returned no descriptor ({fd})");
    }
    // SAFETY: the driver just created this descriptor for the caller, who is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pool(p: RawPool) -> sys::CUmemoryPool {
    p.0 as sys::CUmemoryPool
}

fn ptr(p: DevicePtr) -> sys::CUdeviceptr {
    p.0 as sys::CUdeviceptr
}
fn event(e: RawEvent) -> sys::CUevent {
    e.0 as sys::CUevent
}
fn stream(s: RawStream) -> sys::CUstream {
    s.0 as sys::CUstream
}

impl Driver for CudaDriver {
    fn version(&self) -> Result<i32> {
        let mut version: c_int = 0;
        // SAFETY: writes one int.
        check(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion")?;
        Ok(version)
    }

    fn device_count(&self) -> Result<i32> {
        let mut count: c_int = 0;
        // SAFETY: writes one int.
        check(unsafe { sys::cuDeviceGetCount(&mut count) }, "cuDeviceGetCount")?;
        Ok(count)
    }

    fn device_info(&self, device: i32) -> Result<DeviceInfo> {
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
        Ok(DeviceInfo {
            name,
            unified_addressing: self.attribute(device, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0,
            default_compute_mode: self.attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE)?
                == sys::CUcomputemode::CU_COMPUTEMODE_DEFAULT as i32,
            multiprocessors: self.attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(0) as u32,
            pci_bus_id,
            l2_cache_bytes: self.attribute(device, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as u64,
        })
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        let mut can: c_int = 0;
        // SAFETY: writes one int.
        check(unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, peer) }, "cuDeviceCanAccessPeer")?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        let peer_ctx = self.primary_context(peer)?;
        // SAFETY: both contexts are retained primary contexts; flags must be 0.
        let rc = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) };
        if rc == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(rc, &format!("cuCtxEnablePeerAccess(peer device {peer})"))
    }

    fn use_device(&self, device: i32) -> Result<()> {
        let ctx = self.primary_context(device)?;
        // SAFETY: ctx is a primary context this driver retained.
        check(unsafe { sys::cuCtxSetCurrent(ctx) }, &format!("cuCtxSetCurrent(device {device})"))
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes one device address; freed by the owner through `free`.
        check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, &format!("cuMemAlloc({bytes} bytes)"))?;
        Ok(DevicePtr(p as u64))
    }

    unsafe fn free(&self, p: DevicePtr) -> Result<()> {
        // SAFETY: the caller (ipc::ExportedBuffer) frees each allocation once.
        check(unsafe { sys::cuMemFree_v2(ptr(p)) }, "cuMemFree")
    }

    unsafe fn ipc_get_mem_handle(&self, p: DevicePtr) -> Result<IpcHandleBytes> {
        let mut handle = MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: writes one 64-byte handle.
        check(unsafe { sys::cuIpcGetMemHandle(handle.as_mut_ptr(), ptr(p)) }, "cuIpcGetMemHandle")?;
        // SAFETY: zero-initialised and then filled by the driver; a handle is plain bytes.
        Ok(unsafe { handle.assume_init() }.reserved.map(|b| b as u8))
    }

    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr> {
        let raw = sys::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut p: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
        // SAFETY: writes one device address, closed by the owner through `ipc_close_mem_handle`.
        let rc = unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, raw, flags) };
        check(rc, "cuIpcOpenMemHandle")?;
        Ok(DevicePtr(p as u64))
    }

    unsafe fn ipc_close_mem_handle(&self, p: DevicePtr) -> Result<()> {
        // SAFETY: the caller (ipc::OpenedBuffer) closes each mapping once.
        check(unsafe { sys::cuIpcCloseMemHandle(ptr(p)) }, "cuIpcCloseMemHandle")
    }

    fn create_interprocess_event(&self) -> Result<RawEvent> {
        let mut e: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint
            | sys::CUevent_flags::CU_EVENT_INTERPROCESS as c_uint;
        // SAFETY: writes one event handle, destroyed by its owner.
        check(unsafe { sys::cuEventCreate(&mut e, flags) }, "cuEventCreate(DisableTiming | Interprocess)")?;
        Ok(RawEvent(e as u64))
    }

    unsafe fn ipc_get_event_handle(&self, e: RawEvent) -> Result<IpcHandleBytes> {
        let mut handle = MaybeUninit::<sys::CUipcEventHandle>::zeroed();
        // SAFETY: writes one 64-byte handle.
        check(unsafe { sys::cuIpcGetEventHandle(handle.as_mut_ptr(), event(e)) }, "cuIpcGetEventHandle")?;
        // SAFETY: zero-initialised and then filled by the driver; a handle is plain bytes.
        Ok(unsafe { handle.assume_init() }.reserved.map(|b| b as u8))
    }

    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent> {
        let raw = sys::CUipcEventHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: writes one event handle, destroyed by its owner.
        let rc = unsafe { sys::cuIpcOpenEventHandle(&mut e, raw) };
        check(rc, "cuIpcOpenEventHandle")?;
        Ok(RawEvent(e as u64))
    }

    unsafe fn destroy_event(&self, e: RawEvent) -> Result<()> {
        // SAFETY: the owner destroys each event once.
        check(unsafe { sys::cuEventDestroy_v2(event(e)) }, "cuEventDestroy")
    }

    unsafe fn record_event(&self, e: RawEvent, s: RawStream) -> Result<()> {
        // SAFETY: both handles are alive (borrowed from their owners by the caller).
        check(unsafe { sys::cuEventRecord(event(e), stream(s)) }, "cuEventRecord")
    }

    unsafe fn query_event(&self, e: RawEvent) -> Result<bool> {
        // SAFETY: the caller keeps the event alive.
        ready(unsafe { sys::cuEventQuery(event(e)) }, "cuEventQuery")
    }

    fn create_non_blocking_stream(&self) -> Result<RawStream> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
        // SAFETY: writes one stream handle, destroyed by its owner.
        check(unsafe { sys::cuStreamCreate(&mut s, flags) }, "cuStreamCreate(NonBlocking)")?;
        Ok(RawStream(s as u64))
    }

    unsafe fn destroy_stream(&self, s: RawStream) -> Result<()> {
        // SAFETY: the owner destroys the stream once.
        check(unsafe { sys::cuStreamDestroy_v2(stream(s)) }, "cuStreamDestroy")
    }

    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        // SAFETY: both handles are alive; flags must be 0.
        check(unsafe { sys::cuStreamWaitEvent(stream(s), event(e), 0) }, "cuStreamWaitEvent")
    }

    unsafe fn query_stream(&self, s: RawStream) -> Result<bool> {
        // SAFETY: the caller keeps the stream alive.
        ready(unsafe { sys::cuStreamQuery(stream(s)) }, "cuStreamQuery")
    }

    fn load_kernel(&self, image: &[u8], name: &CStr) -> Result<RawFunction> {
        let ctx = self.current_context()?;
        let mut kernels = self.kernels.lock().map_err(|_| anyhow!("kernel table poisoned"))?;
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
        unsafe {
            std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), image.len())
        };
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the image is a fatbin (its header gives its size) or NUL-terminated PTX (both checked
        // above), so the driver reads no further than it; it copies what it needs.
        let rc = unsafe { sys::cuModuleLoadData(&mut module, aligned.as_ptr().cast::<c_void>()) };
        check(rc, &format!("cuModuleLoadData({name:?})"))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the name is NUL-terminated; the function lives as long as the module (unloaded in Drop).
        let rc = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
        let found = check(rc, &format!("cuModuleGetFunction({name:?})"));
        if let Err(e) = found {
            // SAFETY: the module was just loaded and nothing refers to it.
            unsafe { sys::cuModuleUnload(module) };
            return Err(e);
        }
        kernels.insert(ctx, (module as usize, RawFunction(f as u64)));
        Ok(RawFunction(f as u64))
    }

    unsafe fn max_active_blocks_per_multiprocessor(&self, kernel: RawFunction, block: u32) -> Result<u32> {
        let mut blocks: c_int = 0;
        let function = kernel.0 as sys::CUfunction;
        // SAFETY: the caller promises the function comes from load_kernel, whose module is still loaded.
        let rc = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut blocks, function, block as c_int, 0)
        };
        check(rc, "cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        Ok(blocks.max(0) as u32)
    }

    unsafe fn launch_ptr_int_char(
        &self,
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
        // SAFETY: the caller promises a (char *, int, char) kernel and a live range; the parameters outlive
        // the call (the driver copies them at launch).
        check(
            unsafe {
                sys::cuLaunchKernel(
                    kernel.0 as sys::CUfunction,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream(s),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel(simpleKernel)",
        )
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: `dst` is exclusively borrowed for the call, and cuMemcpyDtoH returns only once the copy has
        // completed or failed, so the device never writes into `dst` after the borrow ends; the caller
        // promises `src` has dst.len() bytes.
        check(unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), ptr(src), dst.len()) }, "cuMemcpyDtoH")
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
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(ptr(dst), ptr(src), bytes, stream(s)) }, "cuMemcpyDtoDAsync")
    }

    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, s: RawStream) -> Result<()> {
        // SAFETY: `dst` is a live device allocation or mapping of at least `bytes` bytes, held by the caller.
        check(unsafe { sys::cuMemsetD8Async(ptr(dst), value, bytes, stream(s)) }, "cuMemsetD8Async")
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
        })
    }

    fn stream_memops_unsupported(&self, device: i32) -> Result<Option<String>> {
        // The v2 operations are the driver's, for every device (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS
        // concerns the v1 ones, which driver 580 refuses); what can be missing is the entry points.
        Ok(self.memops().err().map(|e| format!("device {device}: no stream memory operations: {e:#}")))
    }

    unsafe fn stream_write_u32(&self, s: RawStream, p: DevicePtr, value: u32) -> Result<()> {
        let write = self.memops()?.write;
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as c_uint;
        // SAFETY: the caller keeps the stream and the 4-aligned word alive until the write has run.
        check(unsafe { write(stream(s), ptr(p), value, flags) }, "cuStreamWriteValue32_v2")
    }

    unsafe fn stream_wait_u32_geq(&self, s: RawStream, p: DevicePtr, value: u32) -> Result<()> {
        let wait = self.memops()?.wait;
        let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as c_uint;
        // SAFETY: as above.
        check(unsafe { wait(stream(s), ptr(p), value, flags) }, "cuStreamWaitValue32_v2")
    }

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
        // SAFETY: for a POSIX descriptor the driver takes the int itself as the "pointer"; it does not close it.
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

    fn pool_create(&self, device: i32) -> Result<RawPool> {
        // SAFETY: the structure is plain data for which all zeroes is a valid value.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        props.location = on_device(device);
        let mut created: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: reads the structure, writes one pool, destroyed by its owner.
        let rc = unsafe { sys::cuMemPoolCreate(&mut created, &props) };
        check(rc, &format!("cuMemPoolCreate(device {device}, POSIX file descriptor)"))?;
        Ok(RawPool(created as u64))
    }

    unsafe fn pool_export(&self, p: RawPool) -> Result<OwnedFd> {
        let mut fd: c_int = -1;
        let posix = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for a POSIX descriptor the driver writes one int; the caller keeps the pool alive.
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
        // SAFETY: for a POSIX descriptor the driver takes the int itself as the "pointer"; it does not close it.
        let rc = unsafe { sys::cuMemPoolImportFromShareableHandle(&mut imported, handle, posix, 0) };
        check(rc, "cuMemPoolImportFromShareableHandle")?;
        let mut location = on_device(device);
        let mut flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        // SAFETY: the pool was just imported; reads one location, writes one flag value.
        check(unsafe { sys::cuMemPoolGetAccess(&mut flags, imported, &mut location) }, "cuMemPoolGetAccess")?;
        if flags != sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE {
            let access = read_write(device);
            // SAFETY: as above; reads one access descriptor.
            check(unsafe { sys::cuMemPoolSetAccess(imported, &access, 1) }, "cuMemPoolSetAccess")?;
        }
        Ok(RawPool(imported as u64))
    }

    unsafe fn pool_alloc(&self, p: RawPool, bytes: usize) -> Result<DevicePtr> {
        let mut address: sys::CUdeviceptr = 0;
        let null_stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the caller keeps the pool alive; writes one address, freed by pool_free.
        let rc = unsafe { sys::cuMemAllocFromPoolAsync(&mut address, bytes, pool(p), null_stream) };
        check(rc, &format!("cuMemAllocFromPoolAsync({bytes} bytes)"))?;
        // SAFETY: the null stream exists as long as the context.
        check(unsafe { sys::cuStreamSynchronize(null_stream) }, "cuStreamSynchronize")?;
        Ok(DevicePtr(address as u64))
    }

    unsafe fn pool_export_pointer(&self, p: DevicePtr) -> Result<IpcHandleBytes> {
        let mut data = MaybeUninit::<sys::CUmemPoolPtrExportData>::zeroed();
        // SAFETY: writes the 64 bytes of export data; the caller promises a live pool allocation.
        check(unsafe { sys::cuMemPoolExportPointer(data.as_mut_ptr(), ptr(p)) }, "cuMemPoolExportPointer")?;
        // SAFETY: zero-initialised and filled by the driver; export data is plain bytes.
        Ok(unsafe { data.assume_init() }.reserved)
    }

    unsafe fn pool_import_pointer(&self, p: RawPool, data: &IpcHandleBytes) -> Result<DevicePtr> {
        let mut raw = sys::CUmemPoolPtrExportData { reserved: *data };
        let mut address: sys::CUdeviceptr = 0;
        // SAFETY: the caller promises an imported pool; reads the export data, writes one address.
        let rc = unsafe { sys::cuMemPoolImportPointer(&mut address, pool(p), &mut raw) };
        check(rc, "cuMemPoolImportPointer")?;
        Ok(DevicePtr(address as u64))
    }

    unsafe fn pool_free(&self, p: DevicePtr) -> Result<()> {
        let null_stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the caller frees each pointer once, with no work pending on it.
        check(unsafe { sys::cuMemFreeAsync(ptr(p), null_stream) }, "cuMemFreeAsync")?;
        // SAFETY: the null stream exists as long as the context.
        check(unsafe { sys::cuStreamSynchronize(null_stream) }, "cuStreamSynchronize")
    }

    unsafe fn pool_destroy(&self, p: RawPool) -> Result<()> {
        // SAFETY: the caller destroys each pool once, after freeing its allocations.
        check(unsafe { sys::cuMemPoolDestroy(pool(p)) }, "cuMemPoolDestroy")
    }

    unsafe fn pin_host_memory(&self, host: &mut [u8]) -> Result<bool> {
        // SAFETY: registers a live host range; the caller unregisters it before the memory goes away.
        let rc = unsafe { sys::cuMemHostRegister_v2(host.as_mut_ptr().cast(), host.len(), 0) };
        if rc == CUresult::CUDA_ERROR_NOT_SUPPORTED || rc == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Ok(false);
        }
        check(rc, "cuMemHostRegister")?;
        Ok(true)
    }

    unsafe fn unpin_host_memory(&self, host: &mut [u8]) -> Result<()> {
        // SAFETY: the range was registered by pin_host_memory.
        check(unsafe { sys::cuMemHostUnregister(host.as_mut_ptr().cast()) }, "cuMemHostUnregister")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_gpu_results_waive_and_others_fail() {
        assert!(means_no_gpu(CUresult::CUDA_ERROR_NO_DEVICE));
        assert!(means_no_gpu(CUresult::CUDA_ERROR_STUB_LIBRARY));
        assert!(!means_no_gpu(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert!(!means_no_gpu(CUresult::CUDA_SUCCESS));
    }
}
