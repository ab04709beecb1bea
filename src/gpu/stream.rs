//! A stream created with `cudaStreamNonBlocking` on one device, and the ordered work this program puts on
//! it: waiting for and recording [`Event`]s, filling and copying device memory, stream memory operations.
//! Destroyed on drop. Every call makes the stream's device current first.

use anyhow::{Result, ensure};

use super::memory::DeviceMemory;
use super::release::release;
use crate::driver::{Driver, RawEvent, RawStream};
use crate::os::stop::{self, StopCheck};

/// Any event a stream can wait for or record: exported by this process or opened from another (see
/// `ipc::events`).
///
/// # Safety
/// An implementor promises that [`Event::raw`] is an event of [`Event::driver`], made on
/// [`Event::device`]'s context and not destroyed while the implementor is borrowed.
pub unsafe trait Event {
    fn driver(&self) -> &dyn Driver;
    /// The device whose context the event belongs to.
    fn device(&self) -> i32;
    /// The raw event. Only for the driver's `unsafe fn`s, whose contract the owner upholds.
    fn raw(&self) -> RawEvent;

    /// Whether the work the event last captured has run.
    fn is_complete(&self) -> Result<bool> {
        self.driver().use_device(self.device())?;
        // SAFETY: the event is alive as long as `self` (the trait's contract).
        unsafe { self.driver().query_event(self.raw()) }
    }

    /// The host waits for the work the event last captured (`cudaEventSynchronize`), asking `stop` while it
    /// waits, so that an abort always reaches it.
    fn synchronize(&self, stop: &dyn StopCheck) -> Result<()> {
        stop::poll(|| self.is_complete(), stop, None).map(drop)
    }
}

pub struct Stream<'d> {
    driver: &'d dyn Driver,
    device: i32,
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
    pub fn non_blocking(driver: &'d dyn Driver, device: i32) -> Result<Self> {
        driver.use_device(device)?;
        Ok(Self { driver, device, raw: driver.create_non_blocking_stream()? })
    }

    /// The driver, with the stream's device made current: what every call on the stream starts with.
    fn bound(&self) -> Result<&'d dyn Driver> {
        self.driver.use_device(self.device)?;
        Ok(self.driver)
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// The raw stream. Only for the driver's `unsafe fn`s, whose contract the caller upholds.
    pub(crate) fn raw(&self) -> RawStream {
        self.raw
    }

    /// `cudaStreamWaitEvent`: later work on this stream waits for the work the event last captured.
    pub fn wait_for(&self, event: &impl Event) -> Result<()> {
        let driver = self.bound()?;
        // SAFETY: the stream and the event are alive while borrowed.
        unsafe { driver.stream_wait_event(self.raw, event.raw()) }
    }

    /// `cudaEventRecord` of `event` on this stream.
    pub fn record(&self, event: &impl Event) -> Result<()> {
        let driver = self.bound()?;
        // SAFETY: the stream and the event are alive while borrowed.
        unsafe { driver.record_event(event.raw(), self.raw) }
    }

    /// Waits until everything enqueued so far has run, asking `stop` while it waits (a query loop, not
    /// `cuStreamSynchronize`, so that an abort reaches a process whose stream waits for a dead peer).
    pub fn synchronize(&self, stop: &dyn StopCheck) -> Result<()> {
        let driver = self.bound()?;
        // SAFETY: the stream is alive while borrowed.
        stop::poll(|| unsafe { driver.query_stream(self.raw) }, stop, None).map(drop)
    }

    /// Enqueues writing `value` into the 32-bit flag at the start of `flag`, after the work before it (stream
    /// memory operations).
    pub fn write_flag(&self, flag: &impl DeviceMemory, value: u32) -> Result<()> {
        word(flag)?;
        let driver = self.bound()?;
        // SAFETY: a 4-aligned word inside borrowed memory (checked); freeing it waits for the work.
        unsafe { driver.stream_write_u32(self.raw, flag.ptr(), value) }
    }

    /// Enqueues a wait until the 32-bit flag at the start of `flag` is at least `value`: later work on this
    /// stream waits for it.
    pub fn wait_flag(&self, flag: &impl DeviceMemory, at_least: u32) -> Result<()> {
        word(flag)?;
        let driver = self.bound()?;
        // SAFETY: as in `write_flag`.
        unsafe { driver.stream_wait_u32_geq(self.raw, flag.ptr(), at_least) }
    }

    /// Enqueues setting the first `bytes` bytes of `dst` to `value`.
    pub fn fill(&self, dst: &impl DeviceMemory, value: u8, bytes: usize) -> Result<()> {
        fits(dst, bytes)?;
        let driver = self.bound()?;
        // SAFETY: the range fits (checked); the memory's owner is borrowed, and freeing or closing device
        // memory waits for the work that uses it.
        unsafe { driver.fill(dst.ptr(), value, bytes, self.raw) }
    }

    /// Enqueues copying the first `bytes` bytes of `src` into `dst` (either may be an IPC mapping).
    pub fn copy(&self, dst: &impl DeviceMemory, src: &impl DeviceMemory, bytes: usize) -> Result<()> {
        fits(dst, bytes)?;
        fits(src, bytes)?;
        let driver = self.bound()?;
        // SAFETY: as in `fill`, for both ranges.
        unsafe { driver.copy_device_to_device(dst.ptr(), src.ptr(), bytes, self.raw) }
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: created by this driver, destroyed only here, once; queued work still runs.
        release(self.driver, self.device, "destroying a stream", |d| unsafe { d.destroy_stream(self.raw) });
    }
}
