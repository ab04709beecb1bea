//! Runs in PID namespaces of their own that share /dev/shm (containers with `--ipc=host`, pods with
//! `hostIPC`), on simulated GPUs that name their event files the way the CUDA driver does: by the pid the
//! exporter has in its namespace, so that two parents that are both pid 1 make the same names. Each run
//! passes or fails naming the collision; none removes another's files; `--sync memops` makes no event file
//! at all, so such runs all pass. Needs root, unshare(1) and nsenter(1): where one is missing a test says it
//! was skipped and asserts nothing (and fails where CI says the host has them).
//!
//! Each test's runs share a /dev/shm of the test's own (a tmpfs in a mount namespace that a holder process
//! keeps), as the containers of one pod share theirs: what they make or remove there is theirs alone, and
//! another suite or another run of the program on the machine, using the host's /dev/shm at the same time,
//! neither disturbs a test nor is disturbed by it.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{FAULT, OwnDevShm, SIMULATE, bin, text};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

impl OwnDevShm {
    /// `simple-ipc ARGS` as pid 1 of a PID namespace of its own (with its own /proc) whose /dev/shm is this
    /// one, in a process group of its own.
    fn run(&self, args: &[&str]) -> Child {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id()))
            .args(["--", "unshare", "--pid", "--fork", "--mount-proc"])
            .arg(bin())
            .args(args)
            .env(SIMULATE, "ok")
            .env_remove(FAULT)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        command.spawn().expect("nsenter starts")
    }

    /// The files that processes of pid numbers 1 to 9 (those of a run in a namespace of its own) have here.
    fn namespace_event_files(&self) -> Vec<String> {
        let names: Vec<String> = std::fs::read_dir(self.dir())
            .expect("the test's /dev/shm")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        (1..10u32)
            .flat_map(|pid| {
                let prefix = format!("cuda.shm.0.{pid:x}.");
                names.iter().filter(move |name| name.starts_with(&prefix)).cloned()
            })
            .collect()
    }

    /// `count` runs at once, each in its own PID namespace, all sharing this /dev/shm.
    fn at_once(&self, count: usize, args: &[&str]) -> Vec<Output> {
        let runs: Vec<Child> = (0..count).map(|_| self.run(args)).collect();
        runs.into_iter().map(|run| run.wait_with_output().expect("the run ends")).collect()
    }
}

/// The tests of this file share the pid numbers of their namespaces' processes, so they run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A /dev/shm of the test's own where PID namespaces can be made here (root, unshare(1) and nsenter(1));
/// holds the other tests of this file back while the returned guard lives.
fn namespaces_work(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, OwnDevShm)> {
    let alone = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let works = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        common::skipped("namespaces", format!("{test}: no PID namespaces here (needs root and unshare(1))"));
        return None;
    }
    Some((alone, OwnDevShm::new(test)?))
}

/// Two and three runs at once, with every mechanism and the interprocess events: each passes, or fails
/// with the message that names the collision of the driver's file names; none passes by ordering with
/// another run's event unnoticed, and /dev/shm holds none of their files afterwards.
#[test]
fn runs_in_pid_namespaces_sharing_dev_shm_pass_or_name_the_collision() {
    let Some((_alone, shm)) =
        namespaces_work("runs_in_pid_namespaces_sharing_dev_shm_pass_or_name_the_collision")
    else {
        return;
    };
    assert_eq!(
        shm.namespace_event_files(),
        Vec::<String>::new(),
        "a namespace's event files before the test"
    );
    let mut collisions = 0;
    for mechanism in ["legacy", "vmm", "pool"] {
        for count in [2, 3] {
            for out in shm.at_once(count, &["--procs-per-device", "3", "--ipc", mechanism]) {
                let all = text(&out);
                assert!(all.contains("PP: lshmName = simpleIPCshm1\n"), "the parent is pid 1: {all}");
                match out.status.code() {
                    Some(0) => assert!(!all.contains("failed"), "{mechanism}: {all}"),
                    Some(1) => {
                        // The name made again by another run's parent (pid 1 too), already removed by it, or
                        // being made by it.
                        let named = all.contains("the event opened is another process's")
                            && all.contains("same pid number (1)")
                            || all
                                .contains("is gone from the /dev/shm this process shares with its exporter")
                            || all.contains("is another file now");
                        assert!(
                            named
                                && all.contains(
                                    "Processes of the same pid number in PID namespaces that share"
                                )
                                && all.contains("--sync memops"),
                            "{mechanism}: a failure that does not name the collision: {all}"
                        );
                        collisions += 1;
                    }
                    other => panic!("{mechanism}: status {other:?}: {all}"),
                }
            }
            assert_eq!(
                shm.namespace_event_files(),
                Vec::<String>::new(),
                "{mechanism}: files left in /dev/shm"
            );
        }
    }
    // Runs that start together make the same names at the same time: the collision was exercised.
    assert!(collisions > 0, "no run ever met another's event file: the test tested nothing");
}

/// `--sync memops` exports and opens no interprocess event: no `cuda.shm.*` file appears at any moment
/// (inotify sees every name made in /dev/shm), and three runs at once all pass, with every mechanism that
/// has memops.
#[test]
fn memops_runs_make_no_event_file_and_all_pass_side_by_side() {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let Some((_alone, shm)) = namespaces_work("memops_runs_make_no_event_file_and_all_pass_side_by_side")
    else {
        return;
    };
    for mechanism in ["legacy", "vmm"] {
        let watch = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
        watch.add_watch(&shm.dir(), AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO).unwrap();
        for out in shm.at_once(3, &["--procs-per-device", "4", "--ipc", mechanism, "--sync", "memops"]) {
            assert_eq!(out.status.code(), Some(0), "{mechanism}: {}", text(&out));
        }
        let made: Vec<String> = std::iter::from_fn(|| watch.read_events().ok())
            .flatten()
            .filter_map(|event| event.name?.into_string().ok())
            .filter(|name| (1..10).any(|pid| name.starts_with(&format!("cuda.shm.0.{pid:x}."))))
            .collect();
        assert_eq!(made, Vec::<String>::new(), "{mechanism}: memops runs made event files");
    }
}

/// Nothing of another run is removed: files of the driver's shape for pid numbers the run's processes have
/// (1 for its parent, 2 to 6 for its guardian and children) stay, whether the run passes or is killed with
/// its whole namespace.
#[test]
fn a_run_in_a_pid_namespace_removes_no_file_of_another() {
    let Some((_alone, shm)) = namespaces_work("a_run_in_a_pid_namespace_removes_no_file_of_another") else {
        return;
    };
    let decoys = ["cuda.shm.0.1.777", "cuda.shm.0.2.1", "cuda.shm.0.5.1", "cuda.shm.0.6.1"];
    for name in decoys {
        std::fs::write(shm.dir().join(name), b"another run's").unwrap();
    }
    let out = shm.at_once(1, &["--procs-per-device", "4"]).remove(0);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    let mut killed = shm.run(&["--procs-per-device", "4"]);
    let started = common::wait_for_lines(&mut killed, "Starting on device", 4, Duration::from_secs(10));
    assert_eq!(started, 4);
    kill(Pid::from_raw(-(killed.id() as i32)), Signal::SIGKILL).unwrap();
    killed.wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));

    for name in decoys {
        let path = shm.dir().join(name);
        assert_eq!(std::fs::read(&path).ok().as_deref(), Some(&b"another run's"[..]), "{name} was removed");
    }
    // Killed with its namespace (its guardian too, as pid 1 took them all), the run may leave its own: they
    // go with the test's tmpfs.
}
