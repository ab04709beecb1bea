//! The unit tests of `report`: the document's file, and what each form says where the other failed.

use std::sync::Arc;

use super::destination::Output;
use super::final_document::not_written;
use super::*;

#[test]
fn a_regular_file_is_replaced_whole_and_anything_else_refused_without_blocking() {
    let asked = || {
        let (mode, options) = crate::role::Role::Topology.asked();
        (mode, Options { ipc: "vmm".into(), ..options })
    };
    let tmp = tempfile::Builder::new().prefix("simple-ipc-json-").tempdir().unwrap();
    let dir = tmp.path();
    let file = dir.join("t.json");
    std::fs::write(&file, "an old and much longer document").unwrap();
    let metrics = dir.join("t.prom");
    std::fs::write(&metrics, "simple_ipc_status{status=\"passed\"} 1\n").unwrap();
    let opened = open(Some(&file), Some(&metrics), asked()).unwrap().unwrap();
    // As it begins, the run says so in both files: a run killed now leaves no earlier run's word there.
    let running: Document = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!((running.status, running.exit_status), (Status::Running, None));
    let pid = format!("the run (pid {}) has begun and not ended", std::process::id());
    assert!(running.reason.as_deref().is_some_and(|r| r.starts_with(&pid)), "{:?}", running.reason);
    let prom = std::fs::read_to_string(&metrics).unwrap();
    assert!(prom.contains("simple_ipc_status{status=\"running\"} 1\n"), "{prom}");
    assert!(
        prom.contains("simple_ipc_status{status=\"passed\"} 0\n") && !prom.contains("exit_status"),
        "{prom}"
    );
    let diagnosis = Diagnosis::new("the cause".into(), "; what fixes it: ", "the fix".into());
    let failed = Verdict { diagnosis: Some(&diagnosis), ..Verdict::of(Status::Failed, "x", 1) };
    let findings = Findings { results: Some(Results::Mechanisms(Vec::new())), ..Findings::default() };
    final_document(Some(Arc::new(opened)), &failed, findings).unwrap().write().unwrap();
    let doc: Document = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!((doc.status, doc.exit_status, doc.reason.as_deref()), (Status::Failed, Some(1), Some("x")));
    assert_eq!((doc.cause.as_deref(), doc.fix.as_deref()), (Some("the cause"), Some("the fix")));
    assert_eq!((doc.mode, doc.options.ipc.as_str()), (Mode::Run, "vmm"));
    assert_eq!(doc.mechanisms, Some(Vec::new()), "the role's results are there");
    let prom = std::fs::read_to_string(&metrics).unwrap();
    assert!(
        prom.contains("simple_ipc_status{status=\"failed\"} 1\n") && prom.contains("exit_status 1"),
        "{prom}"
    );
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 2, "no temporary file is left");

    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let Err(refused) = open(Some(&fifo), None, asked()) else { panic!("a FIFO is refused") };
    assert!(format!("{refused:#}").contains("is a FIFO"), "{refused:#}");
    assert!(open(Some(&dir.join("no/such/dir/t.json")), None, asked()).is_err());
    assert!(open(Some(dir), None, asked()).is_err(), "a directory is refused");
}

/// As the run begins, a file that cannot take the running document (its directory gone, its file system
/// full) does not keep the other from taking it: each says `running` where it can, and each that cannot is
/// an error of its own, naming its file.
#[test]
fn a_file_that_cannot_take_the_running_document_leaves_the_other_none_the_less_running() {
    let tmp = tempfile::Builder::new().prefix("simple-ipc-running-").tempdir().unwrap();
    let passed = "simple_ipc_status{status=\"passed\"} 1\n";
    for gone in [Output::Json, Output::Metrics] {
        let (kept, lost) = (tmp.path().join("kept"), tmp.path().join("lost"));
        for dir in [&kept, &lost] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let (json, metrics) = match gone {
            Output::Json => (lost.join("run.json"), kept.join("run.prom")),
            Output::Metrics => (kept.join("run.json"), lost.join("run.prom")),
        };
        for file in [&json, &metrics] {
            std::fs::write(file, passed).unwrap();
        }
        let json_target = Target::checked(Output::Json, &json).unwrap();
        let metrics_target = Target::checked(Output::Metrics, &metrics).unwrap();
        // Checked, then gone before the run's first write: as a file system that cannot take it now.
        std::fs::remove_dir_all(&lost).unwrap();
        let opened =
            Opened::new(Some(json_target), Some(metrics_target), crate::role::Role::Topology.asked());
        let failed = opened.write_running();
        let said: Vec<String> = failed.iter().map(|e| format!("{e:#}")).collect();
        let lost_one = if gone == Output::Json { &json } else { &metrics };
        assert_eq!(said.len(), 1, "{gone:?}: {said:?}");
        assert!(said[0].contains(&lost_one.display().to_string()), "{gone:?}: named: {said:?}");
        let there = std::fs::read_to_string(if gone == Output::Json { &metrics } else { &json }).unwrap();
        let running = match gone {
            Output::Json => there.contains("simple_ipc_status{status=\"running\"} 1\n"),
            Output::Metrics => {
                serde_json::from_str::<Document>(&there).is_ok_and(|d| d.status == Status::Running)
            }
        };
        assert!(
            running,
            "{gone:?}: the other file says the run is running, not the last run's pass: {there}"
        );
        std::fs::remove_dir_all(&kept).unwrap();
    }
}

/// Where one form of the document could not be written, the other says so: a pass or a waiver is a
/// failure for that reason (as `main` says it), a reader gone is an interruption (141), and a failure
/// stays the failure it was.
#[test]
fn the_other_form_says_what_could_not_be_written() {
    let mut passed = document::example();
    (passed.status, passed.reason, passed.exit_status) = (Status::Passed, None, Some(0));
    passed.summary = Some("2 processes".into());
    assert_eq!(not_written(&passed, &Ok(())), None);
    let full = not_written(&passed, &Err(anyhow::anyhow!("disk full"))).unwrap();
    assert_eq!(
        (full.status, full.reason.as_deref(), full.exit_status),
        (Status::Failed, Some("disk full"), Some(1))
    );
    assert_eq!(full.summary, None);
    let gone = not_written(&passed, &Err(crate::output::ReaderGone.into())).unwrap();
    assert_eq!((gone.status, gone.exit_status), (Status::Interrupted, Some(141)));
    let failed = document::example();
    let still = not_written(&failed, &Err(anyhow::anyhow!("disk full"))).unwrap();
    assert_eq!((still.status, still.reason), (Status::Failed, failed.reason.clone()));
}

#[test]
fn the_kernel_modules_version_is_read_from_its_line() {
    let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:38 UTC 2025\nGCC version:  gcc version 12.3.0\n";
    assert_eq!(version_in(proprietary).as_deref(), Some("580.65.06"));
    // The H200 host's.
    let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n";
    assert_eq!(version_in(open).as_deref(), Some("580.159.04"));
    assert_eq!(version_in("GCC version: 12.3.0\n"), None);
}
