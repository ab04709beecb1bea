//! `--serve SOCKET` and `--join SOCKET` on simulated GPUs, the runs that pass: processes the server did
//! not start join the run over a Unix socket and are children in every respect, with every mechanism, in a
//! served sequence (`--ipc all`) and in the benchmark; devices matched by UUID; and the socket's path: one
//! that exists is left alone, a joiner that comes first waits for it, a link to it is followed, none is left.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::serve::{LIMIT, Running, join, serve, socket_path};
use common::{FAULT, SIMULATE, bin, text};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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
