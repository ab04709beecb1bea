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

    let mut vmm = simulated("ok,no-vmm");
    vmm.args(["--ipc", "vmm"]);
    let doc = document_of("waived-vmm", vmm, 2);
    let (word, reason) = status(&doc);
    assert_eq!(word, "waived", "{doc}");
    let expected = "No CUDA devices support IPC with --ipc vmm (device 1";
    assert!(reason.is_some_and(|r| r.starts_with(expected)), "{doc}");
}

/// `--ipc all`: a row per mechanism, each with the document its run wrote, read back as data.
#[test]
fn ipc_all_has_each_runs_document() {
    let mut command = simulated("ok,no-vmm");
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
