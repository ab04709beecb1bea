//! Simulated memory pools (`streamOrderedAllocationIPC`): one table of the pools this process created or
//! imported, each a memfd exported as a new descriptor of it. An allocation is the next page-aligned range
//! of its pool's memfd; its export data is its offset and length; it and the pointers imported from another
//! process's pool are memory in [`super::memory`]'s table.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Mutex;

use anyhow::{Context, Result};
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::ipc::{decode, encode};
use super::memory::{Kind, Mapping};
use super::{Held, HostDriver, failed, lock, owned};
use crate::driver::error::code;
use crate::driver::handles::{DevicePtr, IpcHandleBytes, RawPool};
use crate::driver::pool::Pools;

const POOL_POINTER_TAG: &[u8; 8] = b"SIMPTR\0\x02";

struct Pool {
    file: File,
    /// Bytes of the memfd handed out (for a pool this process created).
    used: u64,
    imported: bool,
}

#[derive(Default)]
struct Table {
    pools: HashMap<u64, Pool>,
    last_id: u64,
}

/// The pools this process holds.
#[derive(Default)]
pub(super) struct PoolTable(Mutex<Table>);

impl PoolTable {
    fn insert(&self, file: File, imported: bool) -> Result<RawPool> {
        let mut table = lock(&self.0)?;
        table.last_id += 1;
        let id = table.last_id;
        table.pools.insert(id, Pool { file, used: 0, imported });
        Ok(RawPool(id))
    }

    /// A new descriptor of `pool`'s memfd, for `call`.
    fn file(&self, call: &str, pool: RawPool) -> Result<File> {
        let table = lock(&self.0)?;
        let found = table.pools.get(&pool.0).ok_or_else(|| no_pool(call, pool))?;
        found.file.try_clone().context("dup of a simulated pool")
    }

    pub(super) fn held(&mut self, held: &mut Held) {
        let table = owned(&mut self.0);
        let imported = table.pools.values().filter(|pool| pool.imported).count();
        held.add(table.pools.len() - imported, "memory pool");
        held.add(imported, "imported memory pool");
    }
}

fn no_pool(call: &str, pool: RawPool) -> anyhow::Error {
    failed(call, code::INVALID_VALUE, format!("no live pool {:#x}", pool.0))
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().map_or(4096, |p| p as u64)
}

impl Pools for HostDriver {
    fn pool_create(&self, device: i32) -> Result<RawPool> {
        self.device("cuMemPoolCreate", device)?;
        let fd = memfd_create(c"simple-ipc-simulated-pool", MFdFlags::MFD_CLOEXEC).context("memfd_create")?;
        self.pools.insert(File::from(fd), false)
    }

    unsafe fn pool_export(&self, pool: RawPool) -> Result<OwnedFd> {
        Ok(OwnedFd::from(self.pools.file("cuMemPoolExportToShareableHandle", pool)?))
    }

    fn pool_import(&self, fd: BorrowedFd, device: i32) -> Result<RawPool> {
        self.device("cuMemPoolSetAccess", device)?;
        let file = File::from(fd.try_clone_to_owned().context("dup of an imported descriptor")?);
        self.pools.insert(file, true)
    }

    unsafe fn pool_alloc(&self, pool: RawPool, bytes: usize) -> Result<DevicePtr> {
        let call = "cuMemAllocFromPoolAsync";
        let (file, offset) = {
            let mut table = lock(&self.pools.0)?;
            let found = table.pools.get_mut(&pool.0).ok_or_else(|| no_pool(call, pool))?;
            if found.imported {
                return Err(failed(call, code::INVALID_VALUE, "an imported pool cannot allocate"));
            }
            let offset = found.used;
            found.used += (bytes as u64).next_multiple_of(page_size());
            found.file.set_len(found.used).context("growing a simulated pool")?;
            (found.file.try_clone().context("dup of a simulated pool")?, offset)
        };
        self.memory.insert(Mapping::at(file, offset, bytes)?, Kind::PoolAllocated { offset })
    }

    unsafe fn pool_export_pointer(&self, ptr: DevicePtr) -> Result<IpcHandleBytes> {
        let call = "cuMemPoolExportPointer";
        let (mapping, kind) = self.memory.get(call, ptr)?;
        let Kind::PoolAllocated { offset } = kind else {
            return Err(failed(
                call,
                code::INVALID_VALUE,
                format!("{:#x} is {kind:?} memory, not a pool's", ptr.0),
            ));
        };
        let mut data = encode(POOL_POINTER_TAG, 0, 0, mapping.len() as u64);
        data[24..32].copy_from_slice(&offset.to_le_bytes());
        Ok(data)
    }

    unsafe fn pool_import_pointer(&self, pool: RawPool, data: &IpcHandleBytes) -> Result<DevicePtr> {
        let call = "cuMemPoolImportPointer";
        let (_, _, len) = decode(data, POOL_POINTER_TAG)
            .ok_or_else(|| failed(call, code::INVALID_VALUE, "not pointer export data"))?;
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&data[24..32]);
        let offset = u64::from_le_bytes(offset);
        let file = self.pools.file(call, pool)?;
        let size = file.metadata().context("fstat of a simulated pool")?.len();
        let bytes =
            usize::try_from(len).ok().filter(|_| offset.checked_add(len).is_some_and(|end| end <= size));
        let bytes = bytes.ok_or_else(|| {
            failed(
                call,
                code::INVALID_VALUE,
                format!("{len} bytes at {offset} lie outside the pool's {size}"),
            )
        })?;
        self.memory.insert(Mapping::at(file, offset, bytes)?, Kind::PoolImported)
    }

    unsafe fn pool_free(&self, ptr: DevicePtr) -> Result<()> {
        let frees = |kind, _| matches!(kind, Kind::PoolAllocated { .. } | Kind::PoolImported);
        self.memory.remove("cuMemFreeAsync", ptr, frees).map(drop)
    }

    unsafe fn pool_destroy(&self, pool: RawPool) -> Result<()> {
        let removed = lock(&self.pools.0)?.pools.remove(&pool.0);
        removed.map(drop).ok_or_else(|| no_pool("cuMemPoolDestroy", pool))
    }
}
