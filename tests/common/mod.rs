//! Helpers shared by the integration tests: the binary, the simulated GPUs, checks that a run left no
//! process and nothing in /dev/shm behind, and the tests' own files, which go when the test ends, however
//! it ends. The helpers of one subject's several files are a module each: [`serve`] (`tests/serve_*.rs`),
//! [`isolate`] (`tests/isolate_*.rs`), [`kubernetes`] (`tests/kubernetes_*.rs`).
#![allow(dead_code)]

pub mod isolate;
pub mod kubernetes;
pub mod serve;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

pub const SIMULATE: &str = "SIMPLE_IPC_SIMULATE_GPUS";
pub const FAULT: &str = "SIMPLE_IPC_TEST_FAULT";

/// A directory of the test's own under TMPDIR (`simple-ipc-NAME-XXXXXX`, mode 0700), removed with all it
/// holds when the guard drops: when the test ends, passed or failed.
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("simple-ipc-{name}-"))
        .tempdir()
        .expect("a directory of the test's own under TMPDIR")
}

/// A file the test makes where no scratch directory can hold it (a decoy in /dev/shm), removed when the
/// guard drops, if it is still there.
pub fn removed_at_end(path: impl Into<std::path::PathBuf>) -> tempfile::TempPath {
    tempfile::TempPath::try_from_path(path).expect("an absolute path")
}

pub fn bin() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin!("simple-ipc").to_path_buf()
}

/// The binary with `gpus` simulated in host memory, in a process group of its own (so that the test can
/// tell when every process of the run is gone).
pub fn simulated(gpus: &str) -> Command {
    let mut command = Command::new(bin());
    command.env(SIMULATE, gpus).env_remove(FAULT).process_group(0);
    command
}

/// [`simulated`], in `shm`'s mount namespace where there is one: a run whose processes have the pid numbers
/// of another suite's (pid 2 of an isolated run), so that the driver's files of their events are theirs
/// alone (see [`OwnDevShm`]).
pub fn simulated_in(shm: Option<&OwnDevShm>, gpus: &str) -> Command {
    let mut command = shm.map_or_else(|| Command::new(bin()), |shm| shm.enter(&bin()));
    command.env(SIMULATE, gpus).env_remove(FAULT).process_group(0);
    command
}

/// Makes `command`'s child hold each `(source, target)` descriptor of this process at `target`, and
/// nothing else of the test's beyond what it inherits anyway. Robust wherever the test runs: every source
/// is first copied above the targets (so that a source that already is some target, as under a shell that
/// left 3..9 open, is neither overwritten by an earlier `dup2` nor left close-on-exec by `dup2(n, n)`, which
/// does nothing), then `dup2`ed to its target, which clears close-on-exec on the copy.
pub fn with_fds(command: &mut Command, fds: &[(std::os::fd::RawFd, std::os::fd::RawFd)]) {
    const ABOVE: std::os::fd::RawFd = 100;
    assert!(fds.len() <= 16, "with_fds: at most 16 descriptors");
    let fds = fds.to_vec();
    // SAFETY: (test) between fork and exec, only fcntl and dup2, which are async-signal-safe, on
    // descriptors this test holds open; nothing is allocated (the copies go in a fixed array).
    unsafe {
        command.pre_exec(move || {
            let mut copies = [0; 16];
            for (copy, &(source, _)) in copies.iter_mut().zip(&fds) {
                *copy = nix::libc::fcntl(source, nix::libc::F_DUPFD_CLOEXEC, ABOVE);
                if *copy < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (&copy, &(_, target)) in copies.iter().zip(&fds) {
                if nix::libc::dup2(copy, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Pipes at descriptors 3..9 of a command, as an invoker leaves them open, and a look at who holds them.
pub struct LeftOpen {
    pipes: Vec<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>,
}

impl LeftOpen {
    pub fn new() -> Self {
        let pipes = (3..10).map(|_| nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()).collect();
        Self { pipes }
    }

    /// `command` gets the write ends at 3..9.
    pub fn give_to(&self, command: &mut Command) {
        use std::os::fd::AsRawFd;
        let at: Vec<_> = self.pipes.iter().zip(3..10).map(|((_, write), n)| (write.as_raw_fd(), n)).collect();
        with_fds(command, &at);
    }

    /// How many processes below `pid` this program started by exec (those whose command line has
    /// `@internal`), and each `PID: fd N` among them that is one of these pipes.
    pub fn held_by_what_started(&self, pid: u32) -> (usize, Vec<String>) {
        let ours: Vec<String> = self
            .pipes
            .iter()
            .map(|(read, _)| format!("pipe:[{}]", nix::sys::stat::fstat(read).unwrap().st_ino))
            .collect();
        let started: Vec<u32> = descendants(pid)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|line| line.split(|&b| b == 0).any(|arg| arg == b"@internal"))
            })
            .collect();
        let mut held = Vec::new();
        for pid in &started {
            for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten() {
                let target =
                    std::fs::read_link(fd.path()).map(|t| t.display().to_string()).unwrap_or_default();
                if ours.contains(&target) {
                    held.push(format!("{pid}: fd {}", fd.file_name().to_string_lossy()));
                }
            }
        }
        (started.len(), held)
    }
}

pub fn run(command: &mut Command) -> Output {
    command.stdin(Stdio::null()).output().expect("the binary starts")
}

/// Runs `command` to its end with its output captured; returns its pid (the run's process group, for
/// [`group_gone`] and [`leftovers`]) and its output.
pub fn run_with_pid(command: &mut Command) -> (u32, Output) {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let pid = child.id();
    (pid, child.wait_with_output().expect("the binary ends"))
}

pub fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// True once no process of the group led by `pgid` is left running: each is reaped, or a zombie that only
/// waits for init to reap it (which some containers' init does only now and then).
pub fn group_gone(pgid: u32) -> bool {
    if matches!(kill(Pid::from_raw(-(pgid as i32)), None), Err(Errno::ESRCH)) {
        return true;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    !entries.flatten().any(|entry| {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid pgrp ...: the fields after the last ')'.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
        fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z"
    })
}

/// Waits up to `limit` for the whole process group to be gone; returns how long it took.
pub fn wait_group_gone(pgid: u32, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if group_gone(pgid) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

pub fn shm_exists(name: &str) -> bool {
    Path::new("/dev/shm").join(name).exists()
}

/// Starts a simulated run whose child 0 hangs in the round-robin, and returns once every child has started
/// (a thread keeps reading its output): the moment to kill or interrupt the parent.
pub fn start_hanging_run(procs: u32) -> Child {
    let mut child = simulated("ok")
        .args(["--procs-per-device", &procs.to_string()])
        .env(FAULT, "child0@round-robin:hang")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the binary starts");
    let started = wait_for_lines(&mut child, "Starting on device", procs as usize, Duration::from_secs(10));
    assert_eq!(started, procs as usize, "not every child started");
    assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be interrupted");
    // Let the other children reach the barrier, where they wait for child 0.
    std::thread::sleep(Duration::from_millis(300));
    child
}

/// Reads the child's stdout on a thread of its own until `count` lines contain `needle` or `limit` passes;
/// returns how many did. The thread goes on draining the output, so that the child never blocks on it.
pub fn wait_for_lines(child: &mut Child, needle: &str, count: usize, limit: Duration) -> usize {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let needle = needle.to_owned();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains(&needle) {
                let _ = tx.send(());
            }
        }
    });
    let deadline = Instant::now() + limit;
    let mut seen = 0;
    while seen < count {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(()) => seen += 1,
            Err(_) => break,
        }
    }
    seen
}

/// The names in /dev/shm that a run of parent `pid` could leave: its segment's old name and the files the
/// driver makes for the events of the parent and of its children `children`.
pub fn leftovers(pid: u32, children: &[u32]) -> Vec<String> {
    let segment = format!("simpleIPCshm{pid}");
    let events: Vec<String> =
        std::iter::once(pid).chain(children.iter().copied()).map(|p| format!(".{p:x}.")).collect();
    std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| {
                    *name == segment
                        || (name.starts_with("cuda.shm.") && events.iter().any(|e| name.contains(e)))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that no process of the run of parent `pid` is left (within 3 s) and nothing of it in /dev/shm
/// (see [`assert_nothing_left`]), the driver's files of its children `children` included.
pub fn assert_clean(pid: u32, children: &[u32], what: &str) {
    assert!(wait_group_gone(pid, Duration::from_secs(3)).is_some(), "{what}: a process of run {pid} is left");
    assert_nothing_left(pid, children, what);
}

/// [`assert_clean`] for a run whose children's pids are not known (their driver files are looked for by the
/// parent's).
pub fn assert_run_clean(pid: u32, what: &str) {
    assert_clean(pid, &[], what);
}

/// Asserts that the run of parent `pid` (children `children`) leaves nothing in /dev/shm, waiting up to 3 s:
/// its guardian, in a session of its own, may still be at work after the run's processes are gone.
pub fn assert_nothing_left(pid: u32, children: &[u32], what: &str) {
    let start = Instant::now();
    while !leftovers(pid, children).is_empty() && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(leftovers(pid, children), Vec::<String>::new(), "{what}: run {pid} left files in /dev/shm");
}

/// The pids of the processes `pid` has started, and theirs, as /proc lists them now.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task")).into_iter().flatten().flatten();
        for task in tasks {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                todo.push(child);
            }
        }
    }
    found
}

/// The guardian the run of parent `pid` started (the child whose command line has `guardian`), once it
/// is there (up to 5 s).
pub fn guardian_of(pid: u32) -> Option<u32> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let found = descendants(pid).into_iter().find(|child| {
            std::fs::read(format!("/proc/{child}/cmdline"))
                .is_ok_and(|cmdline| cmdline.split(|&b| b == 0).any(|arg| arg == b"guardian"))
        });
        if found.is_some() {
            return found;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

/// Waits up to `limit` for process `pid` (not our child) to be gone; true if it is.
pub fn wait_pid_gone(pid: u32, limit: Duration) -> bool {
    let start = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(')').map_or("", |(_, rest)| rest.trim_start());
        if stat.is_empty() || state.starts_with('Z') || state.starts_with('X') {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The driver files of the events of processes whose pid number is `pid` in their namespace.
pub fn event_files_of_pid_number(pid: u32) -> Vec<String> {
    let prefix = format!("cuda.shm.0.{pid:x}.");
    std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| name.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether process `pid` is stopped (its state in /proc/<pid>/stat is `T`).
pub fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('T')))
        .unwrap_or(false)
}

/// The `--json` document at `path`, parsed: it must be one whole JSON object.
pub fn document(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {text}", path.display()));
    assert!(doc.is_object() && text.ends_with("}\n"), "{text}");
    doc
}

/// What turns a skipped test into a failure: a comma-separated list of what this host is known to have
/// (`namespaces`, `root`, `nobody`, `setpriv`, `python3`, `terminal`, `no-gpu-driver`, or `all`). `.ci/run`
/// sets it, so that a test that would skip there for want of one fails instead of passing unseen.
pub const REQUIRE: &str = "SIMPLE_IPC_REQUIRE";

/// Says that a test is skipped, for want of `needs`: `why`, which starts with the test's name. Panics
/// instead where [`REQUIRE`] says the host has `needs`.
pub fn skipped(needs: &str, why: impl std::fmt::Display) {
    let required = std::env::var(REQUIRE).unwrap_or_default();
    if required.split(',').map(str::trim).any(|r| r == needs || r == "all") {
        panic!("{REQUIRE}={required} says this host has {needs}, but a test would be skipped: {why}");
    }
    eprintln!("SKIPPED {why}");
}

/// The value after `option` in `args`.
pub fn value_of<'a>(args: &'a [String], option: &str) -> Option<&'a str> {
    args.iter().position(|a| a == option).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// `args` with the socket of `--serve` or `--join` moved to `socket`.
pub fn at_socket(args: &[String], socket: &Path) -> Vec<String> {
    let mut args = args.to_vec();
    for option in ["--serve", "--join"] {
        if let Some(i) = args.iter().position(|a| a == option) {
            args[i + 1] = socket.display().to_string();
        }
    }
    args
}

/// A stand-in for NVIDIA's MPS control daemon as simple-ipc can tell it: a copy of python3 named
/// `nvidia-cuda-mps-control` that listens on a `SOCK_SEQPACKET` socket named `control` in `dir` (as the
/// daemon does on the H200 host, driver 580) until it is killed. Needs python3 (CI has it).
#[allow(dead_code)]
pub fn stand_in_mps_daemon(dir: &std::path::Path, program_dir: &std::path::Path) -> std::process::Child {
    stand_in_mps_daemon_of(dir, program_dir, None)
}

/// Copies the executable `from` to `to`, and returns once `to` can be run (`probe`, its arguments for a run
/// that does nothing): a process another test thread forks while the copy is being written inherits the
/// copy's writable descriptor until it execs, and running the copy meanwhile fails with ETXTBSY ("Text file
/// busy"). Once one run has started, none holds it: the copy's descriptor is closed, and nothing forked
/// later can inherit it.
pub fn copy_executable(from: impl AsRef<Path>, to: impl AsRef<Path>, probe: &[&str]) {
    let to = to.as_ref();
    std::fs::copy(from, to).unwrap();
    let since = Instant::now();
    loop {
        match Command::new(to).args(probe).stdin(Stdio::null()).output() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && since.elapsed() < Duration::from_secs(5) =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("running the copy {}: {e}", to.display()),
            Ok(_) => return,
        }
    }
}

/// [`stand_in_mps_daemon`], run as `uid` (and its group) where one is given: another user's daemon.
pub fn stand_in_mps_daemon_of(
    dir: &std::path::Path,
    program_dir: &std::path::Path,
    uid: Option<u32>,
) -> std::process::Child {
    let python = Command::new("python3")
        .args(["-c", "import os, sys; print(os.path.realpath(sys.executable))"])
        .output()
        .expect("python3, for a stand-in of NVIDIA's daemon");
    let program = program_dir.join("nvidia-cuda-mps-control");
    copy_executable(String::from_utf8_lossy(&python.stdout).trim(), &program, &["-c", ""]);
    let script = "import socket, sys, time\n\
                  s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
                  s.bind(sys.argv[1]); s.listen(64); print('ready', flush=True)\n\
                  while True: time.sleep(1)\n";
    let mut daemon = Command::new(&program);
    daemon.args(["-c", script]).arg(dir.join("control")).stdin(Stdio::null()).stdout(Stdio::piped());
    if let Some(uid) = uid {
        daemon.uid(uid).gid(uid);
    }
    let mut daemon = daemon.spawn().unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(daemon.stdout.take().unwrap()), &mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready", "the stand-in daemon listens");
    daemon
}

/// A /dev/shm of a test's own: a tmpfs mounted in a mount namespace that a holder process keeps (it ends
/// when its standard input closes: when this is dropped, or when the test process dies). Runs enter that
/// namespace, and the test reads the tmpfs through the holder's root (`/proc/PID/root/dev/shm`).
pub struct OwnDevShm {
    pub holder: Child,
}

impl OwnDevShm {
    /// `None` where this machine cannot make one (not root, no unshare(1)); calls `skipped` then.
    pub fn new(test: &str) -> Option<Self> {
        Self::make().map_err(|why| skipped("namespaces", format!("{test}: {why}"))).ok()
    }

    /// One where this machine can make it: a test that only prefers one (its runs would do on the host's
    /// /dev/shm, alone on the machine) goes on without.
    pub fn where_possible() -> Option<Self> {
        Self::make().ok()
    }

    fn make() -> Result<Self, String> {
        let script = "mount -t tmpfs -o mode=1777,size=64m tmpfs /dev/shm && echo ready && read _";
        let holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let mut holder = match holder {
            Ok(holder) => Self { holder },
            Err(e) => return Err(format!("unshare(1) does not start: {e}")),
        };
        let mut ready = String::new();
        let stdout = holder.holder.stdout.as_mut().expect("piped");
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut ready);
        match ready.trim() {
            "ready" => Ok(holder),
            _ => Err("no mount namespace with a tmpfs here (needs root)".to_owned()),
        }
    }

    /// The tmpfs, as this process sees it.
    pub fn dir(&self) -> std::path::PathBuf {
        format!("/proc/{}/root/dev/shm", self.holder.id()).into()
    }

    /// `program` in this /dev/shm's mount namespace (nsenter execs it: its pid is the program's).
    pub fn enter(&self, program: &Path) -> Command {
        let mut command = Command::new("nsenter");
        command.arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id())).arg("--").arg(program);
        command
    }
}

impl Drop for OwnDevShm {
    fn drop(&mut self) {
        drop(self.holder.stdin.take()); // `read` ends, and with it the holder, its namespace and the tmpfs
        let _ = self.holder.wait();
    }
}
