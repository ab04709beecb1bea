//! Interprocess events and their handles.
//!
//! cudarc's `result` layer has none of the IPC calls, nor a way to create an interprocess event (its
//! `event::create` takes one `CUevent_flags`, a Rust enum of the single flags 0, 1, 2 and 4, so
//! DISABLE_TIMING | INTERPROCESS (6) is not a value of it): those call `sys`. Destroying and querying an
//! event go through `result`.

use std::ffi::c_uint;
use std::mem::MaybeUninit;

use anyhow::Result;
use cudarc::driver::{result, sys};

use super::{CudaDriver, Named, check, event, ready};
use crate::driver::events::Events;
use crate::driver::handles::{IpcHandleBytes, RawEvent};

impl Events for CudaDriver {
    fn create_interprocess_event(&self) -> Result<RawEvent> {
        let mut e: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint
            | sys::CUevent_flags::CU_EVENT_INTERPROCESS as c_uint;
        // `sys`: the result layer's event::create cannot take these two flags together (see the module's
        // comment). SAFETY: writes one event handle, destroyed by its owner.
        check(unsafe { sys::cuEventCreate(&mut e, flags) }, "cuEventCreate(DisableTiming | Interprocess)")?;
        Ok(RawEvent(e as u64))
    }

    unsafe fn ipc_get_event_handle(&self, e: RawEvent) -> Result<IpcHandleBytes> {
        let mut handle = MaybeUninit::<sys::CUipcEventHandle>::zeroed();
        // `sys`: no IPC in the result layer. SAFETY: writes one 64-byte handle.
        check(unsafe { sys::cuIpcGetEventHandle(handle.as_mut_ptr(), event(e)) }, "cuIpcGetEventHandle")?;
        // SAFETY: zero-initialised and then filled by the driver; a handle is plain bytes.
        Ok(unsafe { handle.assume_init() }.reserved.map(|b| b as u8))
    }

    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent> {
        let raw = sys::CUipcEventHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut e: sys::CUevent = std::ptr::null_mut();
        // `sys`: no IPC in the result layer. SAFETY: writes one event handle, destroyed by its owner.
        let rc = unsafe { sys::cuIpcOpenEventHandle(&mut e, raw) };
        check(rc, "cuIpcOpenEventHandle")?;
        Ok(RawEvent(e as u64))
    }

    unsafe fn destroy_event(&self, e: RawEvent) -> Result<()> {
        // SAFETY: the owner destroys each event once.
        unsafe { result::event::destroy(event(e)) }.named("cuEventDestroy")
    }

    unsafe fn query_event(&self, e: RawEvent) -> Result<bool> {
        // SAFETY: the caller keeps the event alive.
        ready(unsafe { result::event::query(event(e)) }, "cuEventQuery")
    }
}
