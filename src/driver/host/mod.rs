//! A [`Driver`] in host memory, so that the process protocol (segment, children, barrier, handles, ordering,
//! faults, signals, clean-up) runs for real in `cargo test` on machines without a GPU.
//!
//! It is chosen only when [`SIMULATE_ENV`] is set; it never stands in for a missing GPU. It is asynchronous
//! the way a GPU is, so that the tests notice when the ordering the sample exists to show is broken:
//! - each stream runs its work in order on a worker thread of its own, and a kernel takes a random 4 to 20
//!   ms before it writes, so a kernel is not done when its launch returns, nor when the next step starts;
//! - an interprocess event is two counters in shared memory: recording it takes the next generation when it
//!   is enqueued and marks it complete when the stream reaches it; a wait (a stream's or the host's) waits for
//!   the generation that was last recorded when the wait was asked for, as `cuStreamWaitEvent` does.
//!
//! A "device buffer" is a memfd; its IPC handle names the exporter's pid and descriptor, and opening it
//! maps `/proc/<pid>/fd/<fd>`. An interprocess event's counters live, as with the CUDA driver (580), in a file
//! `/dev/shm/cuda.shm.0.<pid, hex>.<n>` named by the pid the exporter has in its own PID namespace: a second
//! exporter of the same pid number (another container sharing `/dev/shm`) replaces the name, and opening
//! the handle maps whatever file has that name now. The file is removed when the exporter ends normally (if
//! the name is still its file) and left when it is killed, so that the tests check what the program removes.
//! The driver's answers across namespaces are those measured on the H200 host: a legacy memory or event
//! handle whose exporter has this process's own pid number is refused with `CUDA_ERROR_INVALID_CONTEXT`;
//! an event whose file is not in this process's `/dev/shm` with `CUDA_ERROR_MAP_FAILED`.
//!
//! `SIMPLE_IPC_SIMULATE_GPUS` is a comma-separated list, one entry per device: `ok`, or a defect that device
//! selection must reject: `no-uva` (no unified addressing), `exclusive` (compute mode not Default), `no-peer`
//! (no peer access to any other device), or that a mechanism must waive: `no-legacy-ipc`, `no-vmm`,
//! `no-pools`, `no-memops` (no stream memory operations); several are joined by `+`. An empty value is a machine without devices.
//!
//! The virtual memory management API and memory pools are simulated with descriptors too: an allocation or
//! a pool is a memfd, exported as a new descriptor of it (which the program passes over a Unix socket), and
//! a pool's allocations are page-aligned ranges of its memfd. Host memory is "pinned" by noting its range.
//!
//! Every failure the simulation answers for the driver is a [`CallFailed`] with the `CUresult` the CUDA
//! driver gives in that case (a freed pointer, a destroyed stream, a handle of the wrong kind, memory freed
//! by the call of another kind of memory), its text marked `(simulated: why)`. When the driver is dropped
//! (the process ends its CUDA use) it says on standard error what the process still holds, one line:
//! `simulated driver: process <pid> ended holding 1 device buffer, 2 opened IPC buffers`; the tests fail on
//! that line, so every owner's `Drop` is seen to do its work. A process that exits without dropping its
//! driver (killed, or `exit` from a signal handler) says nothing.
//!
//! The simulation by concern: [`memory`] (every addressable buffer, legacy IPC memory, pinned host memory),
//! [`events`] (interprocess events and their `/dev/shm` files), [`streams`] (streams, kernels, copies,
//! stream memory operations), [`vmm`] and [`pool`]. This file holds the devices, chosen by the environment.

mod events;
mod memory;
mod pool;
mod streams;
mod vmm;

use std::ffi::CStr;
use std::io::Write;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use anyhow::{Result, anyhow};

use super::{
    CallFailed, Capability, DeviceInfo, DevicePtr, Driver, IpcHandleBytes, RawAllocation, RawEvent,
    RawFunction, RawPool, RawStream, code,
};

/// The environment variable that selects the simulation (test-only; README documents it).
pub const SIMULATE_ENV: &str = "SIMPLE_IPC_SIMULATE_GPUS";

/// Whether this process was asked to simulate its GPUs.
pub fn requested() -> bool {
    std::env::var_os(SIMULATE_ENV).is_some()
}

/// The simulated L2 cache: small, so that the benchmark's marking of cache-sized rows shows in tests.
pub const SIMULATED_L2_BYTES: u64 = 64 * 1024;
/// The simulated VMM granularity: not a power of two, so that rounding up is exercised.
pub const SIMULATED_GRANULARITY: usize = 96 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SimulatedDevice {
    Ok,
    NoUnifiedAddressing,
    ExclusiveComputeMode,
    NoPeerAccess,
    /// Legacy IPC handles fail (as on WSL and Tegra).
    NoLegacyIpc,
    /// No virtual memory management.
    NoVmm,
    /// No memory pools.
    NoPools,
    /// No stream memory operations.
    NoStreamMemops,
}

/// What a simulated device lacks: `ok`, or defects joined by `+` (`no-vmm+no-pools`).
struct Defects(Vec<SimulatedDevice>);

impl Defects {
    fn lacks(&self, defect: SimulatedDevice) -> bool {
        self.0.contains(&defect)
    }

    fn parse(kind: &str) -> Result<Self> {
        let defects = kind.split('+').map(|defect| match defect.trim() {
            "ok" => Ok(SimulatedDevice::Ok),
            "no-uva" => Ok(SimulatedDevice::NoUnifiedAddressing),
            "exclusive" => Ok(SimulatedDevice::ExclusiveComputeMode),
            "no-peer" => Ok(SimulatedDevice::NoPeerAccess),
            "no-legacy-ipc" => Ok(SimulatedDevice::NoLegacyIpc),
            "no-vmm" => Ok(SimulatedDevice::NoVmm),
            "no-pools" => Ok(SimulatedDevice::NoPools),
            "no-memops" => Ok(SimulatedDevice::NoStreamMemops),
            other => Err(anyhow!("{SIMULATE_ENV}: unknown device kind {other:?}")),
        });
        Ok(Defects(defects.collect::<Result<Vec<_>>>()?))
    }
}

/// Host-memory stand-in for the CUDA driver: the devices, and one table per concern, each behind one lock.
pub struct HostDriver {
    devices: Vec<Defects>,
    memory: memory::Memory,
    events: events::Events,
    streams: streams::Streams,
    vmm: vmm::Allocations,
    pools: pool::Pools,
    /// An xorshift state: kernel run times, names of temporary files.
    random: AtomicU64,
}

thread_local! {
    /// The device `use_device` made current on this thread, as CUDA keeps it per thread.
    static CURRENT: std::cell::Cell<i32> = const { std::cell::Cell::new(-1) };
}

/// A simulated driver call's failure: the code the CUDA driver answers in that case, in the driver's words,
/// and why the simulation answered it.
fn failed(call: impl Into<String>, code: u32, why: impl std::fmt::Display) -> anyhow::Error {
    let (name, words) = code::name_and_words(code);
    CallFailed { call: call.into(), code, text: format!("{name} ({code}): {words} (simulated: {why})") }
        .into()
}

/// A table's lock. A poisoned one is the simulation's own failure (a panic while it held it), not a
/// driver's answer.
fn lock<T>(mutex: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    mutex.lock().map_err(|_| anyhow!("a simulated driver table is poisoned"))
}

/// A table, when the driver is going away (nothing else can hold it, poisoned or not).
fn owned<T>(mutex: &mut Mutex<T>) -> &mut T {
    mutex.get_mut().unwrap_or_else(PoisonError::into_inner)
}

/// What the process still holds when its driver goes away, table by table: "2 opened IPC buffers".
#[derive(Default)]
struct Held(Vec<String>);

impl Held {
    fn add(&mut self, count: usize, noun: &str) {
        if count > 0 {
            self.0.push(format!("{count} {noun}{}", if count == 1 { "" } else { "s" }));
        }
    }
}

impl Drop for HostDriver {
    /// The process ends its CUDA use: it says what it still holds, and the event files go (where their names
    /// are still this process's files).
    fn drop(&mut self) {
        let mut held = Held::default();
        self.memory.held(&mut held);
        self.events.held(&mut held);
        self.streams.held(&mut held);
        self.vmm.held(&mut held);
        self.pools.held(&mut held);
        if !held.0.is_empty() {
            let line = format!(
                "simulated driver: process {} ended holding {}\n",
                std::process::id(),
                held.0.join(", ")
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        self.events.remove_files();
    }
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
            .map(Defects::parse)
            .collect::<Result<Vec<_>>>()?;
        let seed = u64::from(std::process::id()) << 32
            | u64::from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos());
        Ok(Some(Self {
            devices,
            memory: memory::Memory::default(),
            events: events::Events::default(),
            streams: streams::Streams::default(),
            vmm: vmm::Allocations::default(),
            pools: pool::Pools::default(),
            random: AtomicU64::new(seed | 1),
        }))
    }

    /// The device of ordinal `device`, for `call`.
    fn device(&self, call: &str, device: i32) -> Result<&Defects> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| failed(call, code::INVALID_DEVICE, format!("no device {device}")))
    }

    /// The next number of an xorshift: good enough to shuffle concurrent work and to name temporary files.
    fn random(&self) -> u64 {
        let mut x = self.random.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random.store(x, Ordering::Relaxed);
        x
    }
}

// Each call is simulated in the module of its concern; the devices are answered here.
impl Driver for HostDriver {
    fn simulated(&self) -> bool {
        true
    }
    fn version(&self) -> Result<i32> {
        Ok(0)
    }
    fn device_count(&self) -> Result<i32> {
        Ok(self.devices.len() as i32)
    }
    fn device_info(&self, device: i32) -> Result<DeviceInfo> {
        let kind = self.device("cuDeviceGetAttribute", device)?;
        Ok(DeviceInfo {
            name: format!("Simulated GPU {device}"),
            unified_addressing: !kind.lacks(SimulatedDevice::NoUnifiedAddressing),
            default_compute_mode: !kind.lacks(SimulatedDevice::ExclusiveComputeMode),
            multiprocessors: 2,
            pci_bus_id: None,
            l2_cache_bytes: SIMULATED_L2_BYTES,
        })
    }
    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        let call = "cuDeviceCanAccessPeer";
        let (a, b) = (self.device(call, device)?, self.device(call, peer)?);
        Ok(!a.lacks(SimulatedDevice::NoPeerAccess) && !b.lacks(SimulatedDevice::NoPeerAccess))
    }
    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        self.device("cuCtxEnablePeerAccess", peer).map(drop)
    }
    fn use_device(&self, device: i32) -> Result<()> {
        self.device("cuDevicePrimaryCtxRetain", device)?;
        CURRENT.with(|current| current.set(device));
        Ok(())
    }

    // memory.rs
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        memory::alloc(self, bytes)
    }
    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        memory::free(self, ptr)
    }
    unsafe fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> Result<IpcHandleBytes> {
        memory::ipc_get_mem_handle(self, ptr)
    }
    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr> {
        memory::ipc_open_mem_handle(self, handle)
    }
    unsafe fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> Result<()> {
        memory::ipc_close_mem_handle(self, ptr)
    }

    // events.rs
    fn create_interprocess_event(&self) -> Result<RawEvent> {
        events::create(self)
    }
    unsafe fn ipc_get_event_handle(&self, event: RawEvent) -> Result<IpcHandleBytes> {
        events::handle(self, event)
    }
    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent> {
        events::open(self, handle)
    }
    unsafe fn destroy_event(&self, event: RawEvent) -> Result<()> {
        events::destroy(self, event)
    }
    unsafe fn record_event(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        streams::record_event(self, event, stream)
    }
    unsafe fn query_event(&self, event: RawEvent) -> Result<bool> {
        events::query(self, event)
    }

    // streams.rs
    fn create_non_blocking_stream(&self) -> Result<RawStream> {
        streams::create(self)
    }
    unsafe fn destroy_stream(&self, stream: RawStream) -> Result<()> {
        streams::destroy(self, stream)
    }
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        streams::wait_event(self, stream, event)
    }
    unsafe fn query_stream(&self, stream: RawStream) -> Result<bool> {
        streams::query(self, stream)
    }
    fn load_kernel(&self, _image: &[u8], name: &CStr) -> Result<RawFunction> {
        streams::load_kernel(name)
    }
    unsafe fn max_active_blocks_per_multiprocessor(&self, _kernel: RawFunction, _block: u32) -> Result<u32> {
        Ok(16)
    }
    unsafe fn launch_ptr_int_char(
        &self,
        _kernel: RawFunction,
        _grid: u32,
        _block: u32,
        stream: RawStream,
        args: (DevicePtr, i32, u8),
    ) -> Result<()> {
        streams::launch(self, stream, args)
    }
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        streams::copy_to_host(self, dst, src)
    }
    unsafe fn copy_from_host(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        streams::copy_from_host(self, dst, src)
    }
    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        streams::copy_device_to_device(self, dst, src, bytes, stream)
    }
    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, stream: RawStream) -> Result<()> {
        streams::fill(self, dst, value, bytes, stream)
    }
    fn supports(&self, device: i32, what: Capability) -> Result<bool> {
        let kind = self.device("cuDeviceGetAttribute", device)?;
        Ok(match what {
            Capability::VirtualMemory | Capability::PosixFdHandles => !kind.lacks(SimulatedDevice::NoVmm),
            Capability::MemoryPools | Capability::PoolPosixFdHandles => !kind.lacks(SimulatedDevice::NoPools),
        })
    }
    fn stream_memops_unsupported(&self, device: i32) -> Result<Option<String>> {
        let lacks = self.device("cuDeviceGetAttribute", device)?.lacks(SimulatedDevice::NoStreamMemops);
        Ok(lacks.then(|| format!("device {device} has no stream memory operations (simulated)")))
    }
    unsafe fn stream_write_u32(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
        streams::write_u32(self, stream, ptr, value)
    }
    unsafe fn stream_wait_u32_geq(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
        streams::wait_u32_geq(self, stream, ptr, value)
    }

    // vmm.rs
    fn vmm_granularity(&self, device: i32) -> Result<usize> {
        self.device("cuMemGetAllocationGranularity", device)?;
        Ok(SIMULATED_GRANULARITY)
    }
    fn vmm_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        vmm::create(self, device, bytes)
    }
    unsafe fn vmm_export(&self, allocation: RawAllocation) -> Result<OwnedFd> {
        vmm::export(self, allocation)
    }
    fn vmm_import(&self, fd: BorrowedFd) -> Result<RawAllocation> {
        vmm::import(self, fd)
    }
    unsafe fn vmm_map(&self, allocation: RawAllocation, bytes: usize, device: i32) -> Result<DevicePtr> {
        vmm::map(self, allocation, bytes, device)
    }
    unsafe fn vmm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        vmm::unmap(self, ptr, bytes)
    }
    unsafe fn vmm_release(&self, allocation: RawAllocation) -> Result<()> {
        vmm::release(self, allocation)
    }

    // pool.rs
    fn pool_create(&self, device: i32) -> Result<RawPool> {
        pool::create(self, device)
    }
    unsafe fn pool_export(&self, pool: RawPool) -> Result<OwnedFd> {
        pool::export(self, pool)
    }
    fn pool_import(&self, fd: BorrowedFd, device: i32) -> Result<RawPool> {
        pool::import(self, fd, device)
    }
    unsafe fn pool_alloc(&self, pool: RawPool, bytes: usize) -> Result<DevicePtr> {
        pool::alloc(self, pool, bytes)
    }
    unsafe fn pool_export_pointer(&self, ptr: DevicePtr) -> Result<IpcHandleBytes> {
        pool::export_pointer(self, ptr)
    }
    unsafe fn pool_import_pointer(&self, pool: RawPool, data: &IpcHandleBytes) -> Result<DevicePtr> {
        pool::import_pointer(self, pool, data)
    }
    unsafe fn pool_free(&self, ptr: DevicePtr) -> Result<()> {
        pool::free(self, ptr)
    }
    unsafe fn pool_destroy(&self, pool: RawPool) -> Result<()> {
        pool::destroy(self, pool)
    }

    // memory.rs
    unsafe fn pin_host_memory(&self, host: &mut [u8]) -> Result<bool> {
        self.memory.pin(host).map(|()| true)
    }
    unsafe fn unpin_host_memory(&self, host: &mut [u8]) -> Result<()> {
        self.memory.unpin(host)
    }
}
