//! `--serve`/`--join` on simulated GPUs when something fails: each side notices the other's death, hang or
//! silence (through the socket, or by its own watchdog) and nothing is left; a stop signal ends a joiner
//! with 128+N; and every joiner's verdict is the run's, so that none passes a run that failed.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::serve::{LIMIT, Running, join, serve, socket_path};
use common::{FAULT, SIMULATE, bin};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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
