//! Everything the program writes: lines on standard output, whose write errors fail the run (a full disk,
//! a closed descriptor), and warnings on standard error, which cannot fail the run (the `--json` document is
//! `report`'s).
//!
//! Two things about standard output belong to the invoker and are taken as they come. A reader that goes
//! away (`simple-ipc | head -1`) ends the run as it would end a C program, with status 141 (128 + SIGPIPE)
//! and nothing more said: SIGPIPE stays ignored (Rust's default), the write answers EPIPE, and that is
//! [`ReaderGone`]. A non-blocking descriptor (O_NONBLOCK set by the invoker) is written as a blocking one
//! would be: on EAGAIN the write waits, with `poll`, until the reader has made room.
//!
//! `--json -` gives standard output to the document alone: [`lines_to_standard_error`] makes descriptor 1 a
//! copy of standard error before anything is written or started, so that every line of this process and of
//! every process it starts (children, a run of one mechanism, the run inside an isolation, all of which
//! inherit descriptor 1) goes to standard error, with no process having to know; [`deliver`] writes the
//! document to the standard output the invoker gave.

pub(crate) mod progress;

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// The reader of standard output (or error) went away: the run ends with 141 (128 + SIGPIPE), quietly, as a
/// C program killed by SIGPIPE would. `main` turns it into that status; the parent, when a child ended so.
#[derive(Debug)]
pub struct ReaderGone;

impl std::fmt::Display for ReaderGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the reader of standard output went away")
    }
}

impl std::error::Error for ReaderGone {}

/// The exit status of a run whose reader went away: 128 + SIGPIPE.
pub const READER_GONE_STATUS: u8 = 128 + nix::libc::SIGPIPE as u8;

/// Whether standard output or error is a pipe or socket whose reader has gone (`poll` says POLLERR or
/// POLLHUP): how the parent tells a child that ended by SIGPIPE because of the run's output from one that
/// met a broken pipe of its own.
pub fn reader_gone() -> bool {
    [1, 2].into_iter().any(|fd| {
        // SAFETY: standard output and error stay open for the process's life (see
        // `fill_closed_standard_descriptors`); poll only looks at them.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
        poll(&mut fds, PollTimeout::ZERO).is_ok()
            && fds[0].revents().is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP))
    })
}

/// Writes all of `bytes` to `fd`, however the descriptor behaves: a short write goes on, EINTR is retried,
/// and EAGAIN (a non-blocking descriptor whose reader is slow) waits until the descriptor takes more.
///
/// O_NONBLOCK is not cleared, not even for a moment: it belongs to the open file description, which the
/// invoker and every other process holding that output share, and clearing it would change how their writes
/// behave (and a kill could come before it was restored). Waiting in `poll` gives a blocking write's
/// behaviour to this process alone.
fn write_all_to(fd: BorrowedFd, bytes: &[u8]) -> std::io::Result<()> {
    let mut rest = bytes;
    while !rest.is_empty() {
        match nix::unistd::write(fd, rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
                match poll(&mut fds, PollTimeout::NONE) {
                    // Whatever poll saw (room, or an error the next write will report), write again.
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Writes `bytes` to standard output in one go (one writer at a time among this process's threads, so that
/// lines do not interleave): `Err(ReaderGone)` when the reader went away, an error with context otherwise.
fn to_stdout(bytes: &[u8]) -> Result<()> {
    // A progress bar on the terminal is taken off it first (its lock before std's, as for `stderr_line`).
    let written = crate::output::progress::suspend(|| {
        // Std's lock on standard output serialises the writers; its buffer is not used (every write goes
        // straight to the descriptor, so nothing is held back and nothing can be lost at exit).
        let _one_writer = std::io::stdout().lock();
        // SAFETY: standard output stays open for the process's life (see `fill_closed_standard_descriptors`).
        let stdout = unsafe { BorrowedFd::borrow_raw(1) };
        write_all_to(stdout, bytes)
    });
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(Errno::EPIPE as i32) => Err(ReaderGone.into()),
        Err(e) => Err(e).context("writing to standard output"),
    }
}

/// `--json -`: makes standard output (descriptor 1) a copy of standard error, for this process and every
/// process it starts from now on, and returns the standard output the invoker gave (close-on-exec, above 2,
/// so that no process started inherits it), which is the document's alone (see [`deliver`]). Call it before
/// anything is written or started.
pub fn lines_to_standard_error() -> Result<OwnedFd> {
    // SAFETY: standard output and error stay open for the process's life (see
    // `fill_closed_standard_descriptors`); these calls only duplicate them.
    let (stdout, stderr) = unsafe { (BorrowedFd::borrow_raw(1), BorrowedFd::borrow_raw(2)) };
    let kept = nix::fcntl::fcntl(stdout, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3))
        .context("--json -: duplicating standard output for the document")?;
    // SAFETY: `kept` is the new descriptor fcntl just made, owned by nothing else.
    let kept = unsafe { OwnedFd::from_raw_fd(kept) };
    nix::unistd::dup2_stdout(stderr)
        .context("--json -: sending the lines meant for standard output to standard error (dup2)")?;
    Ok(kept)
}

/// How long [`deliver`] waits for the reader of a pipe to take the document.
const DELIVERY: Duration = Duration::from_secs(2);

/// Writes the `--json -` document to `fd`, the standard output the invoker gave, whole: `Err(ReaderGone)`
/// where its reader went away before it took all of it (`--json - | head -c 10`), as a C program writing
/// it would die of SIGPIPE; the run then ends with 141 and says nothing more.
///
/// A write into a pipe succeeds while the pipe has room, whether or not its reader will ever read it, so
/// where `fd` is a pipe this waits, up to [`DELIVERY`], until its reader has taken every byte (`FIONREAD`
/// says none is left) or has gone away (`poll` says `POLLERR`). A reader still there but slower than that
/// gets the rest when it reads; the run ends as it would have.
pub fn deliver(fd: BorrowedFd, bytes: &[u8]) -> Result<()> {
    match write_all_to(fd, bytes) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(Errno::EPIPE as i32) => return Err(ReaderGone.into()),
        // Its caller says what it wrote (the --json document, the metrics).
        Err(e) => return Err(e.into()),
    }
    let is_pipe =
        nix::sys::stat::fstat(fd).is_ok_and(|st| st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFIFO);
    if !is_pipe {
        return Ok(());
    }
    let deadline = Instant::now() + DELIVERY;
    loop {
        let mut unread: nix::libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, into `unread`, about the pipe `fd`, which stays open.
        let asked = unsafe { nix::libc::ioctl(fd.as_raw_fd(), nix::libc::FIONREAD, &mut unread) };
        if asked != 0 || unread <= 0 {
            return Ok(());
        }
        let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
        let gone = poll(&mut fds, PollTimeout::ZERO).is_ok()
            && fds[0].revents().is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP));
        if gone {
            return Err(ReaderGone.into());
        }
        if Instant::now() >= deadline {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

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

/// `--quiet`: standard output gets the verdict line alone. A setting of how this process prints, set once by
/// `main` before any role runs, as a logger's level is: every `print_line!` reads it, and it decides nothing
/// of the verdict, so it is not passed down to each function that prints.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, [`line`] and [`text`] write nothing (`--quiet`); [`verdict`] still does.
pub fn be_quiet() {
    QUIET.store(true, std::sync::atomic::Ordering::Relaxed);
}

fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

/// Writes a line (use [`print_line!`](crate::print_line)) at once, so that the lines of several processes
/// come out in the order they were written.
pub fn line(args: std::fmt::Arguments) -> Result<()> {
    if quiet() {
        return Ok(());
    }
    to_stdout(fit_for_a_terminal(&format!("{args}\n")).as_bytes())
}

/// Writes text, at once, its lines as they are (only what [`fit_for_a_terminal`] escapes is changed).
pub fn text(text: &str) -> Result<()> {
    if quiet() {
        return Ok(());
    }
    to_stdout(fit_for_a_terminal(text).as_bytes())
}

/// Writes the run's last line, the verdict, even with `--quiet`.
pub fn verdict(line: &str) -> Result<()> {
    to_stdout(fit_for_a_terminal(&format!("{line}\n")).as_bytes())
}

/// Writes a line to standard error (use [`eprint_line!`](crate::eprint_line)) in one write, so that the
/// lines of processes sharing it do not interleave; an error writing it is ignored (there is nowhere left to
/// report it).
pub fn stderr_line(args: std::fmt::Arguments) {
    let line = format!("{args}\n");
    let line = fit_for_a_terminal(&line);
    // The progress bar's lock is taken before std's, in the order the bar's own drawing takes them.
    crate::output::progress::suspend(|| {
        let _one_writer = std::io::stderr().lock();
        // SAFETY: standard error stays open for the process's life (see `fill_closed_standard_descriptors`).
        let stderr = unsafe { BorrowedFd::borrow_raw(2) };
        let _ = write_all_to(stderr, line.as_bytes());
    });
}

/// `print_line!("...", ...)`: `println!`, but a line written whole in one write, nothing under `--quiet`,
/// and `Err` where it cannot be written (a full disk, a reader gone) instead of a panic.
#[macro_export]
macro_rules! print_line {
    ($($arg:tt)*) => { $crate::output::line(format_args!($($arg)*)) };
}

/// `eprint_line!("...", ...)`: `eprintln!`, but a line written whole in one write, and never failing (an
/// error writing standard error is ignored: there is nowhere left to report it). It carries errors, warnings
/// and notes alike, with no level (unlike the `log` crate's `warn!`).
#[macro_export]
macro_rules! eprint_line {
    ($($arg:tt)*) => { $crate::output::stderr_line(format_args!($($arg)*)) };
}

/// Every line this program writes, fit for the terminal it may reach: its lines and tabs kept, every other
/// control character and bidirectional-text control escaped as [`printable`] escapes them. A line is made
/// of pieces from many places (a path the user gave, a file name, an error's text), and whatever none of
/// them escaped, none can move the cursor, clear the screen or hide the verdict: this is the one place
/// every line passes.
pub fn fit_for_a_terminal(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c != '\n' && c != '\t' && needs_escape(c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c => out.push_str(&printable(c.encode_utf8(&mut [0; 4]))),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Whether [`printable`] writes `c` as its escape.
fn needs_escape(c: char) -> bool {
    c.is_control() || is_bidi_control(c)
}

/// Unicode's Bidi_Control characters, all twelve: the Arabic letter mark (U+061C, an implicit mark as
/// LRM and RLM are), LRM and RLM, the embeddings and overrides, and the isolates.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` from another process, fit to print: each control character (ESC, CR, BEL, a newline, C1 codes)
/// and each bidirectional-text control is written as its escape (`\u{1b}`, `\r`, `\n`), so that nothing
/// said over the socket can move the cursor, recolour, retitle or rewrite a line of a terminal or a verdict;
/// the rest is kept as it is, to stay readable. Every text that [`hear`] returns has been through it.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if is_bidi_control(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_keeps_its_lines_and_tabs_and_escapes_every_other_control() {
        let clean = "Process 1\tcomplete!\nPASSED\n";
        assert!(matches!(fit_for_a_terminal(clean), std::borrow::Cow::Borrowed(_)));
        let said = fit_for_a_terminal("--json /x\u{1b}[2J\r\u{7}/y\tz\n\u{202e}FAILED\u{85}\n");
        assert_eq!(said, "--json /x\\u{1b}[2J\\r\\u{7}/y\tz\n\\u{202e}FAILED\\u{85}\n");
        // Every Bidi_Control character, and nothing beside them.
        let bidi =
            "\u{61c}\u{200e}\u{200f}\u{202a}\u{202b}\u{202c}\u{202d}\u{202e}\u{2066}\u{2067}\u{2068}\u{2069}";
        assert_eq!(fit_for_a_terminal(bidi).matches("\\u{").count(), 12, "{bidi:?}");
        assert_eq!(fit_for_a_terminal("\u{61b}\u{200d}\u{2065}"), "\u{61b}\u{200d}\u{2065}");
    }

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
                let next =
                    std::fs::File::open("/proc/self/stat").map(|f| std::os::fd::AsRawFd::as_raw_fd(&f));
                let ok =
                    one.as_deref() == Some(std::path::Path::new("/dev/null")) && next.is_ok_and(|fd| fd > 2);
                // SAFETY: (test) leaves the forked child without the harness's exit handlers.
                unsafe { nix::libc::_exit(if ok { 0 } else { 1 }) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0), "fd 1 is not /dev/null");
            }
        }
    }
}
