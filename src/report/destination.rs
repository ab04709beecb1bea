//! Where the `--json` document (or the `--metrics` file) goes, checked before anything runs, and writing it
//! there whole: a file replaced by a rename (so that the path holds the old document or the whole new one,
//! as node_exporter's textfile collector needs of a metrics file), the pipe back to the process that
//! started this run, or standard output (`--json -`, `--metrics -`).
//!
//! A file may be asked for in a directory that others can write in (`/tmp`, as root), where another user
//! may have made the name first. The document is written as careful tools write there, so that the name
//! cannot take it anywhere else nor hand it to that user:
//! - a symbolic link that another user made in a sticky directory is never followed: it is refused before
//!   the run ([`resolved`]), as the kernel refuses it where `fs.protected_symlinks` is 1. Following it would
//!   write where that user chose (a file of root's in a directory only root can read); replacing the link
//!   instead would quietly drop the path the user asked for, and a link the user made is followed, as ever;
//! - the new file is this process's own, made with `O_EXCL` under a random name beside the path (a name
//!   made first by someone else is never written into, nor removed), then renamed over it;
//! - it keeps the permissions of the file it replaces only where that file was this process's user's: a
//!   file another user made first (`0666`, to rewrite the verdict later) gives its mode to nothing.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The `--json` (or `--metrics`) path that means standard output.
pub(super) const STANDARD_OUTPUT: &str = "-";

/// The permissions of a new document, less the umask: anyone may read it, only its owner write it.
const NEW_FILE_MODE: u32 = 0o644;

/// How many symbolic links a path may take before it is refused, as the kernel's `ELOOP` (40).
const MOST_LINKS: usize = 40;

/// Which form of the document a destination takes: the JSON document, or its metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Output {
    Json,
    Metrics,
}

impl Output {
    /// Its option.
    fn option(self) -> &'static str {
        match self {
            Output::Json => "--json",
            Output::Metrics => "--metrics",
        }
    }

    /// What it is, in messages.
    fn what(self) -> &'static str {
        match self {
            Output::Json => "document",
            Output::Metrics => "metrics",
        }
    }

    /// What it is on standard output: `--json document`, `metrics (--metrics -)`.
    fn streamed(self) -> &'static str {
        match self {
            Output::Json => "--json document",
            Output::Metrics => "metrics (--metrics -)",
        }
    }

    /// Its option and what it is: `--json document`, `--metrics file`.
    fn named(self) -> &'static str {
        match self {
            Output::Json => "--json document",
            Output::Metrics => "--metrics file",
        }
    }
}

/// Where the document goes.
pub(super) enum Destination {
    /// The path with its symbolic links resolved, so that the rename replaces the file and not a link to it.
    File(PathBuf),
    /// The pipe that `--ipc all` handed the run of one mechanism (`--report-fd`), so that the result comes
    /// back without a file.
    Inherited(std::fs::File),
    /// `--json -`: the standard output the invoker gave, which carries the document alone (descriptor 1 is
    /// standard error's copy from [`open`](super::open) on).
    StandardOutput(OwnedFd),
}

impl Destination {
    /// Checks `path` for `--json` or `--metrics` (`output`; see [`report`](super)'s doc): `-` is standard
    /// output, and every other line of the run goes to standard error from now on.
    pub(super) fn checked(output: Output, path: &Path) -> Result<Self> {
        if path.as_os_str() == STANDARD_OUTPUT {
            return Ok(Self::StandardOutput(crate::output::lines_to_standard_error()?));
        }
        let (option, what) = (output.option(), output.what());
        let shown = path.display();
        let target = resolved(path).with_context(|| format!("{option} {shown}"))?;
        match std::fs::metadata(&target) {
            Ok(meta) => {
                let kind = meta.file_type();
                if !kind.is_file() {
                    let kind = if kind.is_fifo() { "a FIFO" } else { "not a regular file" };
                    bail!("{option} {shown} is {kind}; give the path of a regular file");
                }
                if standard_files().contains(&(meta.dev(), meta.ino())) {
                    bail!(
                        "{option} {shown} is the file this run's standard output or error goes to: writing \
                         the {what} there would destroy what the run prints and what the file held; give \
                         another file, or {option} - for the {what} alone on standard output (every other \
                         line then goes to standard error)"
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink()) {
                    bail!("{option} {shown} is a symbolic link to nothing; give the path of a regular file");
                }
            }
            Err(e) => return Err(e).with_context(|| format!("{option} {shown}")),
        }
        let dir = directory_of(&target);
        nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK)
            .with_context(|| format!("{option} {shown}: cannot write in {}", dir.display()))?;
        Ok(Self::File(target))
    }

    /// Whether this is a file, which can be written again (a stream has taken what it was given).
    pub(super) fn is_file(&self) -> bool {
        matches!(self, Self::File(_))
    }

    /// Whether this and `other` are the same file (two outputs of one run must not be).
    pub(super) fn same_file(&self, other: &Destination) -> bool {
        matches!((self, other), (Self::File(a), Self::File(b)) if a == b)
    }

    /// Writes `text` (`output`, given as `given`) to a new file beside the path, renamed over it (or to the
    /// inherited pipe, or to standard output: `Err(ReaderGone)` where its reader went away before it took
    /// the whole document).
    pub(super) fn write(&self, output: Output, given: &Path, text: &str) -> Result<()> {
        let target = match self {
            Self::File(target) => target,
            Self::Inherited(pipe) => {
                // --ipc all, the matrix, or the process outside an isolation started this run.
                let what = "writing the document back to the process that started this run (--report-fd)";
                let mut pipe: &std::fs::File = pipe;
                return pipe.write_all(text.as_bytes()).context(what);
            }
            Self::StandardOutput(stdout) => {
                return crate::output::deliver(stdout.as_fd(), text.as_bytes())
                    .with_context(|| format!("writing the {} to standard output", output.streamed()));
            }
        };
        replace(target, text)
            .with_context(|| format!("could not write the {} {}", output.named(), given.display()))
    }
}

/// Writes `text` to a file of this process's own, made under a random name beside `target` with `O_EXCL`
/// (`.NAME.XXXXXX.tmp`), and renames it over `target`: the rename replaces whatever the name is then (a
/// link is replaced, never followed). The temporary file goes if anything fails; nothing else is removed.
fn replace(target: &Path, text: &str) -> std::io::Result<()> {
    let mut prefix = OsString::from(".");
    prefix.push(target.file_name().unwrap_or_default());
    prefix.push(".");
    let mut file = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(NEW_FILE_MODE))
        .tempfile_in(directory_of(target))?;
    if let Some(mode) = kept_mode(target) {
        file.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    // Through the file itself: the temporary name, which goes on failure, is not worth naming in the error.
    file.as_file_mut().write_all(text.as_bytes())?;
    file.as_file().sync_all()?;
    // On failure, the temporary file in the error is dropped, which removes it.
    file.persist(target).map(drop).map_err(|failed| failed.error)
}

/// The permissions to keep: those of the regular file at `target`, where this process's user owns it. The
/// file of another user (made first in a shared directory, as `0666`) lends its mode to nothing: the new
/// file has [`NEW_FILE_MODE`] less the umask.
fn kept_mode(target: &Path) -> Option<u32> {
    let meta = std::fs::symlink_metadata(target).ok()?;
    let ours = meta.file_type().is_file() && meta.uid() == nix::unistd::geteuid().as_raw();
    ours.then_some(meta.permissions().mode() & 0o777)
}

/// One step of a path being resolved.
enum Step {
    Root,
    Up,
    Name(OsString),
}

/// The steps of `path`, last first (a stack: the next step is popped).
fn steps_of(path: &Path) -> Vec<Step> {
    let steps = path.components().filter_map(|c| match c {
        Component::RootDir => Some(Step::Root),
        Component::ParentDir => Some(Step::Up),
        Component::Normal(name) => Some(Step::Name(name.to_owned())),
        Component::CurDir | Component::Prefix(_) => None,
    });
    let mut steps: Vec<Step> = steps.collect();
    steps.reverse();
    steps
}

/// `path`, absolute, with every symbolic link in it resolved as the kernel follows them (its last name may
/// not exist yet), refusing a link that another user made in a sticky directory ([`refuse_anothers_link`]).
/// Each link is looked at (`lstat`, `readlink`) before it is followed: none is followed by the kernel here.
fn resolved(path: &Path) -> Result<PathBuf> {
    let mut real = if path.is_absolute() {
        PathBuf::from("/")
    } else {
        std::env::current_dir().context("the current directory")?
    };
    let mut todo = steps_of(path);
    let mut links = 0;
    while let Some(step) = todo.pop() {
        let name = match step {
            Step::Root => {
                real = PathBuf::from("/");
                continue;
            }
            Step::Up => {
                real.pop();
                continue;
            }
            Step::Name(name) => name,
        };
        let next = real.join(&name);
        let meta = match std::fs::symlink_metadata(&next) {
            Ok(meta) => meta,
            // The document's own name, not there yet.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && todo.is_empty() => {
                real = next;
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("looking at {}", next.display())),
        };
        if !meta.file_type().is_symlink() {
            real = next;
            continue;
        }
        links += 1;
        if links > MOST_LINKS {
            bail!("more than {MOST_LINKS} symbolic links to follow (a loop?)");
        }
        refuse_anothers_link(&next, &meta, &real)?;
        let points_to =
            std::fs::read_link(&next).with_context(|| format!("reading the link {}", next.display()))?;
        // Where it points, resolved from the directory that holds it (`real`, as it is).
        todo.extend(steps_of(&points_to));
    }
    Ok(real)
}

/// Refuses the symbolic link `link` (`meta`: its own, not its target's) in directory `dir` where that
/// directory is sticky and the link is neither this process's user's nor the directory's owner's: the
/// kernel's rule for `fs.protected_symlinks`, which a host may have turned off, kept here whatever it is.
/// In a sticky directory anyone may make a name; only the names its owner or this user made are trusted.
fn refuse_anothers_link(link: &Path, meta: &std::fs::Metadata, dir: &Path) -> Result<()> {
    let holder =
        std::fs::metadata(dir).with_context(|| format!("looking at the directory {}", dir.display()))?;
    let sticky = holder.mode() & nix::libc::S_ISVTX != 0;
    let me = nix::unistd::geteuid().as_raw();
    if !sticky || meta.uid() == me || meta.uid() == holder.uid() {
        return Ok(());
    }
    let who = match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(meta.uid())) {
        Ok(Some(user)) => format!("user {} ({})", user.name, meta.uid()),
        _ => format!("user {}", meta.uid()),
    };
    bail!(
        "{} is a symbolic link that {who} made in {}, a sticky directory others can write in: following it \
         would write this run's document wherever that user points it, so it is not followed (as the kernel \
         does where fs.protected_symlinks is 1); give a path of your own, or remove the link",
        link.display(),
        dir.display()
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Links are resolved as the kernel resolves them (`realpath`): relative to the directory that holds
    /// them, `..` after a link from where the link led; a loop is refused, and so is a missing directory.
    #[test]
    fn a_path_is_resolved_as_the_kernel_resolves_it() {
        let tmp = tempfile::Builder::new().prefix("simple-ipc-resolve-").tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir_all(dir.join("real/sub")).unwrap();
        std::fs::write(dir.join("real/file.json"), "").unwrap();
        let link = |target: &str, name: &str| std::os::unix::fs::symlink(target, dir.join(name)).unwrap();
        link("real/file.json", "relative");
        link("relative", "chain");
        link("real/sub", "deep");
        link("loop-b", "loop-a");
        link("loop-a", "loop-b");
        for name in ["relative", "chain"] {
            assert_eq!(resolved(&dir.join(name)).unwrap(), dir.join("real/file.json"), "{name}");
        }
        // `..` after a link goes up from where it led, not from the link's own directory.
        assert_eq!(resolved(&dir.join("deep/../new.json")).unwrap(), dir.join("real/new.json"));
        assert_eq!(resolved(&dir.join("./new.json")).unwrap(), dir.join("new.json"), "a name not there yet");
        let Err(looped) = resolved(&dir.join("loop-a")) else { panic!("a loop is refused") };
        assert!(format!("{looped:#}").contains("symbolic links"), "{looped:#}");
        assert!(resolved(&dir.join("no/such/new.json")).is_err(), "a missing directory is refused");
    }

    /// The permissions of a file this user owns are kept; a link's, or a name not there, give none.
    #[test]
    fn only_this_users_own_file_lends_its_permissions() {
        let tmp = tempfile::Builder::new().prefix("simple-ipc-kept-").tempdir().unwrap();
        let file = tmp.path().join("run.json");
        std::fs::write(&file, "").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(kept_mode(&file), Some(0o640));
        let link = tmp.path().join("link.json");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(kept_mode(&link), None, "a link lends nothing: the rename replaces it");
        assert_eq!(kept_mode(&tmp.path().join("new.json")), None);
        replace(&file, "{}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{}\n");
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o640, "kept");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 2, "no temporary file is left");
    }
}
