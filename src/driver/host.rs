//! A [`Driver`] in host memory, so that the process protocol (segment, children, barrier, handles, faults,
//! signals, clean-up) runs for real in `cargo test` on machines without a GPU.
//!
//! It is chosen only when [`SIMULATE_ENV`] is set; it never stands in for a missing GPU. A "device buffer" is
//! a memfd; its "IPC handle" names the exporter's pid and descriptor, and opening it maps
//! `/proc/<pid>/fd/<fd>`, so, as with CUDA, nothing is left in `/dev/shm` when a process dies. Kernels run
//! synchronously on the CPU, so events and streams only need to exist.
//!
//! `SIMPLE_IPC_SIMULATE_GPUS` is a comma-separated list, one entry per device: `ok`, or a defect that device
//! selection must reject: `no-uva` (no unified addressing), `exclusive` (compute mode not Default), `no-peer`
//! (no peer access to any other device). An empty value is a machine without devices.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, anyhow, bail};
use memmap2::MmapRaw;
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::{
    DeviceInfo, DevicePtr, Driver, IPC_HANDLE_SIZE, IpcHandleBytes, RawEvent, RawFunction, RawStream,
};

/// The environment variable that selects the simulation (test-only; README documents it).
pub const SIMULATE_ENV: &str = "SIMPLE_IPC_SIMULATE_GPUS";

/// Size of a simulated device buffer: small, so that tests with 32 processes on 2 cores stay quick.
pub const SIMULATED_BUFFER_SIZE: usize = 256 * 1024;

const HANDLE_TAG: &[u8; 8] = b"SIMIPC\0\x01";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SimulatedDevice {
    Ok,
    NoUnifiedAddressing,
    ExclusiveComputeMode,
    NoPeerAccess,
}

/// Host-memory stand-in for the CUDA driver.
pub struct HostDriver {
    devices: Vec<SimulatedDevice>,
    /// Every mapping this process holds, by the address it hands out as a device pointer.
    mappings: Mutex<HashMap<u64, Mapping>>,
    next_handle: AtomicU64,
}

struct Mapping {
    map: MmapRaw,
    /// Kept open by the exporter so that other processes can open `/proc/<pid>/fd/<fd>`.
    _file: File,
}

impl HostDriver {
    /// The simulation, if the environment asks for it.
    pub fn from_env() -> Result<Option<Self>> {
        let Some(spec) = std::env::var_os(SIMULATE_ENV) else {
            return Ok(None);
        };
        let spec = spec.to_string_lossy();
        let devices = spec
            .split(',')
            .filter(|kind| !kind.trim().is_empty())
            .map(|kind| match kind.trim() {
                "ok" => Ok(SimulatedDevice::Ok),
                "no-uva" => Ok(SimulatedDevice::NoUnifiedAddressing),
                "exclusive" => Ok(SimulatedDevice::ExclusiveComputeMode),
                "no-peer" => Ok(SimulatedDevice::NoPeerAccess),
                other => Err(anyhow!("{SIMULATE_ENV}: unknown device kind {other:?}")),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Self { devices, mappings: Mutex::new(HashMap::new()), next_handle: AtomicU64::new(1) }))
    }

    fn device(&self, device: i32) -> Result<SimulatedDevice> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d).copied())
            .ok_or_else(|| anyhow!("invalid device ordinal {device}"))
    }

    fn insert(&self, file: File, bytes: usize) -> Result<DevicePtr> {
        let map = MmapRaw::map_raw(&file).context("mapping a simulated device buffer")?;
        if map.len() != bytes {
            bail!("simulated device buffer has {} bytes, expected {bytes}", map.len());
        }
        let address = map.as_mut_ptr() as u64;
        self.lock()?.insert(address, Mapping { map, _file: file });
        Ok(DevicePtr(address))
    }

    fn remove(&self, ptr: DevicePtr) -> Result<()> {
        self.lock()?.remove(&ptr.0).map(drop).ok_or_else(|| anyhow!("invalid device pointer {:#x}", ptr.0))
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<u64, Mapping>>> {
        self.mappings.lock().map_err(|_| anyhow!("simulated mapping table poisoned"))
    }

    fn with_mapping<T>(&self, ptr: DevicePtr, f: impl FnOnce(&MmapRaw) -> T) -> Result<T> {
        let mappings = self.lock()?;
        let mapping = mappings.get(&ptr.0).ok_or_else(|| anyhow!("invalid device pointer {:#x}", ptr.0))?;
        Ok(f(&mapping.map))
    }

    /// The start of a simulated device buffer, after checking that `bytes` bytes fit in it.
    fn range(&self, ptr: DevicePtr, bytes: usize) -> Result<*mut u8> {
        let len = self.with_mapping(ptr, |map| map.len())?;
        if bytes > len {
            bail!("{bytes} bytes do not fit the {len}-byte simulated buffer at {:#x}", ptr.0);
        }
        Ok(ptr.0 as *mut u8)
    }

    fn fresh(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }
}

fn encode(pid: u32, fd: i32, len: u64) -> IpcHandleBytes {
    let mut handle = [0u8; IPC_HANDLE_SIZE];
    handle[..8].copy_from_slice(HANDLE_TAG);
    handle[8..12].copy_from_slice(&pid.to_le_bytes());
    handle[12..16].copy_from_slice(&fd.to_le_bytes());
    handle[16..24].copy_from_slice(&len.to_le_bytes());
    handle
}

fn decode(handle: &IpcHandleBytes) -> Result<(u32, i32, u64)> {
    if &handle[..8] != HANDLE_TAG {
        bail!("not a simulated IPC handle");
    }
    let word = |range: std::ops::Range<usize>| -> [u8; 4] { handle[range].try_into().unwrap_or_default() };
    let len: [u8; 8] = handle[16..24].try_into().unwrap_or_default();
    Ok((u32::from_le_bytes(word(8..12)), i32::from_le_bytes(word(12..16)), u64::from_le_bytes(len)))
}

impl Driver for HostDriver {
    fn buffer_size(&self) -> usize {
        SIMULATED_BUFFER_SIZE
    }

    fn device_count(&self) -> Result<i32> {
        Ok(self.devices.len() as i32)
    }

    fn device_info(&self, device: i32) -> Result<DeviceInfo> {
        let kind = self.device(device)?;
        Ok(DeviceInfo {
            name: format!("Simulated GPU {device}"),
            unified_addressing: kind != SimulatedDevice::NoUnifiedAddressing,
            default_compute_mode: kind != SimulatedDevice::ExclusiveComputeMode,
            multiprocessors: 2,
            pci_bus_id: None,
        })
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        let (a, b) = (self.device(device)?, self.device(peer)?);
        Ok(a != SimulatedDevice::NoPeerAccess && b != SimulatedDevice::NoPeerAccess)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        self.device(peer).map(drop)
    }

    fn use_device(&self, device: i32) -> Result<()> {
        self.device(device).map(drop)
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let fd = memfd_create(c"simple-ipc-simulated-buffer", MFdFlags::empty()).context("memfd_create")?;
        let file = File::from(fd);
        file.set_len(bytes as u64).context("sizing a simulated device buffer")?;
        self.insert(file, bytes)
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.remove(ptr)
    }

    fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> Result<IpcHandleBytes> {
        use std::os::fd::AsRawFd;
        let mappings = self.lock()?;
        let mapping = mappings.get(&ptr.0).ok_or_else(|| anyhow!("invalid device pointer {:#x}", ptr.0))?;
        Ok(encode(std::process::id(), mapping._file.as_raw_fd(), mapping.map.len() as u64))
    }

    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr> {
        let (pid, fd, len) = decode(handle)?;
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = OpenOptions::new().read(true).write(true).open(&path).with_context(|| {
            format!("opening simulated IPC buffer {path}: the exporting process is not visible from here")
        })?;
        if file.metadata()?.len() != len {
            bail!("simulated IPC buffer {path} does not have the {len} bytes its handle says");
        }
        self.insert(file, len as usize)
    }

    fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> Result<()> {
        self.remove(ptr)
    }

    fn create_interprocess_event(&self) -> Result<RawEvent> {
        Ok(RawEvent(self.fresh()))
    }

    fn ipc_get_event_handle(&self, event: RawEvent) -> Result<IpcHandleBytes> {
        Ok(encode(std::process::id(), -1, event.0))
    }

    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent> {
        decode(handle)?;
        Ok(RawEvent(self.fresh()))
    }

    fn destroy_event(&self, _event: RawEvent) -> Result<()> {
        Ok(())
    }

    fn record_event(&self, _event: RawEvent, _stream: RawStream) -> Result<()> {
        Ok(())
    }

    fn synchronize_event(&self, _event: RawEvent) -> Result<()> {
        Ok(())
    }

    fn create_non_blocking_stream(&self) -> Result<RawStream> {
        Ok(RawStream(self.fresh()))
    }

    fn destroy_stream(&self, _stream: RawStream) -> Result<()> {
        Ok(())
    }

    fn stream_wait_event(&self, _stream: RawStream, _event: RawEvent) -> Result<()> {
        Ok(())
    }

    fn synchronize_stream(&self, _stream: RawStream) -> Result<()> {
        Ok(())
    }

    fn load_simple_kernel(&self) -> Result<RawFunction> {
        Ok(RawFunction(1))
    }

    fn max_active_blocks_per_multiprocessor(&self, _kernel: RawFunction, _block: u32) -> Result<u32> {
        Ok(16)
    }

    fn launch_simple_kernel(
        &self,
        _kernel: RawFunction,
        _grid: u32,
        _block: u32,
        _stream: RawStream,
        (target, size, value): (DevicePtr, i32, u8),
    ) -> Result<()> {
        self.with_mapping(target, |map| {
            let len = usize::try_from(size).unwrap_or(0).min(map.len());
            // SAFETY: the range lies inside a live shared mapping; other processes write it only at other
            // steps of the round-robin, which the barrier orders, as the GPU's events do for the real kernel.
            unsafe { std::ptr::write_bytes(map.as_mut_ptr(), value, len) };
        })
    }

    fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr, _stream: RawStream) -> Result<()> {
        self.with_mapping(src, |map| {
            let len = dst.len().min(map.len());
            // SAFETY: `len` bytes are readable in the mapping and writable in `dst`; they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(map.as_ptr(), dst.as_mut_ptr(), len) };
        })
    }

    fn copy_from_host(&self, dst: DevicePtr, src: &[u8], _stream: RawStream) -> Result<()> {
        let dst = self.range(dst, src.len())?;
        // SAFETY: `range` checked that src.len() bytes lie in a live mapping; a host slice cannot overlap it.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        _stream: RawStream,
    ) -> Result<()> {
        let (dst, src) = (self.range(dst, bytes)?, self.range(src, bytes)?);
        // SAFETY: both ranges lie in live mappings (checked); `copy` allows them to overlap.
        unsafe { std::ptr::copy(src, dst, bytes) };
        Ok(())
    }

    fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, _stream: RawStream) -> Result<()> {
        let dst = self.range(dst, bytes)?;
        // SAFETY: the range lies in a live mapping (checked).
        unsafe { std::ptr::write_bytes(dst, value, bytes) };
        Ok(())
    }

    fn pin_host_memory(&self, _host: &mut [u8]) -> Result<bool> {
        Ok(false)
    }

    fn unpin_host_memory(&self, _host: &mut [u8]) -> Result<()> {
        Ok(())
    }
}
