//! The simulated virtual memory management API (`memMapIPCDrv`): one table of the physical allocations
//! this process made or imported, each a memfd of a multiple of the granularity, exported as a new
//! descriptor of it. A mapping of one is memory in [`super::memory`]'s table, which outlives the release of
//! its allocation as with CUDA.
//!
//! Fabric-shareable allocations are in the same table, marked so: each is exported only as what it was
//! made for, as with CUDA. A simulated fabric handle is 64 bytes that name the allocation the way a legacy
//! memory handle names its buffer: the exporter's pid and the number of its descriptor of the memfd, and the
//! size; importing it opens `/proc/<pid>/fd/<fd>`. So, unlike a real fabric handle, it needs the exporter
//! visible in this process's `/proc` (one PID namespace, or one where its pid is another process's). Creating
//! one is refused with `CUDA_ERROR_NOT_PERMITTED` unless the device was given an IMEX channel (`imex`), as on
//! a host without `/dev/nvidia-caps-imex-channels/`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;

use anyhow::{Context, Result};
use nix::sys::memfd::{MFdFlags, memfd_create};

use super::memory::{Kind, Mapping, decode, encode};
use super::{Held, HostDriver, SIMULATED_GRANULARITY, SimulatedDevice, failed, lock, owned};
use crate::driver::{DevicePtr, IpcHandleBytes, RawAllocation, code};

const FABRIC_TAG: &[u8; 8] = b"SIMFABRC";

/// What an allocation can be exported as (its `requestedHandleTypes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shareable {
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
pub(super) struct Allocations(Mutex<Table>);

impl Allocations {
    fn insert(&self, file: File, shareable: Shareable) -> Result<RawAllocation> {
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
    fn fabric_descriptor(&self, call: &str, allocation: RawAllocation) -> Result<(i32, u64)> {
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

pub(super) fn create(sim: &HostDriver, device: i32, bytes: usize) -> Result<RawAllocation> {
    sim.device("cuMemCreate", device)?;
    sim.vmm.insert(new_memfd("cuMemCreate", bytes)?, Shareable::PosixFd)
}

/// A memfd of `bytes`, which must be a multiple of the granularity.
fn new_memfd(call: &str, bytes: usize) -> Result<File> {
    if bytes == 0 || !bytes.is_multiple_of(SIMULATED_GRANULARITY) {
        let why = format!("{bytes} bytes is not a multiple of the granularity {SIMULATED_GRANULARITY}");
        return Err(failed(call, code::INVALID_VALUE, why));
    }
    let fd = memfd_create(c"simple-ipc-simulated-vmm", MFdFlags::MFD_CLOEXEC).context("memfd_create")?;
    let file = File::from(fd);
    file.set_len(bytes as u64).context("sizing a simulated allocation")?;
    Ok(file)
}

pub(super) fn export(sim: &HostDriver, allocation: RawAllocation) -> Result<OwnedFd> {
    let call = "cuMemExportToShareableHandle";
    let (file, shareable) = sim.vmm.file(call, allocation)?;
    if shareable != Shareable::PosixFd {
        return Err(not_exportable_as(call, allocation, shareable, Shareable::PosixFd));
    }
    Ok(OwnedFd::from(file))
}

pub(super) fn import(sim: &HostDriver, fd: BorrowedFd) -> Result<RawAllocation> {
    let call = "cuMemImportFromShareableHandle";
    let file = File::from(fd.try_clone_to_owned().context("dup of an imported descriptor")?);
    let bytes = file.metadata().context("fstat of an imported allocation")?.len();
    if bytes == 0 || !bytes.is_multiple_of(SIMULATED_GRANULARITY as u64) {
        return Err(failed(call, code::INVALID_VALUE, format!("not a simulated allocation ({bytes} bytes)")));
    }
    sim.vmm.insert(file, Shareable::PosixFd)
}

/// `cuMemCreate` with `CU_MEM_HANDLE_TYPE_FABRIC`: refused unless the device reports fabric handles and has
/// an IMEX channel.
pub(super) fn fabric_create(sim: &HostDriver, device: i32, bytes: usize) -> Result<RawAllocation> {
    let call = format!("cuMemCreate({bytes} bytes on device {device}, fabric handle)");
    let kind = sim.device(&call, device)?;
    if kind.lacks(SimulatedDevice::NoFabric) {
        return Err(failed(call, code::NOT_SUPPORTED, format!("device {device} has no fabric handles")));
    }
    if !kind.has(SimulatedDevice::Imex) {
        let why = "no IMEX channel: /dev/nvidia-caps-imex-channels/ is absent, as on the H200 host";
        return Err(failed(call, code::NOT_PERMITTED, why));
    }
    sim.vmm.insert(new_memfd(&call, bytes)?, Shareable::Fabric)
}

pub(super) fn fabric_export(sim: &HostDriver, allocation: RawAllocation) -> Result<IpcHandleBytes> {
    let (fd, bytes) = sim.vmm.fabric_descriptor("cuMemExportToShareableHandle", allocation)?;
    Ok(encode(FABRIC_TAG, std::process::id(), fd, bytes))
}

pub(super) fn fabric_import(sim: &HostDriver, handle: &IpcHandleBytes) -> Result<RawAllocation> {
    let call = "cuMemImportFromShareableHandle";
    let (pid, fd, len) = decode(handle, FABRIC_TAG)
        .ok_or_else(|| failed(call, code::INVALID_VALUE, "not a simulated fabric handle"))?;
    if pid == std::process::id() {
        // Its /proc entry would be this process's own descriptor: the simulation cannot tell them apart.
        let why = format!(
            "the simulation names a fabric allocation by its exporter's pid, here this one's ({pid})"
        );
        return Err(failed(call, code::INVALID_VALUE, why));
    }
    let path = format!("/proc/{pid}/fd/{fd}");
    let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
        let why = format!(
            "the simulation needs the exporter visible in /proc, a real fabric handle does not ({path}: {e})"
        );
        failed(call, code::INVALID_VALUE, why)
    })?;
    let size = file.metadata().with_context(|| format!("fstat of {path}"))?.len();
    if size != len || !size.is_multiple_of(SIMULATED_GRANULARITY as u64) {
        let why = format!("{path} has {size} bytes, the handle says {len}");
        return Err(failed(call, code::INVALID_VALUE, why));
    }
    sim.vmm.insert(file, Shareable::Fabric)
}

/// The granularity an allocation was made with: the simulation has one.
pub(super) fn granularity_of(sim: &HostDriver, allocation: RawAllocation) -> Result<usize> {
    sim.vmm.file("cuMemGetAllocationPropertiesFromHandle", allocation)?;
    Ok(SIMULATED_GRANULARITY)
}

pub(super) fn map(
    sim: &HostDriver,
    allocation: RawAllocation,
    bytes: usize,
    device: i32,
) -> Result<DevicePtr> {
    let call = "cuMemMap";
    sim.device("cuMemSetAccess", device)?;
    let (file, _) = sim.vmm.file(call, allocation)?;
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

#[cfg(test)]
mod tests {
    use super::super::HostDriver;
    use crate::driver::{Capability, Driver, code, failed_code};

    /// The device reports fabric handles, but without an IMEX channel (`imex`) creating one is refused with
    /// `CUDA_ERROR_NOT_PERMITTED`, as on the H200 host; `no-fabric` reports none. A fabric allocation is
    /// exported only as a fabric handle, and is named when it is still held.
    #[test]
    fn fabric_allocations_need_an_imex_channel_and_export_only_as_fabric_handles() {
        let mut sim = HostDriver::new("ok,ok+imex,no-fabric+imex", None).unwrap();
        let granule = sim.fabric_granularity(0).unwrap();
        assert!(sim.supports(0, Capability::FabricHandles).unwrap());
        assert!(!sim.supports(2, Capability::FabricHandles).unwrap());
        let refused = sim.fabric_create(0, granule).unwrap_err();
        assert_eq!(failed_code(&refused), Some(code::NOT_PERMITTED), "{refused:#}");
        assert!(format!("{refused:#}").contains("CUDA_ERROR_NOT_PERMITTED (800)"), "{refused:#}");
        assert_eq!(failed_code(&sim.fabric_create(2, granule).unwrap_err()), Some(code::NOT_SUPPORTED));
        let fabric = sim.fabric_create(1, granule).unwrap();
        let posix = sim.vmm_create(1, granule).unwrap();
        // SAFETY: (test) both allocations are this driver's and alive until released below.
        unsafe {
            assert_eq!(failed_code(&sim.vmm_export(fabric).unwrap_err()), Some(code::INVALID_VALUE));
            assert_eq!(failed_code(&sim.fabric_export(posix).unwrap_err()), Some(code::INVALID_VALUE));
            let handle = sim.fabric_export(fabric).unwrap();
            // Its own handle names this process: the simulation cannot import it here (a child does).
            assert_eq!(failed_code(&sim.fabric_import(&handle).unwrap_err()), Some(code::INVALID_VALUE));
            assert_eq!(failed_code(&sim.fabric_import(&[0; 64]).unwrap_err()), Some(code::INVALID_VALUE));
            assert_eq!(sim.vmm_granularity_of(fabric).unwrap(), granule);
            assert_eq!(sim.still_held(), ["1 VMM allocation", "1 fabric allocation"]);
            sim.vmm_release(fabric).unwrap();
            sim.vmm_release(posix).unwrap();
        }
        assert_eq!(sim.still_held(), Vec::<String>::new());
    }
}
