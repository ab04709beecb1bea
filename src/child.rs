//! A child (the original's `childProcess`): attach to the parent's segment, open every process's buffer and
//! event, write the others' buffers round-robin with `simpleKernel`, and check its own buffer.
//!
//! Every wait here ends early when the run is aborted, the parent dies or a stop signal comes; whatever was
//! opened is closed by its owner on the way out.

use std::sync::atomic::Ordering;

use anyhow::{Context, Result, anyhow, bail, ensure};
use nix::unistd::getppid;

use crate::barrier::{self, Barrier, StopCheck};
use crate::driver::{self, Driver};
use crate::fault::{self, Phase, Who};
use crate::ipc::{OpenedBuffer, OpenedEvent};
use crate::kernel::{SimpleKernel, Stream};
use crate::segment::{self, Segment, SharedState};
use crate::signals;
use crate::timings::{Step, Stopwatch};
use crate::topology;
use crate::verify::{self, HostBuffer, find_mismatches};

pub fn run(index: usize) -> Result<()> {
    let mut watch = Stopwatch::start();
    let (segment, parent_pid) = attach(index)?;
    let state = segment.state();
    let n = state.process_count();
    let stop = move || -> Result<()> { still_running(state, parent_pid) };
    // Faulting in the host buffer for the copy back needs no CUDA: it runs while CUDA starts.
    let size = state.data_size();
    let host_memory = std::thread::spawn(move || verify::fault_in(size));

    let driver = driver::load().context("starting CUDA")?;
    let driver: &dyn Driver = &*driver;
    watch.lap(Step::CudaStart);
    let device = state.device_of(index);
    let count = driver.device_count()?;
    ensure!(
        device < count,
        "the segment gives process {index} device {device}, but there are {count} devices"
    );

    println!("Process {index}: Starting on device {device}...");
    if state.options.load(Ordering::Relaxed) & segment::OPTION_BIND_NUMA != 0 {
        match topology::bind_to_device_node(driver, device)? {
            Some(place) => println!("Process {index}: bound to the CPUs of device {device}'s NUMA {place}"),
            None => println!("Process {index}: device {device} has no known NUMA node; not bound"),
        }
    }
    driver.use_device(device)?;
    let stream = Stream::non_blocking(driver)?;
    watch.lap(Step::Context);
    let info = driver.device_info(device)?;
    let kernel = SimpleKernel::load(driver, info.multiprocessors)?;
    let host_memory = host_memory.join().map_err(|_| anyhow!("the host buffer thread panicked"))??;
    let mut host = HostBuffer::pin(driver, host_memory)?;
    watch.lap(Step::Prepare);

    // The parent exports the handles while we started CUDA; wait until they are all there.
    barrier::wait_until(&state.phase, |phase| phase != segment::Phase::Starting as u32, &stop)?;
    stop.check()?;
    watch.lap(Step::WaitReady);

    let mut buffers = Vec::with_capacity(n);
    let mut events = Vec::with_capacity(n);
    for other in 0..n {
        buffers.push(
            OpenedBuffer::open(driver, &state.mem_handles[other].load())
                .with_context(|| format!("opening the buffer of process {other}"))?,
        );
        events.push(
            OpenedEvent::open(driver, &state.event_handles[other].load())
                .with_context(|| format!("opening the event of process {other}"))?,
        );
        fault::at(Who::Child(index), Phase::OpenHandles)?;
    }
    state.opened.fetch_add(1, Ordering::AcqRel);
    watch.lap(Step::OpenHandles);

    // The round-robin: at step i, write buffer (i + index) % n, after its last writer, then tell the next one.
    let barrier = Barrier::new(state, n);
    for step in 0..n {
        let target = (step + index) % n;
        stream.wait_for(&events[target])?;
        kernel
            .launch(&stream, &buffers[target], size, index as u8)
            .with_context(|| format!("launching simpleKernel on the buffer of process {target}"))?;
        stream.record(&events[target])?;
        fault::at(Who::Child(index), Phase::RoundRobin)?;
        barrier.wait(&stop).with_context(|| format!("in the barrier after step {step}"))?;
        if index == 0 {
            println!("Step {step} done");
        }
    }
    watch.lap(Step::RoundRobin);

    // Our own buffer was written last by process (index + 1) % n.
    stream.wait_for(&events[index])?;
    let data = host.copy_from(buffers[index].ptr(), stream.raw()).context("copying the buffer back")?;
    watch.lap(Step::CopyBack);
    println!("Process {index}: verifying...");
    fault::at(Who::Child(index), Phase::Verify)?;
    let expected = ((index + 1) % n) as u8;
    if fault::corrupts(Who::Child(index)) {
        let last = data.len() - 1;
        data[last / 3] = expected.wrapping_add(7);
        data[last] = expected.wrapping_add(1);
    }
    let mismatches = find_mismatches(data, expected);
    watch.lap(Step::Compare);
    if let Some((offset, value)) = mismatches.first {
        bail!(
            "verification failed: {} of {size} bytes differ from {expected}; the first, at offset {offset}, is {value}",
            mismatches.count
        );
    }

    drop((events, buffers, host, kernel, stream));
    watch.lap(Step::CleanUp);
    watch.finish().publish(state, index);
    println!("Process {index} complete!");
    // The parent may free the buffers now, while this process tears its CUDA context down.
    state.finished.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Opens the parent's segment (`simpleIPCshm<getppid()>`) after checking it, and reports this child attached.
/// Returns the segment and the parent's pid.
pub fn attach(index: usize) -> Result<(Segment, i32)> {
    let parent_pid = getppid().as_raw();
    let name = segment::name_for(parent_pid as u32);
    println!("CP: lshmName = {name}");
    let segment = Segment::open(&name).context("Failed to create shared memory slab")?;
    let state = segment.state();
    let n = state.process_count();
    ensure!(index < n, "this is process {index}, but the segment has {n} processes");
    let creator = state.parent_pid.load(Ordering::Relaxed);
    ensure!(
        creator == parent_pid as u32,
        "the segment was made by process {creator}, not by our parent {parent_pid}"
    );
    segment.mark_attached()?;
    fault::at(Who::Child(index), Phase::Attach)?;
    Ok((segment, parent_pid))
}

/// The stop check of every wait in a child.
pub fn still_running(state: &SharedState, parent_pid: i32) -> Result<()> {
    signals::check()?;
    if state.phase() == segment::Phase::Aborted {
        bail!("stopped: the run was aborted (another process failed or the parent was interrupted)");
    }
    if getppid().as_raw() != parent_pid {
        bail!("stopped: the parent process {parent_pid} is gone");
    }
    Ok(())
}
