//! The driver of real GPUs: the CUDA driver API through cudarc, loaded at run time.
//!
//! This module is where the program's CUDA `unsafe` lives. A call that cudarc's `result` layer has goes
//! through it; the few it lacks (IPC, VMM, pool export and import, peer access, host registration,
//! `cuGetProcAddress`, interprocess events) call the raw `sys` bindings, each place saying so. Every failure
//! becomes one [`CallFailed`] through [`Named::named`]: the call's name, the `CUresult` as a number, and
//! the driver's own words for it. [`symbols`] makes sure, before anything is called, that the driver has
//! every entry point the program can reach: cudarc panics at the first use of one it lacks.
//!
//! Each concern's trait is implemented in the file of its name, with the real calls: [`devices`]
//! (attributes, peers, contexts made current), [`memory`] (`cuMemAlloc`, the copy to the host, pinned host
//! memory), [`ipc`] (legacy IPC memory handles), [`events`] (interprocess events and their handles),
//! [`streams`] (streams, event records and waits on them, device copies, stream memory operations),
//! [`kernels`] (the kernel's module, occupancy and launch), [`vmm`], [`fabric`] (the names CUDA 11.4's
//! bindings lack) and [`pool`]. This file holds the driver (initialisation, the primary contexts and loaded
//! modules it releases on drop) and what they share.

mod devices;
mod events;
mod fabric;
mod ipc;
mod kernels;
mod memory;
mod pool;
mod streams;
mod symbols;
mod vmm;

use std::collections::HashMap;
use std::ffi::{CStr, c_int};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Mutex;

use anyhow::{Result, anyhow, bail};
use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::culib as keep_the_library;
use cudarc::driver::sys::{self, CUresult};

use super::error::CallFailed;
use super::handles::{DevicePtr, RawEvent, RawFunction, RawPool, RawStream};
use crate::outcome::Waiver;
use streams::StreamMemops;

/// The CUDA driver, initialised, with the primary contexts this process retained.
pub struct CudaDriver {
    /// Primary context of each device used so far, released on drop.
    contexts: Mutex<HashMap<i32, usize>>,
    /// Loaded `simpleKernel` per context (one module per device the process uses).
    kernels: Mutex<HashMap<usize, (usize, RawFunction)>>,
    /// The stream memory operations, looked up on first use.
    memops: std::sync::OnceLock<Result<StreamMemops, String>>,
}

/// The one conversion of a driver error into the program's: [`CallFailed`] with the call's name (what
/// `ipc::diagnose` matches on, with the code), the `CUresult` as a number, and the driver's words for it.
trait Named<T> {
    fn named(self, call: &str) -> Result<T>;
}

impl<T> Named<T> for std::result::Result<T, DriverError> {
    fn named(self, call: &str) -> Result<T> {
        self.map_err(|DriverError(code)| {
            CallFailed {
                call: call.to_owned(),
                code: code as u32,
                text: describe(code),
                beyond_the_simulation: false,
            }
            .into()
        })
    }
}

/// A raw `sys` call's result (for the calls cudarc's `result` layer lacks), through the same conversion.
fn check(rc: CUresult, call: &str) -> Result<()> {
    rc.result().named(call)
}

/// A query's answer: done (`Ok(true)`), not yet (`CUDA_ERROR_NOT_READY`), or an error.
fn ready(answer: std::result::Result<(), DriverError>, call: &str) -> Result<bool> {
    match answer {
        Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        other => other.named(call).map(|()| true),
    }
}

/// `CUDA_ERROR_INVALID_VALUE (1): invalid argument`, in the driver's words.
pub fn describe(result: CUresult) -> String {
    let error = DriverError(result);
    let read =
        |text: std::result::Result<&CStr, DriverError>| text.ok().map(|t| t.to_string_lossy().into_owned());
    let code = result as u32;
    match (read(error.error_name()), read(error.error_string())) {
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
    /// Whether `libcuda` loads here; it stays loaded, so that [`CudaDriver::load`] finds it at once.
    pub fn library_here() -> bool {
        // `sys`: the result layer has no such test. SAFETY: only dlopens the library by its usual names (its
        // initialisers start nothing); nothing is called through it.
        let present = unsafe { sys::is_culib_present() };
        if present {
            // SAFETY: as above; `culib` opens the library just found (it cannot miss it) and keeps it for the
            // process's life.
            let _ = unsafe { keep_the_library() };
        }
        present
    }

    /// Loads `libcuda` and initialises it; `Waiver` when this machine has no usable GPU.
    pub fn load() -> Result<Self> {
        // `sys`: the result layer has no such test. SAFETY: only tries to dlopen the library by its usual
        // names; nothing is called through it.
        if !unsafe { sys::is_culib_present() } {
            // In a container, the engine mounts the library with the GPUs: its flag is the fix.
            let why = match crate::os::container::engine() {
                Some(engine) => {
                    format!("no CUDA driver library (libcuda.so) in this container: {}", engine.gpus_fix())
                }
                None => "no CUDA driver library (libcuda.so) on this machine".to_owned(),
            };
            return Err(Waiver(why).into());
        }
        symbols::require_all()?;
        match result::init() {
            Err(DriverError(rc)) if means_no_gpu(rc) => {
                return Err(Waiver(format!("the CUDA driver has no GPU to offer: {}", describe(rc))).into());
            }
            other => other.named("cuInit")?,
        }
        Ok(Self {
            contexts: Mutex::new(HashMap::new()),
            kernels: Mutex::new(HashMap::new()),
            memops: std::sync::OnceLock::new(),
        })
    }

    fn attribute(&self, device: i32, attribute: sys::CUdevice_attribute) -> Result<i32> {
        // SAFETY: writes one int; an invalid device is reported as an error.
        unsafe { result::device::get_attribute(device, attribute) }.named("cuDeviceGetAttribute")
    }

    fn primary_context(&self, device: i32) -> Result<sys::CUcontext> {
        let mut contexts = self.contexts.lock().map_err(|_| anyhow!("context table poisoned"))?;
        if let Some(&ctx) = contexts.get(&device) {
            return Ok(ctx as sys::CUcontext);
        }
        // SAFETY: writes one context handle, released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .named(&format!("cuDevicePrimaryCtxRetain(device {device})"))?;
        contexts.insert(device, ctx as usize);
        Ok(ctx)
    }

    fn current_context(&self) -> Result<usize> {
        match result::ctx::get_current().named("cuCtxGetCurrent")? {
            Some(ctx) => Ok(ctx as usize),
            None => bail!("no device is current on this thread"),
        }
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        for (module, _) in kernels.drain().map(|(_, v)| v) {
            // SAFETY: the module was loaded by this driver and no launch can follow: the driver is going away.
            // Nothing is left to do about a failure here.
            let _ = unsafe { result::module::unload(module as sys::CUmodule) };
        }
        let mut contexts = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        for (device, _) in contexts.drain() {
            // SAFETY: balances the one cuDevicePrimaryCtxRetain made for this device.
            let _ = unsafe { result::primary_ctx::release(device) };
        }
    }
}

/// Where a device's memory is, for the VMM and pool structures.
fn on_device(device: i32) -> sys::CUmemLocation {
    sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device }
}

/// A shareable allocation on `device`: pinned device memory, exportable as a POSIX file descriptor.
fn shareable_allocation(device: i32) -> sys::CUmemAllocationProp {
    allocation_prop(device, sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
}

/// Pinned device memory on `device`, exportable as `handle_type`.
fn allocation_prop(device: i32, handle_type: sys::CUmemAllocationHandleType) -> sys::CUmemAllocationProp {
    // SAFETY: the structure is plain data for which all zeroes is a valid value (no flags, null pointers).
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = handle_type;
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
