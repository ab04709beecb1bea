//! The command line and the exit statuses, through the real binary.

mod common;

use assert_cmd::Command;
use common::{FAULT, SIMULATE, bin, run, simulated, text};

#[test]
fn usage_errors_exit_1_with_usage_help() {
    for args in [
        &["--nope"][..],
        &["-1"],
        &["abc"],
        &["32"],
        &["4294967296"],
        &["1", "2"],
        &["--procs-per-device", "0"],
        &["--procs-per-device", "33"],
        &["--procs-per-device"],
    ] {
        let out = Command::new(bin()).args(args).env_remove(SIMULATE).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?} must exit 1 (clap's 2 would read as waived)");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Usage:"), "{args:?}: no usage help in {err:?}");
    }
}

#[test]
fn help_and_version_exit_0() {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--procs-per-device") && help.contains("2 waived"), "{help}");
    assert!(!help.contains("CHILD"), "the child index is not for users: {help}");
    let version = Command::new(bin()).arg("--version").output().unwrap();
    assert_eq!(version.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("simple-ipc "));
}

/// The real run on this machine: where there is a GPU it passes; where there is none (CI) it is waived with
/// the original's line and a reason, and never fails.
#[test]
fn real_run_passes_or_is_waived_with_a_reason() {
    let out = Command::new(bin()).env_remove(SIMULATE).env_remove(FAULT).output().unwrap();
    let all = text(&out);
    match out.status.code() {
        Some(0) => assert!(all.contains("Process 0 complete!"), "{all}"),
        Some(2) => assert!(all.contains("No CUDA devices support IPC ("), "a waived run says why: {all}"),
        other => panic!("exit {other:?}: {all}"),
    }
    assert!(all.starts_with("PP: lshmName = simpleIPCshm"), "{all}");
}

#[test]
fn no_device_fit_for_ipc_is_waived_with_the_original_messages() {
    let out = run(&mut simulated("no-uva,exclusive"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Device 0 does not support unified addressing, skipping...\n"), "{stdout}");
    assert!(stdout.contains("Device 1 is in an unsupported compute mode for this sample\n"), "{stdout}");
    assert!(stdout.ends_with("No CUDA devices support IPC\n"), "{stdout}");

    let out = run(&mut simulated(""));
    assert_eq!(out.status.code(), Some(2), "no device at all: {}", text(&out));
}

#[test]
fn too_many_processes_is_a_failure_not_a_waiver() {
    let out = run(simulated("ok,ok").args(["--procs-per-device", "17"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("makes 34 processes; at most 32"), "{}", text(&out));
}

#[test]
fn malformed_fault_variable_is_refused() {
    let out = run(simulated("ok").env(FAULT, "child1@nowhere:kill"));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("SIMPLE_IPC_TEST_FAULT"), "{}", text(&out));
}
