//! The simulated virtual memory management API (`memMapIPCDrv`): one table of the physical allocations
//! this process made or imported, each a memfd of a multiple of the granularity, exported as a new
//! descriptor of it. A mapping of one is memory in [`super::memory`]'s table, which outlives the release of
//! its allocation as with CUDA. Fabric-shareable allocations (see [`super::fabric`]) are in the same table,
//! marked so: each is exported only as what it was made for, as with CUDA.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Mutex;

use anyhow::{Context, Result};
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::memory::{Kind, Mapping};
use super::{Held, HostDriver, SIMULATED_GRANULARITY, failed, lock, owned};
use crate::driver::error::code;
use crate::driver::handles::{DevicePtr, RawAllocation};
use crate::driver::vmm::Vmm;

/// What an allocation can be exported as (its `requestedHandleTypes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shareable {
    PosixFd,
    Fabric,
}

struct Allocation {
    file: File,
    shareable: Shareable,
}

#[derive(Default)]
struct Table {
    allocations: HashMap<u64, Allocation>,
    last_id: u64,
}

/// The physical allocations this process holds.
#[derive(Default)]
pub(super) struct AllocationTable(Mutex<Table>);

impl AllocationTable {
    pub(super) fn insert(&self, file: File, shareable: Shareable) -> Result<RawAllocation> {
        let mut table = lock(&self.0)?;
        table.last_id += 1;
        let id = table.last_id;
        table.allocations.insert(id, Allocation { file, shareable });
        Ok(RawAllocation(id))
    }

    /// A new descriptor of `allocation`'s memfd, for `call`, and what it can be exported as.
    fn file(&self, call: &str, allocation: RawAllocation) -> Result<(File, Shareable)> {
        let table = lock(&self.0)?;
        let found = table.allocations.get(&allocation.0).ok_or_else(|| no_allocation(call, allocation))?;
        Ok((found.file.try_clone().context("dup of a simulated allocation")?, found.shareable))
    }

    /// The number of this process's own descriptor of a fabric allocation's memfd, and its size.
    pub(super) fn fabric_descriptor(&self, call: &str, allocation: RawAllocation) -> Result<(RawFd, u64)> {
        let table = lock(&self.0)?;
        let found = table.allocations.get(&allocation.0).ok_or_else(|| no_allocation(call, allocation))?;
        if found.shareable != Shareable::Fabric {
            return Err(not_exportable_as(call, allocation, found.shareable, Shareable::Fabric));
        }
        let bytes = found.file.metadata().context("fstat of a simulated allocation")?.len();
        Ok((found.file.as_raw_fd(), bytes))
    }

    pub(super) fn held(&mut self, held: &mut Held) {
        let table = owned(&mut self.0);
        let count = |kind| table.allocations.values().filter(|a| a.shareable == kind).count();
        held.add(count(Shareable::PosixFd), "VMM allocation");
        held.add(count(Shareable::Fabric), "fabric allocation");
    }
}

fn not_exportable_as(
    call: &str,
    allocation: RawAllocation,
    made: Shareable,
    asked: Shareable,
) -> anyhow::Error {
    let why = format!("allocation {:#x} was made for {made:?} handles, not {asked:?}", allocation.0);
    failed(call, code::INVALID_VALUE, why)
}

fn no_allocation(call: &str, allocation: RawAllocation) -> anyhow::Error {
    failed(call, code::INVALID_VALUE, format!("no live allocation {:#x}", allocation.0))
}

/// A memfd of `bytes`, which must be a multiple of the granularity.
pub(super) fn new_memfd(call: &str, bytes: usize) -> Result<File> {
    if bytes == 0 || !bytes.is_multiple_of(SIMULATED_GRANULARITY) {
        let why = format!("{bytes} bytes is not a multiple of the granularity {SIMULATED_GRANULARITY}");
        return Err(failed(call, code::INVALID_VALUE, why));
    }
    let fd = memfd_create(c"simple-ipc-simulated-vmm", MFdFlags::MFD_CLOEXEC).context("memfd_create")?;
    let file = File::from(fd);
    file.set_len(bytes as u64).context("sizing a simulated allocation")?;
    Ok(file)
}

impl Vmm for HostDriver {
    fn vmm_granularity(&self, device: i32) -> Result<usize> {
        self.device("cuMemGetAllocationGranularity", device)?;
        Ok(SIMULATED_GRANULARITY)
    }

    fn vmm_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        self.device("cuMemCreate", device)?;
        self.vmm.insert(new_memfd("cuMemCreate", bytes)?, Shareable::PosixFd)
    }

    unsafe fn vmm_export(&self, allocation: RawAllocation) -> Result<OwnedFd> {
        let call = "cuMemExportToShareableHandle";
        let (file, shareable) = self.vmm.file(call, allocation)?;
        if shareable != Shareable::PosixFd {
            return Err(not_exportable_as(call, allocation, shareable, Shareable::PosixFd));
        }
        Ok(OwnedFd::from(file))
    }

    fn vmm_import(&self, fd: BorrowedFd) -> Result<RawAllocation> {
        let call = "cuMemImportFromShareableHandle";
        let file = File::from(fd.try_clone_to_owned().context("dup of an imported descriptor")?);
        let bytes = file.metadata().context("fstat of an imported allocation")?.len();
        if bytes == 0 || !bytes.is_multiple_of(SIMULATED_GRANULARITY as u64) {
            return Err(failed(
                call,
                code::INVALID_VALUE,
                format!("not a simulated allocation ({bytes} bytes)"),
            ));
        }
        self.vmm.insert(file, Shareable::PosixFd)
    }

    /// The granularity an allocation was made with: the simulation has one.
    unsafe fn vmm_granularity_of(&self, allocation: RawAllocation) -> Result<usize> {
        self.vmm.file("cuMemGetAllocationPropertiesFromHandle", allocation)?;
        Ok(SIMULATED_GRANULARITY)
    }

    unsafe fn vmm_map(&self, allocation: RawAllocation, bytes: usize, device: i32) -> Result<DevicePtr> {
        let call = "cuMemMap";
        self.device("cuMemSetAccess", device)?;
        let (file, _) = self.vmm.file(call, allocation)?;
        let size = file.metadata().context("fstat of a simulated allocation")?.len();
        if size != bytes as u64 {
            let why = format!("the allocation has {size} bytes, not {bytes}");
            return Err(failed(call, code::INVALID_VALUE, why));
        }
        self.memory.insert(Mapping::at(file, 0, bytes)?, Kind::VmmMapped)
    }

    unsafe fn vmm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let frees = |kind, len| kind == Kind::VmmMapped && len == bytes;
        self.memory.remove("cuMemUnmap", ptr, frees).map(drop)
    }

    unsafe fn vmm_release(&self, allocation: RawAllocation) -> Result<()> {
        let removed = lock(&self.vmm.0)?.allocations.remove(&allocation.0);
        removed.map(drop).ok_or_else(|| no_allocation("cuMemRelease", allocation))
    }
}
