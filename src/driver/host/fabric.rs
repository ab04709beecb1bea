//! Simulated fabric handles: VMM allocations (in [`super::vmm`]'s table, marked fabric-shareable) exported
//! as 64 bytes that name the allocation the way a legacy memory handle names its buffer: the exporter's pid
//! and the number of its descriptor of the memfd, and the size; importing it opens `/proc/<pid>/fd/<fd>`.
//! So, unlike a real fabric handle, it needs the exporter visible in this process's `/proc` (one PID
//! namespace, or one where its pid is another process's). Creating one is refused with
//! `CUDA_ERROR_NOT_PERMITTED` unless the device was given an IMEX channel (`imex`), as on a host without
//! `/dev/nvidia-caps-imex-channels/`.

use std::fs::OpenOptions;

use anyhow::{Context, Result};

use super::ipc::{decode, encode};
use super::vmm::{Shareable, new_memfd};
use super::{HostDriver, SIMULATED_GRANULARITY, SimulatedDevice, failed};
use crate::driver::error::code;
use crate::driver::fabric::Fabric;
use crate::driver::handles::{IpcHandleBytes, RawAllocation};

const FABRIC_TAG: &[u8; 8] = b"SIMFABRC";

impl Fabric for HostDriver {
    fn fabric_granularity(&self, device: i32) -> Result<usize> {
        self.device("cuMemGetAllocationGranularity", device)?;
        Ok(SIMULATED_GRANULARITY)
    }

    /// `cuMemCreate` with `CU_MEM_HANDLE_TYPE_FABRIC`: refused unless the device reports fabric handles and
    /// has an IMEX channel.
    fn fabric_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        let call = format!("cuMemCreate({bytes} bytes on device {device}, fabric handle)");
        let kind = self.device(&call, device)?;
        if kind.lacks(SimulatedDevice::NoFabric) {
            return Err(failed(call, code::NOT_SUPPORTED, format!("device {device} has no fabric handles")));
        }
        if !kind.has(SimulatedDevice::Imex) {
            let why = "no IMEX channel: /dev/nvidia-caps-imex-channels/ is absent, as on the H200 host";
            return Err(failed(call, code::NOT_PERMITTED, why));
        }
        self.vmm.insert(new_memfd(&call, bytes)?, Shareable::Fabric)
    }

    unsafe fn fabric_export(&self, allocation: RawAllocation) -> Result<IpcHandleBytes> {
        let (fd, bytes) = self.vmm.fabric_descriptor("cuMemExportToShareableHandle", allocation)?;
        Ok(encode(FABRIC_TAG, std::process::id(), fd, bytes))
    }

    fn fabric_import(&self, handle: &IpcHandleBytes) -> Result<RawAllocation> {
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
        self.vmm.insert(file, Shareable::Fabric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::devices::{Capability, Devices};
    use crate::driver::error::failed_code;
    use crate::driver::vmm::Vmm;

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
