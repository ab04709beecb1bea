//! `--isolate` on simulated GPUs, with real namespaces (root, or user namespaces): each boundary of a
//! container gives the driver's answer with its cause and the least sharing that fixes it; what a user can
//! get wrong is named (the kinds, a TMPDIR, a PID namespace without its own /proc, a socket under /dev/shm);
//! the document is written where the user asked; the run admits only the processes it started and checks
//! their buffers itself. Where this host gives no namespaces, each test says it was skipped; the tests take
//! turns (`common::isolate`).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::isolate::{
    ONE_AT_A_TIME, Tmp, assert_no_driver_files, dev_shm, isolated, isolated_turn, namespaces_here, run,
};
use common::{FAULT, SIMULATE, bin, text};

/// The mounts this process sees: an isolated run's mounts (its /dev/shm, its /proc) must stay in its own
/// mount namespace.
fn mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo").map_or(0, |m| m.lines().count())
}

/// Each boundary on its own: the driver's error, which handle, the cause and the fix, and nothing else
/// advised; what needs no such handle passes.
#[test]
fn each_boundary_names_its_cause_and_the_least_sharing_that_fixes_it() {
    let Some(_turn) = isolated_turn("each_boundary_names_its_cause_and_the_least_sharing_that_fixes_it")
    else {
        return;
    };
    let mounts_before = mounts();
    let cases: &[(&[&str], Option<&[&str]>)] = &[
        // Both pid 2: the driver takes the legacy handle for one of its own.
        (
            &["--isolate", "pid"],
            Some(&["CUDA_ERROR_INVALID_CONTEXT", "both pid 2", "--pid=container", "--ipc vmm"]),
        ),
        (
            &["--isolate", "pid", "--ipc", "vmm"],
            Some(&["cuIpcOpenEventHandle", "CUDA_ERROR_INVALID_CONTEXT", "--sync memops"]),
        ),
        (&["--isolate", "pid", "--ipc", "vmm", "--sync", "memops"], None),
        // Other pid numbers: fine.
        (&["--isolate", "joiners:pid"], None),
        // Its own /dev/shm: the legacy event's file is not there.
        (&["--isolate", "shm"], Some(&["CUDA_ERROR_MAP_FAILED", "share /dev/shm", "--ipc=container"])),
        (&["--isolate", "shm", "--sync", "memops"], None),
        (&["--isolate", "net,ipc,uts,cgroup", "--procs-per-device", "3"], None),
    ];
    // A user namespace of its own: the simulation cannot open another process's memory from there (the
    // driver's kernel module can): a limit of the test's, waived as "not simulated", never a failure.
    let tmp = Tmp::new("boundary-user");
    let (_, out) = run(&tmp, &["--isolate", "user"]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    let verdict = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned();
    assert!(verdict.starts_with("WAIVED") && verdict.contains("not simulated: cuIpcOpenMemHandle"), "{said}");
    assert!(!said.contains("FAILED"), "{said}");
    for (args, failure) in cases {
        let tmp = Tmp::new("boundary");
        let (pid, out) = run(&tmp, args);
        let said = text(&out);
        match failure {
            None => assert_eq!(out.status.code(), Some(0), "{args:?} passes: {said}"),
            Some(needles) => {
                assert_eq!(out.status.code(), Some(1), "{args:?} fails: {said}");
                for needle in *needles {
                    assert!(said.contains(needle), "{args:?} says {needle:?}: {said}");
                }
                // --ipc=host is one way to share /dev/shm, said only where /dev/shm is the boundary.
                if !args.contains(&"shm") {
                    assert!(!said.contains("--ipc=host"), "{args:?}: no blanket --ipc=host: {said}");
                }
            }
        }
        assert!(said.contains("isolated") || failure.is_some(), "{args:?}: the verdict says how: {said}");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "{args:?}: the socket's directory is gone");
        assert_no_driver_files(pid, &format!("{args:?}"));
        assert_eq!(mounts(), mounts_before, "{args:?}: a mount of the run's reached this namespace");
    }
    // The cause and the fix come back from the joiner that met them, into the server's --json document.
    let tmp = Tmp::new("boundary-json");
    let json = tmp.path().join("run.json").display().to_string();
    let (_, out) = run(&tmp, &["--isolate", "shm", "--json", &json]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(doc["cause"].as_str().is_some_and(|c| c.contains("this process has another")), "{doc}");
    assert!(doc["fix"].as_str().is_some_and(|f| f.starts_with("share /dev/shm")), "{doc}");
    // ... and the driver's refusal, as typed facts (what the container matrix reads).
    let refused = &doc["refused"];
    assert_eq!(refused["call"], "cuIpcOpenEventHandle", "{doc}");
    assert_eq!(
        (refused["error"].as_str(), refused["code"].as_u64()),
        (Some("CUDA_ERROR_MAP_FAILED"), Some(205))
    );
    assert_eq!(
        (&refused["event"], &refused["beyond_the_simulation"]),
        (&serde_json::json!(true), &serde_json::json!(false))
    );
    assert!(refused["fix"].as_str().is_some_and(|f| f.starts_with("share /dev/shm")), "{doc}");
    // The libraries again, from what the run measured: PyTorch's shares open the legacy event first.
    let after =
        doc["placement"]["processes"][0]["libraries_measured"].as_array().cloned().unwrap_or_default();
    let path = |name: &str| after.iter().find(|row| row["path"] == name).cloned().unwrap_or_default();
    for name in ["PyTorch CUDA IPC", "PyTorch expandable_segments"] {
        assert_eq!(path(name)["verdict"], "fails", "{name}: {doc}");
        assert_eq!(
            path(name)["detail"],
            "its legacy event: CUDA_ERROR_MAP_FAILED, measured",
            "{name}: {doc}"
        );
    }
    assert!(text(&out).contains("The libraries, from what this run measured:\n"), "{}", text(&out));
}

/// `--json` under an isolation of the parent is written where the user asked, by the process outside, in
/// the user's own namespaces: not into the run's private /dev/shm, and with the user's rights (a user
/// namespace's root may not write in another user's 0700 directory, which root outside may). The verdict
/// comes after it.
#[test]
fn the_document_is_written_where_the_user_asked_by_the_process_outside() {
    let Some(_turn) = isolated_turn("the_document_is_written_where_the_user_asked_by_the_process_outside")
    else {
        return;
    };
    let tmp = Tmp::new("document");
    let mut cases: Vec<(&str, std::path::PathBuf)> = ["shm", "container", "pid,shm,user"]
        .iter()
        .map(|isolate| {
            let name =
                format!("simple-ipc-test-document-{}-{}.json", std::process::id(), isolate.replace(',', "-"));
            (*isolate, Path::new("/dev/shm").join(name))
        })
        .collect();
    // As the runs see it (the suite's own /dev/shm) and as this test does.
    let seen = |path: &Path| match path.strip_prefix("/dev/shm") {
        Ok(name) => dev_shm().join(name),
        Err(_) => path.to_path_buf(),
    };
    if nix::unistd::geteuid().is_root() {
        let theirs = tmp.path().join("nobody");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&theirs, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        cases.push(("user", theirs.join("run.json")));
    }
    for (isolate, path) in cases {
        let _gone = common::removed_at_end(seen(&path));
        let path_arg = path.display().to_string();
        let args = ["--isolate", isolate, "--ipc", "vmm", "--sync", "memops", "--json", &path_arg];
        let (_, out) = run(&tmp, &args);
        assert_eq!(out.status.code(), Some(0), "{isolate}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.lines().last().unwrap_or_default();
        assert!(last.starts_with("PASSED") && last.contains("isolated"), "{isolate}: {stdout}");
        assert_eq!(stdout.matches("PASSED").count(), 1, "said once, by the process outside: {stdout}");
        let written =
            std::fs::read_to_string(seen(&path)).unwrap_or_else(|e| panic!("{isolate}: {path_arg}: {e}"));
        let doc: serde_json::Value = serde_json::from_str(&written).unwrap();
        assert_eq!((doc["status"].as_str(), doc["exit_status"].as_u64()), (Some("passed"), Some(0)), "{doc}");
        assert!(doc["run"]["processes"].as_u64().is_some(), "the run's own results: {doc}");
        let summary = doc["summary"].as_str().unwrap_or("no summary");
        assert!(last.contains(summary) && summary.contains("isolated"), "the run's summary: {doc}");
    }
}

/// A TMPDIR the socket's directory cannot be made in (net namespaces of their own need one) is an error
/// that names it, at once, not a retry without end.
#[test]
fn a_tmpdir_that_takes_no_directory_is_named() {
    let tmp = Tmp::new("no-tmpdir");
    let mut command = isolated(&tmp, &["--isolate", "net"]);
    command.env("TMPDIR", tmp.path().join("absent"));
    let out = command.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("making a private directory in"), "{}", text(&out));
}

/// Another process of the same user that finds an isolated run's socket (in /proc/net/unix) and asks to
/// join takes no place: the run admits only the processes it started. The run passes, and says whom it
/// refused.
#[test]
fn a_stranger_at_an_isolated_runs_socket_is_refused() {
    use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, connect, send, socket};
    let Some(_turn) = isolated_turn("a_stranger_at_an_isolated_runs_socket_is_refused") else { return };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stranger = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut tried, mut held) = (std::collections::BTreeSet::new(), Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
                for fields in table.lines().skip(1).map(|l| l.split_whitespace().collect::<Vec<_>>()) {
                    let Some(name) = fields.get(7).and_then(|n| n.strip_prefix("@simple-ipc-2-")) else {
                        continue;
                    };
                    if fields[5] != "01" || !tried.insert(name.to_owned()) {
                        continue;
                    }
                    let fd = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)
                        .unwrap();
                    let address = UnixAddr::new_abstract(format!("simple-ipc-2-{name}").as_bytes()).unwrap();
                    if connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &address).is_ok() {
                        let _ = send(std::os::fd::AsRawFd::as_raw_fd(&fd), b"SIPCHELO", MsgFlags::empty());
                        held.push(fd);
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            tried.len()
        })
    };
    let tmp = Tmp::new("stranger");
    let (_, out) =
        run(&tmp, &["--isolate", "pid", "--ipc", "vmm", "--sync", "memops", "--procs-per-device", "2"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let tried = stranger.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "the run is its own processes': {}", text(&out));
    // (A run faster than the stranger's look leaves it nothing to try: then there is nothing to refuse.)
    eprintln!("the stranger tried {tried} socket(s)");
    if tried > 0 {
        assert!(text(&out).contains("admits only the processes it started"), "{}", text(&out));
    }
}

/// A user who is not root gets a user namespace with any isolation (the kernel gives the others only inside
/// one), and the verdict says so. Needs root (to become `nobody`) and setpriv(1); elsewhere it says it was
/// skipped.
#[test]
fn a_user_who_is_not_root_is_told_of_the_user_namespace() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if !nix::unistd::geteuid().is_root()
        || !namespaces_here("a_user_who_is_not_root_is_told_of_the_user_namespace")
    {
        common::skipped(
            "root",
            "a_user_who_is_not_root_is_told_of_the_user_namespace: needs root to become nobody",
        );
        return;
    }
    let tmp = Tmp::new("nobody");
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let copy = tmp.path().join("simple-ipc");
    common::copy_executable(bin(), &copy, &["--version"]);
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&copy)
        .args(["--isolate", "pid", "--ipc", "vmm", "--sync", "memops", "-q"])
        .current_dir("/")
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::null());
    let Ok(out) = command.output() else {
        common::skipped("setpriv", "a_user_who_is_not_root_is_told_of_the_user_namespace: no setpriv here");
        return;
    };
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("isolated (pid, in a user namespace: not root)"), "{}", text(&out));
}

/// What a user can get wrong is a usage error that says what it takes.
#[test]
fn isolation_kinds_are_checked_as_typed() {
    let tmp = Tmp::new("usage");
    for (args, needle) in [
        (&["--isolate", "docker"][..], "'docker' is no kind of namespace"),
        (&["--isolate", "pid", "--serve", "@x"], "cannot be used with"),
        (&["--isolate", "pid", "--bench"], "cannot be used with"),
        (&["--isolated", "pid"], "unexpected argument '--isolated'"),
    ] {
        let (_, out) = run(&tmp, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(needle), "{args:?} says {needle:?}: {}", text(&out));
    }
}

/// A PID namespace without a /proc of its own: the CUDA driver's cuInit answers
/// CUDA_ERROR_OPERATING_SYSTEM there (measured on the H200 host), as the simulation does, and the run says
/// why and what fixes it.
#[test]
fn a_pid_namespace_without_its_own_proc_is_named() {
    let tmp = Tmp::new("proc");
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork"])
        .arg(bin())
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .env("TMPDIR", tmp.path());
    let Ok(out) = command.stdin(Stdio::null()).output() else {
        common::skipped("namespaces", "a_pid_namespace_without_its_own_proc_is_named: no unshare here");
        return;
    };
    let said = text(&out);
    if said.contains("unshare failed") || said.contains("Operation not permitted") {
        common::skipped("namespaces", format!("a_pid_namespace_without_its_own_proc_is_named: {said}"));
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{said}");
    for needle in ["CUDA_ERROR_OPERATING_SYSTEM", "/proc is another namespace's", "--mount-proc"] {
        assert!(said.contains(needle), "says {needle:?}: {said}");
    }
}

/// The parent of an isolated run checks every buffer itself: a process in namespaces of its own that did
/// nothing, yet marks itself finished and says it ended well (the `lie` fault), fails the run.
#[test]
fn an_isolated_process_that_lies_cannot_pass_the_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !namespaces_here("an_isolated_process_that_lies_cannot_pass_the_run") {
        return;
    }
    let tmp = Tmp::new("liar");
    let mut command = isolated(&tmp, &["--isolate", "joiners:pid", "--timeout", "20"]);
    command.env(FAULT, "child0@round-robin:lie");
    let out = common::run(&mut command);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("the parent's own check of every buffer failed"), "{said}");
    let (_, honest) = run(&tmp, &["--isolate", "joiners:pid"]);
    assert_eq!(honest.status.code(), Some(0), "{}", text(&honest));
    assert!(text(&honest).contains("every buffer holds the round-robin's result, checked by the parent in "));
}

/// TMPDIR under /dev/shm with an isolation that gives the processes a /dev/shm of their own (`container`):
/// the run's socket could not reach them, and the run says so with the fix, before it starts anything,
/// not "a process started in namespaces of its own ended with exit status 1".
#[test]
fn a_socket_under_dev_shm_for_processes_with_their_own_is_named() {
    let Some(_turn) = isolated_turn("a_socket_under_dev_shm_for_processes_with_their_own_is_named") else {
        return;
    };
    let tmp = Tmp::new("tmpdir-shm");
    let out = isolated(&tmp, &["--isolate", "container"]).env("TMPDIR", "/dev/shm").output().unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("set TMPDIR to a directory outside /dev/shm"), "{said}");
    assert!(!said.contains("ended with exit status"), "{said}");
}
