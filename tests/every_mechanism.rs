//! `--ipc all` on simulated GPUs, as issue 14 found it wanting: the user's options reach every mechanism's
//! run, and the table and the exit status say what those runs found; their results come back without files;
//! no run outlives its top parent, however that ends (SIGKILL, SIGINT, SIGTERM, the reader of its output
//! gone); a run ended by a signal is reported with it.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{FAULT, leftovers, run, simulated, text, wait_group_gone};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The rows of the table at the end of an `--ipc all` run, without the header (what the runs said on
/// standard error may follow it in `all`).
fn table_rows(all: &str) -> Vec<String> {
    let mechanisms = ["legacy ", "vmm ", "pool ", "fabric "];
    let rows: Vec<String> = all
        .lines()
        .skip_while(|l| !l.starts_with("mechanism"))
        .skip(1)
        .take_while(|l| mechanisms.iter().any(|m| l.starts_with(m)))
        .map(str::to_owned)
        .collect();
    assert_eq!(rows.len(), 4, "a row per mechanism: {all}");
    rows
}

/// `--sync memops` reaches the runs: where a device lacks stream memory operations, legacy and vmm are
/// waived for it as a run of each alone would be, and pool, which memops cannot order, is waived for that;
/// so the whole is waived (2), not "all passed".
#[test]
fn sync_memops_reaches_every_mechanism_and_pool_is_waived_for_it() {
    let out = run(simulated("no-memops,no-memops").args(["--ipc", "all", "--sync", "memops"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "every mechanism waived: {all}");
    let rows = table_rows(&all);
    for (row, mechanism) in rows[..2].iter().zip(["legacy", "vmm"]) {
        assert!(row.starts_with(mechanism), "{all}");
        assert!(row.contains("waived: No CUDA devices support IPC with --sync memops (device 0"), "{all}");
    }
    let pool = &rows[2];
    assert!(
        pool.starts_with("pool") && pool.contains("waived: --sync memops cannot order pool memory"),
        "{all}"
    );
    let fabric = &rows[3];
    assert!(fabric.starts_with("fabric"), "{all}");
    assert!(fabric.contains("waived: No CUDA devices support IPC with --sync memops (device 0"), "{all}");
    assert!(!all.contains("FAILED"), "{all}");

    // Where every device has them, legacy, vmm and fabric (with an IMEX channel) pass with memops, pool is
    // still waived: passed (0).
    let out = run(simulated("ok+imex,ok+imex").args(["--ipc", "all", "--sync=memops"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let rows = table_rows(&all);
    assert!(rows[0].starts_with("legacy") && rows[0].ends_with("passed"), "{all}");
    assert!(rows[1].starts_with("vmm") && rows[1].ends_with("passed"), "{all}");
    assert!(
        rows[2].starts_with("pool") && rows[2].contains("waived: --sync memops cannot order pool"),
        "{all}"
    );
    assert!(rows[3].starts_with("fabric") && rows[3].ends_with("passed"), "{all}");
}

/// `--procs-per-device 3` on two devices: each of the four runs has six processes; `--timings`: each
/// prints its table.
#[test]
fn the_users_options_reach_every_run() {
    let out =
        run(simulated("ok+imex,ok+imex").args(["--procs-per-device", "3", "--ipc", "all", "--timings"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_eq!(all.matches("Process 5 complete!\n").count(), 4, "six processes in each run: {all}");
    assert!(!all.contains("Process 6"), "{all}");
    assert_eq!(all.matches("Timings (ms)\n").count(), 4, "{all}");
    assert!(table_rows(&all).iter().all(|row| row.ends_with("passed")), "{all}");
}

/// The runs' results (their JSON documents, with the open times) come back through pipes: a fresh TMPDIR
/// stays empty all through the run (it is looked at every millisecond), and a TMPDIR that does not exist
/// changes nothing.
#[test]
fn results_come_back_without_files() {
    let fresh = common::scratch("all-tmpdir");
    let tmpdir = fresh.path();
    let doc_dir = common::scratch("all-doc");
    let json = doc_dir.path().join("all.json");
    for dir in [tmpdir, Path::new("/nonexistent")] {
        let what = format!("TMPDIR={}", dir.display());
        let mut child = simulated("ok+imex,ok+imex")
            .args(["--ipc", "all", "--procs-per-device", "2", "--json"])
            .arg(&json)
            .env("TMPDIR", dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let out = std::thread::spawn(move || std::io::read_to_string(&mut stdout).unwrap());
        let err = std::thread::spawn(move || std::io::read_to_string(&mut stderr).unwrap());
        let mut seen = BTreeSet::new();
        while child.try_wait().unwrap().is_none() {
            seen.extend(std::fs::read_dir(tmpdir).unwrap().flatten().map(|e| e.file_name()));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(seen.is_empty(), "{what}: the run wrote {seen:?} into {}", tmpdir.display());
        let all = out.join().unwrap() + &err.join().unwrap();
        assert_eq!(child.wait().unwrap().code(), Some(0), "{what}: {all}");
        for row in table_rows(&all) {
            let columns: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(columns.get(3), Some(&"passed"), "{what}: {all}");
            assert!(columns[2].parse::<f64>().is_ok(), "{what}: the open time came back: {row}");
        }
        let doc = common::document(&json);
        let rows = doc["mechanisms"].as_array().unwrap();
        assert_eq!(rows.len(), 4, "{doc}");
        assert!(
            rows.iter().all(|row| row["open_one_ms"].as_f64().is_some_and(|ms| ms > 0.0)),
            "{what}: {doc}"
        );
    }
}

/// A top parent of `--ipc all` on one simulated GPU with two processes, whose child 0 hangs in the
/// round-robin of every run, with `--timeout timeout`; its stdout is read on a thread.
fn start_hanging_all(timeout: &str) -> (Child, Lines) {
    let mut top = simulated("ok")
        .args(["--ipc", "all", "--procs-per-device", "2", "--timeout", timeout])
        .env(FAULT, "child0@round-robin:hang")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::read(top.stdout.take().unwrap());
    (top, lines)
}

/// The lines a process writes, read on a thread as they come.
struct Lines {
    rx: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn read(from: impl std::io::Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { rx, seen: Vec::new() }
    }

    /// Waits up to 10 s until `count` lines seen so far contain `needle`.
    fn wait_for(&mut self, needle: &str, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.seen.iter().filter(|l| l.contains(needle)).count() < count {
            match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no {count} lines with {needle:?} in 10 s: {:?}", self.seen),
            }
        }
    }

    /// Every line, once the writer has closed its end.
    fn all(mut self) -> Vec<String> {
        self.seen.extend(self.rx.iter());
        self.seen
    }
}

/// The run of one mechanism that the top parent `top` is running now (its one child).
fn current_run(top: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{top}/task/{top}/children")).unwrap();
    let runs: Vec<u32> = children.split_whitespace().map(|pid| pid.parse().unwrap()).collect();
    assert_eq!(runs.len(), 1, "one run at a time: {runs:?}");
    runs[0]
}

/// Waits for the run of one mechanism to have started both its processes, and for them to be where they
/// wait (child 0 hangs, child 1 waits for it); returns the run's pid and every process below the top.
fn wait_until_hanging(top: &Child, lines: &mut Lines, runs_before: usize) -> (u32, Vec<u32>) {
    lines.wait_for("Starting on device", 2 * (runs_before + 1));
    std::thread::sleep(Duration::from_millis(300));
    (current_run(top.id()), common::descendants(top.id()))
}

/// Waits up to 3 s for each of `pids` to be gone (reaped, or a zombie), so that nothing of the run (its
/// guardian may be out of its process group) is still removing files when they are counted.
fn wait_all_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(3);
    for pid in pids {
        while Instant::now() < deadline {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rsplit_once(')').map_or("", |(_, rest)| rest.trim_start());
            if stat.is_empty() || state.starts_with('Z') || state.starts_with('X') {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Kill -9 of the top parent: the run it had started stops (PR_SET_PDEATHSIG, SIGTERM) with its children
/// within about a second, long before its watchdog, and leaves nothing in /dev/shm.
#[test]
fn a_run_does_not_outlive_a_killed_top_parent() {
    let (mut top, mut lines) = start_hanging_all("30");
    let (run, below) = wait_until_hanging(&top, &mut lines, 0);
    kill(Pid::from_raw(top.id() as i32), Signal::SIGKILL).unwrap();
    top.wait().unwrap();
    let gone = wait_group_gone(top.id(), Duration::from_secs(5));
    assert!(gone.is_some_and(|took| took < Duration::from_millis(1500)), "took {gone:?} ({below:?})");
    wait_all_gone(&below);
    assert_eq!(leftovers(run, &below), Vec::<String>::new(), "the run {run} left files in /dev/shm");
}

/// SIGINT or SIGTERM to the top parent alone goes on to the run at once: everything is gone well within
/// 2 s, the top parent exits 128+N and starts no other run.
#[test]
fn a_stop_signal_to_the_top_parent_stops_the_run_at_once() {
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let (mut top, mut lines) = start_hanging_all("30");
        let (run, below) = wait_until_hanging(&top, &mut lines, 0);
        let sent = Instant::now();
        kill(Pid::from_raw(top.id() as i32), signal).unwrap();
        let gone = wait_group_gone(top.id(), Duration::from_secs(5)).map(|_| sent.elapsed());
        let status = top.wait().unwrap();
        let stdout = lines.all().join("\n");
        assert!(gone.is_some_and(|took| took < Duration::from_secs(2)), "{signal}: took {gone:?}");
        assert_eq!(status.code(), Some(128 + signal as i32), "{signal}: {stdout}");
        assert!(!stdout.contains("== --ipc vmm"), "{signal}: no other run: {stdout}");
        wait_all_gone(&below);
        assert_eq!(leftovers(run, &below), Vec::<String>::new(), "{signal}: the run {run} left files");
    }
}

/// A run killed by a signal, or stopped by one, is a failed row that names the signal; the top parent goes
/// on with the other mechanisms and exits 1.
#[test]
fn a_run_ended_by_a_signal_is_reported_with_it() {
    let (mut top, mut lines) = start_hanging_all("3");
    let (legacy, _) = wait_until_hanging(&top, &mut lines, 0);
    kill(Pid::from_raw(legacy as i32), Signal::SIGKILL).unwrap();
    let (vmm, _) = wait_until_hanging(&top, &mut lines, 1);
    kill(Pid::from_raw(vmm as i32), Signal::SIGTERM).unwrap();
    let status = top.wait().unwrap();
    let all = lines.all().join("\n");
    assert_eq!(status.code(), Some(1), "{all}");
    let rows = table_rows(&all);
    assert!(rows[0].starts_with("legacy") && rows[0].ends_with("FAILED: killed by SIGKILL"), "{all}");
    assert!(rows[1].starts_with("vmm") && rows[1].ends_with("FAILED: stopped by SIGTERM"), "{all}");
    assert!(rows[2].starts_with("pool") && rows[2].contains("did not finish within 3 s"), "{all}");
    assert!(wait_group_gone(top.id(), Duration::from_secs(3)).is_some());
}

/// `| head -1`: once the reader of the top parent's output has gone, the run is stopped at once, though it
/// writes nothing more (it hangs), and the top parent ends with 141 without starting the next run.
#[test]
fn a_reader_that_goes_away_ends_everything() {
    let mut top = simulated("ok")
        .args(["--ipc", "all", "--procs-per-device", "2", "--timeout", "30"])
        .env(FAULT, "child0@round-robin:hang")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(top.stdout.take().unwrap());
    let mut started = 0;
    let mut line = String::new();
    while started < 2 {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "the run ended before it hung");
        started += usize::from(line.contains("Starting on device"));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (run, below) = (current_run(top.id()), common::descendants(top.id()));
    drop(stdout);
    let closed = Instant::now();
    let gone = wait_group_gone(top.id(), Duration::from_secs(5)).map(|_| closed.elapsed());
    let status = top.wait().unwrap();
    assert!(gone.is_some_and(|took| took < Duration::from_secs(2)), "took {gone:?}");
    assert!(status.code() == Some(141) || status.signal() == Some(13), "{status:?}");
    wait_all_gone(&below);
    assert_eq!(leftovers(run, &below), Vec::<String>::new(), "the run {run} left files");
}

/// A run of one mechanism that is stopped (SIGSTOP) cannot keep its own watchdog: the top parent stops it
/// at its --timeout and a grace, fails its row saying so, goes on, and ends with exit 1 long before the run
/// would have been continued; nothing of the stopped run is left.
#[test]
fn a_stopped_run_of_one_mechanism_is_stopped_at_its_deadline() {
    let (mut top, mut lines) = start_hanging_all("2");
    let (run, below) = wait_until_hanging(&top, &mut lines, 0);
    kill(Pid::from_raw(run as i32), Signal::SIGSTOP).unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = top.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(40) {
            let _ = kill(Pid::from_raw(run as i32), Signal::SIGCONT);
            let _ = top.kill();
            panic!("the top parent did not stop the stopped run: {:?}", lines.all());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1), "{status:?}");
    let all = lines.all().join("\n");
    assert!(
        all.contains("stopped by this process: it did not end within its --timeout (2 s) and 6 s more"),
        "{all}"
    );
    wait_all_gone(&below);
    assert!(leftovers(top.id(), &below).is_empty(), "{:?}", leftovers(top.id(), &below));
}

/// A run that passes, or a mechanism waived once its children had started (fabric without an IMEX
/// channel), writes nothing to standard error: the children of a waived run stop without a word of
/// failure, and the parent says why it was waived.
#[test]
fn a_run_that_passes_writes_nothing_to_standard_error() {
    for args in [
        &["--ipc", "all", "-q"][..],
        &["--ipc", "fabric"][..],
        &["--ipc", "all", "--procs-per-device", "3"][..],
    ] {
        let out = run(simulated("ok,ok").args(args));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(matches!(out.status.code(), Some(0) | Some(2)), "{args:?}: {}", text(&out));
        assert_eq!(stderr, "", "{args:?}: {}", text(&out));
    }
}
