//! Interprocess events (`cudaIpcGetEventHandle` / `cudaIpcOpenEventHandle`), the same for every mechanism:
//! the exporter's event is destroyed on drop, and so is an opener's view of it.

use anyhow::{Context, Result};

use super::warn_on_error;
use crate::driver::{Driver, IpcHandleBytes, RawEvent};
use crate::stop::{self, StopCheck};

/// Any event a stream can wait for or record: exported by this process or opened from another.
pub trait Event {
    fn driver(&self) -> &dyn Driver;
    /// The raw event. Only for the driver's `unsafe fn`s, whose contract the owner upholds.
    fn raw(&self) -> RawEvent;

    /// Whether the work the event last captured has run.
    fn is_complete(&self) -> Result<bool> {
        // SAFETY: the event is alive as long as `self`.
        unsafe { self.driver().query_event(self.raw()) }
    }

    /// The host waits for the work the event last captured (`cudaEventSynchronize`), asking `stop` while it
    /// waits, so that an abort always reaches it.
    fn synchronize(&self, stop: &dyn StopCheck) -> Result<()> {
        stop::poll(|| self.is_complete(), stop, None).map(drop)
    }
}

/// An interprocess event created and exported by this process (the parent): destroyed on drop. The driver
/// releases an event whose recorded work is still pending once that work is done, so a failed run does not
/// wait for work that a dead process recorded; a run that passed synchronises it first, as the original does.
pub struct ExportedEvent<'d> {
    driver: &'d dyn Driver,
    device: i32,
    event: RawEvent,
    handle: IpcHandleBytes,
}

impl<'d> ExportedEvent<'d> {
    /// `cudaEventCreate(DisableTiming | Interprocess)` + `cudaIpcGetEventHandle` on `device`.
    pub fn create(driver: &'d dyn Driver, device: i32) -> Result<Self> {
        driver.use_device(device)?;
        let event = driver.create_interprocess_event()?;
        let mut exported = Self { driver, device, event, handle: [0; 64] };
        // SAFETY: the event was just created by this driver; `exported` destroys it if this fails.
        exported.handle =
            unsafe { driver.ipc_get_event_handle(event) }.context("exporting an event's IPC handle")?;
        Ok(exported)
    }

    pub fn handle(&self) -> &IpcHandleBytes {
        &self.handle
    }
}

impl Event for ExportedEvent<'_> {
    fn driver(&self) -> &dyn Driver {
        self.driver
    }
    fn raw(&self) -> RawEvent {
        self.event
    }
}

impl Drop for ExportedEvent<'_> {
    fn drop(&mut self) {
        let d = self.driver;
        // SAFETY: created by this driver, destroyed only here, once.
        let destroyed = d.use_device(self.device).and_then(|()| unsafe { d.destroy_event(self.event) });
        warn_on_error("destroying an exported event", destroyed);
    }
}

/// Another process's event, opened in this one (`cudaIpcOpenEventHandle`): destroyed on drop.
pub struct OpenedEvent<'d> {
    driver: &'d dyn Driver,
    event: RawEvent,
}

impl<'d> OpenedEvent<'d> {
    pub fn open(driver: &'d dyn Driver, handle: &IpcHandleBytes) -> Result<Self> {
        Ok(Self { driver, event: driver.ipc_open_event_handle(handle)? })
    }
}

impl Event for OpenedEvent<'_> {
    fn driver(&self) -> &dyn Driver {
        self.driver
    }
    fn raw(&self) -> RawEvent {
        self.event
    }
}

impl Drop for OpenedEvent<'_> {
    fn drop(&mut self) {
        // SAFETY: opened by this driver, destroyed only here, once.
        warn_on_error("destroying an opened IPC event", unsafe { self.driver.destroy_event(self.event) });
    }
}
