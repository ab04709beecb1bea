//! Legacy CUDA IPC: memory handles of `cuMemAlloc` memory. cudarc's `result` layer has none of the IPC
//! calls: these call `sys`.

use std::ffi::c_uint;
use std::mem::MaybeUninit;

use anyhow::Result;
use cudarc::driver::sys;

use super::{CudaDriver, check, ptr};
use crate::driver::handles::{DevicePtr, IpcHandleBytes};
use crate::driver::ipc::Ipc;

impl Ipc for CudaDriver {
    unsafe fn ipc_get_mem_handle(&self, p: DevicePtr) -> Result<IpcHandleBytes> {
        let mut handle = MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // `sys`: no IPC in the result layer. SAFETY: writes one 64-byte handle.
        check(unsafe { sys::cuIpcGetMemHandle(handle.as_mut_ptr(), ptr(p)) }, "cuIpcGetMemHandle")?;
        // SAFETY: zero-initialised and then filled by the driver; a handle is plain bytes.
        Ok(unsafe { handle.assume_init() }.reserved.map(|b| b as u8))
    }

    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr> {
        let raw = sys::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut p: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
        // `sys`: no IPC in the result layer. SAFETY: writes one device address, closed by the owner through
        // `ipc_close_mem_handle`.
        let rc = unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, raw, flags) };
        check(rc, "cuIpcOpenMemHandle")?;
        Ok(DevicePtr(p as u64))
    }

    unsafe fn ipc_close_mem_handle(&self, p: DevicePtr) -> Result<()> {
        // `sys`: no IPC in the result layer. SAFETY: the caller (ipc::legacy::View) closes each mapping once.
        check(unsafe { sys::cuIpcCloseMemHandle(ptr(p)) }, "cuIpcCloseMemHandle")
    }
}
