//! Virtual memory management (NVIDIA's `memMapIPCDrv`): the exporter makes a physical allocation with
//! `cuMemCreate`, exportable as a POSIX file descriptor, and maps it in a range of its own; the descriptor
//! travels over a Unix socket (SCM_RIGHTS), so no shared PID namespace is needed. The importer imports it,
//! reserves a range, maps it and grants its device access. Sizes are rounded up to the granularity.
//! Both sides unmap, free their range and release their allocation on drop.

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result, ensure};

use super::{Export as ExportRecord, Spec, ToOpen};
use crate::driver::{Capability, DevicePtr, Driver, IpcHandleBytes, RawAllocation};
use crate::gpu::{DeviceMemory, warn_on_error};

/// NVIDIA's `memMapIPCDrv`: a `cuMemCreate` allocation per buffer, shared as a POSIX file descriptor.
pub const SPEC: Spec = Spec {
    name: "vmm",
    needs: &[Capability::VirtualMemory, Capability::PosixFdHandles],
    descriptors: true,
    refuses_memops: None,
    probe: Some(unsupported),
    allocate,
    open,
};

fn allocate<'d>(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Box<dyn ExportRecord + 'd>> {
    Ok(Box::new(Export::allocate(driver, device, bytes)?))
}

fn open<'d>(driver: &'d dyn Driver, mut opening: ToOpen) -> Result<Box<dyn DeviceMemory + 'd>> {
    let descriptor = opening.take_descriptor(SPEC.name)?;
    Ok(Box::new(View::open(driver, opening.handle, descriptor, opening.bytes, opening.device)?))
}

/// Where the attributes are not to be trusted (WSL2, see `platform`): whether a VMM allocation of one
/// granule can be exported as a descriptor and imported again, asked of `device`. Elsewhere the attributes
/// answer, and this asks nothing.
fn unsupported(driver: &dyn Driver, device: i32) -> Result<Option<String>> {
    let Some(wsl) = driver.wsl() else {
        return Ok(None);
    };
    let trial = || -> Result<()> {
        let export = Export::allocate(driver, device, 1)?;
        let imported = Allocation { driver, device, raw: driver.vmm_import(export.descriptor.as_fd())? };
        drop((imported, export));
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
pub(super) struct Allocation<'d> {
    pub(super) driver: &'d dyn Driver,
    pub(super) device: i32,
    pub(super) raw: RawAllocation,
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        let d = self.driver;
        // SAFETY: the allocation is released only here, once.
        let released = d.use_device(self.device).and_then(|()| unsafe { d.vmm_release(self.raw) });
        warn_on_error("releasing a VMM allocation", released);
    }
}

/// An allocation mapped at `ptr` for `bytes`, readable and writable by its device: unmapped on drop.
pub(super) struct Mapping<'d> {
    driver: &'d dyn Driver,
    device: i32,
    pub(super) ptr: DevicePtr,
    pub(super) bytes: usize,
}

impl<'d> Mapping<'d> {
    /// Maps all `bytes` of `allocation`, on its device.
    pub(super) fn new(allocation: &Allocation<'d>, bytes: usize) -> Result<Self> {
        let (driver, device) = (allocation.driver, allocation.device);
        driver.use_device(device)?;
        // SAFETY: the allocation is alive while borrowed, and has `bytes` bytes (made or checked so).
        let ptr = unsafe { driver.vmm_map(allocation.raw, bytes, device) }?;
        Ok(Self { driver, device, ptr, bytes })
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        let d = self.driver;
        // SAFETY: mapped once by `new`; unmapped only here.
        let unmapped = d.use_device(self.device).and_then(|()| unsafe { d.vmm_unmap(self.ptr, self.bytes) });
        warn_on_error("unmapping a VMM buffer", unmapped);
    }
}

/// The exporter's side. The mapping is declared first: unmapped before the allocation is released.
pub struct Export<'d> {
    mapping: Mapping<'d>,
    _allocation: Allocation<'d>,
    handle: IpcHandleBytes,
    descriptor: OwnedFd,
}

impl<'d> Export<'d> {
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        driver.use_device(device)?;
        let mapped = bytes.next_multiple_of(driver.vmm_granularity(device)?);
        let allocation = Allocation { driver, device, raw: driver.vmm_create(device, mapped)? };
        let mapping = Mapping::new(&allocation, mapped)?;
        // SAFETY: the allocation is alive (owned by `allocation`).
        let descriptor =
            unsafe { driver.vmm_export(allocation.raw) }.context("exporting a VMM allocation")?;
        Ok(Self { mapping, _allocation: allocation, handle: describe(mapped), descriptor })
    }
}

// SAFETY: the mapping lives until the export is dropped, and holds at least the bytes asked for.
unsafe impl DeviceMemory for Export<'_> {
    fn ptr(&self) -> DevicePtr {
        self.mapping.ptr
    }
    fn bytes(&self) -> usize {
        self.mapping.bytes
    }
}

impl ExportRecord for Export<'_> {
    fn handle(&self) -> &IpcHandleBytes {
        &self.handle
    }
    fn descriptor(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.descriptor.as_fd())
    }
}

/// The importer's side: the descriptor is closed once imported.
pub struct View<'d> {
    mapping: Mapping<'d>,
    _allocation: Allocation<'d>,
}

impl<'d> View<'d> {
    pub fn open(
        driver: &'d dyn Driver,
        handle: &IpcHandleBytes,
        descriptor: OwnedFd,
        bytes: usize,
        device: i32,
    ) -> Result<Self> {
        let mapped = mapped_size(handle)?;
        ensure!(mapped >= bytes, "the VMM allocation has {mapped} bytes, fewer than the buffer's {bytes}");
        driver.use_device(device)?;
        let allocation = Allocation { driver, device, raw: driver.vmm_import(descriptor.as_fd())? };
        drop(descriptor);
        let mapping = Mapping::new(&allocation, mapped)?;
        Ok(Self { mapping, _allocation: allocation })
    }
}

// SAFETY: the mapping lives until the view is dropped.
unsafe impl DeviceMemory for View<'_> {
    fn ptr(&self) -> DevicePtr {
        self.mapping.ptr
    }
    fn bytes(&self) -> usize {
        self.mapping.bytes
    }
}
