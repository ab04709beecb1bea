//! Ownership of what crosses process boundaries: the exporter owns its buffer and its event and frees them on
//! drop; an opener holds views that close the mapping or the opened event on drop, and cannot free anything.
//! [`DeviceMemory`] and [`Event`] are what streams and kernels accept, so that no raw handle leaves here.

use anyhow::{Context, Result};

use crate::driver::{DevicePtr, Driver, IpcHandleBytes, RawEvent};
use crate::stop::{self, StopCheck};

fn warn_on_error(what: &str, result: Result<()>) {
    if let Err(e) = result {
        warn!("warning: {what}: {e:#}");
    }
}

/// Device memory that stays allocated or mapped while it is borrowed.
pub trait DeviceMemory {
    /// The device address. Only for the driver's `unsafe fn`s, whose contract the owner upholds.
    fn ptr(&self) -> DevicePtr;
    /// Bytes at [`DeviceMemory::ptr`].
    fn bytes(&self) -> usize;
}

/// A device buffer this process allocated (`cudaMalloc`): freed on drop.
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

impl DeviceMemory for DeviceBuffer<'_> {
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
        let freed = self.driver.use_device(self.device).and_then(|()| unsafe { self.driver.free(self.ptr) });
        warn_on_error("freeing a device buffer", freed);
    }
}

/// A device buffer allocated and exported by this process: freed on drop, like any [`DeviceBuffer`].
pub struct ExportedBuffer<'d> {
    buffer: DeviceBuffer<'d>,
    handle: IpcHandleBytes,
}

impl<'d> ExportedBuffer<'d> {
    /// `cudaMalloc` + `cudaIpcGetMemHandle` on `device`.
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        let buffer = DeviceBuffer::allocate(driver, device, bytes)?;
        // SAFETY: the buffer was just allocated by this driver and is alive.
        let handle =
            unsafe { driver.ipc_get_mem_handle(buffer.ptr) }.context("exporting a buffer's IPC handle")?;
        Ok(Self { buffer, handle })
    }

    pub fn handle(&self) -> &IpcHandleBytes {
        &self.handle
    }
}

impl DeviceMemory for ExportedBuffer<'_> {
    fn ptr(&self) -> DevicePtr {
        self.buffer.ptr
    }
    fn bytes(&self) -> usize {
        self.buffer.len
    }
}

/// Another process's buffer, mapped into this one (`cudaIpcOpenMemHandle`): unmapped on drop.
pub struct OpenedBuffer<'d> {
    driver: &'d dyn Driver,
    ptr: DevicePtr,
    len: usize,
}

impl<'d> OpenedBuffer<'d> {
    /// Maps the buffer of `handle`, which its exporter says has `len` bytes.
    pub fn open(driver: &'d dyn Driver, handle: &IpcHandleBytes, len: usize) -> Result<Self> {
        Ok(Self { driver, ptr: driver.ipc_open_mem_handle(handle)?, len })
    }
}

impl DeviceMemory for OpenedBuffer<'_> {
    fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    fn bytes(&self) -> usize {
        self.len
    }
}

impl Drop for OpenedBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the mapping came from `ipc_open_mem_handle` and is closed only here, once.
        warn_on_error("closing an opened IPC buffer", unsafe { self.driver.ipc_close_mem_handle(self.ptr) });
    }
}

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

/// What one process exports: its buffer and its event, on `device`. The event is declared first, so it is
/// destroyed before the buffer is freed.
pub struct ProcessExports<'d> {
    pub device: i32,
    pub event: ExportedEvent<'d>,
    pub buffer: ExportedBuffer<'d>,
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
