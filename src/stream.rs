//! A stream created with `cudaStreamNonBlocking`, and the ordered work this program puts on it: waiting for
//! and recording events, filling and copying device memory. Destroyed on drop.

use anyhow::{Result, ensure};

use crate::driver::{Driver, RawStream};
use crate::ipc::{DeviceMemory, Event};
use crate::stop::{self, StopCheck};

pub struct Stream<'d> {
    driver: &'d dyn Driver,
    raw: RawStream,
}

/// `bytes` must fit in `memory`: the checks that make the driver's range contract hold.
fn fits(memory: &(impl DeviceMemory + ?Sized), bytes: usize) -> Result<()> {
    ensure!(bytes <= memory.bytes(), "{bytes} bytes do not fit in a buffer of {}", memory.bytes());
    Ok(())
}

/// A flag is one 4-aligned 32-bit word.
fn word(flag: &(impl DeviceMemory + ?Sized)) -> Result<()> {
    ensure!(flag.bytes() >= 4 && flag.ptr().is_aligned(4), "a flag must be a 4-aligned 32-bit word");
    Ok(())
}

impl<'d> Stream<'d> {
    pub fn non_blocking(driver: &'d dyn Driver) -> Result<Self> {
        Ok(Self { driver, raw: driver.create_non_blocking_stream()? })
    }

    /// The raw stream. Only for the driver's `unsafe fn`s, whose contract the caller upholds.
    pub(crate) fn raw(&self) -> RawStream {
        self.raw
    }

    /// `cudaStreamWaitEvent`: later work on this stream waits for the work the event last captured.
    pub fn wait_for(&self, event: &impl Event) -> Result<()> {
        // SAFETY: the stream and the event are alive while borrowed.
        unsafe { self.driver.stream_wait_event(self.raw, event.raw()) }
    }

    /// `cudaEventRecord` of `event` on this stream.
    pub fn record(&self, event: &impl Event) -> Result<()> {
        // SAFETY: the stream and the event are alive while borrowed.
        unsafe { self.driver.record_event(event.raw(), self.raw) }
    }

    /// Waits until everything enqueued so far has run, asking `stop` while it waits (a query loop, not
    /// `cuStreamSynchronize`, so that an abort reaches a process whose stream waits for a dead peer).
    pub fn synchronize(&self, stop: &dyn StopCheck) -> Result<()> {
        // SAFETY: the stream is alive while borrowed.
        stop::poll(|| unsafe { self.driver.query_stream(self.raw) }, stop, None).map(drop)
    }

    /// Enqueues writing `value` into the 32-bit flag at the start of `flag`, after the work before it (stream
    /// memory operations).
    pub fn write_flag(&self, flag: &impl DeviceMemory, value: u32) -> Result<()> {
        word(flag)?;
        // SAFETY: a 4-aligned word inside borrowed memory (checked); freeing it waits for the work.
        unsafe { self.driver.stream_write_u32(self.raw, flag.ptr(), value) }
    }

    /// Enqueues a wait until the 32-bit flag at the start of `flag` is at least `value`: later work on this
    /// stream waits for it.
    pub fn wait_flag(&self, flag: &impl DeviceMemory, at_least: u32) -> Result<()> {
        word(flag)?;
        // SAFETY: as in `write_flag`.
        unsafe { self.driver.stream_wait_u32_geq(self.raw, flag.ptr(), at_least) }
    }

    /// Enqueues setting the first `bytes` bytes of `dst` to `value`.
    pub fn fill(&self, dst: &impl DeviceMemory, value: u8, bytes: usize) -> Result<()> {
        fits(dst, bytes)?;
        // SAFETY: the range fits (checked); the memory's owner is borrowed, and freeing or closing device
        // memory waits for the work that uses it.
        unsafe { self.driver.fill(dst.ptr(), value, bytes, self.raw) }
    }

    /// Enqueues copying the first `bytes` bytes of `src` into `dst` (either may be an IPC mapping).
    pub fn copy(&self, dst: &impl DeviceMemory, src: &impl DeviceMemory, bytes: usize) -> Result<()> {
        fits(dst, bytes)?;
        fits(src, bytes)?;
        // SAFETY: as in `fill`, for both ranges.
        unsafe { self.driver.copy_device_to_device(dst.ptr(), src.ptr(), bytes, self.raw) }
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: created by this driver, destroyed only here, once; queued work still runs.
        if let Err(e) = unsafe { self.driver.destroy_stream(self.raw) } {
            warn!("warning: destroying a stream: {e:#}");
        }
    }
}
