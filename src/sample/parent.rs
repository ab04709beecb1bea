//! The parent (the original's `parentProcess`): create the segment, choose the devices, start the children,
//! export one buffer and one event per child, wait for the children, clean up.
//!
//! Unlike the original, the children start as soon as the devices are chosen, so that their CUDA start-up
//! overlaps the parent's allocations; they wait in the segment until the handles are there (`--sequential`
//! keeps the original's order). Ownership sets the clean-up order: the exports are declared before the
//! children, so the children are stopped and reaped before any buffer is freed.

use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Result;

use crate::devices;
use crate::driver::Driver;
use crate::fault;
use crate::gpu::DeviceMemory;
use crate::ipc::{Event, Fds, Mechanism, Sync, platform};
use crate::joiners::Audience;
use crate::outcome::{Outcome, Waiver};
use crate::phase::{Phase, Who};
use crate::report::document::RunResults;
use crate::report::{Found, Ran, Results};
use crate::role::{Run, Served};
use crate::segment::{self, RunPlan, SharedState};
use crate::setup;
use crate::signals;
use crate::timings::{self, Phases, Stopwatch};
use crate::verify;

mod export;
mod isolated;
mod team;

use export::{Exporter, descriptor_sockets};
use team::Team;

pub fn run(run: &Run, mechanism: Mechanism, served: Option<&Served>) -> Result<Ran> {
    // Served, each joiner is told how the whole run ended once it is over: its verdict is the run's. A run
    // of a served sequence (`--serve --ipc all`) then hands every connection back to the sequence's top
    // parent, however it ended (waived before anyone joined, too).
    let audience = match served {
        Some(served) => Audience::in_sequence(served.round, &served.fds)?,
        None => Audience::default(),
    };
    let mut found = Found::default();
    let outcome = run_the_sample(run, mechanism, &audience, &mut found).unwrap_or_else(Outcome::Failed);
    audience.hand_over(&mut found);
    // Told once the document is written (`entry`), so that what the joiners hear is the verdict.
    let tell = crate::report::Tell(Box::new(move |ended: &Outcome| audience.tell(ended)));
    Ok(Ran { outcome, found, tell: Some(tell) })
}

/// `found`: what the run found, for the document, however it ends.
fn run_the_sample(
    run: &Run,
    mechanism: Mechanism,
    audience: &Audience,
    found: &mut Found,
) -> Result<Outcome> {
    let started = Instant::now();
    let mut watch = Stopwatch::start(Who::Parent, Phase::CudaStart)?;
    say!("PP: lshmName = {}", segment::name_for(std::process::id()))?;
    let setup = match setup::start(|| watch.enter(Phase::DeviceSelection), found)? {
        Ok(setup) => setup,
        Err(waiver) => return Ok(waiver.into()),
    };
    // Dropped in the reverse order: the guardian (which removes the driver's files for our events if we are
    // killed) outlives the exports, declared later, and the segment outlives all.
    let setup::Setup { segment, guardian, cuda, chosen } = setup;
    let state = segment.state();
    let driver: &dyn Driver = &*cuda;
    // Ask the devices and the kernel, do not assume: a mechanism this host lacks is waived, with its reason.
    let (chosen, process_devices) = match ask_the_host(run, mechanism, driver, &chosen)? {
        Ok(fit) => fit,
        Err(waiver) => return Ok(waiver.into()),
    };
    // MPS as the driver says it, not as a socket in a directory another user can make says it.
    let mps_enabled = chosen.iter().try_fold(false, |any, &device| {
        anyhow::Ok(any || driver.supports(device, crate::driver::Capability::MpsEnabled)?)
    })?;
    // --fds pidfd: the importers fetch the descriptors themselves.
    let pidfd = run.fds == Fds::Pidfd && mechanism.uses_descriptors();
    let n = process_devices.len();
    // Processes it did not start from its own program (`--serve`), or that run where it cannot see them
    // (`--isolate`), might say anything: the parent then checks every buffer itself before it says PASSED.
    let checks_itself = run.serve.is_some() || run.isolate.is_some();
    fault::validate_for(&fault::Targets {
        children: 0..n,
        parent: if checks_itself { Phase::PARENT_CHECKING } else { Phase::PARENT },
        child: Phase::CHILD,
        parent_sends_descriptors: mechanism.uses_descriptors() && !pidfd,
        parent_checks_buffers: checks_itself,
    })?;
    let uuids =
        process_devices.iter().map(|&d| Ok(driver.device_info(d)?.uuid)).collect::<Result<Vec<_>>>()?;
    state.describe_run(&RunPlan {
        devices: &process_devices,
        uuids: &uuids,
        procs_per_device: run.procs_per_device as usize,
        data_size: segment::data_size(driver.simulated()),
        options: if run.bind_numa { segment::OPTION_BIND_NUMA } else { 0 }
            | match run.sync {
                Sync::Memops => segment::OPTION_SYNC_MEMOPS,
                Sync::Events => 0,
            }
            | if pidfd { segment::OPTION_FDS_PIDFD } else { 0 },
        mechanism: mechanism.code(),
    });
    // vmm and pool: a socket per child, whose other end it inherits, for the descriptors.
    // With --fds pidfd, none: each importer fetches the descriptors by the numbers in the segment.
    let (sockets, mut their_sockets) = descriptor_sockets(mechanism, if pidfd { 0 } else { n })?;
    let exporter = Exporter {
        driver,
        state,
        chosen: &chosen,
        process_devices: &process_devices,
        mechanism,
        sync: run.sync,
        unwritten: checks_itself,
        sockets,
        guardian: &guardian,
    };

    // Declared before the children: dropped (events destroyed, buffers freed) after them.
    let exports;
    let mut children;
    if run.sequential {
        watch.enter(Phase::AllocateExport)?;
        exports = match missing_waived(exporter.export_all(&mut watch, Phase::StartChildren))? {
            Ok(exported) => exported,
            Err(reason) => return Ok(lacking(mechanism, reason).into()),
        };
        children = Team::start(run, &segment, n, &mut their_sockets, started, audience, &guardian)?;
    } else {
        watch.enter(Phase::StartChildren)?;
        children = Team::start(run, &segment, n, &mut their_sockets, started, audience, &guardian)?;
        watch.enter(Phase::AllocateExport)?;
        exports = match missing_waived(exporter.export_all(&mut watch, Phase::WaitChildren))? {
            Ok(exported) => exported,
            Err(reason) => {
                state.waive();
                children.stop();
                return Ok(lacking(mechanism, reason).into());
            }
        };
    }
    drop(their_sockets);

    watch.enter(Phase::WaitChildren)?;
    let all_finished = || state.finished.load(Ordering::Acquire) as usize == n;
    let mut names_removed = false;
    children.wait(all_finished, || {
        // Once every child has opened the handles, the driver's own files for the events need no name any more.
        if !names_removed && state.opened.load(Ordering::Acquire) as usize == n {
            names_removed = true;
            for event in exports.iter().filter_map(|e| e.event.as_ref()) {
                if let Err(e) = event.remove_file_name() {
                    warn!("warning: removing the name of an event's file: {e:#}");
                }
            }
        }
    })?;
    // Every child has verified and closed what it opened: as the original, wait for each event's last work,
    // destroy the events and free the buffers; release CUDA while the children tear their own contexts down
    // (that takes longer than the whole round-robin); then collect their exit statuses.
    watch.enter(Phase::CleanUp)?;
    for export in &exports {
        if let Some(event) = &export.event {
            event.synchronize(&signals::check)?;
        }
    }
    if checks_itself {
        watch.enter(Phase::Verify)?;
        let buffers: Vec<&dyn DeviceMemory> =
            exports.iter().map(|e| &e.buffer as &dyn DeviceMemory).collect();
        verify::every_buffer(driver, &buffers, &process_devices, state.data_size(), &signals::check)?;
        watch.enter(Phase::CleanUp)?;
    }
    drop(exports);
    drop(cuda);
    watch.enter(Phase::WaitChildren)?;
    children.wait(|| false, || {})?;

    found.results = Some(report(run, state, &watch.finish(), checks_itself)?);
    let gpus = chosen.len();
    // The parent's own check of its pipe directory: its children inherit it; joiners were told nothing.
    let mps = crate::placement::mps::Mps::here();
    if let (false, Some(what)) = (mps.client, &mps.answered) {
        say!("MPS: the control socket in {} is {what}: this run was no MPS client", mps.pipe_directory)?;
    }
    if let Some(said) = mps.not_confirmed(mps_enabled) {
        say!("{said}")?;
    }
    let mps = mps.under(mps_enabled).map(|under| format!(", {under}")).unwrap_or_default();
    let summary = format!(
        "{n} process{} on {gpus} GPU{}, {} IPC{}, {}{mps}{}: {}",
        if n == 1 { "" } else { "es" },
        if gpus == 1 { "" } else { "s" },
        mechanism.name(),
        if pidfd { " (descriptors by pidfd_getfd)" } else { "" },
        run.sync.name(),
        match (&run.serve, &run.isolate) {
            (Some(_), _) => ", joined over the socket".to_owned(),
            (_, Some(isolation)) => format!(", isolated ({})", isolation.described()),
            _ => String::new(),
        },
        // Only what this process saw: a process it did not start from its own program (`--serve`), or that
        // runs where it cannot see it (`--isolate`), may say anything of itself, and one of the same uid could
        // forge every buffer's bytes (it could ptrace the server); the buffers' contents the parent read.
        match (&run.serve, checks_itself) {
            (Some(_), _) => "every buffer holds the round-robin's result, checked by the server",
            (None, true) => "every buffer holds the round-robin's result, checked by the parent",
            (None, false) => "every buffer verified",
        }
    );
    Ok(Outcome::passed(summary))
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

/// The devices fit for `mechanism` as `run` asks, and the device of each process; or why this host cannot
/// run it: the kernel's `pidfd_getfd` for `--fds pidfd`, each chosen device's attributes for the mechanism
/// and for `--sync memops`, then the platform (MIG instances, WSL2). A device that lacks what the mechanism
/// needs is skipped with its reason, as the original's filter skips one without unified addressing; the
/// run is waived only where no device is left. Legacy is asked by an export, on the device's context, in
/// `export_device`: creating the context here would hold the children back.
fn ask_the_host(
    run: &Run,
    mechanism: Mechanism,
    driver: &dyn Driver,
    chosen: &[i32],
) -> Result<std::result::Result<FitDevices, Waiver>> {
    if run.fds == Fds::Pidfd
        && mechanism.uses_descriptors()
        && let Some(reason) = crate::ipc::pidfd::unsupported()
    {
        // The kernel's lack, not the devices': said as such.
        return Ok(Err(Waiver(format!("--ipc {} cannot run here with {reason}", mechanism.name()))));
    }
    let (mut fit, mut first_lack) = (Vec::new(), None);
    for &device in chosen {
        let lack = match mechanism.unsupported_by_attributes(driver, device)? {
            Some(reason) => Some((format!("--ipc {}", mechanism.name()), reason)),
            None => driver
                .stream_memops_unsupported(device)?
                .filter(|_| run.sync == Sync::Memops)
                .map(|reason| ("--sync memops".to_owned(), reason)),
        };
        match lack {
            None => fit.push(device),
            Some((option, reason)) => {
                say!("Device {device} cannot run {option} ({reason}), skipping...")?;
                first_lack.get_or_insert((option, reason));
            }
        }
    }
    if fit.is_empty()
        && let Some((option, reason)) = first_lack
    {
        return Ok(Err(Waiver(format!("No CUDA devices support IPC with {option} ({reason})"))));
    }
    let process_devices = devices::plan(&fit, run.procs_per_device as usize)?;
    Ok(match platform::waiver(driver, mechanism, &process_devices)? {
        Some(reason) => Err(lacking(mechanism, reason)),
        None => Ok((fit, process_devices)),
    })
}

/// `mechanism` waived: these devices lack it, for `reason`.
fn lacking(mechanism: Mechanism, reason: String) -> Waiver {
    Waiver(format!("No CUDA devices support IPC with --ipc {} ({reason})", mechanism.name()))
}

/// `--timings`: the parent's phases and what each child left in the segment; and the results for `--json`.
fn report(run: &Run, state: &SharedState, parent: &Phases, checked_every_buffer: bool) -> Result<Results> {
    if run.timings {
        let children: Vec<Phases> = (0..state.process_count()).map(|i| Phases::read(state, i)).collect();
        crate::output::text(&timings::table(parent, &children))?;
    }
    Ok(Results::Run(RunResults::of(state, parent, checked_every_buffer)))
}
