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

use super::spec::{Export, Spec};
use super::vmm::{self, Allocation, Mapping};
use crate::driver::{Capability, Driver, IpcHandleBytes, code, failed_code};

/// Fabric handles: a `cuMemCreate` allocation per buffer, shared as 64 bytes in the segment.
pub const SPEC: Spec = Spec {
    name: "fabric",
    needs: &[Capability::VirtualMemory, Capability::FabricHandles],
    descriptors: false,
    // VMM memory, which stream memory operations order as they do vmm's.
    refuses_memops: None,
    probe: Some(unsupported),
};

/// The words of the waiver where the device reports fabric handles and the trial is refused.
pub const NOT_PERMITTED: &str = "the device reports fabric handles, but this process may not create them: \
    CUDA_ERROR_NOT_PERMITTED; an IMEX channel is needed";

/// Where a process's IMEX channels are (`channel0`, ...), for the message of a refused trial.
const IMEX_CHANNELS: &str = "/dev/nvidia-caps-imex-channels";

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

/// The exporter's side: the allocation mapped here; its fabric handle travels in the segment.
pub(super) fn export<'d>(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Export<'d>> {
    driver.use_device(device)?;
    let mapped = bytes.next_multiple_of(driver.fabric_granularity(device)?);
    let allocation = Allocation { driver, device, raw: driver.fabric_create(device, mapped)? };
    let mapping = vmm::map(allocation, mapped)?;
    // SAFETY: the allocation is alive (owned by `mapping`) and was made by fabric_create.
    let handle =
        unsafe { driver.fabric_export(mapping.base.raw) }.context("exporting a fabric allocation")?;
    Ok(Export { memory: Box::new(mapping), handle, descriptor: None })
}

/// The importer's side: the allocation the handle names, mapped here.
pub(super) fn open<'d>(
    driver: &'d dyn Driver,
    device: i32,
    handle: &IpcHandleBytes,
    bytes: usize,
) -> Result<Mapping<'d>> {
    driver.use_device(device)?;
    let allocation = Allocation { driver, device, raw: driver.fabric_import(handle)? };
    // SAFETY: the allocation is alive (owned by `allocation`).
    let granule = unsafe { driver.vmm_granularity_of(allocation.raw) }?;
    let mapped = bytes.next_multiple_of(granule);
    ensure!(mapped >= bytes, "a fabric allocation of {bytes} bytes cannot be mapped");
    vmm::map(allocation, mapped)
}
