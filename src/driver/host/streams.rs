//! Simulated streams and the work they run: one table of this process's streams, each a queue drained in
//! order by a worker thread of its own; event records and waits, the kernel (which takes a random 4 to 20 ms
//! before it writes, so that work that is not ordered comes out in the wrong order), copies, fills and the
//! stream memory operations on 32-bit flags.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

use super::{Held, HostDriver, failed, lock, owned};
use crate::driver::{DevicePtr, RawEvent, RawFunction, RawStream, code};

/// How long a simulated kernel takes before it writes: random in this range, and longer than a barrier
/// round of a loaded host (on 2 busy cores one can take milliseconds), so that a kernel is still running
/// when the next step's work is enqueued, and work that is not ordered comes out in the wrong order.
const KERNEL_DELAY_US: std::ops::Range<u64> = 4_000..20_000;
/// How often a waiting stream worker looks again.
const POLL: Duration = Duration::from_micros(50);

/// Work for a stream's worker; the flag says the stream was destroyed, so that a wait that can never end
/// lets go.
type Work = Box<dyn FnOnce(&AtomicBool) + Send>;

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
pub(super) struct Streams(Mutex<Table>);

impl Streams {
    /// Puts the work `make` returns at the end of `stream`'s queue (made only once the stream is found, so
    /// that nothing is counted for work that never runs).
    fn enqueue(&self, call: &str, stream: RawStream, make: impl FnOnce() -> Work) -> Result<()> {
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

pub(super) fn create(sim: &HostDriver) -> Result<RawStream> {
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
    let mut table = lock(&sim.streams.0)?;
    table.last_id += 1;
    let id = table.last_id;
    table.streams.insert(id, Stream { queue, enqueued: 0, done, destroyed });
    Ok(RawStream(id))
}

pub(super) fn destroy(sim: &HostDriver, stream: RawStream) -> Result<()> {
    // As with CUDA, queued work still runs; the worker ends when its queue is empty.
    let removed = lock(&sim.streams.0)?.streams.remove(&stream.0);
    let stream = removed.ok_or_else(|| failed("cuStreamDestroy", code::INVALID_HANDLE, no_stream(stream)))?;
    stream.destroyed.store(true, Ordering::Release);
    Ok(())
}

pub(super) fn query(sim: &HostDriver, stream: RawStream) -> Result<bool> {
    let table = lock(&sim.streams.0)?;
    let found = table.streams.get(&stream.0);
    let stream = found.ok_or_else(|| failed("cuStreamQuery", code::INVALID_HANDLE, no_stream(stream)))?;
    Ok(stream.done.load(Ordering::Acquire) == stream.enqueued)
}

pub(super) fn record_event(sim: &HostDriver, event: RawEvent, stream: RawStream) -> Result<()> {
    let call = "cuEventRecord";
    let event = sim.events.get(call, event)?;
    sim.streams.enqueue(call, stream, || {
        let generation = event.recorded().fetch_add(1, Ordering::AcqRel) + 1;
        Box::new(move |_: &AtomicBool| event.complete(generation))
    })
}

pub(super) fn wait_event(sim: &HostDriver, stream: RawStream, event: RawEvent) -> Result<()> {
    let call = "cuStreamWaitEvent";
    let event = sim.events.get(call, event)?;
    sim.streams.enqueue(call, stream, || {
        // The generation recorded now is the one to wait for, not one recorded later.
        let generation = event.recorded().load(Ordering::Acquire);
        Box::new(move |destroyed: &AtomicBool| poll_until(|| event.reached(generation), destroyed))
    })
}

pub(super) fn load_kernel(name: &CStr) -> Result<RawFunction> {
    if name != c"simpleKernel" {
        return Err(failed("cuModuleGetFunction", code::NOT_FOUND, format!("no kernel {name:?}")));
    }
    Ok(RawFunction(1))
}

/// A kernel's run time: xorshift, good enough to shuffle the order of concurrent work.
fn kernel_delay(sim: &HostDriver) -> Duration {
    let span = KERNEL_DELAY_US.end - KERNEL_DELAY_US.start;
    Duration::from_micros(KERNEL_DELAY_US.start + sim.random() % span)
}

pub(super) fn launch(
    sim: &HostDriver,
    stream: RawStream,
    (target, size, value): (DevicePtr, i32, u8),
) -> Result<()> {
    let call = "cuLaunchKernel";
    let size = usize::try_from(size)
        .map_err(|_| failed(call, code::INVALID_VALUE, format!("kernel size {size}")))?;
    let (mapping, start) = sim.memory.range(call, target, size)?;
    let delay = kernel_delay(sim);
    sim.streams.enqueue(call, stream, || {
        Box::new(move |_: &AtomicBool| {
            std::thread::sleep(delay);
            // SAFETY: `range` checked that `size` bytes from `start` lie in the mapping, which this closure
            // keeps alive; other processes write it only when the events order them after this work.
            unsafe { std::ptr::write_bytes(start as *mut u8, value, size) };
            drop(mapping);
        })
    })
}

pub(super) fn copy_to_host(sim: &HostDriver, dst: &mut [u8], src: DevicePtr) -> Result<()> {
    let (_mapping, start) = sim.memory.range("cuMemcpyDtoH", src, dst.len())?;
    // SAFETY: `range` checked that dst.len() bytes from `start` lie in a live mapping; `dst` is a distinct
    // host slice. The copy is done when this returns.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, dst.as_mut_ptr(), dst.len()) };
    Ok(())
}

pub(super) fn copy_device_to_device(
    sim: &HostDriver,
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    stream: RawStream,
) -> Result<()> {
    let call = "cuMemcpyDtoDAsync";
    let (dst_map, dst) = sim.memory.range(call, dst, bytes)?;
    let (src_map, src) = sim.memory.range(call, src, bytes)?;
    sim.streams.enqueue(call, stream, || {
        Box::new(move |_: &AtomicBool| {
            // SAFETY: both ranges lie in mappings this closure keeps alive (checked); `copy` allows overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
            drop((dst_map, src_map));
        })
    })
}

pub(super) fn fill(
    sim: &HostDriver,
    dst: DevicePtr,
    value: u8,
    bytes: usize,
    stream: RawStream,
) -> Result<()> {
    let call = "cuMemsetD8Async";
    let (mapping, start) = sim.memory.range(call, dst, bytes)?;
    sim.streams.enqueue(call, stream, || {
        Box::new(move |_: &AtomicBool| {
            // SAFETY: the range lies in a mapping this closure keeps alive (checked).
            unsafe { std::ptr::write_bytes(start as *mut u8, value, bytes) };
            drop(mapping);
        })
    })
}

pub(super) fn write_u32(sim: &HostDriver, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
    let call = "cuStreamWriteValue32_v2";
    let (mapping, word) = sim.memory.word(call, ptr)?;
    sim.streams.enqueue(call, stream, || {
        Box::new(move |_: &AtomicBool| {
            // SAFETY: `word` checked the aligned word lies in the mapping this closure keeps alive.
            unsafe { &*(word as *const AtomicU32) }.store(value, Ordering::Release);
            drop(mapping);
        })
    })
}

pub(super) fn wait_u32_geq(sim: &HostDriver, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()> {
    let call = "cuStreamWaitValue32_v2";
    let (mapping, word) = sim.memory.word(call, ptr)?;
    sim.streams.enqueue(call, stream, || {
        Box::new(move |destroyed: &AtomicBool| {
            // SAFETY: as in `write_u32`.
            let word = unsafe { &*(word as *const AtomicU32) };
            poll_until(|| word.load(Ordering::Acquire) >= value, destroyed);
            drop(mapping);
        })
    })
}
