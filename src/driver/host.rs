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
//! a pool's allocations are page-aligned ranges of its memfd.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use memmap2::MmapRaw;
use nix::sys::memfd::{MFdFlags, memfd_create};

use std::os::fd::{BorrowedFd, OwnedFd};

use memmap2::MmapOptions;

use super::{
    CallFailed, Capability, DeviceInfo, DevicePtr, Driver, IPC_HANDLE_SIZE, IpcHandleBytes, RawAllocation,
    RawEvent, RawFunction, RawPool, RawStream,
};

/// The environment variable that selects the simulation (test-only; README documents it).
pub const SIMULATE_ENV: &str = "SIMPLE_IPC_SIMULATE_GPUS";

/// Whether this process was asked to simulate its GPUs.
pub fn requested() -> bool {
    std::env::var_os(SIMULATE_ENV).is_some()
}

const BUFFER_TAG: &[u8; 8] = b"SIMIPC\0\x02";
const POOL_POINTER_TAG: &[u8; 8] = b"SIMPTR\0\x02";
/// The simulated L2 cache: small, so that the benchmark's marking of cache-sized rows shows in tests.
pub const SIMULATED_L2_BYTES: u64 = 64 * 1024;
/// The simulated VMM granularity: not a power of two, so that rounding up is exercised.
pub const SIMULATED_GRANULARITY: usize = 96 * 1024;
const EVENT_TAG: &[u8; 8] = b"SIMEVT\0\x02";
/// An event's shared counters: the generation last recorded, and the highest one completed.
const EVENT_BYTES: usize = 16;
/// How long a simulated kernel takes before it writes: random in this range, and longer than a barrier
/// round of a loaded host (on 2 busy cores one can take milliseconds), so that a kernel is still running
/// when the next step's work is enqueued, and work that is not ordered comes out in the wrong order.
const KERNEL_DELAY_US: std::ops::Range<u64> = 4_000..20_000;
/// How often a waiting stream worker or host wait looks again.
const POLL: Duration = Duration::from_micros(50);

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
}

/// A shared mapping of a memfd: a buffer, or an event's counters.
struct Mapping {
    map: MmapRaw,
    /// Kept open by the exporter so that other processes can open `/proc/<pid>/fd/<fd>`.
    file: File,
}

impl Mapping {
    fn new(file: File, bytes: usize) -> Result<Arc<Self>> {
        let map = MmapRaw::map_raw(&file).context("mapping simulated device memory")?;
        ensure!(map.len() == bytes, "simulated device memory has {} bytes, expected {bytes}", map.len());
        Ok(Arc::new(Self { map, file }))
    }

    /// Maps `bytes` of `file` from `offset` (page-aligned).
    fn at(file: File, offset: u64, bytes: usize) -> Result<Arc<Self>> {
        let map = MmapOptions::new()
            .offset(offset)
            .len(bytes)
            .map_raw(&file)
            .context("mapping simulated memory")?;
        Ok(Arc::new(Self { map, file }))
    }

    fn create(bytes: usize) -> Result<Arc<Self>> {
        let fd = memfd_create(c"simple-ipc-simulated", MFdFlags::empty()).context("memfd_create")?;
        let file = File::from(fd);
        file.set_len(bytes as u64).context("sizing simulated device memory")?;
        Self::new(file, bytes)
    }

    fn open(handle: &IpcHandleBytes, tag: &[u8; 8]) -> Result<Arc<Self>> {
        let (pid, fd, len) = decode(handle, tag)?;
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = OpenOptions::new().read(true).write(true).open(&path).with_context(|| {
            format!("opening simulated IPC memory {path}: the exporting process is not visible from here")
        })?;
        ensure!(file.metadata()?.len() == len, "simulated IPC memory {path} does not have {len} bytes");
        Self::new(file, len as usize)
    }

    fn handle(&self, tag: &[u8; 8]) -> IpcHandleBytes {
        encode(tag, std::process::id(), self.file.as_raw_fd(), self.map.len() as u64)
    }

    /// The `i`th 64-bit counter of an event's mapping.
    fn counter(&self, i: usize) -> &AtomicU64 {
        debug_assert!((i + 1) * 8 <= EVENT_BYTES && EVENT_BYTES == self.map.len());
        // SAFETY: only events call this, whose mappings are EVENT_BYTES long (checked when made or opened);
        // the mapping is page-aligned and lives as long as `self`;
        // other processes touch it only through atomics too.
        unsafe { &*self.map.as_ptr().add(i * 8).cast::<AtomicU64>() }
    }
}

/// An event's counters, shared by the exporter and every process that opened it, and its number in the
/// exporter (the last part of its file's name).
struct Event(Arc<Mapping>, i32);

impl Event {
    fn recorded(&self) -> &AtomicU64 {
        self.0.counter(0)
    }
    fn completed(&self) -> &AtomicU64 {
        self.0.counter(1)
    }
    fn reached(&self, generation: u64) -> bool {
        self.completed().load(Ordering::Acquire) >= generation
    }
}

type Work = Box<dyn FnOnce() + Send>;

/// A stream: work runs in order on a worker thread; `enqueued` and `done` tell whether it is idle.
struct Stream {
    queue: Mutex<Option<Sender<Work>>>,
    enqueued: AtomicU64,
    done: Arc<AtomicU64>,
    /// Set when the stream is destroyed, so that a worker stuck in a wait that can never end lets go.
    destroyed: Arc<AtomicBool>,
}

/// Host-memory stand-in for the CUDA driver.
pub struct HostDriver {
    devices: Vec<Defects>,
    buffers: Mutex<HashMap<u64, Arc<Mapping>>>,
    events: Mutex<HashMap<u64, Arc<Event>>>,
    streams: Mutex<HashMap<u64, Arc<Stream>>>,
    next_id: AtomicU64,
    /// The number of the next exported event, from 1 as in the CUDA driver's file names.
    next_event: AtomicU32,
    random: AtomicU64,
    /// The files in /dev/shm this process's exported events have, as the CUDA driver makes them.
    driver_files: Mutex<Vec<(String, File)>>,
    /// The device of each buffer this process allocated with `alloc`.
    buffer_devices: Mutex<HashMap<u64, i32>>,
    /// VMM allocations and pools: a memfd each (a pool's also says how much of it is handed out).
    allocations: Mutex<HashMap<u64, File>>,
    pools: Mutex<HashMap<u64, (File, u64)>>,
    /// Where in its pool's memfd each pool allocation lies.
    pool_offsets: Mutex<HashMap<u64, u64>>,
}

thread_local! {
    /// The device `use_device` made current on this thread, as CUDA keeps it per thread.
    static CURRENT: std::cell::Cell<i32> = const { std::cell::Cell::new(-1) };
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().map_or(4096, |p| p as u64)
}

impl Drop for HostDriver {
    /// A normal end: the event files go, where their names are still this process's files.
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        for (name, file) in self.driver_files.get_mut().map(std::mem::take).unwrap_or_default() {
            let same =
                |a: &std::fs::Metadata, b: &std::fs::Metadata| a.dev() == b.dev() && a.ino() == b.ino();
            if let (Ok(named), Ok(ours)) = (std::fs::symlink_metadata(&name), file.metadata())
                && same(&named, &ours)
            {
                let _ = std::fs::remove_file(name);
            }
        }
    }
}

/// A simulated driver call's failure, with the code the CUDA driver answers in that case.
fn failed(call: &str, code: u32, name: &str, why: &str) -> anyhow::Error {
    CallFailed { call: call.to_owned(), code, text: format!("{name} ({code}): {why} (simulated)") }.into()
}

/// The handle of another process whose pid number is this process's own: the CUDA driver takes it for one
/// of its own and refuses it, as when two containers' first processes (both pid 1) meet.
fn refuse_own_pid(call: &str, exporter: u32) -> Result<()> {
    if exporter == std::process::id() {
        return Err(failed(
            call,
            super::code::INVALID_CONTEXT,
            "CUDA_ERROR_INVALID_CONTEXT",
            "invalid device context",
        ));
    }
    Ok(())
}

/// The name of the driver's file for event `n` of the process that is `pid` in its own namespace.
fn event_file_name(pid: u32, n: i32) -> String {
    format!("/dev/shm/cuda.shm.0.{pid:x}.{n}")
}

fn lock<T>(mutex: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    mutex.lock().map_err(|_| anyhow!("a simulated driver table is poisoned"))
}

fn encode(tag: &[u8; 8], pid: u32, fd: i32, len: u64) -> IpcHandleBytes {
    let mut handle = [0u8; IPC_HANDLE_SIZE];
    handle[..8].copy_from_slice(tag);
    handle[8..12].copy_from_slice(&pid.to_le_bytes());
    handle[12..16].copy_from_slice(&fd.to_le_bytes());
    handle[16..24].copy_from_slice(&len.to_le_bytes());
    handle
}

fn decode(handle: &IpcHandleBytes, tag: &[u8; 8]) -> Result<(u32, i32, u64)> {
    ensure!(&handle[..8] == tag, "not a simulated IPC handle of this kind");
    let mut word = [0u8; 4];
    word.copy_from_slice(&handle[8..12]);
    let pid = u32::from_le_bytes(word);
    word.copy_from_slice(&handle[12..16]);
    let fd = i32::from_le_bytes(word);
    let mut len = [0u8; 8];
    len.copy_from_slice(&handle[16..24]);
    Ok((pid, fd, u64::from_le_bytes(len)))
}

/// Waits until `done()`, or until `give_up()`.
fn poll_until(done: impl Fn() -> bool, give_up: impl Fn() -> bool) {
    while !done() && !give_up() {
        std::thread::sleep(POLL);
    }
}

impl HostDriver {
    /// The simulation, if the environment asks for it.
    pub fn from_env() -> Result<Option<Self>> {
        let Some(spec) = std::env::var_os(SIMULATE_ENV) else {
            return Ok(None);
        };
        let spec = spec.to_string_lossy();
        let device = |kind: &str| -> Result<Defects> {
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
        };
        let devices =
            spec.split(',').filter(|kind| !kind.trim().is_empty()).map(device).collect::<Result<Vec<_>>>()?;
        let seed = u64::from(std::process::id()) << 32
            | u64::from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos());
        Ok(Some(Self {
            devices,
            buffers: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            next_event: AtomicU32::new(1),
            random: AtomicU64::new(seed | 1),
            driver_files: Mutex::new(Vec::new()),
            buffer_devices: Mutex::new(HashMap::new()),
            allocations: Mutex::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
            pool_offsets: Mutex::new(HashMap::new()),
        }))
    }

    fn device(&self, device: i32) -> Result<&Defects> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| anyhow!("invalid device ordinal {device}"))
    }

    fn fresh(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A kernel's run time: xorshift, good enough to shuffle the order of concurrent work.
    fn kernel_delay(&self) -> Duration {
        let x = self.random();
        Duration::from_micros(KERNEL_DELAY_US.start + x % (KERNEL_DELAY_US.end - KERNEL_DELAY_US.start))
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

    fn buffer(&self, ptr: DevicePtr) -> Result<Arc<Mapping>> {
        lock(&self.buffers)?
            .get(&ptr.0)
            .cloned()
            .ok_or_else(|| anyhow!("invalid device pointer {:#x}", ptr.0))
    }

    /// The start of `bytes` bytes at `ptr`, inside one live buffer, with the mapping that keeps them valid.
    fn range(&self, ptr: DevicePtr, bytes: usize) -> Result<(Arc<Mapping>, usize)> {
        let buffers = lock(&self.buffers)?;
        let end = ptr.0.checked_add(bytes as u64).ok_or_else(|| anyhow!("address overflow"))?;
        let found = buffers.iter().find(|(start, m)| ptr.0 >= **start && end <= **start + m.map.len() as u64);
        let (_, mapping) =
            found.ok_or_else(|| anyhow!("no simulated buffer holds {bytes} bytes at {:#x}", ptr.0))?;
        Ok((Arc::clone(mapping), ptr.0 as usize))
    }

    /// The 4-aligned 32-bit word at `ptr`, inside a live buffer, with the mapping that keeps it valid.
    fn word(&self, ptr: DevicePtr) -> Result<(Arc<Mapping>, usize)> {
        ensure!(ptr.0.is_multiple_of(4), "a 32-bit flag at {:#x} is not 4-aligned", ptr.0);
        let buffers = lock(&self.buffers)?;
        let found =
            buffers.iter().find(|(start, m)| ptr.0 >= **start && ptr.0 + 4 <= **start + m.map.len() as u64);
        let (_, mapping) =
            found.ok_or_else(|| anyhow!("no simulated buffer holds the word at {:#x}", ptr.0))?;
        Ok((Arc::clone(mapping), ptr.0 as usize))
    }

    fn insert_buffer(&self, mapping: Arc<Mapping>) -> Result<DevicePtr> {
        let address = mapping.map.as_mut_ptr() as u64;
        lock(&self.buffers)?.insert(address, mapping);
        Ok(DevicePtr(address))
    }

    fn event(&self, event: RawEvent) -> Result<Arc<Event>> {
        lock(&self.events)?.get(&event.0).cloned().ok_or_else(|| anyhow!("invalid event {:#x}", event.0))
    }

    fn stream(&self, stream: RawStream) -> Result<Arc<Stream>> {
        lock(&self.streams)?.get(&stream.0).cloned().ok_or_else(|| anyhow!("invalid stream {:#x}", stream.0))
    }

    /// Puts `work` at the end of `stream`'s queue.
    fn enqueue(&self, stream: RawStream, work: Work) -> Result<()> {
        let stream = self.stream(stream)?;
        let queue = lock(&stream.queue)?;
        let sender = queue.as_ref().ok_or_else(|| anyhow!("the stream is destroyed"))?;
        stream.enqueued.fetch_add(1, Ordering::AcqRel);
        sender.send(work).map_err(|_| anyhow!("the stream's worker is gone"))
    }
}

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
        let kind = self.device(device)?;
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
        let (a, b) = (self.device(device)?, self.device(peer)?);
        Ok(!a.lacks(SimulatedDevice::NoPeerAccess) && !b.lacks(SimulatedDevice::NoPeerAccess))
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        self.device(peer).map(drop)
    }

    fn use_device(&self, device: i32) -> Result<()> {
        self.device(device)?;
        CURRENT.with(|current| current.set(device));
        Ok(())
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let ptr = self.insert_buffer(Mapping::create(bytes)?)?;
        lock(&self.buffer_devices)?.insert(ptr.0, CURRENT.with(|c| c.get()));
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        // Work still queued holds its own reference to the mapping, so it never writes into freed memory.
        lock(&self.buffers)?
            .remove(&ptr.0)
            .map(drop)
            .ok_or_else(|| anyhow!("invalid device pointer {:#x}", ptr.0))
    }

    unsafe fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> Result<IpcHandleBytes> {
        let device = lock(&self.buffer_devices)?.get(&ptr.0).copied().unwrap_or(-1);
        if self.device(device).is_ok_and(|d| d.lacks(SimulatedDevice::NoLegacyIpc)) {
            return Err(failed(
                "cuIpcGetMemHandle",
                super::code::NOT_SUPPORTED,
                "CUDA_ERROR_NOT_SUPPORTED",
                "operation not supported",
            ));
        }
        Ok(self.buffer(ptr)?.handle(BUFFER_TAG))
    }

    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr> {
        refuse_own_pid("cuIpcOpenMemHandle", decode(handle, BUFFER_TAG)?.0)?;
        self.insert_buffer(Mapping::open(handle, BUFFER_TAG)?)
    }

    unsafe fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> Result<()> {
        // SAFETY: the same contract as `free`: a simulated mapping is closed like a buffer is freed.
        unsafe { self.free(ptr) }
    }

    fn create_interprocess_event(&self) -> Result<RawEvent> {
        // Like the CUDA driver, the counters live in a file in /dev/shm named by our pid, which replaces any
        // file of that name (made elsewhere by a process of the same pid number); removed only when this
        // process ends normally, so that the tests see what a killed exporter leaves.
        let n = self.next_event.fetch_add(1, Ordering::Relaxed) as i32;
        let name = event_file_name(std::process::id(), n);
        // A name of its own (another process of our pid number may be making the same one).
        let made = format!("{name}.new{:x}", self.random());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&made)
            .with_context(|| format!("creating {made}, as the CUDA driver does"))?;
        let placed = file
            .set_len(EVENT_BYTES as u64)
            .and_then(|()| std::fs::rename(&made, &name))
            .with_context(|| format!("making {name}, as the CUDA driver does"));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&made);
            return Err(e);
        }
        lock(&self.driver_files)?.push((name, file.try_clone().context("dup of an event file")?));
        let event = RawEvent(n as u64);
        lock(&self.events)?.insert(event.0, Arc::new(Event(Mapping::new(file, EVENT_BYTES)?, n)));
        Ok(event)
    }

    unsafe fn ipc_get_event_handle(&self, event: RawEvent) -> Result<IpcHandleBytes> {
        let n = self.event(event)?.1;
        Ok(encode(EVENT_TAG, std::process::id(), n, EVENT_BYTES as u64))
    }

    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent> {
        let (pid, n, len) = decode(handle, EVENT_TAG)?;
        ensure!(len == EVENT_BYTES as u64, "a simulated event handle declares {len} bytes");
        refuse_own_pid("cuIpcOpenEventHandle", pid)?;
        // By name, in this process's /dev/shm: whatever file has the name now.
        let name = event_file_name(pid, n);
        let map_failed = || {
            failed(
                "cuIpcOpenEventHandle",
                super::code::MAP_FAILED,
                "CUDA_ERROR_MAP_FAILED",
                "mapping of the event's file failed",
            )
        };
        let file = OpenOptions::new().read(true).write(true).open(&name).map_err(|_| map_failed())?;
        if file.metadata().map(|m| m.len()).ok() != Some(len) {
            return Err(map_failed());
        }
        let id = self.fresh();
        lock(&self.events)?.insert(id, Arc::new(Event(Mapping::new(file, EVENT_BYTES)?, n)));
        Ok(RawEvent(id))
    }

    unsafe fn destroy_event(&self, event: RawEvent) -> Result<()> {
        lock(&self.events)?.remove(&event.0).map(drop).ok_or_else(|| anyhow!("invalid event {:#x}", event.0))
    }

    unsafe fn record_event(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        let event = self.event(event)?;
        let generation = event.recorded().fetch_add(1, Ordering::AcqRel) + 1;
        self.enqueue(
            stream,
            Box::new(move || {
                event.completed().fetch_max(generation, Ordering::AcqRel);
            }),
        )
    }

    unsafe fn query_event(&self, event: RawEvent) -> Result<bool> {
        let event = self.event(event)?;
        Ok(event.reached(event.recorded().load(Ordering::Acquire)))
    }

    fn create_non_blocking_stream(&self) -> Result<RawStream> {
        let (sender, receiver) = channel::<Work>();
        let done = Arc::new(AtomicU64::new(0));
        let worker_done = Arc::clone(&done);
        std::thread::Builder::new()
            .name("simulated-stream".into())
            .spawn(move || {
                for work in receiver {
                    work();
                    worker_done.fetch_add(1, Ordering::AcqRel);
                }
            })
            .context("starting a simulated stream's worker thread")?;
        let id = self.fresh();
        let stream = Stream {
            queue: Mutex::new(Some(sender)),
            enqueued: AtomicU64::new(0),
            done,
            destroyed: Arc::new(AtomicBool::new(false)),
        };
        lock(&self.streams)?.insert(id, Arc::new(stream));
        Ok(RawStream(id))
    }

    unsafe fn destroy_stream(&self, stream: RawStream) -> Result<()> {
        // As with CUDA, queued work still runs; the worker ends when its queue is empty.
        let stream = lock(&self.streams)?.remove(&stream.0).ok_or_else(|| anyhow!("invalid stream"))?;
        stream.destroyed.store(true, Ordering::Release);
        lock(&stream.queue)?.take();
        Ok(())
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        let event = self.event(event)?;
        // The generation recorded now is the one to wait for, not one recorded later.
        let generation = event.recorded().load(Ordering::Acquire);
        let destroyed = Arc::clone(&self.stream(stream)?.destroyed);
        self.enqueue(
            stream,
            Box::new(move || poll_until(|| event.reached(generation), || destroyed.load(Ordering::Acquire))),
        )
    }

    unsafe fn query_stream(&self, stream: RawStream) -> Result<bool> {
        let stream = self.stream(stream)?;
        Ok(stream.done.load(Ordering::Acquire) == stream.enqueued.load(Ordering::Acquire))
    }

    fn load_kernel(&self, _image: &[u8], name: &CStr) -> Result<RawFunction> {
        ensure!(name == c"simpleKernel", "the simulation has no kernel {name:?}");
        Ok(RawFunction(1))
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
        (target, size, value): (DevicePtr, i32, u8),
    ) -> Result<()> {
        let size = usize::try_from(size).context("negative kernel size")?;
        let (mapping, start) = self.range(target, size)?;
        let delay = self.kernel_delay();
        self.enqueue(
            stream,
            Box::new(move || {
                std::thread::sleep(delay);
                // SAFETY: `range` checked that `size` bytes from `start` lie in the mapping, which this closure
                // keeps alive; other processes write it only when the events order them after this work.
                unsafe { std::ptr::write_bytes(start as *mut u8, value, size) };
                drop(mapping);
            }),
        )
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let (_mapping, start) = self.range(src, dst.len())?;
        // SAFETY: `range` checked that dst.len() bytes from `start` lie in a live mapping; `dst` is a distinct
        // host slice. The copy is done when this returns.
        unsafe { std::ptr::copy_nonoverlapping(start as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        let (dst_map, dst) = self.range(dst, bytes)?;
        let (src_map, src) = self.range(src, bytes)?;
        self.enqueue(
            stream,
            Box::new(move || {
                // SAFETY: both ranges lie in mappings this closure keeps alive (checked); `copy` allows overlap.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
                drop((dst_map, src_map));
            }),
        )
    }

    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, stream: RawStream) -> Result<()> {
        let (mapping, start) = self.range(dst, bytes)?;
        self.enqueue(
            stream,
            Box::new(move || {
                // SAFETY: the range lies in a mapping this closure keeps alive (checked).
                unsafe { std::ptr::write_bytes(start as *mut u8, value, bytes) };
                drop(mapping);
            }),
        )
    }

    fn supports(&self, device: i32, what: Capability) -> Result<bool> {
        let kind = self.device(device)?;
        Ok(match what {
            Capability::VirtualMemory | Capability::PosixFdHandles => !kind.lacks(SimulatedDevice::NoVmm),
            Capability::MemoryPools | Capability::PoolPosixFdHandles => !kind.lacks(SimulatedDevice::NoPools),
        })
    }

    fn stream_memops_unsupported(&self, device: i32) -> Result<Option<String>> {
        let lacks = self.device(device)?.lacks(SimulatedDevice::NoStreamMemops);
        Ok(lacks.then(|| format!("device {device} has no stream memory operations (simulated)")))
    }

    unsafe fn stream_write_u32(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
        let (mapping, word) = self.word(ptr)?;
        self.enqueue(
            stream,
            Box::new(move || {
                // SAFETY: `word` checked the aligned word lies in the mapping this closure keeps alive.
                unsafe { &*(word as *const AtomicU32) }.store(value, Ordering::Release);
                drop(mapping);
            }),
        )
    }

    unsafe fn stream_wait_u32_geq(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
        let (mapping, word) = self.word(ptr)?;
        let destroyed = Arc::clone(&self.stream(stream)?.destroyed);
        self.enqueue(
            stream,
            Box::new(move || {
                // SAFETY: as in `stream_write_u32`.
                let word = unsafe { &*(word as *const AtomicU32) };
                poll_until(|| word.load(Ordering::Acquire) >= value, || destroyed.load(Ordering::Acquire));
                drop(mapping);
            }),
        )
    }

    fn vmm_granularity(&self, device: i32) -> Result<usize> {
        self.device(device)?;
        Ok(SIMULATED_GRANULARITY)
    }

    fn vmm_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        self.device(device)?;
        ensure!(
            bytes.is_multiple_of(SIMULATED_GRANULARITY),
            "cuMemCreate: {bytes} bytes is not a multiple of the granularity"
        );
        let fd = memfd_create(c"simple-ipc-simulated-vmm", MFdFlags::MFD_CLOEXEC).context("memfd_create")?;
        let file = File::from(fd);
        file.set_len(bytes as u64).context("sizing a simulated allocation")?;
        let id = self.fresh();
        lock(&self.allocations)?.insert(id, file);
        Ok(RawAllocation(id))
    }

    unsafe fn vmm_export(&self, allocation: RawAllocation) -> Result<OwnedFd> {
        let allocations = lock(&self.allocations)?;
        let file = allocations.get(&allocation.0).ok_or_else(|| anyhow!("invalid allocation"))?;
        Ok(OwnedFd::from(file.try_clone().context("dup")?))
    }

    fn vmm_import(&self, fd: BorrowedFd) -> Result<RawAllocation> {
        let file = File::from(fd.try_clone_to_owned().context("dup")?);
        let bytes = file.metadata().context("fstat of an imported allocation")?.len() as usize;
        ensure!(
            bytes > 0 && bytes.is_multiple_of(SIMULATED_GRANULARITY),
            "cuMemImportFromShareableHandle: not a simulated allocation ({bytes} bytes)"
        );
        let id = self.fresh();
        lock(&self.allocations)?.insert(id, file);
        Ok(RawAllocation(id))
    }

    unsafe fn vmm_map(&self, allocation: RawAllocation, bytes: usize, device: i32) -> Result<DevicePtr> {
        self.device(device)?;
        let file = {
            let allocations = lock(&self.allocations)?;
            let file = allocations.get(&allocation.0).ok_or_else(|| anyhow!("invalid allocation"))?;
            file.try_clone().context("dup")?
        };
        ensure!(
            file.metadata()?.len() == bytes as u64,
            "cuMemMap: the allocation does not have {bytes} bytes"
        );
        self.insert_buffer(Mapping::at(file, 0, bytes)?)
    }

    unsafe fn vmm_unmap(&self, ptr: DevicePtr, _bytes: usize) -> Result<()> {
        // SAFETY: the same contract as `free`.
        unsafe { self.free(ptr) }
    }

    unsafe fn vmm_release(&self, allocation: RawAllocation) -> Result<()> {
        lock(&self.allocations)?.remove(&allocation.0).map(drop).ok_or_else(|| anyhow!("invalid allocation"))
    }

    fn pool_create(&self, device: i32) -> Result<RawPool> {
        self.device(device)?;
        let fd = memfd_create(c"simple-ipc-simulated-pool", MFdFlags::MFD_CLOEXEC).context("memfd_create")?;
        let id = self.fresh();
        lock(&self.pools)?.insert(id, (File::from(fd), 0));
        Ok(RawPool(id))
    }

    unsafe fn pool_export(&self, pool: RawPool) -> Result<OwnedFd> {
        let pools = lock(&self.pools)?;
        let (file, _) = pools.get(&pool.0).ok_or_else(|| anyhow!("invalid pool"))?;
        Ok(OwnedFd::from(file.try_clone().context("dup")?))
    }

    fn pool_import(&self, fd: BorrowedFd, device: i32) -> Result<RawPool> {
        self.device(device)?;
        let file = File::from(fd.try_clone_to_owned().context("dup")?);
        let id = self.fresh();
        lock(&self.pools)?.insert(id, (file, 0));
        Ok(RawPool(id))
    }

    unsafe fn pool_alloc(&self, pool: RawPool, bytes: usize) -> Result<DevicePtr> {
        let (file, offset) = {
            let mut pools = lock(&self.pools)?;
            let (file, used) = pools.get_mut(&pool.0).ok_or_else(|| anyhow!("invalid pool"))?;
            let offset = *used;
            *used += (bytes as u64).next_multiple_of(page_size());
            file.set_len(*used).context("growing a simulated pool")?;
            (file.try_clone().context("dup")?, offset)
        };
        let ptr = self.insert_buffer(Mapping::at(file, offset, bytes)?)?;
        lock(&self.pool_offsets)?.insert(ptr.0, offset);
        Ok(ptr)
    }

    unsafe fn pool_export_pointer(&self, ptr: DevicePtr) -> Result<IpcHandleBytes> {
        let offset =
            lock(&self.pool_offsets)?.get(&ptr.0).copied().ok_or_else(|| anyhow!("not a pool allocation"))?;
        let len = self.buffer(ptr)?.map.len() as u64;
        let mut data = encode(POOL_POINTER_TAG, 0, 0, len);
        data[24..32].copy_from_slice(&offset.to_le_bytes());
        Ok(data)
    }

    unsafe fn pool_import_pointer(&self, pool: RawPool, data: &IpcHandleBytes) -> Result<DevicePtr> {
        let (_, _, len) = decode(data, POOL_POINTER_TAG)?;
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&data[24..32]);
        let offset = u64::from_le_bytes(offset);
        let file = {
            let pools = lock(&self.pools)?;
            let (file, _) = pools.get(&pool.0).ok_or_else(|| anyhow!("invalid pool"))?;
            file.try_clone().context("dup")?
        };
        let size = file.metadata()?.len();
        ensure!(offset + len <= size, "cuMemPoolImportPointer: the pointer lies outside the pool");
        self.insert_buffer(Mapping::at(file, offset, len as usize)?)
    }

    unsafe fn pool_free(&self, ptr: DevicePtr) -> Result<()> {
        lock(&self.pool_offsets)?.remove(&ptr.0);
        // SAFETY: the same contract as `free`.
        unsafe { self.free(ptr) }
    }

    unsafe fn pool_destroy(&self, pool: RawPool) -> Result<()> {
        lock(&self.pools)?.remove(&pool.0).map(drop).ok_or_else(|| anyhow!("invalid pool"))
    }

    unsafe fn pin_host_memory(&self, _host: &mut [u8]) -> Result<bool> {
        Ok(false)
    }

    unsafe fn unpin_host_memory(&self, _host: &mut [u8]) -> Result<()> {
        bail!("the simulation never pins host memory")
    }
}
