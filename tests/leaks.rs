//! Every owner's `Drop` does its work: the simulated driver, when a process drops it, says on standard
//! error what the process still holds (`simulated driver: process <pid> ended holding ...`). No process of
//! a normal run, with each mechanism, each ordering and the benchmark, nor of a run whose child fails
//! on its way (its owners drop as the error returns), may say it.

mod common;

use common::{FAULT, run, simulated, text};

const LEAK: &str = "ended holding";

/// Fabric needs an IMEX channel, which the simulated devices have only when told (`imex`).
fn devices_for(args: &[&str]) -> &'static str {
    if args.contains(&"fabric") { "ok+imex,ok+imex" } else { "ok,ok" }
}

fn assert_no_leak(args: &[&str], fault: Option<&str>, status: i32) {
    let mut command = simulated(devices_for(args));
    command.args(args);
    if let Some(fault) = fault {
        command.env(FAULT, fault);
    }
    let out = run(&mut command);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(status), "{args:?} {fault:?}: {all}");
    let leaks: Vec<&str> = all.lines().filter(|line| line.contains(LEAK)).collect();
    assert!(
        leaks.is_empty(),
        "{args:?} {fault:?}: a process ended holding driver resources: {leaks:#?}\n{all}"
    );
}

#[test]
fn runs_with_each_mechanism_and_ordering_end_holding_nothing() {
    for mechanism in ["legacy", "vmm", "pool", "fabric"] {
        assert_no_leak(&["--ipc", mechanism, "--procs-per-device", "2"], None, 0);
    }
    for mechanism in ["legacy", "vmm", "fabric"] {
        assert_no_leak(&["--ipc", mechanism, "--sync", "memops"], None, 0);
    }
}

#[test]
fn the_benchmark_ends_holding_nothing() {
    for mechanism in ["legacy", "vmm", "pool", "fabric"] {
        assert_no_leak(&["--bench", "--ipc", mechanism, "--bench-max-bytes", "65536"], None, 0);
    }
}

#[test]
fn a_child_failing_on_its_way_ends_holding_nothing() {
    for mechanism in ["legacy", "vmm", "pool", "fabric"] {
        for phase in ["open-handles", "round-robin", "verify"] {
            let fault = format!("child1@{phase}:error");
            assert_no_leak(&["--ipc", mechanism], Some(&fault), 1);
        }
    }
}
