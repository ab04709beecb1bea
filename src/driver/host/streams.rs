//! Simulated streams and the work they run: one table of this process's streams, each a queue drained in
//! order by a worker thread of its own ([`StreamTable::enqueue`], which the kernel's launch uses too);
//! event records and waits, copies, fills and the stream memory operations on 32-bit flags.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

use super::{Held, HostDriver, SimulatedDevice, failed, lock, owned};
use crate::driver::error::code;
use crate::driver::handles::{DevicePtr, RawEvent, RawStream};
use crate::driver::streams::Streams;

/// How often a waiting stream worker looks again.
const POLL: Duration = Duration::from_micros(50);

/// Work for a stream's worker; the flag says the stream was destroyed, so that a wait that can never end
/// lets go.
pub(super) type Work = Box<dyn FnOnce(&AtomicBool) + Send>;

/// A stream: work runs in order on its worker thread; it is idle when `done` reaches `enqueued`.
struct Stream {
    queue: Sender<Work>,
    enqueued: u64,
    done: Arc<AtomicU64>,
    destroyed: Arc<AtomicBool>,
}

#[derive(Default)]
struct Table {
    streams: HashMap<u64, Stream>,
    last_id: u64,
}

#[derive(Default)]
pub(super) struct StreamTable(Mutex<Table>);

impl StreamTable {
    /// Puts the work `make` returns at the end of `stream`'s queue (made only once the stream is found, so
    /// that nothing is counted for work that never runs).
    pub(super) fn enqueue(&self, call: &str, stream: RawStream, make: impl FnOnce() -> Work) -> Result<()> {
        let mut table = lock(&self.0)?;
        let found = table.streams.get_mut(&stream.0);
        let stream = found.ok_or_else(|| failed(call, code::INVALID_HANDLE, no_stream(stream)))?;
        stream.queue.send(make()).map_err(|_| anyhow!("a simulated stream's worker is gone"))?;
        stream.enqueued += 1;
        Ok(())
    }

    pub(super) fn held(&mut self, held: &mut Held) {
        held.add(owned(&mut self.0).streams.len(), "stream");
    }
}

fn no_stream(stream: RawStream) -> String {
    format!("no live stream {:#x}", stream.0)
}

/// Waits until `done()`, or until the stream is destroyed.
fn poll_until(done: impl Fn() -> bool, destroyed: &AtomicBool) {
    while !done() && !destroyed.load(Ordering::Acquire) {
        std::thread::sleep(POLL);
    }
}

impl Streams for HostDriver {
    fn create_non_blocking_stream(&self) -> Result<RawStream> {
        let (queue, receiver) = channel::<Work>();
        let done = Arc::new(AtomicU64::new(0));
        let destroyed = Arc::new(AtomicBool::new(false));
        let (worker_done, worker_destroyed) = (Arc::clone(&done), Arc::clone(&destroyed));
        std::thread::Builder::new()
            .name("simulated-stream".into())
            .spawn(move || {
                for work in receiver {
                    work(&worker_destroyed);
                    worker_done.fetch_add(1, Ordering::AcqRel);
                }
            })
            .context("starting a simulated stream's worker thread")?;
        let mut table = lock(&self.streams.0)?;
        table.last_id += 1;
        let id = table.last_id;
        table.streams.insert(id, Stream { queue, enqueued: 0, done, destroyed });
        Ok(RawStream(id))
    }

    unsafe fn destroy_stream(&self, stream: RawStream) -> Result<()> {
        // As with CUDA, queued work still runs; the worker ends when its queue is empty.
        let removed = lock(&self.streams.0)?.streams.remove(&stream.0);
        let stream =
            removed.ok_or_else(|| failed("cuStreamDestroy", code::INVALID_HANDLE, no_stream(stream)))?;
        stream.destroyed.store(true, Ordering::Release);
        Ok(())
    }

    unsafe fn query_stream(&self, stream: RawStream) -> Result<bool> {
        let table = lock(&self.streams.0)?;
        let found = table.streams.get(&stream.0);
        let stream = found.ok_or_else(|| failed("cuStreamQuery", code::INVALID_HANDLE, no_stream(stream)))?;
        Ok(stream.done.load(Ordering::Acquire) == stream.enqueued)
    }

    unsafe fn record_event(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        let call = "cuEventRecord";
        let event = self.events.get(call, event)?;
        self.streams.enqueue(call, stream, || {
            let generation = event.recorded().fetch_add(1, Ordering::AcqRel) + 1;
            Box::new(move |_: &AtomicBool| event.complete(generation))
        })
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        let call = "cuStreamWaitEvent";
        let event = self.events.get(call, event)?;
        self.streams.enqueue(call, stream, || {
            // The generation recorded now is the one to wait for, not one recorded later.
            let generation = event.recorded().load(Ordering::Acquire);
            Box::new(move |destroyed: &AtomicBool| poll_until(|| event.reached(generation), destroyed))
        })
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        let call = "cuMemcpyDtoDAsync";
        let (dst_map, dst) = self.memory.range(call, dst, bytes)?;
        let (src_map, src) = self.memory.range(call, src, bytes)?;
        self.streams.enqueue(call, stream, || {
            Box::new(move |_: &AtomicBool| {
                // SAFETY: both ranges lie in mappings this closure keeps alive (checked); `copy` allows
                // overlap.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
                drop((dst_map, src_map));
            })
        })
    }

    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, stream: RawStream) -> Result<()> {
        let call = "cuMemsetD8Async";
        let (mapping, start) = self.memory.range(call, dst, bytes)?;
        self.streams.enqueue(call, stream, || {
            Box::new(move |_: &AtomicBool| {
                // SAFETY: the range lies in a mapping this closure keeps alive (checked).
                unsafe { std::ptr::write_bytes(start as *mut u8, value, bytes) };
                drop(mapping);
            })
        })
    }

    fn stream_memops_unsupported(&self, device: i32) -> Result<Option<String>> {
        let lacks = self.device("cuDeviceGetAttribute", device)?.lacks(SimulatedDevice::NoStreamMemops);
        Ok(lacks.then(|| format!("device {device} has no stream memory operations (simulated)")))
    }

    unsafe fn stream_write_u32(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
        let call = "cuStreamWriteValue32_v2";
        let (mapping, word) = self.memory.word(call, ptr)?;
        self.streams.enqueue(call, stream, || {
            Box::new(move |_: &AtomicBool| {
                // SAFETY: `word` checked the aligned word lies in the mapping this closure keeps alive.
                unsafe { &*(word as *const AtomicU32) }.store(value, Ordering::Release);
                drop(mapping);
            })
        })
    }

    unsafe fn stream_wait_u32_geq(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
        let call = "cuStreamWaitValue32_v2";
        let (mapping, word) = self.memory.word(call, ptr)?;
        self.streams.enqueue(call, stream, || {
            Box::new(move |destroyed: &AtomicBool| {
                // SAFETY: as in `stream_write_u32`.
                let word = unsafe { &*(word as *const AtomicU32) };
                poll_until(|| word.load(Ordering::Acquire) >= value, destroyed);
                drop(mapping);
            })
        })
    }
}
