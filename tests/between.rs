//! `--between PID PID` gives, from outside, the forecast a served run gives from inside: for a server and a
//! joiner placed by `unshare` and `setpriv` (on simulated GPUs), the server's forecast for its joiner (its
//! `--json` document's `placement`) and `--between SERVER JOINER`'s, read while both run, row for row. And
//! what it says of a process that is gone, or of a pid that is no number.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{FAULT, SIMULATE, bin};

const LIMIT: Duration = Duration::from_secs(20);

/// A placement of the joiner: its name, a command that runs the rest of its arguments there, and the
/// environment it starts with.
type Placement = (&'static str, &'static [&'static str], &'static [(&'static str, &'static str)]);

const PLACEMENTS: [Placement; 9] = [
    ("the server's namespaces", &[], &[]),
    ("a PID namespace of its own", &["unshare", "--pid", "--fork", "--mount-proc"], &[]),
    (
        "a /dev/shm of its own",
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs /dev/shm && exec \"$0\" \"$@\"",
        ],
        &[],
    ),
    ("a network namespace of its own", &["unshare", "--net"], &[]),
    (
        "a hostname of its own",
        &["unshare", "--uts", "sh", "-c", "hostname far-away && exec \"$0\" \"$@\""],
        &[],
    ),
    ("a user namespace, root mapped", &["unshare", "--user", "--map-root-user"], &[]),
    ("a user namespace without a map", &["unshare", "--user"], &[]),
    ("root without CAP_SYS_PTRACE", &["setpriv", "--inh-caps", "-all", "--bounding-set", "-sys_ptrace"], &[]),
    (
        "the libraries' settings",
        &[],
        &[
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
            ("NCCL_P2P_DISABLE", "1"),
            ("UCX_TLS", "tcp"),
        ],
    ),
];

/// Each row's path and verdict (with its detail): what the two forecasts must agree on.
fn rows(forecasts: &serde_json::Value) -> Vec<(String, String, String)> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    forecasts
        .as_array()
        .unwrap_or_else(|| panic!("no forecasts: {forecasts}"))
        .iter()
        .map(|f| (text(&f["path"]), text(&f["verdict"]), text(&f["detail"])))
        .collect()
}

/// The facts of the table (the first eleven), each `same`, `differs` or `unknown`.
fn table_facts(shares: &serde_json::Value) -> Vec<(String, String)> {
    let shares = shares.as_array().unwrap_or_else(|| panic!("no shares: {shares}"));
    shares.iter().take(11).map(|f| (f["fact"].to_string(), f["same"].to_string())).collect()
}

#[test]
fn between_gives_the_served_runs_forecast_row_for_row_in_every_placement() {
    if !Command::new("unshare")
        .args(["--user", "--pid", "--fork", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        common::skipped("namespaces", "between_gives_the_served_runs_forecast: no namespaces here");
        return;
    }
    for (name, prefix, env) in PLACEMENTS {
        let dir = common::scratch("between");
        let socket = dir.path().join("s.sock").display().to_string();
        let json = dir.path().join("run.json");
        // Two processes on one GPU, of which one joins: the server waits for the other until its --timeout,
        // and both run meanwhile.
        let mut server = common::simulated("ok")
            .args([
                "--serve",
                &socket,
                "--procs-per-device",
                "2",
                "--ipc",
                "vmm",
                "--sync",
                "memops",
                "--timeout",
                "3",
            ])
            .arg("--json")
            .arg(&json)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut joiner = match prefix.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(bin());
                command
            }
            None => Command::new(bin()),
        };
        joiner.args(["--join", &socket]).env(SIMULATE, "ok").env_remove(FAULT).envs(env.iter().copied());
        let mut joiner =
            joiner.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let joined = common::wait_for_lines(&mut server, "Process 0 joined (pid ", 1, LIMIT);
        assert_eq!(joined, 1, "{name}: the joiner joined");
        let said = joiner_of(&server, &socket);
        let between = Command::new(bin())
            .args(["--between", &server.id().to_string(), &said.to_string(), "--json", "-"])
            .output()
            .unwrap();
        assert_eq!(between.status.code(), Some(0), "{name}: {}", String::from_utf8_lossy(&between.stderr));
        let answer: serde_json::Value = serde_json::from_slice(&between.stdout).unwrap();
        let ended = Instant::now() + LIMIT;
        while server.try_wait().unwrap().is_none() && Instant::now() < ended {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = server.kill();
        let _ = server.wait();
        // Its whole group: the joiner in a PID namespace of its own is unshare's child, not the child's.
        let group = nix::unistd::Pid::from_raw(joiner.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = joiner.wait();
        common::wait_group_gone(joiner.id(), LIMIT);
        let served = common::document(&json);
        let served = &served["placement"]["processes"][0];
        let outside = &answer["directions"][0]["processes"][0];
        assert_eq!(rows(&outside["forecast"]), rows(&served["forecast"]), "{name}: the handles: {outside}");
        assert_eq!(rows(&outside["libraries"]), rows(&served["libraries"]), "{name}: the libraries");
        assert_eq!(table_facts(&outside["shares"]), table_facts(&served["shares"]), "{name}: the table");
        assert_eq!(answer["directions"][0]["server"]["pid"], served_server_pid(&json), "{name}");
        // And the placements are told apart: each differs from the server's namespaces where it should.
        let said = |path: &str| {
            let rows = rows(&outside["forecast"]).into_iter().chain(rows(&outside["libraries"]));
            rows.into_iter()
                .find(|(p, _, _)| p == path)
                .map(|(_, verdict, detail)| format!("{verdict} {detail}"))
        };
        let expected = match name {
            "a PID namespace of its own" => {
                Some(("PyTorch expandable_segments", "fails its VMM fd by pidfd_getfd: ESRCH"))
            }
            "a /dev/shm of its own" | "a user namespace without a map" => {
                Some(("legacy event", "fails CUDA_ERROR_MAP_FAILED"))
            }
            "a network namespace of its own" => Some(("NCCL P2P", "fails the descriptors' abstract socket")),
            "a hostname of its own" => Some(("NCCL P2P", "falls_back NCCL's NET transport")),
            "a user namespace, root mapped" | "root without CAP_SYS_PTRACE" => {
                Some(("VMM fd by pidfd_getfd", "fails EPERM"))
            }
            "the libraries' settings" => Some(("NCCL P2P", "falls_back NCCL's SHM or NET transport")),
            _ => Some(("legacy event", "works ")),
        };
        if let Some((path, verdict)) = expected {
            let said = said(path).unwrap_or_default();
            assert!(said.starts_with(verdict), "{name}: {path}: {said}");
        }
    }
}

/// The pid of the joiner of `server` at `socket`: the process of this program, started by this test, whose
/// arguments join that socket.
fn joiner_of(server: &std::process::Child, socket: &str) -> u32 {
    let me = server.id();
    for _ in 0..100 {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            let joins = args.windows(2).any(|w| w[0] == b"--join" && w[1] == socket.as_bytes());
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
            (joins && exe == bin() && pid != me && is_ours(pid)).then_some(pid)
        });
        if let Some(pid) = found {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no joiner of server {me} found");
}

/// Whether `pid` was started by this test process (its parent chain reaches it), not by another suite.
fn is_ours(pid: u32) -> bool {
    let me = std::process::id();
    let mut current = pid;
    for _ in 0..8 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{current}/stat")) else { return false };
        let Some(parent) = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split(' ').nth(1)?.parse().ok())
        else {
            return false;
        };
        if parent == me {
            return true;
        }
        current = parent;
    }
    false
}

fn served_server_pid(json: &std::path::Path) -> serde_json::Value {
    common::document(json)["placement"]["server"]["pid"].clone()
}

#[test]
fn a_process_that_is_gone_or_no_pid_is_a_clear_error() {
    let me = std::process::id().to_string();
    let gone = Command::new(bin()).args(["--between", &me, &i32::MAX.to_string()]).output().unwrap();
    assert_eq!(gone.status.code(), Some(1));
    let said = String::from_utf8_lossy(&gone.stderr);
    assert!(
        said.contains(&format!("process {} cannot be read", i32::MAX)) && said.contains("has it ended?"),
        "{said}"
    );
    assert!(gone.stdout.is_empty(), "no forecast from a guess");
    let dir = common::scratch("between-json");
    let json = dir.path().join("b.json");
    let gone = Command::new(bin())
        .args(["--between", &me, &i32::MAX.to_string(), "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(1));
    let document = common::document(&json);
    assert_eq!(document["status"], "failed");
    assert!(document["reason"].as_str().unwrap_or_default().contains("cannot be read"), "{document}");
    let itself = Command::new(bin()).args(["--between", &me, &me]).output().unwrap();
    assert_eq!(itself.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&itself.stderr).contains("is both processes"), "{itself:?}");
    // Another user may not read root's processes: the fact it could not read is named.
    if nix::unistd::geteuid().is_root() {
        // A copy another user may run, in a directory it may enter.
        let copy = dir.path().join("simple-ipc");
        common::copy_executable(bin(), &copy, &["--version"]);
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let nobody = Command::new(&copy).args(["--between", &me, &me_too()]).uid(65534).gid(65534).output();
        let nobody = nobody.unwrap();
        assert_eq!(nobody.status.code(), Some(1), "{nobody:?}");
        let said = String::from_utf8_lossy(&nobody.stderr);
        assert!(said.contains("could not be read (/proc/"), "{said}");
    } else {
        common::skipped("root", "a_process_that_is_gone_or_no_pid_is_a_clear_error: another user's read");
    }
    let usage = Command::new(bin()).args(["--between", "0", "x"]).output().unwrap();
    assert_eq!(usage.status.code(), Some(1), "a usage error");
    let usage = Command::new(bin()).args(["--between", "1", "2", "--ipc", "vmm"]).output().unwrap();
    assert!(String::from_utf8_lossy(&usage.stderr).contains("cannot be used with"), "--between runs nothing");
}

/// Another process of this test's own, which lives as long as the test process does (its parent, here).
fn me_too() -> String {
    nix::unistd::getppid().to_string()
}

/// This test's own process and its parent, read from outside: answered in well under a second, both ways,
/// with the libraries each has loaded and the settings it started with.
#[test]
fn two_processes_of_one_place_are_answered_both_ways() {
    let me = std::process::id().to_string();
    let mut sleeper = Command::new("sleep").arg("30").env("NCCL_P2P_DISABLE", "1").spawn().unwrap();
    let started = Instant::now();
    let out = Command::new(bin()).args(["--between", &me, &sleeper.id().to_string()]).output().unwrap();
    let took = started.elapsed();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("With pid {me} exporting to pid {}", sleeper.id())), "{text}");
    assert!(text.contains(&format!("exporting to pid {me}")), "both ways: {text}");
    assert!(text.contains("started with NCCL_P2P_DISABLE=1"), "{text}");
    assert!(text.contains("NCCL P2P: falls back to NCCL's SHM or NET transport"), "{text}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// `--json` is taken as a run takes it: `-` is standard output, for a failure as for an answer (once a
/// failure went to a file named `-` in the current directory), with the text beside it on standard error,
/// whose failure is not the answer's; a path that cannot take a document is refused before anything is
/// read.
#[test]
fn the_json_document_goes_where_a_runs_would() {
    let dir = common::scratch("between-stdout");
    let me = std::process::id().to_string();
    let gone = Command::new(bin())
        .args(["--between", &me, &i32::MAX.to_string(), "--json", "-"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");
    let document: serde_json::Value = serde_json::from_slice(&gone.stdout).unwrap();
    assert_eq!(document["status"], "failed", "{document}");
    assert!(!dir.path().join("-").exists(), "a file named -");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let answered =
        Command::new(bin()).args(["--between", &me, &me_too(), "--json", "-"]).stderr(full).output().unwrap();
    assert_eq!(answered.status.code(), Some(0), "{answered:?}");
    let document: serde_json::Value = serde_json::from_slice(&answered.stdout).unwrap();
    assert_eq!(document["status"], "answered");
    let directory =
        Command::new(bin()).args(["--between", &me, &me_too(), "--json"]).arg(dir.path()).output().unwrap();
    assert_eq!(directory.status.code(), Some(1), "{directory:?}");
    assert!(String::from_utf8_lossy(&directory.stderr).contains("is not a regular file"), "{directory:?}");
}

/// A process's name and its files' names are bytes, not UTF-8: a process named `\xff` (`prctl`) that maps a
/// file so named is read (the bytes as U+FFFD), and so is its grandchild, whose ancestor it is through a
/// child of that name. Read as UTF-8, either name made the process unreadable, and the ancestor unseen.
#[test]
fn names_that_are_not_utf8_are_read() {
    let dir = common::scratch("between-bytes");
    let script = "import ctypes, mmap, os, subprocess, sys, time\n\
                  ctypes.CDLL(None).prctl(15, b'bad\\xff\\xfe', 0, 0, 0)\n\
                  path = os.path.join(os.fsencode(sys.argv[1]), b'lat\\xe9.so')\n\
                  open(path, 'wb').write(b'x' * 4096)\n\
                  kept = mmap.mmap(os.open(path, os.O_RDONLY), 0, prot=mmap.PROT_READ)\n\
                  if os.fork() == 0:\n\
                  \x20   print(subprocess.Popen(['sleep', '30']).pid, flush=True)\n\
                  time.sleep(30)\n";
    let mut parent = Command::new("python3")
        .args(["-c", script])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(parent.stdout.take().unwrap()), &mut line)
        .unwrap();
    let child = line.trim().to_owned();
    let out = Command::new(bin())
        .args(["--between", &child, &parent.id().to_string(), "--json", "-"])
        .output()
        .unwrap();
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(parent.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = parent.wait();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["processes"][1]["name"], "bad\u{fffd}\u{fffd}", "{answer}");
    let shares = &answer["directions"][0]["processes"][0]["shares"];
    let ancestor = shares.as_array().unwrap().iter().find(|f| f["fact"] == "importer_is_ancestor").unwrap();
    assert_eq!(ancestor["same"], "same", "{shares}");
}

/// What is no process is said so, naming what it is: a thread (by its process, which is what to give), a
/// zombie (ended, not yet reaped), a kernel thread (pid 2). Each was once read as a process: a thread as
/// one whose pid was the thread's, a zombie as one whose IPC namespace could not be read, pid 2 as one whose
/// environment could not be read.
#[test]
fn a_thread_a_zombie_or_a_kernel_thread_is_no_process() {
    let script = "import os, sys, threading, time\n\
                  threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n\
                  zombie = os.fork()\n\
                  if zombie == 0: os._exit(0)\n\
                  time.sleep(0.2)\n\
                  thread = [t for t in os.listdir('/proc/self/task') if int(t) != os.getpid()][0]\n\
                  print(thread, zombie, flush=True)\n\
                  time.sleep(30)\n";
    let mut python = Command::new("python3").args(["-c", script]).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(python.stdout.take().unwrap()), &mut line)
        .unwrap();
    let (thread, zombie) = line.trim().split_once(' ').unwrap();
    let me = std::process::id().to_string();
    let said = |pid: &str| {
        let out = Command::new(bin()).args(["--between", &me, pid]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{pid}: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let python_pid = python.id().to_string();
    let (of_thread, of_zombie) = (said(thread), said(zombie));
    let _ = python.kill();
    let _ = python.wait();
    let thread_said =
        format!("{thread} is a thread of process {python_pid}, not a process: give {python_pid}");
    assert!(of_thread.contains(&thread_said), "{of_thread}");
    assert!(of_zombie.contains(&format!("process {zombie} has ended (a zombie")), "{of_zombie}");
    match kernel_thread() {
        Some(pid) => {
            let of_kernel = said(&pid.to_string());
            assert!(of_kernel.contains(&format!("{pid} is a kernel thread, not a process")), "{of_kernel}");
        }
        None => eprintln!("SKIPPED a kernel thread: none in this PID namespace"),
    }
}

/// A kernel thread this process can see (`PF_KTHREAD` in its stat's flags): pid 2 on a host, none in a
/// container's own PID namespace.
fn kernel_thread() -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
        let stat = String::from_utf8_lossy(&stat);
        let flags: u64 = stat.rsplit_once(')')?.1.split_whitespace().nth(6)?.parse().ok()?;
        (flags & 0x0020_0000 != 0).then_some(pid)
    })
}

/// A process's paths are read in its own root, as it resolves them: a chrooted process whose `/dev/shm`,
/// `/dev/dxg` and `/etc/nv_tegra_release` are links to the node's own (absolute, so in its root they lead
/// nowhere), and whose MPS pipe directory is a link to a folder of the node with a socket in it, has no
/// /dev/shm, is no WSL2 or Tegra machine, and no MPS daemon answers it. Through `/proc/<pid>/root` the
/// kernel resolved each link from this process's root: the node's /dev/shm, WSL2, and the node's socket.
#[test]
fn a_process_is_read_in_its_own_root() {
    if !nix::unistd::geteuid().is_root() {
        common::skipped("root", "a_process_is_read_in_its_own_root: chroot");
        return;
    }
    let dir = common::scratch("between-root");
    let root = dir.path().join("root");
    for folder in ["dev", "etc", "tmp"] {
        std::fs::create_dir_all(root.join(folder)).unwrap();
    }
    let link =
        |target: &std::path::Path, name: &str| std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    link("/dev/shm".as_ref(), "dev/shm");
    link("/dev/null".as_ref(), "dev/dxg");
    link("/etc/passwd".as_ref(), "etc/nv_tegra_release");
    let node = dir.path().join("node");
    std::fs::create_dir(&node).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(node.join("control")).unwrap();
    link(&node, "tmp/nvidia-mps");
    let place = place_in(&root);
    assert_eq!(place["dev_shm"], serde_json::Value::Null, "{place}");
    assert_eq!(place["platform"]["kind"], "linux", "{place}");
    assert_eq!(
        (&place["mps"]["client"], &place["mps"]["answered"]),
        (&false.into(), &serde_json::Value::Null)
    );
}

/// The place of a process chrooted into `root`, read by `--between` beside this test's own.
fn place_in(root: &std::path::Path) -> serde_json::Value {
    let script = "import os, sys, time\nos.chroot(sys.argv[1]); os.chdir('/')\nprint('in', flush=True)\ntime.sleep(30)\n";
    let mut chrooted =
        Command::new("python3").args(["-c", script]).arg(root).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(chrooted.stdout.take().unwrap()), &mut line)
        .unwrap();
    let me = std::process::id().to_string();
    let out = Command::new(bin())
        .args(["--between", &me, &chrooted.id().to_string(), "--json", "-"])
        .output()
        .unwrap();
    let _ = chrooted.kill();
    let _ = chrooted.wait();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    answer["processes"][1]["place"].clone()
}

/// A /dev/shm that is no directory (a FIFO, a file) is none: the process's `shm_open` meets `ENOTDIR`. It
/// was read as the file system that holds it.
#[test]
fn a_dev_shm_that_is_no_directory_is_none() {
    if !nix::unistd::geteuid().is_root() {
        common::skipped("root", "a_dev_shm_that_is_no_directory_is_none: chroot");
        return;
    }
    let dir = common::scratch("between-shm-file");
    std::fs::create_dir(dir.path().join("dev")).unwrap();
    nix::unistd::mkfifo(&dir.path().join("dev/shm"), nix::sys::stat::Mode::from_bits_truncate(0o600))
        .unwrap();
    let place = place_in(dir.path());
    assert_eq!(place["dev_shm"], serde_json::Value::Null, "{place}");
}

/// A process whose own file system never answers (a FUSE mount over its /dev/shm whose server never
/// replies, which a user may make in namespaces of its own) is an error within a second that names the
/// fact, not a wait for good: the read waited in the kernel until SIGKILL, and Ctrl-C could not end it.
#[test]
fn a_file_system_that_never_answers_is_an_error_not_a_hang() {
    let script = "import ctypes, os, sys, time\n\
                  fd = os.open('/dev/fuse', os.O_RDWR)\n\
                  options = b'fd=%d,rootmode=40000,user_id=0,group_id=0' % fd\n\
                  if ctypes.CDLL(None, use_errno=True).mount(b'hang', b'/dev/shm', b'fuse', 0, options) != 0:\n\
                  \x20   print('failed', ctypes.get_errno(), flush=True); sys.exit(1)\n\
                  print('ready', flush=True)\n\
                  time.sleep(30)\n";
    let Ok(mut hung) = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "python3", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        common::skipped("fuse", "a_file_system_that_never_answers: no unshare");
        return;
    };
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(hung.stdout.take().unwrap()), &mut line);
    if line.trim() != "ready" {
        let _ = hung.kill();
        let _ = hung.wait();
        common::skipped("fuse", format!("a_file_system_that_never_answers: no FUSE mount here ({line:?})"));
        return;
    }
    let me = std::process::id().to_string();
    let started = Instant::now();
    let mut between = Command::new(bin())
        .args(["--between", &me, &hung.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while between.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = started.elapsed();
    // The server's end fails the read that waits for it: a reader that hung ends now.
    let _ = hung.kill();
    let _ = hung.wait();
    let out = between.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(took < Duration::from_secs(5), "it waited for the file system: {said}");
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("its /dev/shm (/proc/") && said.contains("could not be read within"), "{said}");
}

/// Run out of descriptors (`ulimit -n`) at each of its reads, an error names the process and the file it
/// could not read, and asks whether the process ended only where the kernel said there is none: it once
/// asked it of "Too many open files", and once said only that.
#[test]
fn out_of_descriptors_the_error_names_what_it_read() {
    let me = std::process::id().to_string();
    let other = me_too();
    for most in 5..=9 {
        let out = Command::new("sh")
            // Descriptors an invoker left open (3..9) would count against the limit before the program
            // starts (the loader itself could not open a library): closed first.
            .args(["-c", &format!("exec 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-; ulimit -n {most} && exec \"$0\" --between {me} {other}")])
            .arg(bin())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        if out.status.code() == Some(0) {
            continue;
        }
        assert_eq!(out.status.code(), Some(1), "{most}: {said}");
        assert!(
            said.contains("process ") && said.contains("(/proc/") || said.contains(": /proc/"),
            "{most}: {said}"
        );
        assert!(!said.contains("has it ended?"), "{most}: {said}");
    }
}

/// A process that unmapped the pages of its environment (the kernel still keeps its bounds) is an error
/// that says how much of it could be read: it was read as one started without any setting, where it was
/// started with NCCL_P2P_DISABLE=1.
#[test]
fn an_environment_whose_memory_is_gone_is_an_error() {
    let script = "import ctypes, time\n\
                  libc = ctypes.CDLL(None)\n\
                  libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]\n\
                  stat = open('/proc/self/stat').read().rsplit(')', 1)[1].split()\n\
                  start, end = int(stat[47]) & ~4095, (int(stat[48]) + 4095) & ~4095\n\
                  print(libc.munmap(start, end - start), flush=True)\n\
                  time.sleep(30)\n";
    let mut hidden = Command::new("python3")
        .args(["-c", script])
        .env("NCCL_P2P_DISABLE", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(hidden.stdout.take().unwrap()), &mut line)
        .unwrap();
    let me = std::process::id().to_string();
    let out = Command::new(bin()).args(["--between", &me, &hidden.id().to_string()]).output().unwrap();
    let _ = hidden.kill();
    let _ = hidden.wait();
    assert_eq!(line.trim(), "0", "munmap");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}{}", String::from_utf8_lossy(&out.stdout));
    assert!(said.contains("its environment could not be read") && said.contains("0 of its"), "{said}");
}
