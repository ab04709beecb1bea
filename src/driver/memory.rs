//! Plain device memory (`cuMemAlloc`), the synchronous copy out of it to the host, and pinned host memory
//! ([`Memory`]).

use anyhow::Result;

use super::handles::DevicePtr;

/// Device memory of `cuMemAlloc`, and host memory for copies.
pub trait Memory {
    /// Plain `cuMemAlloc`: memory from the stream-ordered pool cannot be exported by legacy IPC.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// # Safety
    /// `ptr` came from [`Memory::alloc`], is freed once, and no work that uses it is pending.
    unsafe fn free(&self, ptr: DevicePtr) -> Result<()>;
    /// Copies `dst.len()` bytes from `src` into `dst` synchronously: when it returns, with `Ok` or `Err`,
    /// the device no longer writes into `dst`. It is not ordered after any stream: synchronise first.
    /// # Safety
    /// The common contract (see [`Driver`](super::Driver)); `src` has at least `dst.len()` bytes.
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()>;
    /// Pins `host` memory for fast copies; returns false where the driver cannot (copies stay pageable).
    /// # Safety
    /// `host` stays mapped until [`Memory::unpin_host_memory`] was called for it.
    unsafe fn pin_host_memory(&self, host: &mut [u8]) -> Result<bool>;
    /// # Safety
    /// `host` was pinned by [`Memory::pin_host_memory`] and no copy into or out of it is pending.
    unsafe fn unpin_host_memory(&self, host: &mut [u8]) -> Result<()>;
}
