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
        // The child's hidden index stays out of the user's way: no tip to pass an option as a value.
        assert!(!err.contains("-- --"), "{args:?}: {err:?}");
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

/// On a machine without an NVIDIA driver (CI's), the real run is waived with the original's line and a
/// reason, never failed. Where there is a driver this test says so and asserts nothing: scripts/gpu-check.sh
/// tests the real run on GPUs.
#[test]
fn without_a_gpu_driver_the_real_run_is_waived_and_says_why() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        eprintln!(
            "SKIPPED without_a_gpu_driver_the_real_run_is_waived_and_says_why: this machine has a driver"
        );
        return;
    }
    let out = Command::new(bin()).env_remove(SIMULATE).env_remove(FAULT).output().unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.starts_with("PP: lshmName = simpleIPCshm"), "{all}");
    assert!(all.contains("No CUDA devices support IPC ("), "a waived run says why: {all}");
}

#[test]
fn no_device_fit_for_ipc_is_waived_with_the_original_messages() {
    let out = run(&mut simulated("no-uva,exclusive"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Device 0 does not support unified addressing, skipping...\n"), "{stdout}");
    assert!(stdout.contains("Device 1 is in an unsupported compute mode for this sample\n"), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[lines.len() - 2], "No CUDA devices support IPC", "the original's last line: {stdout}");
    let verdict = lines[lines.len() - 1];
    assert!(verdict.starts_with("WAIVED (exit 2, not a failure"), "then the verdict: {stdout}");
    assert!(
        verdict.contains(": No CUDA devices support IPC.")
            && verdict.contains("SIMPLE_IPC_SIMULATE_GPUS=ok,ok"),
        "{verdict}"
    );

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
