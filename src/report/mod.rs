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
//!   there before. Nothing is opened or truncated, so a FIFO can never block the run.
//! - The roles hand over what they know as they learn it ([`note_driver`], [`note_devices`]) and their
//!   results ([`JsonFile::write`]); the verdict is not known yet.
//! - [`finish`], from `main` once the exit status is decided: the document goes to a new file beside the path
//!   and is renamed over it, so the path holds the old document or the whole new one, never an empty or
//!   partial one.
//!
//! `--json -` writes the document to standard output instead, which then carries it alone (one JSON value,
//! then a newline): [`open`] sends every other line of the run to standard error
//! (`output::lines_to_standard_error`), and [`finish`] writes the document there whole, or says that its
//! reader went away ([`ReaderGone`](crate::output::ReaderGone), 141); `main` says the verdict after it.
//!
//! It is process-wide state because there is one document per run and only `main` knows its verdict.

pub mod document;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use anyhow::{Context, Result, bail};

use crate::driver::Driver;
use crate::ipc::diagnose::Diagnosis;
pub use document::MatrixCell;
use document::{BenchResults, Device, DriverFacts, MechanismResult, Mode, Options, RunResults};
pub use document::{Document, Refused, Status};

/// The document of this run, between [`open`] (or [`open_inherited`]) and [`finish`].
struct Pending {
    /// The path as given, to name in messages; empty for an inherited pipe.
    given: PathBuf,
    destination: Destination,
    mode: Mode,
    options: Options,
    driver: Option<DriverFacts>,
    devices: Vec<Device>,
    /// The role's results, once it has them.
    results: Option<Results>,
    /// A refusal that a process which joined this run reported in its own document (see
    /// `isolation::launch`).
    refused: Option<Refused>,
}

impl Pending {
    fn new(given: PathBuf, destination: Destination, (mode, options): (Mode, Options)) -> Self {
        Self {
            given,
            destination,
            mode,
            options,
            driver: None,
            devices: Vec::new(),
            results: None,
            refused: None,
        }
    }
}

/// What a role found, for the document.
pub enum Results {
    Run(RunResults),
    Mechanisms(Vec<MechanismResult>),
    Bench(BenchResults),
    Matrix(Vec<MatrixCell>),
}

/// Where the document goes.
enum Destination {
    /// The path with its symbolic links resolved, so that the rename replaces the file and not a link to it.
    File(PathBuf),
    /// The pipe that `--ipc all` handed the run of one mechanism (`--report-fd`), so that the result comes
    /// back without a file.
    Inherited(std::fs::File),
    /// `--json -`: the standard output the invoker gave, which carries the document alone (descriptor 1 is
    /// standard error's copy from [`open`] on).
    StandardOutput(OwnedFd),
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);

fn pending() -> MutexGuard<'static, Option<Pending>> {
    // A panic elsewhere ends the process (see main), so a poisoned lock still holds consistent data.
    PENDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `(device, inode)` of what standard output and error are.
fn standard_files() -> Vec<(u64, u64)> {
    [1, 2]
        .into_iter()
        .filter_map(|fd| {
            // SAFETY: standard output and error stay open for the process's life; fstat only looks.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            nix::sys::stat::fstat(fd).ok().map(|st| (st.st_dev, st.st_ino))
        })
        .collect()
}

/// The `--json` path that means standard output.
pub const STANDARD_OUTPUT: &str = "-";

/// Checks `path` for `--json` (see the module's doc) and makes it the document of this run (`asked`: its mode and options); `-` is
/// standard output, and every other line of the run goes to standard error from now on. Call it before
/// anything is written or started.
pub fn open(path: &Path, asked: (Mode, Options)) -> Result<()> {
    if path.as_os_str() == STANDARD_OUTPUT {
        let stdout = crate::output::lines_to_standard_error()?;
        *pending() = Some(Pending::new(path.to_owned(), Destination::StandardOutput(stdout), asked));
        return Ok(());
    }
    let shown = path.display();
    let target = match std::fs::metadata(path) {
        Ok(meta) => {
            let kind = meta.file_type();
            if !kind.is_file() {
                let what = if kind.is_fifo() { "a FIFO" } else { "not a regular file" };
                bail!("--json {shown} is {what}; give the path of a regular file");
            }
            if standard_files().contains(&(meta.dev(), meta.ino())) {
                bail!(
                    "--json {shown} is the file this run's standard output or error goes to: writing the \
                     document there would destroy what the run prints and what the file held; give another file, \
                     or --json - for the document alone on standard output (every other line then goes to \
                     standard error)"
                );
            }
            std::fs::canonicalize(path).with_context(|| format!("--json {shown}: resolving the path"))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                bail!("--json {shown} is a symbolic link to nothing; give the path of a regular file");
            }
            path.to_owned()
        }
        Err(e) => return Err(e).with_context(|| format!("--json {shown}")),
    };
    let dir = directory_of(&target);
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK)
        .with_context(|| format!("--json {shown}: cannot write in {}", dir.display()))?;
    *pending() = Some(Pending::new(path.to_owned(), Destination::File(target), asked));
    Ok(())
}

/// Makes the inherited descriptor `fd` (`--report-fd`) the document of this run (`asked`: its mode and options).
pub fn open_inherited(fd: std::os::fd::RawFd, asked: (Mode, Options)) -> Result<()> {
    let pipe = std::fs::File::from(crate::inherit::take(fd, "--report-fd")?);
    *pending() = Some(Pending::new(PathBuf::new(), Destination::Inherited(pipe), asked));
    Ok(())
}

/// Makes `pipe` the document of this run (`asked`: its mode and options), in place of any other: the run inside an isolation hands
/// it to the process outside, which writes it where the user asked (see `isolation::outside`). The standard
/// output kept for `--json -` is closed here with the document it replaces: the process outside holds it.
pub fn hand_over(pipe: std::fs::File, asked: (Mode, Options)) {
    *pending() = Some(Pending::new(PathBuf::new(), Destination::Inherited(pipe), asked));
}

/// Whether this run's document goes to standard output (`--json -`): then it is written before the verdict
/// line, which says whether it reached its reader.
pub fn to_standard_output() -> bool {
    pending().as_ref().is_some_and(|p| matches!(p.destination, Destination::StandardOutput(_)))
}

/// Whether this run writes a document: what is only asked for it need not be asked otherwise.
fn requested() -> bool {
    pending().is_some()
}

/// Notes the driver the run loaded: its versions, and whether it is the simulation.
pub fn note_driver(driver: &dyn Driver) {
    if !requested() {
        return;
    }
    let simulated = driver.simulated();
    let facts = DriverFacts {
        version: if simulated { None } else { kernel_module_version() },
        cuda_version: if simulated { None } else { driver.version().ok() },
        simulated,
    };
    if let Some(pending) = pending().as_mut() {
        pending.driver = Some(facts);
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

/// Notes every device the driver reports, and which of them the run chose; a device that cannot be asked
/// is left out.
pub fn note_devices(driver: &dyn Driver, chosen: &[i32]) {
    if !requested() {
        return;
    }
    let count = driver.device_count().unwrap_or(0);
    let devices: Vec<Device> = (0..count)
        .filter_map(|d| Some(Device::of(d, &driver.device_info(d).ok()?, chosen.contains(&d))))
        .collect();
    if let Some(pending) = pending().as_mut() {
        pending.devices = devices;
    }
}

fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Once the run is over, where its processes' placement was noted: the forecast of each path the run took
/// beside what happened (it `passed`, or the driver `refused` a handle), kept for the document; the text
/// to print.
/// `ipc` and `sync`: the run's `--ipc` and `--sync`, which say the paths it took.
pub fn forecast_against_outcome(
    ipc: &str,
    sync: &str,
    passed: bool,
    refused: Option<&Refused>,
) -> Option<String> {
    let mut placement = PLACEMENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let placement = placement.as_mut()?;
    let paths = crate::placement::paths_of(ipc, sync);
    let refused = refused.map(|r| (r.event, r.error.as_str(), r.beyond_the_simulation));
    let against = placement.against(&paths, passed, refused);
    let text = crate::placement::against_text(&against);
    placement.against = Some(against);
    Some(text)
}

/// Where the processes that joined stand, once they all have: said once the run is over, with or without
/// a `--json` document.
static PLACEMENT: Mutex<Option<crate::placement::Placement>> = Mutex::new(None);

/// Notes where the processes that joined stand (`joiners`, once every process has joined).
pub fn note_placement(placement: crate::placement::Placement) {
    *PLACEMENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(placement);
}

/// Notes a refusal that a process which joined this run reported (the first one is kept).
pub fn note_refused(refused: Refused) {
    if let Some(pending) = pending().as_mut() {
        pending.refused.get_or_insert(refused);
    }
}

/// The reason a waived run gives (see [`waive!`](crate::waive)).
static WAIVER: Mutex<Option<String>> = Mutex::new(None);

/// Whether this process's verdict line (or that of the process outside its isolation) will say the waiver.
static VERDICT_SAYS_THE_WAIVER: AtomicBool = AtomicBool::new(false);

/// This process (a role a user starts) ends with a verdict line, which says why a waived run was waived:
/// [`waive!`](crate::waive) then does not say it a line before.
pub fn verdict_says_the_waiver() {
    VERDICT_SAYS_THE_WAIVER.store(true, Ordering::Relaxed);
}

/// Remembers why the run is waived, for the document and the verdict; true where the verdict will say it.
pub fn note_waiver(reason: &str) -> bool {
    *WAIVER.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(reason.to_owned());
    VERDICT_SAYS_THE_WAIVER.load(Ordering::Relaxed)
}

/// Why the run was waived, as it said.
pub fn waiver() -> Option<String> {
    WAIVER.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
}

/// What a run that passed did, for the verdict line (`4 processes on 1 GPU, legacy IPC, events`).
static SUMMARY: Mutex<Option<String>> = Mutex::new(None);

/// Remembers what the run did, for the verdict line.
pub fn note_summary(summary: String) {
    *SUMMARY.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(summary);
}

/// What the run did, as its role said.
pub fn summary() -> Option<String> {
    SUMMARY.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
}

/// A role's handle on the run's `--json` document.
pub struct JsonFile(());

impl JsonFile {
    /// The run's document, if `main` opened one (`--json FILE` or `--report-fd FD`).
    pub fn requested() -> Option<Self> {
        pending().is_some().then_some(Self(()))
    }

    /// Hands over the role's results; they are written, after the run's verdict, by [`finish`].
    pub fn write(self, results: Results) -> Result<()> {
        match pending().as_mut() {
            Some(pending) => pending.results = Some(results),
            None => bail!("--json: the document is gone before the run ended"),
        }
        Ok(())
    }
}

/// How the run ended, as `main` decided it.
pub struct Verdict<'a> {
    pub status: Status,
    pub reason: Option<&'a str>,
    /// What `ipc::diagnose` found, where it explained the failure.
    pub diagnosis: Option<&'a Diagnosis>,
    /// Where the run failed because the driver refused a handle in this process (see [`Refused::of`]).
    pub refused: Option<Refused>,
    pub exit_status: u8,
}

/// The whole document of `pending`, with the verdict.
fn document(pending: &mut Pending, verdict: &Verdict) -> Document {
    let (mut run, mut mechanisms, mut bench, mut matrix) = (None, None, None, None);
    match pending.results.take() {
        Some(Results::Run(results)) => run = Some(results),
        Some(Results::Mechanisms(rows)) => mechanisms = Some(rows),
        Some(Results::Bench(results)) => bench = Some(results),
        Some(Results::Matrix(cells)) => matrix = Some(cells),
        None => {}
    }
    // `--ipc all` loads no driver itself: its runs say what they found.
    let (mut driver, mut devices) = (pending.driver.take(), std::mem::take(&mut pending.devices));
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
        cause: verdict.diagnosis.map(|d| d.cause.clone()),
        fix: verdict.diagnosis.map(|d| d.fix.clone()),
        // A refusal counts only where the run failed.
        refused: match verdict.status {
            Status::Failed => verdict.refused.clone().or_else(|| pending.refused.take()),
            _ => None,
        },
        summary: (verdict.status == Status::Passed).then(summary).flatten(),
        exit_status: verdict.exit_status,
        mode: pending.mode,
        driver,
        devices,
        options: pending.options.clone(),
        run,
        mechanisms,
        bench,
        matrix,
        placement: PLACEMENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take(),
    }
}

/// Writes this run's document, if it was given `--json`: to a new file beside the path, renamed over it (or
/// to the inherited pipe).
pub fn finish(verdict: &Verdict) -> Result<()> {
    let Some(mut pending) = pending().take() else { return Ok(()) };
    let text = document::text(&document(&mut pending, verdict)).context("writing the --json document")?;
    write(pending, &text)
}

/// Writes `document`, which another process of this run made whole (the run inside an isolation), as this
/// run's, if it was given `--json` (or `--report-fd`).
pub fn finish_document(document: Document) -> Result<()> {
    let Some(pending) = pending().take() else { return Ok(()) };
    let text = document::text(&document).context("writing the --json document")?;
    write(pending, &text)
}

/// Writes `text` to a new file beside the path, renamed over it (or to the inherited pipe, or to standard
/// output: `Err(ReaderGone)` where its reader went away before it took the whole document).
fn write(pending: Pending, text: &str) -> Result<()> {
    let target = match pending.destination {
        Destination::File(target) => target,
        Destination::Inherited(mut pipe) => {
            // --ipc all, the matrix, or the process outside an isolation started this run.
            let what = "writing the document back to the process that started this run (--report-fd)";
            return pipe.write_all(text.as_bytes()).context(what);
        }
        Destination::StandardOutput(stdout) => {
            return crate::output::deliver(stdout.as_fd(), text.as_bytes());
        }
    };
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = directory_of(&target).join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(0o644).open(&temporary)?;
        // The file it replaces keeps its permissions.
        if let Ok(old) = std::fs::metadata(&target) {
            file.set_permissions(std::fs::Permissions::from_mode(old.permissions().mode()))?;
        }
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, &target)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.with_context(|| format!("writing --json {}", pending.given.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passed() -> Verdict<'static> {
        Verdict { status: Status::Passed, reason: None, diagnosis: None, refused: None, exit_status: 0 }
    }

    /// One test for the process-wide document, so that no two tests share it at once.
    #[test]
    fn a_regular_file_is_replaced_whole_and_anything_else_refused_without_blocking() {
        let asked = || {
            let (mode, options) = crate::role::Role::Topology.asked();
            (mode, Options { ipc: "vmm".into(), ..options })
        };
        let tmp = tempfile::Builder::new().prefix("simple-ipc-json-").tempdir().unwrap();
        let dir = tmp.path();
        let file = dir.join("t.json");
        std::fs::write(&file, "an old and much longer document").unwrap();
        open(&file, asked()).unwrap();
        JsonFile::requested().unwrap().write(Results::Mechanisms(Vec::new())).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "an old and much longer document", "not yet");
        let diagnosis = Diagnosis::new("the cause".into(), "; what fixes it: ", "the fix".into());
        let failed = Verdict {
            status: Status::Failed,
            reason: Some("x"),
            diagnosis: Some(&diagnosis),
            refused: None,
            exit_status: 1,
        };
        finish(&failed).unwrap();
        let doc: Document = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!((doc.status, doc.exit_status, doc.reason.as_deref()), (Status::Failed, 1, Some("x")));
        assert_eq!((doc.cause.as_deref(), doc.fix.as_deref()), (Some("the cause"), Some("the fix")));
        assert_eq!((doc.mode, doc.options.ipc.as_str()), (Mode::Run, "vmm"));
        assert_eq!(doc.mechanisms, Some(Vec::new()), "the role's results are there");
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 1, "no temporary file is left");
        assert!(JsonFile::requested().is_none(), "written once");
        finish(&passed()).unwrap();

        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let refused = open(&fifo, asked()).expect_err("a FIFO is refused");
        assert!(format!("{refused:#}").contains("is a FIFO"), "{refused:#}");
        assert!(open(&dir.join("no/such/dir/t.json"), asked()).is_err());
        assert!(open(dir, asked()).is_err(), "a directory is refused");
        assert!(JsonFile::requested().is_none(), "nothing refused is opened");
    }

    #[test]
    fn the_kernel_modules_version_is_read_from_its_line() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:38 UTC 2025\nGCC version:  gcc version 12.3.0\n";
        assert_eq!(version_in(proprietary).as_deref(), Some("580.65.06"));
        // The H200 host's.
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n";
        assert_eq!(version_in(open).as_deref(), Some("580.159.04"));
        assert_eq!(version_in("GCC version: 12.3.0\n"), None);
    }
}
