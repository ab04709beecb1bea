//! The program leaves nothing in TMPDIR: each kind of run the tests make (a plain run, a failed one,
//! `--ipc all`, `--bench`, `--serve`/`--join`, `--isolate`), given a fresh empty TMPDIR of its own, leaves
//! it empty once every process of the run is gone. (The tests' own files are in directories that go when
//! the test ends: `common::scratch`.)

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{FAULT, simulated, text};

/// What is in `dir`, waiting up to 3 s for it to be empty (a guardian may still be at work after the run's
/// processes are gone).
fn left_in(dir: &Path) -> Vec<String> {
    let names = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        names
    };
    let start = Instant::now();
    while !names().is_empty() && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    names()
}

/// Asserts that the run of `what` left nothing in `tmpdir`, once its process group (`pgid`) is gone.
fn assert_left_nothing(tmpdir: &Path, pgid: u32, what: &str) {
    assert!(common::wait_group_gone(pgid, Duration::from_secs(3)).is_some(), "{what}: a process is left");
    assert_eq!(
        left_in(tmpdir),
        Vec::<String>::new(),
        "{what}: the run left this in TMPDIR {}",
        tmpdir.display()
    );
}

/// Runs `command` (a simulated run in a process group of its own) to its end with TMPDIR a fresh empty
/// directory; asserts that it left the directory empty, and returns its output.
fn run_with_fresh_tmpdir(what: &str, command: &mut Command) -> Output {
    let tmpdir = common::scratch("tmpdir-guard");
    let (pid, out) = common::run_with_pid(command.env("TMPDIR", tmpdir.path()));
    assert_left_nothing(tmpdir.path(), pid, what);
    out
}

#[test]
fn a_plain_run_and_a_failed_one_leave_nothing_in_tmpdir() {
    let docs = common::scratch("tmpdir-doc");
    let json = docs.path().join("run.json");
    let mut plain = simulated("ok,ok");
    plain.args(["--procs-per-device", "2", "--timings", "--json"]).arg(&json);
    let out = run_with_fresh_tmpdir("a plain run", &mut plain);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(common::document(&json)["status"], "passed");

    let mut failed = simulated("ok");
    failed.args(["--procs-per-device", "3"]).env(FAULT, "child1@verify:corrupt");
    let out = run_with_fresh_tmpdir("a failed run", &mut failed);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

#[test]
fn ipc_all_leaves_nothing_in_tmpdir() {
    let mut all = simulated("ok+imex,ok+imex");
    all.args(["--ipc", "all", "--procs-per-device", "2"]);
    let out = run_with_fresh_tmpdir("--ipc all", &mut all);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("fabric"), "every mechanism ran: {}", text(&out));
}

#[test]
fn bench_leaves_nothing_in_tmpdir() {
    let mut bench = simulated("ok,ok");
    bench.args(["--bench", "--bench-max-bytes", "8192"]);
    let out = run_with_fresh_tmpdir("--bench", &mut bench);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("== pair "), "{}", text(&out));
}

fn joiner(socket: &str, tmpdir: &Path) -> Child {
    simulated("ok")
        .args(["--join", socket])
        .env("TMPDIR", tmpdir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

/// A served run and a served `--ipc all`, each with two joiners; the socket is elsewhere, so that TMPDIR
/// holds only what the processes chose to put there.
#[test]
fn serve_and_join_leave_nothing_in_tmpdir() {
    for ipc in ["legacy", "all"] {
        let what = format!("--serve --ipc {ipc}");
        let tmpdir = common::scratch("tmpdir-guard");
        let socket_dir = common::scratch("tmpdir-socket");
        let socket = socket_dir.path().join("run.sock").display().to_string();
        let mut server = simulated("ok")
            .args(["--serve", &socket, "--procs-per-device", "2", "--ipc", ipc, "--timeout", "20"])
            .env("TMPDIR", tmpdir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts");
        let serving = common::wait_for_lines(&mut server, "waiting for", 1, Duration::from_secs(10));
        assert_eq!(serving, 1, "{what}: the server serves");
        let joiners = [joiner(&socket, tmpdir.path()), joiner(&socket, tmpdir.path())];
        let pids: Vec<u32> = joiners.iter().map(Child::id).collect();
        for joiner in joiners {
            let out = joiner.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(0), "{what}: a joiner: {}", text(&out));
            assert!(text(&out).contains("complete!"), "{what}: {}", text(&out));
        }
        assert_eq!(server.wait().unwrap().code(), Some(0), "{what}: the server");
        for pid in pids {
            assert_left_nothing(tmpdir.path(), pid, &format!("{what}: joiner {pid}"));
        }
        assert_left_nothing(tmpdir.path(), server.id(), &what);
    }
}

/// `--isolate pid` (an abstract socket) and `--isolate container` (network namespaces of their own: the
/// socket is in a private directory in TMPDIR, removed with the run). Where this host gives no namespaces
/// the runs are waived (and must still leave nothing), and the test says it was skipped.
#[test]
fn isolated_runs_leave_nothing_in_tmpdir() {
    for isolate in ["pid", "container"] {
        let what = format!("--isolate {isolate}");
        let mut isolated = simulated("ok");
        isolated.args(["--isolate", isolate, "--ipc", "vmm", "--sync", "memops"]);
        let out = run_with_fresh_tmpdir(&what, &mut isolated);
        if out.status.code() == Some(2) {
            common::skipped(
                "namespaces",
                format!("isolated_runs_leave_nothing_in_tmpdir ({what}): no namespaces here: {}", text(&out)),
            );
            continue;
        }
        assert_eq!(out.status.code(), Some(0), "{what}: {}", text(&out));
        assert!(text(&out).contains("Isolated ("), "{what}: {}", text(&out));
    }
}
