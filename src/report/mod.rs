//! The `--json` document: every run given `--json FILE` writes one, however it ends. It says how
//! (`"status"`: passed, failed, waived or interrupted; `"reason"`, and `"cause"` and `"fix"` where the failure
//! was diagnosed; `"exit_status"`), with what (the program and driver versions, the devices, the options),
//! and what the mode found (the phase timings of every process, each mechanism's run under `--ipc all`, the
//! benchmark's figures). The schema is [`document`]'s (and docs/json.md); this module alone writes it, with
//! serde_json, and the roles hand it data.
//!
//! No option may destroy the user's data, so the file is handled in three steps:
//! - [`open`], before anything runs: the path must be a regular file or not exist yet, in a directory this
//!   process can write, and must not be the file this process's standard output or error goes to
//!   (`--json /dev/stdout >> log`, `--json F > F`): writing it would destroy what the run prints and what was
//!   there before. Nothing is opened or truncated, so a FIFO can never block the run. A symbolic link that
//!   another user made in a sticky directory (`/tmp`) is refused, never followed (see `destination`).
//! - The roles note what they find as they learn it ([`Findings`]: the driver, the devices, their results),
//!   and return it with their outcome ([`RoleEnd`]) to `main`, which decides the verdict.
//! - [`final_document`] and [`FinalDocument::write`], from `main` once the exit status is decided, before the
//!   verdict line (which says whether the document was written): the document goes to a new file of this
//!   process's own beside the path, made under a random name, and is renamed over it, so the path holds the
//!   old document or the whole new one, never an empty or partial one, nor one another user can rewrite.
//!
//! `--json -` writes the document to standard output instead, which then carries it alone (one JSON value,
//! then a newline): [`open`] sends every other line of the run to standard error
//! (`output::lines_to_standard_error`), and [`FinalDocument::write`] writes the document there whole, or says
//! that its reader went away ([`ReaderGone`](crate::output::ReaderGone), 141); `main` says the verdict after
//! it.
//!
//! Nothing of it is process-wide: `main` holds the document it opened ([`Opened`]), and the outcome and what
//! the roles found come back to it as values.

mod destination;
pub mod document;
mod final_document;
mod kernel_log;
mod last_word;
mod metrics;
mod running;
pub(crate) mod verdict;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use destination::{Destination, Output};

use crate::driver::Driver;
use crate::ipc::diagnose::Diagnosis;
use crate::ipc::{Fds, Mechanism, Sync};
use crate::outcome::Outcome;
use crate::placement::{Placement, paths_of};
pub use document::MatrixCell;
use document::{BenchResults, Device, DriverFacts, MechanismResult, Mode, Options, RunResults};
pub use document::{Document, Refused, Status};
pub use final_document::{FinalDocument, final_document};
pub use kernel_log::look_at_the_kernel_log;
pub(crate) use last_word::{LastWord, for_the_watchdog};

/// The document of this run, opened by `main` before anything runs ([`open`], [`open_inherited`]) and written
/// by [`FinalDocument::write`] (or [`for_the_watchdog`]) once the verdict is known: as JSON (`--json`, or the pipe to
/// the process that started the run) and as metrics (`--metrics`), either or both.
pub struct Opened {
    json: Option<Target>,
    metrics: Option<Target>,
    mode: Mode,
    options: Options,
}

/// Where one form of the document goes.
struct Target {
    output: Output,
    /// The path as given, to name in messages; empty for an inherited pipe.
    given: PathBuf,
    destination: Destination,
}

impl Target {
    fn checked(output: Output, path: &Path) -> Result<Self> {
        Ok(Self { output, given: path.to_owned(), destination: Destination::checked(output, path)? })
    }

    fn json(destination: Destination) -> Self {
        Self { output: Output::Json, given: PathBuf::new(), destination }
    }

    fn write(&self, text: &str) -> Result<()> {
        self.destination.write(self.output, &self.given, text)
    }
}

impl Opened {
    fn new(json: Option<Target>, metrics: Option<Target>, (mode, options): (Mode, Options)) -> Self {
        Self { json, metrics, mode, options }
    }
}

/// What a role found, for the document.
#[derive(Debug)]
pub enum Results {
    Run(RunResults),
    Mechanisms(Vec<MechanismResult>),
    Bench(BenchResults),
    Matrix(Vec<MatrixCell>),
    /// The whole document of the process of this program that ran the run (the run inside an isolation).
    Whole(Box<Document>),
}

/// What a role returns to `main` when it ends: how the run ended, what it found for the document, and who is
/// waiting to hear the verdict.
#[derive(Debug)]
pub struct RoleEnd {
    pub outcome: Outcome,
    pub findings: Findings,
    /// Tells those still waiting on the run (a served run's joiners) how it ended, once its document is
    /// written: a joiner's verdict is the run's, and a run whose document could not be written did not pass.
    pub notify_waiters: Option<NotifyWaiters>,
}

/// Called once, with the verdict `main` decided, to tell those waiting on the run how it ended (see
/// [`RoleEnd::notify_waiters`]).
pub struct NotifyWaiters(pub Box<dyn FnOnce(&Outcome)>);

impl std::fmt::Debug for NotifyWaiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NotifyWaiters")
    }
}

/// What a role found for the document, however the run ended: noted as it learns it, returned with its
/// outcome in its [`RoleEnd`].
#[derive(Debug, Default)]
pub struct Findings {
    pub results: Option<Results>,
    /// Where the processes that joined stand (a served or isolated run), once they all have.
    pub placement: Option<Placement>,
    /// The driver the run loaded, and every device it reports.
    driver: Option<DriverFacts>,
    devices: Vec<Device>,
    /// A refusal that a process which joined this run reported in its own document (see
    /// `parent::isolated`).
    pub refused: Option<Refused>,
    /// What the kernel's log said of the run's GPUs, where it was read ([`look_at_the_kernel_log`]).
    kernel_log: Option<crate::node::KernelLog>,
}

impl RoleEnd {
    /// The outcome, with what the role found.
    pub fn with(outcome: Outcome, results: Results) -> Self {
        Self {
            outcome,
            findings: Findings { results: Some(results), ..Findings::default() },
            notify_waiters: None,
        }
    }
}

impl RoleEnd {
    /// The run, as `ending` and the whole `document` of the process that ran it say.
    pub fn handed_back(ending: crate::outcome::Ending, document: Document) -> Self {
        Self::with(Outcome::Ended(ending), Results::Whole(Box::new(document)))
    }
}

impl Document {
    /// How the run it describes ended, with the exit status its process ended with.
    pub fn ending(&self, exit_status: i32) -> crate::outcome::Ending {
        crate::outcome::Ending {
            status: self.status,
            reason: self.reason.clone(),
            summary: self.summary.clone(),
            exit_status: u8::try_from(exit_status).unwrap_or(crate::outcome::EXIT_FAILURE),
        }
    }
}

impl From<Outcome> for RoleEnd {
    fn from(outcome: Outcome) -> Self {
        Self { outcome, findings: Findings::default(), notify_waiters: None }
    }
}

/// Checks `json` for `--json` and `metrics` for `--metrics` (see the module's doc) as the document of this
/// run (`asked`: its mode and options); `-` is standard output, and every other line of the run goes to
/// standard error from now on. `None` where neither is given. Call it before anything is written or started.
pub fn open(json: Option<&Path>, metrics: Option<&Path>, asked: (Mode, Options)) -> Result<Option<Opened>> {
    if json.is_none() && metrics.is_none() {
        return Ok(None);
    }
    let standard_output = Path::new(destination::STANDARD_OUTPUT);
    if json == Some(standard_output) && metrics == Some(standard_output) {
        anyhow::bail!("--json - and --metrics - cannot both have standard output: give --metrics a file")
    }
    let json = json.map(|path| Target::checked(Output::Json, path)).transpose()?;
    let metrics = metrics.map(|path| Target::checked(Output::Metrics, path)).transpose()?;
    if let (Some(json), Some(metrics)) = (&json, &metrics)
        && json.destination.same_file(&metrics.destination)
    {
        anyhow::bail!(
            "--json {} and --metrics {} are the same file: each would replace the other; give two files",
            json.given.display(),
            metrics.given.display()
        )
    }
    let opened = Opened::new(json, metrics, asked);
    // A file that cannot take it now (a full disk) may take the verdict at the end; if it cannot, the
    // verdict line says so then.
    for e in opened.write_running() {
        eprint_line!("simple-ipc: warning: {e:#}: killed before its end, the run would leave what was there");
    }
    Ok(Some(opened))
}

/// The `--json` document of a mode that is no run and writes a document of its own, once (`--between`):
/// its path checked as [`open`] checks a run's, before anything is read (`-` gives standard output to the
/// document alone, every other line going to standard error), and the document written as a run's is: a new
/// file renamed over the path, or standard output, whose reader gone is
/// [`ReaderGone`](crate::output::ReaderGone).
pub(crate) struct OwnDocument(Target);

impl OwnDocument {
    pub(crate) fn checked(path: &Path) -> Result<Self> {
        Target::checked(Output::Json, path).map(Self)
    }

    /// Whether the document goes to standard output (`--json -`), which it then has alone.
    pub(crate) fn is_standard_output(&self) -> bool {
        matches!(self.0.destination, Destination::StandardOutput(_))
    }

    /// Writes `document`, whole.
    pub(crate) fn write(&self, document: &impl serde::Serialize) -> Result<()> {
        let mut text = serde_json::to_string_pretty(document).context("writing the --json document")?;
        text.push('\n');
        self.0.write(&text)
    }
}

/// The inherited descriptor `fd` (`--report-fd`) as the document of this run (`asked`: its mode and options).
pub fn open_inherited(fd: std::os::fd::RawFd, asked: (Mode, Options)) -> Result<Opened> {
    let pipe = std::fs::File::from(crate::os::inherit::take(fd, "--report-fd")?);
    Ok(Opened::new(Some(Target::json(Destination::Inherited(pipe))), None, asked))
}

impl Findings {
    /// Notes the driver the run loaded: its versions, and whether it is the simulation.
    pub fn note_driver(&mut self, driver: &dyn Driver) {
        let simulated = driver.simulated();
        self.driver = Some(DriverFacts {
            version: if simulated { None } else { kernel_module_version() },
            cuda_version: if simulated { None } else { driver.version().ok() },
            simulated,
        });
    }

    /// Notes the driver a mode's runs load, where the mode loads none itself (the container matrix): the
    /// simulation where it was asked for, else the kernel module's version.
    pub fn note_driver_asked(&mut self) {
        let simulated = crate::driver::host::requested();
        let version = if simulated { None } else { kernel_module_version() };
        self.driver = Some(DriverFacts { version, cuda_version: None, simulated });
    }

    /// Notes every device the driver reports, and which of them the run chose; a device that cannot be
    /// asked is left out.
    pub fn note_devices(&mut self, driver: &dyn Driver, chosen: &[i32]) {
        let count = driver.device_count().unwrap_or(0);
        self.devices = (0..count)
            .filter_map(|d| Some(Device::of(d, &driver.device_info(d).ok()?, chosen.contains(&d))))
            .collect();
    }
}

/// The NVIDIA kernel module's version, from `/proc/driver/nvidia/version` (`NVRM version: NVIDIA UNIX
/// x86_64 Kernel Module  580.65.06  ...`): the first word of that line made of digits and dots.
fn kernel_module_version() -> Option<String> {
    version_in(&std::fs::read_to_string("/proc/driver/nvidia/version").ok()?)
}

fn version_in(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_owned)
}

/// Once the run is over: the forecast of each path the run took beside what happened (it `passed`, or the
/// driver `refused` a handle), kept in `placement` for the document; the text to print.
/// `handles`: the run's mechanism, `--sync` and `--fds`, which say the paths it took (none where it ran no
/// one mechanism).
pub fn forecast_against_outcome(
    placement: &mut Placement,
    handles: Option<(Mechanism, Sync, Fds)>,
    passed: bool,
    refused: Option<&Refused>,
) -> String {
    let paths = handles.map_or_else(Vec::new, |(mechanism, sync, fds)| paths_of(mechanism, sync, fds));
    let refused = refused.map(|r| (r.event, r.error.as_str(), crate::placement::RefusedBy::of(r)));
    let against = placement.against(&paths, passed, refused);
    let mut text = crate::placement::against_text(&against);
    text.push_str(&placement.measure_libraries(&against));
    placement.against = Some(against);
    text
}

/// How the run ended, as `main` decided it.
pub struct Verdict<'a> {
    pub status: Status,
    pub reason: Option<&'a str>,
    /// What a run that passed did, as its role said.
    pub summary: Option<&'a str>,
    /// What `ipc::diagnose` found, where it explained the failure.
    pub diagnosis: Option<&'a Diagnosis>,
    /// Where the run failed because the driver refused a handle in this process (see [`Refused::of`]).
    pub refused: Option<Refused>,
    pub exit_status: u8,
}

impl<'a> Verdict<'a> {
    /// A run that did not pass, for `reason`, and with nothing more to say.
    #[cfg(test)]
    pub fn of(status: Status, reason: &'a str, exit_status: u8) -> Self {
        Self { status, reason: Some(reason), summary: None, diagnosis: None, refused: None, exit_status }
    }
}

/// The whole document of `opened`, with the verdict and what the role found.
fn document(opened: &Opened, verdict: &Verdict, findings: Findings) -> Document {
    let Findings { results, placement, mut driver, mut devices, refused, kernel_log } = findings;
    let kernel_log = kernel_log.unwrap_or_default();
    let (mut run, mut mechanisms, mut bench, mut matrix) = (None, None, None, None);
    match results {
        // What the process that ran it wrote, with the verdict as decided here.
        Some(Results::Whole(whole)) => {
            let mut whole = *whole;
            whole.status = verdict.status;
            whole.reason = verdict.reason.map(str::to_owned);
            whole.summary = verdict.summary.map(str::to_owned);
            whole.exit_status = Some(verdict.exit_status);
            (whole.mode, whole.options) = (opened.mode, opened.options.clone());
            return whole;
        }
        Some(Results::Run(results)) => run = Some(results),
        Some(Results::Mechanisms(rows)) => mechanisms = Some(rows),
        Some(Results::Bench(results)) => bench = Some(results),
        Some(Results::Matrix(cells)) => matrix = Some(cells),
        None => {}
    }
    // `--ipc all` loads no driver itself: its runs say what they found.
    if driver.is_none()
        && let Some(first) =
            mechanisms.iter().flatten().filter_map(|m| m.document.as_deref()).find(|d| d.driver.is_some())
    {
        driver = first.driver.clone();
        devices = first.devices.clone();
    }
    Document {
        program: "simple-ipc".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        status: verdict.status,
        reason: verdict.reason.map(str::to_owned),
        cause: kernel_log::beside(
            verdict.diagnosis.map(|d| d.cause.clone()),
            &kernel_log,
            verdict.status,
            |x| {
                format!(
                    "the kernel logged Xid {} on GPU {} ({}): {}",
                    x.xid, x.device, x.pci_bus_id, x.meaning
                )
            },
        ),
        fix: kernel_log::beside(verdict.diagnosis.map(|d| d.fix.clone()), &kernel_log, verdict.status, |x| {
            format!("Xid {}: {}", x.xid, x.action)
        }),
        // A refusal counts only where the run failed, or was waived because the simulation does not model
        // what was refused (which the refusal says, for the container matrix's "not simulated").
        refused: match verdict.status {
            Status::Failed => verdict.refused.clone().or(refused),
            Status::Waived => verdict.refused.clone().or(refused).filter(|r| r.beyond_the_simulation),
            _ => None,
        },
        xid: kernel_log.xid,
        kernel_log: kernel_log.unread,
        test_kernel_log: crate::node::test_log(),
        summary: verdict.summary.map(str::to_owned),
        exit_status: Some(verdict.exit_status),
        mode: opened.mode,
        driver,
        devices,
        options: opened.options.clone(),
        run,
        mechanisms,
        bench,
        matrix,
        placement,
    }
}

#[cfg(test)]
mod tests;
