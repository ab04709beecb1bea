//! `--serve SOCKET` and `--join SOCKET` on simulated GPUs: processes the server did not start join the run
//! over a Unix socket and are children in every respect; each side notices the other's death through the
//! socket; who may join, and how many; devices matched by UUID; a socket path that exists is left alone.

mod common;

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{FAULT, SIMULATE, bin, text};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A process of the run, its output collected on threads as it comes.
struct Running {
    child: Child,
    out: Arc<Mutex<String>>,
}

impl Running {
    fn start(gpus: &str, args: &[&str], fault: Option<&str>) -> Self {
        let mut command = Command::new(bin());
        command.args(args).env(SIMULATE, gpus).env_remove(FAULT).stdin(Stdio::null());
        if let Some(fault) = fault {
            command.env(FAULT, fault);
        }
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let out = Arc::new(Mutex::new(String::new()));
        for mut stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let out = Arc::clone(&out);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = stream.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    out.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk[..n]));
                }
            });
        }
        Self { child, out }
    }

    fn text(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    fn wait_for(&self, needle: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.text().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Waits for the end (up to `limit`); the exit status and everything it printed.
    fn end(mut self, limit: Duration) -> (Option<i32>, String, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(20)); // the output threads drain
                return (status.code(), self.text(), start.elapsed());
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return (None, format!("(did not end within {limit:?}) {}", self.text()), start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A fresh socket path of this test's own, `run.sock` in a directory (mode 0700) that is removed with all
/// it holds when the returned guard drops.
fn socket_path(name: &str) -> (tempfile::TempDir, String) {
    let dir = common::scratch(&format!("serve-{name}"));
    let socket = dir.path().join("run.sock").display().to_string();
    (dir, socket)
}

fn serve(gpus: &str, socket: &str, args: &[&str]) -> Running {
    let mut all = vec!["--serve", socket];
    all.extend_from_slice(args);
    let server = Running::start(gpus, &all, None);
    assert!(server.wait_for("waiting for", Duration::from_secs(10)), "the server serves: {}", server.text());
    server
}

fn join(gpus: &str, socket: &str, fault: Option<&str>) -> Running {
    Running::start(gpus, &["--join", socket], fault)
}

const LIMIT: Duration = Duration::from_secs(20);

/// A served run with two joiners passes with every mechanism, with the events and with memops; each
/// joiner is a child (its lines, its verification, its status), the server says who joined, and neither
/// the socket nor a driver file is left.
#[test]
fn a_served_run_passes_with_every_mechanism() {
    let cases = [
        ("legacy", "events"),
        ("vmm", "events"),
        ("pool", "events"),
        ("legacy", "memops"),
        ("vmm", "memops"),
    ];
    for (i, (ipc, sync)) in cases.into_iter().enumerate() {
        let (_dir, socket) = if i % 2 == 0 {
            let (dir, socket) = socket_path(ipc);
            (Some(dir), socket)
        } else {
            (None, format!("@simple-ipc-test-{}-{i}", std::process::id()))
        };
        let server = serve("ok", &socket, &["--procs-per-device", "2", "--ipc", ipc, "--sync", sync]);
        let server_pid = server.child.id();
        let joiners = [join("ok", &socket, None), join("ok", &socket, None)];
        let (code, out, _) = server.end(LIMIT);
        assert_eq!(code, Some(0), "{ipc} {sync}: {out}");
        assert!(out.contains("Process 0 joined") && out.contains("Process 1 joined"), "{out}");
        let mut completed = 0;
        for joiner in joiners {
            let (code, out, _) = joiner.end(LIMIT);
            assert_eq!(code, Some(0), "{ipc} {sync}: a joiner: {out}");
            assert!(out.contains(&format!("CP: lshmName = simpleIPCshm{server_pid}")), "{out}");
            completed += out.matches("complete!").count();
        }
        assert_eq!(completed, 2, "{ipc} {sync}");
        assert!(!std::path::Path::new(&socket).exists(), "{socket} was left");
        common::assert_nothing_left(server_pid, &[], &format!("{ipc} {sync}"));
    }
}

/// A server and its joiners given a `--timeout` too long for a deadline (`u64::MAX` seconds) pass, and
/// leave no socket: a panic on adding it to the clock had left the socket file behind.
#[test]
fn a_timeout_too_long_for_the_clock_serves_and_leaves_nothing() {
    let never = u64::MAX.to_string();
    for ipc in ["legacy", "all"] {
        let (_dir, socket) = socket_path(&format!("never-{ipc}"));
        let server = Running::start("ok", &["--serve", &socket, "--ipc", ipc, "--timeout", &never], None);
        // Its own limit finite, so that a failing server leaves no joiner waiting for ever.
        let joiner = Running::start("ok", &["--join", &socket, "--timeout", "20"], None);
        let (code, out, _) = server.end(LIMIT);
        assert_eq!(code, Some(0), "{ipc}: the server: {out}");
        let (code, out, _) = joiner.end(LIMIT);
        assert_eq!(code, Some(0), "{ipc}: the joiner: {out}");
        assert!(!std::path::Path::new(&socket).exists(), "{ipc}: {socket} was left");
    }
}

/// `--serve --ipc all` is a sequence of runs, one per mechanism, and the joiners follow it from one to the
/// next: each takes part in every run, is told of the waived one, and ends when the last has; so does the
/// server, with its table. The same with --sync memops, where pool is waived without a run.
#[test]
fn a_served_sequence_takes_its_joiners_through_every_mechanism() {
    for (name, sync, runs, waived) in [("all", "events", 3, "4/4"), ("all-memops", "memops", 2, "3/3")] {
        let (_dir, socket) = socket_path(name);
        let server = serve("ok", &socket, &["--procs-per-device", "2", "--ipc", "all", "--sync", sync]);
        let server_pid = server.child.id();
        let joiners = [join("ok", &socket, None), join("ok", &socket, None)];
        let (code, out, _) = server.end(LIMIT);
        assert_eq!(code, Some(0), "{sync}: {out}");
        assert!(out.contains("legacy passed") && out.contains("vmm passed"), "{sync}: {out}");
        for joiner in joiners {
            let (code, out, _) = joiner.end(LIMIT);
            assert_eq!(code, Some(0), "{sync}: a joiner: {out}");
            assert_eq!(
                out.matches("complete!").count(),
                runs,
                "{sync}: one part in each run that ran: {out}"
            );
            assert!(out.contains(&format!("run {waived} was waived")), "{sync}: told of fabric: {out}");
        }
        assert!(!std::path::Path::new(&socket).exists(), "{socket} was left");
        common::assert_nothing_left(server_pid, &[], sync);
    }
}

/// `--bench --serve`: the consumer serves, the producer joins (from another container, say): every pair's
/// hand-overs and copies are measured across the socket; a joiner asked for `--bench` that finds the sample
/// says so; the producer killed mid-benchmark fails the consumer at once.
#[test]
fn the_benchmark_runs_across_the_socket() {
    let socket = format!("@simple-ipc-test-bench-{}", std::process::id());
    let args = ["--bench", "--ipc", "vmm", "--bench-max-bytes", "16KiB"];
    let mut all = vec!["--serve", socket.as_str()];
    all.extend_from_slice(&args);
    let server = Running::start("ok,ok", &all, None);
    assert!(server.wait_for("waiting for its producer", Duration::from_secs(10)), "{}", server.text());
    let server_pid = server.child.id();
    let producer = Running::start("ok,ok", &["--join", &socket, "--bench"], None);
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(out.matches("events, signal only, GPU waits").count(), 4, "four pairs of two GPUs: {out}");
    assert_eq!(out.matches("16 KiB").count(), 4, "each pair's largest copy: {out}");
    let (code, out, _) = producer.end(LIMIT);
    assert_eq!(code, Some(0), "the producer: {out}");
    common::assert_nothing_left(server_pid, &[], "the served benchmark");

    // --join --bench to the sample: refused at the door, taking no place; the run goes on with a joiner
    // that asks for the sample.
    let sample = format!("@simple-ipc-test-sample-{}", std::process::id());
    let server = serve("ok", &sample, &[]);
    let joiner = Running::start("ok", &["--join", &sample, "--bench"], None);
    let (code, out, _) = joiner.end(LIMIT);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("refused this process: this run is not the benchmark"), "{out}");
    let joiner = join("ok", &sample, None);
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(joiner.end(LIMIT).0, Some(0));

    // The producer killed while it answers hand-overs.
    let socket = format!("@simple-ipc-test-bench-dies-{}", std::process::id());
    let mut all = vec!["--serve", socket.as_str()];
    all.extend_from_slice(&args);
    let server = Running::start("ok", &all, None);
    assert!(server.wait_for("waiting for its producer", Duration::from_secs(10)), "{}", server.text());
    let producer = Running::start("ok", &["--join", &socket], Some("child1@round-robin:kill"));
    let (code, out, took) = server.end(LIMIT);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("the producer stopped") && out.contains("Process 1"), "{out}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let _ = producer.end(Duration::from_secs(3));
}

/// A joiner killed in the round-robin fails the run on the serving side at once, naming it; the other
/// joiner stops too.
#[test]
fn a_joiner_that_dies_fails_the_run_at_once_naming_it() {
    let (_dir, socket) = socket_path("dies");
    let server = serve("ok", &socket, &["--procs-per-device", "2"]);
    let fault = Some("child1@round-robin:kill");
    let joiners = [join("ok", &socket, fault), join("ok", &socket, fault)];
    let (code, out, took) = server.end(LIMIT);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("Process 1 failed!") && out.contains("gone without saying how it ended"), "{out}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    for joiner in joiners {
        let (code, out, _) = joiner.end(Duration::from_secs(3));
        // One was killed (no status); the other stopped with an error.
        assert!(code == Some(1) || code.is_none() && !out.contains("did not end"), "{out}");
    }
}

/// A joiner killed at each phase of its part: the server fails the run within a few seconds naming it, the
/// other joiner ends (it may have finished its part already), and nothing is left.
#[test]
fn a_joiner_killed_at_any_phase_fails_the_run_and_leaves_nothing() {
    for phase in [
        "attach",
        "cuda_start",
        "context",
        "prepare",
        "wait_ready",
        "open_handles",
        "round_robin",
        "copy_back",
        "verify",
        "clean_up",
    ] {
        let (_dir, socket) = socket_path(&format!("joiner-{phase}"));
        let server = serve("ok", &socket, &["--procs-per-device", "2", "--ipc", "vmm"]);
        let server_pid = server.child.id();
        let fault = format!("child1@{phase}:kill");
        let joiners = [join("ok", &socket, Some(&fault)), join("ok", &socket, Some(&fault))];
        let (code, out, took) = server.end(LIMIT);
        assert_eq!(code, Some(1), "{phase}: {out}");
        assert!(out.contains("Process 1 failed!"), "{phase}: names it: {out}");
        assert!(took < Duration::from_secs(5), "{phase}: {took:?}");
        for joiner in joiners {
            let (code, out, _) = joiner.end(Duration::from_secs(3));
            assert!(!out.contains("did not end"), "{phase}: every joiner ends: {out}");
            assert!(matches!(code, None | Some(0) | Some(1)), "{phase}: {code:?} {out}");
        }
        assert!(!std::path::Path::new(&socket).exists(), "{phase}: {socket} was left");
        common::assert_nothing_left(server_pid, &[], phase);
    }
}

/// The server killed at each phase of its run: every joiner ends within its --timeout, with an error, even where the
/// server died after the joiners' parts were done (it never said how the run ended: not PASSED), and the
/// guardian leaves no driver file.
#[test]
fn the_server_killed_at_any_phase_stops_every_joiner_and_leaves_nothing() {
    for phase in ["start_children", "allocate_export", "wait_children", "clean_up"] {
        let (_dir, socket) = socket_path(&format!("server-{phase}"));
        let mut server = Running::start(
            "ok",
            &["--serve", &socket, "--procs-per-device", "2"],
            Some(&format!("parent@{phase}:kill")),
        );
        let server_pid = server.child.id();
        // The server may die before it listens (start_children): then a joiner waits for a server that
        // never comes, until its own --timeout, and that is an error too.
        std::thread::sleep(Duration::from_millis(200));
        let args = ["--join", socket.as_str(), "--timeout", "2"];
        let joiners = [Running::start("ok", &args, None), Running::start("ok", &args, None)];
        let status = server.child.wait().unwrap();
        assert!(status.code().is_none(), "{phase}: the server was killed: {status:?} {}", server.text());
        for joiner in joiners {
            let (code, out, took) = joiner.end(Duration::from_secs(5));
            assert!(!out.contains("did not end"), "{phase}: every joiner ends: {out}");
            assert!(took < Duration::from_secs(5), "{phase}: {took:?}");
            assert_eq!(code, Some(1), "{phase}: {out}");
            assert!(!out.contains("PASSED"), "{phase}: {out}");
            if phase == "clean_up" {
                assert!(out.contains("without saying how the run ended"), "{phase}: {out}");
            }
        }
        common::assert_nothing_left(server_pid, &[], phase);
    }
}

/// The server killed while its joiners wait in the barrier for a third that never comes: both stop within
/// half a second, saying that the server is gone.
#[test]
fn the_servers_death_stops_every_joiner() {
    let (_dir, socket) = socket_path("server-dies");
    let mut server = serve("ok", &socket, &["--procs-per-device", "3"]);
    let joiners = [join("ok", &socket, None), join("ok", &socket, None)];
    for joiner in &joiners {
        assert!(joiner.wait_for("Starting on device", Duration::from_secs(10)), "{}", joiner.text());
    }
    std::thread::sleep(Duration::from_millis(300));
    kill(Pid::from_raw(server.child.id() as i32), Signal::SIGKILL).unwrap();
    server.child.wait().unwrap();
    for joiner in joiners {
        let (code, out, took) = joiner.end(Duration::from_secs(3));
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains("the server of the run is gone"), "{out}");
        assert!(took < Duration::from_millis(1500), "stopped after {took:?}");
    }
}

/// The server takes no more joiners than the run needs: the one too many is refused with the reason.
#[test]
fn one_joiner_too_many_is_refused() {
    let (_dir, socket) = socket_path("too-many");
    let server = serve("ok", &socket, &["--procs-per-device", "2"]);
    let joiners = [join("ok", &socket, None), join("ok", &socket, None), join("ok", &socket, None)];
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(code, Some(0), "{out}");
    let ends: Vec<(Option<i32>, String)> = joiners
        .into_iter()
        .map(|j| {
            let (c, o, _) = j.end(LIMIT);
            (c, o)
        })
        .collect();
    let refused: Vec<&(Option<i32>, String)> = ends.iter().filter(|(_, o)| o.contains("refused")).collect();
    assert_eq!(refused.len(), 1, "{ends:?}");
    assert_eq!(refused[0].0, Some(1));
    assert!(refused[0].1.contains("the run has all the 2 processes it needs"), "{ends:?}");
    assert_eq!(ends.iter().filter(|(c, _)| *c == Some(0)).count(), 2, "{ends:?}");
}

/// A socket path that exists is neither taken over nor removed.
#[test]
fn a_socket_path_that_exists_is_left_alone() {
    let (_exists, socket) = socket_path("exists");
    std::fs::write(&socket, b"someone's").unwrap();
    let out: Output = Command::new(bin()).args(["--serve", &socket]).env(SIMULATE, "ok").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("the path exists"), "{}", text(&out));
    assert_eq!(std::fs::read(&socket).unwrap(), b"someone's");

    // A killed server's socket is removed by its guardian (tests/guardian.rs); one that a server killed with
    // its guardian left, that nothing listens on, is taken over; a live one is not.
    let (_stale, socket) = socket_path("stale");
    let killed = serve("ok", &socket, &["--procs-per-device", "2"]);
    let pid = killed.child.id();
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let _ = killed.end(LIMIT);
    // Killed at once, maybe before its guardian looked at who started it: the guardian still cleans up.
    common::assert_nothing_left(pid, &[], "a server killed as it starts");
    let _ = std::fs::remove_file(&socket);
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let live = serve("ok", &socket, &[]);
    // (Said on standard error, which comes in on a thread of its own: it may come after the serving line.)
    assert!(live.wait_for("removed the stale socket", Duration::from_secs(5)), "{}", live.text());
    let out: Output = Command::new(bin()).args(["--serve", &socket]).env(SIMULATE, "ok").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "a live server's socket is not taken: {}", text(&out));
    let joiner = join("ok", &socket, None);
    assert_eq!(live.end(LIMIT).0, Some(0));
    assert_eq!(joiner.end(LIMIT).0, Some(0));
}

/// A joiner that never comes: the watchdog ends the run and names the process that never joined.
#[test]
fn a_joiner_that_never_comes_is_named_by_the_watchdog() {
    let (_dir, socket) = socket_path("never");
    let server = serve("ok", &socket, &["--procs-per-device", "2", "--timeout", "2"]);
    let joiner = join("ok", &socket, None);
    let (code, out, took) = server.end(LIMIT);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("1 of the 2 joiners never joined.") && out.contains("process 1 never joined"),
        "{out}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    let (code, out, _) = joiner.end(Duration::from_secs(3));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("the run failed: ") && out.contains("1 of the 2 joiners never joined"),
        "says why: {out}"
    );
}

/// Devices are matched by UUID: a joiner that does not see the GPU it is given says which one it lacks.
#[test]
fn a_joiner_without_its_gpu_says_which_uuid_it_lacks() {
    let (_dir, socket) = socket_path("no-gpu");
    let server = serve("ok,ok", &socket, &[]);
    assert!(server.text().contains("waiting for 2 processes to join (--join "), "{}", server.text());
    assert!(server.text().contains("for GPU 0 (GPU-53494d55-4c41-5445-4447-505500000000) x1 and GPU 1 ("));
    // The joiners see one GPU: device 0's. Whoever gets process 1 lacks device 1's.
    let joiners = [join("ok", &socket, None), join("ok", &socket, None)];
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(code, Some(1), "{out}");
    let outs: Vec<String> = joiners.into_iter().map(|j| j.end(LIMIT).1).collect();
    assert!(
        outs.iter()
            .any(|o| o.contains("is given the GPU GPU-") && o.contains("which this process does not see")),
        "{outs:?}"
    );
    // A joiner that sees no GPU at all (a container given none): the same, with what gives it the GPU, as
    // the cause and fix of the server's document.
    let (dir, socket) = socket_path("no-gpu-at-all");
    let json = dir.path().join("run.json");
    let server = serve("ok", &socket, &["--json", &json.display().to_string()]);
    let out = Command::new(bin())
        .args(["--join", &socket])
        .env(SIMULATE, "ok")
        .env("CUDA_VISIBLE_DEVICES", "")
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (code, said, _) = server.end(LIMIT);
    assert_eq!((code, out.status.code()), (Some(1), Some(1)), "{said} {}", text(&out));
    assert!(text(&out).contains("which this process does not see (the CUDA driver has no GPU to offer"));
    let doc = common::document(&json);
    let (cause, fix) = (doc["cause"].as_str().unwrap_or(""), doc["fix"].as_str().unwrap_or(""));
    assert!(
        cause.starts_with("process 0 is given the GPU GPU-") && cause.contains("CUDA_VISIBLE_DEVICES=\"\""),
        "{doc}"
    );
    assert!(
        fix.contains("Docker --gpus device=GPU-") && fix.contains("Kubernetes: both pods need that GPU"),
        "{doc}"
    );
}

/// Joiners in PID namespaces of their own (both pid 1, as two containers' first processes are), with the
/// mechanism that crosses them (vmm: descriptors over the socket) and with memops: the run passes. Needs root
/// and unshare(1); elsewhere it says it was skipped.
#[test]
fn joiners_in_pid_namespaces_of_their_own_take_part() {
    let works = Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "true"]).status();
    if !works.is_ok_and(|s| s.success()) {
        common::skipped(
            "namespaces",
            "joiners_in_pid_namespaces_of_their_own_take_part: no PID namespaces here",
        );
        return;
    }
    for sync in ["events", "memops"] {
        let (_dir, socket) = socket_path(&format!("ns-{sync}"));
        let server = serve("ok", &socket, &["--procs-per-device", "2", "--ipc", "vmm", "--sync", sync]);
        let joiners: Vec<Child> = (0..2)
            .map(|_| {
                Command::new("unshare")
                    .args(["--pid", "--fork", "--mount-proc"])
                    .arg(bin())
                    .args(["--join", &socket])
                    .env(SIMULATE, "ok")
                    .env_remove(FAULT)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let (code, out, _) = server.end(LIMIT);
        assert_eq!(code, Some(0), "{sync}: {out}");
        for joiner in joiners {
            let out = joiner.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(0), "{sync}: {}", text(&out));
            assert!(text(&out).contains("complete!"), "{}", text(&out));
        }
    }
}

/// `prefix` (a command that makes namespaces) then `simple-ipc ARGS`, with its output.
fn in_namespaces(prefix: &[&str], args: &[&str]) -> Child {
    Command::new(prefix[0])
        .args(&prefix[1..])
        .arg(bin())
        .args(args)
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The failures across containers are named from evidence, with the sharing that fixes them: a server
/// and a joiner that are both pid 1 (legacy handles: the same pid number), and a joiner with a /dev/shm of
/// its own (legacy events: the driver's file is not there); with --sync memops the latter passes.
#[test]
fn failures_across_namespaces_name_their_cause_and_fix() {
    let pid_ns = ["unshare", "--pid", "--fork", "--mount-proc"];
    if !Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--mount", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        common::skipped(
            "namespaces",
            "failures_across_namespaces_name_their_cause_and_fix: no namespaces here",
        );
        return;
    }
    // Both pid 1: the driver takes the handle for one of its own.
    let (_dir, socket) = socket_path("same-pid");
    let server = in_namespaces(&pid_ns, &["--serve", &socket, "--ipc", "legacy", "--timeout", "10"]);
    let start = Instant::now();
    while !std::path::Path::new(&socket).exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let joiner = in_namespaces(&pid_ns, &["--join", &socket]).wait_with_output().unwrap();
    let all = text(&joiner);
    assert_eq!(joiner.status.code(), Some(1), "{all}");
    assert!(all.contains("both pid 1") && all.contains("--pid=container"), "{all}");
    assert!(!all.contains("--ipc=host"), "no blanket advice: {all}");
    let server = server.wait_with_output().unwrap();
    assert_eq!(server.status.code(), Some(1), "{}", text(&server));

    // A /dev/shm of the joiner's own: the events' files are not there; memops needs none.
    let own_shm = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t tmpfs none /dev/shm && exec \"$0\" \"$@\"",
    ];
    for (sync, passes) in [("events", false), ("memops", true)] {
        let (_dir, socket) = socket_path(&format!("own-shm-{sync}"));
        let server = serve("ok", &socket, &["--ipc", "vmm", "--sync", sync, "--timeout", "10"]);
        let joiner = in_namespaces(&own_shm, &["--join", &socket]).wait_with_output().unwrap();
        let all = text(&joiner);
        let (code, out, _) = server.end(LIMIT);
        if passes {
            assert_eq!(joiner.status.code(), Some(0), "{all}");
            assert_eq!(code, Some(0), "{out}");
        } else {
            assert_eq!(joiner.status.code(), Some(1), "{all}");
            assert!(
                all.contains("CUDA_ERROR_MAP_FAILED") && all.contains("this process has another"),
                "{all}"
            );
            assert!(all.contains("--ipc=container") && all.contains("--sync memops"), "{all}");
            assert_eq!(code, Some(1), "{out}");
        }
    }
}

/// Who may join: a process of another user (here `nobody`) is refused with the reason; and a socket in a
/// directory that user cannot enter is said to be out of its reach. Needs root (to run as `nobody`).
#[test]
fn a_joiner_of_another_user_is_refused_and_an_unreachable_socket_said_so() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        common::skipped("root", "a_joiner_of_another_user_is_refused: not root");
        return;
    }
    // `nobody` runs a copy of the binary in a directory it can enter (the build's may be under /root).
    let copy_dir = common::scratch("nobody");
    std::fs::set_permissions(copy_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = copy_dir.path().join("simple-ipc");
    std::fs::copy(bin(), &copy).unwrap();
    let reachable = Command::new(&copy).arg("--version").uid(65534).gid(65534).output();
    if !reachable.is_ok_and(|o| o.status.success()) {
        common::skipped(
            "nobody",
            format!("a_joiner_of_another_user_is_refused: nobody cannot run {} here", copy.display()),
        );
        return;
    }
    let as_nobody = |socket: &str| {
        let mut command = Command::new(&copy);
        command.args(["--join", socket]).env(SIMULATE, "ok").env_remove(FAULT).uid(65534).gid(65534);
        command.output().unwrap()
    };
    let (dir, socket) = socket_path("other-user");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = serve("ok", &socket, &["--timeout", "3"]);
    // The socket file is root's, mode 0755 after umask at most: make it reachable, as a shared volume is.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = as_nobody(&socket);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("refused") && text(&out).contains("uid 65534"), "{}", text(&out));
    let joiner = join("ok", &socket, None);
    assert_eq!(server.end(LIMIT).0, Some(0), "the refused one took no place");
    assert_eq!(joiner.end(LIMIT).0, Some(0));

    let (dir, socket) = socket_path("unreachable");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let server = serve("ok", &socket, &["--timeout", "2"]);
    let out = as_nobody(&socket);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("cannot reach the socket"), "{}", text(&out));
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(code, Some(1), "nobody joined: the watchdog says so: {out}");
    assert!(out.contains("process 0 never joined"), "{out}");
}

/// A raw connection to the run's socket, as a stray or hostile client makes one.
fn raw_connect(socket: &str) -> std::os::fd::OwnedFd {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket as make};
    let fd = make(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).unwrap();
    let address = match socket.strip_prefix('@') {
        Some(name) => UnixAddr::new_abstract(name.as_bytes()).unwrap(),
        None => UnixAddr::new(socket).unwrap(),
    };
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &address).unwrap();
    fd
}

/// Asks to join as a joiner does (the bare hello, no place), and reads the server's answer (the admission).
fn ask_and_hear_the_answer(fd: &std::os::fd::OwnedFd) {
    send_raw(fd, b"SIPCHELO");
    let mut answer = [0u8; 64];
    let _ = nix::sys::socket::recv(
        std::os::fd::AsRawFd::as_raw_fd(fd),
        &mut answer,
        nix::sys::socket::MsgFlags::empty(),
    );
}

fn send_raw(fd: &std::os::fd::OwnedFd, bytes: &[u8]) {
    let _ = nix::sys::socket::send(
        std::os::fd::AsRawFd::as_raw_fd(fd),
        bytes,
        nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
    );
}

/// Garbage, a hello that leaves at once, and a crowd of silent connections take no place and do not hold
/// the server up: the real joiner is admitted and the run passes, well within its watchdog.
#[test]
fn stray_and_hostile_connections_take_no_place() {
    let socket = format!("@simple-ipc-test-stray-{}", std::process::id());
    let server = serve("ok", &socket, &["--timeout", "10"]);
    let garbage = raw_connect(&socket);
    send_raw(&garbage, b"hello world!");
    let hello_and_gone = raw_connect(&socket);
    send_raw(&hello_and_gone, b"SIPCHELO");
    drop(hello_and_gone);
    let silent: Vec<_> = (0..40).map(|_| raw_connect(&socket)).collect();
    let start = Instant::now();
    let joiner = join("ok", &socket, None);
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(code, Some(0), "{out}");
    assert!(start.elapsed() < Duration::from_secs(5), "the door held the run up: {:?}", start.elapsed());
    assert_eq!(joiner.end(LIMIT).0, Some(0));
    drop((garbage, silent));
}

/// A joiner's word that it ended well is not enough: one that never finished its part fails the run,
/// named, instead of a PASSED that verified nothing.
#[test]
fn a_joiner_that_says_it_ended_well_without_finishing_fails_the_run() {
    let socket = format!("@simple-ipc-test-liar-{}", std::process::id());
    let server = serve("ok", &socket, &["--timeout", "10"]);
    let liar = raw_connect(&socket);
    ask_and_hear_the_answer(&liar);
    send_raw(&liar, b"SIPCDONE\0");
    drop(liar);
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("Process 0 failed! (it said it ended well, but never finished its part)"), "{out}");
    assert!(!out.contains("PASSED"), "{out}");
}

/// A stopped (or frozen) server keeps its connection open: a joiner's own watchdog stops it.
#[test]
fn a_joiner_stops_by_its_own_watchdog_when_the_server_is_frozen() {
    let (_dir, socket) = socket_path("frozen");
    let mut server = serve("ok", &socket, &["--procs-per-device", "2"]);
    let joiner = Running::start("ok", &["--join", &socket, "--timeout", "2"], None);
    assert!(joiner.wait_for("Starting on device", Duration::from_secs(10)), "{}", joiner.text());
    let pid = Pid::from_raw(server.child.id() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let (code, out, took) = joiner.end(Duration::from_secs(6));
    kill(pid, Signal::SIGKILL).unwrap();
    let _ = kill(pid, Signal::SIGCONT);
    server.child.wait().unwrap();
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("--timeout of this joiner"), "{out}");
    assert!(took < Duration::from_secs(4), "{took:?}");
}

/// The server's verdict rests on its own check of every buffer: a joiner that did nothing and says it
/// finished and ended well (the `lie` fault: it writes "finished" into the segment it holds mapped, as a
/// hostile client of the same uid can) fails the run, alone or taking every place; an honest run says that
/// the server checked too.
#[test]
fn a_joiner_that_lies_cannot_pass_the_run() {
    for (gpus, procs, liars) in [("ok", "1", 1), ("ok", "2", 2)] {
        let (_dir, socket) = socket_path("liar");
        let server = serve(gpus, &socket, &["--procs-per-device", procs, "--timeout", "10"]);
        // One at a time, so that each has the index its fault names.
        let joiners: Vec<Running> = (0..liars)
            .map(|i| {
                let joiner = join(gpus, &socket, Some(&format!("child{i}@round-robin:lie")));
                assert!(server.wait_for(&format!("Process {i} joined"), LIMIT), "{}", server.text());
                joiner
            })
            .collect();
        let (code, out, _) = server.end(LIMIT);
        for joiner in joiners {
            joiner.end(LIMIT);
        }
        assert_eq!(code, Some(1), "{liars} lying joiner(s) must fail the run: {out}");
        assert!(
            out.contains("the parent's own check of every buffer failed")
                && out.contains("the buffer of process 0 has")
                && out.contains("(the byte it held before the run: unwritten)")
                && !out.contains("PASSED"),
            "the server names the buffers it found unwritten: {out}"
        );
    }
    // The server's own check is a real comparison: a buffer it finds changed fails the run, though every
    // joiner passed its own check.
    let (_dir, socket) = socket_path("corrupt");
    let mut args = vec!["--serve", socket.as_str()];
    let server = Running::start("ok", &args, Some("parent@verify:corrupt"));
    assert!(server.wait_for("waiting for", LIMIT), "{}", server.text());
    let joiner = join("ok", &socket, None);
    let (code, out, _) = server.end(LIMIT);
    let (joined, said, _) = joiner.end(LIMIT);
    assert!(said.contains("Process 0 complete!"), "the joiner's own check passes: {said}");
    assert_eq!(joined, Some(1), "but the run's verdict is its own: {said}");
    assert!(said.contains("the parent's own check of every buffer failed"), "{said}");
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("the parent's own check of every buffer failed: the buffer of process 0 has 2 of "),
        "{out}"
    );
    args.clear();
    let (_dir, socket) = socket_path("honest");
    let server = serve("ok", &socket, &["--procs-per-device", "2"]);
    let joiners: Vec<Running> = (0..2).map(|_| join("ok", &socket, None)).collect();
    let (code, out, _) = server.end(LIMIT);
    for joiner in joiners {
        assert_eq!(joiner.end(LIMIT).0, Some(0));
    }
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("every buffer holds the round-robin's result, checked by the server in "), "{out}");
}

/// A fake server in Python (`/usr/bin/python3`, which `nobody` can run), as user `uid` (`None`: the test's
/// own): it listens at the abstract `@name`, answers the first process that asks to join with `reply` (the
/// message's tag, its fields and a text), and is killed when the guard drops.
struct FakeServer(Child);

impl FakeServer {
    fn start(name: &str, uid: Option<u32>, reply: &[u8]) -> Option<Self> {
        use std::os::unix::process::CommandExt;
        const SCRIPT: &str = "import socket, sys, time\n\
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
            s.bind('\\0' + sys.argv[1])\n\
            s.listen(4)\n\
            print('listening', flush=True)\n\
            s.settimeout(20)\n\
            c, _ = s.accept()\n\
            try:\n    c.recv(64)\n    c.send(bytes.fromhex(sys.argv[2]))\n    time.sleep(3)\n\
            except OSError:\n    pass\n";
        let python = std::path::Path::new("/usr/bin/python3");
        if !python.exists() {
            return None;
        }
        let hex: String = reply.iter().map(|b| format!("{b:02x}")).collect();
        let mut command = Command::new(python);
        command.args(["-I", "-c", SCRIPT, name, &hex]).stdin(Stdio::null()).stdout(Stdio::piped());
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        let mut fake = Self(command.spawn().ok()?);
        let listening = common::wait_for_lines(&mut fake.0, "listening", 1, Duration::from_secs(10));
        (listening == 1).then_some(fake)
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the top parent of a sequence of one waived run says at its end, as `say_sequence_ended` writes it.
fn waived_1_of_1(why: &[u8]) -> Vec<u8> {
    [b"SIPCLASTw".as_slice(), why, b"\0"].concat()
}

/// A server of another user cannot make a joiner pass: `nobody` listening at the name first and answering
/// "run 1/1 was waived" (which a joiner once took for a sequence it had taken part in, PASSED) is refused at
/// once, named by its uid and pid. Needs root (to run as `nobody`).
#[test]
fn a_joiner_refuses_a_server_of_another_user() {
    if !nix::unistd::geteuid().is_root() {
        common::skipped("root", "a_joiner_refuses_a_server_of_another_user: not root");
        return;
    }
    let name = format!("simple-ipc-test-impostor-{}", std::process::id());
    let Some(fake) = FakeServer::start(&name, Some(65534), &waived_1_of_1(b"nothing to run here")) else {
        common::skipped(
            "python3",
            "a_joiner_refuses_a_server_of_another_user: no python3 that nobody can run",
        );
        return;
    };
    let (code, out, _) = join("ok", &format!("@{name}"), None).end(LIMIT);
    assert_eq!(code, Some(1), "{out}");
    assert!(!out.contains("PASSED") && !out.contains("was waived"), "{out}");
    assert!(out.contains("uid 65534") && out.contains(&format!("pid {}", fake.0.id())), "{out}");
}

/// Text a server sends (a refusal, a waiver) reaches the joiner's terminal with its control characters
/// escaped: no forged green PASSED line, no window title.
#[test]
fn a_servers_text_reaches_the_joiners_terminal_escaped() {
    let evil: &[u8] = b"\x1b[2K\r\x1b[32mPASSED\x1b[0m\x1b]0;pwned\x07";
    let refusal = [b"SIPCFULL".as_slice(), evil].concat();
    for (i, reply) in [refusal, waived_1_of_1(evil)].into_iter().enumerate() {
        let name = format!("simple-ipc-test-escapes-{}-{i}", std::process::id());
        let Some(_fake) = FakeServer::start(&name, None, &reply) else {
            common::skipped("python3", "a_servers_text_reaches_the_joiners_terminal_escaped: no python3");
            return;
        };
        let (_, out, _) = join("ok", &format!("@{name}"), None).end(LIMIT);
        assert!(out.contains("\\u{1b}[32mPASSED\\u{1b}[0m\\u{1b}]0;pwned\\u{7}"), "{i}: {out:?}");
        assert!(!out.contains('\x1b') && !out.contains('\x07') && !out.contains('\r'), "{i}: {out:?}");
    }
}

/// A joiner's reason for its failure reaches the server's verdict with its control characters escaped.
#[test]
fn a_joiners_reason_reaches_the_servers_verdict_escaped() {
    let socket = format!("@simple-ipc-test-escaped-reason-{}", std::process::id());
    let server = serve("ok", &socket, &["--timeout", "10"]);
    let joiner = raw_connect(&socket);
    ask_and_hear_the_answer(&joiner);
    send_raw(&joiner, b"SIPCDONE\x01\x1b[2K\r\x1b[32mPASSED\x1b]0;pwned\x07");
    let (code, out, _) = server.end(LIMIT);
    drop(joiner);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("Process 0 failed! (exit code 1: \\u{1b}[2K\\r\\u{1b}[32mPASSED\\u{1b}]0;pwned\\u{7})"),
        "{out:?}"
    );
    assert!(!out.contains('\x1b') && !out.contains('\x07') && !out.contains('\r'), "{out:?}");
}

/// Every joiner's verdict is the run's: with joiner 1's buffer corrupted (the fault in its environment
/// only), the server fails the run, and joiner 0, whose own part passed, fails too, naming process 1; the
/// same in a served sequence (`--ipc all`), where the run that failed is named as well.
#[test]
fn a_joiner_whose_part_passed_fails_a_run_that_failed() {
    for (name, args) in
        [("one", &["--procs-per-device", "2"][..]), ("all", &["--procs-per-device", "2", "--ipc", "all"])]
    {
        let (_dir, socket) = socket_path(&format!("verdict-{name}"));
        let server = serve("ok", &socket, args);
        let first = join("ok", &socket, None);
        assert!(server.wait_for("Process 0 joined", Duration::from_secs(10)), "{name}: {}", server.text());
        let second = join("ok", &socket, Some("child1@verify:corrupt"));
        let (code, out, _) = server.end(LIMIT);
        assert_eq!(code, Some(1), "{name}: {out}");
        assert!(out.contains("Process 1 failed!"), "{name}: {out}");
        let (code, out, _) = first.end(LIMIT);
        assert_eq!(code, Some(1), "{name}: joiner 0: {out}");
        // The verdict line (standard error's lines may come after it).
        let verdict = out.lines().find(|l| l.starts_with("FAILED (exit 1)")).unwrap_or_default();
        assert!(verdict.contains("the run failed: Process 1 failed!"), "{name}: joiner 0: {out}");
        assert!(!out.contains("PASSED"), "{name}: joiner 0: {out}");
        if name == "all" {
            assert!(verdict.contains("run 1/4: the run failed"), "{name}: joiner 0: {out}");
        }
        let (code, out, _) = second.end(LIMIT);
        assert_eq!(code, Some(1), "{name}: joiner 1: {out}");
    }
}

/// A joiner that fails once admitted, before its part proper (at the segment's checks, say), tells the
/// server why: the server's verdict gives the true reason, not "gone without saying how it ended".
#[test]
fn a_joiner_that_fails_at_attach_tells_the_server_why() {
    let socket = format!("@simple-ipc-test-attach-{}", std::process::id());
    let server = serve("ok", &socket, &["--timeout", "10"]);
    let joiner = join("ok", &socket, Some("child0@attach:error"));
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("Process 0 failed! (exit code 1: injected fault (child0@attach:error))"), "{out}");
    assert!(!out.contains("gone without saying"), "{out}");
    assert_eq!(joiner.end(LIMIT).0, Some(1));
}

/// A listener at the abstract `@name` that never accepts, its backlog filled: what a stopped (or flooded)
/// server is to a joiner. Its connections go with it.
fn full_backlog(name: &str) -> (std::os::fd::OwnedFd, Vec<std::os::fd::OwnedFd>) {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, connect, listen, socket as make,
    };
    let address = UnixAddr::new_abstract(name.as_bytes()).unwrap();
    let listener = make(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).unwrap();
    bind(std::os::fd::AsRawFd::as_raw_fd(&listener), &address).unwrap();
    listen(&listener, Backlog::new(0).unwrap()).unwrap();
    let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
    let mut queued = Vec::new();
    for _ in 0..1000 {
        let fd = make(AddressFamily::Unix, SockType::SeqPacket, flags, None).unwrap();
        match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &address) {
            Ok(()) => queued.push(fd),
            Err(nix::errno::Errno::EAGAIN) => return (listener, queued),
            Err(e) => panic!("filling the backlog: {e}"),
        }
    }
    panic!("the backlog never filled");
}

/// A joiner's `--timeout` covers connecting: to a server whose backlog is full it gives up within its
/// watchdog's time, saying so, and a stop signal while it connects stops it at once, 128+N.
#[test]
fn a_joiner_connecting_is_bounded_by_its_watchdog_and_stopped_by_a_signal() {
    let name = format!("simple-ipc-test-backlog-{}", std::process::id());
    let _full = full_backlog(&name);
    let socket = format!("@{name}");
    let joiner = Running::start("ok", &["--join", &socket, "--timeout", "2"], None);
    let (code, out, took) = joiner.end(Duration::from_secs(6));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("did not take the connection within 2 s (--timeout of this joiner)"), "{out}");
    assert!(took < Duration::from_secs(4), "{took:?}");

    let joiner = Running::start("ok", &["--join", &socket, "--timeout", "30"], None);
    std::thread::sleep(Duration::from_millis(500));
    kill(Pid::from_raw(joiner.child.id() as i32), Signal::SIGTERM).unwrap();
    let (code, out, took) = joiner.end(Duration::from_secs(5));
    assert_eq!(code, Some(143), "{out}");
    assert!(out.contains("STOPPED (exit 143)"), "{out}");
    assert!(took < Duration::from_secs(1), "{took:?}");
}

/// A joiner of a served sequence stopped by SIGTERM, SIGINT or SIGHUP exits 128+N, STOPPED, as any run.
#[test]
fn a_sequence_joiner_stopped_by_a_signal_exits_128_plus_n() {
    for (signal, code) in [(Signal::SIGTERM, 143), (Signal::SIGINT, 130), (Signal::SIGHUP, 129)] {
        let (_dir, socket) = socket_path(&format!("stopped-{signal}"));
        // Two processes per run, one joiner: it waits in the run for the other, which never comes.
        let server = serve("ok", &socket, &["--procs-per-device", "2", "--ipc", "all", "--timeout", "10"]);
        let joiner = join("ok", &socket, None);
        assert!(joiner.wait_for("Starting on device", Duration::from_secs(10)), "{}", joiner.text());
        std::thread::sleep(Duration::from_millis(200));
        kill(Pid::from_raw(joiner.child.id() as i32), signal).unwrap();
        let (got, out, _) = joiner.end(Duration::from_secs(5));
        kill(Pid::from_raw(server.child.id() as i32), Signal::SIGTERM).unwrap();
        let _ = server.end(LIMIT);
        assert_eq!(got, Some(code), "{signal}: {out}");
        assert!(out.contains(&format!("STOPPED (exit {code}): interrupted by {signal}")), "{signal}: {out}");
    }
}

/// A served sequence whose first run is waived (the GPUs have no legacy IPC) with one joiner: the joiner's
/// connection is admitted by the next run that runs, told which run was waived, and both ends finish well
/// within `--timeout` (it once reconnected ~800 times a second past the watchdog, for minutes).
#[test]
fn a_served_sequence_whose_first_run_is_waived_ends_within_its_timeout() {
    let socket = format!("@simple-ipc-test-waived-first-{}", std::process::id());
    let start = Instant::now();
    let server = serve("no-legacy-ipc", &socket, &["--ipc", "all", "--timeout", "5"]);
    let joiner = Running::start("no-legacy-ipc", &["--join", &socket, "--timeout", "5"], None);
    let (code, out, _) = server.end(Duration::from_secs(8));
    let (joined, said, _) = joiner.end(Duration::from_secs(8));
    assert!(start.elapsed() < Duration::from_secs(7), "{:?}: {out}\n{said}", start.elapsed());
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("legacy waived") && out.contains("vmm passed"), "{out}");
    assert_eq!(joined, Some(0), "{said}");
    assert_eq!(said.matches("was waived").count(), 2, "told of legacy and fabric once each: {said}");
    assert!(said.contains("run 1/4 was waived") && said.contains("run 4/4 was waived"), "{said}");
    assert_eq!(said.matches("complete!").count(), 2, "{said}");
}

/// `nobody` (python3) opening a silent connection to the abstract `@name` every millisecond, keeping the
/// last 500 open, until the guard drops.
struct Flood(Child);

impl Flood {
    fn start(name: &str) -> Option<Self> {
        use std::os::unix::process::CommandExt;
        const SCRIPT: &str = "import socket, sys, time\n\
            held = []\n\
            print('flooding', flush=True)\n\
            while True:\n    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n    s.setblocking(False)\n\
            \x20   try:\n        s.connect('\\0' + sys.argv[1])\n    except OSError:\n        pass\n\
            \x20   held.append(s)\n    if len(held) > 500:\n        held.pop(0).close()\n    time.sleep(0.001)\n";
        let python = std::path::Path::new("/usr/bin/python3");
        if !python.exists() {
            return None;
        }
        let mut command = Command::new(python);
        command.args(["-I", "-c", SCRIPT, name]).stdin(Stdio::null()).stdout(Stdio::piped());
        command.uid(65534).gid(65534);
        let mut flood = Self(command.spawn().ok()?);
        let started = common::wait_for_lines(&mut flood.0, "flooding", 1, Duration::from_secs(10));
        (started == 1).then_some(flood)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A flood of silent connections from another uid neither holds a served sequence open nor keeps its real
/// joiners out: each stranger is closed at accept. Once it held a waived run open 15-25 s past `--timeout
/// 5` and made both joiners fail ("closed the connection without an answer"). Needs root (for `nobody`).
#[test]
fn a_flood_from_another_uid_neither_holds_a_sequence_open_nor_keeps_joiners_out() {
    if !nix::unistd::geteuid().is_root() {
        common::skipped("root", "a_flood_from_another_uid_neither_holds_a_sequence_open: not root");
        return;
    }
    let name = format!("simple-ipc-test-flood-{}", std::process::id());
    let socket = format!("@{name}");
    let start = Instant::now();
    let server =
        serve("no-legacy-ipc", &socket, &["--ipc", "all", "--procs-per-device", "2", "--timeout", "5"]);
    let Some(flood) = Flood::start(&name) else {
        common::skipped(
            "python3",
            "a_flood_from_another_uid_neither_holds_a_sequence_open: no python3 for nobody",
        );
        return;
    };
    std::thread::sleep(Duration::from_millis(300));
    let joiners = [join("no-legacy-ipc", &socket, None), join("no-legacy-ipc", &socket, None)];
    let (code, out, _) = server.end(Duration::from_secs(10));
    let ends: Vec<(Option<i32>, String, Duration)> = joiners.into_iter().map(|j| j.end(LIMIT)).collect();
    drop(flood);
    assert!(start.elapsed() < Duration::from_secs(8), "{:?}: {out}\n{ends:?}", start.elapsed());
    assert_eq!(code, Some(0), "{out}");
    for (code, said, _) in ends {
        assert_eq!(code, Some(0), "{said}");
        assert_eq!(said.matches("complete!").count(), 2, "{said}");
    }
}

/// The server's `--timeout` bounds the whole served sequence, not each run: with nobody joining, it ends at
/// its watchdog, and the runs it had no time for are said to be not run.
#[test]
fn a_served_sequences_timeout_bounds_the_whole_sequence() {
    let socket = format!("@simple-ipc-test-sequence-timeout-{}", std::process::id());
    let server = serve("ok", &socket, &["--ipc", "all", "--timeout", "2"]);
    let (code, out, took) = server.end(LIMIT);
    assert_eq!(code, Some(1), "{out}");
    assert!(took < Duration::from_secs(4), "{took:?}: {out}");
    assert!(out.contains("not run: the sequence did not finish within 2 s (--timeout)"), "{out}");
}

/// Before anything runs, the server says where each joiner stands against it, made of namespaces by
/// `unshare` (not by `--isolate`): a joiner in the server's namespaces shares everything; one with a PID,
/// UTS and mount namespace of its own is said to differ in each (with its hostname), and the forecast says
/// what follows (NCCL's P2P falls back, PyTorch's expandable segments cannot fetch the descriptor), with
/// the least change; the `--json` document carries the same as data.
#[test]
fn the_server_says_what_each_joiner_shares_with_it_and_forecasts_each_path() {
    let prefix = ["unshare", "--pid", "--fork", "--mount-proc", "--uts"];
    if !Command::new("unshare").args(&prefix[1..]).arg("true").status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "the_server_says_what_each_joiner_shares_with_it: no namespaces here");
        return;
    }
    let (dir, socket) = socket_path("placement");
    let json = dir.path().join("run.json");
    let json_arg = json.display().to_string();
    let args = ["--procs-per-device", "2", "--ipc", "vmm", "--sync", "memops", "--json", &json_arg];
    let server = serve("ok", &socket, &args);
    let server_pid = server.child.id();
    let near = join("ok", &socket, None);
    assert!(server.wait_for("Process 0 joined", LIMIT), "{}", server.text());
    let script = format!("hostname far-away && exec {} --join {socket}", bin().display());
    let far = Command::new("unshare")
        .args(&prefix[1..])
        .args(["sh", "-c", &script])
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(near.end(LIMIT).0, Some(0));
    assert_eq!(far.wait_with_output().unwrap().status.code(), Some(0));
    assert_eq!(code, Some(0), "{out}");
    let table: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("Where the processes stand")).collect();
    assert!(table.len() > 12, "the table comes before the run: {out}");
    let row = |name: &str| table.iter().find(|l| l.starts_with(name)).copied().unwrap_or_default();
    assert!(row("PID namespace").contains("same") && row("PID namespace").contains("differs: pid "), "{out}");
    assert!(row("hostname (UTS)").ends_with("and far-away"), "{out}");
    assert!(
        row("mount namespace").contains("differs") && row("/dev/shm").matches("same").count() == 2,
        "{out}"
    );
    assert!(
        out.contains("Forecast for process 0 (docs/placement.md says why; the libraries as of NCCL 2.30.7, UCX 1.22.0 (and master 9466d104a3), PyTorch 2.11):\n  legacy memory: works;"),
        "{out}"
    );
    assert!(out.contains("NCCL P2P: falls back to NCCL's NET transport"), "{out}");
    assert!(
        out.contains("PyTorch expandable_segments: fails (its VMM fd by pidfd_getfd: ESRCH, forecast)"),
        "{out}"
    );
    assert!(out.contains("what fixes it: Docker --uts=container:NAME"), "{out}");
    let doc = common::document(&json);
    let processes = doc["placement"]["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 2, "{doc}");
    let far = processes.iter().find(|p| p["place"]["hostname"] == "far-away").unwrap();
    assert_eq!(far["shares"][0]["fact"], "pid_namespace");
    assert_eq!(far["shares"][0]["same"], "differs");
    assert_eq!(far["place"]["pid"], 1, "{far}");
    let nccl = far["libraries"].as_array().unwrap().iter().find(|f| f["path"] == "NCCL P2P").unwrap();
    assert_eq!(nccl["verdict"], "falls_back", "{nccl}");
    assert_eq!(doc["placement"]["server"]["pid"].as_u64(), Some(u64::from(server_pid)));
}

/// After the run, the server sets the forecast of each path beside what happened: a server and a joiner
/// that are both pid 1 in PID namespaces of their own (made by `unshare`), with legacy memory and memops:
/// the forecast said the driver refuses the handle (`CUDA_ERROR_INVALID_CONTEXT`), the joiner says (over
/// the socket, as typed facts) that it did, and the two agree, in the output and the document.
#[test]
fn the_forecast_stands_beside_the_outcome() {
    let pid_ns = ["unshare", "--pid", "--fork", "--mount-proc"];
    if !Command::new("unshare").args(&pid_ns[1..]).arg("true").status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "the_forecast_stands_beside_the_outcome: no PID namespaces here");
        return;
    }
    let (dir, socket) = socket_path("against");
    let json = dir.path().join("run.json");
    let json_arg = json.display().to_string();
    let server = in_namespaces(&pid_ns, &["--serve", &socket, "--sync", "memops", "--json", &json_arg]);
    let start = Instant::now();
    while !std::path::Path::new(&socket).exists() && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let joiner = in_namespaces(&pid_ns, &["--join", &socket]);
    let (server, joiner) = (server.wait_with_output().unwrap(), joiner.wait_with_output().unwrap());
    let said = text(&server);
    assert_eq!((server.status.code(), joiner.status.code()), (Some(1), Some(1)), "{said}");
    let invalid = "legacy memory: forecast fails (CUDA_ERROR_INVALID_CONTEXT), the driver refused it \
                   (CUDA_ERROR_INVALID_CONTEXT)\n";
    assert!(said.contains(&format!("Forecast against outcome:\n  {invalid}")), "{said}");
    assert!(!said.contains("THE FORECAST WAS WRONG"), "{said}");
    let doc = common::document(&json);
    let against = &doc["placement"]["against"][0];
    assert_eq!((against["path"].as_str(), against["agrees"].as_bool()), (Some("legacy memory"), Some(true)));
    assert_eq!(doc["refused"]["error"], "CUDA_ERROR_INVALID_CONTEXT", "the joiner's refusal, typed: {doc}");
}

/// Containers of a pod start together: a joiner started before its server waits for the socket to appear
/// and accept, says once that it waits and for what, and takes part once the server comes; one whose
/// server never comes fails within its --timeout naming the address and how long it waited (for an
/// abstract socket, that only the server's network namespace reaches it); a path that is no socket is
/// refused at once.
#[test]
fn a_joiner_started_before_its_server_waits_for_it() {
    let (_dir, socket) = socket_path("early");
    let joiner = join("ok", &socket, None);
    assert!(joiner.wait_for("Waiting for the server at", LIMIT), "{}", joiner.text());
    std::thread::sleep(Duration::from_millis(300));
    let server = serve("ok", &socket, &[]);
    let (code, out, _) = server.end(LIMIT);
    let (joined, said, _) = joiner.end(LIMIT);
    assert_eq!((code, joined), (Some(0), Some(0)), "{out}\n{said}");
    assert_eq!(said.matches("Waiting for the server at").count(), 1, "said once: {said}");

    let name = format!("@simple-ipc-test-nobody-serves-{}", std::process::id());
    let start = Instant::now();
    let (code, said, _) = Running::start("ok", &["--join", &name, "--timeout", "1"], None).end(LIMIT);
    assert_eq!(code, Some(1), "{said}");
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert!(said.contains(&format!("--join {name}: no server came within 1 s (--timeout)")), "{said}");
    assert!(said.contains("reachable only from the server's own network namespace"), "{said}");

    let dir = common::scratch("serve-not-a-socket");
    let file = dir.path().join("plain");
    std::fs::write(&file, b"").unwrap();
    let start = Instant::now();
    let (code, said, _) = join("ok", &file.display().to_string(), None).end(LIMIT);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("that path is no socket") && start.elapsed() < Duration::from_secs(2), "{said}");

    // A joiner begins cuInit on a thread as it starts; refused at once, it still waits for that thread
    // before it exits (a process must not exit while a thread is inside the driver): the simulation's slow
    // cuInit says it ended.
    let (code, said, _) = join("ok+slow-init", &file.display().to_string(), None).end(LIMIT);
    assert_eq!(code, Some(1), "{said}");
    let (ended, refused) = (said.find("ended cuInit (slow-init)"), said.find("that path is no socket"));
    assert!(ended.is_some() && refused.is_some(), "{said}");
}

/// `--fds pidfd` in a served run: a joiner in the server's namespaces fetches every descriptor with
/// pidfd_getfd and passes; one in a PID namespace of its own cannot see the server's pid (ESRCH, named with
/// the fix); one that is root without CAP_SYS_PTRACE (setpriv) is refused ptrace (EPERM, named with what it
/// lacks). Needs root, unshare and setpriv.
#[test]
fn descriptors_by_pidfd_getfd_pass_where_visible_and_name_each_refusal() {
    let pid_ns = ["unshare", "--pid", "--fork", "--mount-proc"];
    if !Command::new("unshare").args(&pid_ns[1..]).arg("true").status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "descriptors_by_pidfd_getfd: no PID namespaces here");
        return;
    }
    let no_ptrace = ["setpriv", "--inh-caps", "-all", "--bounding-set", "-sys_ptrace"];
    let cases: [(&str, &[&str], &[&str]); 3] = [
        ("same", &["env"], &[]),
        (
            "pid-ns",
            &pid_ns,
            &[
                "ESRCH",
                "not visible from here",
                "--pid=container:NAME",
                "shareProcessNamespace: true",
                "--fds socket",
            ],
        ),
        (
            "no-ptrace",
            &no_ptrace,
            &[
                "pidfd_getfd: Operation not permitted (EPERM)",
                "lacks CAP_SYS_PTRACE",
                "holds capabilities this process lacks",
                "--cap-add SYS_PTRACE",
                "capabilities.add: [SYS_PTRACE]",
                "--fds socket",
            ],
        ),
    ];
    for (name, prefix, words) in cases {
        let (dir, socket) = socket_path(&format!("pidfd-{name}"));
        let json = dir.path().join("run.json").display().to_string();
        let server =
            serve("ok", &socket, &["--ipc", "vmm", "--fds", "pidfd", "--timeout", "10", "--json", &json]);
        let joiner = in_namespaces(prefix, &["--join", &socket]).wait_with_output().unwrap();
        let all = text(&joiner);
        let (code, out, _) = server.end(LIMIT);
        let doc = common::document(std::path::Path::new(&json));
        if words.is_empty() {
            assert_eq!((joiner.status.code(), code), (Some(0), Some(0)), "{name}: {all}\n{out}");
            assert!(out.contains("vmm IPC (descriptors by pidfd_getfd)"), "{out}");
            assert!(doc["refused"].is_null(), "{doc}");
            assert!(out.contains("VMM fd by pidfd_getfd: forecast works, it worked"), "{out}");
            continue;
        }
        assert_eq!((joiner.status.code(), code), (Some(1), Some(1)), "{name}: {all}\n{out}");
        for word in words {
            assert!(all.contains(word) && out.contains(word), "{name}: {word}: {all}\n{out}");
        }
        // The joiner's refusal crossed the wire typed: the server's document names the kernel's errno and why.
        let (errno, why) = if name == "pid-ns" { ("ESRCH", "not_visible") } else { ("EPERM", "ptrace") };
        let refused = &doc["refused"];
        assert_eq!(
            (refused["error"].as_str(), refused["pidfd"]["why"].as_str()),
            (Some(errno), Some(why)),
            "{doc}"
        );
        if name == "no-ptrace" {
            let obstacles = refused["pidfd"]["obstacles"].as_array().expect("which of ptrace's conditions");
            let said: Vec<&str> = obstacles.iter().filter_map(|o| o["obstacle"].as_str()).collect();
            assert!(said.contains(&"more_capabilities") && said.contains(&"no_cap_sys_ptrace"), "{doc}");
        }
        assert!(refused["fix"].as_str().is_some_and(|f| f.contains("--fds socket")), "{doc}");
        // The server forecast it from where the joiner stands, and holds the forecast against it.
        let held =
            format!("VMM fd by pidfd_getfd: forecast fails ({errno}), the kernel refused it ({errno})");
        assert!(out.contains(&held), "{name}: {out}");
        let against = &doc["placement"]["against"][0];
        assert_eq!(
            (against["outcome"].as_str(), against["agrees"].as_bool()),
            (Some("kernel_refused"), Some(true))
        );
    }
}

/// A kernel without pidfd_getfd (the simulation's `no-pidfd`, as Linux 5.3 to 5.5): `--fds pidfd` is asked
/// by trial and waived (exit 2) with the reason and what needs no such call, in the verdict and the
/// document; `--fds socket` runs there. A served run waives so as its server; a served sequence waives vmm
/// and pool with that reason, tells its joiner, and passes legacy.
#[test]
fn a_kernel_without_pidfd_getfd_waives_fds_pidfd_with_the_reason() {
    let reason = "cannot run here with --fds pidfd: this kernel has no pidfd_getfd (simulated: no-pidfd) \
                  (ENOSYS: pidfd_getfd needs Linux 5.6 or later); --fds socket needs no such call";
    let dir = common::scratch("serve-no-pidfd");
    let json = dir.path().join("run.json");
    let out = common::run(
        common::simulated("ok,ok+no-pidfd").args(["--ipc", "vmm", "--fds", "pidfd", "--json"]).arg(&json),
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!("WAIVED (exit 2, not a failure: nothing here to test): --ipc vmm {reason}")),
        "{said}"
    );
    let doc = common::document(&json);
    assert_eq!(doc["status"], "waived", "{doc}");
    assert!(doc["reason"].as_str().is_some_and(|r| r.contains(reason)), "{doc}");
    let socket = common::run(common::simulated("ok,ok+no-pidfd").args(["--ipc", "pool", "--fds", "socket"]));
    assert_eq!(socket.status.code(), Some(0), "--fds socket needs no such call: {}", text(&socket));

    let (_dir, one) = socket_path("no-pidfd-one");
    let args = ["--serve", one.as_str(), "--ipc", "pool", "--fds", "pidfd"];
    let (code, out, _) = Running::start("ok+no-pidfd", &args, None).end(LIMIT);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains(&format!("--ipc pool {reason}")), "{out}");

    let (_dir, all) = socket_path("no-pidfd-all");
    let server = serve("ok+no-pidfd", &all, &["--ipc", "all", "--fds", "pidfd"]);
    let (joined, heard, _) = join("ok+no-pidfd", &all, None).end(LIMIT);
    let (code, out, _) = server.end(LIMIT);
    assert_eq!((code, joined), (Some(0), Some(0)), "{out}\n{heard}");
    for (run, ipc) in [("2/4", "vmm"), ("3/4", "pool")] {
        let told = format!("The server's run {run} was waived: --ipc {ipc} {reason}");
        assert!(heard.contains(&told), "the joiner is told: {told}: {heard}");
        assert!(out.contains(&format!("waived: --ipc {ipc} {reason}")), "{out}");
    }
    assert!(out.contains("legacy passed, vmm waived, pool waived"), "{out}");
}

/// The top parent of a served sequence, killed (SIGKILL) or stopped by a signal (SIGTERM) while it serves,
/// leaves no socket file: its guardian removes it, or it does itself.
#[test]
fn a_served_sequence_killed_or_stopped_leaves_no_socket() {
    for signal in [Signal::SIGKILL, Signal::SIGTERM] {
        let (_dir, socket) = socket_path(&format!("seq-{signal:?}"));
        let top = serve("ok", &socket, &["--ipc", "all", "--timeout", "20"]);
        assert!(std::path::Path::new(&socket).exists(), "{}", top.text());
        kill(Pid::from_raw(top.child.id() as i32), signal).unwrap();
        let (code, out, _) = top.end(LIMIT);
        assert!(code != Some(0), "{signal:?}: {out}");
        let start = Instant::now();
        while std::path::Path::new(&socket).exists() && start.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!std::path::Path::new(&socket).exists(), "{signal:?}: the socket file was left: {out}");
    }
}

/// `--serve --ipc all` runs every mechanism after the forecast, and its table says beside each result
/// whether it went as forecast (each run's document carries its forecast against its outcome).
#[test]
fn a_served_sequence_shows_forecast_beside_outcome() {
    let (dir, socket) = socket_path("seq-forecast");
    let json = dir.path().join("all.json");
    let server = serve("ok", &socket, &["--ipc", "all", "--json", &json.display().to_string()]);
    let joiner = join("ok", &socket, None);
    let (code, out, _) = server.end(LIMIT);
    assert_eq!((code, joiner.end(LIMIT).0), (Some(0), Some(0)), "{out}");
    for mechanism in ["legacy", "vmm", "pool"] {
        let row = out.lines().find(|l| l.starts_with(mechanism) && l.contains("passed")).unwrap_or_default();
        assert!(row.ends_with("passed (as forecast)"), "{mechanism}: {out}");
    }
    let doc = common::document(&json);
    let legacy = &doc["mechanisms"][0]["document"]["placement"]["against"];
    assert_eq!(legacy[0]["path"], "legacy memory", "{doc}");
    assert_eq!(legacy[0]["agrees"], true, "{doc}");
}

/// Fabric handles where the simulated processes have an IMEX channel (`imex`): the place each reads says
/// so too, so that the forecast and the simulated driver rest on one fact: "not known" (nobody measured
/// fabric handles with a channel), and the run passes; never "THE FORECAST WAS WRONG".
#[test]
fn a_served_fabric_run_with_an_imex_channel_agrees_with_its_forecast() {
    let (_dir, socket) = socket_path("fabric");
    let server = serve("ok+imex", &socket, &["--ipc", "fabric"]);
    let joiner = join("ok+imex", &socket, None);
    let (code, out, _) = server.end(LIMIT);
    let (joined, said, _) = joiner.end(LIMIT);
    assert_eq!((code, joined), (Some(0), Some(0)), "{out}\n{said}");
    assert!(out.contains("IMEX channel            same"), "{out}");
    assert!(out.contains("  fabric: forecast not known, it worked\n"), "{out}");
    assert!(!out.contains("THE FORECAST WAS WRONG"), "{out}");
}

/// The facts a joiner reads in its own place reach the forecast: a joiner in a network namespace of its own
/// cannot reach NCCL's abstract socket (cuMem P2P fails), unless its environment says NCCL_CUMEM_ENABLE=0,
/// which makes NCCL's P2P legacy IPC; and each process tried pidfd_getfd on itself.
#[test]
fn a_joiners_settings_and_network_namespace_reach_the_library_forecast() {
    if !Command::new("unshare").args(["--net", "true"]).status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "a_joiners_settings_reach_the_library_forecast: no network namespaces");
        return;
    }
    for (setting, p2p) in [(None, "fails"), (Some("0"), "works")] {
        let (dir, socket) = socket_path("settings");
        let json = dir.path().join("run.json");
        let server = serve("ok", &socket, &["--json", json.to_str().unwrap()]);
        let mut joiner = Command::new("unshare");
        joiner.args(["--net"]).arg(bin()).args(["--join", &socket]).env(SIMULATE, "ok").env_remove(FAULT);
        match setting {
            Some(value) => joiner.env("NCCL_CUMEM_ENABLE", value),
            None => joiner.env_remove("NCCL_CUMEM_ENABLE"),
        };
        let joined = joiner.stdin(Stdio::null()).output().unwrap();
        let (code, out, _) = server.end(LIMIT);
        assert_eq!((code, joined.status.code()), (Some(0), Some(0)), "{out}\n{}", text(&joined));
        let doc = common::document(&json);
        let process = &doc["placement"]["processes"][0];
        let nccl = process["libraries"].as_array().unwrap().iter().find(|r| r["path"] == "NCCL P2P").unwrap();
        assert_eq!(nccl["verdict"], p2p, "NCCL_CUMEM_ENABLE={setting:?}: {nccl}");
        let settings = process["place"]["settings"].as_array().unwrap();
        assert_eq!(
            settings.contains(&serde_json::json!(["NCCL_CUMEM_ENABLE", "0"])),
            setting.is_some(),
            "{doc}"
        );
        assert_eq!(process["place"]["pidfd_getfd_itself"], "allowed", "{doc}");
    }
}

/// A request to join with a place of a joiner's shape, by hand: `hostname` and made-up facts.
fn hello_with_hostname(hostname: &str) -> Vec<u8> {
    let place = serde_json::json!({
        "pid": 7,
        "namespaces": {"pid": 1, "ipc": 1, "mnt": 1, "net": 1, "uts": 1, "user": 1, "cgroup": 1},
        "dev_shm": null,
        "hostname": hostname,
        "boot_id": null,
        "cuda_visible_devices": null,
        "nvidia_visible_devices": null,
        "nccl_hostid": null,
        "gpus": null,
        "imex_channel": false,
        "uid": 0,
        "in_user_namespace": false,
        "capabilities": {"sys_ptrace": false, "sys_nice": false, "ipc_lock": false},
        "ptrace_scope": null,
        "seccomp": null,
        "mps": {"pipe_directory": "/tmp/nvidia-mps", "from_env": false, "client": false},
    });
    [&b"SIPCHELO"[..], &serde_json::to_vec(&place).unwrap()].concat()
}

/// A joiner that says a 60 KB hostname (the wire takes 64 KiB; its own joiners send at most 3000 bytes) is
/// no place of simple-ipc's: the server says so, naming the field, and leaves it out of where the
/// processes stand, whose table stays as narrow as the honest joiner's column (it once printed the 60 KB
/// hostname on every row: 723 KB).
#[test]
fn a_joiner_that_says_an_oversized_hostname_is_left_out_of_the_table() {
    let (_dir, socket) = socket_path("oversized");
    let server = serve("ok,ok", &socket, &["--timeout", "10"]);
    let liar = raw_connect(&socket);
    let hostname = format!("{}\x1b[2J", "h".repeat(60_000));
    send_raw(&liar, &hello_with_hostname(&hostname));
    assert!(server.wait_for("Process 0 joined", LIMIT), "{}", server.text());
    let honest = join("ok,ok", &socket, None);
    assert!(server.wait_for("Where the processes stand", LIMIT), "{}", server.text());
    drop(liar);
    let (code, out, _) = server.end(LIMIT);
    let _ = honest.end(LIMIT);
    assert_eq!(code, Some(1), "the liar never took its part: {out}");
    assert!(
        out.contains("its hostname is 60004 characters, where a hostname (HOST_NAME_MAX) holds at most 64"),
        "{out}"
    );
    assert!(!out.contains(&"h".repeat(65)) && !out.contains('\x1b'), "{out}");
    let table: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("Where the processes stand")).collect();
    assert!(table.get(1).is_some_and(|l| l.ends_with("process 1")), "the honest joiner alone: {out}");
    assert!(out.len() < 20_000, "{} bytes of output", out.len());
}

/// `--join` through a link to a live socket joins it, as connect(2) follows the link (the server at its end
/// is still held to this user or root); a link to what is no socket is said to be one, with where it
/// points; a link whose end is not there yet is waited for, and named when it never comes.
#[test]
fn a_joiner_follows_a_link_to_the_socket_and_names_a_link_to_what_is_no_socket() {
    let (dir, socket) = socket_path("link");
    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(&socket, &link).unwrap();
    let link = link.display().to_string();
    let server = serve("ok", &socket, &["--timeout", "10"]);
    let (joined, said, _) = join("ok", &link, None).end(LIMIT);
    let (code, out, _) = server.end(LIMIT);
    assert_eq!((code, joined), (Some(0), Some(0)), "{out}\n{said}");

    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"").unwrap();
    let to_plain = dir.path().join("to-plain");
    std::os::unix::fs::symlink(&plain, &to_plain).unwrap();
    let (code, said, _) = join("ok", &to_plain.display().to_string(), None).end(LIMIT);
    assert_eq!(code, Some(1), "{said}");
    let says = format!("that path is a link to {}, which is no socket", plain.display());
    assert!(said.contains(&says), "{said}");

    let start = Instant::now();
    let args = ["--join", &link, "--timeout", "1"];
    let (code, said, _) = Running::start("ok", &args, None).end(LIMIT);
    assert_eq!(code, Some(1), "{said}");
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert!(said.contains(&format!("Waiting for the server at {link}, a link to {socket}")), "{said}");
    assert!(said.contains(&format!("the end of its link, {socket}, never appeared")), "{said}");
}

/// A joiner's verdict is the run's: a server whose `--json -` cannot be written (standard output is
/// /dev/full) does not pass, and its joiner hears so, where it once said `PASSED: the run ended well`.
#[test]
fn a_joiner_hears_that_the_servers_document_could_not_be_written() {
    let (dir, socket) = socket_path("full");
    let log = dir.path().join("server.err");
    let mut server = Command::new(bin())
        .args(["--serve", &socket, "--json", "-", "--timeout", "20"])
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .stdout(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !std::path::Path::new(&socket).exists() && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (code, said, _) = join("ok", &socket, None).end(LIMIT);
    let served = server.wait().unwrap();
    let server_said = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(served.code(), Some(1), "{server_said}");
    assert_eq!(code, Some(1), "the joiner's verdict is the run's: {said}\nserver: {server_said}");
    assert!(said.contains("could not write its --json document"), "{said}");
    assert!(!said.contains("PASSED"), "{said}");
}

/// The NCCL a joiner would load is read in its own place, from its file and never by loading it (here a
/// stand-in library made with the C compiler, named by SIMPLE_IPC_NCCL_LIBRARY, with NCCL's banner in its
/// read-only data and a constructor that ends the process: a joiner that ran it would exit 42), and the
/// forecast speaks of that version: NCCL 2.18 uses legacy IPC for P2P, which needs no shared network
/// namespace.
#[test]
fn the_nccl_a_joiner_would_load_is_read_and_its_version_forecast() {
    let dir = common::scratch("nccl");
    let source = dir.path().join("nccl.c");
    let code = "#include <unistd.h>\n\
                __attribute__((used)) const char banner[] = \"NCCL version 2.18.6+cuda12.2\";\n\
                __attribute__((constructor)) static void planted(void) { _exit(42); }\n\
                int ncclGetVersion(int *version) { *version = 21806; return 0; }\n";
    std::fs::write(&source, code).unwrap();
    let library = dir.path().join("libnccl.so.2");
    let built = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&library).arg(&source).status();
    if !built.is_ok_and(|s| s.success()) {
        common::skipped(
            "cc",
            "the_nccl_a_joiner_would_load_is_read: no C compiler to make a stand-in libnccl",
        );
        return;
    }
    if !Command::new("unshare").args(["--net", "true"]).status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "the_nccl_a_joiner_would_load_is_read: no network namespaces");
        return;
    }
    let (sockets, socket) = socket_path("nccl-version");
    let json = sockets.path().join("run.json");
    let server = serve("ok", &socket, &["--json", json.to_str().unwrap()]);
    let joined = Command::new("unshare")
        .args(["--net"])
        .arg(bin())
        .args(["--join", &socket])
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .env("SIMPLE_IPC_NCCL_LIBRARY", &library)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (code, out, _) = server.end(LIMIT);
    assert_eq!((code, joined.status.code()), (Some(0), Some(0)), "{out}\n{}", text(&joined));
    let doc = common::document(&json);
    let process = &doc["placement"]["processes"][0];
    assert_eq!(process["place"]["nccl_version"], serde_json::json!([2, 18, 6]), "{doc}");
    let p2p = process["libraries"].as_array().unwrap().iter().find(|r| r["path"] == "NCCL P2P").unwrap();
    assert_eq!(p2p["verdict"], "works", "legacy IPC crosses network namespaces: {p2p}");
    assert!(p2p["rule"].as_str().unwrap().contains("NCCL 2.18.6, as read here"), "{p2p}");
}

/// A joiner stuck in a call that never returns (here the `hang` fault in the round-robin, as a hung GPU)
/// whose server is killed ends by its own watchdog at its --timeout and a grace, saying so: no other
/// process of this program watches it. Once it outlived its --timeout for good.
#[test]
fn a_hung_joiner_whose_server_is_killed_ends_by_its_own_watchdog() {
    let (_dir, socket) = socket_path("hung-joiner");
    let mut server = serve("ok", &socket, &["--procs-per-device", "2", "--timeout", "60"]);
    let joiners: Vec<Running> = (0..2)
        .map(|_| {
            Running::start("ok", &["--join", &socket, "--timeout", "2"], Some("child1@round-robin:hang"))
        })
        .collect();
    assert!(
        joiners
            .iter()
            .any(|j| j.wait_for("test fault: child1@round-robin:hang strikes", Duration::from_secs(10))),
        "the fault struck"
    );
    let _ = server.child.kill();
    let _ = server.child.wait();
    let killed = Instant::now();
    for joiner in joiners {
        let (code, said, _) = joiner.end(Duration::from_secs(15));
        assert_eq!(code, Some(1), "{said}");
        if said.contains("strikes") {
            assert!(said.contains("its own watchdog ended it"), "{said}");
            assert!(
                said.contains("FAILED (exit 1): this process did not finish within --timeout 2 s"),
                "{said}"
            );
        }
    }
    assert!(
        killed.elapsed() < Duration::from_secs(8),
        "past --timeout 2 and the grace: {:?}",
        killed.elapsed()
    );
}

/// `--serve --json - | true`: the reader of the server's document is gone when the server writes it, so
/// the server ends 141 (interrupted, as a C program killed by SIGPIPE); its joiners are told so and do not
/// say PASSED for a run whose server did not pass.
#[test]
fn a_servers_reader_gone_is_no_pass_for_its_joiners() {
    let (_dir, socket) = socket_path("reader-gone");
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let mut server = Command::new(bin())
        .args(["--serve", &socket, "--json", "-"])
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = server.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut said = String::new();
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("waiting for") {
                let _ = tx.send(None);
            }
            said.push_str(&line);
            said.push('\n');
        }
        let _ = tx.send(Some(said));
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(None), "the server serves");
    let joiner = join("ok", &socket, None);
    let (code, said, _) = joiner.end(LIMIT);
    let server_code = server.wait().unwrap().code();
    let server_said = rx.recv_timeout(Duration::from_secs(5)).ok().flatten().unwrap_or_default();
    assert_eq!(server_code, Some(141), "{server_said}");
    assert_eq!(code, Some(1), "the joiner does not pass a run its server did not: {said}");
    assert!(!said.contains("PASSED"), "{said}");
    assert!(said.contains("the reader of standard output went away"), "{said}");
}

/// A server killed (SIGKILL) just after both its joiners joined: no joiner waives the run. Opening the dead
/// server's memory, the simulated driver finds it no longer in /proc (as from another PID namespace, which
/// it does not model); that is no waiver where the server is gone: the joiner fails, saying so first.
#[test]
fn a_server_killed_after_its_joiners_joined_is_no_waiver_for_them() {
    let mut waived = Vec::new();
    for attempt in 0..10 {
        let (_dir, socket) = socket_path(&format!("killed-after-join-{attempt}"));
        let mut server = serve("ok", &socket, &["--procs-per-device", "2"]);
        let joiners = [join("ok", &socket, None), join("ok", &socket, None)];
        assert!(server.wait_for("Process 1 joined", Duration::from_secs(10)), "{}", server.text());
        let _ = server.child.kill();
        let _ = server.child.wait();
        for joiner in joiners {
            let (code, out, _) = joiner.end(LIMIT);
            assert!(code.is_some(), "{out}");
            if code == Some(2) {
                waived.push(out);
            }
        }
    }
    assert!(waived.is_empty(), "a joiner waived a run whose server was killed:\n{}", waived.join("\n---\n"));
}
