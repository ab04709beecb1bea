//! Helpers of the `--isolate` tests (`tests/isolate_*.rs`): isolated runs on simulated GPUs, with real
//! namespaces (root, or user namespaces), in a TMPDIR and a /dev/shm of the suite's own, and what they
//! leave: processes (found by a mark in their environment), socket directories, driver files.
//!
//! The tests take turns ([`isolated_turn`], [`ONE_AT_A_TIME`]): isolated runs in PID namespaces that share
//! /dev/shm all have pid 2, and two at once would meet each other's driver files (which the program then
//! names as a collision, but which is not what these tests are about). The lock is one test binary's:
//! `cargo test` runs the binaries one after another, and where they run at once (nextest) each process's
//! runs have a /dev/shm of their own where the host can make one ([`dev_shm`]).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::{FAULT, SIMULATE, bin, text};

pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The /dev/shm of this suite's runs: a tmpfs of its own (`common::OwnDevShm`), where this host can make one.
/// Every isolated run's processes are pid 2 in their namespaces, and the driver names an event's file by its
/// exporter's pid: another suite's isolated runs, or another program's, in the host's /dev/shm at the same
/// time would collide with these runs' files, or be taken for files they left.
static OWN_DEV_SHM: std::sync::OnceLock<Option<super::OwnDevShm>> = std::sync::OnceLock::new();

fn own_dev_shm() -> Option<&'static super::OwnDevShm> {
    OWN_DEV_SHM.get_or_init(super::OwnDevShm::where_possible).as_ref()
}

/// The /dev/shm the runs see, as this process sees it.
pub fn dev_shm() -> std::path::PathBuf {
    own_dev_shm().map_or_else(|| "/dev/shm".into(), super::OwnDevShm::dir)
}

/// This test's turn among those that isolate (one at a time), where this host gives namespaces
/// ([`namespaces_here`]); `None` where it gives none (the test then returns: a skip, which fails where
/// `SIMPLE_IPC_REQUIRE` names namespaces).
pub fn isolated_turn(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    namespaces_here(test).then_some(turn)
}

/// A TMPDIR of the test's own, so that it can see whether a run left its socket directory behind; removed
/// with what it holds when it drops.
pub struct Tmp(tempfile::TempDir);

impl Tmp {
    pub fn new(name: &str) -> Self {
        Self(super::scratch(&format!("isolate-{name}")))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    pub fn entries(&self) -> Vec<String> {
        std::fs::read_dir(self.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect()
    }
}

/// The driver's files in /dev/shm now that an isolated run could have made: those of pid number 2 (a
/// process in a PID namespace of its own) and of `top` (a parent on the host). Other runs on this machine
/// have files of their own, and are not this test's business.
pub fn driver_files(top: u32) -> Vec<String> {
    let ours = [".2.".to_owned(), format!(".{top:x}.")];
    let mut names: Vec<String> = std::fs::read_dir(dev_shm())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("cuda.shm.") && ours.iter().any(|o| n.contains(o.as_str())))
        .collect();
    names.sort();
    names
}

/// Waits up to 3 s for the driver's files of the run of `top` to be gone (a guardian may still be at work).
pub fn assert_no_driver_files(top: u32, what: &str) {
    let start = Instant::now();
    while !driver_files(top).is_empty() && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(driver_files(top), Vec::<String>::new(), "{what}: the run left driver files in /dev/shm");
}

pub fn isolated(tmp: &Tmp, args: &[&str]) -> Command {
    let mut command = own_dev_shm().map_or_else(|| Command::new(bin()), |shm| shm.enter(&bin()));
    command
        .args(args)
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null())
        .process_group(0);
    command
}

/// Runs to the end; returns the run's pid with its output.
pub fn run(tmp: &Tmp, args: &[&str]) -> (u32, Output) {
    super::run_with_pid(&mut isolated(tmp, args))
}

/// Whether this host gives the namespaces, asked of the kernel, not of the program: where `unshare(1)` can
/// make them, the program must too, and a run that waives there fails the test (a program that always
/// waived must not pass by skipping). Where `unshare` is missing, the program's own answer decides.
pub fn namespaces_here(test: &str) -> bool {
    let kernel = Command::new("unshare")
        .args(["--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--net", "--ipc", "--uts"])
        .args(["--cgroup", "true"])
        .stdin(Stdio::null())
        .output();
    let tmp = Tmp::new("probe");
    let (_, out) =
        run(&tmp, &["--isolate", "pid,shm,net,ipc,uts,cgroup,user", "--sync", "memops", "--ipc", "vmm"]);
    match (kernel, out.status.code()) {
        (Ok(kernel), Some(2)) if !kernel.status.success() => {
            super::skipped("namespaces", format!("{test}: this host gives no namespaces: {}", text(&out)));
            false
        }
        (Err(_), Some(2)) => {
            super::skipped(
                "namespaces",
                format!("{test}: no unshare(1), and the program waives: {}", text(&out)),
            );
            false
        }
        (_, code) => {
            assert_eq!(code, Some(0), "every namespace at once, by descriptor and memops: {}", text(&out));
            true
        }
    }
}

/// The pids of the processes whose environment has `mark`: every process of one run, wherever it is.
pub fn marked(mark: &str) -> Vec<u32> {
    let needle = format!("SIMPLE_IPC_TEST_MARK={mark}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

/// Kills every process of the run marked `mark` when dropped: a test that fails half-way leaves none.
pub struct EndMarked(pub String);

impl Drop for EndMarked {
    fn drop(&mut self) {
        for pid in marked(&self.0) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// The child's exit status, if it ends within `limit` (it is left running otherwise).
pub fn wait_at_most(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn wait_all_gone(mark: &str, limit: Duration) -> Vec<u32> {
    let start = Instant::now();
    while !marked(mark).is_empty() && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(10));
    }
    marked(mark)
}

/// The children of process `pid`, as /proc lists them.
pub fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// The state letter of process `pid` (`T` stopped), if it is there.
pub fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}
