//! The `--bench` and `--topology` roles, on simulated GPUs (the numbers are host memcpy's, so only the
//! shape of the output and the clean-up are asserted here; the GPU figures come from scripts/perf.py).

mod common;

use std::process::Stdio;

use common::{group_gone, run, shm_exists, simulated, text};

#[test]
fn bench_prints_one_row_per_size_and_cleans_up() {
    let child = simulated("ok")
        .args(["--bench", "--bench-max-bytes", "65536"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("IPC hand-over benchmark: producer on device 0"), "{all}");
    assert!(
        all.contains("stream-ordered") && all.contains("host-ordered") && all.contains("staged GB/s"),
        "{all}"
    );
    assert!(all.contains("shared-flag round trip alone, us: "), "{all}");
    let rows: Vec<&str> = all.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).collect();
    assert_eq!(rows.len(), 3, "4, 16 and 64 KiB: {all}");
    for (row, size) in rows.iter().zip(["4 KiB", "16 KiB", "64 KiB"]) {
        assert!(row.trim_start().starts_with(size), "{row}");
        assert!(row.contains('%') && row.contains('(') && row.contains('-'), "{row}");
    }
    assert!(group_gone(pid), "the consumer is gone");
    assert!(!shm_exists(&format!("simpleIPCshm{pid}")));
}

#[test]
fn bench_waives_without_a_device() {
    let out = run(simulated("no-uva").arg("--bench"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn topology_prints_the_peer_matrix_and_placement() {
    let out = run(simulated("ok,no-peer").arg("--topology"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("    GPU0     -    no\n") && stdout.contains("    GPU1    no     -\n"),
        "{stdout}"
    );
    assert!(stdout.contains("GPU1: Simulated GPU 1, PCI none, NUMA node unknown"), "{stdout}");
}

#[test]
fn bind_numa_says_what_it_did_and_still_passes() {
    let out = run(simulated("ok").args(["--bind-numa", "--procs-per-device", "2"]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(stdout.matches("has no known NUMA node; not bound").count(), 2, "{stdout}");
}
