//! `--ipc all` on simulated GPUs, as issue 14 found it wanting: the user's options reach every mechanism's
//! run, and the table and the exit status say what those runs found.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{run, simulated, text};

/// The rows of the table at the end of an `--ipc all` run, without the header.
fn table_rows(all: &str) -> Vec<String> {
    let table: Vec<&str> = all.lines().skip_while(|l| !l.starts_with("mechanism")).collect();
    assert_eq!(table.len(), 4, "a header and a row per mechanism: {all}");
    table[1..].iter().map(|row| row.to_string()).collect()
}

/// `--sync memops` reaches the runs: where a device lacks stream memory operations, legacy and vmm are
/// waived for it as a run of each alone would be, and pool, which memops cannot order, is waived for that;
/// so the whole is waived (2), not "all passed".
#[test]
fn sync_memops_reaches_every_mechanism_and_pool_is_waived_for_it() {
    let out = run(simulated("ok,no-memops").args(["--ipc", "all", "--sync", "memops"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "every mechanism waived: {all}");
    let rows = table_rows(&all);
    for (row, mechanism) in rows[..2].iter().zip(["legacy", "vmm"]) {
        assert!(row.starts_with(mechanism), "{all}");
        assert!(row.contains("waived: No CUDA devices support IPC with --sync memops (device 1"), "{all}");
    }
    let pool = &rows[2];
    assert!(
        pool.starts_with("pool") && pool.contains("waived: --sync memops cannot order pool memory"),
        "{all}"
    );
    assert!(!all.contains("FAILED"), "{all}");

    // Where every device has them, legacy and vmm pass with memops, pool is still waived: passed (0).
    let out = run(simulated("ok,ok").args(["--ipc", "all", "--sync=memops"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let rows = table_rows(&all);
    assert!(rows[0].starts_with("legacy") && rows[0].ends_with("passed"), "{all}");
    assert!(rows[1].starts_with("vmm") && rows[1].ends_with("passed"), "{all}");
    assert!(
        rows[2].starts_with("pool") && rows[2].contains("waived: --sync memops cannot order pool"),
        "{all}"
    );
}

/// `--procs-per-device 3` on two devices: each of the three runs has six processes; `--timings`: each
/// prints its table.
#[test]
fn the_users_options_reach_every_run() {
    let out = run(simulated("ok,ok").args(["--procs-per-device", "3", "--ipc", "all", "--timings"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_eq!(all.matches("Process 5 complete!\n").count(), 3, "six processes in each run: {all}");
    assert!(!all.contains("Process 6"), "{all}");
    assert_eq!(all.matches("Timings (ms)\n").count(), 3, "{all}");
    assert!(table_rows(&all).iter().all(|row| row.ends_with("passed")), "{all}");
}

/// The runs' results (their JSON documents, with the open times) come back through pipes: a fresh TMPDIR
/// stays empty all through the run (it is looked at every millisecond), and a TMPDIR that does not exist
/// changes nothing.
#[test]
fn results_come_back_without_files() {
    let scratch = std::env::temp_dir();
    let tmpdir = scratch.join(format!("simple-ipc-all-tmpdir-{}", std::process::id()));
    std::fs::create_dir_all(&tmpdir).unwrap();
    let json = scratch.join(format!("simple-ipc-all-doc-{}.json", std::process::id()));
    for dir in [tmpdir.as_path(), Path::new("/nonexistent")] {
        let what = format!("TMPDIR={}", dir.display());
        let mut child = simulated("ok,ok")
            .args(["--ipc", "all", "--procs-per-device", "2", "--json"])
            .arg(&json)
            .env("TMPDIR", dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let out = std::thread::spawn(move || std::io::read_to_string(&mut stdout).unwrap());
        let err = std::thread::spawn(move || std::io::read_to_string(&mut stderr).unwrap());
        let mut seen = BTreeSet::new();
        while child.try_wait().unwrap().is_none() {
            seen.extend(std::fs::read_dir(&tmpdir).unwrap().flatten().map(|e| e.file_name()));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(seen.is_empty(), "{what}: the run wrote {seen:?} into {}", tmpdir.display());
        let all = out.join().unwrap() + &err.join().unwrap();
        assert_eq!(child.wait().unwrap().code(), Some(0), "{what}: {all}");
        for row in table_rows(&all) {
            let columns: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(columns.get(3), Some(&"passed"), "{what}: {all}");
            assert!(columns[2].parse::<f64>().is_ok(), "{what}: the open time came back: {row}");
        }
        let doc = std::fs::read_to_string(&json).unwrap();
        assert_eq!(doc.matches("\"open_one_ms\": ").count(), 3, "{doc}");
        assert!(!doc.contains("\"open_one_ms\": null"), "{what}: {doc}");
    }
    std::fs::remove_file(&json).unwrap();
    std::fs::remove_dir(&tmpdir).unwrap();
}
