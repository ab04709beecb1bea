//! The `--json` document (docs/json.md) of every outcome and every mode, parsed with serde_json: how the run
//! ended (status, reason, exit status), with what (program, driver, devices, options), and what the mode
//! found; strings are escaped whatever they hold.

mod common;

use std::process::Command;

use common::{FAULT, run, simulated, text};
use serde_json::Value;

/// A directory of its own for a test's files, removed when it drops.
fn scratch(name: &str) -> tempfile::TempDir {
    common::scratch(&format!("json-{name}"))
}

/// Runs `command` with `--json`, asserts its exit status, and returns its document.
fn document_of(name: &str, mut command: Command, code: i32) -> Value {
    let dir = scratch(name);
    let json = dir.path().join("run.json");
    let out = run(command.arg("--json").arg(&json));
    assert_eq!(out.status.code(), Some(code), "{name}: {}", text(&out));
    let doc = common::document(&json);
    assert_eq!(doc["exit_status"].as_i64(), Some(i64::from(code)), "{name}: {doc}");
    assert_eq!(doc["program"], "simple-ipc", "{doc}");
    assert_eq!(doc["version"], env!("CARGO_PKG_VERSION"), "{doc}");
    doc
}

fn status(doc: &Value) -> (&str, Option<&str>) {
    (doc["status"].as_str().unwrap_or("?"), doc["reason"].as_str())
}

#[test]
fn a_passed_run_has_every_process_with_its_phases() {
    let mut command = simulated("ok,ok");
    command.args(["--procs-per-device", "2", "--ipc", "pool"]);
    let doc = document_of("passed", command, 0);
    assert_eq!(status(&doc), ("passed", None), "{doc}");
    assert!(doc["cause"].is_null() && doc["fix"].is_null(), "{doc}");
    assert_eq!(doc["mode"], "run", "{doc}");
    assert_eq!(doc["driver"]["simulated"], true, "{doc}");
    assert!(doc["driver"]["cuda_version"].is_null(), "a simulation has no CUDA version: {doc}");
    let devices = doc["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{doc}");
    for (i, device) in devices.iter().enumerate() {
        assert_eq!(device["index"].as_u64(), Some(i as u64), "{doc}");
        assert_eq!(device["name"], format!("Simulated GPU {i}"), "{doc}");
        assert!(device["uuid"].as_str().is_some_and(|u| u.starts_with("GPU-") && u.len() == 40), "{doc}");
        assert!(device["pci_bus_id"].is_null() && device["chosen"] == true, "{doc}");
    }
    let options = &doc["options"];
    assert_eq!((options["ipc"].as_str(), options["sync"].as_str()), (Some("pool"), Some("events")), "{doc}");
    assert_eq!((options["procs_per_device"].as_u64(), options["timeout_s"].as_u64()), (Some(2), Some(60)));
    assert!(options["bench_max_bytes"].is_null(), "not a benchmark: {doc}");

    let results = &doc["run"];
    assert_eq!((results["unit"].as_str(), results["processes"].as_u64()), (Some("ms"), Some(4)), "{doc}");
    let parent = &results["parent"]["phases"];
    assert!(parent["total"].as_f64().is_some_and(|ms| ms > 0.0), "{doc}");
    assert!(parent.get("verify").is_none(), "the parent verifies nothing: {doc}");
    let children = results["children"].as_array().unwrap();
    assert_eq!(children.len(), 4, "{doc}");
    for (i, child) in children.iter().enumerate() {
        assert_eq!(child["index"].as_u64(), Some(i as u64), "{doc}");
        assert_eq!(child["device"].as_u64(), Some(i as u64 / 2), "two processes a device: {doc}");
        let phases = &child["phases"];
        let measured = ["attach", "open_handles", "round_robin", "verify", "total"];
        assert!(measured.iter().all(|p| phases[*p].as_f64().is_some_and(|ms| ms >= 0.0)), "{doc}");
        assert!(phases.get("allocate_export").is_none(), "a child exports nothing: {doc}");
        assert_eq!(child["descriptors_before_open"], child["descriptors_after_close"], "{doc}");
    }
}

#[test]
fn a_failed_run_says_why_and_has_no_results() {
    let mut command = simulated("ok");
    command.args(["--procs-per-device", "3"]).env(FAULT, "child2@round-robin:error");
    let doc = document_of("failed", command, 1);
    assert_eq!(status(&doc), ("failed", Some("Process 2 failed! (exit code 1)")), "{doc}");
    assert!(doc.get("run").is_none(), "{doc}");
    assert!(doc["cause"].is_null(), "nothing was diagnosed: {doc}");
    assert_eq!(doc["devices"].as_array().map(Vec::len), Some(1), "the devices are known: {doc}");
}

/// A reason holding quotes, backslashes and a newline (a path, here) comes back as it was.
#[test]
fn a_reason_with_quotes_backslashes_and_newlines_is_escaped() {
    let dir = scratch("escaped");
    let socket = dir.path().join("no\"such\\dir\nat all").join("run.sock");
    let json = dir.path().join("run.json");
    let out = run(simulated("ok").arg("--serve").arg(&socket).arg("--json").arg(&json));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let raw = std::fs::read_to_string(&json).unwrap();
    let doc = common::document(&json);
    let reason = doc["reason"].as_str().unwrap_or_else(|| panic!("{doc}"));
    assert!(reason.starts_with(&format!("--serve {}: bind", socket.display())), "{reason:?}");
    assert!(raw.contains(r#"no\"such\\dir\nat all"#), "escaped in the file: {raw}");
    assert_eq!(doc["options"]["serve"].as_str(), Some(socket.to_str().unwrap()), "{doc}");
}

#[test]
fn a_waived_run_says_why_and_lists_the_devices_it_could_not_use() {
    let doc = document_of("waived", simulated("ok,no-uva"), 0);
    assert_eq!(status(&doc), ("passed", None), "device 0 alone runs: {doc}");
    assert_eq!(doc["devices"][1]["chosen"], false, "{doc}");

    let doc = document_of("waived", simulated("no-uva"), 2);
    let (word, reason) = status(&doc);
    assert_eq!((word, reason), ("waived", Some("No CUDA devices support IPC")), "{doc}");
    assert_eq!(doc["devices"][0]["chosen"], false, "{doc}");
    assert!(doc.get("run").is_none(), "{doc}");

    let mut vmm = simulated("no-vmm,no-vmm");
    vmm.args(["--ipc", "vmm"]);
    let doc = document_of("waived-vmm", vmm, 2);
    let (word, reason) = status(&doc);
    assert_eq!(word, "waived", "{doc}");
    let expected = "No CUDA devices support IPC with --ipc vmm (device 0";
    assert!(reason.is_some_and(|r| r.starts_with(expected)), "{doc}");
}

/// `--ipc all`: a row per mechanism, each with the document its run wrote, read back as data.
#[test]
fn ipc_all_has_each_runs_document() {
    let mut command = simulated("no-vmm,no-vmm");
    command.args(["--ipc", "all", "--procs-per-device", "2"]);
    let doc = document_of("all", command, 0);
    assert_eq!((status(&doc), doc["mode"].as_str()), (("passed", None), Some("ipc_all")), "{doc}");
    assert_eq!(doc["options"]["ipc"], "all", "{doc}");
    assert_eq!(doc["devices"].as_array().map(Vec::len), Some(2), "from the runs' documents: {doc}");
    let rows = doc["mechanisms"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().filter_map(|r| r["mechanism"].as_str()).collect();
    assert_eq!(names, ["legacy", "vmm", "pool", "fabric"], "{doc}");
    for row in [&rows[0], &rows[2]] {
        assert_eq!(status(row), ("passed", None), "{row}");
        assert!(row["open_one_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{row}");
        let run = &row["document"];
        assert_eq!((run["status"].as_str(), run["exit_status"].as_i64()), (Some("passed"), Some(0)), "{row}");
        assert_eq!(run["options"]["ipc"], row["mechanism"], "{row}");
        assert_eq!(run["run"]["processes"].as_u64(), Some(4), "{row}");
    }
    let vmm = &rows[1];
    assert_eq!(status(vmm).0, "waived", "{vmm}");
    assert_eq!(vmm["reason"], vmm["document"]["reason"], "the run's own reason: {vmm}");
    assert_eq!(vmm["document"]["exit_status"].as_i64(), Some(2), "{vmm}");

    // A mechanism that fails: its row and its run's document say so, and the whole fails.
    let mut command = simulated("ok");
    command.args(["--ipc", "all"]).env(FAULT, "parent@allocate-export:send-none");
    let doc = document_of("all-failed", command, 1);
    assert_eq!(status(&doc), ("failed", Some("--ipc all: vmm, pool failed")), "{doc}");
    let vmm = &doc["mechanisms"][1];
    assert_eq!(status(vmm), ("failed", Some("Process 0 failed! (exit code 1)")), "{vmm}");
    assert_eq!(vmm["document"]["exit_status"].as_i64(), Some(1), "{vmm}");
    assert!(vmm["document"].get("run").is_none() && vmm["open_one_ms"].is_null(), "{vmm}");

    // A mechanism waived without a run: no document.
    let mut command = simulated("ok");
    command.args(["--ipc", "all", "--sync", "memops"]);
    let doc = document_of("all-memops", command, 0);
    let pool = &doc["mechanisms"][2];
    assert_eq!(status(pool).0, "waived", "{pool}");
    assert!(
        status(pool).1.is_some_and(|r| r.starts_with("--sync memops cannot order pool memory")),
        "{pool}"
    );
    assert!(pool["document"].is_null() && pool["wall_ms"].is_null(), "{pool}");
}

#[test]
fn bench_has_every_test_of_every_pair() {
    let mut command = simulated("ok,no-memops");
    command.args(["--bench", "--bench-max-bytes", "16384"]);
    let doc = document_of("bench", command, 0);
    assert_eq!((status(&doc), doc["mode"].as_str()), (("passed", None), Some("bench")), "{doc}");
    assert_eq!(doc["options"]["bench_max_bytes"].as_u64(), Some(16384), "{doc}");
    let bench = &doc["bench"];
    assert_eq!(bench["mechanism"], "legacy", "{doc}");
    assert!(bench["mps"].as_str().is_some_and(|m| m.starts_with("MPS: ")), "{doc}");
    let tests = bench["testcases"].as_array().unwrap();
    // Four pairs, six hand-overs and two sizes (4 and 16 KiB) each.
    assert_eq!(tests.len(), 4 * (6 + 2), "{doc}");
    let pairs: std::collections::BTreeSet<(u64, u64)> =
        tests.iter().filter_map(|t| Some((t["producer"].as_u64()?, t["consumer"].as_u64()?))).collect();
    assert_eq!(pairs.len(), 4, "{doc}");
    for test in tests {
        match (&test["handover"], &test["copy"]) {
            (Value::Object(trips), Value::Null) if test["status"] == "passed" => {
                assert_eq!(trips["unit"], "us", "{test}");
                let figure = |k: &str| trips.get(k).and_then(Value::as_f64);
                match figure("mean") {
                    Some(mean) => assert!(mean > 0.0, "{test}"),
                    None => {
                        let (p10, p50, p90) =
                            (figure("p10").unwrap(), figure("p50").unwrap(), figure("p90").unwrap());
                        assert!(p10 <= p50 && p50 <= p90, "{test}");
                    }
                }
            }
            (Value::Null, Value::Object(copy)) => {
                assert_eq!(test["name"], "copy", "{test}");
                assert!([4096, 16384].contains(&copy["bytes"].as_u64().unwrap()), "{test}");
                assert!(copy["ipc"].as_f64().is_some_and(|r| r > 0.0), "{test}");
                assert_eq!(copy["fits_in_l2"], true, "the simulated L2 is 64 KiB: {test}");
            }
            (Value::Null, Value::Null) => {
                assert_eq!(test["status"], "waived", "{test}");
                let expected = "device 1 has no stream memory operations";
                assert!(test["reason"].as_str().is_some_and(|r| r.starts_with(expected)), "{test}");
            }
            _ => panic!("a test is a hand-over, a copy or waived: {test}"),
        }
    }
    assert_eq!(tests.iter().filter(|t| t["status"] == "waived").count(), 4 * 3, "{doc}");
}

// `--json -`: standard output carries the document alone (one JSON value, then a newline), and every human
// line (the run's, its children's, a run of one mechanism's, the run inside an isolation's, the verdict)
// goes to standard error.

/// A run of `command` with `--json -`, in a directory of its own (which must stay empty: no file named `-`).
fn to_stdout(name: &str, mut command: Command) -> std::process::Output {
    let dir = scratch(&format!("stdout-{name}"));
    let out = run(command.current_dir(dir.path()).args(["--json", "-"]));
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "{name}: --json - made {left:?}: {}", text(&out));
    out
}

/// Standard output must be exactly one JSON object and a newline, whose exit status is the run's `code`;
/// standard error ends with the verdict line, which starts with `verdict`. Returns the document and
/// standard error.
fn the_document_alone(what: &str, out: &std::process::Output, code: i32, verdict: &str) -> (Value, String) {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(code), "{what}: stdout: {stdout}\nstderr: {stderr}");
    // serde_json refuses anything after the value but white space; the value is followed by one newline.
    let doc: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{what}: standard output is not one JSON value ({e}): {stdout}"));
    assert!(doc.is_object() && stdout.starts_with('{') && stdout.ends_with("}\n"), "{what}: {stdout:?}");
    assert_eq!(doc["exit_status"].as_i64(), Some(i64::from(code)), "{what}: {doc}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(verdict),
        "{what}: the verdict line is not the last on standard error: {stderr}"
    );
    (doc, stderr.into_owned())
}

#[test]
fn json_dash_puts_the_document_alone_on_standard_output_in_every_outcome() {
    let out = to_stdout("passed", simulated("ok,ok"));
    let (doc, stderr) = the_document_alone("passed", &out, 0, "PASSED: 2 processes on 2 GPUs");
    assert_eq!((status(&doc), doc["mode"].as_str()), (("passed", None), Some("run")), "{doc}");
    assert_eq!(doc["run"]["processes"].as_u64(), Some(2), "{doc}");
    // The parent's lines, and its children's, which inherit its descriptors.
    for line in ["SIMULATED GPUs", "PP: lshmName", "Process 0 complete!", "Process 1 complete!"] {
        assert!(stderr.contains(line), "{line:?} is not on standard error: {stderr}");
    }

    let mut failed = simulated("ok,ok");
    failed.env(FAULT, "child1@verify:corrupt");
    let out = to_stdout("failed", failed);
    let (doc, _) = the_document_alone("failed", &out, 1, "FAILED (exit 1): Process 1 failed!");
    assert_eq!(status(&doc), ("failed", Some("Process 1 failed! (exit code 1)")), "{doc}");

    let out = to_stdout("waived", simulated("no-uva"));
    let (doc, _) = the_document_alone("waived", &out, 2, "WAIVED (exit 2");
    assert_eq!(status(&doc), ("waived", Some("No CUDA devices support IPC")), "{doc}");
}

/// SIGTERM once every child has started (child 0 hangs in the round-robin): 143, and the document says so.
#[test]
fn json_dash_an_interrupted_run_writes_its_document_on_standard_output() {
    use std::io::Read;
    use std::process::Stdio;
    let dir = scratch("stdout-interrupted");
    let mut child = simulated("ok,ok")
        .current_dir(dir.path())
        .args(["--json", "-"])
        .env(FAULT, "child0@round-robin:hang")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut all = Vec::new();
        stdout.read_to_end(&mut all).map(|_| all)
    });
    // The lines are on standard error now (`common::wait_for_lines` reads standard output).
    let (tx, rx) = std::sync::mpsc::channel();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut chunk) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&chunk[..n]);
            let _ = tx.send(String::from_utf8_lossy(&all).matches("Starting on device").count());
        }
        all
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())).is_ok_and(|n| n < 2)
    {
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let ended = child.wait().unwrap();
    let out = std::process::Output {
        status: ended,
        stdout: stdout.join().unwrap().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    let (doc, stderr) = the_document_alone("interrupted", &out, 143, "STOPPED (exit 143)");
    assert_eq!(status(&doc), ("interrupted", Some("interrupted by SIGTERM")), "{doc}");
    assert_eq!(stderr.matches("Starting on device").count(), 2, "{stderr}");
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "--json - made a file");
}

/// `--ipc all` and `--bench`: the runs of one mechanism, whose output the top parent passes on, and the
/// tables, all on standard error.
#[test]
fn json_dash_ipc_all_and_bench_put_their_tables_on_standard_error() {
    let mut all = simulated("no-vmm,no-vmm");
    all.args(["--ipc", "all"]);
    let out = to_stdout("all", all);
    let (doc, stderr) = the_document_alone("--ipc all", &out, 0, "PASSED: every mechanism");
    assert_eq!((status(&doc), doc["mode"].as_str()), (("passed", None), Some("ipc_all")), "{doc}");
    assert_eq!(doc["mechanisms"].as_array().map(Vec::len), Some(4), "{doc}");
    for line in ["== --ipc legacy", "== --ipc pool", "Process 0 complete!", "mechanism"] {
        assert!(stderr.contains(line), "{line:?} is not on standard error: {stderr}");
    }

    let mut bench = simulated("ok");
    bench.args(["--bench", "--bench-max-bytes", "8192"]);
    let out = to_stdout("bench", bench);
    let (doc, _) = the_document_alone("--bench", &out, 0, "PASSED");
    assert_eq!((status(&doc), doc["mode"].as_str()), (("passed", None), Some("bench")), "{doc}");
    assert!(doc["bench"]["testcases"].as_array().is_some_and(|t| !t.is_empty()), "{doc}");
}

/// A served run: the server's standard output is its document alone; a joiner takes no `--json` and
/// prints its lines as ever.
#[test]
fn json_dash_a_servers_standard_output_is_its_document() {
    let sockets = scratch("stdout-serve");
    let socket = sockets.path().join("run.sock");
    let mut join = Command::new(common::bin());
    join.arg("--join").arg(&socket).env(common::SIMULATE, "ok").env_remove(FAULT);
    let served = socket.clone();
    let joiner = std::thread::spawn(move || {
        // Once the server is there: this test is not about a joiner that waits for it.
        let start = std::time::Instant::now();
        while !served.exists() && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        run(&mut join)
    });
    let mut serve = simulated("ok");
    serve.arg("--serve").arg(&socket).args(["--timeout", "20"]);
    let out = to_stdout("serve", serve);
    let joined = joiner.join().unwrap();
    assert_eq!(joined.status.code(), Some(0), "the joiner: {}", text(&joined));
    assert!(String::from_utf8_lossy(&joined.stdout).contains("complete!"), "{}", text(&joined));
    let (doc, stderr) = the_document_alone("--serve", &out, 0, "PASSED");
    assert_eq!(
        (status(&doc), doc["options"]["serve"].as_str()),
        (("passed", None), socket.to_str()),
        "{doc}"
    );
    assert!(stderr.contains("Process 0 joined"), "{stderr}");
}

/// An isolated run and the container matrix: the process outside writes the document the run hands back,
/// and the run's lines (it inherits the process outside's descriptors) go to standard error.
#[test]
fn json_dash_the_process_outside_an_isolated_run_writes_it() {
    let mut isolated = simulated("ok,ok");
    isolated.args(["--isolate", "shm", "--ipc", "vmm", "--sync", "memops"]);
    let out = to_stdout("isolated", isolated);
    if out.status.code() == Some(2) && text(&out).contains("namespace") {
        return common::skipped(
            "namespaces",
            format!("json_dash_the_process_outside_an_isolated_run_writes_it: {}", text(&out)),
        );
    }
    let (doc, stderr) = the_document_alone("--isolate shm", &out, 0, "PASSED");
    assert_eq!((status(&doc), doc["options"]["isolate"].as_str()), (("passed", None), Some("shm")), "{doc}");
    assert!(stderr.contains("Process 1 complete!"), "the run's children's lines: {stderr}");
    into_head("--isolate shm", &["--isolate", "shm", "--ipc", "vmm", "--sync", "memops"]);

    // One that fails across the boundary: the driver's refusal, said by the process outside.
    let mut refused = simulated("ok,ok");
    refused.args(["--isolate", "shm"]);
    let out = to_stdout("isolated-refused", refused);
    let (doc, _) = the_document_alone("--isolate shm, refused", &out, 1, "FAILED (exit 1)");
    assert_eq!(doc["refused"]["error"], "CUDA_ERROR_MAP_FAILED", "{doc}");

    // Its cells' runs are pid 2 in their namespaces: a /dev/shm of their own, where one can be made.
    let shm = common::OwnDevShm::where_possible();
    let mut matrix = common::simulated_in(shm.as_ref(), "ok");
    matrix.args(["--ipc", "all", "--isolate", "container,user", "--quiet"]);
    let out = to_stdout("matrix", matrix);
    let (doc, _) = the_document_alone("the container matrix", &out, 0, "PASSED: the container matrix");
    assert_eq!(doc["mode"], "container_matrix", "{doc}");
    assert!(doc["matrix"].as_array().is_some_and(|cells| !cells.is_empty()), "{doc}");
    // A simulated matrix says so, as every simulated run does; its cells set their own ordering.
    assert_eq!(doc["driver"]["simulated"], true, "{doc}");
    assert_eq!(doc["options"]["sync"], "per_cell", "{doc}");
}

/// `simple-ipc --json - | python3 -m json.tool`: the whole of standard output is one JSON document.
#[test]
fn json_dash_is_what_python_json_tool_takes() {
    use std::process::Stdio;
    let dir = scratch("stdout-python");
    let mut program = simulated("ok,ok");
    program.current_dir(dir.path()).args(["--json", "-", "--ipc", "all"]).stdin(Stdio::null());
    let mut program = program.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let piped = program.stdout.take().unwrap();
    // The command holds its standard input until it drops: only python may hold the pipe's read end.
    let tool = Command::new("python3").args(["-m", "json.tool"]).stdin(piped).output();
    let out = program.wait_with_output().unwrap();
    let tool = match tool {
        Ok(tool) => tool,
        Err(e) => {
            return common::skipped("python3", format!("json_dash_is_what_python_json_tool_takes: {e}"));
        }
    };
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(tool.status.code(), Some(0), "python3 -m json.tool: {}", text(&tool));
    let doc: Value = serde_json::from_slice(&tool.stdout).unwrap();
    assert_eq!((doc["status"].as_str(), doc["mode"].as_str()), (Some("passed"), Some("ipc_all")), "{doc}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("PASSED: every mechanism"), "{}", text(&out));
}

/// `simple-ipc --json - ARGS | head -c 10` on two simulated GPUs: head takes the first 10 bytes of the
/// document and goes; the run must end with 141 (128 + SIGPIPE) and say nothing of it (no error, no verdict
/// line), its own lines on standard error all the same.
fn into_head(what: &str, args: &[&str]) {
    use std::process::Stdio;
    let dir = scratch("stdout-head");
    let mut program = simulated("ok,ok");
    program.current_dir(dir.path()).args(["--json", "-"]).args(args).stdin(Stdio::null());
    let mut program = program.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let piped = program.stdout.take().unwrap();
    // The command holds its standard input until it drops: only head may hold the pipe's read end.
    let head = Command::new("head").args(["-c", "10"]).stdin(piped).output().unwrap();
    let out = program.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{what}: {stderr}");
    assert_eq!(String::from_utf8_lossy(&head.stdout), "{\n  \"progr", "{what}: what head took");
    assert!(stderr.contains("Process 1 complete!"), "{what}: the run's lines are there: {stderr}");
    let (first, anywhere) =
        (["simple-ipc:", "PASSED", "FAILED", "STOPPED", "WAIVED"], ["went away", "Broken pipe"]);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| first.iter().any(|w| l.starts_with(w)) || anywhere.iter().any(|w| l.contains(w)))
        .collect();
    assert!(said.is_empty(), "{what}: nothing is said of the reader gone: {said:?}");
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "{what}: --json - made a file");
}

#[test]
fn json_dash_into_head_ends_with_141_and_nothing_else() {
    into_head("a run", &[]);
    into_head("--ipc all", &["--ipc", "all"]);
}

/// The reason a run is waived for travels with its outcome to the top, which says it once, on the verdict
/// line, and writes it into the document; what a run that passed did reaches the line and the document
/// alike, of `--ipc all` and of each of its runs; what a run found before it failed reaches its document.
#[test]
fn the_outcome_reaches_the_line_and_the_document() {
    let mut vmm = simulated("no-vmm,no-vmm");
    vmm.args(["--ipc", "vmm"]);
    let out = to_stdout("waived-once", vmm);
    let (doc, stderr) = the_document_alone("waived", &out, 2, "WAIVED (exit 2");
    let reason = doc["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("No CUDA devices support IPC with --ipc vmm (device 0"), "{doc}");
    assert!(stderr.lines().last().is_some_and(|line| line.contains(reason)), "{stderr}");
    assert_eq!(stderr.matches("No CUDA devices support IPC").count(), 1, "said once: {stderr}");

    let mut all = simulated("no-vmm,no-vmm");
    all.args(["--ipc", "all"]);
    let out = to_stdout("summaries", all);
    let (doc, stderr) = the_document_alone("--ipc all", &out, 0, "PASSED: every mechanism");
    let summary = "every mechanism: legacy passed, vmm waived, pool passed, fabric waived";
    assert_eq!(doc["summary"], summary, "{doc}");
    assert!(stderr.lines().last().is_some_and(|line| line.contains(summary)), "{stderr}");
    let legacy = &doc["mechanisms"][0]["document"];
    let said = legacy["summary"].as_str().unwrap_or_default();
    assert!(said.starts_with("2 processes on 2 GPUs, legacy IPC, events"), "the run's own: {legacy}");
    let vmm = &doc["mechanisms"][1];
    assert!(vmm["reason"].as_str().is_some_and(|r| r.contains("--ipc vmm (device 0")), "{vmm}");
    // The run of vmm, which says no verdict, says its waiver once; the table says it again.
    assert_eq!(stderr.matches("No CUDA devices support IPC with --ipc vmm").count(), 2, "{stderr}");

    // What a run found before it failed reaches its document too.
    let mut failed = simulated("ok,ok");
    failed.env(FAULT, "child1@verify:corrupt");
    let doc = document_of("failed-found", failed, 1);
    assert_eq!(doc["devices"].as_array().map(Vec::len), Some(2), "{doc}");
    assert_eq!(doc["driver"]["simulated"], true, "{doc}");
}

// Issue 30: a `--json` path in a directory others can write in. Root writes `/tmp/NAME.json`, where user
// nobody (65534) may have made the name first: root's document must not be given to nobody, nor go where
// nobody points it, and nobody's files must not stop root's run nor be removed by it.

/// The uid of user nobody, who makes the names first here.
const NOBODY: u32 = 65534;

/// A sticky directory that anyone may write in (mode 1777, as `/tmp`), of root's, for a test that needs
/// root to chown a file to nobody; `None` (the test is skipped) where this is not root.
fn sticky(name: &str, test: &str) -> Option<tempfile::TempDir> {
    if !nix::unistd::geteuid().is_root() {
        common::skipped("root", format!("{test}: needs root, to make files of nobody's"));
        return None;
    }
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch(name);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    Some(dir)
}

/// The owner and the permission bits of `path` itself (a link's own).
fn owner_and_mode(path: &std::path::Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.uid(), meta.mode() & 0o7777)
}

/// The names `dir` holds, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// nobody makes `NAME.json` first, mode 0666, to rewrite root's verdict later: root's document is a new
/// file of root's own, which nobody cannot write (it was nobody's mode, 0666, and nobody rewrote
/// `failed` as `passed`). A file of root's own keeps its permissions, as ever.
#[test]
fn another_users_file_in_a_sticky_directory_gives_root_s_document_neither_its_mode_nor_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let test =
        "another_users_file_in_a_sticky_directory_gives_root_s_document_neither_its_mode_nor_its_owner";
    let Some(dir) = sticky("sticky-file", test) else { return };
    let json = dir.path().join("run.json");
    std::fs::write(&json, "nobody's").unwrap();
    std::fs::set_permissions(&json, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::chown(&json, Some(NOBODY), Some(NOBODY)).unwrap();
    let mut failed = simulated("ok,ok");
    failed.env(FAULT, "child1@verify:corrupt").arg("--json").arg(&json);
    let out = run(&mut failed);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(status(&common::document(&json)).0, "failed", "{}", text(&out));
    let (owner, mode) = owner_and_mode(&json);
    assert_eq!(owner, 0, "the document is root's own, not nobody's file");
    assert_eq!(mode & 0o022, 0, "nobody cannot rewrite the verdict: mode {mode:o}");
    assert_eq!(names_in(dir.path()), ["run.json"], "no temporary file is left");

    // A file of root's own keeps its permissions.
    std::fs::set_permissions(&json, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = run(simulated("ok").arg("--json").arg(&json));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(status(&common::document(&json)).0, "passed");
    assert_eq!(owner_and_mode(&json), (0, 0o640), "root's own file keeps its permissions");
}

/// nobody makes `NAME.json` a symbolic link to a file of root's in a directory only root can enter (where
/// fs.protected_symlinks is 0, the kernel follows it for root): root's run refuses it before it starts,
/// saying why, and neither the link nor its target is touched. A link root made is followed, as ever.
#[test]
fn another_users_link_in_a_sticky_directory_is_refused_never_followed() {
    use std::os::unix::fs::PermissionsExt;
    let test = "another_users_link_in_a_sticky_directory_is_refused_never_followed";
    let Some(dir) = sticky("sticky-link", test) else { return };
    let private = scratch("private");
    let secret = private.path().join("secret.json");
    std::fs::write(&secret, "root's own").unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let json = dir.path().join("run.json");
    std::os::unix::fs::symlink(&secret, &json).unwrap();
    std::os::unix::fs::lchown(&json, Some(NOBODY), Some(NOBODY)).unwrap();
    let out = run(simulated("ok").arg("--json").arg(&json));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(
        all.contains("is a symbolic link that user") && all.contains("65534") && all.contains("not followed"),
        "the refusal says whose link it is and why: {all}"
    );
    assert!(!all.contains("PP: lshmName"), "refused before the run started: {all}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's own", "the link's target is untouched");
    assert_eq!(std::fs::read_link(&json).unwrap(), secret, "the link is nobody's still");
    assert_eq!(owner_and_mode(&json).0, NOBODY);

    // A link of root's own in the same directory is followed: the file it names is replaced.
    let own = dir.path().join("own.json");
    std::os::unix::fs::symlink(&secret, &own).unwrap();
    let out = run(simulated("ok").arg("--json").arg(&own));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(status(&common::document(&secret)).0, "passed", "root's own link leads to root's file");
    assert!(std::fs::symlink_metadata(&own).unwrap().file_type().is_symlink(), "the link stays a link");
}

/// nobody makes the temporary name a run once used, `.NAME.json.<pid>.tmp`, for the pid the run will have
/// (a shell that makes it, then execs the run): the run passes, writes its document all the same, says
/// PASSED last, and leaves nobody's file as it was.
#[test]
fn another_users_file_at_a_temporary_name_neither_stops_the_run_nor_is_removed() {
    let test = "another_users_file_at_a_temporary_name_neither_stops_the_run_nor_is_removed";
    let Some(dir) = sticky("sticky-temporary", test) else { return };
    let json = dir.path().join("run.json");
    let script = r#"touch "$1/.run.json.$$.tmp" && chown 65534:65534 "$1/.run.json.$$.tmp" &&
        exec "$0" --json "$1/run.json""#;
    let out = run(Command::new("sh")
        .args(["-c", script])
        .arg(common::bin())
        .arg(dir.path())
        .env(common::SIMULATE, "ok,ok")
        .env_remove(FAULT));
    let (all, stdout) = (text(&out), String::from_utf8_lossy(&out.stdout));
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(stdout.lines().last().is_some_and(|l| l.starts_with("PASSED")), "{all}");
    assert_eq!(status(&common::document(&json)).0, "passed", "{all}");
    assert_eq!(owner_and_mode(&json).0, 0, "the document is root's own");
    let names = names_in(dir.path());
    let nobodys: Vec<&String> = names.iter().filter(|n| n.starts_with(".run.json.")).collect();
    assert_eq!(nobodys.len(), 1, "nobody's file is there, and nothing else of the run's: {names:?}");
    let nobodys = dir.path().join(nobodys[0]);
    assert_eq!(owner_and_mode(&nobodys).0, NOBODY, "{names:?}");
    assert_eq!(std::fs::read(&nobodys).unwrap(), b"", "nobody's file was not written into");
}

/// A run that cannot write its document (a full file system: a tmpfs of one page, filled, in a mount
/// namespace of its own) says so in its verdict line, the last it prints, and not PASSED before it; it
/// leaves no temporary file. Needs root and unshare(1); elsewhere it says it was skipped.
#[test]
fn a_document_that_cannot_be_written_is_said_by_the_verdict_which_comes_last() {
    let dir = scratch("full");
    let script = r#"mount -t tmpfs -o size=4k tmpfs "$1" || exit 99
        head -c 4096 /dev/zero > "$1/fill" 2>/dev/null
        "$0" --json "$1/run.json" > "$1/../stdout" 2>&1; echo "status $?"; ls -A "$1""#;
    let held = dir.path().join("held");
    std::fs::create_dir(&held).unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "sh", "-c", script])
        .arg(common::bin())
        .arg(&held)
        .env(common::SIMULATE, "ok,ok")
        .env_remove(FAULT)
        .output();
    let said = match out {
        Ok(out) if text(&out).contains("status ") => text(&out),
        other => {
            let why = other.map_or_else(|e| e.to_string(), |out| text(&out));
            return common::skipped(
                "namespaces",
                format!("a_document_that_cannot_be_written_is_said_by_the_verdict_which_comes_last: {why}"),
            );
        }
    };
    let stdout = std::fs::read_to_string(dir.path().join("stdout")).unwrap();
    assert!(said.starts_with("status 1\n"), "{said}: {stdout}");
    assert_eq!(said.lines().skip(1).collect::<Vec<_>>(), ["fill"], "no temporary file is left: {said}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("FAILED (exit 1): could not write the --json document")
            && last.contains("No space left on device"),
        "the verdict, last, says the document was not written: {stdout}"
    );
    assert!(!stdout.lines().any(|l| l.starts_with("PASSED")), "no PASSED before it: {stdout}");
}

/// A run killed with SIGKILL (the OOM killer, `timeout -s KILL`) writes nothing as it dies: what its files
/// say then is what it wrote as it began, that it is running, with its pid, never the previous run's pass.
#[test]
fn a_run_killed_with_sigkill_leaves_running_not_the_last_runs_pass() {
    use std::time::{Duration, Instant};
    let dir = scratch("sigkill");
    let (json, metrics) = (dir.path().join("run.json"), dir.path().join("run.prom"));
    let passed = run(simulated("ok").arg("--json").arg(&json).arg("--metrics").arg(&metrics));
    assert_eq!(passed.status.code(), Some(0), "{}", text(&passed));
    assert_eq!(common::document(&json)["status"], "passed");
    let mut hung = simulated("ok");
    hung.env(FAULT, "child0@round-robin:hang").arg("--json").arg(&json).arg("--metrics").arg(&metrics);
    let mut child =
        hung.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let pid = child.id();
    let running = || {
        common::document(&json)["status"] == "running"
            && std::fs::read_to_string(&metrics).is_ok_and(|m| m.contains("{status=\"running\"} 1"))
    };
    let start = Instant::now();
    while !running() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Its group: the run and its children (its guardian, in a session of its own, then cleans up).
    let _ =
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(-(pid as i32)), nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let doc = common::document(&json);
    assert_eq!((doc["status"].as_str(), doc["exit_status"].as_u64()), (Some("running"), None), "{doc}");
    let reason = doc["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with(&format!("the run (pid {pid}) has begun and not ended")), "{doc}");
    let prom = std::fs::read_to_string(&metrics).unwrap();
    assert!(prom.contains("simple_ipc_status{status=\"running\"} 1\n"), "{prom}");
    assert!(prom.contains("simple_ipc_status{status=\"passed\"} 0\n"), "{prom}");
    common::assert_nothing_left(pid, &[], "a run killed with SIGKILL");
}
