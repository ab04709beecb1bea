//! `--serve`/`--join` on simulated GPUs, at the door: who may join (not another user) and how many; stray,
//! hostile and lying peers take no place and cannot pass the run; a server of another user cannot make a
//! joiner pass; and what a peer says reaches the other side's terminal escaped.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::serve::{LIMIT, Running, join, serve, socket_path};
use common::{FAULT, SIMULATE, bin, text};

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
    common::copy_executable(bin(), &copy, &["--version"]);
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
