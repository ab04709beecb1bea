//! Host memory for copies out of device memory: mapped and faulted in up front, pinned where the driver
//! allows (on one device's context), unpinned on drop. A child copies its buffer back into one to verify it.

use anyhow::{Context, Result, ensure};
use memmap2::{MmapMut, MmapOptions};

use super::memory::DeviceMemory;
use super::release::release;
use super::stream::Stream;
use crate::driver::Driver;
use crate::os::stop::StopCheck;

pub struct HostBuffer<'d> {
    driver: &'d dyn Driver,
    /// The device whose context pinned the memory.
    device: i32,
    memory: MmapMut,
    pinned: bool,
}

/// Maps `bytes` of anonymous memory and faults every page in. It needs no driver, so a child starts it on a
/// thread of its own while CUDA starts.
pub fn fault_in(bytes: usize) -> Result<MmapMut> {
    MmapOptions::new().len(bytes).populate().map_anon().context("mapping a host buffer")
}

impl<'d> HostBuffer<'d> {
    /// Pins memory made by [`fault_in`] on `device`'s context.
    pub fn pin(driver: &'d dyn Driver, device: i32, mut memory: MmapMut) -> Result<Self> {
        driver.use_device(device)?;
        // SAFETY: the memory is owned by the returned value, which unpins it in Drop before unmapping it.
        let pinned = unsafe { driver.pin_host_memory(&mut memory) }?;
        Ok(Self { driver, device, memory, pinned })
    }

    /// Copies the first `bytes` bytes of `src` here, after everything already on `stream` (which may write
    /// `src`) has run; returns those bytes. When it returns, the device writes here no more.
    pub fn copy_from(
        &mut self,
        src: &(impl DeviceMemory + ?Sized),
        bytes: usize,
        stream: &Stream,
        stop: &dyn StopCheck,
    ) -> Result<&mut [u8]> {
        self.copy_part_from(src, 0, bytes, stream, stop)
    }

    /// [`copy_from`](Self::copy_from) of the `bytes` bytes of `src` from `offset` on.
    pub fn copy_part_from(
        &mut self,
        src: &(impl DeviceMemory + ?Sized),
        offset: usize,
        bytes: usize,
        stream: &Stream,
        stop: &dyn StopCheck,
    ) -> Result<&mut [u8]> {
        let end = offset.checked_add(bytes);
        ensure!(
            end.is_some_and(|end| end <= src.bytes()) && bytes <= self.memory.len(),
            "a copy of {bytes} bytes from offset {offset} does not fit"
        );
        let from = src.ptr().offset(offset).ok_or_else(|| anyhow::anyhow!("offset {offset} overflows"))?;
        stream.synchronize(stop)?;
        self.driver.use_device(self.device)?;
        let dst = &mut self.memory[..bytes];
        // SAFETY: `src` is borrowed and has `offset + bytes` bytes (checked); the copy is synchronous.
        unsafe { self.driver.copy_to_host(dst, from) }?;
        Ok(dst)
    }
}

impl Drop for HostBuffer<'_> {
    fn drop(&mut self) {
        if !self.pinned {
            return;
        }
        let memory = &mut self.memory;
        // SAFETY: pinned by `pin`; every copy is synchronous, so none is pending.
        release(self.driver, self.device, "unpinning a host buffer", |d| unsafe {
            d.unpin_host_memory(memory)
        });
    }
}
