//! The entry point: parse the command line, run the parent or a child (or the guardian, the benchmark, the
//! topology, every mechanism), turn the result into the exit status (0 passed, 1 failed, 2 waived, 128+N
//! stopped by signal N) and the `--json` document.

use std::process::ExitCode;

use nix::sys::signal::{SigHandler, Signal, signal};

use crate::ipc::diagnose::Diagnosis;
use std::os::fd::RawFd;

use crate::os::signals::Interrupted;
use crate::outcome::{EXIT_FAILURE, EXIT_WAIVED, Ending, Outcome};
use crate::output::READER_GONE_STATUS;
use crate::report::verdict::{self, is_reader_gone, reader_gone};
use crate::report::{self, Status};
use crate::role::{MechanismRun, Role};
use crate::sample::attach::Stopped;
use crate::tool::{child, parent};
use crate::{
    bench, cli, devices, driver, every_mechanism, join, os::signals, phases::fault, supervise::guardian,
    topology,
};

/// The whole program: what `main` runs.
pub fn main() -> ExitCode {
    crate::output::fill_closed_standard_descriptors();
    // SIGPIPE stays ignored (Rust's default): a reader that goes away (`simple-ipc | head`) is an EPIPE, which
    // ends the run in order, quietly, with 141 as for a C program (`output::ReaderGone`).
    // A file size limit (`ulimit -f`) makes a write fail with EFBIG instead of killing the process.
    // SAFETY: ignoring a signal installs no handler; nothing else runs yet.
    let _ = unsafe { signal(Signal::SIGXFSZ, SigHandler::SigIgn) };
    // Before any child is started: every role that waits for children needs their exit statuses.
    // Then the stop signals' handlers, before anything else: a signal that comes from now on is noted and
    // stops the run in order, however early (a process that enters namespaces, `isolation::enter`, hands
    // the note on to the run's process it forks).
    if let Err(e) = signals::keep_child_statuses().and_then(|()| signals::install()) {
        eprint_line!("simple-ipc: {e:#}");
        return ExitCode::from(EXIT_FAILURE);
    }
    // No panic reaches the user as status 101: it is a failure like any other, said in one line.
    // The standard library panics where it cannot map a new thread's signal stack (a tight `ulimit -v`):
    // that is the machine's limit, not a defect, and is said as such.
    std::panic::set_hook(Box::new(|panic| {
        let payload = panic.payload();
        let said =
            payload.downcast_ref::<&str>().copied().or(payload.downcast_ref::<String>().map(|s| s.as_str()));
        match said {
            Some(said) if said.contains("alternative stack") || said.contains("failed to allocate") => {
                eprint_line!("simple-ipc: out of memory: {said}")
            }
            _ => eprint_line!("simple-ipc: internal error: {panic}"),
        }
        std::process::exit(i32::from(EXIT_FAILURE));
    }));
    devices::prefer_fast_context_creation();
    let role = match cli::parse() {
        Ok(role) => role,
        Err(early_exit) => {
            early_exit.print();
            return ExitCode::from(early_exit.exit_code());
        }
    };
    // A read of two other processes, not a run: its answer is its own (see `between`).
    if let Role::Between(between) = &role {
        let (exporter, importer, quiet) = (between.exporter, between.importer, between.quiet);
        let json = between.json.as_deref();
        return crate::between::main(&crate::between::Asked { exporter, importer, json, quiet });
    }
    let who = match &role {
        Role::Child(child) => format!("Process {}", child.index),
        _ => "simple-ipc".to_owned(),
    };
    // The run's --json document: its path is checked before anything runs (a path that cannot take it is a
    // usage error), and it is written once the verdict is known, whatever it is.
    // `--ipc all` hands each of its runs a pipe for the document instead.
    let asked = role.asked();
    let handles = role.handles();
    let opened = match (role.report_fd(), role.json()) {
        (Some(fd), _) => report::open_inherited(fd, asked.clone()).map(Some),
        (None, json) => report::open(json, role.metrics(), asked.clone()),
    };
    let document = match opened {
        Ok(document) => document.map(std::sync::Arc::new),
        Err(e) => {
            eprint_line!("{who}: {e:#}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    // A run its watchdog must end (a call that never returns) still writes them, as failed.
    if let Some(document) = &document {
        crate::supervise::watchdog::leave_last_word(report::for_the_watchdog(document));
    }
    if role.quiet() {
        crate::output::be_quiet();
    }
    // A role a user starts ends with a verdict line (said here, or, for the run inside an isolation, by the
    // process outside), which says why a waived run was waived: once, not also on the line before.
    let inside = role.inside_an_isolation();
    let ends_with_a_verdict = role.started_by_a_user() || inside;
    let started = std::time::Instant::now();
    let mut began =
        crate::node::RunStart::now(matches!(role, Role::Sample(..) | Role::Bench(_) | Role::MechanismRun(_)));
    let (outcome, mut findings, notify_waiters) = match run(role) {
        Ok(report::RoleEnd { outcome, findings, notify_waiters }) => (outcome, findings, notify_waiters),
        Err(e) => (Outcome::Failed(e), report::Findings::default(), None),
    };
    let failure = match &outcome {
        Outcome::Failed(e) => Some(e),
        _ => None,
    };
    // Where `ipc::diagnose` explained the failure, the document carries its cause and fix as fields.
    // A process that joined over the socket gave its own (see `wire::Message::Ended`).
    let diagnosis = failure.and_then(|e| {
        e.downcast_ref::<Diagnosis>().or_else(|| {
            e.downcast_ref::<crate::supervise::peers::PeerFailed>().and_then(|j| j.diagnosis.as_ref())
        })
    });
    // How the run ended, decided once: the verdict line, the document and the exit status say it.
    let Ending { mut status, mut reason, summary, exit_status: mut code } = match &outcome {
        Outcome::Passed(summary) => Ending::passed(summary.clone()),
        // Said here where no verdict line will say it.
        Outcome::Waived(waiver) => match say_unless(ends_with_a_verdict, waiver) {
            Ok(()) => Ending::not_passed(Status::Waived, waiver.to_string(), EXIT_WAIVED),
            Err(e) => ended_by(&who, &e),
        },
        Outcome::Failed(e) => ended_by(&who, e),
        Outcome::Ended(ending) => ending.clone(),
    };
    report::look_at_the_kernel_log(&mut began, status, asked.0, &mut findings, &mut reason);
    let summary = summary.as_deref();
    // The last line says how the run ended, for the roles a user starts (not a child, the guardian, a run
    // of one mechanism under --ipc all, whose top parent says it, or the run inside an isolation, whose
    // process outside says it); a reader that went away gets nothing.
    let says_verdict = ends_with_a_verdict && !inside && code != READER_GONE_STATUS;
    // A served or isolated run: what was forecast for each path it took, beside what happened.
    let refused = failure.and_then(|e| {
        report::Refused::of(e)
            .or_else(|| e.downcast_ref::<crate::supervise::peers::PeerFailed>()?.refused.clone())
    });
    if let Some(placement) = &mut findings.placement
        && let text =
            report::forecast_against_outcome(placement, handles, status == Status::Passed, refused.as_ref())
        && code != READER_GONE_STATUS
        && let Err(e) = crate::output::text(&text)
    {
        eprint_line!("{who}: {e:#}");
    }
    let diagnosis = diagnosis.filter(|_| status == Status::Failed);
    // Where the driver refused to open another process's handle, the document says so as typed facts.
    let summary = summary.filter(|_| status == Status::Passed);
    let ending =
        report::Verdict { status, reason: reason.as_deref(), summary, diagnosis, refused, exit_status: code };
    // The document goes first (to its file, or to standard output for `--json -`), and the verdict line
    // after it: the line is the run's last word, so it must say whether the document was written, and a
    // passed run whose document could not be written is no pass.
    let mut final_document = report::final_document(document, &ending, findings);
    let written = final_document.as_ref().map_or(Ok(()), report::FinalDocument::write);
    // Those waiting on the run (a served run's joiners) hear the verdict: a run whose document could not be
    // written did not pass, for them either.
    if let Some(report::NotifyWaiters(tell)) = notify_waiters {
        match &written {
            // `--serve --json - | true`: the run ends interrupted (141), and is no pass for them either.
            Err(e) if e.chain().any(is_reader_gone) && !matches!(outcome, Outcome::Failed(_)) => {
                let (status, why, code) = reader_gone();
                tell(&Outcome::Ended(Ending::not_passed(status, why.unwrap_or_default(), code)))
            }
            Err(e) if matches!(outcome, Outcome::Passed(_)) => tell(&Outcome::Failed(anyhow::anyhow!(
                "the server could not write its --json document: {e:#}"
            ))),
            _ => tell(&outcome),
        }
    }
    match written {
        Ok(()) => {}
        // `--json - | head -c 10`: 141, and nothing more said, as for a C program killed by SIGPIPE.
        Err(e) if e.chain().any(is_reader_gone) => code = READER_GONE_STATUS,
        Err(e) => {
            let why = format!("{e:#}");
            // Said on a line of its own where no verdict line will say it, or where the verdict says the
            // run's own failure.
            if !says_verdict || matches!(status, Status::Failed | Status::Interrupted) {
                eprint_line!("{who}: {why}");
            }
            // The user asked for a document and has none: neither a pass nor a waiver (as the process outside
            // an isolated run says it, `isolation::outside`).
            if matches!(status, Status::Passed | Status::Waived) {
                (status, reason, code) = (Status::Failed, Some(why), EXIT_FAILURE);
            }
        }
    }
    if says_verdict && code != READER_GONE_STATUS {
        let line = verdict::line(status, reason.as_deref(), summary, code, started.elapsed());
        match crate::output::verdict(&line) {
            Ok(()) => {}
            // The reader went away before the last line (`--topology | head -1`): 141, quietly, as when it
            // goes before any other line; a file's document, written already, is written again to say so.
            Err(e) if e.chain().any(is_reader_gone) => {
                let (_, why, gone) = reader_gone();
                code = gone;
                if let Some(final_document) = &mut final_document
                    && let Err(e) = final_document.rewrite_interrupted(why.unwrap_or_default(), code)
                {
                    eprint_line!("{who}: {e:#}");
                }
            }
            // The verdict is the run's last output: one that cannot be written (a full disk, an I/O error)
            // fails a run that passed or was waived, as any other output would, and its file's document
            // says so.
            Err(e) => {
                let why = format!("{e:#}");
                // A run that failed writing its output has said that error already.
                if reason.as_deref() != Some(why.as_str()) {
                    eprint_line!("{who}: {why}");
                }
                if matches!(status, Status::Passed | Status::Waived) {
                    code = EXIT_FAILURE;
                    if let Some(final_document) = &mut final_document
                        && let Err(e) = final_document.rewrite_ended(Status::Failed, why, code)
                    {
                        eprint_line!("{who}: {e:#}");
                    }
                }
            }
        }
    }
    ExitCode::from(code)
}

/// Says `waiver` as a line, unless the verdict line will say it (`verdict_says_it`).
fn say_unless(verdict_says_it: bool, waiver: &crate::outcome::Waiver) -> anyhow::Result<()> {
    if verdict_says_it { Ok(()) } else { print_line!("{waiver}") }
}

/// How a run that ended with `e` ended, said on standard error as `who`'s where it is news.
fn ended_by(who: &str, e: &anyhow::Error) -> Ending {
    let (status, reason, code) = match e {
        e if e.is::<join::RunOverBeforeJoining>() => (Status::Failed, e.to_string(), EXIT_FAILURE),
        // A namespace this host does not give: nothing here to test that way.
        e if e.chain().any(|cause| cause.is::<crate::outcome::Waiver>()) => {
            eprint_line!("{who}: {e:#}");
            (Status::Waived, format!("{e:#}"), EXIT_WAIVED)
        }
        // Quietly, as a C program killed by SIGPIPE. A run of `--ipc all` whose reader went away was stopped
        // for it, and says so as `Interrupted(SIGPIPE)` (this program ignores SIGPIPE: nothing else says it).
        // ... also a process of a run that was stopped because the reader went away, before it wrote.
        e if e.chain().any(is_reader_gone)
            || (Stopped::of(e) == Some(Stopped::Aborted) && crate::output::reader_gone()) =>
        {
            let (status, why, code) = reader_gone();
            (status, why.unwrap_or_default(), code)
        }
        // A child of a run its parent waived: the parent says why; nothing failed.
        e if Stopped::of(e) == Some(Stopped::Waived) => (Status::Waived, e.to_string(), EXIT_WAIVED),
        // A child whose parent ended the run before its plan: the parent says why.
        e if Stopped::of(e) == Some(Stopped::BeforeThePlan) => (Status::Failed, e.to_string(), EXIT_FAILURE),
        // The simulation was asked what it does not model: a limit of this test's, not a failure of CUDA
        // IPC, and waived as the container matrix's cells are ("not simulated").
        e if let Some(what) = beyond_the_simulation(e) => {
            eprint_line!("{who}: {e:#}");
            let why = format!(
                "not simulated: {what} is beyond what the simulated GPUs model (the line above says why); \
                 on GPUs, the CUDA driver decides"
            );
            (Status::Waived, why, EXIT_WAIVED)
        }
        e => {
            eprint_line!("{who}: {e:#}");
            match e.chain().find_map(|cause| cause.downcast_ref::<Interrupted>()) {
                Some(interrupted) => {
                    (Status::Interrupted, interrupted.to_string(), 128 + interrupted.0 as u8)
                }
                None => (Status::Failed, format!("{e:#}"), EXIT_FAILURE),
            }
        }
    };
    Ending::not_passed(status, reason, code)
}

/// The call the simulation answered beyond what it models, where that ended the run: in this process
/// (the driver's typed error) or in a process of the run (its refusal, sent over the wire).
fn beyond_the_simulation(e: &anyhow::Error) -> Option<String> {
    let here = e.chain().find_map(|cause| cause.downcast_ref::<driver::CallFailed>());
    if let Some(failed) = here.filter(|failed| failed.beyond_the_simulation) {
        return Some(failed.call.clone());
    }
    let peer = e.chain().find_map(|cause| cause.downcast_ref::<crate::supervise::peers::PeerFailed>())?;
    let refused = peer.refused.as_ref().filter(|refused| refused.beyond_the_simulation)?;
    Some(format!("{} in process {}", refused.call, peer.index))
}

/// Runs `role`.
fn run(role: Role) -> anyhow::Result<report::RoleEnd> {
    // Unlike the original, an ARM host is not waived as a whole: GH200 and GB200 hosts have CUDA IPC, and
    // each device is asked for each mechanism by trial, as on x86-64.
    // First of all, while this process has one thread: the namespaces of an isolated run's process.
    let isolate = match &role {
        Role::Sample(run, _) => run.isolate.as_ref().map(|isolation| (run, isolation, false)),
        Role::MechanismRun(sub) => sub.run.isolate.as_ref().map(|isolation| (&sub.run, isolation, true)),
        _ => None,
    };
    let outside = |fd: RawFd| crate::os::inherit::take(fd, "--outside-fd");
    match (&role, isolate) {
        (Role::Isolated(isolated), _) => {
            crate::isolation::enter(&isolated.isolation, outside(isolated.outside_fd)?)?
        }
        (Role::MechanismRun(MechanismRun { outside_fd: Some(fd), .. }), Some((_, isolation, _))) => {
            crate::isolation::enter(isolation, outside(*fd)?)?
        }
        _ => {}
    }
    // The process the user started stays in the user's namespaces; the run goes on in this program again,
    // which enters them.
    match (&role, isolate) {
        (Role::Sample(run, mechanism), Some((_, isolation, _))) if isolation.includes_parent() => {
            return crate::isolation::run_inside(run, *mechanism, None, false);
        }
        (Role::MechanismRun(sub), Some((_, isolation, _)))
            if isolation.includes_parent() && sub.outside_fd.is_none() =>
        {
            return crate::isolation::run_inside(
                &sub.run,
                sub.mechanism,
                sub.served.as_ref(),
                sub.matrix_row,
            );
        }
        _ => {}
    }
    if !matches!(role, Role::Guardian { .. }) {
        fault::validate_env()?;
    }
    let joins = matches!(role, Role::Child(_) | Role::Joiner(_) | Role::Isolated(_) | Role::Guardian { .. });
    if !joins && driver::host::requested() {
        print_line!(
            "SIMULATED GPUs ({}): a test of the process protocol in host memory, not of a GPU",
            driver::host::SIMULATE_ENV
        )?;
    }
    if !joins && let Some(hook) = crate::node::test_hook_said() {
        eprint_line!("{hook}");
    }
    match role {
        Role::Guardian { fd } => guardian::watch(fd).map(|()| Outcome::Passed(None).into()),
        Role::Joiner(joiner) => join::run(&joiner, false).map(report::RoleEnd::from),
        Role::Isolated(isolated) if isolated.matrix_row => crate::matrix::row::import(&isolated),
        Role::Isolated(isolated) => join::run(&isolated.joiner, true).map(report::RoleEnd::from),
        Role::Child(child) if child.bench => {
            bench::run_producer(child.index as usize, child.segment_fd, child.socket_fd)
                .map(|()| Outcome::Passed(None).into())
        }
        Role::Child(child) => child::run(child.index as usize, child.segment_fd, child.socket_fd)
            .map(|()| Outcome::Passed(None).into()),
        Role::Bench(bench) => bench::run_consumer(&bench, bench.mechanism),
        Role::Topology => {
            fault::validate_for(&fault::Targets::NONE)?;
            topology::run().map(report::RoleEnd::from)
        }
        Role::Sample(run, mechanism) => parent::run(&run, mechanism, None),
        Role::MechanismRun(sub) if sub.matrix_row => crate::matrix::row::export(&sub.run),
        Role::MechanismRun(sub) => parent::run(&sub.run, sub.mechanism, sub.served.as_ref()),
        Role::Matrix(run, asked) => crate::matrix::run(&run, &asked),
        Role::EveryMechanism(every) => every_mechanism::run(&every),
        Role::Between(_) => Err(anyhow::anyhow!("--between is answered before any run starts")),
    }
}
