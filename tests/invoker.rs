//! The invoker's environment must not change the verdict (issue 14): dispositions it leaves (SIGCHLD, SIGHUP
//! or SIGINT ignored), a reader that goes away or reads slowly, a non-blocking standard output, `--json` paths
//! that name the output itself, absurd `--timeout` values, faults that could not strike. Each case ends with
//! the status the run earned, on simulated GPUs.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{FAULT, run, simulated, text, wait_for_lines, wait_group_gone};
use nix::sys::signal::{SigHandler, Signal, kill, signal};
use nix::unistd::Pid;
use simple_ipc::phases::Phase;

/// [`simulated`], started with `signals` ignored, as a supervisor or `nohup` would leave them (an ignored
/// disposition is kept across exec).
fn ignoring(gpus: &str, signals: &'static [Signal]) -> Command {
    let mut command = simulated(gpus);
    // SAFETY: (test) runs in the forked child before exec; signal() is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            for &s in signals {
                signal(s, SigHandler::SigIgn).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    command
}

/// Starts `command` (a run whose child 0 hangs in the round-robin) and returns once its `procs` children have
/// started and reached the barrier.
fn start_hanging(mut command: Command, procs: usize) -> Child {
    let mut child = command
        .args(["--procs-per-device", &procs.to_string()])
        .env(FAULT, "child0@round-robin:hang")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let started = wait_for_lines(&mut child, "Starting on device", procs, Duration::from_secs(10));
    assert_eq!(started, procs, "not every child started");
    std::thread::sleep(Duration::from_millis(300));
    child
}

fn group_signal(pgid: u32, signal: Signal) {
    kill(Pid::from_raw(-(pgid as i32)), signal).expect("the run's group exists");
}

/// SIGCHLD ignored by the invoker: the kernel would reap the children itself and the parent would see no
/// failure. A corrupted buffer still fails the run, a killed child is named at once (not by the watchdog),
/// and `--ipc all` waits for its runs.
#[test]
fn an_ignored_sigchld_cannot_turn_a_failure_into_a_pass() {
    let out = run(ignoring("ok,ok", &[Signal::SIGCHLD]).env(FAULT, "child1@verify:corrupt"));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("Process 1 failed! (exit code 1)"), "{all}");

    let out = run(ignoring("ok,ok", &[Signal::SIGCHLD])
        .args(["--timeout", "30"])
        .env(FAULT, "child1@round-robin:kill"));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("Process 1 failed! (killed by SIGKILL)"), "{all}");
    assert!(!all.contains("--timeout"), "the watchdog should not be the one to see it: {all}");

    let out = run(ignoring("ok,ok", &[Signal::SIGCHLD]).args(["--ipc", "all"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("PASSED: every mechanism: legacy passed, vmm passed, pool passed"), "{all}");
}

/// `nohup simple-ipc &`, or a background job whose SIGINT the shell ignores: the inherited SIG_IGN stays, in the
/// parent and in every child, so SIGHUP and SIGINT sent to the whole group change nothing; SIGTERM, which was
/// not ignored, still stops the run in order.
#[test]
fn stop_signals_the_invoker_ignores_stay_ignored() {
    let mut parent = start_hanging(ignoring("ok", &[Signal::SIGHUP, Signal::SIGINT]), 3);
    let pid = parent.id();
    group_signal(pid, Signal::SIGHUP);
    group_signal(pid, Signal::SIGINT);
    std::thread::sleep(Duration::from_millis(500));
    assert!(parent.try_wait().unwrap().is_none(), "an ignored SIGHUP or SIGINT ended the run");
    assert_eq!(common::descendants(pid).len(), 4, "a child (or the guardian) ended");
    group_signal(pid, Signal::SIGTERM);
    let status = parent.wait().unwrap();
    assert_eq!(status.code(), Some(143), "SIGTERM was not ignored: {status:?}");
    assert!(wait_group_gone(pid, Duration::from_secs(3)).is_some(), "a process of the run is left");
}

/// A `--timeout` beyond what the clock can count is a watchdog that never fires, not a panic.
#[test]
fn any_timeout_is_accepted_without_a_panic() {
    for timeout in ["9223372036854775807", "18446744073709551615"] {
        let out = run(simulated("ok").args(["--timeout", timeout]));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "--timeout {timeout}: {all}");
        assert!(!all.contains("panicked") && !all.contains("internal error"), "{all}");
    }
    let out = run(simulated("ok").args(["--timeout", "18446744073709551616"]));
    assert_eq!(out.status.code(), Some(1), "past u64::MAX is a usage error: {}", text(&out));
}

/// Every fault is accepted exactly where it strikes: at each phase, for the parent and for a child, one that
/// the role enters strikes (and fails the run), any other is refused before a child starts. The actions with
/// their own conditions (`corrupt`, the descriptor faults) and the other roles (`--bench`, `--topology`)
/// follow the same rule.
#[test]
fn a_fault_is_accepted_only_where_it_can_strike() {
    let refused = |args: &[&str], spec: &str, why: &str| {
        let out = run(simulated("ok,ok").args(args).env(FAULT, spec));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{spec} {args:?}: {all}");
        assert!(all.contains("cannot strike") && all.contains(why), "{spec} {args:?}: {all}");
        assert!(!all.contains("CP: lshmName") && !all.contains("strikes"), "{spec} {args:?} ran: {all}");
    };
    let strikes = |args: &[&str], spec: &str| {
        let out = run(simulated("ok,ok").args(args).env(FAULT, spec));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{spec} {args:?}: {all}");
        assert!(all.contains(&format!("test fault: {spec} strikes")), "{spec} {args:?} was accepted: {all}");
    };
    for phase in Phase::ALL {
        for (who, phases) in [("parent", Phase::PARENT), ("child1", Phase::CHILD)] {
            let spec = format!("{who}@{}:error", phase.name());
            match phases.contains(&phase) {
                true => strikes(&[], &spec),
                false => refused(&[], &spec, &format!("does not enter {}", phase.name())),
            }
        }
    }
    refused(&[], "parent@verify:kill", "the parent does not enter verify");
    refused(&[], "parent@verify:corrupt", "the parent does not enter verify");
    refused(&[], "parent@allocate-export:send-none", "sends no descriptors");
    refused(&["--ipc", "legacy"], "parent@allocate-export:close-socket", "sends no descriptors");
    strikes(&["--ipc", "vmm"], "parent@allocate-export:send-none");
    refused(&["--bench"], "child1@verify:error", "process 1 does not enter verify");
    refused(&["--bench"], "parent@wait-children:error", "it enters no phase");
    strikes(&["--bench", "--bench-max-bytes", "4096"], "child1@round-robin:error");
    refused(&["--topology"], "child0@attach:kill", "names process 0, but this run has no child processes");
    refused(&["--topology"], "parent@cuda-start:kill", "it enters no phase");
}

/// `simple-ipc | head -1`: whichever process meets the closed pipe first (the parent or a child), the run
/// ends with 141 (128 + SIGPIPE) as a C program would, says nothing of a failed process, and leaves nothing.
#[test]
fn the_reader_going_away_ends_the_run_with_141_quietly() {
    use std::io::BufRead;
    for _ in 0..10 {
        let mut child = simulated("ok,ok")
            .args(["--procs-per-device", "4"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{:?} after {first:?}: {err}", out.status);
        assert!(!err.contains("failed"), "the reader going away is nobody's failure: {err}");
        assert!(wait_group_gone(pid, Duration::from_secs(3)).is_some(), "a process of the run is left");
        assert_eq!(common::leftovers(pid, &[]), Vec::<String>::new());
    }
}

/// The pid of child `index` of the run led by `parent` (its arguments: `@internal child INDEX ...`).
fn child_pid(parent: u32, index: usize) -> u32 {
    let pids = common::descendants(parent);
    *pids
        .iter()
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).collect();
            args.windows(2).any(|pair| pair == [&b"child"[..], index.to_string().as_bytes()])
        })
        .unwrap_or_else(|| panic!("no child {index} among {pids:?}"))
}

/// A Ctrl-C reaches every process of the group at once, and a child may be gone (exit 130) before the
/// parent's own handler has run. Here the child is interrupted first and the parent only once the child has
/// been reaped: the run still ends with the parent's 130, not "Process 1 failed! (exit code 130)". A child
/// interrupted alone, with the parent left alone, is a failed child.
#[test]
fn a_child_stopped_with_the_group_is_not_a_failed_child() {
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let parent = start_hanging(simulated("ok"), 3);
        let pid = parent.id();
        let child = child_pid(pid, 1);
        kill(Pid::from_raw(child as i32), signal).unwrap();
        // Reaped by the parent: /proc no longer has it.
        while std::path::Path::new(&format!("/proc/{child}")).exists() {
            std::thread::sleep(Duration::from_micros(200));
        }
        kill(Pid::from_raw(pid as i32), signal).unwrap();
        let out = parent.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + signal as i32), "{signal}: {err}");
        assert!(!err.contains("Process 1 failed"), "{signal}: {err}");
    }

    let parent = start_hanging(simulated("ok"), 3);
    let child = child_pid(parent.id(), 1);
    kill(Pid::from_raw(child as i32), Signal::SIGINT).unwrap();
    let out = parent.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Process 1 failed! (exit code 130)"), "{err}");
}

/// A standard output with O_NONBLOCK (set by the invoker, and shared with it) and a reader slower than the
/// run: every line arrives, the run passes, and the flag is still set afterwards.
#[test]
fn a_non_blocking_stdout_with_a_slow_reader_loses_nothing() {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use std::io::Read;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    fcntl(&write, FcntlArg::F_SETPIPE_SZ(4096)).unwrap();
    fcntl(&write, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
    let ours = write.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        let mut read = std::fs::File::from(read);
        let (mut all, mut chunk) = (Vec::new(), [0u8; 256]);
        std::thread::sleep(Duration::from_millis(300));
        loop {
            match read.read(&mut chunk).unwrap() {
                0 => return String::from_utf8_lossy(&all).into_owned(),
                n => all.extend_from_slice(&chunk[..n]),
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let out = simulated("ok")
        .args(["--procs-per-device", "32", "--timings"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let flags = OFlag::from_bits_truncate(fcntl(&ours, FcntlArg::F_GETFL).unwrap());
    drop(ours);
    let stdout = reader.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(stdout.len() > 2 * 4096, "the output must overfill the pipe: {} bytes", stdout.len());
    for i in 0..32 {
        assert!(stdout.contains(&format!("Process {i} complete!")), "{stdout}");
    }
    let before_verdict = stdout.trim_end().rsplit_once('\n').map_or("", |(table, _)| table);
    assert!(stdout.trim_end().rsplit('\n').next().is_some_and(|l| l.starts_with("PASSED: ")), "{stdout}");
    assert!(before_verdict.ends_with(|c: char| c.is_ascii_digit()), "the timings table is cut: {stdout}");
    assert!(stdout.contains("Timings (ms)") && stdout.contains("\ntotal "), "{stdout}");
    assert!(flags.contains(OFlag::O_NONBLOCK), "the invoker's O_NONBLOCK was cleared");
}

/// A directory of its own for a test's files, removed when it drops.
fn scratch(name: &str) -> tempfile::TempDir {
    common::scratch(&format!("invoker-{name}"))
}

fn appending(path: &std::path::Path) -> std::fs::File {
    std::fs::OpenOptions::new().append(true).open(path).unwrap()
}

/// `--json /dev/stdout >> log`, `--json F >> F`, `--json /dev/stderr 2>> log`: the path is the run's own
/// output, so it is refused before anything runs, and the file keeps what it held.
#[test]
fn json_to_the_runs_own_output_is_refused_and_destroys_nothing() {
    let tmp = scratch("own-output");
    let dir = tmp.path();
    let log = dir.join("log");
    for (json, stdout, stderr) in
        [("/dev/stdout", true, false), ("log", true, false), ("/dev/stderr", false, true)]
    {
        std::fs::write(&log, "earlier\n").unwrap();
        let mut command = simulated("ok");
        command.current_dir(dir).args(["--json", json]).stdin(Stdio::null());
        command.stdout(if stdout { Stdio::from(appending(&log)) } else { Stdio::null() });
        command.stderr(if stderr { Stdio::from(appending(&log)) } else { Stdio::piped() });
        let out = command.output().unwrap();
        let held = std::fs::read_to_string(&log).unwrap();
        assert_eq!(out.status.code(), Some(1), "--json {json}: {held}{}", text(&out));
        assert!(held.starts_with("earlier\n") && !held.contains("PP: lshmName"), "--json {json}: {held}");
        assert!(format!("{held}{}", text(&out)).contains("standard output or error"), "--json {json}");
        assert!(!held.contains("\"status\""), "--json {json}: {held}");
    }
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 1, "only the log is there");
}

/// Every run given `--json` writes a document that says how it ended: passed, failed (and why), waived (and
/// why), interrupted (by a signal, or the reader going away); the file it replaces is never left empty or
/// partial, and no temporary file stays beside it.
#[test]
fn every_run_given_json_writes_how_it_ended() {
    let tmp = scratch("every-ending");
    let dir = tmp.path();
    let json = dir.join("run.json");
    let document = |mut command: Command, expected_code: i32| -> serde_json::Value {
        std::fs::write(&json, "the previous document").unwrap();
        let out = command.arg("--json").arg(&json).stdin(Stdio::null()).output().unwrap();
        assert_eq!(out.status.code(), Some(expected_code), "{}", text(&out));
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 1, "a temporary file is left");
        common::document(&json)
    };
    // How the run ended, as the document says it: status, reason, exit status.
    let ending = |doc: &serde_json::Value| {
        (
            doc["status"].as_str().map(str::to_owned),
            doc["reason"].as_str().map(str::to_owned),
            doc["exit_status"].as_i64(),
        )
    };

    let passed = document(simulated("ok,ok"), 0);
    assert_eq!(ending(&passed), (Some("passed".into()), None, Some(0)), "{passed}");
    assert_eq!(passed["run"]["processes"], 2, "{passed}");

    let mut corrupt = simulated("ok,ok");
    corrupt.env(FAULT, "child1@verify:corrupt");
    let failed = document(corrupt, 1);
    assert_eq!(
        ending(&failed),
        (Some("failed".into()), Some("Process 1 failed! (exit code 1)".into()), Some(1))
    );

    let waived = document(simulated("no-uva"), 2);
    let (status, reason, code) = ending(&waived);
    assert_eq!((status.as_deref(), code), (Some("waived"), Some(2)), "{waived}");
    assert!(reason.is_some_and(|r| r.starts_with("No CUDA devices support IPC")), "{waived}");

    std::fs::write(&json, "the previous document").unwrap();
    let mut command = simulated("ok");
    command.arg("--json").arg(&json);
    let parent = start_hanging(command, 2);
    kill(Pid::from_raw(parent.id() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(parent.wait_with_output().unwrap().status.code(), Some(143));
    let interrupted = common::document(&json);
    assert_eq!(
        ending(&interrupted),
        (Some("interrupted".into()), Some("interrupted by SIGTERM".into()), Some(143)),
        "{interrupted}"
    );

    let mut child = simulated("ok").arg("--json").arg(&json).stdout(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    assert_eq!(child.wait().unwrap().code(), Some(141));
    let gone = common::document(&json);
    assert_eq!(
        (gone["status"].as_str(), gone["exit_status"].as_i64()),
        (Some("interrupted"), Some(141)),
        "{gone}"
    );
}

/// A standard output whose reader is already gone: every write answers EPIPE.
fn reader_gone_before_the_start() -> Stdio {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    drop(read);
    Stdio::from(write)
}

/// The reader gone before the verdict, and only then: 141, quietly, as when it goes before any other line,
/// not a passed run's 0 with "the reader of standard output went away" on standard error (`--topology |
/// head -1` did that, 4 of 40). The sample's run writes the verdict alone (`--quiet`), its document says
/// so; `--topology` (which takes no `--quiet`) writes into a pipe of one page that holds what comes before
/// the verdict and no more, so that the verdict's write waits until the reader has gone.
#[test]
fn the_reader_gone_before_the_verdict_is_141_quietly() {
    let dir = common::scratch("reader-gone-verdict");
    let json = dir.path().join("run.json");
    let out = simulated("ok,ok")
        .arg("--quiet")
        .arg("--json")
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(reader_gone_before_the_start())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "--quiet: {err}");
    assert_eq!(err, "", "--quiet: nothing is said of a reader that went away");
    let document = common::document(&json);
    assert_eq!(document["status"], "interrupted", "{document}");
    assert_eq!(document["reason"], "the reader of standard output went away");
    assert_eq!(document["exit_status"], 141);

    let whole = run(simulated("ok,ok").arg("--topology"));
    assert_eq!(whole.status.code(), Some(0), "{}", text(&whole));
    let said = String::from_utf8_lossy(&whole.stdout);
    let before_verdict = said.len() - said.lines().last().unwrap().len() - 1;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let page = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(4096)).unwrap() as usize;
    assert!(before_verdict < page, "what --topology says fits in a page");
    let filled = nix::unistd::write(&write, &vec![b'.'; page - before_verdict]).unwrap();
    assert_eq!(filled, page - before_verdict);
    let topology = simulated("ok,ok")
        .arg("--topology")
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500)); // it has written all but the verdict, and waits
    drop(read);
    let out = topology.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "--topology: {err}");
    assert_eq!(err, "", "--topology: nothing is said of a reader that went away");
}

/// `--ipc all | head -1`: the run of one mechanism under way is stopped because the reader went away, and
/// the reason is the one a single run gives, "the reader of standard output went away" (it was
/// "interrupted by SIGPIPE", a signal this program ignores), in the document and never said as an
/// interruption.
#[test]
fn every_mechanism_with_its_reader_gone_gives_the_single_runs_reason() {
    use std::io::BufRead;
    let dir = common::scratch("reader-gone-all");
    let json = dir.path().join("all.json");
    for _ in 0..3 {
        let mut child = simulated("ok,ok")
            .args(["--ipc", "all", "--json"])
            .arg(&json)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "after {first:?}: {err}");
        assert!(!err.contains("SIGPIPE"), "{err}");
        let document = common::document(&json);
        assert_eq!(document["reason"], "the reader of standard output went away", "{document}");
        assert_eq!(document["status"], "interrupted");
        assert!(wait_group_gone(pid, Duration::from_secs(3)).is_some(), "a process of the run is left");
    }
}

/// Descriptors 3..9 left open by the invoker (as shells, IDEs, CI runners and `make -j` leave them) stay in
/// the process the user started: no process that the run starts by exec (its children, its guardian) has
/// one, so none holds the invoker's pipe open past the run or takes one for its own.
#[test]
fn descriptors_the_invoker_left_open_reach_no_process_of_the_run() {
    let left_open = common::LeftOpen::new();
    let mut command = simulated("ok");
    left_open.give_to(&mut command);
    let run = start_hanging(command, 3);
    let (started, held) = left_open.held_by_what_started(run.id());
    group_signal(run.id(), Signal::SIGTERM);
    run.wait_with_output().unwrap();
    assert!(started >= 4, "the 3 children and the guardian, started by exec: {started}");
    assert_eq!(held, Vec::<String>::new(), "processes of the run hold the invoker's descriptors");
}
