//! The shared memory segment `simpleIPCshm<parent pid>`: its layout, its creation by the parent, and its
//! checked opening by a child.
//!
//! The original opens `/dev/shm/simpleIPCshm<pid>` with `shm_open` and never removes it, and its children
//! find it by that name. Here the segment is the same kind of memory (shmem), made with `memfd_create` under
//! that name: it never has a name in `/dev/shm`, so no way of killing any process can leave a file, and two
//! runs in different PID namespaces (containers sharing `/dev/shm`, where each parent can be pid 1) cannot
//! collide. The children inherit its descriptor instead (`--segment-fd`). Its space is reserved when it is
//! made (`posix_fallocate`), so a full tmpfs or a file size limit is an error, not a SIGBUS later, and it
//! is sealed against growing and shrinking, so no process can make another's mapping fault.
//!
//! The layout keeps the original's fields in the original's order (`nprocesses`, `barrier`, `sense`,
//! `devices`, `memHandle`, `eventHandle`), behind a header the child checks before it trusts anything, and
//! followed by the port's own fields. Every field is an atomic, so any bytes are a valid `SharedState` and
//! several processes may touch any field at once; plain data is published by the parent through `phase`.

pub(crate) mod barrier;

use std::ffi::CString;
use std::fs::File;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use anyhow::{Context, Result, ensure};
use memmap2::MmapRaw;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::stat::fstat;

mod fields;
pub use fields::{BenchFlags, HandleSlot, RunState};

use crate::os::driver_files::{self, EventFile};
use crate::os::futex;
use crate::segment::barrier::Barrier;

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
/// `SharedState::options` bit: the round-robin is ordered by stream memory operations on a flag after each
/// buffer (`--sync memops`), not by the interprocess events.
pub const OPTION_SYNC_MEMOPS: u32 = 2;
/// The run is the IPC benchmark (`--bench`): a process that joins it is its producer.
pub const OPTION_BENCH: u32 = 4;
/// The importers fetch the vmm and pool descriptors with `pidfd_getfd` (`--fds pidfd`), by the numbers in
/// `SharedState::descriptor_numbers`, instead of receiving them over a socket.
pub const OPTION_FDS_PIDFD: u32 = 8;
/// Bytes after each buffer's data that hold its flag for `--sync memops` (a whole 256-byte line, so that the
/// flag shares it with nothing the kernel writes).
pub const FLAG_BYTES: usize = 256;
/// Changes whenever `SharedState` does, so that mismatched binaries refuse each other's segments.
pub const LAYOUT_VERSION: u32 = 10;
/// Bytes of an IPC memory or event handle (`CU_HANDLE_SIZE`): the segment carries them as opaque bytes.
pub const HANDLE_SIZE: usize = 64;
/// The bytes of one handle.
pub type HandleBytes = [u8; HANDLE_SIZE];
/// Phase timings each process can leave in the segment (see `timings`).
pub const TIMING_SLOTS: usize = 16;

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
    /// Children that have opened every handle.
    pub opened: AtomicU32,
    /// Children that have verified their buffer and closed every handle they opened.
    pub finished: AtomicU32,
    /// The phase each process is in (see `timings::progress_of`), for the watchdog's report.
    pub progress: [AtomicU32; MAX_PROCESSES],
    /// Each child's count of open descriptors before it opened the handles and after it closed them: a
    /// descriptor it received and did not close shows as a difference.
    pub descriptors: [[AtomicU32; 2]; MAX_PROCESSES],
    /// Phase timings in microseconds, per process (see `timings`).
    pub timings: [[AtomicU64; TIMING_SLOTS]; MAX_PROCESSES],

    /// The IPC benchmark's hand-over flags (see `bench`).
    pub bench: BenchFlags,
    /// Bit 0: children pin themselves to the CPUs of their device's NUMA node (`--bind-numa`).
    pub options: AtomicU32,
    /// How the buffers are shared: the code of an `ipc::Mechanism`.
    pub mechanism: AtomicU32,
    /// For each process's event, the driver's file behind it as its exporter maps it (a
    /// `driver_files::EventFile` record; empty where the exporter found none), so that an importer can tell
    /// that the event it opened is that one and not another process's of the same name.
    pub event_files: [HandleSlot; MAX_PROCESSES],
    /// The UUID of each process's device: a process that joins from another container may number the GPUs
    /// otherwise (see `join`), so it finds its device by this, not by `devices`. Zero: not given.
    pub device_uuids: [[AtomicU64; 2]; MAX_PROCESSES],
    /// With `--fds pidfd`: the number of the exporter's descriptor of each process's buffer, in its process
    /// (the parent's, or the server's), for `pidfd_getfd`.
    pub descriptor_numbers: [AtomicI32; MAX_PROCESSES],
}

impl SharedState {
    pub fn run_state(&self) -> RunState {
        match self.run_state.load(Ordering::Acquire) {
            0 => RunState::Planning,
            1 => RunState::Starting,
            2 => RunState::Ready,
            4 => RunState::Waived,
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

    /// The UUID of process `index`'s device, if the parent gave one.
    pub fn device_uuid_of(&self, index: usize) -> Option<[u8; 16]> {
        let mut uuid = [0u8; 16];
        for (word, bytes) in self.device_uuids[index].iter().zip(uuid.chunks_exact_mut(8)) {
            bytes.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        (uuid != [0; 16]).then_some(uuid)
    }

    /// How the round-robin is ordered (`--sync`), as the parent wrote it.
    pub(crate) fn sync(&self) -> crate::ipc::Sync {
        match self.options.load(Ordering::Relaxed) & OPTION_SYNC_MEMOPS {
            0 => crate::ipc::Sync::Events,
            _ => crate::ipc::Sync::Memops,
        }
    }

    /// Writes who runs where, and lets the children that started before it was known go on (`Planning` to
    /// `Starting`, in release order: what they read next is written).
    pub fn describe_run(&self, run: &RunPlan) {
        self.nprocesses.store(run.devices.len() as u64, Ordering::Relaxed);
        self.procs_per_device.store(run.procs_per_device as u32, Ordering::Relaxed);
        self.data_size.store(run.data_size as u64, Ordering::Relaxed);
        self.options.store(run.options, Ordering::Relaxed);
        self.mechanism.store(run.mechanism, Ordering::Relaxed);
        for (slot, &device) in self.devices.iter().zip(run.devices) {
            slot.store(device, Ordering::Relaxed);
        }
        for (slot, uuid) in self.device_uuids.iter().zip(run.uuids) {
            for (word, bytes) in slot.iter().zip(uuid.chunks_exact(8)) {
                let mut le = [0u8; 8];
                le.copy_from_slice(bytes);
                word.store(u64::from_le_bytes(le), Ordering::Relaxed);
            }
        }
        self.advance(RunState::Planning, RunState::Starting);
    }

    /// The run goes from `from` to `to`, and whoever waits on it wakes; a run that has left `from` (aborted,
    /// waived) stays where it is.
    fn advance(&self, from: RunState, to: RunState) {
        let _ = self.run_state.compare_exchange(from as u32, to as u32, Ordering::AcqRel, Ordering::Acquire);
        futex::wake_all(&self.run_state);
    }

    /// Places process `index` on `device`, whose UUID is `uuid` (the benchmark's producer, at each pair).
    pub fn place(&self, index: usize, device: i32, uuid: &[u8; 16]) {
        self.devices[index].store(device, Ordering::Relaxed);
        for (word, bytes) in self.device_uuids[index].iter().zip(uuid.chunks_exact(8)) {
            let mut le = [0u8; 8];
            le.copy_from_slice(bytes);
            word.store(u64::from_le_bytes(le), Ordering::Relaxed);
        }
    }

    /// Writes the handle of process `slot`'s event, and the driver's file behind it as the exporter maps it.
    pub fn publish_event(&self, slot: usize, handle: &HandleBytes, file: Option<&EventFile>) {
        self.event_handles[slot].store(handle);
        self.event_files[slot].store(&file.map_or([0; driver_files::RECORD_BYTES], EventFile::to_record));
    }

    /// The driver's file behind process `slot`'s event, as its exporter published it.
    pub fn event_file(&self, slot: usize) -> Option<EventFile> {
        EventFile::from_record(&self.event_files[slot].load())
    }

    /// Lets the waiting children go on: every handle is in the segment (release order publishes them).
    pub fn publish_ready(&self) {
        self.advance(RunState::Starting, RunState::Ready);
    }

    /// Tells every process to stop, and wakes whoever sleeps in a wait.
    pub fn abort(&self) {
        // A waived run stays waived: its children stop as they would, without a word of failure.
        let waived = RunState::Waived as u32;
        let _ = self.run_state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            (s != waived).then_some(RunState::Aborted as u32)
        });
        futex::wake_all(&self.run_state);
        futex::wake_all(&self.sense);
    }

    /// The run is waived after its children started (the mechanism is missing): they stop quietly.
    pub fn waive(&self) {
        self.run_state.store(RunState::Waived as u32, Ordering::Release);
        futex::wake_all(&self.run_state);
        futex::wake_all(&self.sense);
    }

    /// Checks what a child relies on, so that a forged, stale, zeroed or foreign segment is refused: the
    /// header, and the plan where it is written (else [`SharedState::validate_plan`] once it is).
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
        match self.run_state() {
            // Not written yet, or never to be (the run was waived or aborted before): the wait for it stops.
            RunState::Planning | RunState::Waived | RunState::Aborted => Ok(()),
            RunState::Starting | RunState::Ready => self.validate_plan(),
        }
    }

    /// Checks the run's plan (`describe_run`): the number of processes, the buffers' size, the devices.
    pub fn validate_plan(&self) -> Result<()> {
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
    /// The UUID of each process's device (or none: every process sees the parent's numbering).
    pub uuids: &'a [[u8; 16]],
    pub procs_per_device: usize,
    /// Bytes in each process's buffer.
    pub data_size: usize,
    /// `OPTION_*` bits.
    pub options: u32,
    /// The code of the `ipc::Mechanism` that shares the buffers.
    pub mechanism: u32,
}

/// The segment's name for the parent with process id `pid`.
pub fn name_for(pid: u32) -> String {
    format!("simpleIPCshm{pid}")
}

/// The seals every segment carries: its size can never change.
fn seals() -> SealFlag {
    SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL
}

/// A mapped segment, with its descriptor (which the parent hands to its children).
pub struct Segment {
    fd: OwnedFd,
    map: MmapRaw,
}

impl Segment {
    /// Creates the segment: anonymous shared memory called `name`, its space reserved, its size sealed, its
    /// header written. Its descriptor is closed on exec unless a child is let to inherit it.
    pub fn create(name: &str) -> Result<Self> {
        let bytes = size_of::<SharedState>();
        let c_name = CString::new(name).context("segment name")?;
        let fd = memfd_create(c_name.as_c_str(), MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .with_context(|| format!("memfd_create({name})"))?;
        nix::fcntl::posix_fallocate(&fd, 0, bytes as i64).with_context(|| {
            format!(
                "reserving {bytes} bytes of shared memory for the segment {name} (is memory or tmpfs full?)"
            )
        })?;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals())).with_context(|| format!("sealing the segment {name}"))?;
        let map = MmapRaw::map_raw(&File::from(fd.try_clone().context("dup")?))
            .with_context(|| format!("mmap({name})"))?;
        let segment = Self { fd, map };
        let state = segment.state();
        state.magic.store(MAGIC, Ordering::Relaxed);
        state.layout_version.store(LAYOUT_VERSION, Ordering::Relaxed);
        state.segment_size.store(bytes as u64, Ordering::Relaxed);
        state.parent_pid.store(std::process::id(), Ordering::Relaxed);
        Ok(segment)
    }

    /// The descriptor a child gets (`--segment-fd`; see `inherit::keep_across_exec`).
    /// The descriptor, borrowed: what a joiner is handed over the run's socket.
    pub fn fd_borrowed(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Maps the segment a child inherited as descriptor `fd`, after checking it: ours (owner), sealed, of
    /// the layout's size, then its header. A short or growable object is refused before it is mapped, so it
    /// cannot raise SIGBUS.
    pub fn open_inherited(fd: RawFd) -> Result<Self> {
        Self::open(crate::os::inherit::take(fd, "segment")?)
    }

    /// [`Segment::open_inherited`], for a descriptor this process was handed over a socket (`--join`).
    pub fn open(fd: OwnedFd) -> Result<Self> {
        let stat = fstat(&fd).context("fstat(segment descriptor)")?;
        let me = nix::unistd::geteuid();
        ensure!(stat.st_uid == me.as_raw(), "the segment belongs to uid {}, not to us ({me})", stat.st_uid);
        let sealed = fcntl(&fd, FcntlArg::F_GET_SEALS).map(SealFlag::from_bits_truncate);
        ensure!(
            sealed.is_ok_and(|s| s.contains(seals())),
            "the segment's size is not sealed: it is not one that simple-ipc made"
        );
        let size = usize::try_from(stat.st_size).unwrap_or(0);
        ensure!(
            size == size_of::<SharedState>(),
            "the segment has {size} bytes; a segment has {}",
            size_of::<SharedState>()
        );
        let map = MmapRaw::map_raw(&File::from(fd.try_clone().context("dup")?)).context("mmap(segment)")?;
        let segment = Self { fd, map };
        segment.state().validate(size).context("not a usable segment")?;
        Ok(segment)
    }

    pub fn state(&self) -> &SharedState {
        // SAFETY: the mapping is page-aligned and at least size_of::<SharedState>() bytes (checked on open, set
        // on create, sealed) and lives as long as `self`; every field is an atomic, so any bytes are a valid
        // value and concurrent access from other processes is allowed.
        unsafe { &*self.map.as_ptr().cast::<SharedState>() }
    }
}
