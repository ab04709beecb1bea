//! What a vmm, fabric or pool buffer rests on, and the buffer's memory on it, as this process holds them: a
//! [`Base`] (a physical allocation, or a memory pool) and the memory on it (a mapping of the allocation, or
//! an allocation from the pool). Each is given back on drop by the call that matches it, the memory before
//! its base; the two kinds of base differ only in those calls.

use anyhow::Result;

use crate::driver::{DevicePtr, Driver};
use crate::gpu::{DeviceMemory, release};

/// What a buffer's memory rests on, and how each is given back.
pub(super) trait Base: Copy {
    /// Said where giving the base back fails.
    const RELEASING: &'static str;
    /// Said where giving the memory on it back fails.
    const FREEING: &'static str;
    /// Gives the base back.
    /// # Safety
    /// `self` came from `driver` and is given back once, after every memory on it.
    unsafe fn release(self, driver: &dyn Driver) -> Result<()>;
    /// Gives back the memory on a base of this kind.
    /// # Safety
    /// `ptr` and `bytes` are one memory on a live base of this kind, given back once, with no work pending.
    unsafe fn free(driver: &dyn Driver, ptr: DevicePtr, bytes: usize) -> Result<()>;
}

/// A base made or imported here on `device`: given back on drop.
pub(super) struct HeldBase<'d, B: Base> {
    pub(super) driver: &'d dyn Driver,
    pub(super) device: i32,
    pub(super) raw: B,
}

impl<B: Base> Drop for HeldBase<'_, B> {
    fn drop(&mut self) {
        // SAFETY: made or imported by this driver, given back only here, after the memory on it (which
        // holds it).
        release(self.driver, self.device, B::RELEASING, |d| unsafe { self.raw.release(d) });
    }
}

/// `bytes` at `ptr`, readable and writable by the base's device: what the exporter and each importer hold
/// of a buffer. Given back on drop, then its base.
pub(super) struct MemoryOn<'d, B: Base> {
    pub(super) base: HeldBase<'d, B>,
    pub(super) ptr: DevicePtr,
    pub(super) bytes: usize,
}

// SAFETY: the memory lives until it is dropped; an importer's has the bytes the segment declares, and the
// exporter gives its own back only after every view is closed.
unsafe impl<B: Base> DeviceMemory for MemoryOn<'_, B> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

impl<B: Base> Drop for MemoryOn<'_, B> {
    fn drop(&mut self) {
        let (driver, device) = (self.base.driver, self.base.device);
        // SAFETY: made or imported once on its base, given back only here, before the base; an importer
        // gives its own back before the exporter.
        release(driver, device, B::FREEING, |d| unsafe { B::free(d, self.ptr, self.bytes) });
    }
}
