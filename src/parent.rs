//! The parent (the original's `parentProcess`): create the segment, choose the devices, start the children,
//! export one buffer and one event per child, wait for the children, clean up.
//!
//! Unlike the original, the children start as soon as the devices are chosen, so that their CUDA start-up
//! overlaps the parent's allocations; they wait in the segment until the handles are there (`--sequential`
//! keeps the original's order). Ownership sets the clean-up order: the exports are declared before the
//! children, so the children are stopped and reaped before any buffer is freed.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

use crate::children::Children;
use crate::cli::{Cli, Fds, Sync};
use crate::devices;
use crate::driver::Driver;
use crate::fault;
use crate::gpu::{DeviceMemory, Stream};
use crate::guardian::Guardian;
use crate::ipc::{
    Event, ExportedBuffer, ExportedEvent, Mechanism, Missing, ProcessExports, Slice, descriptors, platform,
};
use crate::isolation;
use crate::joiners::{Audience, Joiners};
use crate::meeting::Address;
use crate::outcome::Outcome;
use crate::phase::{Phase, Who};
use crate::report::document::RunResults;
use crate::report::{JsonFile, Results};
use crate::segment::{self, RunPlan, Segment, SharedState};
use crate::setup;
use crate::signals;
use crate::timings::{self, Phases, Stopwatch};
use crate::verify;

pub fn run(cli: &Cli, mechanism: Mechanism) -> Result<Outcome> {
    // Served, each joiner is told how the whole run ended once it is over: its verdict is the run's. A run
    // of a served sequence (`--serve --ipc all`) then hands every connection back to the sequence's top
    // parent, however it ended (waived before anyone joined, too).
    let audience = match (cli.serve_round, &cli.served_fds) {
        (Some(round), Some(fds)) => Audience::in_sequence(round, fds)?,
        _ => Audience::default(),
    };
    let outcome = run_the_sample(cli, mechanism, &audience);
    audience.tell(&outcome);
    outcome
}

fn run_the_sample(cli: &Cli, mechanism: Mechanism, audience: &Audience) -> Result<Outcome> {
    let started = Instant::now();
    let mut watch = Stopwatch::start(Who::Parent, Phase::CudaStart)?;
    // Opened before anything runs: a bad path fails at once, and a FIFO can never block the end of a run.
    let json = JsonFile::requested();
    say!("PP: lshmName = {}", segment::name_for(std::process::id()))?;
    let Some(setup) = setup::start(|| watch.enter(Phase::DeviceSelection))? else {
        return Ok(Outcome::Waived);
    };
    // Dropped in the reverse order: the guardian (which removes the driver's files for our events if we are
    // killed) outlives the exports, declared later, and the segment outlives all.
    let setup::Setup { segment, guardian, cuda, chosen } = setup;
    let state = segment.state();
    let driver: &dyn Driver = &*cuda;
    // Ask the devices, do not assume: a mechanism this host lacks is waived, with its reason.
    let memops = cli.sync == Sync::Memops;
    // --fds pidfd: the importers fetch the descriptors themselves; asked of this kernel by trial first.
    let pidfd = cli.fds == Fds::Pidfd && mechanism.uses_descriptors();
    if let Some(reason) = crate::ipc::pidfd::unsupported().filter(|_| pidfd) {
        waive!("No CUDA devices support IPC with --ipc {} ({reason})", mechanism.name())?;
        return Ok(Outcome::Waived);
    }
    for &device in &chosen {
        // Legacy is asked by an export, on the device's context, in `export_device`: creating the context here
        // would hold the children back.
        if let Some(reason) = mechanism.unsupported_by_attributes(driver, device)? {
            waive!("No CUDA devices support IPC with --ipc {} ({reason})", mechanism.name())?;
            return Ok(Outcome::Waived);
        }
        if let Some(reason) = driver.stream_memops_unsupported(device)?.filter(|_| memops) {
            waive!("No CUDA devices support IPC with --sync memops ({reason})")?;
            return Ok(Outcome::Waived);
        }
    }
    let process_devices = devices::plan(&chosen, cli.procs_per_device as usize)?;
    if let Some(reason) = platform::waiver(driver, mechanism, &process_devices)? {
        waive!("No CUDA devices support IPC with --ipc {} ({reason})", mechanism.name())?;
        return Ok(Outcome::Waived);
    }
    let n = process_devices.len();
    // Processes it did not start from its own program (`--serve`), or that run where it cannot see them
    // (`--isolate`), might say anything: the parent then checks every buffer itself before it says PASSED.
    let checks_itself = cli.serve.is_some() || cli.isolate.is_some();
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
        procs_per_device: cli.procs_per_device as usize,
        data_size: segment::data_size(driver.simulated()),
        options: if cli.bind_numa { segment::OPTION_BIND_NUMA } else { 0 }
            | if memops { segment::OPTION_SYNC_MEMOPS } else { 0 }
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
        memops,
        unwritten: checks_itself,
        sockets,
        guardian: &guardian,
    };

    // Declared before the children: dropped (events destroyed, buffers freed) after them.
    let exports;
    let mut children;
    if cli.sequential {
        watch.enter(Phase::AllocateExport)?;
        let Some(exported) =
            waived_if_missing(mechanism, exporter.export_all(&mut watch, Phase::StartChildren))?
        else {
            return Ok(Outcome::Waived);
        };
        exports = exported;
        children = Team::start(cli, &segment, n, &mut their_sockets, started, audience, &guardian)?;
    } else {
        watch.enter(Phase::StartChildren)?;
        children = Team::start(cli, &segment, n, &mut their_sockets, started, audience, &guardian)?;
        watch.enter(Phase::AllocateExport)?;
        let Some(exported) =
            waived_if_missing(mechanism, exporter.export_all(&mut watch, Phase::WaitChildren))?
        else {
            state.waive();
            children.stop();
            return Ok(Outcome::Waived);
        };
        exports = exported;
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

    report(cli, json, state, &watch.finish(), checks_itself)?;
    let gpus = chosen.len();
    // The parent's own check of its pipe directory: its children inherit it; joiners were told nothing.
    let mps =
        crate::placement::mps::Mps::here().under().map(|under| format!(", {under}")).unwrap_or_default();
    crate::report::note_summary(format!(
        "{n} process{} on {gpus} GPU{}, {} IPC{}, {}{mps}{}: every buffer verified{}",
        if n == 1 { "" } else { "es" },
        if gpus == 1 { "" } else { "s" },
        mechanism.name(),
        if pidfd { " (descriptors by pidfd_getfd)" } else { "" },
        if memops { "memops" } else { "events" },
        match (&cli.serve, &cli.isolate) {
            (Some(_), _) => ", joined over the socket".to_owned(),
            (_, Some(isolation)) => format!(", isolated ({})", isolation.described()),
            _ => String::new(),
        },
        match (&cli.serve, checks_itself) {
            (Some(_), _) => " by its process and by the server",
            (None, true) => " by its process and by the parent",
            (None, false) => "",
        }
    ));
    Ok(Outcome::Passed)
}

/// The run's other processes: the children this parent starts, the processes that join it (`--serve`), or
/// the processes it starts in namespaces of their own, which join it (`--isolate`).
enum Team<'s> {
    Started(Children<'s>),
    Joined(Joiners<'s>),
    /// Dropped in this order: the joiners' connections close, then the processes end.
    Isolated(Joiners<'s>, isolation::Launched<'s>),
}

impl<'s> Team<'s> {
    /// Starts the children, or, with `--serve`, listens for the processes that join instead (each gets its
    /// end of its descriptor socket from `their_sockets` when it joins, and is told how the run ended by
    /// `audience`).
    fn start(
        cli: &Cli,
        segment: &'s Segment,
        n: usize,
        their_sockets: &mut Vec<OwnedFd>,
        started: Instant,
        audience: &'s Audience,
        guardian: &'s Guardian,
    ) -> Result<Self> {
        if let Some(isolation) = &cli.isolate {
            let mut launched = isolation::Launched::prepare(isolation, guardian)?;
            let address = launched.address();
            let sockets = std::mem::take(their_sockets);
            let joiners = Joiners::listen(segment, address.clone(), n, sockets, started, cli.timeout())?
                .covered_by(guardian)
                .removing_the_socket_when_full();
            launched.start(&address, n, isolation, cli.timeout, cli.quiet)?;
            let joiners = joiners.only_started_by(launched.pids());
            say!(
                "Isolated ({isolation}): {n} processes started in namespaces of their own join at {address}"
            )?;
            return Ok(Team::Isolated(joiners, launched));
        }
        let Some(address) = &cli.serve else {
            // --quiet reaches the children: they print nothing either.
            let args: &[&str] = if cli.quiet { &["--quiet"] } else { &[] };
            let children = Children::spawn(segment, 0..n, args, their_sockets, started, cli.timeout())?;
            return Ok(Team::Started(children));
        };
        let address = Address::parse(address).with_context(|| format!("--serve {address}"))?;
        let sockets = std::mem::take(their_sockets);
        let joiners = match cli.serve_round {
            Some(_) => Joiners::in_sequence(segment, audience, n, sockets, started, cli.timeout())?,
            None => Joiners::listen(segment, address.clone(), n, sockets, started, cli.timeout())?
                .covered_by(guardian)
                .telling_the_end_to(audience),
        };
        let processes = if n == 1 { "process" } else { "processes" };
        say!(
            "Serving the run at {address}: waiting for {n} {processes} to join (--join {address}), {}",
            gpus_of(segment.state(), n)
        )?;
        Ok(Team::Joined(joiners))
    }

    /// Waits until each has ended well, or `enough()`; the first failure stops the others (see
    /// `Children::wait` and `Joiners::wait`).
    fn wait(&mut self, enough: impl Fn() -> bool, mut tick: impl FnMut()) -> Result<()> {
        match self {
            Team::Started(children) => children.wait(enough, tick),
            Team::Joined(joiners) => joiners.wait(&enough, &mut tick, &mut || None),
            Team::Isolated(joiners, launched) => {
                joiners.wait(&enough, &mut tick, &mut || launched.ended_early())
            }
        }
    }

    fn stop(&mut self) {
        match self {
            Team::Started(children) => children.stop(None),
            Team::Joined(joiners) | Team::Isolated(joiners, ..) => joiners.stop(),
        }
    }
}

/// The GPUs the processes run on, each with its UUID and how many processes it takes: `for GPU 0
/// (GPU-...) x2 and GPU 1 (GPU-...) x2` (a joiner must see the GPU it is given).
fn gpus_of(state: &SharedState, n: usize) -> String {
    let mut gpus: Vec<(i32, String, usize)> = Vec::new();
    for index in 0..n {
        let uuid =
            state.device_uuid_of(index).map_or_else(|| "?".to_owned(), |u| crate::driver::uuid_text(&u));
        match gpus.iter_mut().find(|(device, ..)| *device == state.device_of(index)) {
            Some((.., count)) => *count += 1,
            None => gpus.push((state.device_of(index), uuid, 1)),
        }
    }
    let each: Vec<String> =
        gpus.iter().map(|(device, uuid, count)| format!("GPU {device} ({uuid}) x{count}")).collect();
    format!("for {}", each.join(" and "))
}

/// The exports of some processes, with their indices.
type Indexed<'d> = Vec<(usize, ProcessExports<'d>)>;

/// `None`, after printing the waived line, when the export found the mechanism missing on a device.
fn waived_if_missing<T>(mechanism: Mechanism, exported: Result<T>) -> Result<Option<T>> {
    match exported {
        Ok(exported) => Ok(Some(exported)),
        Err(e) => match e.downcast::<Missing>() {
            Ok(Missing(reason)) => {
                waive!("No CUDA devices support IPC with --ipc {} ({reason})", mechanism.name())?;
                Ok(None)
            }
            Err(e) => Err(e),
        },
    }
}

/// For vmm and pool, one socket pair per child: the parent's ends, and the ends the children inherit.
fn descriptor_sockets(mechanism: Mechanism, n: usize) -> Result<(Vec<OwnedFd>, Vec<OwnedFd>)> {
    if !mechanism.uses_descriptors() {
        return Ok((Vec::new(), Vec::new()));
    }
    (0..n).map(|_| descriptors::pair()).collect::<Result<Vec<_>>>().map(|pairs| pairs.into_iter().unzip())
}

/// What the parent needs to export every process's buffer and event.
struct Exporter<'a, 'd> {
    driver: &'d dyn Driver,
    state: &'a SharedState,
    chosen: &'a [i32],
    process_devices: &'a [i32],
    mechanism: Mechanism,
    /// `--sync memops`: each buffer has a flag after its data, zeroed before the children may use it.
    memops: bool,
    /// Each buffer's data is filled with [`verify::UNWRITTEN`] first, for the parent's own check.
    unwritten: bool,
    /// The parent's end of each child's descriptor socket (vmm and pool only).
    sockets: Vec<OwnedFd>,
    /// Told of each event's file as soon as it exists.
    guardian: &'a Guardian,
}

impl<'d> Exporter<'_, 'd> {
    /// Makes each chosen device's context current, allocates and exports every process's buffer and event
    /// into the segment (and, for vmm and pool, sends every child the descriptors), then lets the children go
    /// on. Several devices are set up in parallel, one thread each. `next` is the phase the parent enters when
    /// the handles are published.
    fn export_all(self, watch: &mut Stopwatch, next: Phase) -> Result<Vec<ProcessExports<'d>>> {
        let this = &self;
        let per_device: Vec<Result<(Duration, Indexed<'d>)>> = std::thread::scope(|scope| {
            let mut workers = Vec::with_capacity(this.chosen.len());
            for &device in this.chosen {
                let worker = std::thread::Builder::new()
                    .spawn_scoped(scope, move || this.export_device(device))
                    .with_context(|| format!("starting the set-up thread of device {device}"));
                workers.push(worker);
            }
            let joined = workers.into_iter().map(|worker| {
                worker?.join().unwrap_or_else(|_| Err(anyhow!("a device set-up thread failed")))
            });
            joined.collect()
        });
        let mut exports: Indexed<'d> = Vec::with_capacity(self.process_devices.len());
        let mut slowest_context = Duration::ZERO;
        for result in per_device {
            let (context, exported) = result?;
            slowest_context = slowest_context.max(context);
            exports.extend(exported);
        }
        exports.sort_by_key(|(index, _)| *index);
        for (index, export) in &exports {
            self.state.mem_handles[*index].store(export.buffer.handle());
            if let Some(descriptor) = export.buffer.descriptor() {
                self.state.descriptor_numbers[*index].store(descriptor.as_raw_fd(), Ordering::Relaxed);
            }
            if let Some(event) = &export.event {
                self.state.publish_event(*index, event.handle(), event.file());
            }
        }
        let exports: Vec<ProcessExports<'d>> = exports.into_iter().map(|(_, e)| e).collect();
        self.send_descriptors(&exports)?;
        self.state.publish_ready();
        // Not needed for IPC, but it sets the peers up, as the original does; the children go on meanwhile.
        devices::enable_peers(self.driver, self.chosen)?;
        watch.enter_with_part(next, Some((Phase::Context, slowest_context)))?;
        Ok(exports)
    }

    /// One device's share of [`Exporter::export_all`]: its context (timed), then the buffer and event of each
    /// of its processes.
    fn export_device(&self, device: i32) -> Result<(Duration, Indexed<'d>)> {
        let driver = self.driver;
        let start = Instant::now();
        driver.use_device(device).with_context(|| format!("making device {device} current"))?;
        let context = start.elapsed();
        // A mechanism with a trial (legacy: a small export) is asked now that the device has a context.
        if let Some(probe) = self.mechanism.spec().probe
            && let Some(reason) = probe(driver, device)?
        {
            return Err(Missing(reason).into());
        }
        let mut exported = Vec::new();
        let data = self.state.data_size();
        let flag = if self.memops { segment::FLAG_BYTES } else { 0 };
        let stream =
            if self.memops || self.unwritten { Some(Stream::non_blocking(driver, device)?) } else { None };
        for (index, _) in self.process_devices.iter().enumerate().filter(|(_, d)| **d == device) {
            // --sync memops orders the round-robin without interprocess events: it makes none.
            let event = match self.memops {
                true => None,
                false => Some(
                    self.guardian.covering(|| ExportedEvent::create(driver, device), ExportedEvent::file)?,
                ),
            };
            let buffer = ExportedBuffer::allocate(driver, self.mechanism, device, data + flag)
                .with_context(|| format!("the {} buffer of process {index}", self.mechanism.name()))?;
            if let Some(stream) = &stream {
                if self.memops {
                    stream.fill(&Slice::of(&buffer, data, flag)?, 0, flag)?; // no write done yet
                }
                if self.unwritten {
                    stream.fill(&buffer, verify::UNWRITTEN, data)?;
                }
            }
            exported.push((index, ProcessExports { event, buffer }));
        }
        if let Some(stream) = &stream {
            stream.synchronize(&signals::check)?;
        }
        Ok((context, exported))
    }

    /// vmm and pool: sends each child one message with every buffer's descriptor, in process order.
    fn send_descriptors(&self, exports: &[ProcessExports]) -> Result<()> {
        if self.sockets.is_empty() {
            return Ok(());
        }
        let all: Vec<BorrowedFd> = exports.iter().filter_map(|e| e.buffer.descriptor()).collect();
        for (child, socket) in self.sockets.iter().enumerate() {
            match fault::descriptor_fault() {
                None => descriptors::send(socket, self.mechanism.code(), &all),
                Some(fault) => descriptors::send_wrong(socket, self.mechanism.code(), &all, fault),
            }
            .with_context(|| format!("sending process {child} its descriptors"))?;
        }
        Ok(())
    }
}

/// `--timings` and `--json`: the parent's phases and what each child left in the segment.
fn report(
    cli: &Cli,
    json: Option<JsonFile>,
    state: &SharedState,
    parent: &Phases,
    checked_every_buffer: bool,
) -> Result<()> {
    if cli.timings {
        let children: Vec<Phases> = (0..state.process_count()).map(|i| Phases::read(state, i)).collect();
        crate::output::text(&timings::table(parent, &children))?;
    }
    if let Some(json) = json {
        json.write(Results::Run(RunResults::of(state, parent, checked_every_buffer)))?;
    }
    Ok(())
}
