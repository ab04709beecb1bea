//! Device memory as the streams and the kernel accept it: [`DeviceMemory`] (what an owner promises of its
//! pointer), [`Slice`] (a part of some owner's memory, borrowed) and [`DeviceBuffer`] (plain `cudaMalloc`
//! memory, freed on drop). The IPC mechanisms' exports and views are device memory too (see `ipc`).

use anyhow::{Context, Result, anyhow};

use super::release::release;
use crate::driver::{DevicePtr, Driver};

/// Device memory that stays allocated or mapped while it is borrowed.
///
/// # Safety
/// An implementor promises that [`DeviceMemory::ptr`] is the start of [`DeviceMemory::bytes`] bytes of
/// device memory of the driver it was made with, allocated or mapped for as long as the implementor is
/// borrowed: the driver's `unsafe fn`s are handed this pointer on that promise.
pub unsafe trait DeviceMemory {
    /// The device address. Only for the driver's `unsafe fn`s, whose contract the owner upholds.
    fn ptr(&self) -> DevicePtr;
    /// Bytes at [`DeviceMemory::ptr`].
    fn bytes(&self) -> usize;
}

/// A part of some device memory (`bytes` from `offset`), borrowed from its owner: a flag after a buffer's
/// data, say.
pub struct Slice<'m> {
    ptr: DevicePtr,
    bytes: usize,
    _owner: std::marker::PhantomData<&'m ()>,
}

impl<'m> Slice<'m> {
    pub fn of(memory: &'m (impl DeviceMemory + ?Sized), offset: usize, bytes: usize) -> Result<Self> {
        let end = offset.checked_add(bytes).filter(|end| *end <= memory.bytes());
        end.ok_or_else(|| anyhow!("{bytes} bytes at {offset} do not fit a buffer of {}", memory.bytes()))?;
        let ptr = memory.ptr().offset(offset).ok_or_else(|| anyhow!("device address overflow"))?;
        Ok(Self { ptr, bytes, _owner: std::marker::PhantomData })
    }
}

// SAFETY: the range lies inside its owner's memory (checked in `of`), which the borrow keeps alive.
unsafe impl DeviceMemory for Slice<'_> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A device buffer this process allocated (`cudaMalloc`) on `device`: freed on drop.
pub struct DeviceBuffer<'d> {
    driver: &'d dyn Driver,
    device: i32,
    ptr: DevicePtr,
    len: usize,
}

impl<'d> DeviceBuffer<'d> {
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        driver.use_device(device)?;
        let ptr =
            driver.alloc(bytes).with_context(|| format!("allocating {bytes} bytes on device {device}"))?;
        Ok(Self { driver, device, ptr, len: bytes })
    }
}

// SAFETY: `ptr` is `len` bytes from `alloc`, freed only when the buffer is dropped.
unsafe impl DeviceMemory for DeviceBuffer<'_> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn bytes(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `alloc` and is freed only here, once; cuMemFree waits for work that
        // still uses it (and the simulation keeps it mapped until that work has run).
        release(self.driver, self.device, "freeing a device buffer", |d| unsafe { d.free(self.ptr) });
    }
}
