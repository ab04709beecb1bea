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
use crate::driver::Driver;
use crate::driver_files;
use crate::fault::{self, Who};
use crate::guardian::Guardian;
use crate::ipc::{Event, ExportedBuffer, ExportedEvent, ProcessExports};
use crate::output::JsonFile;
use crate::phase::Phase;
use crate::segment::{self, RunPlan, Segment, SharedState};
use crate::signals;
use crate::timings::{self, Phases, Stopwatch};

pub fn run(cli: &Cli) -> Result<Outcome> {
    let started = Instant::now();
    let mut watch = Stopwatch::start(Who::Parent, Phase::CudaStart)?;
    // Opened before anything runs: a bad path fails at once, and a FIFO can never block the end of a run.
    let json = cli.json.as_deref().map(JsonFile::create).transpose()?;
    let name = segment::name_for(std::process::id());
    say!("PP: lshmName = {name}")?;
    let segment = Segment::create(&name)?;
    let state = segment.state();
    // Removes the driver's files for our events if we are killed.
    let _guardian = Guardian::start()?;

    let Some(cuda) = devices::load_or_waive()? else { return Ok(Outcome::Waived) };
    let driver: &dyn Driver = &*cuda;

    watch.enter(Phase::DeviceSelection)?;
    let chosen = devices::select(driver)?;
    if chosen.is_empty() {
        say!("No CUDA devices support IPC")?;
        return Ok(Outcome::Waived);
    }
    let process_devices = devices::plan(&chosen, cli.procs_per_device as usize)?;
    fault::validate_for(process_devices.len())?;
    state.describe_run(&RunPlan {
        devices: &process_devices,
        procs_per_device: cli.procs_per_device as usize,
        data_size: segment::data_size(driver.simulated()),
        options: if cli.bind_numa { segment::OPTION_BIND_NUMA } else { 0 },
    });

    // Declared before the children: dropped (events synchronised and destroyed, buffers freed) after them.
    let exports;
    let mut children;
    if cli.sequential {
        watch.enter(Phase::AllocateExport)?;
        exports = export_all(driver, state, &chosen, &process_devices, &mut watch, Phase::StartChildren)?;
        children = Children::spawn(&segment, 0..process_devices.len(), &[], started, cli.timeout())?;
    } else {
        watch.enter(Phase::StartChildren)?;
        children = Children::spawn(&segment, 0..process_devices.len(), &[], started, cli.timeout())?;
        watch.enter(Phase::AllocateExport)?;
        exports = export_all(driver, state, &chosen, &process_devices, &mut watch, Phase::WaitChildren)?;
    }

    watch.enter(Phase::WaitChildren)?;
    let n = process_devices.len();
    let all_finished = || state.finished.load(Ordering::Acquire) as usize == n;
    let mut names_removed = false;
    children.wait(all_finished, || {
        // Once every child has opened the handles, the driver's own files for them need no name any more.
        if !names_removed && state.opened.load(Ordering::Acquire) as usize == n {
            names_removed = true;
            if let Err(e) = driver_files::remove_event_files_of(std::process::id()) {
                warn!("warning: {e:#}");
            }
        }
    })?;
    // Every child has verified and closed what it opened: as the original, wait for each event's last work,
    // destroy the events and free the buffers; release CUDA while the children tear their own contexts down
    // (that takes longer than the whole round-robin); then collect their exit statuses.
    watch.enter(Phase::CleanUp)?;
    for export in &exports {
        driver.use_device(export.device)?;
        export.event.synchronize(&signals::check)?;
    }
    drop(exports);
    drop(cuda);
    watch.enter(Phase::WaitChildren)?;
    children.wait(|| false, || {})?;

    report(cli, json, state, &watch.finish())?;
    Ok(Outcome::Passed)
}

/// The exports of some processes, with their indices.
type Indexed<'d> = Vec<(usize, ProcessExports<'d>)>;

/// Makes each chosen device's context current, allocates and exports every process's buffer and event into
/// the segment, then lets the children go on. Several devices are set up in parallel, one thread each.
/// `next` is the phase the parent enters when the handles are published.
fn export_all<'d>(
    driver: &'d dyn Driver,
    state: &SharedState,
    chosen: &[i32],
    process_devices: &[i32],
    watch: &mut Stopwatch,
    next: Phase,
) -> Result<Vec<ProcessExports<'d>>> {
    let per_device: Vec<Result<(Duration, Indexed<'d>)>> = std::thread::scope(|scope| {
        let mut workers = Vec::with_capacity(chosen.len());
        for &device in chosen {
            let worker = std::thread::Builder::new()
                .spawn_scoped(scope, move || export_device(driver, device, process_devices))
                .with_context(|| format!("starting the set-up thread of device {device}"));
            workers.push(worker);
        }
        let joined = workers
            .into_iter()
            .map(|worker| worker?.join().unwrap_or_else(|_| Err(anyhow!("a device set-up thread failed"))));
        joined.collect()
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
    watch.enter_with_part(next, Some((Phase::Context, slowest_context)))?;
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
        let buffer = ExportedBuffer::allocate(driver, device, segment::data_size(driver.simulated()))
            .with_context(|| format!("buffer of process {index}"))?;
        exported.push((index, ProcessExports { device, event, buffer }));
    }
    Ok((context, exported))
}

/// `--timings` and `--json`: the parent's phases and what each child left in the segment.
fn report(cli: &Cli, json: Option<JsonFile>, state: &SharedState, parent: &Phases) -> Result<()> {
    if !cli.timings && json.is_none() {
        return Ok(());
    }
    let children: Vec<Phases> = (0..state.process_count()).map(|i| Phases::read(state, i)).collect();
    if cli.timings {
        crate::output::text(&timings::table(parent, &children))?;
    }
    if let Some(json) = json {
        let extra = [
            ("processes", state.process_count().to_string()),
            ("procs_per_device", state.procs_per_device.load(Ordering::Relaxed).to_string()),
            ("buffer_bytes", state.data_size().to_string()),
            ("sequential", cli.sequential.to_string()),
            ("simulated", crate::driver::host::requested().to_string()),
        ];
        json.write(&timings::json(parent, &children, &extra))?;
    }
    Ok(())
}
