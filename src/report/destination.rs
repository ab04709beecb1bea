//! Where the `--json` document goes, checked before anything runs, and writing it there whole: a file
//! replaced by a rename (so that the path holds the old document or the whole new one), the pipe back to
//! the process that started this run, or standard output (`--json -`).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The `--json` path that means standard output.
const STANDARD_OUTPUT: &str = "-";

/// Where the document goes.
pub(super) enum Destination {
    /// The path with its symbolic links resolved, so that the rename replaces the file and not a link to it.
    File(PathBuf),
    /// The pipe that `--ipc all` handed the run of one mechanism (`--report-fd`), so that the result comes
    /// back without a file.
    Inherited(std::fs::File),
    /// The pipe to the process outside this isolated run, which writes the document where the user asked
    /// and says the verdict (see `isolation::outside`).
    Outside(std::fs::File),
    /// `--json -`: the standard output the invoker gave, which carries the document alone (descriptor 1 is
    /// standard error's copy from [`open`](super::open) on).
    StandardOutput(OwnedFd),
}

impl Destination {
    /// Checks `path` for `--json` (see [`report`](super)'s doc): `-` is standard output, and every other line of the
    /// run goes to standard error from now on.
    pub(super) fn checked(path: &Path) -> Result<Self> {
        if path.as_os_str() == STANDARD_OUTPUT {
            return Ok(Self::StandardOutput(crate::output::lines_to_standard_error()?));
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
        Ok(Self::File(target))
    }

    /// Writes `text` to a new file beside the path, renamed over it (or to the inherited pipe, or to standard
    /// output: `Err(ReaderGone)` where its reader went away before it took the whole document).
    pub(super) fn write(self, given: &Path, text: &str) -> Result<()> {
        let target = match self {
            Self::File(target) => target,
            Self::Inherited(mut pipe) | Self::Outside(mut pipe) => {
                // --ipc all, the matrix, or the process outside an isolation started this run.
                let what = "writing the document back to the process that started this run (--report-fd)";
                return pipe.write_all(text.as_bytes()).context(what);
            }
            Self::StandardOutput(stdout) => {
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
        written.with_context(|| format!("writing --json {}", given.display()))
    }
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

fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}
