//! The parent (the original's `parentProcess`): create the segment, choose the devices, start the children,
//! export one buffer and one event per child, wait for the children, clean up.
//!
//! Unlike the original, the children start as soon as the devices are chosen, so that their CUDA start-up
//! overlaps the parent's allocations; they wait in the segment until the handles are there (`--sequential`
//! keeps the original's order). Ownership sets the clean-up order: the exports are declared before the
//! children, so the children are stopped and reaped before any buffer is freed.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

use crate::Outcome;
use crate::children::Children;
use crate::cli::Cli;
use crate::devices;
use crate::driver::{self, Driver};
use crate::fault::{self, Who};
use crate::ipc::{ExportedBuffer, ExportedEvent, ProcessExports};
use crate::segment::{self, RunPlan, Segment, SharedState};
use crate::timings::{self, Phases, Step, Stopwatch};

pub fn run(cli: &Cli) -> Result<Outcome> {
    let mut watch = Stopwatch::start();
    let name = segment::name_for(std::process::id());
    println!("PP: lshmName = {name}");
    let segment = Segment::create(&name)?;
    let state = segment.state();

    let Some(cuda) = driver::load_or_waive()? else { return Ok(Outcome::Waived) };
    let driver: &dyn Driver = &*cuda;
    watch.lap(Step::CudaStart);

    let chosen = devices::select(driver)?;
    if chosen.is_empty() {
        println!("No CUDA devices support IPC");
        return Ok(Outcome::Waived);
    }
    let process_devices = devices::plan(&chosen, cli.procs_per_device as usize)?;
    state.describe_run(&RunPlan {
        devices: &process_devices,
        procs_per_device: cli.procs_per_device as usize,
        data_size: driver.buffer_size(),
        options: if cli.bind_numa { segment::OPTION_BIND_NUMA } else { 0 },
    });
    watch.lap(Step::DeviceSelection);

    // Declared before the children: dropped (events synchronised and destroyed, buffers freed) after them.
    let exports;
    let mut children;
    if cli.sequential {
        exports = export_all(driver, state, &chosen, &process_devices, &mut watch)?;
        children = Children::spawn(state, 0..process_devices.len(), &[])?;
        watch.lap(Step::StartChildren);
    } else {
        children = Children::spawn(state, 0..process_devices.len(), &[])?;
        watch.lap(Step::StartChildren);
        exports = export_all(driver, state, &chosen, &process_devices, &mut watch)?;
    }

    fault::at(Who::Parent, fault::Phase::WaitChildren)?;
    let n = process_devices.len();
    let all_finished = || state.finished.load(Ordering::Acquire) as usize == n;
    let mut names_removed = false;
    children.wait(all_finished, || {
        // Once every child has opened the handles, the driver's own files for them need no name any more.
        if !names_removed && state.opened.load(Ordering::Acquire) as usize == n {
            names_removed = true;
            if let Err(e) = driver.remove_exported_names() {
                eprintln!("warning: {e:#}");
            }
        }
    })?;
    watch.lap(Step::WaitChildren);
    // Every child has verified and closed what it opened: free the buffers and release CUDA while the
    // children tear their own contexts down (that takes longer than the whole round-robin), then collect
    // their exit statuses.
    drop(exports);
    drop(cuda);
    watch.lap(Step::CleanUp);
    children.wait(|| false, || {})?;
    watch.lap(Step::WaitChildren);

    report(cli, state, &watch.finish())?;
    Ok(Outcome::Passed)
}

/// The exports of some processes, with their indices.
type Indexed<'d> = Vec<(usize, ProcessExports<'d>)>;

/// Makes each chosen device's context current, allocates and exports every process's buffer and event into
/// the segment, then lets the children go on. Several devices are set up in parallel, one thread each.
fn export_all<'d>(
    driver: &'d dyn Driver,
    state: &SharedState,
    chosen: &[i32],
    process_devices: &[i32],
    watch: &mut Stopwatch,
) -> Result<Vec<ProcessExports<'d>>> {
    let per_device: Vec<Result<(Duration, Indexed<'d>)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = chosen
            .iter()
            .map(|&device| scope.spawn(move || export_device(driver, device, process_devices)))
            .collect();
        let joined = workers.into_iter().map(|worker| worker.join());
        joined.map(|r| r.unwrap_or_else(|_| Err(anyhow!("a device set-up thread panicked")))).collect()
    });
    let mut exports: Indexed<'d> = Vec::with_capacity(process_devices.len());
    let mut slowest_context = Duration::ZERO;
    for result in per_device {
        let (context, exported) = result?;
        slowest_context = slowest_context.max(context);
        exports.extend(exported);
    }
    exports.sort_by_key(|(index, _)| *index);
    for (index, export) in &exports {
        state.mem_handles[*index].store(export.buffer.handle());
        state.event_handles[*index].store(export.event.handle());
    }
    state.publish_ready();
    watch.lap_with_part(Step::AllocateExport, (Step::Context, slowest_context));
    Ok(exports.into_iter().map(|(_, e)| e).collect())
}

/// One device's share of [`export_all`]: its context (timed), then the buffer and event of each of its processes.
fn export_device<'d>(
    driver: &'d dyn Driver,
    device: i32,
    process_devices: &[i32],
) -> Result<(Duration, Indexed<'d>)> {
    let start = Instant::now();
    driver.use_device(device).with_context(|| format!("making device {device} current"))?;
    let context = start.elapsed();
    let mut exported = Vec::new();
    for (index, _) in process_devices.iter().enumerate().filter(|(_, d)| **d == device) {
        let event = ExportedEvent::create(driver, device)?;
        let buffer = ExportedBuffer::allocate(driver, device, driver.buffer_size())
            .with_context(|| format!("buffer of process {index}"))?;
        exported.push((index, ProcessExports { event, buffer }));
    }
    Ok((context, exported))
}

/// `--timings` and `--json`: the parent's phases and what each child left in the segment.
fn report(cli: &Cli, state: &SharedState, parent: &Phases) -> Result<()> {
    if !cli.timings && cli.json.is_none() {
        return Ok(());
    }
    let children: Vec<Phases> = (0..state.process_count()).map(|i| Phases::read(state, i)).collect();
    if cli.timings {
        print!("{}", timings::table(parent, &children));
    }
    if let Some(path) = &cli.json {
        let extra = [
            ("processes", state.process_count().to_string()),
            ("procs_per_device", state.procs_per_device.load(Ordering::Relaxed).to_string()),
            ("buffer_bytes", state.data_size().to_string()),
            ("sequential", cli.sequential.to_string()),
        ];
        std::fs::write(path, timings::json(parent, &children, &extra))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
