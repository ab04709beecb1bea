//! `--isolate` on simulated GPUs, with real namespaces (root, or user namespaces): each boundary of a
//! container gives the driver's answer with its cause and the least sharing that fixes it, the container
//! matrix matches the table measured on the H200 host, and a run killed at any moment leaves no process, no
//! socket directory and no driver file. Where this host gives no namespaces, each test says it was skipped.
//!
//! The tests take turns: isolated runs in PID namespaces that share /dev/shm all have pid 2, and two at once
//! would meet each other's driver files (which the program then names as a collision, but which is not what
//! these tests are about).

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{FAULT, SIMULATE, bin, text};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The /dev/shm of this suite's runs: a tmpfs of its own (`common::OwnDevShm`), where this host can make one.
/// Every isolated run's processes are pid 2 in their namespaces, and the driver names an event's file by its
/// exporter's pid: another suite's isolated runs, or another program's, in the host's /dev/shm at the same
/// time would collide with these runs' files, or be taken for files they left.
static OWN_DEV_SHM: std::sync::OnceLock<Option<common::OwnDevShm>> = std::sync::OnceLock::new();

fn own_dev_shm() -> Option<&'static common::OwnDevShm> {
    OWN_DEV_SHM.get_or_init(common::OwnDevShm::where_possible).as_ref()
}

/// The /dev/shm the runs see, as this process sees it.
fn dev_shm() -> std::path::PathBuf {
    own_dev_shm().map_or_else(|| "/dev/shm".into(), common::OwnDevShm::dir)
}

/// This test's turn among those that isolate (one at a time), where this host gives namespaces
/// ([`namespaces_here`]); `None` where it gives none (the test then returns: a skip, which fails where
/// `SIMPLE_IPC_REQUIRE` names namespaces).
fn isolated_turn(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    namespaces_here(test).then_some(turn)
}

/// A TMPDIR of the test's own, so that it can see whether a run left its socket directory behind; removed
/// with what it holds when it drops.
struct Tmp(tempfile::TempDir);

impl Tmp {
    fn new(name: &str) -> Self {
        Self(common::scratch(&format!("isolate-{name}")))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn entries(&self) -> Vec<String> {
        std::fs::read_dir(self.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect()
    }
}

/// The driver's files in /dev/shm now that an isolated run could have made: those of pid number 2 (a
/// process in a PID namespace of its own) and of `top` (a parent on the host). Other runs on this machine
/// have files of their own, and are not this test's business.
fn driver_files(top: u32) -> Vec<String> {
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
fn assert_no_driver_files(top: u32, what: &str) {
    let start = Instant::now();
    while !driver_files(top).is_empty() && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(driver_files(top), Vec::<String>::new(), "{what}: the run left driver files in /dev/shm");
}

fn isolated(tmp: &Tmp, args: &[&str]) -> Command {
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
fn run(tmp: &Tmp, args: &[&str]) -> (u32, Output) {
    common::run_with_pid(&mut isolated(tmp, args))
}

/// Whether this host gives the namespaces, asked of the kernel, not of the program: where `unshare(1)` can
/// make them, the program must too, and a run that waives there fails the test (a program that always
/// waived must not pass by skipping). Where `unshare` is missing, the program's own answer decides.
fn namespaces_here(test: &str) -> bool {
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
            common::skipped("namespaces", format!("{test}: this host gives no namespaces: {}", text(&out)));
            false
        }
        (Err(_), Some(2)) => {
            common::skipped(
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

/// A matrix whose runs fail for another reason than the driver's refusal of a handle (no TMPDIR for the
/// socket's directory, a TMPDIR too long for a socket's path) is no table of this host: it fails, exit 1,
/// naming the cause, whatever the cells' messages say; the cells that ran are in its document as errors.
#[test]
fn a_matrix_whose_runs_fail_for_another_reason_than_a_refusal_fails_naming_it() {
    let Some(_turn) =
        isolated_turn("a_matrix_whose_runs_fail_for_another_reason_than_a_refusal_fails_naming_it")
    else {
        return;
    };
    let tmp = Tmp::new("matrix-broken");
    let long = tmp.path().join("x".repeat(110));
    std::fs::create_dir(&long).unwrap();
    for (tmpdir, cause) in
        [(tmp.path().join("absent"), "making a private directory in"), (long.clone(), "not a socket path")]
    {
        let json = tmp.path().join("matrix.json");
        let json_arg = json.display().to_string();
        let mut command = isolated(&tmp, &["--ipc", "all", "--isolate", "net", "--json", &json_arg]);
        let out = command.env("TMPDIR", &tmpdir).output().unwrap();
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "TMPDIR {}: {said}", tmpdir.display());
        let stdout = String::from_utf8_lossy(&out.stdout);
        let verdict = stdout.lines().last().unwrap_or_default();
        assert!(verdict.starts_with("FAILED (exit 1)") && verdict.contains(cause), "{verdict}: {said}");
        assert!(verdict.contains("own net / legacy memory"), "the cell is named: {verdict}");
        assert!(!said.contains("PASSED"), "{said}");
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(doc["status"], "failed", "{doc}");
        let cells = doc["matrix"].as_array().unwrap();
        let net = cells.iter().filter(|c| c["isolate"] == "net").collect::<Vec<_>>();
        assert!(net.iter().all(|c| c["result"] == "error"), "{net:?}");
        assert!(cells.iter().filter(|c| c["isolate"] == "none").all(|c| c["result"] != "error"), "{cells:?}");
        std::fs::remove_file(&json).unwrap();
        assert_eq!(std::fs::read_dir(&long).unwrap().count(), 0, "nothing is left in the long TMPDIR");
    }
}

/// The cells of the table, row by row, as the H200 host's driver answers (issue 16's table), and the notes.
#[test]
fn the_container_matrix_is_the_one_measured_on_the_h200_host() {
    let Some(_turn) = isolated_turn("the_container_matrix_is_the_one_measured_on_the_h200_host") else {
        return;
    };
    let tmp = Tmp::new("matrix");
    let json = tmp.path().join("matrix.json");
    let json_arg = json.display().to_string();
    let (pid, out) = run(&tmp, &["--ipc", "all", "--isolate", "container,user", "--json", &json_arg]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "a boundary the driver refuses is a fact, not a failure: {said}");
    let row = |title: &str| -> Vec<String> {
        let line = said
            .lines()
            .find(|l| l.starts_with(title) && !l.contains(" / "))
            .unwrap_or_else(|| panic!("a row {title:?}: {said}"));
        line[title.len()..].split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect()
    };
    let expect = |title: &str, cells: &[&str]| assert_eq!(row(title), cells, "row {title:?}: {said}");
    // The last column, "VMM fd by pidfd_getfd", is the kernel's (the simulation makes the calls for real):
    // ESRCH wherever the importer has a PID namespace of its own, EPERM where its CAP_SYS_PTRACE is a user
    // namespace's of its own.
    let same_pid =
        ["INVALID_CONTEXT", "INVALID_CONTEXT (event)", "ok", "INVALID_CONTEXT (event)", "waived", "ESRCH"];
    expect("same namespaces", &["ok", "ok", "ok", "ok", "waived", "ok"]);
    expect("own PID namespaces, other pid numbers", &["ok", "ok", "ok", "ok", "waived", "ESRCH"]);
    expect("own PID namespaces, the same pid number", &same_pid);
    expect("own /dev/shm", &["ok", "MAP_FAILED (event)", "ok", "MAP_FAILED (event)", "waived", "ok"]);
    expect("own SysV IPC, net, UTS, cgroup", &["ok", "ok", "ok", "ok", "waived", "ok"]);
    // The simulation opens legacy memory through /proc, which another user namespace may not; the driver's
    // kernel module can (the H200 host says ok).
    expect("own user namespace (root mapped)", &["not simulated", "ok", "ok", "ok", "waived", "EPERM"]);
    expect("Docker's default set (container)", &same_pid);
    for note in [
        "CUDA_ERROR_INVALID_CONTEXT opening a legacy memory handle",
        "CUDA_ERROR_MAP_FAILED opening a legacy event handle (own /dev/shm): what fixes it: share /dev/shm",
        "ESRCH from the kernel, fetching a descriptor by pidfd_getfd (own PID namespaces, other pid numbers; ",
        "what fixes it: one PID namespace for both (Docker --pid=container:NAME, Kubernetes \
         shareProcessNamespace: true), or --fds socket, which needs neither",
        "EPERM from the kernel, fetching a descriptor by pidfd_getfd (own user namespace (root mapped)): what \
         fixes it: one user namespace for both",
    ] {
        assert!(said.contains(note), "the notes say {note:?}: {said}");
    }
    assert!(!said.contains("--ipc=host or"), "no blanket advice: {said}");
    // The same cells in the --json document, as data.
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!((doc["mode"].as_str(), doc["status"].as_str()), (Some("container_matrix"), Some("passed")));
    let cells = doc["matrix"].as_array().unwrap();
    assert_eq!(cells.len(), 8 * 6, "every boundary by every handle");
    let cell = |boundary: &str, handle: &str| {
        cells.iter().find(|c| c["boundary"] == boundary && c["handle"] == handle).unwrap()
    };
    let shm_event = cell("own /dev/shm", "legacy event");
    assert_eq!(shm_event["error"], "CUDA_ERROR_MAP_FAILED");
    assert_eq!(shm_event["event_refused"], true);
    assert!(shm_event["fix"].as_str().unwrap().starts_with("share /dev/shm"), "{shm_event}");
    // The kernel's refusal is a refusal ("failed"), by its type, not a run that broke ("error").
    let by_pidfd = cell("own PID namespaces, the same pid number", "VMM fd by pidfd_getfd");
    let said_of = |key: &str| by_pidfd[key].as_str();
    assert_eq!((said_of("result"), said_of("error")), (Some("failed"), Some("ESRCH")), "{by_pidfd}");
    assert_eq!((said_of("ipc"), said_of("sync")), (Some("vmm"), Some("memops")), "{by_pidfd}");
    assert!(said_of("fix").unwrap_or("").contains("shareProcessNamespace: true"), "{by_pidfd}");
    std::fs::remove_file(&json).unwrap();
    assert_eq!(tmp.entries(), Vec::<String>::new(), "no socket directory is left");
    assert_no_driver_files(pid, "the matrix");
}

/// On a kernel without pidfd_getfd (the simulation's `no-pidfd`), the column "VMM fd by pidfd_getfd" is
/// waived in every row, with the reason, and the matrix stands on its other columns (exit 0).
#[test]
fn a_kernel_without_pidfd_getfd_waives_the_matrixs_pidfd_column() {
    let Some(_turn) = isolated_turn("a_kernel_without_pidfd_getfd_waives_the_matrixs_pidfd_column") else {
        return;
    };
    let tmp = Tmp::new("matrix-no-pidfd");
    let json = tmp.path().join("matrix.json");
    let mut command = isolated(&tmp, &["--ipc", "all", "--isolate", "pid", "--json"]);
    command.arg(&json).env(SIMULATE, "ok+no-pidfd");
    let (_, out) = common::run_with_pid(&mut command);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cells: Vec<&serde_json::Value> =
        doc["matrix"].as_array().unwrap().iter().filter(|c| c["handle"] == "VMM fd by pidfd_getfd").collect();
    assert_eq!(cells.len(), 3, "one a row: {doc}");
    assert!(cells.iter().all(|c| c["result"] == "waived"), "{doc}");
    assert!(said.contains("same namespaces / VMM fd by pidfd_getfd: waived"), "{said}");
    let vmm = doc["matrix"].as_array().unwrap().iter().find(|c| c["handle"] == "VMM fd").unwrap();
    assert_eq!(vmm["result"], "ok", "the socket needs no such call: {doc}");
    std::fs::remove_file(&json).unwrap();
}

/// The matrix runs each row as one run that tries every handle, the rows at once, in lanes, and says how
/// many; the rows whose exporters are in PID namespaces of their own with the host's /dev/shm (`pid`, and
/// the asked set `pid,net`) share one. The comparison's hook (`SIMPLE_IPC_MATRIX_SERIAL`) runs every cell
/// as a whole run of its own, one after another, as the matrix ran before, says so, and prints the same
/// table, notes and all, over every boundary of a container: one importer trying every handle changes no
/// cell.
#[test]
fn the_matrix_runs_its_rows_at_once_and_one_after_another_gives_the_same_table() {
    let Some(_turn) =
        isolated_turn("the_matrix_runs_its_rows_at_once_and_one_after_another_gives_the_same_table")
    else {
        return;
    };
    let tmp = Tmp::new("matrix-lanes");
    let table = |out: &Output| -> String {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let from = stdout.find("importer vs exporter").unwrap_or_else(|| panic!("a table: {}", text(out)));
        let verdict = stdout.rfind("PASSED").unwrap_or(stdout.len());
        stdout[from..verdict].to_owned()
    };
    let first = |out: &Output| {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        stdout.lines().find(|l| l.starts_with("The container matrix (")).unwrap_or_default().to_owned()
    };
    let lanes = isolated(&tmp, &["--ipc", "all", "--isolate", "pid,net"]).output().unwrap();
    assert_eq!(lanes.status.code(), Some(0), "{}", text(&lanes));
    // Rows: same namespaces, joiners:pid, pid, and the asked set pid,net: the last two in one lane.
    assert!(first(&lanes).contains("(4 boundaries"), "{}", first(&lanes));
    assert!(first(&lanes).ends_with("the rows in 3 lanes at once)"), "{}", first(&lanes));
    let args = ["--ipc", "all", "--isolate", "container,user", "--json"];
    let (rows_json, serial_json) = (tmp.path().join("rows.json"), tmp.path().join("serial.json"));
    let rows = isolated(&tmp, &args).arg(&rows_json).output().unwrap();
    assert_eq!(rows.status.code(), Some(0), "{}", text(&rows));
    assert!(first(&rows).contains("each row one isolated run that tries every handle"), "{}", first(&rows));
    let mut serial = isolated(&tmp, &args);
    let serial = serial.arg(&serial_json).env("SIMPLE_IPC_MATRIX_SERIAL", "1").output().unwrap();
    assert_eq!(serial.status.code(), Some(0), "{}", text(&serial));
    let said = first(&serial);
    assert!(said.ends_with("one after another: SIMPLE_IPC_MATRIX_SERIAL is set)"), "{said}");
    assert_eq!(table(&rows), table(&serial), "the same table");
    let cells = |path: &Path| -> serde_json::Value {
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        std::fs::remove_file(path).unwrap();
        doc["matrix"].clone()
    };
    let (by_row, by_cell) = (cells(&rows_json), cells(&serial_json));
    assert_eq!(by_row.as_array().map(Vec::len), Some(8 * 6), "{by_row}");
    assert_eq!(by_row, by_cell, "the same cells in the document, typed refusals and fixes");
    for refused in ["INVALID_CONTEXT (event)", "MAP_FAILED (event)", "ESRCH", "EPERM", "not simulated"] {
        assert!(table(&rows).contains(refused), "{refused}: {}", table(&rows));
    }
    // A device without stream memory operations: the columns ordered by them are waived in a row as their
    // runs are, though their handles would cross.
    let no_memops = |serial: bool| {
        let mut command = isolated(&tmp, &["--ipc", "all", "--isolate", "pid,shm"]);
        command.env(SIMULATE, "no-memops");
        if serial {
            command.env("SIMPLE_IPC_MATRIX_SERIAL", "1");
        }
        command.output().unwrap()
    };
    let (rows, serial) = (no_memops(false), no_memops(true));
    assert_eq!(table(&rows), table(&serial), "the same table without memops");
    let same = table(&rows).lines().find(|l| l.starts_with("same namespaces")).unwrap_or_default().to_owned();
    assert_eq!(
        same.split_whitespace().collect::<Vec<_>>(),
        ["same", "namespaces", "waived", "ok", "waived", "ok", "waived", "waived"]
    );
    assert_eq!(tmp.entries(), Vec::<String>::new(), "no socket directory is left");
}

/// The matrix stopped while its rows run (each process's cuInit slowed to a second, so that the rows'
/// exporters and importers are all under way): SIGTERM to it goes on to every row at once, and it ends as
/// stopped (143) within seconds, every process of every row gone, no socket directory and no driver file
/// left.
#[test]
fn a_matrix_stopped_while_its_rows_run_leaves_nothing() {
    let Some(_turn) = isolated_turn("a_matrix_stopped_while_its_rows_run_leaves_nothing") else { return };
    let tmp = Tmp::new("matrix-stopped");
    let cuda_files = || -> Vec<String> {
        let names =
            std::fs::read_dir(dev_shm()).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok());
        let mut names: Vec<String> = names.filter(|n| n.starts_with("cuda.shm.")).collect();
        names.sort();
        names
    };
    let before = cuda_files();
    let mark = format!("{}-matrix-stopped", std::process::id());
    let _end = EndMarked(mark.clone());
    let mut matrix = isolated(&tmp, &["--ipc", "all", "--isolate", "pid,shm,net"])
        .env(SIMULATE, "ok+slow-init")
        .env("SIMPLE_IPC_TEST_MARK", &mark)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // The matrix, and for each of its rows at least its run and the row's exporter or importer.
    assert!(marked(&mark).len() >= 6, "the rows are under way: {:?}", marked(&mark));
    nix::sys::signal::kill(Pid::from_raw(matrix.id() as i32), Signal::SIGTERM).unwrap();
    let status = wait_at_most(&mut matrix, Duration::from_secs(6));
    assert_eq!(status.and_then(|s| s.code()), Some(143), "stopped by SIGTERM, said as such");
    assert_eq!(wait_all_gone(&mark, Duration::from_secs(4)), Vec::<u32>::new(), "every process gone");
    assert_eq!(tmp.entries(), Vec::<String>::new(), "no socket directory is left");
    let start = Instant::now();
    while cuda_files() != before && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(cuda_files(), before, "no driver file is left");
}

/// The pids of the processes whose environment has `mark`: every process of one run, wherever it is.
fn marked(mark: &str) -> Vec<u32> {
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
struct EndMarked(String);

impl Drop for EndMarked {
    fn drop(&mut self) {
        for pid in marked(&self.0) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// The child's exit status, if it ends within `limit` (it is left running otherwise).
fn wait_at_most(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
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

fn wait_all_gone(mark: &str, limit: Duration) -> Vec<u32> {
    let start = Instant::now();
    while !marked(mark).is_empty() && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(10));
    }
    marked(mark)
}

/// A run held in its round-robin, then killed: by SIGKILL to its process group (the processes in
/// namespaces are in sessions of their own, reached through the process outside), or by SIGINT. Every
/// process is gone within 3 s, and nothing is left in /dev/shm or TMPDIR.
#[test]
fn killing_an_isolated_run_leaves_nothing() {
    let Some(_turn) = isolated_turn("killing_an_isolated_run_leaves_nothing") else { return };
    for (isolate, signal) in [
        ("pid", Signal::SIGKILL),
        ("joiners:pid", Signal::SIGKILL),
        ("container", Signal::SIGINT),
        ("shm", Signal::SIGKILL),
        // A socket in a directory (net namespaces of their own): gone once every process joined.
        ("net", Signal::SIGKILL),
    ] {
        let tmp = Tmp::new("killed");
        let mark = format!("{}-{isolate}-{signal}", std::process::id());
        let _end = EndMarked(mark.clone());
        // memops with vmm: passes across every boundary, so that the run is held, not failed.
        let mut child = isolated(
            &tmp,
            &[
                "--isolate",
                isolate,
                "--ipc",
                "vmm",
                "--sync",
                "memops",
                "--timeout",
                "0",
                "--procs-per-device",
                "2",
            ],
        )
        .env(FAULT, "child1@round-robin:hang")
        .env("SIMPLE_IPC_TEST_MARK", &mark)
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        let seen = common::wait_for_lines(&mut child, "Starting on device", 2, Duration::from_secs(10));
        assert_eq!(seen, 2, "{isolate}: both processes started");
        std::thread::sleep(Duration::from_millis(300));
        let pids = marked(&mark);
        assert!(pids.len() >= 3, "{isolate}: the run's processes are there: {pids:?}");
        killpg(Pid::from_raw(child.id() as i32), signal).unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success(), "{isolate}: {status:?}");
        if signal == Signal::SIGINT {
            // Passed on to the run, which stops in order and says so as a shell would: 128 + 2.
            assert_eq!(status.code(), Some(130), "{isolate}: {status:?}");
        }
        let left = wait_all_gone(&mark, Duration::from_secs(3));
        assert_eq!(left, Vec::<u32>::new(), "{isolate}, {signal}: every process of the run is gone");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "{isolate}, {signal}: no socket directory is left");
        assert_no_driver_files(child.id(), &format!("{isolate}, {signal}"));
    }
}

/// The inits of PID namespaces (pid 1 in their own) among `pid`'s children: the process that entered a
/// PID namespace hands its init over to the process that started it, a child subreaper, and ends, so that
/// no process stands between them.
fn inits_among_children_of(pid: u32) -> Vec<u32> {
    children_of(pid).into_iter().filter(|&child| pid_in_its_namespace(child) == Some(1)).collect()
}

/// `pid`'s number in its own (innermost) PID namespace.
fn pid_in_its_namespace(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// The init (pid 1) of an isolated run's PID namespace stopped (SIGSTOP): it can reap nothing, and the run
/// would never end. The process outside stops the run at its deadline (--timeout and 4 s), exits 1 naming
/// the stopped init, and nothing of the run is left; never PASSED. Under joiners:pid, a joiner's stopped
/// init is killed with the joiner by the parent that started it, and outlives nothing.
#[test]
fn a_stopped_init_is_stopped_at_the_deadline_and_named() {
    let Some(_turn) = isolated_turn("a_stopped_init_is_stopped_at_the_deadline_and_named") else { return };
    for isolate in ["pid", "joiners:pid"] {
        let tmp = Tmp::new("stopped-init");
        let mark = format!("{}-stopped-init-{isolate}", std::process::id());
        let _end = EndMarked(mark.clone());
        let log = tmp.path().join("run.log");
        let file = std::fs::File::create(&log).unwrap();
        let args = "--ipc vmm --sync memops --procs-per-device 2 --timeout 2 --isolate";
        let mut args: Vec<&str> = args.split(' ').collect();
        args.push(isolate);
        let mut child = isolated(&tmp, &args)
            .env(FAULT, "child1@round-robin:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        let started = Instant::now();
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        while said().matches("Starting on device").count() < 2 && started.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        // The run's own init (pid): outside -> init; a joiner's (joiners:pid): parent -> init, one level
        // less than when the process that entered the namespace stayed between them.
        let inits: Vec<u32> = inits_among_children_of(child.id()).into_iter().take(1).collect();
        assert_eq!(inits.len(), 1, "{isolate}: one init to stop: {}", said());
        nix::sys::signal::kill(Pid::from_raw(inits[0] as i32), Signal::SIGSTOP).unwrap();
        let status = wait_at_most(&mut child, Duration::from_secs(12));
        let out = said();
        let _ = std::fs::remove_file(&log);
        assert_eq!(status.and_then(|s| s.code()), Some(1), "{isolate}: ended by the deadline: {out}");
        assert!(!out.contains("PASSED"), "{isolate}: {out}");
        let verdict = out.lines().rfind(|l| l.starts_with("FAILED")).unwrap_or_default();
        if isolate == "pid" {
            assert!(verdict.contains("init of a PID namespace") && verdict.contains("stopped"), "{out}");
        }
        let left = wait_all_gone(&mark, Duration::from_secs(3));
        assert_eq!(left, Vec::<u32>::new(), "{isolate}: the stopped init and all it held are gone");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "{isolate}: no socket directory is left");
    }
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

/// A process the parent started that hangs (it never answers the abort): the watchdog stops the run, and
/// the parent ends what it started, its init and all, before it exits; nothing is left.
#[test]
fn a_hung_isolated_process_is_ended_by_the_parent_that_started_it() {
    let Some(_turn) = isolated_turn("a_hung_isolated_process_is_ended_by_the_parent_that_started_it") else {
        return;
    };
    for isolate in ["pid", "joiners:pid", "net"] {
        let tmp = Tmp::new("hung");
        let mark = format!("{}-hung-{isolate}", std::process::id());
        let _end = EndMarked(mark.clone());
        let args = "--ipc vmm --sync memops --procs-per-device 2 --timeout 2";
        let mut args: Vec<&str> = args.split(' ').collect();
        args.extend(["--isolate", isolate]);
        // Output to a file, not a pipe: a process left behind would hold a pipe open, and the test with it.
        let log = tmp.path().join("run.log");
        let file = std::fs::File::create(&log).unwrap();
        let mut child = isolated(&tmp, &args)
            .env(FAULT, "child1@round-robin:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        let status = wait_at_most(&mut child, Duration::from_secs(15));
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        assert_eq!(status.and_then(|s| s.code()), Some(1), "{isolate}: the watchdog: {said}");
        assert!(said.contains("did not finish within 2 s"), "{isolate}: {said}");
        let left = wait_all_gone(&mark, Duration::from_secs(3));
        assert_eq!(left, Vec::<u32>::new(), "{isolate}: the hung process and its init are gone");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "{isolate}: no socket directory is left");
    }
}

/// The children of process `pid`, as /proc lists them.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// The run's own process (pid 2 in its PID namespace) killed by SIGKILL while it holds its events: the
/// process the user started exits as it did (137, as a shell says a SIGKILL), and the init waits for the
/// guardian, which removes the driver's files, before the namespace ends.
#[test]
fn the_isolated_parent_killed_exits_as_killed_and_its_guardian_still_cleans_up() {
    let Some(_turn) =
        isolated_turn("the_isolated_parent_killed_exits_as_killed_and_its_guardian_still_cleans_up")
    else {
        return;
    };
    let tmp = Tmp::new("parent-killed");
    let mark = format!("{}-parent-killed", std::process::id());
    let _end = EndMarked(mark.clone());
    let mut child =
        isolated(&tmp, &["--isolate", "pid", "--ipc", "vmm", "--procs-per-device", "2", "--timeout", "0"])
            .env(FAULT, "parent@wait-children:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    let start = Instant::now();
    while driver_files(child.id()).is_empty() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!driver_files(child.id()).is_empty(), "the parent exported its events");
    // outside -> init -> the run's process: the process that entered the namespaces handed the init over
    // and ended.
    // (The process that handed over may still be a zombie, not yet reaped.)
    let live: Vec<u32> = children_of(child.id()).into_iter().filter(|&c| state_of(c) != Some('Z')).collect();
    let init = inits_among_children_of(child.id());
    assert_eq!(init.len(), 1, "the process outside has one child, the init: {live:?}");
    assert_eq!(live, init, "and no other process");
    let run = children_of(init[0]);
    let parent = *run.first().expect("the init runs the parent");
    nix::sys::signal::kill(Pid::from_raw(parent as i32), Signal::SIGKILL).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(137), "exits as the run's process did: {status:?}");
    assert_eq!(wait_all_gone(&mark, Duration::from_secs(3)), Vec::<u32>::new(), "every process is gone");
    assert_no_driver_files(child.id(), "the parent killed");
}

/// A stop signal the invoker left ignored (nohup, a background job) stays ignored under --isolate too:
/// the process outside does not pass it on, and the run goes on to its watchdog.
#[test]
fn an_ignored_sigint_is_not_passed_on_to_an_isolated_run() {
    let Some(_turn) = isolated_turn("an_ignored_sigint_is_not_passed_on_to_an_isolated_run") else { return };
    let tmp = Tmp::new("ignored");
    let mark = format!("{}-ignored", std::process::id());
    let _end = EndMarked(mark.clone());
    let mut command = isolated(
        &tmp,
        &[
            "--isolate",
            "pid",
            "--ipc",
            "vmm",
            "--sync",
            "memops",
            "--procs-per-device",
            "2",
            "--timeout",
            "2",
        ],
    );
    command.env(FAULT, "child1@round-robin:hang").env("SIMPLE_IPC_TEST_MARK", &mark);
    // SAFETY: (test) ignoring a signal between fork and exec is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            nix::sys::signal::signal(Signal::SIGINT, nix::sys::signal::SigHandler::SigIgn)
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(800));
    nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "the watchdog ended it, not the ignored SIGINT (130): {status:?}");
    assert_eq!(wait_all_gone(&mark, Duration::from_secs(3)), Vec::<u32>::new(), "every process is gone");
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

/// The parent alone killed by SIGKILL (not its group), with a hung process it started: what it started
/// does not outlive it (PR_SET_PDEATHSIG), and the init of that process ends it. And SIGTERM to the matrix's
/// top process goes on to the cell that runs, at once.
#[test]
fn what_an_isolated_parent_started_does_not_outlive_it() {
    let Some(_turn) = isolated_turn("what_an_isolated_parent_started_does_not_outlive_it") else { return };
    for (args, signal) in [
        (
            &["--isolate", "joiners:pid", "--ipc", "vmm", "--sync", "memops", "--procs-per-device", "2"][..],
            Signal::SIGKILL,
        ),
        (&["--ipc", "all", "--isolate", "pid"][..], Signal::SIGTERM),
    ] {
        let tmp = Tmp::new("outlive");
        let mark = format!("{}-outlive-{signal}", std::process::id());
        let _end = EndMarked(mark.clone());
        let mut child = isolated(&tmp, args)
            .args(["--timeout", "0"])
            .env(FAULT, "child0@round-robin:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        assert!(marked(&mark).len() >= 3, "{args:?}: the run is under way");
        nix::sys::signal::kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        let status = wait_at_most(&mut child, Duration::from_secs(5));
        assert!(status.is_some(), "{args:?}: the process signalled ends within 5 s");
        assert_eq!(wait_all_gone(&mark, Duration::from_secs(4)), Vec::<u32>::new(), "{args:?}: all gone");
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
    std::fs::copy(bin(), &copy).unwrap();
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

/// `--isolate net` (a socket in a private directory under TMPDIR) with every process of the run SIGKILLed
/// at once, the process outside and the run's own process group, at several moments from its start on:
/// only the guardian, in a session of its own, is left, and it removes the socket file and the directory
/// (the run had no code left to run). Nothing stays in TMPDIR.
#[test]
fn an_isolated_run_killed_whole_at_any_moment_leaves_no_socket_or_directory() {
    let Some(_turn) =
        isolated_turn("an_isolated_run_killed_whole_at_any_moment_leaves_no_socket_or_directory")
    else {
        return;
    };
    for after_ms in [5u64, 15, 30, 60, 120, 250] {
        let tmp = Tmp::new("killed-whole");
        let mark = format!("{}-killed-whole-{after_ms}", std::process::id());
        let _end = EndMarked(mark.clone());
        let mut child = isolated(&tmp, &["--isolate", "net", "--ipc", "vmm", "--procs-per-device", "2"])
            .args(["--timeout", "0"])
            .env(FAULT, "child1@round-robin:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        // Until the run has made what it makes (or the moment has come).
        while start.elapsed() < Duration::from_millis(after_ms) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let made = tmp.entries();
        let run = children_of(child.id());
        let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        for pid in &run {
            let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        child.wait().unwrap();
        let gone = Instant::now();
        while !tmp.entries().is_empty() && gone.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            tmp.entries(),
            Vec::<String>::new(),
            "killed {after_ms} ms in (it had made {made:?}): the socket directory is left"
        );
        wait_all_gone(&mark, Duration::from_secs(3));
    }
}

/// The state letter of process `pid` (`T` stopped), if it is there.
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Every process below `pid`, as /proc lists them.
fn all_below(pid: u32) -> Vec<u32> {
    let mut found = children_of(pid);
    let mut at = 0;
    while at < found.len() {
        let more = children_of(found[at]);
        found.extend(more);
        at += 1;
    }
    found
}

/// Whether `pid` leads a session of its own (the init of a PID namespace, the guardian): such a process only
/// waits, and Ctrl-Z leaves it awake (the init continues the run should the process outside die).
fn leads_a_session(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    fields.get(3).and_then(|s| s.parse::<u32>().ok()) == Some(pid)
}

/// Ctrl-Z, then `kill -9 %1` (SIGKILL to the process outside, the job's only process): the run, held
/// stopped, is continued by its init (pid, container) or by the kernel (net: an orphaned process group with
/// stopped members gets SIGHUP and SIGCONT) and stops in order: no process is left, stopped or not, and
/// nothing in TMPDIR. Once 100 processes were left stopped for good.
#[test]
fn a_stopped_isolated_run_whose_outside_is_killed_leaves_nothing() {
    let Some(_turn) = isolated_turn("a_stopped_isolated_run_whose_outside_is_killed_leaves_nothing") else {
        return;
    };
    for isolate in ["pid", "net", "container"] {
        let tmp = Tmp::new("stopped-killed");
        let mark = format!("{}-stopped-killed-{isolate}", std::process::id());
        let _end = EndMarked(mark.clone());
        let log = tmp.path().join("run.log");
        let file = std::fs::File::create(&log).unwrap();
        let args = ["--isolate", isolate, "--ipc", "vmm", "--sync", "memops", "--procs-per-device", "2"];
        let mut child = isolated(&tmp, &args)
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        let started = Instant::now();
        while !said().contains("Starting on device") && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let outside = child.id();
        nix::sys::signal::kill(Pid::from_raw(outside as i32), Signal::SIGTSTP).unwrap();
        let stopping = Instant::now();
        while state_of(outside) != Some('T') && stopping.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(state_of(outside), Some('T'), "{isolate}: the process outside stopped: {}", said());
        nix::sys::signal::kill(Pid::from_raw(outside as i32), Signal::SIGKILL).unwrap();
        let _ = child.wait();
        let left = wait_all_gone(&mark, Duration::from_secs(10));
        let states: Vec<(u32, Option<char>)> = left.iter().map(|&pid| (pid, state_of(pid))).collect();
        assert_eq!(states, Vec::new(), "{isolate}: processes left: {}", said());
        assert_eq!(
            tmp.entries(),
            vec!["run.log".to_owned()],
            "{isolate}: nothing left in TMPDIR but the log"
        );
    }
}

/// Ctrl-Z on an isolated run (SIGTSTP to the process outside, as the terminal sends it to the job's
/// group): every process of the run is stopped, and then the process outside, so that the shell sees the
/// whole job stopped and nothing of it runs on or prints; SIGCONT (`fg`) continues all and the run passes.
/// Held past its --timeout, the run's own watchdog ends it, and the verdict says it was held stopped.
#[test]
fn ctrl_z_stops_the_whole_isolated_run_and_fg_continues_it() {
    let Some(_turn) = isolated_turn("ctrl_z_stops_the_whole_isolated_run_and_fg_continues_it") else {
        return;
    };
    // (A run held past its --timeout fails when continued only where a wait of it still has to block then:
    // held after its last such wait, it finishes and passes, which made a case of this test race; the held
    // note is in isolation::outside.)
    for (isolate, timeout, held) in [("pid", "20", 1500u64), ("net", "20", 1500)] {
        let tmp = Tmp::new("ctrl-z");
        let mark = format!("{}-ctrl-z-{isolate}-{timeout}", std::process::id());
        let _end = EndMarked(mark.clone());
        let log = tmp.path().join("run.log");
        let file = std::fs::File::create(&log).unwrap();
        let mut child = isolated(
            &tmp,
            &[
                "--isolate",
                isolate,
                "--ipc",
                "vmm",
                "--sync",
                "memops",
                "--procs-per-device",
                "2",
                "--timeout",
                timeout,
            ],
        )
        .env("SIMPLE_IPC_TEST_MARK", &mark)
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
        let said = || std::fs::read_to_string(&log).unwrap_or_default();
        let started = Instant::now();
        while !said().contains("Starting on device") && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let outside = child.id();
        nix::sys::signal::kill(Pid::from_raw(outside as i32), Signal::SIGTSTP).unwrap();
        let stopping = Instant::now();
        // (The leaders of sessions of their own, the inits and the guardian, only wait, and stay awake.)
        let running = || -> Vec<(u32, Option<char>)> {
            std::iter::once(outside)
                .chain(all_below(outside))
                .filter(|pid| !leads_a_session(*pid))
                .map(|pid| (pid, state_of(pid)))
                .filter(|(_, state)| !matches!(state, Some('T' | 'Z') | None))
                .collect()
        };
        while !running().is_empty() && stopping.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let before = said();
        assert_eq!(running(), Vec::new(), "{isolate}: all of the run is stopped: {before}");
        assert!(!before.contains("PASSED"), "{isolate}: {before}");
        std::thread::sleep(Duration::from_millis(held));
        assert_eq!(said(), before, "{isolate}: a stopped run prints nothing more");
        assert_eq!(running(), Vec::new(), "{isolate}: the run stays stopped");
        nix::sys::signal::kill(Pid::from_raw(outside as i32), Signal::SIGCONT).unwrap();
        let status = wait_at_most(&mut child, Duration::from_secs(15));
        let out = said();
        let _ = std::fs::remove_file(&log);
        let verdict = out.lines().last().unwrap_or_default().to_owned();
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{isolate}: continued, it passes: {out}");
        assert!(verdict.starts_with("PASSED"), "{isolate}: {out}");
        assert_eq!(wait_all_gone(&mark, Duration::from_secs(3)), Vec::<u32>::new(), "{isolate}");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "{isolate}: no socket directory is left");
    }
}

/// Under an MPS daemon (here a stand-in: a copy of python3 named `nvidia-cuda-mps-control`, listening on a
/// `SOCK_SEQPACKET` socket named `control` in the pipe directory, as NVIDIA's daemon does), the matrix says,
/// after its table, whether each boundary's importers were the daemon's clients, as each process found for
/// itself, and its verdict says it ran under MPS. A pipe directory that the isolated processes can see
/// (under TMPDIR, which no boundary of the matrix hides) makes every importer a client. Another program's
/// socket there (this test's own) makes no client: nothing of MPS is said.
#[test]
fn the_matrix_under_mps_says_whose_clients_the_importers_were() {
    let Some(_turn) = isolated_turn("the_matrix_under_mps_says_whose_clients_the_importers_were") else {
        return;
    };
    let tmp = Tmp::new("matrix-mps");
    let pipe = tmp.path().join("mps");
    std::fs::create_dir(&pipe).unwrap();
    let mut daemon = common::stand_in_mps_daemon(&pipe, tmp.path());
    let mut command = isolated(&tmp, &["--ipc", "all", "--isolate", "pid,shm"]);
    let out = command.env("CUDA_MPS_PIPE_DIRECTORY", &pipe).env(SIMULATE, "ok+mps").output().unwrap();
    // The same daemon's socket where the driver says no MPS: no client in any row, no MPS said.
    let mut command = isolated(&tmp, &["--ipc", "all", "--isolate", "pid"]);
    let unconfirmed = command.env("CUDA_MPS_PIPE_DIRECTORY", &pipe).output().unwrap();
    assert_eq!(unconfirmed.status.code(), Some(0), "{}", text(&unconfirmed));
    let said = text(&unconfirmed);
    assert!(
        !said.contains("under MPS") && !said.contains("Under MPS") && !said.contains("its clients ("),
        "{said}"
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let under =
        format!("Under MPS (the daemon of {}): the importers of each boundary's runs", pipe.display());
    assert!(said.contains(&under), "{said}");
    for row in ["same namespaces", "own PID namespaces, the same pid number", "own /dev/shm"] {
        let line = said.lines().find(|l| l.trim_start().starts_with(row) && l.contains("clients"));
        assert!(line.is_some_and(|l| l.contains("its clients (") && !l.contains("not")), "{row}: {said}");
    }
    let verdict = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned();
    assert!(verdict.contains(&format!("under MPS (the daemon of {})", pipe.display())), "{verdict}");
    // Another program's socket where the daemon's would be: no client, nothing of MPS said.
    std::fs::remove_file(pipe.join("control")).unwrap();
    let impostor = std::os::unix::net::UnixListener::bind(pipe.join("control")).unwrap();
    let mut command = isolated(&tmp, &["--ipc", "all", "--isolate", "pid"]);
    let out = command.env("CUDA_MPS_PIPE_DIRECTORY", &pipe).output().unwrap();
    drop(impostor);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains("under MPS") && !text(&out).contains("Under MPS"), "{}", text(&out));
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

/// An invoker that left SIGTERM ignored (`trap '' TERM`), then the process outside killed by SIGKILL: the
/// run's death signal, SIGTERM, would be ignored too (inherited, and kept), and the run went on without
/// anyone to say its verdict; it is SIGKILL then, and nothing of the run is left (without a PID namespace
/// its guardian cleans up; with one, the init takes the namespace down).
#[test]
fn a_run_whose_invoker_ignores_sigterm_does_not_outlive_its_outside() {
    let Some(_turn) = isolated_turn("a_run_whose_invoker_ignores_sigterm_does_not_outlive_its_outside")
    else {
        return;
    };
    for isolate in ["net", "shm"] {
        let tmp = Tmp::new("term-ignored");
        let mark = format!("{}-term-ignored-{isolate}", std::process::id());
        let _end = EndMarked(mark.clone());
        let bin = bin();
        let mut child = Command::new("bash")
            .args(["-c", "trap '' TERM; exec \"$0\" \"$@\""])
            .arg(&bin)
            .args(["--isolate", isolate, "--ipc", "vmm", "--sync", "memops", "--procs-per-device", "2"])
            .args(["--timeout", "0"])
            .env(SIMULATE, "ok")
            .env(FAULT, "child1@round-robin:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .env("TMPDIR", tmp.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let start = Instant::now();
        while marked(&mark).len() < 4 && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(marked(&mark).len() >= 4, "{isolate}: the run's processes are there");
        std::thread::sleep(Duration::from_millis(300));
        nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
        child.wait().unwrap();
        let left = wait_all_gone(&mark, Duration::from_secs(5));
        assert_eq!(left, Vec::<u32>::new(), "{isolate}: the run outlived the process outside");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "{isolate}: nothing left in TMPDIR");
    }
}

/// Whether process `pid` handles `signal` (its bit in `SigCgt` of `/proc/PID/status`): the program has
/// installed its stop signals' handlers.
fn handles(pid: u32, signal: Signal) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let caught = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).map(str::trim);
    caught
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .is_some_and(|mask| mask >> (signal as i32 - 1) & 1 == 1)
}

/// A stop signal is never lost in the hand-over of an isolated run: sent at every millisecond of the first
/// 20 after the process the user started can take it (the relaunched run starting, entering its namespaces,
/// holding the stop signals blocked while it forks the init, handing the init over and ending; the init and
/// the run's process starting), a run that would hang ends in order with 128+N and its verdict, within a
/// second or two: stopped by the signal itself, with its own document (not ended by it before its handlers
/// were there), never by the process outside's SIGKILL 4 s later (137), nor as if nothing came.
#[test]
fn a_stop_signal_in_any_window_of_the_hand_over_ends_the_run_in_order() {
    let Some(_turn) = isolated_turn("a_stop_signal_in_any_window_of_the_hand_over_ends_the_run_in_order")
    else {
        return;
    };
    let mut lost = Vec::new();
    for (kind, signal) in [("pid", Signal::SIGTERM), ("container", Signal::SIGINT)] {
        for after_ms in 0..20u64 {
            let tmp = Tmp::new("hand-over");
            let mark = format!("{}-hand-over-{kind}-{after_ms}", std::process::id());
            let _end = EndMarked(mark.clone());
            let mut child = isolated(&tmp, &["--isolate", kind, "--ipc", "vmm", "--sync", "memops"])
                .env(FAULT, "child0@round-robin:hang")
                .env("SIMPLE_IPC_TEST_MARK", &mark)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let pid = child.id();
            let start = Instant::now();
            while !handles(pid, signal) && start.elapsed() < Duration::from_secs(5) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(after_ms));
            let sent = Instant::now();
            nix::sys::signal::kill(Pid::from_raw(pid as i32), signal).unwrap();
            let status = wait_at_most(&mut child, Duration::from_secs(10));
            let took = sent.elapsed();
            let mut said = String::new();
            if let Some(mut out) = child.stdout.take() {
                use std::io::Read;
                let _ = out.read_to_string(&mut said);
            }
            let expected = 128 + signal as i32;
            let last = said.lines().last().unwrap_or_default().to_owned();
            let in_order = status.and_then(|s| s.code()) == Some(expected)
                && last == format!("STOPPED (exit {expected}): interrupted by {signal}")
                && took < Duration::from_secs(3);
            if !in_order {
                lost.push(format!("{kind} {signal} {after_ms} ms in: {status:?} after {took:?}: {last}"));
            }
            wait_all_gone(&mark, Duration::from_secs(3));
        }
    }
    assert!(lost.is_empty(), "stop signals not taken in order:\n{}", lost.join("\n"));
}

/// The init of an isolated run's PID namespace killed (SIGKILL) as soon as it is there, at several moments
/// while the run's processes meet at their socket in a private directory under TMPDIR: the kernel kills
/// every process of the namespace with it, the run's guardian among them, so the process outside, which
/// chose where that directory is made, removes it. Nothing stays in TMPDIR.
#[test]
fn an_init_killed_early_leaves_no_socket_directory() {
    let Some(_turn) = isolated_turn("an_init_killed_early_leaves_no_socket_directory") else { return };
    let mut made_one = false;
    for after_ms in [0u64, 2, 4, 6, 8, 10, 14, 18, 24, 30] {
        let tmp = Tmp::new("init-killed");
        let mark = format!("{}-init-killed-{after_ms}", std::process::id());
        let _end = EndMarked(mark.clone());
        let mut child = isolated(&tmp, &["--isolate", "container", "--ipc", "vmm", "--sync", "memops"])
            .env(FAULT, "child0@round-robin:hang")
            .env("SIMPLE_IPC_TEST_MARK", &mark)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let init = loop {
            if let Some(&init) = inits_among_children_of(child.id()).first() {
                break Some(init);
            }
            if start.elapsed() > Duration::from_secs(5) {
                break None;
            }
            std::thread::yield_now();
        };
        let init = init.expect("the run's PID namespace has an init");
        std::thread::sleep(Duration::from_millis(after_ms));
        made_one |= !tmp.entries().is_empty();
        let _ = nix::sys::signal::kill(Pid::from_raw(init as i32), Signal::SIGKILL);
        let status = wait_at_most(&mut child, Duration::from_secs(10));
        assert!(status.is_some(), "{after_ms} ms: the process outside ended");
        assert_eq!(tmp.entries(), Vec::<String>::new(), "init killed {after_ms} ms in: left in TMPDIR");
        wait_all_gone(&mark, Duration::from_secs(3));
    }
    assert!(made_one, "at least one kill came while the socket's directory was there");
}
