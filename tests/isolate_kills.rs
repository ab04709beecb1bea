//! `--isolate` runs killed or hung, with real namespaces: killed whole or in part at any moment, with a
//! stopped init, a hung process or a killed parent, every process of the run goes and no socket directory
//! or driver file is left. Where this host gives no namespaces, each test says it was skipped; the tests
//! take turns (`common::isolate`).

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::FAULT;
use common::isolate::{
    EndMarked, Tmp, assert_no_driver_files, children_of, driver_files, isolated, isolated_turn, marked,
    state_of, wait_all_gone, wait_at_most,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// A run held in its round-robin, then killed: by SIGKILL to its process group (the processes in
/// namespaces are in sessions of their own, reached through the process outside), or by SIGINT. Every
/// process is gone within 3 s, and nothing is left in /dev/shm or TMPDIR.
#[test]
fn killing_an_isolated_run_leaves_nothing() {
    let Some(_turn) = isolated_turn("killing_an_isolated_run_leaves_nothing") else { return };
    for (isolate, signal) in [
        ("pid", Signal::SIGKILL),
        ("joiners:pid", Signal::SIGKILL),
        ("container", Signal::SIGINT),
        ("shm", Signal::SIGKILL),
        // A socket in a directory (net namespaces of their own): gone once every process joined.
        ("net", Signal::SIGKILL),
    ] {
        let tmp = Tmp::new("killed");
        let mark = format!("{}-{isolate}-{signal}", std::process::id());
        let _end = EndMarked(mark.clone());
        // memops with vmm: passes across every boundary, so that the run is held, not failed.
        let mut child = isolated(
            &tmp,
            &[
                "--isolate",
                isolate,
                "--ipc",
                "vmm",
                "--sync",
                "memops",
                "--timeout",
                "0",
                "--procs-per-device",
                "2",
            ],
        )
        .env(FAULT, "child1@round-robin:hang")
        .env("SIMPLE_IPC_TEST_MARK", &mark)
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        let seen = common::wait_for_lines(&mut child, "Starting on device", 2, Duration::from_secs(10));
        assert_eq!(seen, 2, "{isolate}: both processes started");
        std::thread::sleep(Duration::from_millis(300));
        let pids = marked(&mark);
        assert!(pids.len() >= 3, "{isolate}: the run's processes are there: {pids:?}");
        killpg(Pid::from_raw(child.id() as i32), signal).unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "{isolate}: {status:?}");
        if signal == Signal::SIGINT {
            // Passed on to the run, which stops in order and says so as a shell would: 128 + 2.
            assert_eq!(status.code(), Some(130), "{isolate}: {status:?}");
        }
        let left = wait_all_gone(&mark, Duration::from_secs(3));
        assert_eq!(left, Vec::<u32>::new(), "{isolate}, {signal}: every process of the run is gone");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "{isolate}, {signal}: no socket directory is left");
        assert_no_driver_files(child.id(), &format!("{isolate}, {signal}"));
    }
}

/// The inits of PID namespaces (pid 1 in their own) among `pid`'s children: the process that entered a
/// PID namespace hands its init over to the process that started it, a child subreaper, and ends, so that
/// no process stands between them.
fn inits_among_children_of(pid: u32) -> Vec<u32> {
    children_of(pid).into_iter().filter(|&child| pid_in_its_namespace(child) == Some(1)).collect()
}

/// `pid`'s number in its own (innermost) PID namespace.
fn pid_in_its_namespace(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// An isolated run (`--isolate ISOLATE`, vmm and memops, 2 processes, `--timeout 2`) whose child 1 hangs in
/// the round-robin, its processes marked with `mark`, its output in the file `log`: a file, not a pipe, as a
/// process left behind would hold a pipe open, and the test with it.
fn run_whose_child1_hangs(
    tmp: &Tmp,
    isolate: &str,
    mark: &str,
    log: &std::path::Path,
) -> std::process::Child {
    let file = std::fs::File::create(log).unwrap();
    let args = "--ipc vmm --sync memops --procs-per-device 2 --timeout 2 --isolate";
    let mut args: Vec<&str> = args.split(' ').collect();
    args.push(isolate);
    isolated(tmp, &args)
        .env(FAULT, "child1@round-robin:hang")
        .env("SIMPLE_IPC_TEST_MARK", mark)
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap()
}

/// The init (pid 1) of an isolated run's PID namespace stopped (SIGSTOP): it can reap nothing, and the run
/// would never end. The process outside stops the run at its deadline (--timeout and 4 s), exits 1 naming
/// the stopped init, and nothing of the run is left; never PASSED. Under joiners:pid, a joiner's stopped
/// init is killed with the joiner by the parent that started it, and outlives nothing.
#[test]
fn a_stopped_init_is_stopped_at_the_deadline_and_named() {
    let Some(_turn) = isolated_turn("a_stopped_init_is_stopped_at_the_deadline_and_named") else { return };
    for isolate in ["pid", "joiners:pid"] {
        let tmp = Tmp::new("stopped-init");
        let mark = format!("{}-stopped-init-{isolate}", std::process::id());
        let _end = EndMarked(mark.clone());
        let log = tmp.path().join("run.log");
        let mut child = run_whose_child1_hangs(&tmp, isolate, &mark, &log);
        let started = Instant::now();
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        while said().matches("Starting on device").count() < 2 && started.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        // The run's own init (pid): outside -> init; a joiner's (joiners:pid): parent -> init, one level
        // less than when the process that entered the namespace stayed between them.
        let inits: Vec<u32> = inits_among_children_of(child.id()).into_iter().take(1).collect();
        assert_eq!(inits.len(), 1, "{isolate}: one init to stop: {}", said());
        nix::sys::signal::kill(Pid::from_raw(inits[0] as i32), Signal::SIGSTOP).unwrap();
        let status = wait_at_most(&mut child, Duration::from_secs(12));
        let out = said();
        let _ = std::fs::remove_file(&log);
        assert_eq!(status.and_then(|s| s.code()), Some(1), "{isolate}: ended by the deadline: {out}");
        assert!(!out.contains("PASSED"), "{isolate}: {out}");
        let verdict = out.lines().rfind(|l| l.starts_with("FAILED")).unwrap_or_default();
        if isolate == "pid" {
            assert!(verdict.contains("init of a PID namespace") && verdict.contains("stopped"), "{out}");
        }
        let left = wait_all_gone(&mark, Duration::from_secs(3));
        assert_eq!(left, Vec::<u32>::new(), "{isolate}: the stopped init and all it held are gone");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "{isolate}: no socket directory is left");
    }
}

/// A process the parent started that hangs (it never answers the abort): the watchdog stops the run, and
/// the parent ends what it started, its init and all, before it exits; nothing is left.
#[test]
fn a_hung_isolated_process_is_ended_by_the_parent_that_started_it() {
    let Some(_turn) = isolated_turn("a_hung_isolated_process_is_ended_by_the_parent_that_started_it") else {
        return;
    };
    for isolate in ["pid", "joiners:pid", "net"] {
        let tmp = Tmp::new("hung");
        let mark = format!("{}-hung-{isolate}", std::process::id());
        let _end = EndMarked(mark.clone());
        let log = tmp.path().join("run.log");
        let mut child = run_whose_child1_hangs(&tmp, isolate, &mark, &log);
        let status = wait_at_most(&mut child, Duration::from_secs(15));
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        assert_eq!(status.and_then(|s| s.code()), Some(1), "{isolate}: the watchdog: {said}");
        assert!(said.contains("did not finish within 2 s"), "{isolate}: {said}");
        let left = wait_all_gone(&mark, Duration::from_secs(3));
        assert_eq!(left, Vec::<u32>::new(), "{isolate}: the hung process and its init are gone");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "{isolate}: no socket directory is left");
    }
}

/// The run's own process (pid 2 in its PID namespace) killed by SIGKILL while it holds its events: the
/// process the user started exits as it did (137, as a shell says a SIGKILL), and the init waits for the
/// guardian, which removes the driver's files, before the namespace ends.
#[test]
fn the_isolated_parent_killed_exits_as_killed_and_its_guardian_still_cleans_up() {
    let Some(_turn) =
        isolated_turn("the_isolated_parent_killed_exits_as_killed_and_its_guardian_still_cleans_up")
    else {
        return;
    };
    let tmp = Tmp::new("parent-killed");
    let mark = format!("{}-parent-killed", std::process::id());
    let _end = EndMarked(mark.clone());
    let mut child =
        isolated(&tmp, &["--isolate", "pid", "--ipc", "vmm", "--procs-per-device", "2", "--timeout", "0"])
            .env(FAULT, "parent@wait-children:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    let start = Instant::now();
    while driver_files(child.id()).is_empty() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!driver_files(child.id()).is_empty(), "the parent exported its events");
    // outside -> init -> the run's process: the process that entered the namespaces handed the init over
    // and ended.
    // (The process that handed over may still be a zombie, not yet reaped.)
    let live: Vec<u32> = children_of(child.id()).into_iter().filter(|&c| state_of(c) != Some('Z')).collect();
    let init = inits_among_children_of(child.id());
    assert_eq!(init.len(), 1, "the process outside has one child, the init: {live:?}");
    assert_eq!(live, init, "and no other process");
    let run = children_of(init[0]);
    let parent = *run.first().expect("the init runs the parent");
    nix::sys::signal::kill(Pid::from_raw(parent as i32), Signal::SIGKILL).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(137), "exits as the run's process did: {status:?}");
    assert_eq!(wait_all_gone(&mark, Duration::from_secs(3)), Vec::<u32>::new(), "every process is gone");
    assert_no_driver_files(child.id(), "the parent killed");
}

/// The parent alone killed by SIGKILL (not its group), with a hung process it started: what it started
/// does not outlive it (PR_SET_PDEATHSIG), and the init of that process ends it. And SIGTERM to the matrix's
/// top process goes on to the cell that runs, at once.
#[test]
fn what_an_isolated_parent_started_does_not_outlive_it() {
    let Some(_turn) = isolated_turn("what_an_isolated_parent_started_does_not_outlive_it") else { return };
    for (args, signal) in [
        (
            &["--isolate", "joiners:pid", "--ipc", "vmm", "--sync", "memops", "--procs-per-device", "2"][..],
            Signal::SIGKILL,
        ),
        (&["--ipc", "all", "--isolate", "pid"][..], Signal::SIGTERM),
    ] {
        let tmp = Tmp::new("outlive");
        let mark = format!("{}-outlive-{signal}", std::process::id());
        let _end = EndMarked(mark.clone());
        let mut child = isolated(&tmp, args)
            .args(["--timeout", "0"])
            .env(FAULT, "child0@round-robin:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        assert!(marked(&mark).len() >= 3, "{args:?}: the run is under way");
        nix::sys::signal::kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let status = wait_at_most(&mut child, Duration::from_secs(5));
        assert!(status.is_some(), "{args:?}: the process signalled ends within 5 s");
        assert_eq!(wait_all_gone(&mark, Duration::from_secs(4)), Vec::<u32>::new(), "{args:?}: all gone");
    }
}

/// `--isolate net` (a socket in a private directory under TMPDIR) with every process of the run SIGKILLed
/// at once, the process outside and the run's own process group, at several moments from its start on:
/// only the guardian, in a session of its own, is left, and it removes the socket file and the directory
/// (the run had no code left to run). Nothing stays in TMPDIR.
#[test]
fn an_isolated_run_killed_whole_at_any_moment_leaves_no_socket_or_directory() {
    let Some(_turn) =
        isolated_turn("an_isolated_run_killed_whole_at_any_moment_leaves_no_socket_or_directory")
    else {
        return;
    };
    for after_ms in [5u64, 15, 30, 60, 120, 250] {
        let tmp = Tmp::new("killed-whole");
        let mark = format!("{}-killed-whole-{after_ms}", std::process::id());
        let _end = EndMarked(mark.clone());
        let mut child = isolated(&tmp, &["--isolate", "net", "--ipc", "vmm", "--procs-per-device", "2"])
            .args(["--timeout", "0"])
            .env(FAULT, "child1@round-robin:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        // Until the run has made what it makes (or the moment has come).
        while start.elapsed() < Duration::from_millis(after_ms) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let made = tmp.entries();
        let run = children_of(child.id());
        let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        for pid in &run {
            let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        child.wait().unwrap();
        let gone = Instant::now();
        while !tmp.entries().is_empty() && gone.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            tmp.entries(),
            Vec::<String>::new(),
            "killed {after_ms} ms in (it had made {made:?}): the socket directory is left"
        );
        wait_all_gone(&mark, Duration::from_secs(3));
    }
}

/// The init of an isolated run's PID namespace killed (SIGKILL) as soon as it is there, at several moments
/// while the run's processes meet at their socket in a private directory under TMPDIR: the kernel kills
/// every process of the namespace with it, the run's guardian among them, so the process outside, which
/// chose where that directory is made, removes it. Nothing stays in TMPDIR.
#[test]
fn an_init_killed_early_leaves_no_socket_directory() {
    let Some(_turn) = isolated_turn("an_init_killed_early_leaves_no_socket_directory") else { return };
    let mut made_one = false;
    for after_ms in [0u64, 2, 4, 6, 8, 10, 14, 18, 24, 30] {
        let tmp = Tmp::new("init-killed");
        let mark = format!("{}-init-killed-{after_ms}", std::process::id());
        let _end = EndMarked(mark.clone());
        let mut child = isolated(&tmp, &["--isolate", "container", "--ipc", "vmm", "--sync", "memops"])
            .env(FAULT, "child0@round-robin:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let init = loop {
            if let Some(&init) = inits_among_children_of(child.id()).first() {
                break Some(init);
            }
            if start.elapsed() > Duration::from_secs(5) {
                break None;
            }
            std::thread::yield_now();
        };
        let init = init.expect("the run's PID namespace has an init");
        std::thread::sleep(Duration::from_millis(after_ms));
        made_one |= !tmp.entries().is_empty();
        let _ = nix::sys::signal::kill(Pid::from_raw(init as i32), Signal::SIGKILL);
        let status = wait_at_most(&mut child, Duration::from_secs(10));
        assert!(status.is_some(), "{after_ms} ms: the process outside ended");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "init killed {after_ms} ms in: left in TMPDIR");
        wait_all_gone(&mark, Duration::from_secs(3));
    }
    assert!(made_one, "at least one kill came while the socket's directory was there");
}
