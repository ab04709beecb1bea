//! Interprocess events (`cudaIpcGetEventHandle` / `cudaIpcOpenEventHandle`), the same for every mechanism:
//! the exporter's event is destroyed on drop, and so is an opener's view of it.
//!
//! The driver backs an exported event with a file in `/dev/shm` named by the exporter's pid in its own
//! namespace (see `driver_files`), which importers map by name. Each side reads which file it maps right
//! after the export or the open: the exporter publishes that file's identity and removes its name once every
//! importer has opened the event (the driver removes it when the exporter exits normally); an importer that
//! mapped another file fails at once, instead of ordering its work with another process's event.

use std::sync::Mutex;

use anyhow::{Context, Result};

use super::diagnose::{self, Exporter, Opening};
use crate::driver::{Driver, IpcHandleBytes, RawEvent};
use crate::gpu::{Event, release};
use crate::os::driver_files::{self, EventFile};

/// Held while this process exports or opens an event, so that the one driver file that appears in
/// `/proc/self/maps` meanwhile is that event's.
static MAPPING_EVENT_FILES: Mutex<()> = Mutex::new(());

/// Runs `make` (an event's creation, or its opening) and returns what it made with the driver files this
/// process mapped before and after.
fn with_mapped_files<T>(make: impl FnOnce() -> Result<T>) -> Result<(T, Mapped)> {
    let _alone = MAPPING_EVENT_FILES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // Opened before: a `make` that takes the last descriptor leaves none to open it with after, and the
    // file it made would be known to no one.
    let mut maps = driver_files::Maps::open()?;
    let before = maps.read()?;
    let made = make()?;
    Ok((made, Mapped { before, after: maps.read()? }))
}

/// The driver files a process mapped before and after it made or opened an event.
struct Mapped {
    before: Vec<EventFile>,
    after: Vec<EventFile>,
}

/// An interprocess event this process holds on `device`'s context, exported by it ([`ExportedEvent`]) or
/// opened from another's handle ([`OpenedEvent`]): destroyed on drop. The driver releases an event whose
/// recorded work is still pending once that work is done, so a failed run does not wait for work that a dead
/// process recorded; a run that passed synchronises it first, as the original does.
pub struct IpcEvent<'d, S: Side> {
    driver: &'d dyn Driver,
    device: i32,
    event: RawEvent,
    side: S,
}

/// Which side of an interprocess event this process holds.
pub trait Side {
    /// What failed, where destroying the event fails.
    const DESTROYING: &'static str;
}

/// The exporter's side (the parent's): the handle, and the driver's file behind the event as this process
/// maps it (`None` where none appeared).
pub struct Exported {
    handle: IpcHandleBytes,
    file: Option<EventFile>,
}

impl Side for Exported {
    const DESTROYING: &'static str = "destroying an exported event";
}

/// An importer's side.
pub struct Opened;

impl Side for Opened {
    const DESTROYING: &'static str = "destroying an opened IPC event";
}

/// An interprocess event created and exported by this process (`cudaEventCreate(DisableTiming |
/// Interprocess)` + `cudaIpcGetEventHandle`).
pub type ExportedEvent<'d> = IpcEvent<'d, Exported>;

/// Another process's event, opened in this one (`cudaIpcOpenEventHandle`).
pub type OpenedEvent<'d> = IpcEvent<'d, Opened>;

impl<'d> IpcEvent<'d, Exported> {
    /// `cudaEventCreate(DisableTiming | Interprocess)` + `cudaIpcGetEventHandle` on `device`.
    pub fn create(driver: &'d dyn Driver, device: i32) -> Result<Self> {
        driver.use_device(device)?;
        let (mut exported, mapped) = with_mapped_files(|| {
            let event = driver.create_interprocess_event()?;
            let side = Exported { handle: [0; 64], file: None };
            let mut exported = Self { driver, device, event, side };
            // SAFETY: the event was just created by this driver; `exported` destroys it if this fails.
            exported.side.handle =
                unsafe { driver.ipc_get_event_handle(event) }.context("exporting an event's IPC handle")?;
            Ok(exported)
        })?;
        exported.side.file =
            driver_files::holding_new_event(&mapped.before, &mapped.after, std::process::id());
        Ok(exported)
    }

    pub fn handle(&self) -> &IpcHandleBytes {
        &self.side.handle
    }

    /// The driver's file behind the event, as this process maps it.
    pub fn file(&self) -> Option<&EventFile> {
        self.side.file.as_ref()
    }

    /// Removes the name of the event's file, if it is still this event's: once every importer has opened
    /// the event, nothing needs it, and a name that is gone cannot be left behind.
    pub fn remove_file_name(&self) -> Result<()> {
        self.side.file.as_ref().map_or(Ok(()), |file| file.remove_if_ours().map(drop))
    }
}

impl<'d> IpcEvent<'d, Opened> {
    /// Opens the event `handle` names on `device`'s context, and checks that the driver's file this process
    /// mapped for it is the one `exporter` made; a failure says why, from what this process can see.
    pub fn open(
        driver: &'d dyn Driver,
        device: i32,
        handle: &IpcHandleBytes,
        exporter: &Exporter,
    ) -> Result<Self> {
        driver.use_device(device)?;
        let (opened, mapped) = with_mapped_files(|| {
            let event = driver
                .ipc_open_event_handle(handle)
                .map_err(|e| diagnose::open_failed(e, Opening::Event, exporter))?;
            Ok(Self { driver, device, event, side: Opened })
        })?;
        // The file it mapped for the event: a second event of one exporter maps nothing new, and says nothing.
        let file = driver_files::appeared(&mapped.before, &mapped.after);
        match diagnose::collision(exporter, file.as_ref()) {
            Some(collision) => Err(collision), // `opened` is destroyed on the way out
            None => Ok(opened),
        }
    }
}

// SAFETY: the event was made or opened on `device` by `driver` and is destroyed only when the owner is
// dropped.
unsafe impl<S: Side> Event for IpcEvent<'_, S> {
    fn driver(&self) -> &dyn Driver {
        self.driver
    }
    fn device(&self) -> i32 {
        self.device
    }
    fn raw(&self) -> RawEvent {
        self.event
    }
}

impl<S: Side> Drop for IpcEvent<'_, S> {
    fn drop(&mut self) {
        // SAFETY: created or opened by this driver, destroyed only here, once.
        release(self.driver, self.device, S::DESTROYING, |d| unsafe { d.destroy_event(self.event) });
    }
}
