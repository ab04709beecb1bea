//! Ownership of what crosses process boundaries: the exporter owns its buffer and its event and frees them on
//! drop; an opener holds views that close the mapping or the opened event on drop, and cannot free anything.

use anyhow::{Context, Result};

use crate::driver::{DevicePtr, Driver, IpcHandleBytes, RawEvent};

fn warn_on_error(what: &str, result: Result<()>) {
    if let Err(e) = result {
        eprintln!("warning: {what}: {e:#}");
    }
}

/// A device buffer this process allocated (`cudaMalloc`): freed on drop.
pub struct DeviceBuffer<'d> {
    driver: &'d dyn Driver,
    device: i32,
    ptr: DevicePtr,
}

impl<'d> DeviceBuffer<'d> {
    pub fn allocate(driver: &'d dyn Driver, device: i32, bytes: usize) -> Result<Self> {
        driver.use_device(device)?;
        let ptr =
            driver.alloc(bytes).with_context(|| format!("allocating {bytes} bytes on device {device}"))?;
        Ok(Self { driver, device, ptr })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        warn_on_error(
            "freeing a device buffer",
            self.driver.use_device(self.device).and_then(|()| self.driver.free(self.ptr)),
        );
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
        let handle = driver.ipc_get_mem_handle(buffer.ptr()).context("exporting a buffer's IPC handle")?;
        Ok(Self { buffer, handle })
    }

    pub fn handle(&self) -> &IpcHandleBytes {
        &self.handle
    }

    pub fn ptr(&self) -> DevicePtr {
        self.buffer.ptr()
    }
}

/// Any event a stream can wait for or record: exported by this process or opened from another.
pub trait Event {
    fn raw(&self) -> RawEvent;
}

/// An interprocess event created and exported by this process (the parent): on drop it waits for the event's
/// last recorded work, then destroys it (the original's clean-up order).
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
        exported.handle = driver.ipc_get_event_handle(event).context("exporting an event's IPC handle")?;
        Ok(exported)
    }

    pub fn handle(&self) -> &IpcHandleBytes {
        &self.handle
    }
}

impl Event for ExportedEvent<'_> {
    fn raw(&self) -> RawEvent {
        self.event
    }
}

impl Drop for ExportedEvent<'_> {
    fn drop(&mut self) {
        let d = self.driver;
        warn_on_error(
            "synchronising and destroying an exported event",
            d.use_device(self.device)
                .and_then(|()| d.synchronize_event(self.event))
                .and_then(|()| d.destroy_event(self.event)),
        );
    }
}

/// What one process exports: its buffer and its event. The event is declared first, so it is synchronised
/// and destroyed before the buffer is freed.
pub struct ProcessExports<'d> {
    pub event: ExportedEvent<'d>,
    pub buffer: ExportedBuffer<'d>,
}

/// Another process's buffer, mapped into this one (`cudaIpcOpenMemHandle`): unmapped on drop.
pub struct OpenedBuffer<'d> {
    driver: &'d dyn Driver,
    ptr: DevicePtr,
}

impl<'d> OpenedBuffer<'d> {
    pub fn open(driver: &'d dyn Driver, handle: &IpcHandleBytes) -> Result<Self> {
        Ok(Self { driver, ptr: driver.ipc_open_mem_handle(handle)? })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for OpenedBuffer<'_> {
    fn drop(&mut self) {
        warn_on_error("closing an opened IPC buffer", self.driver.ipc_close_mem_handle(self.ptr));
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
    fn raw(&self) -> RawEvent {
        self.event
    }
}

impl Drop for OpenedEvent<'_> {
    fn drop(&mut self) {
        warn_on_error("destroying an opened IPC event", self.driver.destroy_event(self.event));
    }
}
