//! Legacy CUDA IPC, the original's mechanism: memory handles of `cuMemAlloc` memory ([`Ipc`]).

use anyhow::Result;

use super::handles::{DevicePtr, IpcHandleBytes};

/// Legacy IPC memory handles (`cudaIpcGetMemHandle`, `cudaIpcOpenMemHandle`, `cudaIpcCloseMemHandle`).
pub trait Ipc {
    /// # Safety
    /// `ptr` came from [`Memory::alloc`](super::Memory::alloc) and is not freed.
    unsafe fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> Result<IpcHandleBytes>;
    /// Maps another process's buffer, with lazy peer access enabled. A forged handle is an error.
    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr>;
    /// # Safety
    /// `ptr` came from [`Ipc::ipc_open_mem_handle`], is closed once, and no work that uses it is pending.
    unsafe fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> Result<()>;
}
