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
//! why that changes the figures. `--json FILE` has every figure, per pair and test (see `report`).
//!
//! This file holds the two sides' stories, [`run_consumer`] and [`run_producer`], each in the order of the
//! [`rendezvous::Step`]s at which they meet; [`handover`] and [`copy`] measure, [`report`] says.

pub mod copy;
pub mod handover;
pub mod rendezvous;
pub mod report;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use self::copy::{Reference, copy_rates, sizes};
use self::handover::{FLAGS_BYTES, Handover, Pair, WORK_BYTES, answer, flags_mechanism, measure, rounds};
use self::rendezvous::{Rendezvous, Side, Step};
use self::report::{Figures, TestResult, mps_note};
use crate::devices;
use crate::driver::{self, Driver};
use crate::gpu::Stream;
use crate::ipc::diagnose::Exporter;
use crate::ipc::{DeviceBuffer, ExportedBuffer, ExportedEvent, Mechanism, OpenedBuffer, OpenedEvent};
use crate::joiners::{Joiners, JoinersAtEnd};
use crate::os::signals;
use crate::outcome::{Outcome, Waiver};
use crate::output::progress;
use crate::phases::Phase;
use crate::phases::Who;
use crate::phases::fault;
use crate::phases::timings::Stopwatch;
use crate::report::document::BenchResults;
use crate::report::{Findings, Results, RoleEnd};
use crate::role::Bench;
use crate::sample::attach;
use crate::sample::children::Children;
use crate::segment::barrier::StopCheck;
use crate::segment::{self, RunPlan};
use crate::setup;
use crate::wire::descriptors;

/// The consumer is process 0 (the parent), the producer process 1 (its child).
const CONSUMER: usize = 0;
const PRODUCER: usize = 1;
/// The segment's buffer slots: the producer's data buffer of the current size, and its flags.
const DATA_SLOT: usize = 0;
const FLAGS_SLOT: usize = 1;

/// The consumer: the parent's side of `--bench`; it measures, prints and writes the JSON.
pub fn run_consumer(bench: &Bench, mechanism: Mechanism) -> Result<RoleEnd> {
    // Served, the producer is told how the whole benchmark ended: its verdict is the run's.
    let joiners_at_end = JoinersAtEnd::default();
    let mut findings = Findings::default();
    let outcome = consume(bench, mechanism, &joiners_at_end, &mut findings).unwrap_or_else(Outcome::Failed);
    joiners_at_end.hand_over(&mut findings);
    let notify_waiters =
        crate::report::NotifyWaiters(Box::new(move |ended: &Outcome| joiners_at_end.tell(ended)));
    Ok(RoleEnd { outcome, findings, notify_waiters: Some(notify_waiters) })
}

/// `findings`: what the benchmark found, for the document, however it ends.
fn consume(
    bench: &Bench,
    mechanism: Mechanism,
    joiners_at_end: &JoinersAtEnd,
    findings: &mut Findings,
) -> Result<Outcome> {
    let started = Instant::now();
    fault::validate_for(&fault::Targets {
        children: PRODUCER..PRODUCER + 1,
        parent: &[],
        child: Phase::BENCH_PRODUCER,
        parent_sends_descriptors: false,
        parent_checks_buffers: false,
    })?;
    let setup = match setup::start(|| Ok(()), findings)? {
        Ok(setup) => setup,
        Err(waiver) => return Ok(waiver.into()),
    };
    let (state, guardian, chosen) = (setup.segment.state(), &setup.guardian, &setup.chosen);
    let driver: &dyn Driver = &*setup.cuda;
    // The in-process peer copies need it.
    devices::enable_peers(driver, chosen)?;
    for &device in chosen {
        if let Some(reason) = mechanism.unsupported(driver, device)? {
            let why = format!("No CUDA devices support IPC with --ipc {} ({reason})", mechanism.name());
            return Ok(Waiver(why).into());
        }
    }
    let memops_missing =
        chosen.iter().find_map(|&d| driver.stream_memops_unsupported(d).transpose()).transpose()?;
    let pairs: Vec<(i32, i32)> = chosen.iter().flat_map(|&p| chosen.iter().map(move |&c| (p, c))).collect();
    let max = bench.max_bytes as usize;
    let first_uuid = driver.device_info(chosen[0])?.uuid;
    state.describe_run(&RunPlan {
        uuids: &[first_uuid, first_uuid],
        devices: &[chosen[0], chosen[0]],
        procs_per_device: 1,
        data_size: max,
        options: segment::OPTION_BENCH
            | if memops_missing.is_none() { segment::OPTION_SYNC_MEMOPS } else { 0 },
        mechanism: mechanism.code(),
    });
    state.bench.pairs.store(pairs.len() as u32, Ordering::Relaxed);
    let mps_enabled = chosen.iter().try_fold(false, |any, &device| {
        anyhow::Ok(any || driver.supports(device, crate::driver::Capability::MpsEnabled)?)
    })?;
    let mps = mps_note(mps_enabled);
    print_line!(
        "IPC benchmark, {} IPC, {} pair(s) of (producer, consumer) GPUs; {mps}",
        mechanism.name(),
        pairs.len()
    )?;

    // vmm and pool: the producer sends each buffer's descriptor over a socket.
    let (socket, their_socket) = match mechanism.uses_descriptors() {
        true => descriptors::pair().map(|(ours, theirs)| (Some(ours), vec![theirs]))?,
        false => (None, Vec::new()),
    };
    // The producer: this program's child, or, with --serve, the process that joins at the socket.
    let producer = match &bench.serve {
        None => Producer::Child(Children::spawn(
            &setup.segment,
            PRODUCER..PRODUCER + 1,
            true,
            bench.quiet,
            &their_socket,
            started,
            bench.timeout,
        )?),
        Some(address) => {
            let joiners =
                Joiners::listen(&setup.segment, address.clone(), 2, their_socket, started, bench.timeout)?
                    .covered_by(&setup.guardian)
                    .starting_at_index(PRODUCER)
                    .handing_placement_and_connections_to(joiners_at_end);
            print_line!(
                "Serving the benchmark at {address}: waiting for its producer to join (--join {address})"
            )?;
            Producer::Joined(std::cell::RefCell::new(joiners))
        }
    };
    let stop = || -> Result<()> {
        signals::check()?;
        producer.check().context("the producer stopped")
    };
    let receive = |stop: &dyn StopCheck| -> Result<Option<OwnedFd>> {
        match &socket {
            Some(socket) => Ok(descriptors::receive(socket.as_fd(), mechanism.code(), 1, stop)?.pop()),
            None => Ok(None),
        }
    };

    let mut rendezvous = Rendezvous::on(state, Side::Consumer);
    let mut results = Vec::new();
    // Each pair's hand-overs and sizes, on a terminal's standard error; started once the producer has
    // attached (and said so), so that its line does not cross the bar.
    let steps = pairs.len() * (Handover::ALL.len() + sizes(max).len());
    let mut bar = None;
    for (pair, &(producer, consumer)) in pairs.iter().enumerate() {
        state.bench.producer_device.store(producer as u32, Ordering::Relaxed);
        // By UUID too: a producer that joined from another container may number the GPUs otherwise.
        state.place(PRODUCER, producer, &driver.device_info(producer)?.uuid);
        rendezvous.meet(Step::PairAnnounced, &stop)?;
        let bar = bar.get_or_insert_with(|| progress::Bar::start(steps as u64, "--bench", bench.quiet));
        let doing = |what: &str| {
            let of = pairs.len();
            bar.doing(format!("pair {}/{of}, GPU {producer} to GPU {consumer}: {what}", pair + 1));
        };
        let stream = Stream::non_blocking(driver, consumer)?;
        let mine = ExportedEvent::create(driver, consumer)?;
        state.publish_event(CONSUMER, mine.handle(), mine.file());
        guardian.cover(mine.file().map(std::slice::from_ref).unwrap_or_default());
        let work = DeviceBuffer::allocate(driver, consumer, WORK_BYTES)?;
        rendezvous.meet(Step::EndpointsPublished, &stop)?;
        // The producer's event file is covered too: the guardian outlives both.
        let producer_event = Exporter { pid: None, file: state.event_file(PRODUCER) };
        guardian.cover(producer_event.file.as_slice());
        let theirs =
            OpenedEvent::open(driver, consumer, &state.event_handles[PRODUCER].load(), &producer_event)?;
        let flags_by = flags_mechanism(mechanism);
        let descriptor = if flags_by.uses_descriptors() { receive(&stop)? } else { None };
        let flags_handle = state.mem_handles[FLAGS_SLOT].load();
        let flags = OpenedBuffer::open(
            driver,
            flags_by,
            &flags_handle,
            descriptor,
            FLAGS_BYTES,
            consumer,
            &Exporter::default(),
        )?;
        let side = Pair::consumer(&stream, &mine, &theirs, &flags, &work)?;
        report::print_pair_header(driver, producer, consumer, &mps, pair)?;
        let rounds = rounds(driver.simulated());
        let mut memops_done = 0;
        for handover in Handover::ALL {
            doing(handover.name());
            let figures = match (&memops_missing, handover.memops()) {
                (Some(reason), true) => Figures::Waived(reason.clone()),
                _ => {
                    rendezvous.meet(Step::Handover(handover), &stop)?;
                    Figures::Handover(measure(handover, &side, state, rounds, &mut memops_done, &stop)?)
                }
            };
            report::print_handover(handover, &figures)?;
            bar.step_done();
            results.push(TestResult { name: handover.name().into(), producer, consumer, figures });
        }
        rendezvous.meet(Step::HandoversDone, &stop)?;

        let l2 = driver.device_info(consumer)?.l2_cache_bytes;
        let reference = Reference::of(producer, consumer);
        report::print_rates_heading(reference)?;
        for size in sizes(max) {
            doing(&format!("copy of {}", report::human(size)));
            rendezvous.meet(Step::BufferPublished(size), &stop)?;
            let handle = state.mem_handles[DATA_SLOT].load();
            let descriptor = receive(&stop)?;
            let shared = OpenedBuffer::open(
                driver,
                mechanism,
                &handle,
                descriptor,
                size,
                consumer,
                &Exporter::default(),
            )?;
            let devices = (producer, consumer);
            let rates = copy_rates(driver, &stream, &shared, devices, reference, size, l2, &stop)?;
            drop(shared);
            rendezvous.meet(Step::MappingClosed(size), &stop)?;
            report::print_rates(&rates)?;
            bar.step_done();
            results.push(TestResult {
                name: "copy".into(),
                producer,
                consumer,
                figures: Figures::Copy(rates),
            });
        }
        report::print_l2_note(consumer, l2)?;
        drop(flags);
        rendezvous.meet(Step::FlagsClosed, &stop)?;
    }
    producer.wait()?;
    findings.results = Some(Results::Bench(BenchResults::of(mechanism, &mps, &results)));
    Ok(Outcome::Passed(None))
}

/// The benchmark's producer: the consumer's child, or the process that joined its served run.
enum Producer<'s> {
    Child(Children<'s>),
    Joined(std::cell::RefCell<Joiners<'s>>),
}

impl Producer<'_> {
    /// `Err` if the producer has failed or is gone (or, served, the watchdog's time is up).
    fn check(&self) -> Result<()> {
        match self {
            Producer::Child(children) => children.check_all_alive(),
            Producer::Joined(joiners) => joiners.borrow_mut().check_alive(),
        }
    }

    /// Waits for the producer's end, which must be a good one.
    fn wait(self) -> Result<()> {
        match self {
            Producer::Child(mut children) => {
                crate::supervise::peers::wait(&mut children, || false, || {}, || None)
            }
            Producer::Joined(joiners) => {
                crate::supervise::peers::wait(&mut joiners.into_inner(), || false, || {}, || None)
            }
        }
    }
}

/// The producer as the consumer's child: attaches to the inherited segment, then produces.
pub fn run_producer(index: usize, segment_fd: Option<i32>, socket_fd: Option<i32>) -> Result<()> {
    if index != PRODUCER {
        bail!("the benchmark's producer is process {PRODUCER}, not {index}");
    }
    let watch = Stopwatch::start(Who::Child(index), Phase::Attach)?;
    let (segment, parent_pid) = attach::segment(segment_fd)?;
    print_line!("CP: lshmName = {}", segment::name_for(parent_pid as u32))?;
    let socket = socket_fd.map(|fd| crate::os::inherit::take(fd, "descriptor socket")).transpose()?;
    produce(index, watch, &segment, socket, &attach::Parent::Pid(parent_pid))
}

/// The producer's side of `--bench`, in the segment of a consumer that is `parent` (its parent, or the
/// server it joined).
pub fn produce(
    index: usize,
    watch: Stopwatch,
    segment: &segment::Segment,
    socket: Option<OwnedFd>,
    parent: &attach::Parent,
) -> Result<()> {
    if index != PRODUCER {
        bail!("the benchmark's producer is process {PRODUCER}, not {index}");
    }
    let state = segment.state();
    let mut watch = watch.report_to(&state.progress[index]);
    let mechanism = Mechanism::from_code(state.mechanism.load(Ordering::Relaxed))
        .context("the segment names an IPC mechanism this program does not know")?;
    let memops = state.options.load(Ordering::Relaxed) & segment::OPTION_SYNC_MEMOPS != 0;
    let socket = socket.filter(|_| mechanism.uses_descriptors());
    let send = |buffer: &ExportedBuffer| -> Result<()> {
        if let (Some(socket), Some(fd)) = (&socket, buffer.descriptor()) {
            descriptors::send(socket, mechanism.code(), &[fd])?;
        }
        Ok(())
    };
    let stop = move || attach::still_running(state, parent);
    watch.enter(Phase::CudaStart)?;
    let cuda = driver::load().context("starting CUDA").map_err(attach::not_waived)?;
    let driver: &dyn Driver = &*cuda;
    let mut rendezvous = Rendezvous::on(state, Side::Producer);
    let rounds = rounds(driver.simulated());
    watch.enter(Phase::RoundRobin)?;
    for _ in 0..state.bench.pairs.load(Ordering::Relaxed) {
        rendezvous.meet(Step::PairAnnounced, &stop)?;
        let device = attach::device(driver, state, PRODUCER)?;
        let stream = Stream::non_blocking(driver, device)?;
        let mine = ExportedEvent::create(driver, device)?;
        state.publish_event(PRODUCER, mine.handle(), mine.file());
        let work = DeviceBuffer::allocate(driver, device, WORK_BYTES)?;
        let flags = ExportedBuffer::allocate(driver, flags_mechanism(mechanism), device, FLAGS_BYTES)?;
        stream.fill(&flags, 0, FLAGS_BYTES)?;
        stream.synchronize(&stop)?;
        state.mem_handles[FLAGS_SLOT].store(flags.handle());
        send(&flags)?; // nothing to send for legacy flags
        rendezvous.meet(Step::EndpointsPublished, &stop)?;
        let consumer_event = Exporter {
            pid: Some(state.parent_pid.load(Ordering::Relaxed)),
            file: state.event_file(CONSUMER),
        };
        let theirs =
            OpenedEvent::open(driver, device, &state.event_handles[CONSUMER].load(), &consumer_event)?;
        let side = Pair::producer(&stream, &mine, &theirs, &flags, &work)?;
        let mut memops_done = 0;
        for handover in Handover::ALL.into_iter().filter(|h| memops || !h.memops()) {
            rendezvous.meet(Step::Handover(handover), &stop)?;
            answer(handover, &side, state, rounds, &mut memops_done, &stop)?;
        }
        rendezvous.meet(Step::HandoversDone, &stop)?;
        for size in sizes(state.data_size()) {
            let buffer = ExportedBuffer::allocate(driver, mechanism, device, size)?;
            stream.fill(&buffer, 7, size)?;
            stream.synchronize(&stop)?;
            state.mem_handles[DATA_SLOT].store(buffer.handle());
            send(&buffer)?;
            rendezvous.meet(Step::BufferPublished(size), &stop)?;
            rendezvous.meet(Step::MappingClosed(size), &stop)?;
        }
        rendezvous.meet(Step::FlagsClosed, &stop)?;
    }
    // Its part is done, as the segment says (a server counts a joiner's good end only with this).
    watch.finish().publish(state, index);
    Ok(())
}
