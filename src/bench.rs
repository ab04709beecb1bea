//! The IPC benchmark (`--bench`): for every (producer GPU, consumer GPU) pair of the chosen devices, a
//! producer process (the child) exports buffers by the chosen mechanism and answers hand-overs, and the
//! consumer (the parent) measures:
//! - hand-over round trips, as median and 10th to 90th percentiles: signal only (no GPU work between) and
//!   with work (a small fill on each side), by interprocess events (the GPU waits, or the host waits) and by
//!   stream memory operations on flags in IPC-mapped memory (the host syncs each round, or both sides are
//!   queued ahead and only the GPUs wait);
//! - for each size from 4 KiB to `--bench-max-bytes`, the copy rate through the IPC mapping beside the
//!   limit of that path: an in-process peer copy between the same two GPUs, or a local copy where the pair
//!   is one GPU. Sizes that fit in the L2 cache are marked: their rates are the cache's, not memory's.
//!
//! The header of each pair says whether the two processes share a GPU and whether MPS may serve them, and
//! why that changes the figures. `--json FILE` writes every figure as one document, in the manner of
//! nvbandwidth's.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::Outcome;
use crate::barrier::{self, StopCheck};
use crate::children::Children;
use crate::cli::Cli;
use crate::devices;
use crate::driver::{self, Driver};
use crate::fault::{self, Who};
use crate::futex;
use crate::guardian::Guardian;
use crate::ipc::diagnose::Exporter;
use crate::ipc::{
    DeviceBuffer, Event, ExportedBuffer, ExportedEvent, Mechanism, OpenedBuffer, OpenedEvent, Slice,
    descriptors,
};
use crate::output::JsonFile;
use crate::phase::Phase;
use crate::segment::{self, RunPlan, Segment, SharedState};
use crate::signals;
use crate::stream::Stream;
use crate::timings::Stopwatch;

/// The consumer is process 0 (the parent), the producer process 1 (its child).
const CONSUMER: usize = 0;
const PRODUCER: usize = 1;
/// The segment's buffer slots: the producer's data buffer of the current size, and its flags.
const DATA_SLOT: usize = 0;
const FLAGS_SLOT: usize = 1;
/// The flags' buffer: the consumer's flag at its start, the producer's one cache line further.
const FLAGS_BYTES: usize = 4096;
const PRODUCER_FLAG: usize = 128;
/// The work of a hand-over "with work": a fill of this many bytes on each side.
const WORK_BYTES: usize = 4096;
const SMALLEST: usize = 4 * 1024;

/// 4 KiB, 16 KiB, ... up to `max` (each size four times the last).
pub fn sizes(max: usize) -> Vec<usize> {
    std::iter::successors(Some(SMALLEST), |s| s.checked_mul(4)).take_while(|s| *s <= max).collect()
}

/// Copies per bandwidth measurement: about 4 GiB moved, at least 3 copies.
fn copies(size: usize) -> u32 {
    ((4usize << 30) / size).clamp(3, 1000) as u32
}

/// The hand-overs measured, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Events, no work: each side's stream waits for the other's event (`cuStreamWaitEvent`).
    EventsGpuWaits,
    /// Events, no work: each side's host waits for the other's event (`cuEventSynchronize`).
    EventsHostWaits,
    /// Events, a fill on each side, the GPU waits.
    EventsWithWork,
    /// Stream memory operations, no work; the consumer's host syncs each round.
    MemopsHostSynced,
    /// Stream memory operations, no work; all rounds queued ahead on both sides: the mean of a round.
    MemopsQueued,
    /// Stream memory operations, a fill on each side; the host syncs each round.
    MemopsWithWork,
}

impl Handover {
    const ALL: [Handover; 6] = [
        Handover::EventsGpuWaits,
        Handover::EventsHostWaits,
        Handover::EventsWithWork,
        Handover::MemopsHostSynced,
        Handover::MemopsQueued,
        Handover::MemopsWithWork,
    ];

    fn name(self) -> &'static str {
        match self {
            Handover::EventsGpuWaits => "events, signal only, GPU waits",
            Handover::EventsHostWaits => "events, signal only, host waits",
            Handover::EventsWithWork => "events, a fill on each side",
            Handover::MemopsHostSynced => "stream memops, signal only, host syncs each round",
            Handover::MemopsQueued => "stream memops, signal only, queued ahead (mean)",
            Handover::MemopsWithWork => "stream memops, a fill on each side",
        }
    }

    fn memops(self) -> bool {
        matches!(self, Handover::MemopsHostSynced | Handover::MemopsQueued | Handover::MemopsWithWork)
    }

    fn work(self) -> bool {
        matches!(self, Handover::EventsWithWork | Handover::MemopsWithWork)
    }
}

/// How the hand-over flags are shared: by the benchmark's mechanism, except that stream memory operations
/// refuse pool memory (`CUDA_ERROR_INVALID_VALUE` on driver 580), so pool's flags are plain device memory
/// shared by legacy IPC.
fn flags_mechanism(mechanism: Mechanism) -> Mechanism {
    if mechanism == Mechanism::Pool { Mechanism::Legacy } else { mechanism }
}

/// Round trips per hand-over kind.
fn rounds(simulated: bool) -> u32 {
    if simulated { 20 } else { 500 }
}

/// `p50 (p10-p90)` of round trips, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub p50: f64,
    pub p10: f64,
    pub p90: f64,
}

impl Spread {
    pub fn of(trips: &mut [Duration]) -> Self {
        trips.sort();
        let at = |q: usize| {
            trips.get(trips.len().saturating_sub(1) * q / 100).map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        Self { p50: at(50), p10: at(10), p90: at(90) }
    }
}

/// One line of the results, and of the JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum Figures {
    Handover(Spread),
    Copy { bytes: usize, ipc: f64, reference: f64, reference_name: &'static str, in_l2: bool },
    Waived(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct TestResult {
    pub name: String,
    pub producer: i32,
    pub consumer: i32,
    pub figures: Figures,
}

/// What the two sides of a pair share to hand over.
struct Pair<'a, 'd> {
    stream: &'a Stream<'d>,
    mine: &'a ExportedEvent<'d>,
    theirs: &'a OpenedEvent<'d>,
    my_flag: Slice<'a>,
    their_flag: Slice<'a>,
    work: &'a DeviceBuffer<'d>,
}

/// The consumer: the parent's side of `--bench`; it measures, prints and writes the JSON.
pub fn run_consumer(cli: &Cli, mechanism: Mechanism) -> Result<Outcome> {
    let started = Instant::now();
    fault::validate_for(&fault::Targets {
        children: PRODUCER..PRODUCER + 1,
        parent: &[],
        child: Phase::BENCH_PRODUCER,
        parent_sends_descriptors: false,
    })?;
    let json = cli.json.as_deref().map(JsonFile::create).transpose()?;
    let segment = Segment::create(&segment::name_for(std::process::id()))?;
    let state = segment.state();
    let guardian = Guardian::start()?;
    let Some(cuda) = devices::load_or_waive()? else { return Ok(Outcome::Waived) };
    let driver: &dyn Driver = &*cuda;
    let chosen = devices::select(driver)?;
    if chosen.is_empty() {
        waive!("No CUDA devices support IPC")?;
        return Ok(Outcome::Waived);
    }
    // The in-process peer copies need it.
    devices::enable_peers(driver, &chosen)?;
    for &device in &chosen {
        if let Some(reason) = mechanism.unsupported(driver, device)? {
            waive!("No CUDA devices support IPC with --ipc {} ({reason})", mechanism.name())?;
            return Ok(Outcome::Waived);
        }
    }
    let memops_missing =
        chosen.iter().find_map(|&d| driver.stream_memops_unsupported(d).transpose()).transpose()?;
    let pairs: Vec<(i32, i32)> = chosen.iter().flat_map(|&p| chosen.iter().map(move |&c| (p, c))).collect();
    let max = cli.bench_max_bytes as usize;
    state.describe_run(&RunPlan {
        devices: &[chosen[0], chosen[0]],
        procs_per_device: 1,
        data_size: max,
        options: if memops_missing.is_none() { segment::OPTION_SYNC_MEMOPS } else { 0 },
        mechanism: mechanism.code(),
    });
    state.bench.pairs.store(pairs.len() as u32, Ordering::Relaxed);
    let mps = mps_note();
    say!(
        "IPC benchmark, {} IPC, {} pair(s) of (producer, consumer) GPUs; {mps}",
        mechanism.name(),
        pairs.len()
    )?;

    // vmm and pool: the producer sends each buffer's descriptor over a socket.
    let (socket, their_socket) = match mechanism.uses_descriptors() {
        true => descriptors::pair().map(|(ours, theirs)| (Some(ours), vec![theirs]))?,
        false => (None, Vec::new()),
    };
    let mut children = Children::spawn(
        &segment,
        PRODUCER..PRODUCER + 1,
        &["--bench"],
        &their_socket,
        started,
        cli.timeout(),
    )?;
    drop(their_socket);
    let stop = || -> Result<()> {
        signals::check()?;
        children.check_all_alive().context("the producer stopped")
    };
    let receive = |stop: &dyn StopCheck| -> Result<Option<OwnedFd>> {
        match &socket {
            Some(socket) => Ok(descriptors::receive(socket.as_fd(), mechanism.code(), 1, stop)?.pop()),
            None => Ok(None),
        }
    };

    let barrier = state.barrier(2);
    let mut results = Vec::new();
    for (pair, &(producer, consumer)) in pairs.iter().enumerate() {
        state.bench.producer_device.store(producer as u32, Ordering::Relaxed);
        barrier.wait(&stop)?; // the pair is announced
        driver.use_device(consumer)?;
        let stream = Stream::non_blocking(driver)?;
        let mine = ExportedEvent::create(driver, consumer)?;
        state.publish_event(CONSUMER, mine.handle(), mine.file());
        guardian.cover(mine.file().map(std::slice::from_ref).unwrap_or_default());
        let work = DeviceBuffer::allocate(driver, consumer, WORK_BYTES)?;
        barrier.wait(&stop)?; // both events and the producer's flags are published
        // The producer's event file is covered too: the guardian outlives both.
        let producer_event = Exporter { pid: None, file: state.event_file(PRODUCER) };
        guardian.cover(producer_event.file.as_slice());
        let theirs = OpenedEvent::open(driver, &state.event_handles[PRODUCER].load(), &producer_event)?;
        let flags_by = flags_mechanism(mechanism);
        let descriptor = if flags_by.uses_descriptors() { receive(&stop)? } else { None };
        let flags = OpenedBuffer::open(
            driver,
            flags_by,
            &state.mem_handles[FLAGS_SLOT].load(),
            descriptor,
            FLAGS_BYTES,
            consumer,
            &Exporter::default(),
        )?;
        let side = Pair {
            stream: &stream,
            mine: &mine,
            theirs: &theirs,
            my_flag: Slice::of(&flags, 0, 4)?,
            their_flag: Slice::of(&flags, PRODUCER_FLAG, 4)?,
            work: &work,
        };
        print_pair_header(driver, producer, consumer, &mps, pair)?;
        let simulated = driver.simulated();
        let mut memops_done = 0;
        for handover in Handover::ALL {
            let figures = match (&memops_missing, handover.memops()) {
                (Some(reason), true) => Figures::Waived(reason.clone()),
                _ => {
                    barrier.wait(&stop)?;
                    let spread = measure(handover, &side, state, rounds(simulated), &mut memops_done, &stop)?;
                    Figures::Handover(spread)
                }
            };
            say!("  {:<52} {}", handover.name(), figure_text(&figures))?;
            results.push(TestResult { name: handover.name().into(), producer, consumer, figures });
        }
        barrier.wait(&stop)?; // the hand-overs are done
        let l2 = driver.device_info(consumer)?.l2_cache_bytes;
        say!(
            "  {:>9}  {:>10}  {:>22}  {:>7}",
            "size",
            "IPC GB/s",
            if producer == consumer { "local copy GB/s" } else { "in-process peer GB/s" },
            "IPC %"
        )?;
        for size in sizes(max) {
            driver.use_device(consumer)?;
            barrier.wait(&stop)?; // the producer's buffer of this size is published
            let shared = OpenedBuffer::open(
                driver,
                mechanism,
                &state.mem_handles[DATA_SLOT].load(),
                receive(&stop)?,
                size,
                consumer,
                &Exporter::default(),
            )?;
            let figures = copy_rates(driver, &stream, &shared, producer, consumer, size, l2, &stop)?;
            drop(shared);
            barrier.wait(&stop)?; // the consumer's mapping is closed
            if let Figures::Copy { ipc, reference, in_l2, .. } = &figures {
                say!(
                    "  {:>9}{} {:>10.1}  {:>22.1}  {:>6.1}%",
                    human(size),
                    if *in_l2 { "*" } else { " " },
                    ipc,
                    reference,
                    100.0 * ipc / reference
                )?;
            }
            results.push(TestResult { name: "copy".into(), producer, consumer, figures });
        }
        say!(
            "  * fits in device {consumer}'s L2 cache ({}): a rate of the cache, not of memory",
            human(l2 as usize)
        )?;
        drop(flags);
        barrier.wait(&stop)?; // the consumer has closed the flags: the producer may free them
    }
    children.wait(|| false, || {})?;
    if let Some(json) = json {
        json.write(&json_document(driver, &chosen, mechanism, &mps, &results)?)?;
    }
    Ok(Outcome::Passed)
}

/// Round trips of one kind of hand-over, measured by the consumer; the producer does its part in
/// [`answer`]. Host flags (`ping`, `pong`) say when the other side has enqueued its part.
fn measure(
    handover: Handover,
    side: &Pair,
    state: &SharedState,
    rounds: u32,
    memops_done: &mut u32,
    stop: &dyn StopCheck,
) -> Result<Spread> {
    let stream = side.stream;
    let mut trips = Vec::with_capacity(rounds as usize);
    if handover == Handover::MemopsQueued {
        // Every round queued at once on both sides; the mean includes the hosts' enqueueing. (Holding the
        // chain on a flag and releasing it from a second stream deadlocks: with one hardware queue per
        // context, the release waits behind the held wait.)
        let base = *memops_done;
        let start = Instant::now();
        for k in base + 1..=base + rounds {
            stream.write_flag(&side.my_flag, k)?;
            stream.wait_flag(&side.their_flag, k)?;
        }
        stream.synchronize(stop)?;
        *memops_done += rounds;
        let mean = start.elapsed() / rounds;
        return Ok(Spread { p50: mean.as_secs_f64() * 1e6, p10: f64::NAN, p90: f64::NAN });
    }
    for _ in 0..rounds {
        let start = Instant::now();
        if handover.work() {
            stream.fill(side.work, 1, WORK_BYTES)?;
        }
        if handover.memops() {
            *memops_done += 1;
            stream.write_flag(&side.my_flag, *memops_done)?;
            stream.wait_flag(&side.their_flag, *memops_done)?;
            stream.synchronize(stop)?;
        } else {
            stream.record(side.mine)?;
            let ping = state.bench.ping.fetch_add(1, Ordering::AcqRel) + 1;
            futex::wake_all(&state.bench.ping);
            barrier::wait_until(&state.bench.pong, |v| v >= ping, stop)?;
            match handover {
                Handover::EventsHostWaits => side.theirs.synchronize(stop)?,
                _ => {
                    stream.wait_for(side.theirs)?;
                    stream.synchronize(stop)?;
                }
            }
        }
        trips.push(start.elapsed());
    }
    Ok(Spread::of(&mut trips))
}

/// The producer's part of a hand-over kind: the mirror of [`measure`].
fn answer(
    handover: Handover,
    side: &Pair,
    state: &SharedState,
    rounds: u32,
    memops_done: &mut u32,
    stop: &dyn StopCheck,
) -> Result<()> {
    let stream = side.stream;
    if handover.memops() {
        // Everything queued ahead: the GPU waits for each of the consumer's writes, and answers.
        for _ in 0..rounds {
            *memops_done += 1;
            stream.wait_flag(&side.their_flag, *memops_done)?;
            if handover.work() {
                stream.fill(side.work, 2, WORK_BYTES)?;
            }
            stream.write_flag(&side.my_flag, *memops_done)?;
        }
        return stream.synchronize(stop);
    }
    for _ in 0..rounds {
        let asked = wait_for_raise(&state.bench.ping, state.bench.pong.load(Ordering::Acquire), stop)?;
        match handover {
            Handover::EventsHostWaits => side.theirs.synchronize(stop)?,
            _ => stream.wait_for(side.theirs)?,
        }
        if handover.work() {
            stream.fill(side.work, 2, WORK_BYTES)?;
        }
        stream.record(side.mine)?;
        state.bench.pong.store(asked, Ordering::Release);
        futex::wake_all(&state.bench.pong);
    }
    stream.synchronize(stop)
}

/// Waits until `word` exceeds `seen`; returns its new value.
fn wait_for_raise(word: &AtomicU32, seen: u32, stop: &dyn StopCheck) -> Result<u32> {
    barrier::wait_until(word, |v| v > seen, stop)?;
    Ok(word.load(Ordering::Acquire))
}

/// The copy rate through the IPC mapping, and the limit of that path: an in-process peer copy from a buffer
/// of this process on the producer's GPU, or a local copy where the pair is one GPU.
#[allow(clippy::too_many_arguments)]
fn copy_rates(
    driver: &dyn Driver,
    stream: &Stream,
    shared: &OpenedBuffer,
    producer: i32,
    consumer: i32,
    size: usize,
    l2: u64,
    stop: &dyn StopCheck,
) -> Result<Figures> {
    let source = DeviceBuffer::allocate(driver, producer, size)?;
    driver.use_device(consumer)?;
    let into = DeviceBuffer::allocate(driver, consumer, size)?;
    stream.fill(&into, 0, size)?;
    // Bytes per second of `copy`, repeated after one warm-up, in GB/s.
    let rate = |copy: &dyn Fn() -> Result<()>| -> Result<f64> {
        copy()?;
        stream.synchronize(stop)?;
        let n = copies(size);
        let start = Instant::now();
        for _ in 0..n {
            copy()?;
        }
        stream.synchronize(stop)?;
        Ok(size as f64 * f64::from(n) / start.elapsed().as_secs_f64() / 1e9)
    };
    let ipc = rate(&|| stream.copy(&into, shared, size))?;
    let reference = rate(&|| stream.copy(&into, &source, size))?;
    let reference_name = if producer == consumer { "local copy" } else { "in-process peer copy" };
    Ok(Figures::Copy { bytes: size, ipc, reference, reference_name, in_l2: size as u64 <= l2 })
}

/// The producer: the child's side of `--bench`.
pub fn run_producer(index: usize, segment_fd: Option<i32>, socket_fd: Option<i32>) -> Result<()> {
    if index != PRODUCER {
        bail!("the benchmark's producer is process {PRODUCER}, not {index}");
    }
    let watch = Stopwatch::start(Who::Child(index), Phase::Attach)?;
    let (segment, parent_pid) = crate::attach::segment(index, segment_fd)?;
    let state = segment.state();
    let mut watch = watch.report_to(&state.progress[index]);
    let mechanism = Mechanism::from_code(state.mechanism.load(Ordering::Relaxed))
        .context("the segment names an IPC mechanism this program does not know")?;
    let memops = state.options.load(Ordering::Relaxed) & segment::OPTION_SYNC_MEMOPS != 0;
    let socket = match socket_fd {
        Some(fd) if mechanism.uses_descriptors() => Some(crate::inherit::take(fd, "descriptor socket")?),
        _ => None,
    };
    let send = |buffer: &ExportedBuffer| -> Result<()> {
        if let (Some(socket), Some(fd)) = (&socket, buffer.descriptor()) {
            descriptors::send(socket, mechanism.code(), 1, &[fd])?;
        }
        Ok(())
    };
    let stop = move || crate::attach::still_running(state, parent_pid);
    watch.enter(Phase::CudaStart)?;
    let cuda = driver::load().context("starting CUDA")?;
    let driver: &dyn Driver = &*cuda;
    let barrier = state.barrier(2);
    let rounds = rounds(driver.simulated());
    watch.enter(Phase::RoundRobin)?;
    for _ in 0..state.bench.pairs.load(Ordering::Relaxed) {
        barrier.wait(&stop)?; // the pair is announced
        let device = state.bench.producer_device.load(Ordering::Relaxed) as i32;
        driver.use_device(device)?;
        let stream = Stream::non_blocking(driver)?;
        let mine = ExportedEvent::create(driver, device)?;
        state.publish_event(PRODUCER, mine.handle(), mine.file());
        let work = DeviceBuffer::allocate(driver, device, WORK_BYTES)?;
        let flags = ExportedBuffer::allocate(driver, flags_mechanism(mechanism), device, FLAGS_BYTES)?;
        stream.fill(&flags, 0, FLAGS_BYTES)?;
        stream.synchronize(&stop)?;
        state.mem_handles[FLAGS_SLOT].store(flags.handle());
        send(&flags)?; // nothing to send for legacy flags
        barrier.wait(&stop)?; // both events and the flags are published
        let consumer_event = Exporter {
            pid: Some(state.parent_pid.load(Ordering::Relaxed)),
            file: state.event_file(CONSUMER),
        };
        let theirs = OpenedEvent::open(driver, &state.event_handles[CONSUMER].load(), &consumer_event)?;
        let side = Pair {
            stream: &stream,
            mine: &mine,
            theirs: &theirs,
            my_flag: Slice::of(&flags, PRODUCER_FLAG, 4)?,
            their_flag: Slice::of(&flags, 0, 4)?,
            work: &work,
        };
        let mut memops_done = 0;
        for handover in Handover::ALL.into_iter().filter(|h| memops || !h.memops()) {
            barrier.wait(&stop)?;
            answer(handover, &side, state, rounds, &mut memops_done, &stop)?;
        }
        barrier.wait(&stop)?; // the hand-overs are done
        for size in sizes(state.data_size()) {
            let buffer = ExportedBuffer::allocate(driver, mechanism, device, size)?;
            stream.fill(&buffer, 7, size)?;
            stream.synchronize(&stop)?;
            state.mem_handles[DATA_SLOT].store(buffer.handle());
            send(&buffer)?;
            barrier.wait(&stop)?; // published
            barrier.wait(&stop)?; // the consumer has closed its mapping
        }
        barrier.wait(&stop)?; // the consumer has closed the flags
    }
    Ok(())
}

/// Whether an MPS control daemon is there to serve the processes (its pipe directory), in words.
fn mps_note() -> String {
    mps_note_for(&std::env::var("CUDA_MPS_PIPE_DIRECTORY").unwrap_or_else(|_| "/tmp/nvidia-mps".into()))
}

/// [`mps_note`] for the pipe directory `dir`.
fn mps_note_for(dir: &str) -> String {
    if std::path::Path::new(dir).join("control").exists() {
        format!("MPS: a control daemon listens at {dir}")
    } else {
        format!("MPS: no control daemon at {dir}")
    }
}

fn print_pair_header(
    driver: &dyn Driver,
    producer: i32,
    consumer: i32,
    mps: &str,
    pair: usize,
) -> Result<()> {
    let name = |d: i32| driver.device_info(d).map(|i| i.name);
    let same = producer == consumer;
    say!(
        "== pair {pair}: producer on device {producer} ({}), consumer on device {consumer} ({}): {}",
        name(producer)?,
        name(consumer)?,
        if same { "one GPU" } else { "two GPUs" }
    )?;
    let why = match (same, mps.contains("listens")) {
        (true, false) => {
            "one GPU without MPS: a hand-over of GPU work between two processes waits for a time-slice \
             context switch (about 140 us each way); signals alone do not"
        }
        (true, true) => {
            "one GPU, and if both processes are MPS clients they share its hardware queues: no context \
             switch separates their work"
        }
        (false, _) => {
            "two GPUs: each side's work runs on its own GPU; a hand-over costs the signal's trip between them"
        }
    };
    say!("   why the figures are what they are: {why}")?;
    say!("   hand-over round trips in us, p50 (p10-p90):")
}

fn figure_text(figures: &Figures) -> String {
    match figures {
        Figures::Handover(s) if s.p10.is_nan() => format!("{:.1} (mean)", s.p50),
        Figures::Handover(s) => format!("{:.1} ({:.1}-{:.1})", s.p50, s.p10, s.p90),
        Figures::Waived(reason) => format!("waived: {reason}"),
        Figures::Copy { ipc, .. } => format!("{ipc:.1} GB/s"),
    }
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 30 => format!("{} GiB", s >> 30),
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s => format!("{} KiB", s >> 10),
    }
}

fn json_number(x: f64) -> String {
    if x.is_finite() { format!("{x:.3}") } else { "null".into() }
}

/// Every figure as one JSON document, in the manner of nvbandwidth's: the devices, the driver, and for each
/// test its name, the pair, its status (Passed or Waived) and its figures.
pub fn json_document(
    driver: &dyn Driver,
    devices: &[i32],
    mechanism: Mechanism,
    mps: &str,
    results: &[TestResult],
) -> Result<String> {
    let mut listed = Vec::new();
    for &d in devices {
        let info = driver.device_info(d)?;
        listed.push(format!(
            "{{\"index\": {d}, \"name\": \"{}\", \"l2_cache_bytes\": {}}}",
            info.name.replace('"', "'"),
            info.l2_cache_bytes
        ));
    }
    let tests: Vec<String> = results
        .iter()
        .map(|r| {
            let (status, figures) = match &r.figures {
                Figures::Handover(s) => (
                    "Passed",
                    format!(
                        "\"unit\": \"us\", \"p50\": {}, \"p10\": {}, \"p90\": {}",
                        json_number(s.p50),
                        json_number(s.p10),
                        json_number(s.p90)
                    ),
                ),
                Figures::Copy { bytes, ipc, reference, reference_name, in_l2 } => (
                    "Passed",
                    format!(
                        "\"unit\": \"GB/s\", \"bytes\": {bytes}, \"ipc\": {}, \"reference\": {}, \
                         \"reference_name\": \"{reference_name}\", \"ipc_percent\": {}, \"fits_in_l2\": {in_l2}",
                        json_number(*ipc),
                        json_number(*reference),
                        json_number(100.0 * ipc / reference)
                    ),
                ),
                Figures::Waived(reason) => ("Waived", format!("\"reason\": \"{}\"", reason.replace('"', "'"))),
            };
            format!(
                "{{\"name\": \"{}\", \"producer\": {}, \"consumer\": {}, \"status\": \"{status}\", {figures}}}",
                r.name, r.producer, r.consumer
            )
        })
        .collect();
    Ok(format!(
        "{{\"simple_ipc_bench\": {{\"driver_version\": {}, \"simulated\": {}, \"mechanism\": \"{}\", \"mps\": \"{}\", \
         \"devices\": [{}], \"testcases\": [{}]}}}}\n",
        driver.version()?,
        driver.simulated(),
        mechanism.name(),
        mps,
        listed.join(", "),
        tests.join(", ")
    ))
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
        assert!(copies(4096) > copies(1 << 30) && copies(1 << 30) >= 3);
    }

    #[test]
    fn the_hand_over_kinds_say_what_they_measure() {
        let with_work: Vec<Handover> = Handover::ALL.into_iter().filter(|h| h.work()).collect();
        assert_eq!(with_work, [Handover::EventsWithWork, Handover::MemopsWithWork]);
        let memops: Vec<Handover> = Handover::ALL.into_iter().filter(|h| h.memops()).collect();
        assert_eq!(memops, [Handover::MemopsHostSynced, Handover::MemopsQueued, Handover::MemopsWithWork]);
        assert!(Handover::ALL.iter().all(|h| h.name().contains(if h.memops() {
            "memops"
        } else {
            "events"
        })));
        assert!(rounds(true) >= 10 && rounds(false) >= 100, "enough rounds for percentiles");
    }

    #[test]
    fn sizes_read_as_people_write_them_and_mps_is_found_by_its_control_pipe() {
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(1 << 30), "1 GiB");
        let dir = std::env::temp_dir().join(format!("simple-ipc-mps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shown = dir.to_string_lossy().into_owned();
        assert_eq!(mps_note_for(&shown), format!("MPS: no control daemon at {shown}"));
        std::fs::write(dir.join("control"), b"").unwrap();
        assert_eq!(mps_note_for(&shown), format!("MPS: a control daemon listens at {shown}"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn spreads_are_percentiles_of_the_sorted_trips() {
        let mut trips: Vec<Duration> = (1..=11).rev().map(Duration::from_micros).collect();
        let spread = Spread::of(&mut trips);
        assert_eq!((spread.p50, spread.p10, spread.p90), (6.0, 2.0, 10.0));
        assert_eq!(figure_text(&Figures::Handover(spread)), "6.0 (2.0-10.0)");
        let mean = Spread { p50: 4.25, p10: f64::NAN, p90: f64::NAN };
        assert_eq!(figure_text(&Figures::Handover(mean)), "4.2 (mean)");
        assert_eq!(json_number(f64::NAN), "null");
    }
}
