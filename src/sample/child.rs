//! A child (the original's `childProcess`): attach to the parent's segment, open every process's buffer and
//! event (step 6), write the others' buffers round-robin with `simpleKernel`, each write ordered by the
//! buffer's event and every step closed by the barrier (step 7), check its own buffer (step 8), and close
//! what it opened before it says it finished (step 9).
//!
//! Every wait here ends early when the run is aborted, the parent dies or a stop signal comes; whatever was
//! opened is closed by its owner on the way out. The tool's options reach it through [`ChildExtras`].

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, anyhow, bail};

use super::attach;
use super::extras::{ChildExtras, WriteOrder};
use super::verify::{expected_byte, find_mismatches};
use crate::driver::{self, Driver};
use crate::gpu::Stream;
use crate::gpu::host_buffer::{self, HostBuffer};
use crate::gpu::kernel::SimpleKernel;
use crate::ipc::diagnose::Exporter;
use crate::ipc::{Mechanism, OpenedBuffer, OpenedEvent};
use crate::os::inherit;
use crate::os::stop::StopCheck;
use crate::phases::timings::Stopwatch;
use crate::phases::{Phase, Who};
use crate::segment::barrier;
use crate::segment::{self, Segment};
use crate::wire::descriptors;

/// `childProcess` for a child its parent started: the parent's pid (`getppid`), its segment
/// `simpleIPCshm<ppid>` (`sharedMemoryOpen`, here inherited as a descriptor), then its part.
pub(crate) fn child_process(
    index: usize,
    segment_fd: Option<i32>,
    socket_fd: Option<i32>,
    extras: &dyn ChildExtras,
) -> Result<()> {
    let watch = Stopwatch::start(Who::Child(index), Phase::Attach)?;
    let (segment, parent_pid) = attach::segment(segment_fd)?;
    let socket = socket_fd.map(|fd| inherit::take(fd, "descriptor socket")).transpose()?;
    take_part(index, watch, &segment, socket, &attach::Parent::Pid(parent_pid), driver::load, extras)
}

/// Everything a child does once it has its segment, whoever handed it over (its parent, or the server it
/// joined: see `join`), with `socket` the one its buffers' descriptors come over (vmm and pool), and
/// `start_cuda` what starts CUDA in this process (`cuInit`; a joiner began it as it started).
pub(crate) fn take_part(
    index: usize,
    watch: Stopwatch,
    segment: &Segment,
    socket: Option<OwnedFd>,
    parent: &attach::Parent,
    start_cuda: impl FnOnce() -> Result<Box<dyn Driver>>,
    extras: &dyn ChildExtras,
) -> Result<()> {
    let state = segment.state();
    let mut watch = watch.report_to(&state.progress[index]);
    let stop = move || -> Result<()> { attach::still_running(state, parent) };

    // CUDA first: the first device's children start while the parent is still choosing the devices.
    watch.enter(Phase::CudaStart)?;
    let cuda = start_cuda();
    // Then the plan: how many processes, who runs where, the mechanism. A parent that found no GPU either
    // waives the run, and this process stops without a word.
    watch.enter(Phase::WaitPlan)?;
    attach::wait_for_the_plan(state, index, parent)?;
    if let attach::Parent::Pid(pid) = parent {
        // The original's first line, once the run goes on (a joiner said it as it joined).
        print_line!("CP: lshmName = {}", segment::name_for(*pid as u32))?;
    }
    let cuda = attach::driver(state, index, cuda)?;
    let driver: &dyn Driver = &*cuda;
    let n = state.process_count();
    let mechanism = Mechanism::from_code(state.mechanism.load(Ordering::Relaxed))
        .context("the segment names an IPC mechanism this program does not know")?;
    // Faulting in the host buffer for the copy back needs no CUDA: it runs while the context is made.
    let size = state.data_size();
    let host_memory = std::thread::Builder::new()
        .spawn(move || host_buffer::fault_in(size))
        .context("starting the host buffer thread")?;

    // cudaSetDevice(shm->devices[id]), cudaGetDeviceProperties, cudaStreamCreateWithFlags, and the kernel's
    // grid from cudaOccupancyMaxActiveBlocksPerMultiprocessor.
    let device = attach::device(driver, state, index)?;

    watch.enter(Phase::Context)?;
    print_line!("Process {index}: Starting on device {device}...")?;
    extras.place(driver, device, state)?;
    let stream = Stream::non_blocking(driver, device)?;

    watch.enter(Phase::Prepare)?;
    let info = driver.device_info(device)?;
    let kernel = SimpleKernel::load(driver, device, info.multiprocessors)?;
    let host_memory = host_memory.join().map_err(|_| anyhow!("the host buffer thread failed"))??;
    let mut host = HostBuffer::pin(driver, device, host_memory)?;

    // The parent exports the handles while we started CUDA; wait until they are all there (the segment's
    // run state, which the parent sets once every handle is in: the original's children start only then).
    watch.enter(Phase::WaitReady)?;
    barrier::wait_until(&state.run_state, |s| s != segment::RunState::Starting as u32, &stop)?;
    stop.check()?;

    // Step 6, open: cudaIpcOpenMemHandle and cudaIpcOpenEventHandle for every process's buffer and event.
    watch.enter(Phase::OpenHandles)?;
    state.descriptors[index][0].store(open_descriptors()?, Ordering::Relaxed);
    let mut descriptors = match extras.fetched_descriptors(socket.is_some(), state, mechanism)? {
        Some(fetched) => fetched.into_iter().map(Some).collect(),
        None => received(socket.as_ref(), n, mechanism, &stop)?,
    };
    let allocated = size + extras.bytes_after_data(state);
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
        let event = &state.event_handles[other].load();
        events.extend(
            extras
                .event(state, &mut || OpenedEvent::open(driver, device, event, &exporter))
                .with_context(|| format!("opening the event of process {other}"))?,
        );
    }
    state.opened.fetch_add(1, Ordering::AcqRel);

    // Step 7, the round-robin: at step i, write buffer (i + id) % n after its last writer
    // (cudaStreamWaitEvent), then tell the next one (cudaEventRecord); barrierWait keeps all at one step.
    watch.enter(Phase::RoundRobin)?;
    let order = match extras.write_order(state, &buffers)? {
        Some(other) => other,
        None => Box::new(Events(&events)),
    };
    let barrier = state.barrier(n);
    extras.before_writing(&mut watch, state)?;
    for step in 0..n {
        let target = (step + index) % n;
        order.wait_for_writes(&stream, target, step)?;
        kernel
            .launch(&stream, &buffers[target], size, index as u8)
            .with_context(|| format!("launching simpleKernel on the buffer of process {target}"))?;
        order.after_writing(&stream, target, step)?;
        barrier.wait(&stop).with_context(|| format!("in the barrier after step {step}"))?;
        if index == 0 {
            print_line!("Step {step} done")?;
        }
    }

    // Step 8, verify: our own buffer was written last by process (id + 1) % n, at the last step; wait for
    // that write, copy the buffer back (cudaMemcpyAsync, cudaStreamSynchronize) and compare.
    watch.enter(Phase::CopyBack)?;
    order.wait_for_writes(&stream, index, n)?;
    let data = host.copy_from(&buffers[index], size, &stream, &stop).context("copying the buffer back")?;
    print_line!("Process {index}: verifying...")?;
    watch.enter(Phase::Verify)?;
    let expected = expected_byte(index, n);
    extras.before_comparing(data, expected);
    let mismatches = find_mismatches(data, expected)?;
    if let Some((offset, value)) = mismatches.first {
        bail!(
            "verification failed: {} of {size} bytes differ from {expected}; the first, at offset {offset}, is {value}",
            mismatches.count
        );
    }

    // Step 9, clean up: cudaIpcCloseMemHandle, cudaEventDestroy, cudaStreamDestroy, before it says that it
    // finished.
    watch.enter(Phase::CleanUp)?;
    drop(order);
    drop((events, buffers, host, kernel, stream));
    state.descriptors[index][1].store(open_descriptors()?, Ordering::Relaxed);
    watch.finish().publish(state, index);
    print_line!("Process {index} complete!")?;
    // The parent may free the buffers now, while this process ends, and its CUDA context with it.
    state.finished.fetch_add(1, Ordering::AcqRel);
    extras.leave_cuda(cuda);
    Ok(())
}

/// Step 6's descriptors: every buffer's (vmm and pool), in process order, over `socket`; none for the
/// mechanisms that need none.
fn received(
    socket: Option<&OwnedFd>,
    n: usize,
    mechanism: Mechanism,
    stop: &dyn StopCheck,
) -> Result<Vec<Option<OwnedFd>>> {
    match socket {
        Some(socket) => Ok(descriptors::receive(socket.as_fd(), mechanism.code(), n, stop)?
            .into_iter()
            .map(Some)
            .collect()),
        None if mechanism.uses_descriptors() => {
            bail!("--ipc {} needs a descriptor socket, and none was given", mechanism.name())
        }
        None => Ok((0..n).map(|_| None).collect()),
    }
}

/// The original's order: the stream waits for the buffer's interprocess event (`cudaStreamWaitEvent`), and
/// records it after the kernel (`cudaEventRecord`).
struct Events<'a, 'd>(&'a [OpenedEvent<'d>]);

impl WriteOrder for Events<'_, '_> {
    fn wait_for_writes(&self, stream: &Stream, target: usize, _step: usize) -> Result<()> {
        stream.wait_for(&self.0[target])
    }

    fn after_writing(&self, stream: &Stream, target: usize, _step: usize) -> Result<()> {
        stream.record(&self.0[target])
    }
}

/// How many descriptors this process has open.
fn open_descriptors() -> Result<u32> {
    let entries = std::fs::read_dir("/proc/self/fd").context("listing /proc/self/fd")?;
    // Less the one read_dir itself holds open.
    Ok((entries.count() as u32).saturating_sub(1))
}
