//! The POSIX shared memory segment `simpleIPCshm<parent pid>`: its layout, its creation by the parent, its
//! checked opening by a child, and the removal of its name.
//!
//! The layout keeps the original's fields in the original's order (`nprocesses`, `barrier`, `sense`,
//! `devices`, `memHandle`, `eventHandle`), behind a header the child checks before it trusts anything, and
//! followed by the port's own fields. Every field is an atomic, so any bytes are a valid `SharedState` and
//! several processes may touch any field at once; plain data is published by the parent through `phase`.

use std::fs::File;
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

use anyhow::{Context, Result, bail, ensure};
use memmap2::MmapRaw;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::mman::{shm_open, shm_unlink};
use nix::sys::stat::{Mode, fstat};

use crate::barrier::Barrier;
use crate::futex;

/// Most processes in one run: the original's `MAX_DEVICES`, one slot per process.
pub const MAX_PROCESSES: usize = 32;
/// Bytes in each process's buffer (the original's `DATA_SIZE`).
pub const DATA_SIZE: usize = 64 * 1024 * 1024;
/// Bytes in each buffer on simulated devices: small, so that tests with 32 processes on 2 cores stay quick.
pub const SIMULATED_DATA_SIZE: usize = 256 * 1024;

/// The size of every process's buffer: the original's, or the simulation's.
pub fn data_size(simulated: bool) -> usize {
    if simulated { SIMULATED_DATA_SIZE } else { DATA_SIZE }
}
/// `"SIMPLIPC"`, the first eight bytes of every segment this program makes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SIMPLIPC");
/// `SharedState::options` bit: children pin themselves to their GPU's NUMA node.
pub const OPTION_BIND_NUMA: u32 = 1;
/// Changes whenever `SharedState` does, so that mismatched binaries refuse each other's segments.
pub const LAYOUT_VERSION: u32 = 2;
/// Bytes of an IPC memory or event handle (`CU_HANDLE_SIZE`): the segment carries them as opaque bytes.
pub const HANDLE_SIZE: usize = 64;
/// The bytes of one handle.
pub type HandleBytes = [u8; HANDLE_SIZE];
/// Phase timings each process can leave in the segment (see `timings`).
pub const TIMING_SLOTS: usize = 16;

/// Where the run stands; children wait on it (it is also a futex word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum RunState {
    /// Header and devices written; buffers and events not yet exported.
    Starting = 0,
    /// Every handle is in the segment: children may open them.
    Ready = 1,
    /// A process failed or the run was interrupted: everybody stops.
    Aborted = 2,
}

/// One IPC handle's 64 bytes, as atomics.
#[repr(C)]
pub struct HandleSlot([AtomicU64; HANDLE_SIZE / 8]);

impl HandleSlot {
    pub fn store(&self, handle: &HandleBytes) {
        for (word, bytes) in self.0.iter().zip(handle.chunks_exact(8)) {
            let mut le = [0u8; 8];
            le.copy_from_slice(bytes);
            word.store(u64::from_le_bytes(le), Ordering::Relaxed);
        }
    }

    pub fn load(&self) -> HandleBytes {
        let mut handle = [0u8; HANDLE_SIZE];
        for (word, bytes) in self.0.iter().zip(handle.chunks_exact_mut(8)) {
            bytes.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        handle
    }
}

/// The IPC benchmark's shared words: the consumer raises `ping`, the producer answers with `pong`.
#[repr(C)]
pub struct BenchFlags {
    /// Bytes of the buffer the producer has just published.
    pub size: AtomicU64,
    pub ping: AtomicU32,
    pub pong: AtomicU32,
}

/// The segment's contents (`shmStruct` in the original, plus a header and the port's fields).
#[repr(C)]
pub struct SharedState {
    // Header: written once by the parent before any child starts.
    pub magic: AtomicU64,
    pub layout_version: AtomicU32,
    pub procs_per_device: AtomicU32,
    pub segment_size: AtomicU64,
    pub data_size: AtomicU64,
    pub parent_pid: AtomicU32,
    /// Padding: keeps the original's fields 8-byte aligned.
    pub _reserved: AtomicU32,

    // The original's fields.
    pub nprocesses: AtomicU64,
    pub barrier: AtomicI32,
    pub sense: AtomicU32,
    pub devices: [AtomicI32; MAX_PROCESSES],
    pub mem_handles: [HandleSlot; MAX_PROCESSES],
    pub event_handles: [HandleSlot; MAX_PROCESSES],

    // The port's fields.
    /// A [`RunState`].
    pub run_state: AtomicU32,
    /// Children that have mapped the segment; the one that completes the count removes the name.
    pub attached: AtomicU32,
    /// Children that have opened every handle.
    pub opened: AtomicU32,
    /// Children that have verified their buffer and closed every handle they opened.
    pub finished: AtomicU32,
    /// Set by whoever removes the segment's name, so that it is removed exactly once.
    pub name_removed: AtomicBool,
    /// The phase each process is in (see `timings::progress_of`), for the watchdog's report.
    pub progress: [AtomicU32; MAX_PROCESSES],
    /// Phase timings in microseconds, per process (see `timings`).
    pub timings: [[AtomicU64; TIMING_SLOTS]; MAX_PROCESSES],

    /// The IPC benchmark's hand-over flags (see `bench`).
    pub bench: BenchFlags,
    /// Bit 0: children pin themselves to the CPUs of their device's NUMA node (`--bind-numa`).
    pub options: AtomicU32,
}

impl SharedState {
    pub fn run_state(&self) -> RunState {
        match self.run_state.load(Ordering::Acquire) {
            0 => RunState::Starting,
            1 => RunState::Ready,
            _ => RunState::Aborted,
        }
    }

    pub fn process_count(&self) -> usize {
        self.nprocesses.load(Ordering::Relaxed) as usize
    }

    pub fn data_size(&self) -> usize {
        self.data_size.load(Ordering::Relaxed) as usize
    }

    /// The original's sense-reversal barrier over `barrier` and `sense`, for `participants` processes.
    pub fn barrier(&self, participants: usize) -> Barrier<'_> {
        Barrier::new(&self.barrier, &self.sense, participants)
    }

    /// Device of process `index`.
    pub fn device_of(&self, index: usize) -> i32 {
        self.devices[index].load(Ordering::Relaxed)
    }

    /// Writes who runs where, before any child starts.
    pub fn describe_run(&self, run: &RunPlan) {
        self.nprocesses.store(run.devices.len() as u64, Ordering::Relaxed);
        self.procs_per_device.store(run.procs_per_device as u32, Ordering::Relaxed);
        self.data_size.store(run.data_size as u64, Ordering::Relaxed);
        self.options.store(run.options, Ordering::Relaxed);
        for (slot, &device) in self.devices.iter().zip(run.devices) {
            slot.store(device, Ordering::Relaxed);
        }
    }

    /// Lets the waiting children go on: every handle is in the segment (release order publishes them).
    pub fn publish_ready(&self) {
        let _ = self.run_state.compare_exchange(
            RunState::Starting as u32,
            RunState::Ready as u32,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        futex::wake_all(&self.run_state);
    }

    /// Tells every process to stop, and wakes whoever sleeps in a wait.
    pub fn abort(&self) {
        self.run_state.store(RunState::Aborted as u32, Ordering::Release);
        futex::wake_all(&self.run_state);
        futex::wake_all(&self.sense);
    }

    /// Checks what a child relies on, so that a forged, stale, zeroed or foreign segment is refused.
    pub fn validate(&self, actual_size: usize) -> Result<()> {
        let magic = self.magic.load(Ordering::Relaxed);
        ensure!(magic == MAGIC, "not a simple-ipc segment (magic {magic:#018x}, expected {MAGIC:#018x})");
        let version = self.layout_version.load(Ordering::Relaxed);
        ensure!(
            version == LAYOUT_VERSION,
            "segment layout version {version}, this program reads version {LAYOUT_VERSION}"
        );
        let declared = self.segment_size.load(Ordering::Relaxed);
        ensure!(
            declared == actual_size as u64 && actual_size == size_of::<SharedState>(),
            "segment declares {declared} bytes and has {actual_size}; this program's layout has {}",
            size_of::<SharedState>()
        );
        let n = self.process_count();
        ensure!(
            (1..=MAX_PROCESSES).contains(&n),
            "segment declares {n} processes (1 to {MAX_PROCESSES} allowed)"
        );
        let data = self.data_size();
        ensure!(
            data > 0 && data <= i32::MAX as usize,
            "segment declares buffers of {data} bytes (1 to {} allowed)",
            i32::MAX
        );
        for (i, device) in self.devices.iter().take(n).enumerate() {
            let device = device.load(Ordering::Relaxed);
            ensure!(device >= 0, "segment gives process {i} the invalid device {device}");
        }
        Ok(())
    }
}

/// Who runs where: what the parent tells its children before they start.
pub struct RunPlan<'a> {
    /// Device of each process: process `i` runs on `devices[i]`.
    pub devices: &'a [i32],
    pub procs_per_device: usize,
    /// Bytes in each process's buffer.
    pub data_size: usize,
    /// `OPTION_*` bits.
    pub options: u32,
}

/// The segment's name for the parent with process id `pid`.
pub fn name_for(pid: u32) -> String {
    format!("simpleIPCshm{pid}")
}

/// A mapped segment. The parent's copy removes the name on drop; a child's only unmaps.
pub struct Segment {
    name: String,
    map: MmapRaw,
    owner: bool,
}

impl Segment {
    /// Creates the segment exclusively, mode 0600, and writes its header. An existing object of that name is
    /// refused and left untouched.
    pub fn create(name: &str) -> Result<Self> {
        let fd = match shm_open(
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
            Mode::S_IRUSR | Mode::S_IWUSR,
        ) {
            Err(Errno::EEXIST) => bail!(
                "shared memory object /dev/shm/{name} already exists; refusing to reuse or remove it \
                 (another program made it, or an old run left it: remove it yourself if you know it is stale)"
            ),
            other => other.with_context(|| format!("shm_open(/dev/shm/{name}, O_CREAT | O_EXCL)"))?,
        };
        // The name is ours from here on: removed again if the object cannot be sized or mapped.
        let file = File::from(fd);
        let mapped = file
            .set_len(size_of::<SharedState>() as u64)
            .with_context(|| format!("ftruncate({name})"))
            .and_then(|()| MmapRaw::map_raw(&file).with_context(|| format!("mmap({name})")));
        let map = match mapped {
            Ok(map) => map,
            Err(e) => {
                let _ = shm_unlink(name);
                return Err(e);
            }
        };
        let segment = Self { name: name.to_owned(), map, owner: true };
        let state = segment.state();
        state.magic.store(MAGIC, Ordering::Relaxed);
        state.layout_version.store(LAYOUT_VERSION, Ordering::Relaxed);
        state.segment_size.store(size_of::<SharedState>() as u64, Ordering::Relaxed);
        state.parent_pid.store(std::process::id(), Ordering::Relaxed);
        Ok(segment)
    }

    /// Opens and maps the segment of a parent, after checking the object's owner and size, and then the
    /// header: a short object is refused before it is mapped, so it cannot raise SIGBUS.
    pub fn open(name: &str) -> Result<Self> {
        let fd = shm_open(name, OFlag::O_RDWR, Mode::empty())
            .with_context(|| format!("shm_open(/dev/shm/{name})"))?;
        let stat = fstat(&fd).with_context(|| format!("fstat({name})"))?;
        let me = nix::unistd::geteuid();
        ensure!(
            stat.st_uid == me.as_raw(),
            "/dev/shm/{name} belongs to uid {}, not to us ({me})",
            stat.st_uid
        );
        let size = usize::try_from(stat.st_size).unwrap_or(0);
        ensure!(
            size == size_of::<SharedState>(),
            "/dev/shm/{name} has {size} bytes; a segment has {}",
            size_of::<SharedState>()
        );
        let map = MmapRaw::map_raw(&File::from(fd)).with_context(|| format!("mmap({name})"))?;
        let segment = Self { name: name.to_owned(), map, owner: false };
        segment.state().validate(size).with_context(|| format!("/dev/shm/{name} is not a usable segment"))?;
        Ok(segment)
    }

    pub fn state(&self) -> &SharedState {
        // SAFETY: the mapping is page-aligned and at least size_of::<SharedState>() bytes (checked on open, set
        // on create) and lives as long as `self`; every field is an atomic, so any bytes are a valid value and
        // concurrent access from other processes is allowed.
        unsafe { &*self.map.as_ptr().cast::<SharedState>() }
    }

    /// Removes the name from `/dev/shm` (once, whoever calls it first); the mappings stay valid.
    pub fn remove_name(&self) -> Result<()> {
        if self.state().name_removed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match shm_unlink(self.name.as_str()) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("shm_unlink({})", self.name)),
        }
    }

    /// A child reports that it has mapped the segment; the last one removes the name, so that nothing is left
    /// in `/dev/shm` even if the parent is killed later.
    pub fn mark_attached(&self) -> Result<()> {
        let state = self.state();
        let attached = state.attached.fetch_add(1, Ordering::AcqRel) + 1;
        if attached as usize == state.process_count() {
            self.remove_name()?;
        }
        Ok(())
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owner
            && let Err(e) = self.remove_name()
        {
            eprintln!("warning: {e:#}");
        }
    }
}
