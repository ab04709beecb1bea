//! The IPC benchmark (`--bench`): a producer (the parent) and a consumer (its one child) hand buffers over
//! through IPC handles and events, for sizes from 4 KiB up to `--bench-max-bytes` (1 GiB).
//!
//! For each size the consumer measures, and prints as one row of a table:
//! - (once, first) the round trip of the shared flags alone, without CUDA;
//! - the hand-over round trip: the consumer records its event and raises `ping` in the segment; the producer
//!   waits for that event, fills the buffer, records its own event and answers with `pong`; the consumer waits
//!   for that event and copies the buffer out. Median and 10th-90th percentiles of many trips, once with the
//!   GPU waiting for the events (`cuStreamWaitEvent`) and once with the host waiting (`cuEventSynchronize`);
//! - the bandwidth of a copy from the producer's buffer through the IPC mapping into a local buffer;
//! - the same copy between two local buffers of the consumer (the limit of this path);
//! - a copy staged through pinned host memory (device to host, then host to device), the way without IPC.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::Outcome;
use crate::barrier::{self, StopCheck};
use crate::children::Children;
use crate::cli::Cli;
use crate::devices;
use crate::driver::{self, Driver};
use crate::futex;
use crate::guardian::Guardian;
use crate::host_buffer::HostBuffer;
use crate::ipc::{
    DeviceBuffer, Event, ExportedBuffer, ExportedEvent, Mechanism, OpenedBuffer, OpenedEvent, descriptors,
};
use crate::segment::{self, RunPlan, RunState, Segment};
use crate::signals;
use crate::stream::Stream;

/// The producer is process 0, the consumer process 1.
const PRODUCER: usize = 0;
const CONSUMER: usize = 1;
const SMALLEST: usize = 4 * 1024;

/// 4 KiB, 16 KiB, ... up to `max` (each size four times the last).
pub fn sizes(max: usize) -> Vec<usize> {
    std::iter::successors(Some(SMALLEST), |s| s.checked_mul(4)).take_while(|s| *s <= max).collect()
}

/// Round trips of the shared flags alone, before the table.
const FLAG_TRIPS: u32 = 2001;

/// Round trips per size: enough for a stable median, fewer for large buffers.
fn trips(size: usize) -> u32 {
    ((2usize << 30) / size).clamp(7, 201) as u32
}

/// Copies per bandwidth measurement: about 4 GiB moved, at least 3 copies.
fn copies(size: usize) -> u32 {
    ((4usize << 30) / size).clamp(3, 1000) as u32
}

/// The producer: the parent's side of `--bench`.
pub fn run_producer(cli: &Cli, mechanism: Mechanism) -> Result<Outcome> {
    let started = Instant::now();
    let name = segment::name_for(std::process::id());
    let segment = Segment::create(&name)?;
    let state = segment.state();
    let guardian = Guardian::start()?;
    let Some(cuda) = devices::load_or_waive()? else { return Ok(Outcome::Waived) };
    let driver: &dyn Driver = &*cuda;
    let chosen = devices::select(driver)?;
    let (Some(&producer), Some(&consumer)) = (chosen.first(), chosen.last()) else {
        say!("No CUDA devices support IPC")?;
        return Ok(Outcome::Waived);
    };
    let max = cli.bench_max_bytes as usize;
    state.describe_run(&RunPlan {
        devices: &[producer, consumer],
        procs_per_device: 1,
        data_size: max,
        options: 0,
        mechanism: mechanism.code(),
    });
    for device in [producer, consumer] {
        if let Some(reason) = mechanism.unsupported(driver, device)? {
            say!("No CUDA devices support IPC with --ipc {} ({reason})", mechanism.name())?;
            return Ok(Outcome::Waived);
        }
    }
    let describe = |d: i32| driver.device_info(d).map(|i| format!("device {d} ({})", i.name));
    say!(
        "IPC hand-over benchmark: producer on {}, consumer on {}",
        describe(producer)?,
        describe(consumer)?
    )?;

    // vmm and pool: each buffer's descriptor goes to the consumer over a socket of its own.
    let (socket, their_socket) = match mechanism.uses_descriptors() {
        true => descriptors::pair().map(|(ours, theirs)| (Some(ours), vec![theirs]))?,
        false => (None, Vec::new()),
    };
    let mut children = Children::spawn(
        &segment,
        CONSUMER..CONSUMER + 1,
        &["--bench"],
        &their_socket,
        started,
        cli.timeout(),
    )?;
    drop(their_socket);
    guardian.cover(children.pids())?;
    driver.use_device(producer)?;
    let stream = Stream::non_blocking(driver)?;
    let ready = ExportedEvent::create(driver, producer)?;
    state.event_handles[PRODUCER].store(ready.handle());
    let barrier = state.barrier(2);
    let stop = || -> Result<()> {
        signals::check()?;
        children.check_all_alive().context("the consumer stopped")
    };

    barrier.wait(&stop)?; // the consumer's event is in the segment
    let consumed = OpenedEvent::open(driver, &state.event_handles[CONSUMER].load())?;
    for _ in 0..FLAG_TRIPS {
        let asked = wait_for_raise(&state.bench.ping, state.bench.pong.load(Ordering::Acquire), &stop)?;
        state.bench.pong.store(asked, Ordering::Release);
        futex::wake_all(&state.bench.pong);
    }
    for size in sizes(max) {
        let buffer = ExportedBuffer::allocate(driver, mechanism, producer, size)?;
        state.mem_handles[PRODUCER].store(buffer.handle());
        if let (Some(socket), Some(fd)) = (&socket, buffer.descriptor()) {
            descriptors::send(socket, mechanism.code(), 1, &[fd])?;
        }
        state.bench.size.store(size as u64, Ordering::Relaxed);
        barrier.wait(&stop)?; // the buffer is in the segment
        for (_, order) in HANDOVERS.iter().flat_map(|&order| (0..trips(size)).map(move |t| (t, order))) {
            let asked = wait_for_raise(&state.bench.ping, state.bench.pong.load(Ordering::Acquire), &stop)?;
            match order {
                Handover::StreamOrdered => stream.wait_for(&consumed)?,
                Handover::HostOrdered => consumed.synchronize(&stop)?,
            }
            stream.fill(&buffer, asked as u8, size)?;
            stream.record(&ready)?;
            state.bench.pong.store(asked, Ordering::Release);
            futex::wake_all(&state.bench.pong);
        }
        barrier.wait(&stop)?; // the consumer has closed its mapping
        stream.synchronize(&stop)?;
    }
    children.wait(|| false, || {})?;
    Ok(Outcome::Passed)
}

/// Waits until `word` exceeds `seen`; returns its new value.
fn wait_for_raise(word: &AtomicU32, seen: u32, stop: &dyn StopCheck) -> Result<u32> {
    barrier::wait_until(word, |v| v > seen, stop)?;
    Ok(word.load(Ordering::Acquire))
}

/// `p50 (p10-p90)` of round-trip times, in microseconds.
fn percentiles(trips: &mut [Duration]) -> String {
    trips.sort();
    let at =
        |q: usize| trips.get(trips.len().saturating_sub(1) * q / 100).map_or(0.0, |d| d.as_secs_f64() * 1e6);
    format!("{:.1} ({:.1}-{:.1})", at(50), at(10), at(90))
}

/// How each side waits for the other's event in a hand-over.
#[derive(Clone, Copy)]
enum Handover {
    /// `cuStreamWaitEvent`: the GPU waits; the host only enqueues.
    StreamOrdered,
    /// `cuEventSynchronize`: the host waits for the event, then enqueues.
    HostOrdered,
}

const HANDOVERS: [Handover; 2] = [Handover::StreamOrdered, Handover::HostOrdered];

/// One row of the table.
struct Row {
    size: usize,
    /// Round trip per [`HANDOVERS`] entry.
    handover: [String; 2],
    ipc: f64,
    local: f64,
    staged: f64,
}

/// The consumer: the child's side of `--bench`.
pub fn run_consumer(index: usize, segment_fd: Option<i32>, socket_fd: Option<i32>) -> Result<()> {
    if index != CONSUMER {
        bail!("the benchmark's consumer is process {CONSUMER}, not {index}");
    }
    let (segment, parent_pid) = crate::child::attach(index, segment_fd)?;
    let state = segment.state();
    let mechanism = Mechanism::from_code(state.mechanism.load(Ordering::Relaxed))
        .context("the segment names an IPC mechanism this program does not know")?;
    let socket = match socket_fd {
        Some(fd) if mechanism.uses_descriptors() => Some(crate::inherit::take(fd, "descriptor socket")?),
        _ => None,
    };
    let stop = move || crate::child::still_running(state, parent_pid);
    let cuda = driver::load().context("starting CUDA")?;
    let driver: &dyn Driver = &*cuda;
    let device = state.device_of(CONSUMER);
    driver.use_device(device)?;
    let stream = Stream::non_blocking(driver)?;
    let consumed = ExportedEvent::create(driver, device)?;
    state.event_handles[CONSUMER].store(consumed.handle());
    let barrier = state.barrier(2);
    barrier.wait(&stop)?;
    let ready = OpenedEvent::open(driver, &state.event_handles[PRODUCER].load())?;
    let max = state.data_size();
    let mut host = HostBuffer::prepare(driver, max)?;

    let mut flag_trips = Vec::new();
    for _ in 0..FLAG_TRIPS {
        let start = Instant::now();
        let ping = state.bench.ping.fetch_add(1, Ordering::AcqRel) + 1;
        futex::wake_all(&state.bench.ping);
        barrier::wait_until(&state.bench.pong, |v| v >= ping, &stop)?;
        flag_trips.push(start.elapsed());
    }
    say!("shared-flag round trip alone, us: {}", percentiles(&mut flag_trips))?;

    say!("hand-over round trips in us, p50 (p10-p90): the GPU waits (stream) or the host waits (host)")?;
    say!(
        "{:>9}  {:>24}  {:>24}  {:>10}  {:>12}  {:>8}  {:>10}",
        "size",
        "stream-ordered",
        "host-ordered",
        "IPC GB/s",
        "local GB/s",
        "IPC %",
        "staged GB/s"
    )?;
    for size in sizes(max) {
        barrier.wait(&stop)?;
        if state.bench.size.load(Ordering::Relaxed) as usize != size {
            bail!("the producer published a buffer of another size");
        }
        let handle = state.mem_handles[PRODUCER].load();
        let descriptor = match &socket {
            Some(socket) => descriptors::receive(socket.as_fd(), mechanism.code(), 1, &stop)?.pop(),
            None => None,
        };
        let shared = OpenedBuffer::open(driver, mechanism, &handle, descriptor, size, device)?;
        let into = DeviceBuffer::allocate(driver, device, size)?;
        let local = DeviceBuffer::allocate(driver, device, size)?;
        stream.fill(&local, 1, size)?;

        // Bytes per second of `copy`, repeated `n` times after one warm-up, in GB/s.
        let rate = |n: u32, copy: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            copy()?;
            stream.synchronize(&stop)?;
            let start = Instant::now();
            for _ in 0..n {
                copy()?;
            }
            stream.synchronize(&stop)?;
            Ok(size as f64 * f64::from(n) / start.elapsed().as_secs_f64() / 1e9)
        };
        let local_rate = rate(copies(size), &mut || stream.copy(&into, &local, size))?;
        let ipc_rate = rate(copies(size), &mut || stream.copy(&into, &shared, size))?;
        let staged_rate = rate(copies(size).min(50), &mut || {
            host.copy_from(&local, size, &stream, &stop)?;
            host.copy_to(&into, size)
        })?;

        let mut handover = HANDOVERS.map(|_| String::new());
        for (column, order) in handover.iter_mut().zip(HANDOVERS) {
            let mut round_trips = Vec::new();
            for _ in 0..trips(size) {
                let start = Instant::now();
                stream.record(&consumed)?;
                let ping = state.bench.ping.fetch_add(1, Ordering::AcqRel) + 1;
                futex::wake_all(&state.bench.ping);
                barrier::wait_until(&state.bench.pong, |v| v >= ping, &stop)?;
                match order {
                    Handover::StreamOrdered => stream.wait_for(&ready)?,
                    Handover::HostOrdered => ready.synchronize(&stop)?,
                }
                stream.copy(&into, &shared, size)?;
                stream.synchronize(&stop)?;
                round_trips.push(start.elapsed());
            }
            *column = percentiles(&mut round_trips);
        }
        print_row(&Row { size, handover, ipc: ipc_rate, local: local_rate, staged: staged_rate })?;
        drop((shared, into, local));
        barrier.wait(&stop)?;
    }
    if state.run_state() == RunState::Aborted {
        bail!("the run was aborted");
    }
    Ok(())
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 30 => format!("{} GiB", s >> 30),
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s => format!("{} KiB", s >> 10),
    }
}

fn print_row(row: &Row) -> Result<()> {
    say!(
        "{:>9}  {:>24}  {:>24}  {:>10.1}  {:>12.1}  {:>7.1}%  {:>10.1}",
        human(row.size),
        row.handover[0],
        row.handover[1],
        row.ipc,
        row.local,
        100.0 * row.ipc / row.local,
        row.staged
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_go_from_4_kib_to_the_maximum_by_fours() {
        assert_eq!(sizes(64 * 1024), vec![4096, 16384, 65536]);
        assert_eq!(sizes(1 << 30).len(), 10);
        assert_eq!(sizes(1 << 30).last(), Some(&(1 << 30)));
        assert!(sizes(1000).is_empty());
        assert!(trips(4096) > trips(1 << 30) && trips(1 << 30) >= 7);
    }
}
