//! Simulated device memory: one table of every buffer this process can address, keyed by its address, with
//! what made it (`cuMemAlloc`, a legacy IPC open, a VMM mapping, a pool allocation or an imported pool
//! pointer), so that each is freed only by the call that matches its kind, as with CUDA, and the driver can
//! say what is left when it goes away; and the host ranges pinned, in the same table. [`Mapping`], a shared
//! mapping of a memfd or a file, is what every kind of memory and every event lives in. `cuMemAlloc`, the
//! copy to the host and pinning are answered here ([`Memory`]).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, ensure};
use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::{CURRENT, Held, HostDriver, failed, lock, owned};
use crate::driver::error::code;
use crate::driver::handles::DevicePtr;
use crate::driver::memory::Memory;

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

    /// This process's descriptor of the memfd or file, which another process opens by number.
    pub(super) fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn start(&self) -> u64 {
        self.map.as_mut_ptr() as u64
    }

    /// The first byte of the mapping, which stays mapped as long as `self`.
    pub(super) fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }
}

/// The device made current on this thread, -1 if none.
pub(super) fn current_device() -> i32 {
    CURRENT.with(|current| current.get())
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
pub(super) struct BufferTable(Mutex<Table>);

impl BufferTable {
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

impl Memory for HostDriver {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.memory.insert(Mapping::create(bytes)?, Kind::Allocated { device: current_device() })
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.memory.remove("cuMemFree", ptr, |kind, _| matches!(kind, Kind::Allocated { .. })).map(drop)
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        let (_mapping, start) = self.memory.range("cuMemcpyDtoH", src, dst.len())?;
        // SAFETY: `range` checked that dst.len() bytes from `start` lie in a live mapping; `dst` is a
        // distinct host slice. The copy is done when this returns.
        unsafe { std::ptr::copy_nonoverlapping(start as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn pin_host_memory(&self, host: &mut [u8]) -> Result<bool> {
        self.memory.pin(host).map(|()| true)
    }

    unsafe fn unpin_host_memory(&self, host: &mut [u8]) -> Result<()> {
        self.memory.unpin(host)
    }
}
