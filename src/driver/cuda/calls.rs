//! The [`Driver`] trait of real GPUs: each call handed to the module of its concern.

use std::ffi::CStr;
use std::os::fd::{BorrowedFd, OwnedFd};

use anyhow::Result;

use super::{CudaDriver, devices, fabric, ipc, memory, pool, streams, vmm};
use crate::driver::{
    Capability, DeviceInfo, DevicePtr, Driver, IpcHandleBytes, RawAllocation, RawEvent, RawFunction, RawPool,
    RawStream,
};

impl Driver for CudaDriver {
    fn version(&self) -> Result<i32> {
        devices::version()
    }

    fn device_count(&self) -> Result<i32> {
        devices::device_count()
    }

    fn device_info(&self, device: i32) -> Result<DeviceInfo> {
        devices::device_info(self, device)
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        devices::can_access_peer(device, peer)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        devices::enable_peer_access(self, peer)
    }

    fn use_device(&self, device: i32) -> Result<()> {
        devices::use_device(self, device)
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        memory::alloc(bytes)
    }

    unsafe fn free(&self, p: DevicePtr) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { memory::free(p) }
    }

    unsafe fn ipc_get_mem_handle(&self, p: DevicePtr) -> Result<IpcHandleBytes> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { ipc::get_mem_handle(p) }
    }

    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr> {
        ipc::open_mem_handle(handle)
    }

    unsafe fn ipc_close_mem_handle(&self, p: DevicePtr) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { ipc::close_mem_handle(p) }
    }

    fn create_interprocess_event(&self) -> Result<RawEvent> {
        ipc::create_interprocess_event()
    }

    unsafe fn ipc_get_event_handle(&self, e: RawEvent) -> Result<IpcHandleBytes> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { ipc::get_event_handle(e) }
    }

    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent> {
        ipc::open_event_handle(handle)
    }

    unsafe fn destroy_event(&self, e: RawEvent) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { ipc::destroy_event(e) }
    }

    unsafe fn record_event(&self, e: RawEvent, s: RawStream) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::record_event(e, s) }
    }

    unsafe fn query_event(&self, e: RawEvent) -> Result<bool> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { ipc::query_event(e) }
    }

    fn create_non_blocking_stream(&self) -> Result<RawStream> {
        streams::create_non_blocking_stream()
    }

    unsafe fn destroy_stream(&self, s: RawStream) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::destroy_stream(s) }
    }

    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::wait_event(s, e) }
    }

    unsafe fn query_stream(&self, s: RawStream) -> Result<bool> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::query_stream(s) }
    }

    fn load_kernel(&self, image: &[u8], name: &CStr) -> Result<RawFunction> {
        streams::load_kernel(self, image, name)
    }

    unsafe fn max_active_blocks_per_multiprocessor(&self, kernel: RawFunction, block: u32) -> Result<u32> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::max_active_blocks_per_multiprocessor(kernel, block) }
    }

    unsafe fn launch_ptr_int_char(
        &self,
        kernel: RawFunction,
        grid: u32,
        block: u32,
        s: RawStream,
        args: (DevicePtr, i32, u8),
    ) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::launch_ptr_int_char(kernel, grid, block, s, args) }
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { memory::copy_to_host(dst, src) }
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::copy_device_to_device(dst, src, bytes, s) }
    }

    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, s: RawStream) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::fill(dst, value, bytes, s) }
    }

    fn supports(&self, device: i32, what: Capability) -> Result<bool> {
        devices::supports(self, device, what)
    }

    fn stream_memops_unsupported(&self, device: i32) -> Result<Option<String>> {
        streams::memops_unsupported(self, device)
    }

    unsafe fn stream_write_u32(&self, s: RawStream, p: DevicePtr, value: u32) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::write_u32(self, s, p, value) }
    }

    unsafe fn stream_wait_u32_geq(&self, s: RawStream, p: DevicePtr, value: u32) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { streams::wait_u32_geq(self, s, p, value) }
    }

    fn vmm_granularity(&self, device: i32) -> Result<usize> {
        vmm::granularity(device)
    }

    fn vmm_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        vmm::create(device, bytes)
    }

    unsafe fn vmm_export(&self, allocation: RawAllocation) -> Result<OwnedFd> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { vmm::export(allocation) }
    }

    fn vmm_import(&self, fd: BorrowedFd) -> Result<RawAllocation> {
        vmm::import(fd)
    }

    unsafe fn vmm_map(&self, allocation: RawAllocation, bytes: usize, device: i32) -> Result<DevicePtr> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { vmm::map(allocation, bytes, device) }
    }

    unsafe fn vmm_unmap(&self, p: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { vmm::unmap(p, bytes) }
    }

    unsafe fn vmm_release(&self, allocation: RawAllocation) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { vmm::release(allocation) }
    }

    unsafe fn vmm_granularity_of(&self, allocation: RawAllocation) -> Result<usize> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { vmm::granularity_of(allocation) }
    }

    fn fabric_granularity(&self, device: i32) -> Result<usize> {
        fabric::granularity(device)
    }

    fn fabric_create(&self, device: i32, bytes: usize) -> Result<RawAllocation> {
        fabric::create(device, bytes)
    }

    unsafe fn fabric_export(&self, allocation: RawAllocation) -> Result<IpcHandleBytes> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { fabric::export(allocation) }
    }

    fn fabric_import(&self, handle: &IpcHandleBytes) -> Result<RawAllocation> {
        fabric::import(handle)
    }

    fn pool_create(&self, device: i32) -> Result<RawPool> {
        pool::create(device)
    }

    unsafe fn pool_export(&self, p: RawPool) -> Result<OwnedFd> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { pool::export(p) }
    }

    fn pool_import(&self, fd: BorrowedFd, device: i32) -> Result<RawPool> {
        pool::import(fd, device)
    }

    unsafe fn pool_alloc(&self, p: RawPool, bytes: usize) -> Result<DevicePtr> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { pool::alloc(p, bytes) }
    }

    unsafe fn pool_export_pointer(&self, p: DevicePtr) -> Result<IpcHandleBytes> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { pool::export_pointer(p) }
    }

    unsafe fn pool_import_pointer(&self, p: RawPool, data: &IpcHandleBytes) -> Result<DevicePtr> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { pool::import_pointer(p, data) }
    }

    unsafe fn pool_free(&self, p: DevicePtr) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { pool::free(p) }
    }

    unsafe fn pool_destroy(&self, p: RawPool) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { pool::destroy(p) }
    }

    unsafe fn pin_host_memory(&self, host: &mut [u8]) -> Result<bool> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { memory::pin_host_memory(host) }
    }

    unsafe fn unpin_host_memory(&self, host: &mut [u8]) -> Result<()> {
        // SAFETY: the caller keeps this method's contract, which is the callee's.
        unsafe { memory::unpin_host_memory(host) }
    }
}
