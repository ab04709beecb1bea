//! What a vmm, fabric or pool buffer rests on, and the buffer's memory on it, as this process holds them: a
//! [`Base`] (a physical allocation, or a memory pool) and the memory on it (a mapping of the allocation, or
//! an allocation from the pool). Each is given back on drop by the call that matches it, the memory before
//! its base.

use crate::driver::{DevicePtr, Driver, RawAllocation, RawPool};
use crate::gpu::{DeviceMemory, release};

/// What a buffer's memory rests on.
#[derive(Clone, Copy)]
pub(super) enum Base {
    /// A physical allocation (`cuMemCreate` or imported), on which the memory is a mapping (vmm, fabric).
    Allocation(RawAllocation),
    /// A memory pool (created or imported), from which the memory is an allocation or an imported pointer.
    Pool(RawPool),
}

impl From<RawAllocation> for Base {
    fn from(allocation: RawAllocation) -> Self {
        Base::Allocation(allocation)
    }
}

impl From<RawPool> for Base {
    fn from(pool: RawPool) -> Self {
        Base::Pool(pool)
    }
}

/// A base made or imported here on `device`: given back on drop.
pub(super) struct HeldBase<'d, R: Copy + Into<Base>> {
    pub(super) driver: &'d dyn Driver,
    pub(super) device: i32,
    pub(super) raw: R,
}

impl<R: Copy + Into<Base>> Drop for HeldBase<'_, R> {
    fn drop(&mut self) {
        let (driver, device) = (self.driver, self.device);
        match self.raw.into() {
            Base::Allocation(allocation) => {
                // SAFETY: made or imported by this driver, released only here, once (its mappings may
                // outlive it).
                let give_back = |d: &dyn Driver| unsafe { d.vmm_release(allocation) };
                release(driver, device, "releasing a VMM allocation", give_back)
            }
            Base::Pool(pool) => {
                // SAFETY: created or imported by this driver, destroyed only here, once, after the memory
                // on it (which holds it) was freed.
                let give_back = |d: &dyn Driver| unsafe { d.pool_destroy(pool) };
                release(driver, device, "destroying a memory pool", give_back)
            }
        }
    }
}

/// `bytes` at `ptr` on a base, readable and writable by its device: what the exporter and each importer
/// hold of a buffer. Given back on drop, then its base.
pub(super) struct MemoryOn<'d, R: Copy + Into<Base>> {
    pub(super) base: HeldBase<'d, R>,
    pub(super) ptr: DevicePtr,
    pub(super) bytes: usize,
}

// SAFETY: the memory lives until it is dropped; an importer's has the bytes the segment declares, and the
// exporter gives its own back only after every view is closed.
unsafe impl<R: Copy + Into<Base>> DeviceMemory for MemoryOn<'_, R> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

impl<R: Copy + Into<Base>> Drop for MemoryOn<'_, R> {
    fn drop(&mut self) {
        let (driver, device) = (self.base.driver, self.base.device);
        let (ptr, bytes) = (self.ptr, self.bytes);
        match self.base.raw.into() {
            Base::Allocation(_) => {
                // SAFETY: one `vmm_map` of the allocation, unmapped only here, before it is released.
                let give_back = |d: &dyn Driver| unsafe { d.vmm_unmap(ptr, bytes) };
                release(driver, device, "unmapping a VMM buffer", give_back)
            }
            Base::Pool(_) => {
                // SAFETY: allocated from the pool or imported from it once, freed only here, before the pool
                // is destroyed; an importer frees before the exporter.
                let give_back = |d: &dyn Driver| unsafe { d.pool_free(ptr) };
                release(driver, device, "freeing a pool allocation", give_back)
            }
        }
    }
}
