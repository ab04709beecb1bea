//! A child (the original's `childProcess`): attach to the parent's segment, open every process's buffer and
//! event, write the others' buffers round-robin with `simpleKernel`, and check its own buffer.
//!
//! Every wait here ends early when the run is aborted, the parent dies or a stop signal comes; whatever was
//! opened is closed by its owner on the way out.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, anyhow, bail};

use crate::attach;
use crate::barrier;
use crate::driver::Driver;
use crate::fault;
use crate::gpu::Stream;
use crate::gpu::host_buffer::{self, HostBuffer};
use crate::gpu::kernel::SimpleKernel;
use crate::inherit;
use crate::ipc::diagnose::Exporter;
use crate::ipc::{Mechanism, OpenedBuffer, OpenedEvent, Slice, Sync, pidfd};
use crate::numa::{self, Sysfs};
use crate::phase::{Phase, Who};
use crate::segment::{self, Segment};
use crate::stop::StopCheck;
use crate::timings::Stopwatch;
use crate::verify::{expected_byte, find_mismatches};
use crate::wire::descriptors;

/// A child the parent started: its index, and the segment and descriptor socket it inherited.
pub fn run(index: usize, segment_fd: Option<i32>, socket_fd: Option<i32>) -> Result<()> {
    let watch = Stopwatch::start(Who::Child(index), Phase::Attach)?;
    let (segment, parent_pid) = attach::segment(index, segment_fd)?;
    let socket = socket_fd.map(|fd| inherit::take(fd, "descriptor socket")).transpose()?;
    take_part(index, watch, &segment, socket, &attach::Parent::Pid(parent_pid))
}

/// Everything a child does once it has its segment, whoever handed it over (its parent, or the server it
/// joined: see `join`), with `socket` the one its buffers' descriptors come over (vmm and pool).
pub fn take_part(
    index: usize,
    watch: Stopwatch,
    segment: &Segment,
    socket: Option<OwnedFd>,
    parent: &attach::Parent,
) -> Result<()> {
    let state = segment.state();
    let mut watch = watch.report_to(&state.progress[index]);
    let n = state.process_count();
    let mechanism = Mechanism::from_code(state.mechanism.load(Ordering::Relaxed))
        .context("the segment names an IPC mechanism this program does not know")?;
    let pidfd = state.options.load(Ordering::Relaxed) & segment::OPTION_FDS_PIDFD != 0;
    if mechanism.uses_descriptors() && socket.is_none() && !pidfd {
        bail!("--ipc {} needs a descriptor socket, and none was given", mechanism.name());
    }
    let stop = move || -> Result<()> { attach::still_running(state, parent) };
    // Faulting in the host buffer for the copy back needs no CUDA: it runs while CUDA starts.
    let size = state.data_size();
    let host_memory = std::thread::Builder::new()
        .spawn(move || host_buffer::fault_in(size))
        .context("starting the host buffer thread")?;

    watch.enter(Phase::CudaStart)?;
    let driver = attach::driver(state, index)?;
    let driver: &dyn Driver = &*driver;
    let device = attach::device(driver, state, index)?;

    watch.enter(Phase::Context)?;
    say!("Process {index}: Starting on device {device}...")?;
    if state.options.load(Ordering::Relaxed) & segment::OPTION_BIND_NUMA != 0 {
        let bus = driver.device_info(device)?.pci_bus_id;
        match numa::bind_to_device_node(&Sysfs::default(), bus.as_deref())? {
            Some(place) => say!("Process {index}: bound to the CPUs of device {device}'s NUMA {place}"),
            None => say!("Process {index}: device {device} has no known NUMA node; not bound"),
        }?;
    }
    let stream = Stream::non_blocking(driver, device)?;

    watch.enter(Phase::Prepare)?;
    let info = driver.device_info(device)?;
    let kernel = SimpleKernel::load(driver, device, info.multiprocessors)?;
    let host_memory = host_memory.join().map_err(|_| anyhow!("the host buffer thread failed"))??;
    let mut host = HostBuffer::pin(driver, device, host_memory)?;

    // The parent exports the handles while we started CUDA; wait until they are all there.
    watch.enter(Phase::WaitReady)?;
    barrier::wait_until(&state.run_state, |s| s != segment::RunState::Starting as u32, &stop)?;
    stop.check()?;

    watch.enter(Phase::OpenHandles)?;
    state.descriptors[index][0].store(open_descriptors()?, Ordering::Relaxed);
    let mut descriptors: Vec<Option<OwnedFd>> = match &socket {
        Some(socket) => {
            descriptors::receive(socket.as_fd(), mechanism.code(), n, &stop)?.into_iter().map(Some).collect()
        }
        // --fds pidfd: fetched from the exporter, by the numbers it published.
        None if pidfd && mechanism.uses_descriptors() => {
            let exporter = exporter_pid(parent, state.parent_pid.load(Ordering::Relaxed))?;
            (0..n)
                .map(|other| {
                    let number = state.descriptor_numbers[other].load(Ordering::Relaxed);
                    pidfd::fetch(exporter, number, other).map(Some)
                })
                .collect::<Result<_>>()?
        }
        None => (0..n).map(|_| None).collect(),
    };
    let sync = state.sync();
    let memops = sync == Sync::Memops;
    // With --sync memops, each buffer has its flag after the data.
    let allocated = if memops { size + segment::FLAG_BYTES } else { size };
    let mut buffers = Vec::with_capacity(n);
    let mut events = Vec::with_capacity(n);
    for (other, descriptor) in descriptors.iter_mut().enumerate() {
        // The parent exported everything; it wrote its pid and each event's file into the segment.
        let exporter =
            Exporter { pid: Some(state.parent_pid.load(Ordering::Relaxed)), file: state.event_file(other) };
        let handle = state.mem_handles[other].load();
        buffers.push(
            OpenedBuffer::open(driver, mechanism, &handle, descriptor.take(), allocated, device, &exporter)
                .with_context(|| format!("opening the {} buffer of process {other}", mechanism.name()))?,
        );
        // --sync memops orders the round-robin without interprocess events: it opens none.
        if !memops {
            events.push(
                OpenedEvent::open(driver, device, &state.event_handles[other].load(), &exporter)
                    .with_context(|| format!("opening the event of process {other}"))?,
            );
        }
    }
    state.opened.fetch_add(1, Ordering::AcqRel);

    // The round-robin: at step i, write buffer (i + index) % n, after its last writer, then tell the next one.
    watch.enter(Phase::RoundRobin)?;
    let handover = match sync {
        Sync::Memops => {
            let flags =
                buffers.iter().map(|b| Slice::of(b, size, segment::FLAG_BYTES)).collect::<Result<_>>()?;
            Handover::Flags(flags)
        }
        Sync::Events => Handover::Events(&events),
    };
    let barrier = state.barrier(n);
    if fault::lies(Who::Child(index)) {
        // A test of the parent's own check: a process that did nothing writes into the segment that it
        // finished, and says it ended well.
        watch.finish().publish(state, index);
        state.finished.fetch_add(1, Ordering::AcqRel);
        return Ok(());
    }
    for step in 0..n {
        let target = (step + index) % n;
        handover.before_writing(&stream, target, step)?;
        kernel
            .launch(&stream, &buffers[target], size, index as u8)
            .with_context(|| format!("launching simpleKernel on the buffer of process {target}"))?;
        handover.after_writing(&stream, target, step)?;
        barrier.wait(&stop).with_context(|| format!("in the barrier after step {step}"))?;
        if index == 0 {
            say!("Step {step} done")?;
        }
    }

    // Our own buffer was written last by process (index + 1) % n, at the last step.
    watch.enter(Phase::CopyBack)?;
    handover.before_writing(&stream, index, n)?;
    let data = host.copy_from(&buffers[index], size, &stream, &stop).context("copying the buffer back")?;
    say!("Process {index}: verifying...")?;
    watch.enter(Phase::Verify)?;
    let expected = expected_byte(index, n);
    fault::corrupt_if_asked(Who::Child(index), data, expected);
    let mismatches = find_mismatches(data, expected)?;
    if let Some((offset, value)) = mismatches.first {
        bail!(
            "verification failed: {} of {size} bytes differ from {expected}; the first, at offset {offset}, is {value}",
            mismatches.count
        );
    }

    watch.enter(Phase::CleanUp)?;
    drop(handover);
    drop((events, buffers, host, kernel, stream));
    state.descriptors[index][1].store(open_descriptors()?, Ordering::Relaxed);
    watch.finish().publish(state, index);
    say!("Process {index} complete!")?;
    // The parent may free the buffers now, while this process tears its CUDA context down.
    state.finished.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// How a writer of a buffer waits for the one before it and tells the one after it (`--sync`).
enum Handover<'a, 'd> {
    /// The original's: the stream waits for the buffer's interprocess event, and records it after the kernel.
    Events(&'a [OpenedEvent<'d>]),
    /// Stream memory operations on the buffer's flag, which counts the writes done: the stream waits until
    /// the flag says `step` writes are done, and writes `step + 1` after the kernel.
    Flags(Vec<Slice<'a>>),
}

impl Handover<'_, '_> {
    /// Work on `stream` from now on waits until buffer `target` has been written `step` times.
    fn before_writing(&self, stream: &Stream, target: usize, step: usize) -> Result<()> {
        match self {
            Handover::Events(events) => stream.wait_for(&events[target]),
            Handover::Flags(flags) => stream.wait_flag(&flags[target], step as u32),
        }
    }

    /// Tells the next writer of buffer `target` that the write of `step` is done, once the stream's work is.
    fn after_writing(&self, stream: &Stream, target: usize, step: usize) -> Result<()> {
        match self {
            Handover::Events(events) => stream.record(&events[target]),
            Handover::Flags(flags) => stream.write_flag(&flags[target], step as u32 + 1),
        }
    }
}

/// The exporter's pid as this process sees it: its parent's, or the server's as the connection's peer
/// credentials say (the kernel gives 0 for a process outside this one's PID namespace), or in a served
/// sequence the run below it that `published` its pid (see `pidfd::exporter_seen_from`).
fn exporter_pid(parent: &attach::Parent, published: u32) -> Result<u32> {
    match parent {
        attach::Parent::Pid(pid) => Ok(*pid as u32),
        attach::Parent::Server { connection, .. } => {
            let peer = nix::sys::socket::getsockopt(*connection, nix::sys::socket::sockopt::PeerCredentials)
                .context("asking the socket for the server's pid (SO_PEERCRED)")?;
            pidfd::exporter_seen_from(peer.pid().max(0) as u32, published)
        }
    }
}

/// How many descriptors this process has open.
fn open_descriptors() -> Result<u32> {
    let entries = std::fs::read_dir("/proc/self/fd").context("listing /proc/self/fd")?;
    // Less the one read_dir itself holds open.
    Ok((entries.count() as u32).saturating_sub(1))
}
