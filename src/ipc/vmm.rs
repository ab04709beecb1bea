//! Virtual memory management (NVIDIA's `memMapIPCDrv`): the exporter makes a physical allocation with
//! `cuMemCreate`, exportable as a POSIX file descriptor, and maps it in a range of its own; the descriptor
//! travels over a Unix socket (SCM_RIGHTS), so no shared PID namespace is needed. The importer imports it,
//! reserves a range, maps it and grants its device access. Sizes are rounded up to the granularity.
//! Both sides unmap, free their range and release their allocation on drop ([`Mapping`], which `fabric`
//! shares: memory on a base, as `held` has it).

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result, ensure};

use super::held::{HeldBase, MemoryOn};
use super::spec::{Export, Spec};
use crate::driver::{Capability, Driver, IpcHandleBytes, RawAllocation};

/// NVIDIA's `memMapIPCDrv`: a `cuMemCreate` allocation per buffer, shared as a POSIX file descriptor.
pub const SPEC: Spec = Spec {
    name: "vmm",
    needs: &[Capability::VirtualMemory, Capability::PosixFdHandles],
    descriptors: true,
    refuses_memops: None,
    probe: Some(unsupported),
};

/// Where the attributes are not to be trusted (WSL2, see `platform`): whether a VMM allocation of one
/// granule can be exported as a descriptor and imported again, asked of `device`. Elsewhere the attributes
/// answer, and this asks nothing.
fn unsupported(driver: &dyn Driver, device: i32) -> Result<Option<String>> {
    let Some(wsl) = driver.wsl() else {
        return Ok(None);
    };
    let trial = || -> Result<()> {
        let (exported, descriptor) = allocate(driver, device, 1)?;
        let imported = Allocation { driver, device, raw: driver.vmm_import(descriptor.as_fd())? };
        drop((imported, exported, descriptor));
        Ok(())
    };
    Ok(trial()
        .err()
        .map(|e| format!("device {device} cannot export and import a VMM allocation on WSL2 ({wsl}): {e:#}")))
}

const TAG: &[u8; 8] = b"VMMALLOC";

/// What the segment says of a VMM buffer: the size of its allocation.
fn describe(mapped: usize) -> IpcHandleBytes {
    let mut handle = [0u8; 64];
    handle[..8].copy_from_slice(TAG);
    handle[8..16].copy_from_slice(&(mapped as u64).to_le_bytes());
    handle
}

fn mapped_size(handle: &IpcHandleBytes) -> Result<usize> {
    ensure!(&handle[..8] == TAG, "the segment holds no VMM allocation in this slot");
    let mut size = [0u8; 8];
    size.copy_from_slice(&handle[8..16]);
    Ok(u64::from_le_bytes(size) as usize)
}

/// A physical allocation, made or imported here on `device`: released on drop (its mappings keep the
/// memory alive). Fabric allocations are these too.
pub(super) type Allocation<'d> = HeldBase<'d, RawAllocation>;

/// An allocation mapped for all its bytes, readable and writable by its device: what the exporter and each
/// importer hold of a VMM or fabric buffer. Unmapped on drop, then the allocation is released.
pub(super) type Mapping<'d> = MemoryOn<'d, RawAllocation>;

/// Maps all `bytes` of `allocation`, on its device.
pub(super) fn map(allocation: Allocation<'_>, bytes: usize) -> Result<Mapping<'_>> {
    let (driver, device) = (allocation.driver, allocation.device);
    driver.use_device(device)?;
    // SAFETY: the allocation is alive (owned here), and has `bytes` bytes (made or checked so).
    let ptr = unsafe { driver.vmm_map(allocation.raw, bytes, device) }?;
    Ok(Mapping { base: allocation, ptr, bytes })
}

/// A VMM allocation of `bytes` rounded up to the granularity, on `device`, mapped here, and a new
/// descriptor of it.
fn allocate<'d>(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<(Mapping<'d>, OwnedFd)> {
    driver.use_device(device)?;
    let mapped = bytes.next_multiple_of(driver.vmm_granularity(device)?);
    let allocation = Allocation { driver, device, raw: driver.vmm_create(device, mapped)? };
    let mapping = map(allocation, mapped)?;
    // SAFETY: the allocation is alive (owned by `mapping`).
    let descriptor = unsafe { driver.vmm_export(mapping.base.raw) }.context("exporting a VMM allocation")?;
    Ok((mapping, descriptor))
}

/// The exporter's side: the allocation mapped here; the segment says its size, the descriptor travels.
pub(super) fn export<'d>(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Export<'d>> {
    let (mapping, descriptor) = allocate(driver, device, bytes)?;
    let handle = describe(mapping.bytes);
    Ok(Export { memory: Box::new(mapping), handle, descriptor: Some(descriptor) })
}

/// The importer's side: the descriptor is closed once imported.
pub(super) fn open<'d>(
    driver: &'d dyn Driver,
    device: i32,
    handle: &IpcHandleBytes,
    descriptor: OwnedFd,
    bytes: usize,
) -> Result<Mapping<'d>> {
    let mapped = mapped_size(handle)?;
    ensure!(mapped >= bytes, "the VMM allocation has {mapped} bytes, fewer than the buffer's {bytes}");
    driver.use_device(device)?;
    let allocation = Allocation { driver, device, raw: driver.vmm_import(descriptor.as_fd())? };
    drop(descriptor);
    map(allocation, mapped)
}
