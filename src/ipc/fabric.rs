//! Fabric handles: the exporter makes a physical allocation with `cuMemCreate`, exportable as a
//! `CUmemFabricHandle`, and maps it in a range of its own; the handle is 64 bytes, which travel in the
//! segment's slot like a legacy handle (no descriptor, no socket, no dependence on PID namespaces or
//! `/dev/shm`). The importer imports it with `cuMemImportFromShareableHandle`, reserves a range, maps it and
//! grants its device access, as for [`super::vmm`], whose owners it shares; it rounds the size up to the
//! granularity the allocation's own properties give, as the exporter did.
//!
//! The device's attribute is not enough: a process may create fabric-shareable memory only where it has an
//! IMEX channel (`/dev/nvidia-caps-imex-channels/`), so [`unsupported`] asks by a trial allocation. On the
//! H200 host (driver 580) the attribute is 1 and the trial answers `CUDA_ERROR_NOT_PERMITTED`: waived.
//! This module never calls `cuMulticastCreate` (multicast can take a shared host's GPUs out of service).

use anyhow::{Context, Result, ensure};

use super::vmm::{Allocation, Mapping};
use super::{Export as ExportRecord, Spec, ToOpen};
use crate::driver::{Capability, DevicePtr, Driver, IpcHandleBytes, code, failed_code};
use crate::gpu::DeviceMemory;

/// Fabric handles: a `cuMemCreate` allocation per buffer, shared as 64 bytes in the segment.
pub const SPEC: Spec = Spec {
    name: "fabric",
    needs: &[Capability::VirtualMemory, Capability::FabricHandles],
    descriptors: false,
    // VMM memory, which stream memory operations order as they do vmm's.
    refuses_memops: None,
    probe: Some(unsupported),
    allocate,
    open,
};

/// The words of the waiver where the device reports fabric handles and the trial is refused.
pub const NOT_PERMITTED: &str = "the device reports fabric handles, but this process may not create them: \
    CUDA_ERROR_NOT_PERMITTED; an IMEX channel is needed";

/// Where a process's IMEX channels are (`channel0`, ...), for the message of a refused trial.
const IMEX_CHANNELS: &str = "/dev/nvidia-caps-imex-channels";

fn allocate<'d>(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Box<dyn ExportRecord + 'd>> {
    Ok(Box::new(Export::allocate(driver, device, bytes)?))
}

fn open<'d>(driver: &'d dyn Driver, opening: ToOpen) -> Result<Box<dyn DeviceMemory + 'd>> {
    Ok(Box::new(View::open(driver, opening.handle, opening.bytes, opening.device)?))
}

/// Whether this process may create fabric-shareable memory on `device`, asked by creating one granule of
/// it (released at once); `Some(reason)` where it may not. A driver's refusal is a reason; any other
/// failure is an error.
pub fn unsupported(driver: &dyn Driver, device: i32) -> Result<Option<String>> {
    driver.use_device(device)?;
    let trial = driver.fabric_granularity(device).and_then(|granule| driver.fabric_create(device, granule));
    match trial {
        Ok(raw) => {
            drop(Allocation { driver, device, raw });
            Ok(None)
        }
        Err(e) if failed_code(&e) == Some(code::NOT_PERMITTED) => {
            let channels = match std::fs::read_dir(IMEX_CHANNELS) {
                Ok(_) => "holds no channel this process may open",
                Err(_) => "is absent here",
            };
            Ok(Some(format!("device {device}: {NOT_PERMITTED}; {IMEX_CHANNELS}/ {channels}")))
        }
        Err(e) if failed_code(&e).is_some() => {
            Ok(Some(format!("device {device} cannot create fabric-shareable memory: {e:#}")))
        }
        Err(e) => Err(e),
    }
}

/// The exporter's side. The mapping is declared first: unmapped before the allocation is released.
pub struct Export<'d> {
    mapping: Mapping<'d>,
    _allocation: Allocation<'d>,
    handle: IpcHandleBytes,
}

impl<'d> Export<'d> {
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        driver.use_device(device)?;
        let mapped = bytes.next_multiple_of(driver.fabric_granularity(device)?);
        let allocation = Allocation { driver, device, raw: driver.fabric_create(device, mapped)? };
        let mapping = Mapping::new(&allocation, mapped)?;
        // SAFETY: the allocation is alive (owned by `allocation`) and was made by fabric_create.
        let handle =
            unsafe { driver.fabric_export(allocation.raw) }.context("exporting a fabric allocation")?;
        Ok(Self { mapping, _allocation: allocation, handle })
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
}

/// The importer's side.
pub struct View<'d> {
    mapping: Mapping<'d>,
    _allocation: Allocation<'d>,
}

impl<'d> View<'d> {
    pub fn open(driver: &'d dyn Driver, handle: &IpcHandleBytes, bytes: usize, device: i32) -> Result<Self> {
        driver.use_device(device)?;
        let allocation = Allocation { driver, device, raw: driver.fabric_import(handle)? };
        // SAFETY: the allocation is alive (owned by `allocation`).
        let granule = unsafe { driver.vmm_granularity_of(allocation.raw) }?;
        let mapped = bytes.next_multiple_of(granule);
        ensure!(mapped >= bytes, "a fabric allocation of {bytes} bytes cannot be mapped");
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
