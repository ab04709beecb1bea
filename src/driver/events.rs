//! Interprocess events: created, exported as 64-byte handles, opened from another process's handle,
//! queried and destroyed ([`Events`]). Recording one and waiting for one are work on a stream
//! ([`Streams`](super::Streams)).

use anyhow::Result;

use super::handles::{IpcHandleBytes, RawEvent};

/// Interprocess events (`DisableTiming | Interprocess`, the only kind this program makes) and their handles.
pub trait Events {
    /// An event with `DisableTiming | Interprocess`.
    fn create_interprocess_event(&self) -> Result<RawEvent>;
    /// # Safety
    /// The common contract (see [`Driver`](super::Driver)).
    unsafe fn ipc_get_event_handle(&self, event: RawEvent) -> Result<IpcHandleBytes>;
    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent>;
    /// # Safety
    /// The common contract; the event is destroyed once.
    unsafe fn destroy_event(&self, event: RawEvent) -> Result<()>;
    /// True once the work the event last captured has run (`cuEventQuery`).
    /// # Safety
    /// The common contract.
    unsafe fn query_event(&self, event: RawEvent) -> Result<bool>;
}
