//! The parent (the original's `parentProcess`), in the original's order: the segment (step 1), the device
//! filter (step 2), the exports (step 3, in `export`), the children (step 4, `children`), the wait for
//! them (step 5) and the clean-up (step 9). Each step is a few lines here; the tool's options reach it
//! through [`ParentExtras`].
//!
//! Unlike the original, the children start before the parent's exports: the first device's even before the
//! parent starts CUDA (they start theirs meanwhile, then wait in the segment for the plan), the others as
//! soon as the devices are chosen; they wait in the segment until the handles are there (`--sequential`
//! keeps the original's order). Ownership sets the clean-up order: the exports are declared before the
//! children, so the children are stopped and reaped before any buffer is freed.

use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Result;

use super::children::Children;
use super::export::{Exporter, descriptor_sockets};
use super::extras::{ParentExtras, Processes};
use crate::devices;
use crate::driver::Driver;
use crate::ipc::{Event, Mechanism, platform};
use crate::os::signals;
use crate::outcome::{Outcome, Waiver};
use crate::phases::timings::{Stopwatch, Timeout};
use crate::phases::{Phase, Who};
use crate::report::Findings;
use crate::segment::{self, RunPlan};
use crate::setup;
use crate::supervise::watchdog::Watchdog;

/// What the story itself is asked: the mechanism, how many processes per device, in which order the parent
/// exports and starts them, and what the children are told.
pub(crate) struct Sample {
    pub mechanism: Mechanism,
    pub procs_per_device: usize,
    /// `--sequential`: the original's order, the children started once everything is exported.
    pub sequential: bool,
    /// `--quiet`, which reaches the children.
    pub quiet: bool,
    /// The watchdog's limit (`--timeout`).
    pub timeout: Timeout,
}

/// `parentProcess`. `findings`: what the run found, for the document, however it ends.
pub(crate) fn parent_process(
    sample: &Sample,
    extras: &dyn ParentExtras,
    findings: &mut Findings,
) -> Result<Outcome> {
    let mechanism = sample.mechanism;
    let started = Instant::now();
    // Every wait below looks at --timeout; this ends the run where a call never returns (a hung cuInit, with
    // the first children waiting for the plan).
    let _watchdog = Watchdog::start(sample.timeout.deadline_from(started));
    let mut watch = Stopwatch::start(Who::Parent, Phase::CudaStart)?;
    print_line!("PP: lshmName = {}", segment::name_for(std::process::id()))?;
    // Step 1, sharedMemoryCreate: the segment simpleIPCshm<pid> (`segment`), and the guardian, which removes
    // the driver's files for our events if we are killed. Dropped in the reverse order of these declarations:
    // the children first (stopped and reaped), then the exports (events destroyed, buffers freed), CUDA,
    // the guardian, and the segment last.
    let (segment, guardian) = setup::segment_and_guardian()?;
    let state = segment.state();
    let cuda: Box<dyn Driver>;
    let exports;
    let mut children: Box<dyn Processes + '_>;
    // Still step 1, before the devices are chosen: where the children are this program's own, the first
    // device's are started now (the original starts them at step 4), so that their CUDA start overlaps the
    // parent's; they wait in the segment until the devices are chosen (`--sequential` keeps the original's
    // order: every child once everything is exported).
    // (--procs-per-device is at most MAX_PROCESSES, the parser's bound.)
    let early = match extras.children_come() && !sample.sequential && setup::cuda_library_here() {
        true => sample.procs_per_device,
        false => 0,
    };
    let (mut sockets, their_sockets) = descriptor_sockets(mechanism, extras.descriptor_sockets(early))?;
    let mut first = None;
    if early > 0 {
        first = Some(Children::spawn(
            &segment,
            0..early,
            false,
            sample.quiet,
            &their_sockets,
            started,
            sample.timeout,
        )?);
    }
    drop(their_sockets);
    // A waiver once children started: they stop quietly (the parent says why).
    let waived = |first: Option<Children>, waiver: Waiver| -> Result<Outcome> {
        state.waive();
        drop(first);
        Ok(waiver.into())
    };
    // Step 2, the original's device filter: unified addressing, the default compute mode, peers both ways
    // (`devices::select`).
    let chosen = match setup::cuda_and_devices(|| watch.enter(Phase::DeviceSelection), findings)? {
        Ok((driver, chosen)) => {
            cuda = driver;
            chosen
        }
        Err(waiver) => return waived(first, waiver),
    };
    let driver: &dyn Driver = &*cuda;
    // Step 2, continued: of those, the devices fit for the mechanism ("No CUDA devices support IPC": none).
    let (chosen, process_devices) = match fit_devices(sample, extras, driver, &chosen)? {
        Ok(fit) => fit,
        Err(waiver) => return waived(first, waiver),
    };
    let n = process_devices.len();
    extras.devices_chosen(driver, &chosen, n)?;
    // shm->nprocesses and shm->devices: who runs where; the children that started wait for it.
    let uuids =
        process_devices.iter().map(|&d| Ok(driver.device_info(d)?.uuid)).collect::<Result<Vec<_>>>()?;
    state.describe_run(&RunPlan {
        devices: &process_devices,
        uuids: &uuids,
        procs_per_device: sample.procs_per_device,
        data_size: segment::data_size(driver.simulated()),
        options: extras.options(),
        mechanism: mechanism.code(),
    });

    // What step 3 (export, below) needs: every process's buffer and event go on `devices`, their handles
    // into the segment (`export`); vmm and pool: a socket per child, whose other end it inherits, for the
    // descriptors.
    let (more_sockets, mut their_sockets) =
        descriptor_sockets(mechanism, extras.descriptor_sockets(n).saturating_sub(sockets.len()))?;
    sockets.extend(more_sockets);
    let exporter = Exporter {
        driver,
        state,
        chosen: &chosen,
        process_devices: &process_devices,
        mechanism,
        extras: extras.export(),
        sockets,
        guardian: &guardian,
    };
    // How step 4 (spawnProcess, below) starts the processes: this program again, as child INDEX with the
    // segment (`Children::spawn`), those not started yet; or the processes the tool lets in instead
    // (`--serve`, `--isolate`).
    let (segment, guardian) = (&segment, &guardian);
    let spawn = move |their_sockets: &mut Vec<_>| {
        let processes: Box<dyn Processes + '_> = match first {
            Some(mut first) => {
                first.spawn_more(early..n, their_sockets)?;
                Box::new(first)
            }
            None => match extras.others(segment, guardian, n, their_sockets, started)? {
                Some(others) => others,
                None => Box::new(Children::spawn(
                    segment,
                    0..n,
                    false,
                    sample.quiet,
                    their_sockets,
                    started,
                    sample.timeout,
                )?),
            },
        };
        anyhow::Ok(processes)
    };
    // Steps 3 and 4. The original exports, then spawns (`--sequential`); here the children start first, so
    // that their CUDA start-up overlaps the exports.
    if sample.sequential {
        // Step 3, export; then step 4, spawn.
        watch.enter(Phase::AllocateExport)?;
        exports = match missing_waived(exporter.export_all(&mut watch, Phase::StartChildren, &mut || Ok(())))?
        {
            Ok(exported) => exported,
            Err(reason) => return Ok(lacking(mechanism, reason).into()),
        };
        children = spawn(&mut their_sockets)?;
    } else {
        // Step 4, spawn (the rest of the processes); then step 3, export, meanwhile watching the processes
        // and admitting joiners as they come.
        watch.enter(Phase::StartChildren)?;
        children = spawn(&mut their_sockets)?;
        watch.enter(Phase::AllocateExport)?;
        let exported = exporter.export_all(&mut watch, Phase::WaitChildren, &mut || children.check_alive());
        exports = match missing_waived(exported)? {
            Ok(exported) => exported,
            Err(reason) => {
                state.waive();
                children.stop();
                return Ok(lacking(mechanism, reason).into());
            }
        };
    }
    drop(their_sockets);

    // Step 5, waitProcess for each: until every child has verified its buffer and closed what it opened;
    // the first that fails stops the others.
    watch.enter(Phase::WaitChildren)?;
    let all_finished = || state.finished.load(Ordering::Acquire) as usize == n;
    let mut names_removed = false;
    children.wait(&all_finished, &mut || {
        // Once every child has opened the handles, the driver's own files for the events need no name any more.
        if !names_removed && state.opened.load(Ordering::Acquire) as usize == n {
            names_removed = true;
            for event in exports.iter().filter_map(|e| e.event.as_ref()) {
                if let Err(e) = event.remove_file_name() {
                    eprint_line!("warning: removing the name of an event's file: {e:#}");
                }
            }
        }
    })?;
    // Step 9, clean up, as the original: wait for each event's last work (cudaEventSynchronize), destroy the
    // events and free the buffers (cudaEventDestroy, cudaFree); release CUDA while the children tear their
    // own contexts down (that takes longer than the whole round-robin); then collect their exit statuses.
    watch.enter(Phase::CleanUp)?;
    for export in &exports {
        if let Some(event) = &export.event {
            event.synchronize(&signals::check)?;
        }
    }
    extras.check_every_buffer(&mut watch, driver, &exports, &process_devices, state)?;
    drop(exports);
    drop(cuda);
    watch.enter(Phase::WaitChildren)?;
    children.wait(&|| false, &mut || {})?;

    findings.results = Some(extras.results(state, &watch.finish())?);
    Ok(Outcome::passed(extras.summary(n, chosen.len())?))
}

/// `Err` with the reason where the export found the mechanism missing on a device.
fn missing_waived<T>(exported: Result<T>) -> Result<Result<T, String>> {
    match exported.map_err(|e| e.downcast::<Waiver>()) {
        Ok(exported) => Ok(Ok(exported)),
        Err(Ok(Waiver(reason))) => Ok(Err(reason)),
        Err(Err(e)) => Err(e),
    }
}

/// The devices fit for the mechanism, and the device of each process (one per process).
type FitDevices = (Vec<i32>, Vec<i32>);

/// The devices fit for the mechanism and the tool's options, and the device of each process; or why this
/// host cannot run it: the tool's own refusal, then each chosen device's attributes for the mechanism and
/// for the tool's options, then the platform (MIG instances, WSL2). A device that lacks what the mechanism
/// needs is skipped with its reason, as the original's filter skips one without unified addressing; the
/// run is waived only where no device is left. Legacy is asked by an export, on the device's context, in
/// `export_device`: creating the context here would hold the children back.
fn fit_devices(
    sample: &Sample,
    extras: &dyn ParentExtras,
    driver: &dyn Driver,
    chosen: &[i32],
) -> Result<std::result::Result<FitDevices, Waiver>> {
    let mechanism = sample.mechanism;
    if let Some(waiver) = extras.refusal(mechanism) {
        return Ok(Err(waiver));
    }
    let (mut fit, mut first_lack) = (Vec::new(), None);
    for &device in chosen {
        let lack = match mechanism.unsupported_by_attributes(driver, device)? {
            Some(reason) => Some((format!("--ipc {}", mechanism.name()), reason)),
            None => extras.lacks(driver, device)?,
        };
        match lack {
            None => fit.push(device),
            Some((option, reason)) => {
                print_line!("Device {device} cannot run {option} ({reason}), skipping...")?;
                first_lack.get_or_insert((option, reason));
            }
        }
    }
    if fit.is_empty()
        && let Some((option, reason)) = first_lack
    {
        return Ok(Err(Waiver(format!("No CUDA devices support IPC with {option} ({reason})"))));
    }
    let process_devices = devices::plan(&fit, sample.procs_per_device)?;
    Ok(match platform::waiver(driver, mechanism, &process_devices)? {
        Some(reason) => Err(lacking(mechanism, reason)),
        None => Ok((fit, process_devices)),
    })
}

/// `mechanism` waived: these devices lack it, for `reason`.
fn lacking(mechanism: Mechanism, reason: String) -> Waiver {
    Waiver(format!("No CUDA devices support IPC with --ipc {} ({reason})", mechanism.name()))
}
