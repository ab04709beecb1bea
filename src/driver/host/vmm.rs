//! The simulated virtual memory management API (`memMapIPCDrv`): one table of the physical allocations
//! this process made or imported, each a memfd of a multiple of the granularity, exported as a new
//! descriptor of it. A mapping of one is memory in [`super::memory`]'s table, which outlives the release of
//! its allocation as with CUDA.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Mutex;

use anyhow::{Context, Result};
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::memory::{Kind, Mapping};
use super::{Held, HostDriver, SIMULATED_GRANULARITY, failed, lock, owned};
use crate::driver::{DevicePtr, RawAllocation, code};

#[derive(Default)]
struct Table {
    allocations: HashMap<u64, File>,
    last_id: u64,
}

/// The physical allocations this process holds.
#[derive(Default)]
pub(super) struct Allocations(Mutex<Table>);

impl Allocations {
    fn insert(&self, file: File) -> Result<RawAllocation> {
        let mut table = lock(&self.0)?;
        table.last_id += 1;
        let id = table.last_id;
        table.allocations.insert(id, file);
        Ok(RawAllocation(id))
    }

    /// A new descriptor of `allocation`'s memfd, for `call`.
    fn file(&self, call: &str, allocation: RawAllocation) -> Result<File> {
        let table = lock(&self.0)?;
        let file = table.allocations.get(&allocation.0).ok_or_else(|| no_allocation(call, allocation))?;
        file.try_clone().context("dup of a simulated allocation")
    }

    pub(super) fn held(&mut self, held: &mut Held) {
        held.add(owned(&mut self.0).allocations.len(), "VMM allocation");
    }
}

fn no_allocation(call: &str, allocation: RawAllocation) -> anyhow::Error {
    failed(call, code::INVALID_VALUE, format!("no live allocation {:#x}", allocation.0))
}

pub(super) fn create(sim: &HostDriver, device: i32, bytes: usize) -> Result<RawAllocation> {
    let call = "cuMemCreate";
    sim.device(call, device)?;
    if bytes == 0 || !bytes.is_multiple_of(SIMULATED_GRANULARITY) {
        let why = format!("{bytes} bytes is not a multiple of the granularity {SIMULATED_GRANULARITY}");
        return Err(failed(call, code::INVALID_VALUE, why));
    }
    let fd = memfd_create(c"simple-ipc-simulated-vmm", MFdFlags::MFD_CLOEXEC).context("memfd_create")?;
    let file = File::from(fd);
    file.set_len(bytes as u64).context("sizing a simulated allocation")?;
    sim.vmm.insert(file)
}

pub(super) fn export(sim: &HostDriver, allocation: RawAllocation) -> Result<OwnedFd> {
    Ok(OwnedFd::from(sim.vmm.file("cuMemExportToShareableHandle", allocation)?))
}

pub(super) fn import(sim: &HostDriver, fd: BorrowedFd) -> Result<RawAllocation> {
    let call = "cuMemImportFromShareableHandle";
    let file = File::from(fd.try_clone_to_owned().context("dup of an imported descriptor")?);
    let bytes = file.metadata().context("fstat of an imported allocation")?.len();
    if bytes == 0 || !bytes.is_multiple_of(SIMULATED_GRANULARITY as u64) {
        return Err(failed(call, code::INVALID_VALUE, format!("not a simulated allocation ({bytes} bytes)")));
    }
    sim.vmm.insert(file)
}

pub(super) fn map(
    sim: &HostDriver,
    allocation: RawAllocation,
    bytes: usize,
    device: i32,
) -> Result<DevicePtr> {
    let call = "cuMemMap";
    sim.device("cuMemSetAccess", device)?;
    let file = sim.vmm.file(call, allocation)?;
    let size = file.metadata().context("fstat of a simulated allocation")?.len();
    if size != bytes as u64 {
        let why = format!("the allocation has {size} bytes, not {bytes}");
        return Err(failed(call, code::INVALID_VALUE, why));
    }
    sim.memory.insert(Mapping::at(file, 0, bytes)?, Kind::VmmMapped)
}

pub(super) fn unmap(sim: &HostDriver, ptr: DevicePtr, bytes: usize) -> Result<()> {
    let frees = |kind, len| kind == Kind::VmmMapped && len == bytes;
    sim.memory.remove("cuMemUnmap", ptr, frees).map(drop)
}

pub(super) fn release(sim: &HostDriver, allocation: RawAllocation) -> Result<()> {
    let removed = lock(&sim.vmm.0)?.allocations.remove(&allocation.0);
    removed.map(drop).ok_or_else(|| no_allocation("cuMemRelease", allocation))
}
