//! The simulated devices' answers, from the defects and features the environment gave each
//! ([`SimulatedDevice`]): what each is and offers, peer access, and the device made current on a thread.

use anyhow::Result;

use super::{CURRENT, HostDriver, SIMULATED_L2_BYTES, SimulatedDevice, simulated_uuid};
use crate::driver::devices::{Capability, DeviceInfo, Devices, uuid_text};

impl Devices for HostDriver {
    fn simulated(&self) -> bool {
        true
    }

    fn version(&self) -> Result<i32> {
        Ok(0)
    }

    fn device_count(&self) -> Result<i32> {
        Ok(self.devices.len() as i32)
    }

    fn wsl(&self) -> Option<String> {
        let wsl = self.devices.iter().any(|d| d.has(SimulatedDevice::Wsl));
        wsl.then(|| "simulated: /dev/dxg is present".to_owned())
    }

    fn device_info(&self, device: i32) -> Result<DeviceInfo> {
        let kind = self.device("cuDeviceGetAttribute", device)?;
        Ok(DeviceInfo {
            name: format!("Simulated GPU {device}"),
            unified_addressing: !kind.lacks(SimulatedDevice::NoUnifiedAddressing),
            default_compute_mode: !kind.lacks(SimulatedDevice::ExclusiveComputeMode),
            multiprocessors: 2,
            pci_bus_id: crate::node::simulated_pci_bus_id(self.physical[device as usize]),
            l2_cache_bytes: SIMULATED_L2_BYTES,
            uuid: simulated_uuid(self.physical[device as usize]),
            // `mig`: a MIG device of its own, named as nvidia-smi -L names one.
            mig: kind.has(SimulatedDevice::Mig).then(|| {
                let uuid = uuid_text(&simulated_uuid(self.physical[device as usize]));
                format!("MIG-{}", uuid.trim_start_matches("GPU-"))
            }),
        })
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        let call = "cuDeviceCanAccessPeer";
        let (a, b) = (self.device(call, device)?, self.device(call, peer)?);
        Ok(!a.lacks(SimulatedDevice::NoPeerAccess) && !b.lacks(SimulatedDevice::NoPeerAccess))
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        self.device("cuCtxEnablePeerAccess", peer).map(drop)
    }

    fn use_device(&self, device: i32) -> Result<()> {
        self.device("cuDevicePrimaryCtxRetain", device)?;
        CURRENT.with(|current| current.set(device));
        Ok(())
    }

    fn supports(&self, device: i32, what: Capability) -> Result<bool> {
        let kind = self.device("cuDeviceGetAttribute", device)?;
        Ok(match what {
            Capability::VirtualMemory | Capability::PosixFdHandles => !kind.lacks(SimulatedDevice::NoVmm),
            Capability::MemoryPools | Capability::PoolPosixFdHandles => !kind.lacks(SimulatedDevice::NoPools),
            Capability::FabricHandles => !kind.lacks(SimulatedDevice::NoFabric),
            Capability::MpsEnabled => kind.has(SimulatedDevice::Mps),
        })
    }
}
