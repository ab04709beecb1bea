//! Legacy CUDA IPC, the original's mechanism: `cudaMalloc` + `cudaIpcGetMemHandle` in the exporter, and
//! `cudaIpcOpenMemHandle` (lazy peer access) in the importer. The 64-byte handle travels in the segment; the
//! importer must not have the exporter's pid number (see `diagnose`).

use anyhow::{Context, Result};

use super::diagnose::{self, Exporter};
use super::spec::{Export, Spec};
use crate::driver::{DevicePtr, Driver, IpcHandleBytes};
use crate::gpu::{DeviceBuffer, DeviceMemory, release};

/// The original's mechanism: nothing to ask of the attributes, but a trial export (see [`unsupported`]).
pub const SPEC: Spec =
    Spec { name: "legacy", needs: &[], descriptors: false, refuses_memops: None, probe: Some(unsupported) };

/// `cudaMalloc` + `cudaIpcGetMemHandle` on `device`: the buffer (freed on drop) and its handle.
pub(super) fn export<'d>(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Export<'d>> {
    let buffer = DeviceBuffer::allocate(driver, device, bytes)?;
    // SAFETY: the buffer was just allocated by this driver and is alive.
    let handle =
        unsafe { driver.ipc_get_mem_handle(buffer.ptr()) }.context("exporting a buffer's IPC handle")?;
    Ok(Export { memory: Box::new(buffer), handle, descriptor: None })
}

/// Another process's buffer, mapped with `cudaIpcOpenMemHandle` on `device`'s context: unmapped on drop.
pub struct View<'d> {
    driver: &'d dyn Driver,
    device: i32,
    ptr: DevicePtr,
    bytes: usize,
}

impl<'d> View<'d> {
    /// Opens the buffer of `exporter` on `device`; a failure says why, from what this process can see.
    pub fn open(
        driver: &'d dyn Driver,
        device: i32,
        handle: &IpcHandleBytes,
        bytes: usize,
        exporter: &Exporter,
    ) -> Result<Self> {
        driver.use_device(device)?;
        let ptr = driver
            .ipc_open_mem_handle(handle)
            .map_err(|e| diagnose::open_failed(e, diagnose::Opening::LegacyMemory, exporter))?;
        Ok(Self { driver, device, ptr, bytes })
    }
}

// SAFETY: the mapping lives until the view is dropped; the exporter's buffer has at least `bytes` bytes (the
// segment says so, and the exporter frees it only after every view is closed).
unsafe impl DeviceMemory for View<'_> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for View<'_> {
    fn drop(&mut self) {
        // SAFETY: the mapping came from `ipc_open_mem_handle` and is closed only here, once.
        release(self.driver, self.device, "closing an opened IPC buffer", |d| unsafe {
            d.ipc_close_mem_handle(self.ptr)
        });
    }
}

/// Whether legacy IPC works on `device`, asked the way NCCL asks: export a small allocation. It is missing
/// on WSL and on Tegra. `Some(reason)` when it does not work.
pub fn unsupported(driver: &dyn Driver, device: i32) -> Result<Option<String>> {
    let probe = DeviceBuffer::allocate(driver, device, 2 << 20)?;
    // SAFETY: the probe buffer is alive until the end of this function.
    match unsafe { driver.ipc_get_mem_handle(probe.ptr()) } {
        Ok(_) => Ok(None),
        Err(e) => {
            Ok(Some(format!("device {device} cannot export a legacy IPC handle, as on WSL and Tegra: {e:#}")))
        }
    }
}
