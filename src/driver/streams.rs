//! Streams and the ordered work put on them: event records and waits, device copies and fills, and the
//! stream memory operations on 32-bit flags ([`Streams`]).

use anyhow::Result;

use super::handles::{DevicePtr, RawEvent, RawStream};

/// Non-blocking streams and their work. Every `unsafe fn` here keeps the common contract (see
/// [`Driver`](super::Driver)); what more each asks, it says.
pub trait Streams {
    fn create_non_blocking_stream(&self) -> Result<RawStream>;
    /// # Safety
    /// The common contract; the stream is destroyed once.
    unsafe fn destroy_stream(&self, stream: RawStream) -> Result<()>;
    /// True once everything enqueued on `stream` has run (`cuStreamQuery`).
    /// # Safety
    /// The common contract.
    unsafe fn query_stream(&self, stream: RawStream) -> Result<bool>;
    /// Enqueues capturing the work before it in `event` (`cuEventRecord`).
    /// # Safety
    /// The common contract.
    unsafe fn record_event(&self, event: RawEvent, stream: RawStream) -> Result<()>;
    /// Later work on `stream` waits for the work `event` captured when it was last recorded.
    /// # Safety
    /// The common contract.
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()>;
    /// Enqueues a device-to-device copy of `bytes` bytes (either side may be an IPC mapping).
    /// # Safety
    /// The common contract; both ranges have `bytes` bytes.
    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// Enqueues setting `bytes` bytes at `dst` to `value`.
    /// # Safety
    /// The common contract; the range has `bytes` bytes.
    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, stream: RawStream) -> Result<()>;

    // Stream memory operations on 32-bit flags in device memory (`cuStreamWriteValue32_v2`,
    // `cuStreamWaitValue32_v2`; the v1 entry points answer CUDA_ERROR_NOT_SUPPORTED on driver 580).
    /// Why stream memory operations cannot be used on `device`; `None` if they can.
    fn stream_memops_unsupported(&self, device: i32) -> Result<Option<String>>;
    /// Enqueues writing `value` to the 32-bit word at `ptr`, after the stream's earlier work (with a memory
    /// barrier, so that the work's writes are visible first).
    /// # Safety
    /// The common contract; `ptr` is a 4-aligned word of live device memory until the write has run.
    unsafe fn stream_write_u32(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()>;
    /// Enqueues a wait until the 32-bit word at `ptr` is at least `value`: later work on the stream waits.
    /// # Safety
    /// As for [`Streams::stream_write_u32`].
    unsafe fn stream_wait_u32_geq(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()>;
}
