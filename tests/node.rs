//! What the node says of a run, on simulated GPUs: the Xid errors of a kernel log the test writes
//! (`SIMPLE_IPC_TEST_KERNEL_LOG`), named beside a failure (and at the end of `--bench`) in the verdict, the
//! `--json` document and the metrics, for the run's GPUs only and only since the run began; and `--metrics`
//! in every mode (the sample, `--ipc all`, the container matrix, `--bench`, a served run), parsed with a
//! real parser (`prometheus-parse`) and read again strictly here: names, types, labels, escapes, each
//! family whole and once, no series twice.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{FAULT, run, simulated, text};
use serde_json::Value;

/// The test hook that gives the program a kernel log of the test's.
const KERNEL_LOG: &str = "SIMPLE_IPC_TEST_KERNEL_LOG";

fn scratch(name: &str) -> tempfile::TempDir {
    common::scratch(&format!("node-{name}"))
}

/// `CLOCK_MONOTONIC` now, in microseconds: the kernel log's clock.
fn monotonic_micros() -> i64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    now.tv_sec() * 1_000_000 + now.tv_nsec() / 1000
}

/// A kernel log in `/dev/kmsg`'s format in `dir`: each message stamped `seconds` from now (a record an hour
/// ahead is logged during the run; one 10 s ago, before it), each followed by a dictionary line.
fn kernel_log(dir: &Path, records: &[(i64, &str)]) -> PathBuf {
    let now = monotonic_micros();
    let mut text = String::new();
    for (seq, (seconds, message)) in records.iter().enumerate() {
        text.push_str(&format!("4,{seq},{},-;{message}\n SUBSYSTEM=pci\n", now + seconds * 1_000_000));
    }
    let path = dir.join("kmsg");
    std::fs::write(&path, text).unwrap();
    path
}

/// Simulated GPU 1's PCI address while a test's log is read, as the log writes it.
const GPU_1: &str = "PCI:0000:11:00";
const DURING: i64 = 3600;
const BEFORE: i64 = -10;

/// One series as read: its name, labels and value.
#[derive(Debug, Clone, PartialEq)]
struct Series {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

impl Series {
    fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}

/// The series of a metrics file, read by `prometheus-parse` and, strictly, by [`strictly`]: both must read
/// the same names, labels and values, every one a gauge.
fn parsed(text: &str) -> Vec<Series> {
    assert!(text.ends_with('\n'), "{text}");
    let strict = strictly(text);
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    assert_eq!(scrape.samples.len(), strict.len(), "every series is read by both: {text}");
    for (sample, series) in scrape.samples.iter().zip(&strict) {
        let labels: BTreeMap<String, String> =
            sample.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!((&sample.metric, &labels), (&series.name, &series.labels), "{text}");
        match sample.value {
            prometheus_parse::Value::Gauge(value) => assert_eq!(value, series.value, "{}", series.name),
            ref other => panic!("{}: {other:?} is no gauge: {text}", series.name),
        }
        assert!(scrape.docs.get(&series.name).is_some_and(|help| !help.is_empty()), "{}", series.name);
    }
    strict
}

/// Reads the exposition format strictly: each family's `# HELP` then `# TYPE gauge` once, before its series
/// and all of them together; names `simple_ipc_...` without `_total`; label names and escaped values as the
/// format has them; finite values; no timestamp; no series twice.
fn strictly(text: &str) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    let mut families: Vec<String> = Vec::new();
    let mut typed = false;
    for line in text.lines() {
        let family = families.last().cloned().unwrap_or_default();
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or_else(|| panic!("{line}"));
            assert!(!families.iter().any(|f| f == name), "{name} again: {text}");
            assert!(!help.trim().is_empty() && !help.contains('\\'), "{line}");
            families.push(name.to_owned());
            typed = false;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            assert_eq!(rest, format!("{family} gauge"), "TYPE after its HELP: {text}");
            typed = true;
        } else {
            assert!(typed, "a series before its family's HELP and TYPE: {line}");
            let one = series_of(line);
            assert_eq!(one.name, family, "each family's series together: {text}");
            assert!(!series.iter().any(|s| s.name == one.name && s.labels == one.labels), "twice: {line}");
            series.push(one);
        }
    }
    for name in &families {
        assert!(name.starts_with("simple_ipc_") && !name.ends_with("_total"), "{name}");
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{name}");
    }
    series
}

/// One series' line: `name{key="value",...} value`, the value's escapes (`\\`, `\"`, `\n`) read.
fn series_of(line: &str) -> Series {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("{line}"));
    let (name, mut rest) = line.split_at(name_end);
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.chars();
        loop {
            let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
            assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !key.is_empty(), "{line}");
            assert!(!key.starts_with(|c: char| c.is_ascii_digit()) && !key.starts_with("__"), "{line}");
            assert_eq!(chars.next(), Some('"'), "{line}");
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some('\\') => match chars.next() {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        other => panic!("escape {other:?}: {line}"),
                    },
                    Some('"') => break,
                    Some('\n') | None => panic!("an unterminated value: {line}"),
                    Some(c) => value.push(c),
                }
            }
            assert!(labels.insert(key, value).is_none(), "a label twice: {line}");
            match chars.next() {
                Some(',') => continue,
                Some('}') => break,
                other => panic!("{other:?} after a label: {line}"),
            }
        }
        rest = chars.as_str();
    }
    let value = rest.strip_prefix(' ').unwrap_or_else(|| panic!("one space before the value: {line}"));
    assert!(!value.contains(' '), "no timestamp: {line}");
    let value: f64 = value.parse().unwrap_or_else(|e| panic!("{e}: {line}"));
    assert!(value.is_finite(), "{line}");
    Series { name: name.to_owned(), labels, value }
}

/// The series of `name` (without the prefix).
fn of<'a>(series: &'a [Series], name: &str) -> Vec<&'a Series> {
    let name = format!("simple_ipc_{name}");
    series.iter().filter(|s| s.name == name).collect()
}

/// The value of the one series of `name` whose labels include `labels`.
fn value(series: &[Series], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<&Series> =
        of(series, name).into_iter().filter(|s| labels.iter().all(|(k, v)| s.label(k) == *v)).collect();
    assert!(matching.len() <= 1, "{name} {labels:?}: {matching:?}");
    matching.first().map(|s| s.value)
}

/// The metrics file `path`, parsed; its directory holds no temporary file.
fn metrics_of(path: &Path) -> Vec<Series> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dir = path.parent().unwrap();
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    parsed(&text)
}

/// Runs `command` with `--json` and `--metrics` into `dir`; its exit status, output, document and metrics.
fn run_with_both(dir: &Path, command: &mut Command) -> (Option<i32>, String, Value, Vec<Series>) {
    let (json, metrics) = (dir.join("run.json"), dir.join("run.prom"));
    let out = run(command.arg("--json").arg(&json).arg("--metrics").arg(&metrics));
    let said = text(&out);
    let doc = common::document(&json);
    (out.status.code(), said, doc, metrics_of(&metrics))
}

/// A served run on two simulated GPUs: `server` (its environment and options given) serving at an abstract
/// socket of this test's (`name`), and two joiners (each given the test fault `fault`, if any); the exit
/// status of the server and of each joiner.
fn served(name: &str, mut server: Command, fault: Option<&str>) -> (Option<i32>, Vec<Option<i32>>) {
    let socket = format!("@simple-ipc-test-node-{name}-{}", std::process::id());
    server.args(["--serve", &socket]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut server = server.spawn().unwrap();
    assert_eq!(common::wait_for_lines(&mut server, "waiting for", 1, Duration::from_secs(10)), 1);
    let joiners: Vec<_> = (0..2)
        .map(|_| {
            let mut joiner = simulated("ok,ok");
            joiner.args(["--join", &socket]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
            if let Some(fault) = fault {
                joiner.env(FAULT, fault);
            }
            joiner.spawn().unwrap()
        })
        .collect();
    let server = server.wait().unwrap().code();
    (server, joiners.into_iter().map(|mut joiner| joiner.wait().unwrap().code()).collect())
}

/// The last line of standard output: the verdict.
fn verdict(said: &str) -> &str {
    said.lines().rfind(|l| l.starts_with("PASSED") || l.starts_with("FAILED")).unwrap_or_default()
}

/// A run that fails with an Xid in the kernel's log for one of its GPUs names it: the hook says it is there,
/// the verdict line names the Xid and its GPU, the document lists it with what it means and what to do and
/// puts it in the cause and fix, and the metrics count it. An Xid of another GPU, or one logged before the
/// run began, is none of the run's.
#[test]
fn a_failure_names_the_xid_its_gpu_logged_in_the_verdict_the_document_and_the_metrics() {
    let dir = scratch("xid");
    let log = kernel_log(
        dir.path(),
        &[
            (BEFORE, "NVRM: Xid (PCI:0000:10:00): 43, pid=1, name=old, Ch 00000001"),
            (DURING, &format!("NVRM: Xid ({GPU_1}): 79, pid=0, GPU has fallen off the bus.")),
            (DURING, "NVRM: Xid (PCI:0000:99:00): 31, pid=7, name=another, Ch 00000008"),
            (DURING, "nvidia-nvlink: Nvlink Core is being initialized"),
        ],
    );
    let mut command = simulated("ok,ok");
    command.env(KERNEL_LOG, &log).env(FAULT, "child0@round-robin:error");
    let (code, said, doc, metrics) = run_with_both(dir.path(), &mut command);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains(&format!("TEST KERNEL LOG ({KERNEL_LOG}=")), "the hook says it is there: {said}");
    let verdict = verdict(&said);
    assert!(verdict.contains("Xid 79 (GPU has fallen off the bus) on GPU 1 (0000:11:00.0)"), "{verdict}");
    assert!(!said.contains("Xid 43") && !said.contains("Xid 31"), "none of the run's: {said}");
    assert!(said.contains("the node needs attention, not the program"), "{said}");

    let xids = doc["xid"].as_array().unwrap_or_else(|| panic!("an xid list: {doc}"));
    assert_eq!(xids.len(), 1, "{doc}");
    let xid = &xids[0];
    assert_eq!((xid["xid"].as_u64(), xid["device"].as_i64()), (Some(79), Some(1)), "{doc}");
    assert_eq!(xid["pci_bus_id"], doc["devices"][1]["pci_bus_id"], "matched by PCI address: {doc}");
    assert_eq!(
        (xid["uuid"].as_str(), xid["whose"].as_str()),
        (doc["devices"][1]["uuid"].as_str(), Some("node"))
    );
    assert!(xid["seconds_into_run"].as_f64().is_some_and(|s| s > 3000.0), "{doc}");
    assert!(
        xid["message"].as_str().is_some_and(|m| m.starts_with("NVRM: Xid (PCI:0000:11:00): 79")),
        "{doc}"
    );
    assert!(doc["reason"].as_str().is_some_and(|r| r.contains("Xid 79")), "{doc}");
    assert!(doc["cause"].as_str().is_some_and(|c| c.contains("Xid 79 on GPU 1")), "{doc}");
    assert!(doc["fix"].as_str().is_some_and(|f| f.contains("the node needs attention")), "{doc}");
    assert!(doc.get("kernel_log").is_none(), "the log was read: {doc}");

    let gpu_1 = [("device", "1"), ("xid", "79"), ("whose", "node"), ("pci_bus_id", "0000:11:00.0")];
    assert_eq!(value(&metrics, "xid_errors", &gpu_1), Some(1.0), "{metrics:?}");
    assert_eq!(of(&metrics, "xid_errors").len(), 1, "{metrics:?}");
    assert_eq!(value(&metrics, "status", &[("status", "failed")]), Some(1.0));
}

/// A run that passes reads no kernel log and says nothing of one, even where the log holds an Xid of its
/// GPU or cannot be read: that is no noise on a passing run.
#[test]
fn a_passing_run_reads_no_log_and_says_nothing_of_it() {
    let dir = scratch("passing");
    let planted = kernel_log(dir.path(), &[(DURING, &format!("NVRM: Xid ({GPU_1}): 31, pid=7"))]);
    for log in [planted, dir.path().join("absent")] {
        let mut command = simulated("ok,ok");
        command.env(KERNEL_LOG, &log);
        let (code, said, doc, metrics) = run_with_both(dir.path(), &mut command);
        assert_eq!(code, Some(0), "{said}");
        assert!(!said.contains("the kernel logged") && !said.contains("could not be read"), "{said}");
        assert!(doc.get("xid").is_none() && doc.get("kernel_log").is_none(), "{doc}");
        assert!(of(&metrics, "xid_errors").is_empty() && of(&metrics, "kernel_log_unreadable").is_empty());
    }
}

/// Where the log cannot be read, a failure says so once (on standard error and in the document's
/// `kernel_log`), and the metrics say it was unreadable; a benchmark that passes says it in its document
/// only.
#[test]
fn a_log_that_cannot_be_read_is_said_once() {
    let dir = scratch("unreadable");
    let absent = dir.path().join("absent");
    let mut command = simulated("ok");
    command.env(KERNEL_LOG, &absent).env(FAULT, "child0@round-robin:error");
    let (code, said, doc, metrics) = run_with_both(dir.path(), &mut command);
    assert_eq!(code, Some(1), "{said}");
    assert_eq!(said.matches("the kernel's log could not be read").count(), 1, "{said}");
    assert!(doc["kernel_log"].as_str().is_some_and(|why| why.contains("absent")), "{doc}");
    assert_eq!(value(&metrics, "kernel_log_unreadable", &[]), Some(1.0), "{metrics:?}");

    let mut command = simulated("ok");
    command.env(KERNEL_LOG, &absent).args(["--bench", "--ipc", "legacy", "--bench-max-bytes", "8KiB"]);
    let (code, said, doc, _) = run_with_both(dir.path(), &mut command);
    assert_eq!(code, Some(0), "{said}");
    assert!(!said.contains("could not be read"), "no noise on a passing run: {said}");
    assert!(doc["kernel_log"].as_str().is_some_and(|why| why.contains("absent")), "{doc}");
}

/// The benchmark reads the log at its end, passed or not: an Xid of its GPU is named and listed, and the
/// run still passes on its figures.
#[test]
fn the_benchmark_names_an_xid_at_its_end() {
    let dir = scratch("bench");
    let log =
        kernel_log(dir.path(), &[(DURING, "NVRM: Xid (PCI:0000:10:00): 13, Graphics SM Warp Exception")]);
    let mut command = simulated("ok");
    command.env(KERNEL_LOG, &log).args(["--bench", "--ipc", "vmm", "--bench-max-bytes", "8KiB"]);
    let (code, said, doc, metrics) = run_with_both(dir.path(), &mut command);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("the kernel logged Xid 13 on GPU 0 (0000:10:00.0)"), "{said}");
    assert_eq!(doc["xid"][0]["xid"].as_u64(), Some(13), "{doc}");
    assert_eq!(doc["xid"][0]["whose"], "program", "{doc}");
    assert!(doc["cause"].is_null(), "a pass has no cause: {doc}");
    assert_eq!(value(&metrics, "xid_errors", &[("xid", "13"), ("mechanism", "vmm")]), Some(1.0));
}

/// A served run that fails lists the Xid of a joiner's GPU in the server's document; where the record names
/// a process that is none of the run's (here pid 9, `name=xid`: the H200 host's wild write of another
/// process beside a failing run), it is said to be another process's and is no cause of the run's.
#[test]
fn a_served_runs_document_lists_the_xid_of_a_joiners_gpu_as_another_processes() {
    let dir = scratch("served");
    let log =
        kernel_log(dir.path(), &[(DURING, &format!("NVRM: Xid ({GPU_1}): 31, pid=9, name=xid, channel 2"))]);
    let json = dir.path().join("server.json");
    let mut server = simulated("ok,ok");
    server.env(KERNEL_LOG, &log).arg("--json").arg(&json);
    let (server, joiners) = served("xid", server, Some("child1@round-robin:error"));
    assert_eq!((server, joiners.len()), (Some(1), 2));
    let doc = common::document(&json);
    assert_eq!(
        (doc["xid"][0]["xid"].as_u64(), doc["xid"][0]["device"].as_i64()),
        (Some(31), Some(1)),
        "{doc}"
    );
    let xid = &doc["xid"][0];
    assert_eq!(
        (xid["pid"].as_u64(), xid["process_name"].as_str(), xid["process"].as_str()),
        (Some(9), Some("xid"), Some("another")),
        "{doc}"
    );
    assert!(
        doc["cause"].as_str().is_none_or(|c| !c.contains("Xid 31")),
        "another's fault is no cause: {doc}"
    );
    assert!(doc["reason"].as_str().is_some_and(|r| !r.contains("Xid 31")), "{doc}");
}

/// An Xid is the run's only where the kernel's record names one of its processes (or the node is at fault):
/// a child's fault (its pid as the kernel numbers it, this host's PID namespace being the kernel's) is named
/// in the verdict, the cause and the metrics as the run's; another process's on the same GPU (this test's
/// own pid) is listed as another's, said on standard error as such, and named nowhere as the cause; a
/// record that names no process (pid=0) is said so, and an Xid of the node's is still the run's cause.
#[test]
fn an_xid_is_the_runs_only_where_its_record_names_one_of_the_runs_processes() {
    let dir = scratch("whose");
    let log = dir.path().join("kmsg");
    std::fs::write(&log, "").unwrap();
    let (json, metrics) = (dir.path().join("run.json"), dir.path().join("run.prom"));
    let mut run = simulated("ok,ok")
        .args(["--timeout", "2"])
        .env(KERNEL_LOG, &log)
        .env(FAULT, "child1@round-robin:hang")
        .arg("--json")
        .arg(&json)
        .arg("--metrics")
        .arg(&metrics)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = run.id();
    assert_eq!(common::wait_for_lines(&mut run, "Starting on device", 2, Duration::from_secs(10)), 2);
    let guardian = common::guardian_of(pid);
    let children: Vec<u32> = common::descendants(pid).into_iter().filter(|&c| Some(c) != guardian).collect();
    assert_eq!(children.len(), 2, "{children:?}");
    let child = children[1];
    let another = std::process::id();
    // Written while the run waits for its hung child: read at its end.
    kernel_log(
        dir.path(),
        &[
            (DURING, &format!("NVRM: Xid ({GPU_1}): 31, pid={child}, name=simple-ipc, channel 1")),
            (DURING, &format!("NVRM: Xid ({GPU_1}): 43, pid={another}, name=xid, channel 2")),
            (DURING, &format!("NVRM: Xid ({GPU_1}): 79, pid=0, GPU has fallen off the bus.")),
        ],
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(1), "{stderr}");
    let doc = common::document(&json);
    let whose: Vec<(u64, Option<u64>, &str)> = doc["xid"]
        .as_array()
        .unwrap_or_else(|| panic!("{doc}"))
        .iter()
        .map(|x| (x["xid"].as_u64().unwrap(), x["pid"].as_u64(), x["process"].as_str().unwrap()))
        .collect();
    assert_eq!(
        whose,
        [
            (31, Some(u64::from(child)), "run"),
            (43, Some(u64::from(another)), "another"),
            (79, Some(0), "not_known")
        ],
        "{doc}"
    );
    let cause = doc["cause"].as_str().unwrap_or_else(|| panic!("a cause: {doc}"));
    assert!(cause.contains("Xid 31") && cause.contains("Xid 79") && !cause.contains("Xid 43"), "{cause}");
    let reason = doc["reason"].as_str().unwrap();
    assert!(reason.contains("Xid 31") && !reason.contains("Xid 43"), "{reason}");
    assert!(
        stderr.contains(&format!("pid {another} (xid), as the kernel numbers it: another process, not one of the run's; not this run's cause")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "pid {child} (simple-ipc), as the kernel numbers it: one of the run's processes"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("the record names no process"), "{stderr}");
    let series = metrics_of(&metrics);
    assert_eq!(value(&series, "xid_errors", &[("xid", "31"), ("process", "run")]), Some(1.0), "{series:?}");
    assert_eq!(
        value(&series, "xid_errors", &[("xid", "43"), ("process", "another")]),
        Some(1.0),
        "{series:?}"
    );
    assert_eq!(
        value(&series, "xid_errors", &[("xid", "79"), ("process", "not_known")]),
        Some(1.0),
        "{series:?}"
    );
}

/// The sample's metrics: how it ended, with what, the GPUs, each phase of each process (the parent's and
/// each child's, by mechanism), and MPS as the driver says it.
#[test]
fn a_runs_metrics_have_each_phase_of_each_process() {
    let dir = scratch("plain");
    let mut command = simulated("ok,ok");
    command.args(["--procs-per-device", "2", "--ipc", "pool"]);
    let (code, said, doc, metrics) = run_with_both(dir.path(), &mut command);
    assert_eq!(code, Some(0), "{said}");
    let info = of(&metrics, "info");
    assert_eq!(info.len(), 1, "{metrics:?}");
    assert_eq!(
        (info[0].label("mode"), info[0].label("ipc"), info[0].label("simulated")),
        ("run", "pool", "true")
    );
    assert_eq!(value(&metrics, "status", &[("status", "passed")]), Some(1.0));
    assert_eq!(of(&metrics, "status").iter().map(|s| s.value).sum::<f64>(), 1.0, "one status holds");
    assert_eq!(value(&metrics, "exit_status", &[]), Some(0.0));
    assert_eq!(of(&metrics, "device_info").len(), 2);
    assert_eq!(value(&metrics, "processes", &[("mechanism", "pool")]), Some(4.0));
    let processes: std::collections::BTreeSet<&str> =
        of(&metrics, "phase_seconds").iter().map(|s| s.label("process")).collect();
    assert_eq!(processes.into_iter().collect::<Vec<_>>(), ["0", "1", "2", "3", "parent"]);
    let round_robin = value(&metrics, "phase_seconds", &[("process", "2"), ("phase", "round_robin")]);
    let in_ms = doc["run"]["children"][2]["phases"]["round_robin"].as_f64().unwrap();
    // The document's milliseconds as seconds, without the float noise of the division (to the nanosecond).
    let seconds = (in_ms / 1e3 * 1e9).round() / 1e9;
    assert_eq!(round_robin, Some(seconds), "seconds, from the document's milliseconds");
    assert!(value(&metrics, "process_seconds", &[("process", "parent")]).is_some_and(|s| s > 0.0));
    assert_eq!(value(&metrics, "mps_client", &[]), Some(0.0));
}

/// `--ipc all`: each mechanism's status (one of four holds), its times, and its runs' phases by mechanism.
#[test]
fn every_mechanisms_result_is_in_the_metrics() {
    let dir = scratch("all");
    let (code, said, _, metrics) = run_with_both(dir.path(), simulated("ok,ok").args(["--ipc", "all"]));
    assert_eq!(code, Some(0), "{said}");
    for mechanism in ["legacy", "vmm", "pool", "fabric"] {
        let statuses = of(&metrics, "mechanism_status");
        let of_it: Vec<_> = statuses.iter().filter(|s| s.label("mechanism") == mechanism).collect();
        assert_eq!(of_it.len(), 4, "{mechanism}: {metrics:?}");
        assert_eq!(of_it.iter().map(|s| s.value).sum::<f64>(), 1.0, "{mechanism}");
    }
    assert_eq!(value(&metrics, "mechanism_status", &[("mechanism", "vmm"), ("status", "passed")]), Some(1.0));
    assert!(value(&metrics, "mechanism_seconds", &[("mechanism", "legacy")]).is_some_and(|s| s > 0.0));
    let vmm = [("mechanism", "vmm"), ("process", "1"), ("phase", "open_handles")];
    assert!(value(&metrics, "phase_seconds", &vmm).is_some(), "{metrics:?}");
}

/// `--bench`: each hand-over's round trip by its name and statistic, each copy's rate in bytes per second
/// by size and path, and MPS.
#[test]
fn the_benchmarks_figures_are_in_the_metrics() {
    let dir = scratch("benchmark");
    let mut command = simulated("ok,ok");
    command.args(["--bench", "--ipc", "vmm", "--bench-max-bytes", "16KiB"]);
    let (code, said, doc, metrics) = run_with_both(dir.path(), &mut command);
    assert_eq!(code, Some(0), "{said}");
    let pair = [("producer", "0"), ("consumer", "1"), ("mechanism", "vmm")];
    let trip = [&pair[..], &[("handover", "events_signal_only_gpu_waits"), ("statistic", "p50")]].concat();
    assert!(value(&metrics, "bench_round_trip_seconds", &trip).is_some_and(|s| s > 0.0), "{metrics:?}");
    let rate = [&pair[..], &[("size_bytes", "16384"), ("path", "ipc")]].concat();
    let copy = doc["bench"]["testcases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["producer"] == 0 && t["consumer"] == 1 && t["copy"]["bytes"] == 16384)
        .unwrap()["copy"]["ipc"]
        .as_f64()
        .unwrap();
    assert_eq!(value(&metrics, "bench_copy_bytes_per_second", &rate), Some(copy * 1e9), "GB/s in bytes/s");
    let reference = [&pair[..], &[("size_bytes", "16384"), ("path", "in_process_peer_copy")]].concat();
    assert!(value(&metrics, "bench_copy_bytes_per_second", &reference).is_some(), "{metrics:?}");
    assert!(!of(&metrics, "bench_copy_ipc_ratio").is_empty());
    assert_eq!(value(&metrics, "mps_client", &[]), Some(0.0));
    assert!(of(&metrics, "phase_seconds").is_empty(), "no sample's phases: {metrics:?}");
}

/// A served run: what each process that joined shares with the server, the forecast of each path for it,
/// and how each path the run took fared.
#[test]
fn what_a_served_runs_joiners_share_is_in_the_metrics() {
    let dir = scratch("serve");
    let prom = dir.path().join("served.prom");
    let mut server = simulated("ok,ok");
    server.arg("--metrics").arg(&prom);
    assert_eq!(served("metrics", server, None), (Some(0), vec![Some(0), Some(0)]));
    let metrics = metrics_of(&prom);
    for process in ["0", "1"] {
        let pid = [("process", process), ("fact", "pid_namespace"), ("same", "same")];
        assert_eq!(value(&metrics, "joiner_shares", &pid), Some(1.0), "{metrics:?}");
        let legacy = [("process", process), ("path", "legacy memory"), ("verdict", "works")];
        assert_eq!(value(&metrics, "joiner_forecast", &legacy), Some(1.0), "{metrics:?}");
    }
    let worked = [("path", "legacy memory"), ("outcome", "worked")];
    assert_eq!(value(&metrics, "path_outcome", &worked), Some(1.0), "{metrics:?}");
    assert_eq!(value(&metrics, "status", &[("status", "passed")]), Some(1.0));
}

/// The container matrix: each cell's result (one of five holds), by its `--isolate` and handle; and an
/// isolated run's metrics, which the process outside its namespaces writes.
#[test]
fn the_container_matrixs_cells_are_in_the_metrics() {
    let dir = scratch("matrix");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut command = simulated("ok");
    command.env("TMPDIR", &tmp).args(["--ipc", "all", "--isolate", "net"]);
    let (code, said, doc, metrics) = run_with_both(dir.path(), &mut command);
    if code == Some(2) {
        return common::skipped("namespaces", format!("this host gives no namespaces: {said}"));
    }
    assert_eq!(code, Some(0), "{said}");
    let cells = doc["matrix"].as_array().unwrap();
    let results = of(&metrics, "matrix_result");
    assert_eq!(results.len(), cells.len() * 5, "{metrics:?}");
    for cell in cells {
        let at =
            [("isolate", cell["isolate"].as_str().unwrap()), ("handle", cell["handle"].as_str().unwrap())];
        let held = [&at[..], &[("result", cell["result"].as_str().unwrap())]].concat();
        assert_eq!(value(&metrics, "matrix_result", &held), Some(1.0), "{cell}: {metrics:?}");
    }

    let isolated = dir.path().join("isolated.prom");
    let out = run(simulated("ok")
        .env("TMPDIR", &tmp)
        .args(["--ipc", "vmm", "--sync", "memops", "--isolate", "pid", "--metrics"])
        .arg(&isolated));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let metrics = metrics_of(&isolated);
    assert_eq!(value(&metrics, "status", &[("status", "passed")]), Some(1.0));
    assert_eq!(of(&metrics, "info")[0].label("isolate"), "pid");
    assert!(!of(&metrics, "joiner_shares").is_empty(), "{metrics:?}");
}

/// `--metrics -` writes the metrics alone on standard output (every other line on standard error); a
/// run cannot give standard output to both `--json -` and `--metrics -`, nor one file to both; and
/// `--metrics` is refused where no run is made (`--topology`, `--join`).
#[test]
fn metrics_go_to_standard_output_alone_and_never_share_a_destination() {
    let out = run(simulated("ok").args(["--metrics", "-"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let metrics = parsed(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(value(&metrics, "status", &[("status", "passed")]), Some(1.0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PASSED"), "{}", text(&out));

    let out = run(simulated("ok").args(["--json", "-", "--metrics", "-"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("cannot both have standard output"), "{}", text(&out));
    let dir = scratch("same");
    let file = dir.path().join("both");
    let out = run(simulated("ok").arg("--json").arg(&file).arg("--metrics").arg(&file));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("are the same file"), "{}", text(&out));
    assert!(!file.exists(), "nothing ran");
    for args in [&["--topology"][..], &["--join", "@nowhere"]] {
        let out = run(simulated("ok").args(args).args(["--metrics", "m.prom"]));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("--metrics"), "{}", text(&out));
    }
}

/// A run whose watchdog must end it (a call that never returns: here the parent hangs choosing its devices,
/// its first children waiting for the plan, as under a hung `cuInit`) still replaces a previous run's
/// documents: the `--json` document and the metrics say it failed, for the watchdog's reason, before the
/// verdict line says so. A node's textfile collector must never keep the last pass of a hung node.
#[test]
fn a_run_its_watchdog_ends_writes_both_documents_as_failed() {
    let dir = scratch("watchdog");
    let (json, metrics) = (dir.path().join("run.json"), dir.path().join("run.prom"));
    // The previous run's, which passed.
    let (code, said, _, _) = run_with_both(dir.path(), &mut simulated("ok"));
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(value(&metrics_of(&metrics), "status", &[("status", "passed")]), Some(1.0));
    let mut hung = simulated("ok");
    hung.args(["--timeout", "1"]).env(FAULT, "parent@device-selection:hang");
    let started = std::time::Instant::now();
    let (code, said, doc, series) = run_with_both(dir.path(), &mut hung);
    assert_eq!(code, Some(1), "{said}");
    assert!(started.elapsed() < Duration::from_secs(10), "the watchdog ended it: {said}");
    assert!(verdict(&said).contains("its own watchdog ended it"), "{said}");
    assert_eq!((doc["status"].as_str(), doc["exit_status"].as_u64()), (Some("failed"), Some(1)), "{doc}");
    assert!(doc["reason"].as_str().is_some_and(|r| r.contains("its own watchdog ended it")), "{doc}");
    assert_eq!(doc["options"]["timeout_s"].as_u64(), Some(1), "the run's own options: {doc}");
    assert_eq!(value(&series, "status", &[("status", "failed")]), Some(1.0), "{series:?}");
    assert_eq!(value(&series, "status", &[("status", "passed")]), Some(0.0), "{series:?}");
    assert_eq!(value(&series, "exit_status", &[]), Some(1.0), "{series:?}");
    assert!(json.exists() && metrics.exists());
}

/// The test's kernel log is a test hook, and held as one: it is said on standard error (so `--quiet` keeps
/// it) and marked in the document (`test_kernel_log`) and the metrics; a FIFO is refused unread (it would
/// hold a failing run past its --timeout and its watchdog), and so is a file larger than 16 MiB (read whole,
/// 512 MiB took 73 s and 11 GB); a record's bidirectional-text controls reach no output raw.
#[test]
fn the_test_kernel_log_is_announced_marked_and_bounded() {
    let dir = scratch("hook");
    let log = kernel_log(
        dir.path(),
        &[(DURING, &format!("NVRM: Xid ({GPU_1}): 79, pid=0, \u{202e}sub eht\u{202c}"))],
    );
    let mut command = simulated("ok,ok");
    command.env(KERNEL_LOG, &log).env(FAULT, "child0@round-robin:error").arg("--quiet");
    let out = run(command
        .arg("--json")
        .arg(dir.path().join("q.json"))
        .arg("--metrics")
        .arg(dir.path().join("q.prom")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("TEST KERNEL LOG ({KERNEL_LOG}=")),
        "said where --quiet keeps it: {stderr}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("\u{202e}") && !stderr.contains('\u{202e}'),
        "{stderr}"
    );
    assert!(stderr.contains("\\u{202e}sub eht"), "escaped: {stderr}");
    let doc = common::document(&dir.path().join("q.json"));
    assert_eq!(doc["test_kernel_log"].as_str(), log.to_str(), "{doc}");
    assert!(!doc.to_string().contains('\u{202e}'), "{doc}");
    assert_eq!(value(&metrics_of(&dir.path().join("q.prom")), "test_kernel_log", &[]), Some(1.0));

    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let huge = dir.path().join("huge");
    std::fs::File::create(&huge).unwrap().set_len(17 << 20).unwrap();
    for (log, why) in [(&fifo, "not a regular file"), (&huge, "more than the 16777216 read")] {
        let started = std::time::Instant::now();
        let mut command = simulated("ok");
        command.env(KERNEL_LOG, log).env(FAULT, "child0@round-robin:error").args(["--timeout", "5"]);
        let (code, said, doc, _) = run_with_both(dir.path(), &mut command);
        assert_eq!(code, Some(1), "{said}");
        assert!(started.elapsed() < Duration::from_secs(4), "{why}: {:?}: {said}", started.elapsed());
        assert!(doc["kernel_log"].as_str().is_some_and(|k| k.contains(why)), "{why}: {doc}");
    }
}

/// Standard output that cannot take them (`>/dev/full`): the run fails naming what it could not write, the
/// metrics or the document, never one for the other.
#[test]
fn what_standard_output_could_not_take_is_named() {
    for (option, named) in [("--metrics", "the metrics (--metrics -)"), ("--json", "the --json document")] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = simulated("ok").args([option, "-"]).stdout(full).stderr(Stdio::piped()).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(
            said.contains(&format!("FAILED (exit 1): writing {named} to standard output: No space left")),
            "{option}: {said}"
        );
    }
}
