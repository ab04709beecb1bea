//! The tool's parent: a run of the sample as the user asked it (`Run`). The story is `sample::parent`; this
//! module answers its seams for the run's options (`--serve`, `--isolate`, `--fds pidfd`, `--sync memops`,
//! `--bind-numa`, the test faults, MPS, `--timings`) and tells a served run's joiners how it ended.

use std::cell::Cell;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Instant;

use anyhow::Result;

use super::memops;
use super::own_check::{self, UNWRITTEN};
use super::team::Team;
use crate::driver::{Capability, Driver};
use crate::gpu::{DeviceMemory, Stream};
use crate::ipc::{ExportedBuffer, ExportedEvent, Fds, Mechanism, ProcessExports, Sync, pidfd};
use crate::joiners::JoinersAtEnd;
use crate::os::signals;
use crate::outcome::{Outcome, Waiver};
use crate::phases::Phase;
use crate::phases::fault;
use crate::phases::timings::{self, Phases, Stopwatch};
use crate::placement::mps::Mps;
use crate::report::document::RunResults;
use crate::report::{Findings, NotifyWaiters, Results, RoleEnd};
use crate::role::{Run, Served};
use crate::sample::extras::{ExportExtras, ParentExtras, Processes};
use crate::sample::parent::{Sample, parent_process};
use crate::segment::{self, Segment, SharedState};
use crate::supervise::guardian::Guardian;
use crate::wire::descriptors;

/// Runs the sample of `mechanism` as `run` asks; `served`: a run of a served sequence (`--serve --ipc all`).
pub fn run(run: &Run, mechanism: Mechanism, served: Option<&Served>) -> Result<RoleEnd> {
    // Served, each joiner is told how the whole run ended once it is over: its verdict is the run's. A run
    // of a served sequence (`--serve --ipc all`) then hands every connection back to the sequence's top
    // parent, however it ended (waived before anyone joined, too).
    let joiners_at_end = match served {
        Some(served) => JoinersAtEnd::in_sequence(served.round, &served.fds)?,
        None => JoinersAtEnd::default(),
    };
    let mut findings = Findings::default();
    let sample = Sample {
        mechanism,
        procs_per_device: run.procs_per_device as usize,
        sequential: run.sequential,
        quiet: run.quiet,
        timeout: run.timeout,
    };
    let extras = RunExtras::new(run, mechanism, &joiners_at_end);
    let outcome = parent_process(&sample, &extras, &mut findings).unwrap_or_else(Outcome::Failed);
    joiners_at_end.hand_over(&mut findings);
    // Told once the document is written (`entry`), so that what the joiners hear is the verdict.
    let notify_waiters = NotifyWaiters(Box::new(move |ended: &Outcome| joiners_at_end.tell(ended)));
    Ok(RoleEnd { outcome, findings, notify_waiters: Some(notify_waiters) })
}

/// The run's options, as the story's seams ask them.
struct RunExtras<'a> {
    run: &'a Run,
    mechanism: Mechanism,
    joiners_at_end: &'a JoinersAtEnd,
    /// `--fds pidfd` with a mechanism that has descriptors: the importers fetch them themselves.
    pidfd: bool,
    /// Processes it did not start from its own program (`--serve`), or that run where it cannot see them
    /// (`--isolate`), might say anything: the parent then checks every buffer itself before it says PASSED.
    checks_itself: bool,
    /// Whether the driver says MPS runs any chosen device.
    mps_enabled: Cell<bool>,
    export: NewBuffers,
}

impl<'a> RunExtras<'a> {
    fn new(run: &'a Run, mechanism: Mechanism, joiners_at_end: &'a JoinersAtEnd) -> Self {
        let checks_itself = run.serve.is_some() || run.isolate.is_some();
        RunExtras {
            run,
            mechanism,
            joiners_at_end,
            pidfd: run.fds == Fds::Pidfd && mechanism.uses_descriptors(),
            checks_itself,
            mps_enabled: Cell::new(false),
            export: NewBuffers { memops: run.sync == Sync::Memops, unwritten: checks_itself },
        }
    }
}

impl ParentExtras for RunExtras<'_> {
    fn refusal(&self, mechanism: Mechanism) -> Option<Waiver> {
        // The kernel's lack, not the devices': said as such.
        if !self.pidfd {
            return None;
        }
        let reason = pidfd::unsupported()?;
        Some(Waiver(format!("--ipc {} cannot run here with {reason}", mechanism.name())))
    }

    fn lacks(&self, driver: &dyn Driver, device: i32) -> Result<Option<(String, String)>> {
        Ok(driver
            .stream_memops_unsupported(device)?
            .filter(|_| self.run.sync == Sync::Memops)
            .map(|reason| ("--sync memops".to_owned(), reason)))
    }

    fn devices_chosen(&self, driver: &dyn Driver, chosen: &[i32], n: usize) -> Result<()> {
        // MPS as the driver says it, not as a socket in a directory another user can make says it.
        let mps_enabled = chosen.iter().try_fold(false, |any, &device| {
            anyhow::Ok(any || driver.supports(device, Capability::MpsEnabled)?)
        })?;
        self.mps_enabled.set(mps_enabled);
        fault::validate_for(&fault::Targets {
            children: 0..n,
            parent: if self.checks_itself { Phase::PARENT_CHECKING } else { Phase::PARENT },
            child: Phase::CHILD,
            parent_sends_descriptors: self.mechanism.uses_descriptors() && !self.pidfd,
            parent_checks_buffers: self.checks_itself,
        })
    }

    fn options(&self) -> u32 {
        (if self.run.bind_numa { segment::OPTION_BIND_NUMA } else { 0 })
            | match self.run.sync {
                Sync::Memops => segment::OPTION_SYNC_MEMOPS,
                Sync::Events => 0,
            }
            | if self.pidfd { segment::OPTION_FDS_PIDFD } else { 0 }
    }

    fn descriptor_sockets(&self, n: usize) -> usize {
        // With --fds pidfd, none: each importer fetches the descriptors by the numbers in the segment.
        if self.pidfd { 0 } else { n }
    }

    fn export(&self) -> &dyn ExportExtras {
        &self.export
    }

    fn children_come(&self) -> bool {
        self.run.serve.is_none() && self.run.isolate.is_none()
    }

    fn others<'s>(
        &'s self,
        segment: &'s Segment,
        guardian: &'s Guardian,
        n: usize,
        their_sockets: &mut Vec<OwnedFd>,
        started: Instant,
    ) -> Result<Option<Box<dyn Processes + 's>>> {
        let team = Team::start(self.run, segment, n, their_sockets, started, self.joiners_at_end, guardian)?;
        Ok(team.map(|team| Box::new(team) as Box<dyn Processes>))
    }

    fn check_every_buffer(
        &self,
        watch: &mut Stopwatch,
        driver: &dyn Driver,
        exports: &[ProcessExports],
        devices: &[i32],
        state: &SharedState,
    ) -> Result<()> {
        if !self.checks_itself {
            return Ok(());
        }
        watch.enter(Phase::Verify)?;
        let buffers: Vec<&dyn DeviceMemory> =
            exports.iter().map(|e| &e.buffer as &dyn DeviceMemory).collect();
        own_check::every_buffer(driver, &buffers, devices, state.data_size(), &signals::check)?;
        watch.enter(Phase::CleanUp)
    }

    /// `--timings`: the parent's phases and what each child left in the segment; the results for `--json`.
    fn results(&self, state: &SharedState, parent: &Phases) -> Result<Results> {
        if self.run.timings {
            let children: Vec<Phases> = (0..state.process_count()).map(|i| Phases::read(state, i)).collect();
            crate::output::text(&timings::table(parent, &children))?;
        }
        Ok(Results::Run(RunResults::of(state, parent, self.checks_itself)))
    }

    fn summary(&self, n: usize, gpus: usize) -> Result<String> {
        let mps_enabled = self.mps_enabled.get();
        // The parent's own check of its pipe directory: its children inherit it; joiners were told nothing.
        let mps = Mps::here();
        if let (false, Some(what)) = (mps.client, &mps.answered) {
            print_line!(
                "MPS: the control socket in {} is {what}: this run was no MPS client",
                mps.pipe_directory
            )?;
        }
        if let Some(said) = mps.not_confirmed(mps_enabled) {
            print_line!("{said}")?;
        }
        let mps = mps.under(mps_enabled).map(|under| format!(", {under}")).unwrap_or_default();
        let run = self.run;
        Ok(format!(
            "{n} process{} on {gpus} GPU{}, {} IPC{}, {}{mps}{}: {}",
            if n == 1 { "" } else { "es" },
            if gpus == 1 { "" } else { "s" },
            self.mechanism.name(),
            if self.pidfd { " (descriptors by pidfd_getfd)" } else { "" },
            run.sync.name(),
            match (&run.serve, &run.isolate) {
                (Some(_), _) => ", joined over the socket".to_owned(),
                (_, Some(isolation)) => format!(", isolated ({})", isolation.described()),
                _ => String::new(),
            },
            // Only what this process saw: a process it did not start from its own program (`--serve`), or
            // that runs where it cannot see it (`--isolate`), may say anything of itself, and one of the same
            // uid could forge every buffer's bytes (it could ptrace the server); the buffers' contents the
            // parent read.
            match (&run.serve, self.checks_itself) {
                (Some(_), _) => "every buffer holds the round-robin's result, checked by the server",
                (None, true) => "every buffer holds the round-robin's result, checked by the parent",
                (None, false) => "every buffer verified",
            }
        ))
    }
}

/// What the run's options add to each buffer the parent exports.
struct NewBuffers {
    /// `--sync memops`: a flag after each buffer's data, zeroed before the children may use it, and no event.
    memops: bool,
    /// Each buffer's data is filled with [`UNWRITTEN`] first, for the parent's own check.
    unwritten: bool,
}

impl ExportExtras for NewBuffers {
    fn bytes_after_data(&self) -> usize {
        if self.memops { memops::FLAG_BYTES } else { 0 }
    }

    fn event<'d>(
        &self,
        make: &mut dyn FnMut() -> Result<ExportedEvent<'d>>,
    ) -> Result<Option<ExportedEvent<'d>>> {
        // --sync memops orders the round-robin without interprocess events: it makes none.
        if self.memops { Ok(None) } else { make().map(Some) }
    }

    fn prepare(
        &self,
        driver: &dyn Driver,
        device: i32,
        buffers: &[&ExportedBuffer],
        data: usize,
    ) -> Result<()> {
        if !self.memops && !self.unwritten {
            return Ok(());
        }
        let stream = Stream::non_blocking(driver, device)?;
        for &buffer in buffers {
            if self.memops {
                memops::zero_flag(&stream, buffer, data)?;
            }
            if self.unwritten {
                stream.fill(buffer, UNWRITTEN, data)?;
            }
        }
        stream.synchronize(&signals::check)
    }

    fn send_descriptors(&self, socket: &OwnedFd, mechanism: u32, all: &[BorrowedFd]) -> Result<()> {
        match fault::descriptor_fault() {
            None => descriptors::send(socket, mechanism, all),
            Some(fault) => descriptors::send_wrong(socket, mechanism, all, fault),
        }
    }
}
