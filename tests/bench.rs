//! The `--bench` and `--topology` roles, on simulated GPUs (the numbers are host memcpy's, so only the
//! shape of the output and the clean-up are asserted here; the GPU figures come from scripts/perf.py).

mod common;

use common::{run, simulated, text};

/// One row set per (producer, consumer) pair: six kinds of hand-over, and per size the IPC copy beside the
/// local copy (one GPU) or the in-process peer copy (two GPUs), cache-sized rows marked; the JSON has every
/// figure; nothing is left.
#[test]
fn bench_prints_a_row_set_per_pair_and_writes_json() {
    for mechanism in ["legacy", "pool"] {
        let dir = common::scratch(&format!("bench-{mechanism}"));
        let json = dir.path().join("bench.json");
        let (pid, out) = common::run_with_pid(
            simulated("ok,ok")
                .args(["--bench", "--ipc", mechanism, "--bench-max-bytes", "262144", "--json"])
                .arg(&json),
        );
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{all}");
        assert!(all.contains(&format!("IPC benchmark, {mechanism} IPC, 4 pair(s)")), "{all}");
        assert_eq!(all.matches("== pair ").count(), 4, "{all}");
        assert_eq!(all.matches("): one GPU\n").count(), 2, "(0,0) and (1,1): {all}");
        let pair = |p: i32, c: i32, kind: &str| {
            format!(
                "producer on device {p} (Simulated GPU {p}), consumer on device {c} (Simulated GPU {c}): {kind}\n"
            )
        };
        assert!(all.contains(&pair(0, 0, "one GPU")) && all.contains(&pair(1, 0, "two GPUs")), "{all}");
        assert!(all.contains("MPS: no control daemon at "), "the header says whether MPS is there: {all}");
        assert_eq!(all.matches("): two GPUs\n").count(), 2, "(0,1) and (1,0): {all}");
        for kind in [
            "events, signal only, GPU waits",
            "events, a fill on each side",
            "stream memops, signal only, queued ahead (mean)",
        ] {
            assert_eq!(all.matches(kind).count(), 4, "{kind}: {all}");
        }
        assert_eq!(all.matches("local copy GB/s").count(), 2, "{all}");
        assert_eq!(all.matches("in-process peer GB/s").count(), 2, "{all}");
        let rows: Vec<&str> = all.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).collect();
        assert_eq!(rows.len(), 4 * 4, "4, 16, 64 and 256 KiB per pair: {all}");
        // The simulated L2 is 64 KiB: the three smaller sizes are marked, 256 KiB is not.
        assert_eq!(rows.iter().filter(|r| r.contains("KiB*")).count(), 4 * 3, "{all}");
        assert!(rows.iter().all(|r| r.ends_with('%')), "{all}");
        // Rates in GB/s that a copy between host memory mappings can have.
        for row in &rows {
            let rates: Vec<f64> =
                row.split_whitespace().filter_map(|w| w.parse().ok()).skip(1).take(2).collect();
            assert_eq!(rates.len(), 2, "{row}");
            assert!(rates.iter().all(|r| *r > 0.01 && *r < 10_000.0), "{row}");
        }
        // Every round trip is a median within its 10th to 90th percentiles, over more than one round.
        for line in all.lines().filter(|l| l.contains("events,") || l.contains("memops,")) {
            let figures = line.rsplit("  ").next().unwrap().trim();
            if figures.ends_with("(mean)") {
                assert!(figures.trim_end_matches(" (mean)").parse::<f64>().unwrap() > 0.0, "{line}");
                continue;
            }
            let numbers: Vec<f64> =
                figures.split(['(', ')', '-', ' ']).filter_map(|n| n.parse().ok()).collect();
            let [p50, p10, p90] = numbers[..] else { panic!("{line}") };
            assert!(p10 <= p50 && p50 <= p90 && p10 < p90 && p10 > 0.0, "{line}");
        }
        let doc = common::document(&json);
        assert_eq!((doc["status"].as_str(), doc["mode"].as_str()), (Some("passed"), Some("bench")), "{doc}");
        let bench = &doc["bench"];
        assert_eq!(bench["mechanism"], mechanism, "{doc}");
        assert_eq!(doc["driver"]["simulated"], true, "{doc}");
        let tests = bench["testcases"].as_array().unwrap();
        assert_eq!(tests.len(), 4 * (6 + 4), "{doc}");
        assert!(tests.iter().all(|t| t["status"] == "passed"), "{doc}");
        let copies: Vec<&serde_json::Value> = tests.iter().filter(|t| t["name"] == "copy").collect();
        assert_eq!(copies.len(), 4 * 4, "{doc}");
        assert!(copies.iter().any(|t| t["copy"]["fits_in_l2"] == true), "{doc}");
        // One GPU: the local copy; two: the in-process peer copy.
        for test in copies {
            let reference =
                if test["producer"] == test["consumer"] { "local copy" } else { "in-process peer copy" };
            assert_eq!(test["copy"]["reference_name"], reference, "{test}");
            assert_eq!(test["copy"]["unit"], "GB/s", "{test}");
        }
        assert!(
            common::wait_group_gone(pid, std::time::Duration::from_secs(3)).is_some(),
            "the producer is gone"
        );
        assert_eq!(common::leftovers(pid, &[]), Vec::<String>::new());
    }
}

/// Where stream memory operations are missing, their rows are waived with the reason; the rest runs.
#[test]
fn bench_waives_the_memops_rows_where_they_are_missing() {
    let out = run(simulated("ok,no-memops").args(["--bench", "--bench-max-bytes", "4096"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_eq!(all.matches("waived: device 1 has no stream memory operations").count(), 4 * 3, "{all}");
    assert_eq!(all.matches("events, signal only, host waits").count(), 4, "{all}");
}

#[test]
fn bench_measures_one_mechanism_at_a_time() {
    let out = run(simulated("ok").args(["--bench", "--ipc", "all"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--bench measures one mechanism at a time"), "{}", text(&out));
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
