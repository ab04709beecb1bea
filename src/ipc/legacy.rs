//! Legacy CUDA IPC, the original's mechanism: `cudaMalloc` + `cudaIpcGetMemHandle` in the exporter, and
//! `cudaIpcOpenMemHandle` (lazy peer access) in the importer. The 64-byte handle travels in the segment; the
//! importer must not have the exporter's pid number (see `diagnose`).

use anyhow::{Context, Result};

use super::diagnose::{self, Exporter, Opening};
use super::{DeviceBuffer, DeviceMemory, warn_on_error};
use crate::driver::{DevicePtr, Driver, IpcHandleBytes};

/// A buffer allocated with `cudaMalloc` and exported: freed on drop.
pub struct Export<'d> {
    pub buffer: DeviceBuffer<'d>,
    pub handle: IpcHandleBytes,
}

impl<'d> Export<'d> {
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        let buffer = DeviceBuffer::allocate(driver, device, bytes)?;
        // SAFETY: the buffer was just allocated by this driver and is alive.
        let handle =
            unsafe { driver.ipc_get_mem_handle(buffer.ptr()) }.context("exporting a buffer's IPC handle")?;
        Ok(Self { buffer, handle })
    }
}

/// Another process's buffer, mapped with `cudaIpcOpenMemHandle`: unmapped on drop.
pub struct View<'d> {
    driver: &'d dyn Driver,
    pub ptr: DevicePtr,
}

impl<'d> View<'d> {
    /// Opens the buffer of `exporter`; a failure says why, from what this process can see.
    pub fn open(driver: &'d dyn Driver, handle: &IpcHandleBytes, exporter: &Exporter) -> Result<Self> {
        let ptr = driver
            .ipc_open_mem_handle(handle)
            .map_err(|e| diagnose::open_failed(e, Opening::LegacyMemory, exporter))?;
        Ok(Self { driver, ptr })
    }
}

impl Drop for View<'_> {
    fn drop(&mut self) {
        // SAFETY: the mapping came from `ipc_open_mem_handle` and is closed only here, once.
        warn_on_error("closing an opened IPC buffer", unsafe { self.driver.ipc_close_mem_handle(self.ptr) });
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
