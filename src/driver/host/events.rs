//! Simulated interprocess events, and their files in `/dev/shm`: one table of the events this process
//! created or opened, the files its exported events have, and the numbers that name them.
//!
//! An event is two 64-bit counters (the generation last recorded, the highest one completed) in a file of
//! 16 bytes named as the CUDA driver (580) names it, `/dev/shm/cuda.shm.<uid, hex>.<pid, hex>.<n>`, by
//! the uid and the pid the exporter has in its own namespaces, mode 0600. An opener maps whatever file has
//! that name, with its own uid in it, in its own `/dev/shm` now (measured on the H200 host, 2026-12-07: an
//! importer of another uid, or in a user namespace where it is another uid, finds no file of its uid's
//! name): none is `CUDA_ERROR_MAP_FAILED`, an exporter of the opener's own pid number
//! `CUDA_ERROR_INVALID_CONTEXT`. The names are removed when the driver is dropped, where they are still
//! this process's files.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, ensure};

use super::ipc::{decode, encode, refuse_own_pid};
use super::memory::Mapping;
use super::{Held, HostDriver, failed, lock, owned};
use crate::driver::error::code;
use crate::driver::events::Events;
use crate::driver::handles::{IpcHandleBytes, RawEvent};

const EVENT_TAG: &[u8; 8] = b"SIMEVT\0\x02";
/// An event's shared counters: the generation last recorded, and the highest one completed.
const EVENT_BYTES: usize = 16;

/// An event's counters, shared by the exporter and every process that opened it, and its number in the
/// exporter (the last part of its file's name).
pub(super) struct Event {
    mapping: Arc<Mapping>,
    number: i32,
}

impl Event {
    fn new(mapping: Arc<Mapping>, number: i32) -> Result<Arc<Self>> {
        ensure!(mapping.len() >= EVENT_BYTES, "a simulated event's mapping has {} bytes", mapping.len());
        Ok(Arc::new(Self { mapping, number }))
    }

    fn counter(&self, i: usize) -> &AtomicU64 {
        let i = i.min(EVENT_BYTES / 8 - 1);
        // SAFETY: counter `i` (0 or 1) lies in the first EVENT_BYTES of the mapping, which has at least that
        // many (checked by `new`), is page-aligned and lives as long as `self`; other processes touch it only
        // through atomics too.
        unsafe { &*self.mapping.as_ptr().add(i * 8).cast::<AtomicU64>() }
    }

    pub(super) fn recorded(&self) -> &AtomicU64 {
        self.counter(0)
    }

    fn completed(&self) -> &AtomicU64 {
        self.counter(1)
    }

    /// Marks `generation` complete (a stream reached the record).
    pub(super) fn complete(&self, generation: u64) {
        self.completed().fetch_max(generation, Ordering::AcqRel);
    }

    pub(super) fn reached(&self, generation: u64) -> bool {
        self.completed().load(Ordering::Acquire) >= generation
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    Exported,
    Opened,
}

#[derive(Default)]
struct Table {
    events: HashMap<u64, (Arc<Event>, Origin)>,
    last_id: u64,
    /// The number of the last exported event, from 1 as in the CUDA driver's file names.
    last_number: i32,
    /// The files in /dev/shm this process's exported events have, as the CUDA driver makes them.
    files: Vec<(String, File)>,
}

impl Table {
    fn insert(&mut self, event: Arc<Event>, origin: Origin) -> RawEvent {
        self.last_id += 1;
        self.events.insert(self.last_id, (event, origin));
        RawEvent(self.last_id)
    }
}

#[derive(Default)]
pub(super) struct EventTable(Mutex<Table>);

impl EventTable {
    /// The event `event`, for `call`.
    pub(super) fn get(&self, call: &str, event: RawEvent) -> Result<Arc<Event>> {
        let table = lock(&self.0)?;
        let found = table.events.get(&event.0).map(|(event, _)| Arc::clone(event));
        found.ok_or_else(|| failed(call, code::INVALID_HANDLE, format!("no live event {:#x}", event.0)))
    }

    pub(super) fn held(&mut self, held: &mut Held) {
        let table = owned(&mut self.0);
        let count = |origin| table.events.values().filter(|(_, o)| *o == origin).count();
        held.add(count(Origin::Exported), "exported event");
        held.add(count(Origin::Opened), "opened IPC event");
    }

    /// A normal end: the event files go, where their names are still this process's files.
    pub(super) fn remove_files(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let same = |a: &std::fs::Metadata, b: &std::fs::Metadata| a.dev() == b.dev() && a.ino() == b.ino();
        for (name, file) in std::mem::take(&mut owned(&mut self.0).files) {
            if let (Ok(named), Ok(ours)) = (std::fs::symlink_metadata(&name), file.metadata())
                && same(&named, &ours)
            {
                let _ = std::fs::remove_file(name);
            }
        }
    }
}

/// The name of the driver's file for event `n` of the process that is `pid` in its own PID namespace, as
/// a process whose uid (as it sees itself) is `uid` makes it, and as one of that uid looks for it.
fn file_name(uid: u32, pid: u32, n: i32) -> String {
    format!("/dev/shm/cuda.shm.{uid:x}.{pid:x}.{n}")
}

/// This process's uid as it sees itself, which the driver's event files are named by.
fn own_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

impl Events for HostDriver {
    fn create_interprocess_event(&self) -> Result<RawEvent> {
        use std::os::unix::fs::MetadataExt;
        // Like the CUDA driver, the counters live in a file in /dev/shm named by our pid, which replaces any
        // file of that name (made elsewhere by a process of the same pid number); removed only when this
        // process ends normally, so that the tests see what a killed exporter leaves.
        let n = {
            let mut table = lock(&self.events.0)?;
            table.last_number += 1;
            table.last_number
        };
        let name = file_name(own_uid(), std::process::id(), n);
        // The file replaces whatever has the name (another process of our pid number may have made it, or be
        // making it now): the old name goes, then the file is made anew under it. No other name is ever made,
        // so a process killed at any moment leaves only what the driver would.
        let mut attempts = 0;
        let file = loop {
            match std::fs::remove_file(&name) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("replacing {name}, as the CUDA driver does"));
                }
                _ => {}
            }
            match OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&name) {
                Ok(file) => break file,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempts < 10 => attempts += 1,
                Err(e) => return Err(e).with_context(|| format!("creating {name}, as the CUDA driver does")),
            }
        };
        // A creation that fails once the file is there takes its name away again, if it is still this file
        // (out of descriptors, say): an event that was never made leaves no file.
        let ours = file.metadata().ok().map(|m| (m.dev(), m.ino()));
        let made = (|| {
            file.set_len(EVENT_BYTES as u64)
                .with_context(|| format!("sizing {name}, as the CUDA driver does"))?;
            let kept = file.try_clone().context("dup of an event file")?;
            let event = Event::new(Mapping::new(file, EVENT_BYTES)?, n)?;
            Ok((kept, event))
        })();
        let (kept, event) = match made {
            Ok(made) => made,
            Err(e) => {
                let named = std::fs::symlink_metadata(&name).ok().map(|m| (m.dev(), m.ino()));
                if named.is_some() && named == ours {
                    let _ = std::fs::remove_file(&name);
                }
                return Err(e);
            }
        };
        let mut table = lock(&self.events.0)?;
        table.files.push((name, kept));
        Ok(table.insert(event, Origin::Exported))
    }

    unsafe fn ipc_get_event_handle(&self, event: RawEvent) -> Result<IpcHandleBytes> {
        let call = "cuIpcGetEventHandle";
        let table = lock(&self.events.0)?;
        match table.events.get(&event.0) {
            Some((event, Origin::Exported)) => {
                Ok(encode(EVENT_TAG, std::process::id(), event.number, EVENT_BYTES as u64))
            }
            Some((_, Origin::Opened)) => {
                Err(failed(call, code::INVALID_VALUE, "the event was opened, not created"))
            }
            None => Err(failed(call, code::INVALID_HANDLE, format!("no live event {:#x}", event.0))),
        }
    }

    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent> {
        let call = "cuIpcOpenEventHandle";
        let (pid, n, len) = decode(handle, EVENT_TAG)
            .ok_or_else(|| failed(call, code::INVALID_VALUE, "not a simulated event handle"))?;
        if len != EVENT_BYTES as u64 {
            return Err(failed(call, code::INVALID_VALUE, format!("the handle declares {len} bytes")));
        }
        refuse_own_pid(call, pid)?;
        // By name, with this process's own uid in it, in this process's /dev/shm: whatever file has the
        // name now.
        let name = file_name(own_uid(), pid, n);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&name)
            .map_err(|e| failed(call, code::MAP_FAILED, format!("no {name} in this /dev/shm ({e})")))?;
        let size = file.metadata().map(|m| m.len()).ok();
        if size != Some(len) {
            return Err(failed(call, code::MAP_FAILED, format!("{name} has {size:?} bytes, not {len}")));
        }
        let event = Event::new(Mapping::new(file, EVENT_BYTES)?, n)?;
        Ok(lock(&self.events.0)?.insert(event, Origin::Opened))
    }

    unsafe fn destroy_event(&self, event: RawEvent) -> Result<()> {
        let removed = lock(&self.events.0)?.events.remove(&event.0);
        let why = || failed("cuEventDestroy", code::INVALID_HANDLE, format!("no live event {:#x}", event.0));
        removed.map(drop).ok_or_else(why)
    }

    unsafe fn query_event(&self, event: RawEvent) -> Result<bool> {
        let event = self.events.get("cuEventQuery", event)?;
        Ok(event.reached(event.recorded().load(Ordering::Acquire)))
    }
}
