//! Simulated device memory: one table of every buffer this process can address, keyed by its address, with
//! what made it (`cuMemAlloc`, a legacy IPC open, a VMM mapping, a pool allocation or an imported pool
//! pointer), so that each is freed only by the call that matches its kind, as with CUDA, and the driver can
//! say what is left when it goes away; legacy IPC memory handles; and the host ranges pinned, in the same
//! table. [`Mapping`], a shared mapping of a memfd or a file, is what every kind of memory and every event
//! lives in.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow, ensure};
use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::{CURRENT, Held, HostDriver, SimulatedDevice, beyond, failed, lock, owned};
use crate::driver::{DevicePtr, IPC_HANDLE_SIZE, IpcHandleBytes, code};

const BUFFER_TAG: &[u8; 8] = b"SIMIPC\0\x02";

/// A shared mapping of a memfd or a file: a buffer, or an event's counters.
pub(super) struct Mapping {
    map: MmapRaw,
    /// Kept open by the exporter so that other processes can open `/proc/<pid>/fd/<fd>`.
    file: File,
}

impl Mapping {
    /// Maps all of `file`, which must have `bytes` bytes.
    pub(super) fn new(file: File, bytes: usize) -> Result<Arc<Self>> {
        let map = MmapRaw::map_raw(&file).context("mapping simulated device memory")?;
        ensure!(map.len() == bytes, "simulated device memory has {} bytes, expected {bytes}", map.len());
        Ok(Arc::new(Self { map, file }))
    }

    /// Maps `bytes` of `file` from `offset` (page-aligned).
    pub(super) fn at(file: File, offset: u64, bytes: usize) -> Result<Arc<Self>> {
        let map = MmapOptions::new()
            .offset(offset)
            .len(bytes)
            .map_raw(&file)
            .context("mapping simulated memory")?;
        Ok(Arc::new(Self { map, file }))
    }

    fn create(bytes: usize) -> Result<Arc<Self>> {
        let fd = memfd_create(c"simple-ipc-simulated", MFdFlags::MFD_CLOEXEC).context("memfd_create")?;
        let file = File::from(fd);
        file.set_len(bytes as u64).context("sizing simulated device memory")?;
        Self::new(file, bytes)
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    fn start(&self) -> u64 {
        self.map.as_mut_ptr() as u64
    }

    /// The first byte of the mapping, which stays mapped as long as `self`.
    pub(super) fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }
}

/// A simulated IPC handle: `tag`, then the exporter's pid, a number of its own (a descriptor, an event's
/// number) and a length.
pub(super) fn encode(tag: &[u8; 8], pid: u32, number: i32, len: u64) -> IpcHandleBytes {
    let mut handle = [0u8; IPC_HANDLE_SIZE];
    handle[..8].copy_from_slice(tag);
    handle[8..12].copy_from_slice(&pid.to_le_bytes());
    handle[12..16].copy_from_slice(&number.to_le_bytes());
    handle[16..24].copy_from_slice(&len.to_le_bytes());
    handle
}

/// What [`encode`] put in `handle`; `None` if it is not a handle of `tag`'s kind.
pub(super) fn decode(handle: &IpcHandleBytes, tag: &[u8; 8]) -> Option<(u32, i32, u64)> {
    if &handle[..8] != tag {
        return None;
    }
    let word = |at: usize| [handle[at], handle[at + 1], handle[at + 2], handle[at + 3]];
    let mut len = [0u8; 8];
    len.copy_from_slice(&handle[16..24]);
    Some((u32::from_le_bytes(word(8)), i32::from_le_bytes(word(12)), u64::from_le_bytes(len)))
}

/// The device made current on this thread, -1 if none.
pub(super) fn current_device() -> i32 {
    CURRENT.with(|current| current.get())
}

/// The /proc of the PID namespace this process was started in, kept before its own was mounted over it
/// (`--isolate pid`): where the exporter of a handle, the process that started this one, is visible. The
/// CUDA driver reaches another process's memory through its kernel module; the simulation, through this.
static OUTER_PROC: std::sync::OnceLock<std::os::fd::OwnedFd> = std::sync::OnceLock::new();

/// Keeps `proc` (a descriptor of the /proc this process had before it mounted its own).
pub fn keep_outer_proc(proc: std::os::fd::OwnedFd) {
    let _ = OUTER_PROC.set(proc);
}

/// How the simulation says that what it was asked is beyond what it models (not how the driver answers).
pub const BEYOND_THE_SIMULATION: &str = "beyond the simulation";

/// The handle of another process whose pid number is this process's own: the CUDA driver takes it for one
/// of its own and refuses it, as when two containers' first processes (both pid 1) meet.
pub(super) fn refuse_own_pid(call: &str, exporter: u32) -> Result<()> {
    if exporter == std::process::id() {
        let why = format!("the exporter's pid number is this process's own ({exporter})");
        return Err(failed(call, code::INVALID_CONTEXT, why));
    }
    Ok(())
}

/// What made a buffer, and so which call frees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// `cuMemAlloc` on a device (-1 when none was current); `cuMemFree`.
    Allocated { device: i32 },
    /// `cuIpcOpenMemHandle`; `cuIpcCloseMemHandle`.
    Opened,
    /// `cuMemMap` of a VMM allocation; `cuMemUnmap`.
    VmmMapped,
    /// `cuMemAllocFromPoolAsync`, at `offset` in its pool; `cuMemFreeAsync`.
    PoolAllocated { offset: u64 },
    /// `cuMemPoolImportPointer`; `cuMemFreeAsync`.
    PoolImported,
}

struct Buffer {
    mapping: Arc<Mapping>,
    kind: Kind,
}

#[derive(Default)]
struct Table {
    /// By start address.
    buffers: BTreeMap<u64, Buffer>,
    /// Pinned host ranges: start address and length.
    pinned: HashMap<usize, usize>,
}

/// Every buffer this process can address, and its pinned host memory.
#[derive(Default)]
pub(super) struct Memory(Mutex<Table>);

impl Memory {
    /// Makes `mapping` addressable, as memory of `kind`.
    pub(super) fn insert(&self, mapping: Arc<Mapping>, kind: Kind) -> Result<DevicePtr> {
        let start = mapping.start();
        lock(&self.0)?.buffers.insert(start, Buffer { mapping, kind });
        Ok(DevicePtr(start))
    }

    /// The buffer that starts at `ptr`, for `call`.
    pub(super) fn get(&self, call: &str, ptr: DevicePtr) -> Result<(Arc<Mapping>, Kind)> {
        let table = lock(&self.0)?;
        let buffer = table.buffers.get(&ptr.0).ok_or_else(|| not_memory(call, ptr))?;
        Ok((Arc::clone(&buffer.mapping), buffer.kind))
    }

    /// Takes the buffer at `ptr` out of the table, if it is of a kind `frees` (kind, bytes) accepts: work
    /// still queued holds its own reference to the mapping, so it never writes into freed memory.
    pub(super) fn remove(
        &self,
        call: &str,
        ptr: DevicePtr,
        frees: impl Fn(Kind, usize) -> bool,
    ) -> Result<Kind> {
        let mut table = lock(&self.0)?;
        let buffer = table.buffers.get(&ptr.0).ok_or_else(|| not_memory(call, ptr))?;
        if !frees(buffer.kind, buffer.mapping.len()) {
            let why = format!(
                "{:#x} is {:?} memory of {} bytes, which {call} does not free",
                ptr.0,
                buffer.kind,
                buffer.mapping.len()
            );
            return Err(failed(call, code::INVALID_VALUE, why));
        }
        let kind = buffer.kind;
        table.buffers.remove(&ptr.0);
        Ok(kind)
    }

    /// The start of `bytes` bytes at `ptr`, inside one live buffer, with the mapping that keeps them valid.
    pub(super) fn range(&self, call: &str, ptr: DevicePtr, bytes: usize) -> Result<(Arc<Mapping>, usize)> {
        let table = lock(&self.0)?;
        let end = ptr.0.checked_add(bytes as u64);
        let found =
            table.buffers.range(..=ptr.0).next_back().filter(|(start, buffer)| {
                end.is_some_and(|end| end <= **start + buffer.mapping.len() as u64)
            });
        let (_, buffer) = found.ok_or_else(|| {
            failed(
                call,
                code::INVALID_VALUE,
                format!("no simulated buffer holds {bytes} bytes at {:#x}", ptr.0),
            )
        })?;
        Ok((Arc::clone(&buffer.mapping), ptr.0 as usize))
    }

    /// The 4-aligned 32-bit word at `ptr`, inside a live buffer, with the mapping that keeps it valid.
    pub(super) fn word(&self, call: &str, ptr: DevicePtr) -> Result<(Arc<Mapping>, usize)> {
        if !ptr.is_aligned(4) {
            return Err(failed(
                call,
                code::INVALID_VALUE,
                format!("a 32-bit word at {:#x} is not 4-aligned", ptr.0),
            ));
        }
        self.range(call, ptr, 4)
    }

    pub(super) fn pin(&self, host: &mut [u8]) -> Result<()> {
        let (start, len) = (host.as_ptr() as usize, host.len());
        let mut table = lock(&self.0)?;
        if table.pinned.iter().any(|(&s, &l)| start < s + l && s < start + len) {
            let why = format!("{len} bytes at {start:#x} overlap a pinned range");
            return Err(failed("cuMemHostRegister", code::HOST_MEMORY_ALREADY_REGISTERED, why));
        }
        table.pinned.insert(start, len);
        Ok(())
    }

    pub(super) fn unpin(&self, host: &mut [u8]) -> Result<()> {
        let start = host.as_ptr() as usize;
        lock(&self.0)?.pinned.remove(&start).map(drop).ok_or_else(|| {
            let why = format!("{start:#x} was not pinned");
            failed("cuMemHostUnregister", code::HOST_MEMORY_NOT_REGISTERED, why)
        })
    }

    pub(super) fn held(&mut self, held: &mut Held) {
        let table = owned(&mut self.0);
        let count = |matches: fn(&Kind) -> bool| table.buffers.values().filter(|b| matches(&b.kind)).count();
        held.add(count(|k| matches!(k, Kind::Allocated { .. })), "device buffer");
        held.add(count(|k| *k == Kind::Opened), "opened IPC buffer");
        held.add(count(|k| *k == Kind::VmmMapped), "VMM mapping");
        held.add(count(|k| matches!(k, Kind::PoolAllocated { .. })), "pool allocation");
        held.add(count(|k| *k == Kind::PoolImported), "imported pool pointer");
        held.add(table.pinned.len(), "pinned host range");
    }
}

fn not_memory(call: &str, ptr: DevicePtr) -> anyhow::Error {
    failed(call, code::INVALID_VALUE, format!("{:#x} is no live simulated buffer", ptr.0))
}

pub(super) fn alloc(sim: &HostDriver, bytes: usize) -> Result<DevicePtr> {
    sim.memory.insert(Mapping::create(bytes)?, Kind::Allocated { device: current_device() })
}

pub(super) fn free(sim: &HostDriver, ptr: DevicePtr) -> Result<()> {
    sim.memory.remove("cuMemFree", ptr, |kind, _| matches!(kind, Kind::Allocated { .. })).map(drop)
}

pub(super) fn ipc_get_mem_handle(sim: &HostDriver, ptr: DevicePtr) -> Result<IpcHandleBytes> {
    let call = "cuIpcGetMemHandle";
    let (mapping, kind) = sim.memory.get(call, ptr)?;
    let Kind::Allocated { device } = kind else {
        return Err(failed(
            call,
            code::INVALID_VALUE,
            format!("{:#x} is {kind:?} memory, not cuMemAlloc's", ptr.0),
        ));
    };
    if sim.device(call, device).is_ok_and(|d| d.lacks(SimulatedDevice::NoLegacyIpc)) {
        return Err(failed(call, code::NOT_SUPPORTED, format!("device {device} has no legacy IPC")));
    }
    if sim.device(call, device).is_ok_and(|d| d.has(SimulatedDevice::Wsl)) {
        return Err(failed(call, code::NOT_SUPPORTED, "WSL2 has no legacy IPC"));
    }
    Ok(encode(BUFFER_TAG, std::process::id(), mapping.file.as_raw_fd(), mapping.len() as u64))
}

pub(super) fn ipc_open_mem_handle(sim: &HostDriver, handle: &IpcHandleBytes) -> Result<DevicePtr> {
    let call = "cuIpcOpenMemHandle";
    let (pid, fd, len) = decode(handle, BUFFER_TAG)
        .ok_or_else(|| failed(call, code::INVALID_VALUE, "not a simulated legacy memory handle"))?;
    refuse_own_pid(call, pid)?;
    let path = match OUTER_PROC.get() {
        Some(proc) => format!("/proc/self/fd/{}/{pid}/fd/{fd}", proc.as_raw_fd()),
        None => format!("/proc/{pid}/fd/{fd}"),
    };
    let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            // The driver's kernel module reaches the memory whatever the namespaces; /proc does not.
            let why = format!(
                "it opens another process's memory as {path}, which a process in another user namespace \
                 may not ({e}); the CUDA driver's kernel module is not held back so"
            );
            return beyond(call, code::NOT_SUPPORTED, why);
        }
        // A process in another PID namespace (`unshare --pid`) does not see the exporter in its /proc; the
        // driver's kernel module reaches the memory all the same (the H200 host passes there).
        let why = format!(
            "the exporting process is not visible from here ({path}: {e}); the CUDA driver's kernel module \
             reaches it whatever the namespaces"
        );
        beyond(call, code::NOT_SUPPORTED, why)
    })?;
    let size = file.metadata().with_context(|| format!("fstat of {path}"))?.len();
    if size != len {
        let why = format!("{path} has {size} bytes, the handle says {len}");
        return Err(failed(call, code::INVALID_VALUE, why));
    }
    let bytes = usize::try_from(len).map_err(|_| anyhow!("{len} bytes do not fit this address space"))?;
    sim.memory.insert(Mapping::new(file, bytes)?, Kind::Opened)
}

pub(super) fn ipc_close_mem_handle(sim: &HostDriver, ptr: DevicePtr) -> Result<()> {
    sim.memory.remove("cuIpcCloseMemHandle", ptr, |kind, _| kind == Kind::Opened).map(drop)
}
