//! Everything the program writes: lines on standard output, whose write errors fail the run (a full disk,
//! a closed descriptor; a reader that went away ends the process by SIGPIPE, as with any C program), warnings
//! on standard error, which cannot fail the run, and the `--json` file, opened before the run so that a bad
//! path is reported at once and a FIFO can never block it.

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::os::fd::RawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Opens `/dev/null` on standard input, output or error where one is closed, so that no descriptor the
/// program opens later (the segment, a pipe) takes its number and receives what is meant for it. Call it
/// first thing, while the process has one thread.
pub fn fill_closed_standard_descriptors() {
    for fd in 0..3 {
        // SAFETY: only asks whether the number is open; nothing is owned or closed.
        let closed = nix::fcntl::fcntl(
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
            nix::fcntl::FcntlArg::F_GETFD,
        )
        .is_err();
        if closed {
            // The lowest free number is `fd` itself, since the numbers below it are open.
            let null = std::fs::OpenOptions::new().read(fd == 0).write(fd != 0).open("/dev/null");
            // Kept open for the process's life, as the standard descriptor it stands for.
            std::mem::forget(null);
        }
    }
}

/// Writes a line (use [`say!`](crate::say)) and flushes it, so that the lines of several processes come
/// out in the order they were written.
pub fn line(args: std::fmt::Arguments) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .context("writing to standard output")
}

/// Writes text as it is, and flushes it.
pub fn text(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).context("writing to standard output")
}

/// Writes a line to standard error in one write, so that the lines of processes sharing it do not
/// interleave; an error writing it is ignored (there is nowhere left to report it).
pub fn warn(args: std::fmt::Arguments) {
    let _ = std::io::stderr().write_all(format!("{args}\n").as_bytes());
}

/// `say!("...", ...)`: a line on standard output, `Err` if it cannot be written.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => { $crate::output::line(format_args!($($arg)*)) };
}

/// `warn!("...", ...)`: a line on standard error, never failing.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::output::warn(format_args!($($arg)*)) };
}

/// The `--json` file: a regular file, opened (created if need be) before the run, replaced when written.
pub struct JsonFile {
    path: PathBuf,
    file: File,
}

impl JsonFile {
    /// Opens `path` for writing without blocking; anything but a regular file (a FIFO, a device, a socket) is
    /// refused, so that the run can neither hang on it nor write half a document into a pipe.
    pub fn create(path: &Path) -> Result<Self> {
        let shown = path.display();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .mode(0o644)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path)
            .with_context(|| format!("--json {shown}: cannot open it for writing"))?;
        let kind = file.metadata().with_context(|| format!("--json {shown}"))?.file_type();
        if !kind.is_file() {
            let what = if kind.is_fifo() { "a FIFO" } else { "not a regular file" };
            bail!("--json {shown} is {what}; give the path of a regular file");
        }
        Ok(Self { path: path.to_owned(), file })
    }

    /// Replaces the file's contents with `document`.
    pub fn write(mut self, document: &str) -> Result<()> {
        let shown = self.path.display();
        self.file.set_len(0).with_context(|| format!("truncating {shown}"))?;
        self.file.rewind().with_context(|| format!("writing {shown}"))?;
        self.file.write_all(document.as_bytes()).with_context(|| format!("writing {shown}"))
    }
}

/// Where a run's JSON document goes: the `--json` file, or the pipe that `--ipc all` handed the run of one
/// mechanism (`--report-fd`), so that its result comes back without a file.
pub enum JsonOut {
    File(JsonFile),
    Inherited(File),
}

impl JsonOut {
    /// Opens `--json FILE` or takes the inherited descriptor of `--report-fd FD`; `None` if neither is given.
    pub fn open(file: Option<&Path>, report_fd: Option<RawFd>) -> Result<Option<Self>> {
        if let Some(fd) = report_fd {
            return Ok(Some(Self::Inherited(File::from(crate::inherit::take(fd, "--report-fd")?))));
        }
        Ok(file.map(JsonFile::create).transpose()?.map(Self::File))
    }

    pub fn write(self, document: &str) -> Result<()> {
        match self {
            Self::File(file) => file.write(document),
            Self::Inherited(mut pipe) => {
                pipe.write_all(document.as_bytes()).context("writing the result to --ipc all (--report-fd)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked process (the test harness keeps its own descriptors): with standard output closed, the
    /// next descriptor opened would be 1; after the filling, 1 is /dev/null and a new one is not 0, 1 or 2.
    #[test]
    fn closed_standard_descriptors_are_filled_with_dev_null() {
        // SAFETY: (test) the forked child only closes, opens, reads links and leaves with _exit.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                // SAFETY: (test) fd 1 of the forked child alone.
                unsafe { nix::libc::close(1) };
                fill_closed_standard_descriptors();
                let one = std::fs::read_link("/proc/self/fd/1").ok();
                let next = File::open("/proc/self/stat").map(|f| std::os::fd::AsRawFd::as_raw_fd(&f));
                let ok = one.as_deref() == Some(Path::new("/dev/null")) && next.is_ok_and(|fd| fd > 2);
                // SAFETY: (test) leaves the forked child without the harness's exit handlers.
                unsafe { nix::libc::_exit(if ok { 0 } else { 1 }) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0), "fd 1 is not /dev/null");
            }
        }
    }

    #[test]
    fn json_replaces_a_regular_file_and_refuses_a_fifo_without_blocking() {
        let dir = std::env::temp_dir().join(format!("simple-ipc-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.json");
        std::fs::write(&file, "an old and much longer document").unwrap();
        JsonFile::create(&file).unwrap().write("{}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{}\n");

        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let refused = JsonFile::create(&fifo).err().expect("a FIFO without a reader is refused");
        assert!(format!("{refused:#}").contains("--json"), "{refused:#}");
        // With a reader it opens, and is still refused: it is not a regular file.
        let _reader = OpenOptions::new().read(true).custom_flags(nix::libc::O_NONBLOCK).open(&fifo).unwrap();
        let refused = JsonFile::create(&fifo).err().expect("a FIFO with a reader is refused too");
        assert!(format!("{refused:#}").contains("is a FIFO"), "{refused:#}");

        assert!(JsonFile::create(&dir.join("no/such/dir/t.json")).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
