//! The container matrix (`--ipc all --isolate KINDS`) on simulated GPUs, with real namespaces: it matches
//! the table measured on the H200 host; its rows at once give the same table as one after another; a kernel
//! without pidfd_getfd waives that column; under MPS it says whose clients the importers were; runs that
//! fail for another reason than a refusal fail it, named; stopped while its rows run, it leaves nothing.
//! Where this host gives no namespaces, each test says it was skipped; the tests take turns
//! (`common::isolate`).

mod common;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::isolate::{
    EndMarked, Tmp, assert_no_driver_files, dev_shm, isolated, isolated_turn, marked, run, wait_all_gone,
    wait_at_most,
};
use common::{SIMULATE, text};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

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
