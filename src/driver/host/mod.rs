//! A [`Driver`](super::Driver) in host memory, so that the process protocol (segment, children, barrier,
//! handles, ordering, faults, signals, clean-up) runs for real in `cargo test` on machines without a GPU.
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
//! `/dev/shm/cuda.shm.<uid, hex>.<pid, hex>.<n>` named by the uid and the pid the exporter has in its own PID namespace: a second
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
//! `no-pools`, `no-memops` (no stream memory operations), `no-fabric` (the device does not report fabric
//! handles); or a feature, `imex`: the process has an IMEX channel, `mps`: an MPS daemon serves its
//! contexts (the driver's `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`); or a place, `mig` (the device is a MIG
//! device of its own, named `MIG-...`), `wsl` (the machine is WSL2: legacy IPC handles fail) or `no-pidfd`
//! (the machine's kernel lacks `pidfd_getfd`, which `--fds pidfd` calls for real otherwise), or `slow-init`
//! (`cuInit` takes a second in every process, which then says it ended). Without `imex` a device reports fabric
//! handles but `cuMemCreate` of a fabric-shareable allocation answers `CUDA_ERROR_NOT_PERMITTED`, as on the
//! H200 host (driver 580, no `/dev/nvidia-caps-imex-channels/`). Several are joined by `+` (`ok+imex`). An
//! empty value is a machine without devices. `CUDA_VISIBLE_DEVICES` is honoured as by the driver: a list of
//! ordinals or UUIDs (`GPU-...`, or a prefix of one) keeps those devices, in that order, each with its UUID;
//! the list ends at the first entry that names none; a list that keeps none makes `cuInit` answer
//! `CUDA_ERROR_NO_DEVICE`.
//!
//! The virtual memory management API and memory pools are simulated with descriptors too: an allocation or
//! a pool is a memfd, exported as a new descriptor of it (which the program passes over a Unix socket), and
//! a pool's allocations are page-aligned ranges of its memfd. A fabric handle is a VMM allocation's memfd
//! named like legacy memory, by the exporter's pid and descriptor (see [`vmm`]). Host memory is "pinned" by noting its range.
//!
//! Every failure the simulation answers for the driver is a [`CallFailed`] with the `CUresult` the CUDA
//! driver gives in that case (a freed pointer, a destroyed stream, a handle of the wrong kind, memory freed
//! by the call of another kind of memory), its text marked `(simulated: why)`. When the driver is dropped
//! (the process ends its CUDA use) it says on standard error what the process still holds, one line:
//! `simulated driver: process <pid> ended holding 1 device buffer, 2 opened IPC buffers`; the tests fail on
//! that line, so every owner's `Drop` is seen to do its work. A process that exits without dropping its
//! driver (killed, or `exit` from a signal handler) says nothing.
//!
//! The simulation by concern, each file implementing the trait of its name for [`HostDriver`]: [`devices`]
//! (the devices' answers), [`memory`] (every addressable buffer, `cuMemAlloc`, pinned host memory),
//! [`ipc`] (legacy IPC memory handles, and the shape of every simulated handle), [`events`] (interprocess
//! events and their `/dev/shm` files), [`streams`] (streams, copies, stream memory operations), [`kernels`],
//! [`vmm`], [`fabric`] and [`pool`]. This file holds the driver, its devices as the environment chose
//! them, and what the tables share.

mod asked;
mod devices;
mod events;
mod fabric;
mod ipc;
mod kernels;
mod memory;
mod pool;
mod streams;
mod vmm;

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use anyhow::{Result, anyhow};

use super::devices::foreign_proc;
use super::error::{CallFailed, code};
use asked::visible_devices;
pub use asked::*;

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
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` is 0.
    NoFabric,
    /// A feature, not a defect: this process has an IMEX channel, so it may create fabric-shareable
    /// allocations (without it the device reports fabric handles but `cuMemCreate` refuses them).
    Imex,
    /// A feature: an MPS daemon serves this process's contexts on the device (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`
    /// reads 1), as NVIDIA's daemon does; a stand-in daemon's socket alone makes no client.
    Mps,
    /// The device is a MIG device (a GPU instance of its own): its `DeviceInfo` names it `MIG-...`.
    Mig,
    /// The machine is WSL2 (as if `/dev/dxg` were present): legacy IPC handles fail on the device, as
    /// there; VMM and stream memory operations work.
    Wsl,
    /// The machine's kernel lacks `pidfd_getfd` (as Linux 5.3 to 5.5, which have `pidfd_open`): see
    /// [`kernel_lacks_pidfd_getfd`].
    NoPidfd,
    /// `cuInit` takes [`SLOW_INIT`] in every process, as a driver starting cold may, and each process says
    /// when its `cuInit` has ended: a process must not exit while a thread of its own is still in it.
    SlowInit,
}

/// How long `cuInit` takes with `slow-init`.
pub const SLOW_INIT: std::time::Duration = std::time::Duration::from_secs(1);

/// What a simulated device lacks: `ok`, or defects joined by `+` (`no-vmm+no-pools`).
#[derive(Clone)]
struct Defects(Vec<SimulatedDevice>);

impl Defects {
    fn lacks(&self, defect: SimulatedDevice) -> bool {
        self.0.contains(&defect)
    }

    /// Whether the device was given `feature` (`imex`).
    fn has(&self, feature: SimulatedDevice) -> bool {
        self.0.contains(&feature)
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
            "no-fabric" => Ok(SimulatedDevice::NoFabric),
            "imex" => Ok(SimulatedDevice::Imex),
            "mps" => Ok(SimulatedDevice::Mps),
            "mig" => Ok(SimulatedDevice::Mig),
            "wsl" => Ok(SimulatedDevice::Wsl),
            "no-pidfd" => Ok(SimulatedDevice::NoPidfd),
            "slow-init" => Ok(SimulatedDevice::SlowInit),
            other => Err(anyhow!("{SIMULATE_ENV}: unknown device kind {other:?}")),
        });
        Ok(Defects(defects.collect::<Result<Vec<_>>>()?))
    }
}

/// Host-memory stand-in for the CUDA driver: the devices, and one table per concern, each behind one lock.
pub struct HostDriver {
    /// The visible devices, each with its ordinal on the machine (its UUID's number), by `CUDA_VISIBLE_DEVICES`.
    devices: Vec<Defects>,
    physical: Vec<i32>,
    memory: memory::BufferTable,
    events: events::EventTable,
    streams: streams::StreamTable,
    vmm: vmm::AllocationTable,
    pools: pool::PoolTable,
    /// An xorshift state: kernel run times, names of temporary files.
    random: AtomicU64,
}

/// The /proc of the PID namespace this process was started in, kept before its own was mounted over it
/// (`--isolate pid`): where the exporter of a handle, the process that started this one, is visible. The
/// CUDA driver reaches another process's memory through its kernel module; the simulation, through this.
static OUTER_PROC: std::sync::OnceLock<std::os::fd::OwnedFd> = std::sync::OnceLock::new();

/// Keeps `proc` (a descriptor of the /proc this process had before it mounted its own).
pub fn keep_outer_proc(proc: std::os::fd::OwnedFd) {
    let _ = OUTER_PROC.set(proc);
}

thread_local! {
    /// The device `use_device` made current on this thread, as CUDA keeps it per thread.
    static CURRENT: std::cell::Cell<i32> = const { std::cell::Cell::new(-1) };
}

/// How the simulation says that what it was asked is beyond what it models (not how the driver answers).
pub const BEYOND_THE_SIMULATION: &str = "beyond the simulation";

/// A simulated driver call's failure: the code the CUDA driver answers in that case, in the driver's words,
/// and why the simulation answered it.
fn failed(call: impl Into<String>, code: u32, why: impl std::fmt::Display) -> anyhow::Error {
    failed_as(call.into(), code, why.to_string(), false)
}

/// A failure of the simulation's own (see [`BEYOND_THE_SIMULATION`]), not the driver's answer: typed as
/// such, so that a report tells it from the driver's.
fn beyond(call: impl Into<String>, code: u32, why: impl std::fmt::Display) -> anyhow::Error {
    failed_as(call.into(), code, format!("{BEYOND_THE_SIMULATION}: {why}"), true)
}

fn failed_as(call: String, code: u32, why: String, beyond_the_simulation: bool) -> anyhow::Error {
    let (name, words) = code::name_and_words(code);
    let text = format!("{name} ({code}): {words} (simulated: {why})");
    CallFailed { call, code, text, beyond_the_simulation }.into()
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
        let held = self.still_held();
        if !held.is_empty() {
            let line = format!(
                "simulated driver: process {} ended holding {}\n",
                std::process::id(),
                held.join(", ")
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
        // As the CUDA driver's cuInit in a PID namespace whose /proc is another's.
        if foreign_proc().is_some() {
            let why = "this process's pid is not the one /proc says";
            return Err(failed("cuInit", code::OPERATING_SYSTEM, why));
        }
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let spec = spec.to_string_lossy();
        let simulation = Self::new(&spec, visible.as_deref())?;
        if spec.split(',').flat_map(|kind| kind.split('+')).any(|kind| kind.trim() == "slow-init") {
            std::thread::sleep(SLOW_INIT);
            let line = format!("simulated driver: process {} ended cuInit (slow-init)\n", std::process::id());
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        Ok(Some(simulation))
    }

    /// The simulation of `spec`'s devices, for a unit test elsewhere (the environment is every test's).
    #[cfg(test)]
    pub(crate) fn for_tests(spec: &str) -> Result<Self> {
        Self::new(spec, None)
    }

    /// The simulation of the devices `spec` describes (the value of [`SIMULATE_ENV`]).
    fn new(spec: &str, visible: Option<&str>) -> Result<Self> {
        let all = spec
            .split(',')
            .filter(|kind| !kind.trim().is_empty())
            .map(Defects::parse)
            .collect::<Result<Vec<_>>>()?;
        let physical = match visible {
            None => (0..all.len() as i32).collect(),
            Some(list) => {
                let kept = visible_devices(list, all.len());
                if kept.is_empty() {
                    // As the CUDA driver's cuInit: CUDA_ERROR_NO_DEVICE, which means no GPU here.
                    return Err(crate::outcome::Waiver(format!(
                        "the CUDA driver has no GPU to offer: CUDA_ERROR_NO_DEVICE (simulated: \
                         CUDA_VISIBLE_DEVICES={list:?} names none of the {} devices)",
                        all.len()
                    ))
                    .into());
                }
                kept
            }
        };
        let devices = physical.iter().map(|&d| all[d as usize].clone()).collect();
        let seed = u64::from(std::process::id()) << 32
            | u64::from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos());
        Ok(Self {
            devices,
            physical,
            memory: memory::BufferTable::default(),
            events: events::EventTable::default(),
            streams: streams::StreamTable::default(),
            vmm: vmm::AllocationTable::default(),
            pools: pool::PoolTable::default(),
            random: AtomicU64::new(seed | 1),
        })
    }

    /// What this process still holds, table by table ("2 opened IPC buffers").
    fn still_held(&mut self) -> Vec<String> {
        let mut held = Held::default();
        self.memory.held(&mut held);
        self.events.held(&mut held);
        self.streams.held(&mut held);
        self.vmm.held(&mut held);
        self.pools.held(&mut held);
        held.0
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::devices::{Capability, Devices, uuid_text};
    use crate::driver::error::failed_code;
    use crate::driver::ipc::Ipc;
    use crate::driver::memory::Memory;
    use crate::driver::streams::Streams;

    /// `CUDA_VISIBLE_DEVICES` keeps the devices it names, in its order, each with its own UUID; the list
    /// ends at the first entry that names none; none kept is `cuInit`'s `CUDA_ERROR_NO_DEVICE`.
    #[test]
    fn cuda_visible_devices_is_honoured_as_by_the_driver() {
        let uuid = |d| uuid_text(&simulated_uuid(d));
        assert_eq!(visible_devices("1,0", 3), [1, 0]);
        assert_eq!(visible_devices("2,7,0", 3), [2], "the list ends at an ordinal that names none");
        assert_eq!(visible_devices(&uuid(2), 3), [2]);
        assert_eq!(visible_devices("", 3), Vec::<i32>::new());
        assert_eq!(visible_devices("GPU-", 3), Vec::<i32>::new());
        let sim = HostDriver::new("ok,no-vmm,ok", Some("1")).unwrap();
        assert_eq!(sim.device_count().unwrap(), 1);
        let info = sim.device_info(0).unwrap();
        assert_eq!(info.uuid, simulated_uuid(1), "device 0 here is the machine's device 1");
        assert!(!sim.supports(0, Capability::VirtualMemory).unwrap(), "with its defects");
        let none = HostDriver::new("ok,ok", Some("")).err().unwrap();
        assert!(none.is::<crate::outcome::Waiver>() && none.to_string().contains("CUDA_ERROR_NO_DEVICE"));
    }

    /// What is not freed is named when the driver goes away; freeing by the wrong call, or twice, is the
    /// CUresult CUDA answers.
    #[test]
    fn what_is_still_held_is_named_and_frees_must_match() {
        let mut sim = HostDriver::new("ok", None).unwrap();
        sim.use_device(0).unwrap();
        let buffer = sim.alloc(4096).unwrap();
        let stream = sim.create_non_blocking_stream().unwrap();
        let mut host = vec![0u8; 4096];
        // SAFETY: (test) every handle is this driver's; `host` outlives its pinning.
        unsafe {
            assert!(sim.pin_host_memory(&mut host).unwrap());
            assert_eq!(sim.still_held(), ["1 device buffer", "1 pinned host range", "1 stream"]);
            let wrong = sim.ipc_close_mem_handle(buffer).unwrap_err();
            assert_eq!(failed_code(&wrong), Some(code::INVALID_VALUE), "{wrong:#}");
            sim.free(buffer).unwrap();
            assert_eq!(failed_code(&sim.free(buffer).unwrap_err()), Some(code::INVALID_VALUE));
            sim.destroy_stream(stream).unwrap();
            assert_eq!(failed_code(&sim.destroy_stream(stream).unwrap_err()), Some(code::INVALID_HANDLE));
            sim.unpin_host_memory(&mut host).unwrap();
            let twice = sim.unpin_host_memory(&mut host).unwrap_err();
            assert_eq!(failed_code(&twice), Some(code::HOST_MEMORY_NOT_REGISTERED));
        }
        assert_eq!(sim.still_held(), Vec::<String>::new());
        assert_eq!(failed_code(&sim.use_device(1).unwrap_err()), Some(code::INVALID_DEVICE));
    }
}
