//! The `--json` document: every run given `--json FILE` writes one, however it ends, that says how
//! (`"status"`: passed, failed, waived or interrupted; `"reason"`: why, or null; `"exit_status"`), followed by
//! what the role reports on success (the timings, the benchmark's figures, the table of `--ipc all`).
//!
//! No option may destroy the user's data, so the file is handled in three steps:
//! - [`open`], before anything runs: the path must be a regular file or not exist yet, in a directory this
//!   process can write, and must not be the file this process's standard output or error goes to
//!   (`--json /dev/stdout >> log`, `--json F > F`): writing it would destroy what the run prints and what was
//!   there before. Nothing is opened or truncated, so a FIFO can never block the run.
//! - A role's [`JsonFile::write`] hands over its details; the verdict is not known yet.
//! - [`finish`], from `main` once the exit status is decided: the document goes to a new file beside the path
//!   and is renamed over it, so the path holds the old document or the whole new one, never an empty or
//!   partial one.
//!
//! It is process-wide state because there is one document per run and only `main` knows its verdict.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use anyhow::{Context, Result, bail};

/// The document of this run, between [`open`] (or [`open_inherited`]) and [`finish`].
struct Pending {
    /// The path as given, to compare with the roles' and to name in messages; empty for an inherited pipe.
    given: PathBuf,
    destination: Destination,
    /// The role's document, once it wrote one.
    details: Option<String>,
}

/// Where the document goes.
enum Destination {
    /// The path with its symbolic links resolved, so that the rename replaces the file and not a link to it.
    File(PathBuf),
    /// The pipe that `--ipc all` handed the run of one mechanism (`--report-fd`), so that the result comes
    /// back without a file.
    Inherited(std::fs::File),
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

/// Checks `path` for `--json` (see the module's doc) and makes it this run's document.
pub fn open(path: &Path) -> Result<()> {
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
                     document there would destroy what the run prints and what the file held; give another file"
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
    *pending() =
        Some(Pending { given: path.to_owned(), destination: Destination::File(target), details: None });
    Ok(())
}

/// Makes the inherited descriptor `fd` (`--report-fd`) this run's document.
pub fn open_inherited(fd: std::os::fd::RawFd) -> Result<()> {
    let pipe = std::fs::File::from(crate::inherit::take(fd, "--report-fd")?);
    *pending() =
        Some(Pending { given: PathBuf::new(), destination: Destination::Inherited(pipe), details: None });
    Ok(())
}

fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// The reason a waived run gives (see [`waive!`](crate::waive)).
static WAIVER: Mutex<Option<String>> = Mutex::new(None);

/// Remembers why the run is waived, for the document.
pub fn note_waiver(reason: &str) {
    *WAIVER.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(reason.to_owned());
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

    /// The run's document at `path`: the one `main` opened, or, if none was, one opened now (see [`open`]).
    pub fn create(path: &Path) -> Result<Self> {
        let opened = pending().as_ref().is_some_and(|p| p.given == path);
        if !opened {
            open(path)?;
        }
        Ok(Self(()))
    }

    /// Hands over the role's document, a JSON object; it is written, after the run's verdict, by [`finish`].
    pub fn write(self, document: &str) -> Result<()> {
        match pending().as_mut() {
            Some(pending) => pending.details = Some(document.to_owned()),
            None => bail!("--json: the document was handed over twice"),
        }
        Ok(())
    }
}

/// How a run ended, as the document's `"status"` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Passed,
    Failed,
    Waived,
    Interrupted,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Waived => "waived",
            Status::Interrupted => "interrupted",
        }
    }
}

/// A JSON string literal of `text`.
pub fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The whole document: how the run ended, then the role's fields (`details` is a JSON object, or none).
pub fn document(status: Status, reason: Option<&str>, exit_status: u8, details: Option<&str>) -> String {
    let head = format!(
        "\"status\": \"{}\", \"reason\": {}, \"exit_status\": {exit_status}",
        status.name(),
        reason.map_or_else(|| "null".to_owned(), json_string)
    );
    let rest = details.and_then(|d| d.trim().strip_prefix('{')).map(str::trim_start).unwrap_or("}");
    let comma = if rest.starts_with('}') { "" } else { ", " };
    format!("{{{head}{comma}{}\n", rest.trim_end())
}

/// Writes this run's document, if it was given `--json`: to a new file beside the path, renamed over it (or
/// to the inherited pipe).
pub fn finish(status: Status, reason: Option<&str>, exit_status: u8) -> Result<()> {
    let Some(pending) = pending().take() else { return Ok(()) };
    let text = document(status, reason, exit_status, pending.details.as_deref());
    let target = match pending.destination {
        Destination::File(target) => target,
        Destination::Inherited(mut pipe) => {
            return pipe.write_all(text.as_bytes()).context("writing the result to --ipc all (--report-fd)");
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

    #[test]
    fn the_document_says_how_the_run_ended_before_the_roles_fields() {
        assert_eq!(
            document(Status::Passed, None, 0, Some("{\"unit\": \"ms\", \"processes\": 2}\n")),
            "{\"status\": \"passed\", \"reason\": null, \"exit_status\": 0, \"unit\": \"ms\", \"processes\": 2}\n"
        );
        assert_eq!(
            document(Status::Failed, Some("a \"quoted\"\nline"), 1, None),
            "{\"status\": \"failed\", \"reason\": \"a \\\"quoted\\\"\\u000aline\", \"exit_status\": 1}\n"
        );
        assert_eq!(
            document(Status::Waived, Some("no"), 2, Some("{}")),
            "{\"status\": \"waived\", \"reason\": \"no\", \"exit_status\": 2}\n"
        );
    }

    /// One test for the process-wide document, so that no two tests share it at once.
    #[test]
    fn a_regular_file_is_replaced_whole_and_anything_else_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("simple-ipc-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.json");
        std::fs::write(&file, "an old and much longer document").unwrap();
        JsonFile::create(&file).unwrap().write("{\"a\": 1}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "an old and much longer document", "not yet");
        finish(Status::Passed, None, 0).unwrap();
        let expected = "{\"status\": \"passed\", \"reason\": null, \"exit_status\": 0, \"a\": 1}\n";
        assert_eq!(std::fs::read_to_string(&file).unwrap(), expected);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file is left");

        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let refused = JsonFile::create(&fifo).err().expect("a FIFO is refused");
        assert!(format!("{refused:#}").contains("is a FIFO"), "{refused:#}");
        assert!(JsonFile::create(&dir.join("no/such/dir/t.json")).is_err());
        assert!(JsonFile::create(&dir).is_err(), "a directory is refused");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
