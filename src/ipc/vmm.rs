//! Virtual memory management (NVIDIA's `memMapIPCDrv`): the exporter makes a physical allocation with
//! `cuMemCreate`, exportable as a POSIX file descriptor, and maps it in a range of its own; the descriptor
//! travels over a Unix socket (SCM_RIGHTS), so no shared PID namespace is needed. The importer imports it,
//! reserves a range, maps it and grants its device access. Sizes are rounded up to the granularity.
//! Both sides unmap, free their range and release their allocation on drop.

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result, ensure};

use super::warn_on_error;
use crate::driver::{DevicePtr, Driver, IpcHandleBytes, RawAllocation};

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

/// A physical allocation, made or imported here: released on drop (its mappings keep the memory alive).
struct Allocation<'d> {
    driver: &'d dyn Driver,
    raw: RawAllocation,
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        // SAFETY: the allocation is released only here, once.
        warn_on_error("releasing a VMM allocation", unsafe { self.driver.vmm_release(self.raw) });
    }
}

/// An allocation mapped at `ptr` for `bytes`, readable and writable by one device: unmapped on drop.
struct Mapping<'d> {
    driver: &'d dyn Driver,
    ptr: DevicePtr,
    bytes: usize,
}

impl<'d> Mapping<'d> {
    fn new(allocation: &Allocation<'d>, bytes: usize, device: i32) -> Result<Self> {
        // SAFETY: the allocation is alive while borrowed, and has `bytes` bytes (made or checked so).
        let ptr = unsafe { allocation.driver.vmm_map(allocation.raw, bytes, device) }?;
        Ok(Self { driver: allocation.driver, ptr, bytes })
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        // SAFETY: mapped once by `new`; unmapped only here.
        warn_on_error("unmapping a VMM buffer", unsafe { self.driver.vmm_unmap(self.ptr, self.bytes) });
    }
}

/// The exporter's side. The mapping is declared first: unmapped before the allocation is released.
pub struct Export<'d> {
    mapping: Mapping<'d>,
    _allocation: Allocation<'d>,
    pub handle: IpcHandleBytes,
    pub descriptor: OwnedFd,
}

impl<'d> Export<'d> {
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        driver.use_device(device)?;
        let mapped = bytes.next_multiple_of(driver.vmm_granularity(device)?);
        let allocation = Allocation { driver, raw: driver.vmm_create(device, mapped)? };
        let mapping = Mapping::new(&allocation, mapped, device)?;
        // SAFETY: the allocation is alive (owned by `allocation`).
        let descriptor =
            unsafe { driver.vmm_export(allocation.raw) }.context("exporting a VMM allocation")?;
        Ok(Self { mapping, _allocation: allocation, handle: describe(mapped), descriptor })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.mapping.ptr
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
        let allocation = Allocation { driver, raw: driver.vmm_import(descriptor.as_fd())? };
        drop(descriptor);
        let mapping = Mapping::new(&allocation, mapped, device)?;
        Ok(Self { mapping, _allocation: allocation })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.mapping.ptr
    }
}
