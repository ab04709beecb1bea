//! `--ipc all`: each mechanism as a whole run of its own, one after another (this program again, with the
//! user's own arguments, less `--ipc` and `--json`, and `--ipc <mechanism>`), then a table of mechanism,
//! result (passed, failed, or waived and why), wall time and the time a child took to open one process's
//! buffer and event. Exit 1 if any failed, 2 if all were waived, 0 otherwise; `--json` carries the same.
//! Pool under `--sync memops` is waived without a run: memops cannot order pool memory.
//!
//! This module owns those runs while they last: each gets the write end of a pipe (`--report-fd`) for its
//! JSON document, so nothing goes through TMPDIR; the top parent passes the run's output on as it comes, in
//! one poll loop that also watches its stop flag and its own standard output. A run gets SIGTERM
//! (`PR_SET_PDEATHSIG`) if the top parent dies; a stop signal to the top parent goes on to the run at once,
//! and a reader of the top parent's output that goes away (`| head -1`) stops the run; either way the top
//! parent then exits 128+N without starting the next run.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, poll};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::cli::{Cli, Sync};
use crate::inherit;
use crate::ipc::{Mechanism, memops_refusal};
use crate::outcome::Outcome;
use crate::report::{JsonFile, json_string};
use crate::signals::{self, Interrupted};

/// How one mechanism's run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    Passed,
    Failed(String),
    Waived(String),
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub mechanism: Mechanism,
    pub ending: Ending,
    /// `None` where the mechanism was not run.
    pub wall_ms: Option<f64>,
    /// The median over the children of their time to open every handle, divided by the process count.
    pub open_one_ms: Option<f64>,
}

pub fn run(cli: &Cli) -> Result<Outcome> {
    let json = JsonFile::requested();
    let passed_on = passed_on(std::env::args_os().skip(1));
    let mut rows = Vec::new();
    for mechanism in Mechanism::ALL {
        say!("== --ipc {}", mechanism.name())?;
        let row = match cannot_run(cli, mechanism) {
            Some(reason) => {
                say!("{reason}")?;
                Row { mechanism, ending: Ending::Waived(reason.clone()), wall_ms: None, open_one_ms: None }
            }
            None => run_one(&passed_on, mechanism)?,
        };
        rows.push(row);
        signals::check()?;
    }
    crate::output::text(&table(&rows))?;
    if let Some(json) = json {
        json.write(&json_document(&rows))?;
    }
    outcome(&rows)
}

/// 1 if any failed, 2 if all were waived, 0 otherwise.
pub fn outcome(rows: &[Row]) -> Result<Outcome> {
    let failed: Vec<&str> =
        rows.iter().filter(|r| matches!(r.ending, Ending::Failed(_))).map(|r| r.mechanism.name()).collect();
    if !failed.is_empty() {
        bail!("--ipc all: {} failed", failed.join(", "));
    }
    if rows.iter().all(|r| matches!(r.ending, Ending::Waived(_))) {
        return Ok(Outcome::Waived);
    }
    Ok(Outcome::Passed)
}

/// The options `--ipc all` sets itself for each run: every other argument goes on as the user gave it, so
/// that no option, today's or a future one, can be dropped on the way.
const SET_HERE: [&str; 3] = ["--ipc", "--json", "--report-fd"];

/// The user's arguments (without the program's name) less those in [`SET_HERE`], in both their forms
/// (`--ipc vmm` and `--ipc=vmm`).
pub fn passed_on(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut args = args.into_iter();
    let mut kept = Vec::new();
    while let Some(arg) = args.next() {
        if arg == "--" {
            kept.push(arg);
            kept.extend(args);
            break;
        }
        let bytes = arg.as_bytes();
        if SET_HERE.iter().any(|option| bytes == option.as_bytes()) {
            args.next(); // its value
        } else if !SET_HERE
            .iter()
            .any(|option| bytes.strip_prefix(option.as_bytes()).is_some_and(|rest| rest.starts_with(b"=")))
        {
            kept.push(arg);
        }
    }
    kept
}

/// Why `mechanism` cannot run with the user's options whatever the devices, if so: a property of the
/// mechanism, so its row is waived with the reason (`main` refuses `--ipc pool --sync memops` as an error).
fn cannot_run(cli: &Cli, mechanism: Mechanism) -> Option<String> {
    (cli.sync == Sync::Memops && mechanism.spec().refuses_memops.is_some()).then(|| memops_refusal(mechanism))
}

/// How often the top parent looks at the run of one mechanism while it waits for output.
const LOOK_MS: u8 = 10;
/// How long the output of a run that has exited is still read (the run's own children may still be writing
/// as they die); a grandchild that keeps the pipes open cannot hold the top parent longer.
const DRAIN: Duration = Duration::from_secs(1);
/// How long a run of one mechanism gets to stop in order (it stops its children within 300 ms) before it is
/// killed.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// Runs this program with the user's options and `--ipc <mechanism>`; passes its output on as it comes and
/// reads its result (the JSON document of `--json`) from a pipe it inherits (`--report-fd`): no file.
fn run_one(passed_on: &[OsString], mechanism: Mechanism) -> Result<Row> {
    let (report, report_end) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).context("pipe2 for the result of a run of one mechanism")?;
    let fd = report_end.as_raw_fd();
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0(std::env::args_os().next().unwrap_or_else(|| "simple-ipc".into()))
        .args(passed_on)
        .args(["--ipc", mechanism.name(), "--report-fd", &fd.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let top = nix::unistd::getpid();
    // SAFETY: runs in the forked child before exec; prctl, getppid and fcntl are async-signal-safe and
    // allocate nothing.
    unsafe {
        command.pre_exec(move || {
            // The run must not outlive the top parent: SIGTERM, which it handles as an orderly stop.
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != top {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH)); // it died before the prctl
            }
            inherit::keep_across_exec(fd)
        });
    }
    // A descriptor fault is meant for the mechanisms that send descriptors; legacy's run would refuse it.
    if crate::fault::needs_descriptors() && !mechanism.uses_descriptors() {
        command.env_remove(crate::fault::FAULT_ENV);
    }
    let start = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("starting the run of --ipc {} (/proc/self/exe)", mechanism.name()))?;
    drop(report_end);
    let (stdout, stderr) = (child.stdout.take().map(OwnedFd::from), child.stderr.take().map(OwnedFd::from));
    // Declared before the pipes: on an early return they close first, so the run cannot block writing to
    // them while it is being stopped.
    let mut run = SubRun(child);
    let mut pipes = [
        Pipe::new(stdout, Echo::Stdout),
        Pipe::new(stderr, Echo::Stderr),
        Pipe::new(Some(report), Echo::Keep),
    ];
    let (status, stopped) = run.follow(&mut pipes)?;
    if let Some(signal) = stopped {
        return Err(Interrupted(signal).into());
    }
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    let [stdout, stderr, document] = pipes.map(|pipe| String::from_utf8_lossy(&pipe.got).into_owned());
    let ending = match status.code() {
        Some(0) => Ending::Passed,
        Some(2) => Ending::Waived(
            stdout
                .lines()
                .rev()
                .find(|l| l.starts_with("No CUDA devices support IPC"))
                .unwrap_or("waived")
                .to_owned(),
        ),
        Some(code) if code > 128 => Ending::Failed(format!("stopped by {}", signal_name(code - 128))),
        None => Ending::Failed(format!("killed by {}", status.signal().map_or("?".into(), signal_name))),
        other => Ending::Failed(
            stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map_or_else(|| format!("exit status {other:?}"), |line| line.trim().to_owned()),
        ),
    };
    Ok(Row { mechanism, ending, wall_ms: Some(wall_ms), open_one_ms: open_one_ms(&document) })
}

/// Where the top parent passes on what comes through one of a run's pipes.
#[derive(Clone, Copy)]
enum Echo {
    Stdout,
    Stderr,
    /// Nowhere: the result, kept only.
    Keep,
}

/// One pipe from the run of one mechanism, and all that came through it so far.
struct Pipe {
    /// `None` once at its end.
    fd: Option<OwnedFd>,
    echo: Echo,
    got: Vec<u8>,
}

impl Pipe {
    fn new(fd: Option<OwnedFd>, echo: Echo) -> Self {
        Self { fd, echo, got: Vec::new() }
    }

    /// Reads what `poll` said is there, passes it on and keeps it.
    fn read(&mut self) -> Result<()> {
        let Some(fd) = &self.fd else { return Ok(()) };
        let mut chunk = [0u8; 16 * 1024];
        let n = match nix::unistd::read(fd, &mut chunk) {
            Ok(n) => n,
            Err(Errno::EINTR | Errno::EAGAIN) => return Ok(()),
            Err(e) => return Err(e).context("reading the output of a run of one mechanism"),
        };
        let bytes = &chunk[..n];
        match self.echo {
            _ if n == 0 => self.fd = None,
            Echo::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(bytes).and_then(|()| out.flush()).context("writing to standard output")?;
            }
            // As `warn!`: standard error cannot fail the run.
            Echo::Stderr => drop(std::io::stderr().write_all(bytes)),
            Echo::Keep => {}
        }
        self.got.extend_from_slice(bytes);
        Ok(())
    }
}

/// The run of one mechanism; dropped before it has ended (the top parent's own output failed), it is
/// stopped and reaped.
struct SubRun(Child);

impl SubRun {
    /// Passes on the run's output as it comes, until it has exited and its pipes are at their end (or
    /// [`DRAIN`] has passed since it exited). Returns how it exited and, where the top parent was stopped
    /// meanwhile, why: a stop signal it received, which is passed on to the run at once, or SIGPIPE when the
    /// reader of its standard output went away (`| head -1`), and the run is stopped with SIGTERM. A run that
    /// has not stopped [`STOP_GRACE`] after that is killed.
    fn follow(&mut self, pipes: &mut [Pipe]) -> Result<(ExitStatus, Option<Signal>)> {
        let pid = Pid::from_raw(self.0.id() as i32);
        let stdout = std::io::stdout();
        let mut exited: Option<(ExitStatus, Instant)> = None;
        let mut stopped: Option<(Signal, Instant)> = None;
        let mut reader_gone = false;
        let mut killed = false;
        loop {
            let cause = signals::received().or(reader_gone.then_some(Signal::SIGPIPE));
            if let Some(cause) = cause.filter(|_| stopped.is_none()) {
                let signal = if cause == Signal::SIGPIPE { Signal::SIGTERM } else { cause };
                if exited.is_none() {
                    let _ = kill(pid, signal);
                }
                stopped = Some((cause, Instant::now()));
            }
            if let Some((_, since)) = stopped
                && exited.is_none()
                && !killed
                && since.elapsed() > STOP_GRACE
            {
                let _ = kill(pid, Signal::SIGKILL);
                killed = true;
            }
            if exited.is_none() {
                let status = self.0.try_wait().context("waiting for a run of one mechanism")?;
                exited = status.map(|status| (status, Instant::now()));
            }
            if let Some((status, at)) = exited
                && (pipes.iter().all(|pipe| pipe.fd.is_none()) || at.elapsed() > DRAIN)
            {
                return Ok((status, stopped.map(|(cause, _)| cause)));
            }
            let mut polled: Vec<PollFd> = pipes
                .iter()
                .filter_map(|pipe| pipe.fd.as_ref())
                .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
                .collect();
            // Our own standard output, for POLLERR alone: a pipe whose reader has gone.
            let watch_stdout = !reader_gone;
            if watch_stdout {
                polled.push(PollFd::new(stdout.as_fd(), PollFlags::empty()));
            }
            match poll(&mut polled, LOOK_MS) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e).context("poll on the output of a run of one mechanism"),
            }
            let mut ready: Vec<bool> = polled.iter().map(|p| p.any().unwrap_or(false)).collect();
            if watch_stdout {
                let revents = polled.last().and_then(PollFd::revents).unwrap_or(PollFlags::empty());
                reader_gone = revents.contains(PollFlags::POLLERR);
                ready.pop();
            }
            drop(polled);
            if reader_gone {
                // What the run still writes there is read (so that it does not block) and kept only.
                for pipe in pipes.iter_mut().filter(|pipe| matches!(pipe.echo, Echo::Stdout)) {
                    pipe.echo = Echo::Keep;
                }
            }
            let open = pipes.iter_mut().filter(|pipe| pipe.fd.is_some());
            for (pipe, _) in open.zip(ready).filter(|(_, ready)| *ready) {
                pipe.read()?;
            }
        }
    }
}

impl Drop for SubRun {
    fn drop(&mut self) {
        if !matches!(self.0.try_wait(), Ok(None)) {
            return;
        }
        let pid = Pid::from_raw(self.0.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(u64::from(LOOK_MS)));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// From a run's JSON: the median over the children of `open_handles`, divided by the process count.
pub fn open_one_ms(document: &str) -> Option<f64> {
    let processes: f64 = number_after(document, "\"processes\": ")?;
    let children = document.split("\"children\": [").nth(1)?.split(']').next()?;
    let mut opens: Vec<f64> =
        children.split('}').filter_map(|child| number_after(child, "\"open_handles\": ")).collect();
    opens.sort_by(f64::total_cmp);
    let median = *opens.get(opens.len().checked_sub(1)? / 2)?;
    (processes > 0.0).then(|| median / processes)
}

fn number_after(text: &str, key: &str) -> Option<f64> {
    let rest = text.split(key).nth(1)?;
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// `SIGTERM` for 15; the number where it is no signal.
fn signal_name(number: i32) -> String {
    Signal::try_from(number).map_or_else(|_| format!("signal {number}"), |signal| signal.to_string())
}

fn result_text(result: &Ending) -> String {
    match result {
        Ending::Passed => "passed".into(),
        Ending::Failed(why) => format!("FAILED: {why}"),
        Ending::Waived(why) => format!("waived: {why}"),
    }
}

/// The table printed at the end.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!("{:<10}{:>10}{:>20}  {}\n", "mechanism", "wall ms", "open one, ms", "result");
    for row in rows {
        let open = row.open_one_ms.map_or_else(|| "-".into(), |ms| format!("{ms:.3}"));
        let wall = row.wall_ms.map_or_else(|| "-".into(), |ms| format!("{ms:.1}"));
        out.push_str(&format!(
            "{:<10}{:>10}{:>20}  {}\n",
            row.mechanism.name(),
            wall,
            open,
            result_text(&row.ending)
        ));
    }
    out
}

/// The same as [`table`], as one JSON document.
pub fn json_document(rows: &[Row]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|row| {
            let (result, why) = match &row.ending {
                Ending::Passed => ("passed", None),
                Ending::Failed(why) => ("failed", Some(why)),
                Ending::Waived(why) => ("waived", Some(why)),
            };
            format!(
                "{{\"mechanism\": \"{}\", \"result\": \"{result}\", \"reason\": {}, \"wall_ms\": {}, \"open_one_ms\": {}}}",
                row.mechanism.name(),
                why.map_or_else(|| "null".into(), |w| json_string(w)),
                row.wall_ms.map_or_else(|| "null".into(), |ms| format!("{ms:.3}")),
                row.open_one_ms.map_or_else(|| "null".into(), |ms| format!("{ms:.4}"))
            )
        })
        .collect();
    format!("{{\"mechanisms\": [{}]}}\n", rows.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mechanism: Mechanism, ending: Ending) -> Row {
        Row { mechanism, ending, wall_ms: Some(1.0), open_one_ms: Some(0.25) }
    }

    #[test]
    fn exit_1_if_any_failed_2_if_all_waived_0_otherwise() {
        let waived = || Ending::Waived("no".into());
        let all_waived = [row(Mechanism::Legacy, waived()), row(Mechanism::Vmm, waived())];
        assert_eq!(outcome(&all_waived).unwrap(), Outcome::Waived);
        let one_passed = [row(Mechanism::Legacy, Ending::Passed), row(Mechanism::Vmm, waived())];
        assert_eq!(outcome(&one_passed).unwrap(), Outcome::Passed);
        let one_failed =
            [row(Mechanism::Legacy, Ending::Passed), row(Mechanism::Pool, Ending::Failed("x".into()))];
        assert!(outcome(&one_failed).unwrap_err().to_string().contains("pool failed"));
    }

    /// A run of one mechanism gets the user's options as the user gave them, its own `--ipc` and no `--json`.
    /// Every option of the command line is in one of the cases, so a new option fails this test until it is
    /// added here.
    #[test]
    fn every_option_but_ipc_and_json_is_passed_on() {
        use clap::{CommandFactory, Parser};
        let cases: &[&[&str]] = &[
            &["--ipc", "all", "--sync", "memops", "--procs-per-device", "3", "--timings", "--json", "x.json"],
            &["--ipc=all", "--json=x.json", "--sequential", "--timeout=5", "--bind-numa"],
            &["--timeout", "0", "--ipc", "legacy", "--bench", "--bench-max-bytes", "8192"],
            &["--ipc", "all", "--topology"],
            &["--ipc", "all", "--report-fd", "7"],
        ];
        let program = || std::iter::once(OsString::from("simple-ipc"));
        let mut seen = std::collections::BTreeSet::new();
        for case in cases {
            let user = Cli::try_parse_from(program().chain(case.iter().map(OsString::from))).unwrap();
            let args = passed_on(case.iter().map(OsString::from));
            let own = ["--ipc", "vmm", "--report-fd", "9"].map(OsString::from);
            let sub = Cli::try_parse_from(program().chain(args).chain(own)).unwrap();
            let expected = Cli { ipc: crate::cli::IpcArg::Vmm, json: None, report_fd: Some(9), ..user };
            assert_eq!(sub, expected, "{case:?}");
            seen.extend(case.iter().filter_map(|a| a.strip_prefix("--")?.split('=').next()));
        }
        for arg in Cli::command().get_arguments().filter(|arg| !arg.is_hide_set()) {
            let long = arg.get_long().unwrap_or_default();
            assert!(
                ["help", "version"].contains(&long) || seen.contains(long),
                "--{long} is in no case of this test"
            );
        }
    }

    #[test]
    fn the_open_time_is_the_childrens_median_per_process_and_json_escapes_reasons() {
        let doc = r#"{"unit": "ms", "parent": {"total": 9.0}, "children": [{"open_handles": 4.0}, {"open_handles": 2.0}, {"open_handles": 100.0}], "processes": 2}"#;
        assert_eq!(open_one_ms(doc), Some(2.0));
        assert_eq!(open_one_ms("{}"), None);
        let json = json_document(&[row(Mechanism::Vmm, Ending::Failed("a \"quoted\"\nline".into()))]);
        assert!(json.contains(r#""reason": "a \"quoted\"\u000aline""#), "{json}");
        assert!(
            json.contains(r#""result": "failed""#) && json.contains(r#""open_one_ms": 0.2500"#),
            "{json}"
        );
    }
}
