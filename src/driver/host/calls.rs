//! The [`Driver`] trait of the simulation: each call handed to the module of its concern (the devices'
//! answers are given here, from the defects the environment gave them).

use std::ffi::CStr;
use std::os::fd::{BorrowedFd, OwnedFd};

use anyhow::Result;

use super::{CURRENT, HostDriver, SIMULATED_GRANULARITY, SIMULATED_L2_BYTES, SimulatedDevice};
use super::{events, memory, pool, streams, vmm};
use crate::driver::{
    Capability, DeviceInfo, DevicePtr, Driver, IpcHandleBytes, RawAllocation, RawEvent, RawFunction, RawPool,
    RawStream,
};

impl Driver for HostDriver {
    fn simulated(&self) -> bool {
        true
    }
    fn version(&self) -> Result<i32> {
        Ok(0)
    }
    fn device_count(&self) -> Result<i32> {
        Ok(self.devices.len() as i32)
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
            uuid: super::simulated_uuid(self.physical[device as usize]),
            // `mig`: a MIG device of its own, named as nvidia-smi -L names one.
            mig: kind.has(SimulatedDevice::Mig).then(|| {
                let uuid = crate::driver::uuid_text(&super::simulated_uuid(self.physical[device as usize]));
                format!("MIG-{}", uuid.trim_start_matches("GPU-"))
            }),
        })
    }
    fn wsl(&self) -> Option<String> {
        let wsl = self.devices.iter().any(|d| d.has(SimulatedDevice::Wsl));
        wsl.then(|| "simulated: /dev/dxg is present".to_owned())
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

    // memory.rs
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        memory::alloc(self, bytes)
    }
    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        memory::free(self, ptr)
    }
    unsafe fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> Result<IpcHandleBytes> {
        memory::ipc_get_mem_handle(self, ptr)
    }
    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr> {
        memory::ipc_open_mem_handle(self, handle)
    }
    unsafe fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> Result<()> {
        memory::ipc_close_mem_handle(self, ptr)
    }

    // events.rs
    fn create_interprocess_event(&self) -> Result<RawEvent> {
        events::create(self)
    }
    unsafe fn ipc_get_event_handle(&self, event: RawEvent) -> Result<IpcHandleBytes> {
        events::handle(self, event)
    }
    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent> {
        events::open(self, handle)
    }
    unsafe fn destroy_event(&self, event: RawEvent) -> Result<()> {
        events::destroy(self, event)
    }
    unsafe fn record_event(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        streams::record_event(self, event, stream)
    }
    unsafe fn query_event(&self, event: RawEvent) -> Result<bool> {
        events::query(self, event)
    }

    // streams.rs
    fn create_non_blocking_stream(&self) -> Result<RawStream> {
        streams::create(self)
    }
    unsafe fn destroy_stream(&self, stream: RawStream) -> Result<()> {
        streams::destroy(self, stream)
    }
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        streams::wait_event(self, stream, event)
    }
    unsafe fn query_stream(&self, stream: RawStream) -> Result<bool> {
        streams::query(self, stream)
    }
    fn load_kernel(&self, _image: &[u8], name: &CStr) -> Result<RawFunction> {
        streams::load_kernel(name)
    }
    unsafe fn max_active_blocks_per_multiprocessor(&self, _kernel: RawFunction, _block: u32) -> Result<u32> {
        Ok(16)
    }
    unsafe fn launch_ptr_int_char(
        &self,
        _kernel: RawFunction,
        _grid: u32,
        _block: u32,
        stream: RawStream,
        args: (DevicePtr, i32, u8),
    ) -> Result<()> {
        streams::launch(self, stream, args)
    }
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        streams::copy_to_host(self, dst, src)
    }
    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        streams::copy_device_to_device(self, dst, src, bytes, stream)
    }
    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, stream: RawStream) -> Result<()> {
        streams::fill(self, dst, value, bytes, stream)
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
    fn stream_memops_unsupported(&self, device: i32) -> Result<Option<String>> {
        let lacks = self.device("cuDeviceGetAttribute", device)?.lacks(SimulatedDevice::NoStreamMemops);
        Ok(lacks.then(|| format!("device {device} has no stream memory operations (simulated)")))
    }
    unsafe fn stream_write_u32(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
        streams::write_u32(self, stream, ptr, value)
    }
    unsafe fn stream_wait_u32_geq(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
        streams::wait_u32_geq(self, stream, ptr, value)
    }

    // vmm.rs
    fn vmm_granularity(&self, device: i32) -> Result<usize> {
        self.device("cuMemGetAllocationGranularity", device)?;
        Ok(SIMULATED_GRANULARITY)
    }
    fn vmm_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        vmm::create(self, device, bytes)
    }
    unsafe fn vmm_export(&self, allocation: RawAllocation) -> Result<OwnedFd> {
        vmm::export(self, allocation)
    }
    fn vmm_import(&self, fd: BorrowedFd) -> Result<RawAllocation> {
        vmm::import(self, fd)
    }
    unsafe fn vmm_map(&self, allocation: RawAllocation, bytes: usize, device: i32) -> Result<DevicePtr> {
        vmm::map(self, allocation, bytes, device)
    }
    unsafe fn vmm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        vmm::unmap(self, ptr, bytes)
    }
    unsafe fn vmm_release(&self, allocation: RawAllocation) -> Result<()> {
        vmm::release(self, allocation)
    }
    unsafe fn vmm_granularity_of(&self, allocation: RawAllocation) -> Result<usize> {
        vmm::granularity_of(self, allocation)
    }
    fn fabric_granularity(&self, device: i32) -> Result<usize> {
        self.device("cuMemGetAllocationGranularity", device)?;
        Ok(SIMULATED_GRANULARITY)
    }
    fn fabric_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        vmm::fabric_create(self, device, bytes)
    }
    unsafe fn fabric_export(&self, allocation: RawAllocation) -> Result<IpcHandleBytes> {
        vmm::fabric_export(self, allocation)
    }
    fn fabric_import(&self, handle: &IpcHandleBytes) -> Result<RawAllocation> {
        vmm::fabric_import(self, handle)
    }

    // pool.rs
    fn pool_create(&self, device: i32) -> Result<RawPool> {
        pool::create(self, device)
    }
    unsafe fn pool_export(&self, pool: RawPool) -> Result<OwnedFd> {
        pool::export(self, pool)
    }
    fn pool_import(&self, fd: BorrowedFd, device: i32) -> Result<RawPool> {
        pool::import(self, fd, device)
    }
    unsafe fn pool_alloc(&self, pool: RawPool, bytes: usize) -> Result<DevicePtr> {
        pool::alloc(self, pool, bytes)
    }
    unsafe fn pool_export_pointer(&self, ptr: DevicePtr) -> Result<IpcHandleBytes> {
        pool::export_pointer(self, ptr)
    }
    unsafe fn pool_import_pointer(&self, pool: RawPool, data: &IpcHandleBytes) -> Result<DevicePtr> {
        pool::import_pointer(self, pool, data)
    }
    unsafe fn pool_free(&self, ptr: DevicePtr) -> Result<()> {
        pool::free(self, ptr)
    }
    unsafe fn pool_destroy(&self, pool: RawPool) -> Result<()> {
        pool::destroy(self, pool)
    }

    // memory.rs
    unsafe fn pin_host_memory(&self, host: &mut [u8]) -> Result<bool> {
        self.memory.pin(host).map(|()| true)
    }
    unsafe fn unpin_host_memory(&self, host: &mut [u8]) -> Result<()> {
        self.memory.unpin(host)
    }
}
