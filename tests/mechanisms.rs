//! `--ipc legacy|vmm|pool|fabric|all` on simulated GPUs: the whole protocol with each mechanism, with real
//! descriptors passed over SCM_RIGHTS between real processes; what a child does when the descriptors do not
//! come as the segment says; the waivers (fabric's, by attribute and by trial, among them); and the
//! `--ipc all` table, its JSON and its exit statuses.

mod common;

use common::{FAULT, run, simulated, text};

/// The header and rows of the table at the end of an `--ipc all` run (what the runs said on standard error
/// may follow it in `all`).
fn table_of(all: &str) -> Vec<&str> {
    let rows = ["legacy ", "vmm ", "pool ", "fabric "];
    let mut lines = all.lines().skip_while(|l| !l.starts_with("mechanism"));
    let header = lines.next().into_iter();
    header.chain(lines.take_while(|l| rows.iter().any(|r| l.starts_with(r)))).collect()
}

/// Each child's count of descriptors (`descriptors_before_open` or `descriptors_after_close`) in a run's
/// `--json` document.
fn descriptors(doc: &serde_json::Value, key: &str) -> Vec<u64> {
    let children = doc["run"]["children"].as_array().unwrap_or_else(|| panic!("no children: {doc}"));
    children.iter().map(|child| child[key].as_u64().unwrap_or_else(|| panic!("no {key}: {doc}"))).collect()
}

/// Runs `command`, returning its pid, status and all its output.
fn run_pid(command: &mut std::process::Command) -> (u32, Option<i32>, String) {
    let (pid, out) = common::run_with_pid(command);
    (pid, out.status.code(), text(&out))
}

#[test]
fn every_mechanism_runs_the_whole_protocol_on_several_devices() {
    for mechanism in ["legacy", "vmm", "pool"] {
        for ppd in ["1", "4"] {
            let what = format!("--ipc {mechanism} --procs-per-device {ppd}");
            let dir = common::scratch(&format!("mech-{mechanism}"));
            let json = dir.path().join("run.json");
            let (pid, code, all) = run_pid(
                simulated("ok,ok").args(["--ipc", mechanism, "--procs-per-device", ppd, "--json"]).arg(&json),
            );
            assert_eq!(code, Some(0), "{what}: {all}");
            let n = 2 * ppd.parse::<usize>().unwrap();
            for i in 0..n {
                assert!(all.contains(&format!("Process {i} complete!\n")), "{what}: {all}");
                assert!(all.contains(&format!("Step {i} done\n")), "{what}: {all}");
            }
            let doc = common::document(&json);
            assert_eq!(doc["options"]["ipc"], mechanism, "{what}: the JSON names it: {doc}");
            // Every descriptor a child received is closed: as many open at the end as before opening.
            let (before, after) =
                (descriptors(&doc, "descriptors_before_open"), descriptors(&doc, "descriptors_after_close"));
            assert_eq!(before.len(), n, "{what}: {doc}");
            assert!(before.iter().all(|&b| b > 3), "{what}: counted (0, 1, 2, the segment, ...): {doc}");
            assert_eq!(before, after, "{what}: a child left descriptors open: {doc}");
            common::assert_run_clean(pid, &what);
        }
    }
}

/// A child that gets too few descriptors, none, or a socket closed before anything came, exits 1 and says
/// why; the run stops and leaves nothing.
#[test]
fn descriptors_that_do_not_come_as_the_segment_says_fail_the_run() {
    for mechanism in ["vmm", "pool"] {
        for (fault, message) in [
            ("send-fewer", "expected 3 descriptors (one per process), received 2 (the message declares 3)"),
            ("send-none", "expected 3 descriptors (one per process), received 0 (the message declares 3)"),
            ("close-socket", "the parent closed the descriptor socket before sending any descriptor"),
        ] {
            let what = format!("--ipc {mechanism}, parent@allocate-export:{fault}");
            let (pid, code, all) = run_pid(
                simulated("ok")
                    .args(["--ipc", mechanism, "--procs-per-device", "3"])
                    .env(FAULT, format!("parent@allocate-export:{fault}")),
            );
            assert_eq!(code, Some(1), "{what}: {all}");
            assert!(all.contains(message), "{what}: {all}");
            assert!(all.contains("failed! (exit code 1)"), "{what}: the parent names the child: {all}");
            assert!(!all.contains("panicked"), "{what}: {all}");
            common::assert_run_clean(pid, &what);
        }
    }
}

/// A mechanism that no device has is waived with the reason (exit 2), never failed; a device that lacks
/// it is skipped with its reason, as the original's filter skips one, and the run goes on on the others.
#[test]
fn a_mechanism_the_device_lacks_is_waived_with_the_reason() {
    for (device, mechanism, reason) in [
        ("no-vmm", "vmm", "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"),
        ("no-pools", "pool", "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED"),
    ] {
        let out = run(simulated(&format!("{device},{device}")).args(["--ipc", mechanism]));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{device}: {all}");
        assert!(
            all.contains(&format!("No CUDA devices support IPC with --ipc {mechanism} (device 0")),
            "{all}"
        );
        assert!(all.contains(reason), "{device}: {all}");
        let out = run(simulated(&format!("ok,{device}")).args(["--ipc", mechanism]));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{device}: runs on device 0: {all}");
        let skipped =
            format!("Device 1 cannot run --ipc {mechanism} (device 1 does not report {reason}), skipping...");
        assert!(all.contains(&skipped), "{all}");
        assert!(all.contains("PASSED: 1 process on 1 GPU"), "{all}");
    }
    // Legacy is asked by trial (an export), on every device.
    let out = run(simulated("ok,no-legacy-ipc").args(["--ipc", "legacy"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.contains("No CUDA devices support IPC with --ipc legacy (device 1"), "{all}");
    assert!(all.contains("cannot export a legacy IPC handle, as on WSL and Tegra"), "{all}");
    let out = run(simulated("no-memops,no-memops").args(["--sync", "memops"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("No CUDA devices support IPC with --sync memops (device 0"),
        "{}",
        text(&out)
    );
    let out = run(simulated("ok,no-memops").args(["--sync", "memops"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("Device 1 cannot run --sync memops (device 1 has no stream memory"),
        "{}",
        text(&out)
    );
    // The other mechanisms still run on such a device.
    let out = run(simulated("ok,no-vmm").args(["--ipc", "pool"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("PASSED: 2 processes on 2 GPUs"), "{}", text(&out));
}

/// Where CUDA IPC cannot work, the waiver says why in the words of NVIDIA's documents (exit 2), never a
/// failure: MIG devices on different GPU instances, for every mechanism (what one MIG device does is asked by
/// trial, and passes here); legacy on WSL2, where vmm and memops are asked by trial and pass.
#[test]
fn where_cuda_ipc_cannot_work_the_waiver_says_so() {
    for (gpus, mechanism) in [("ok+mig,ok+mig", "legacy"), ("ok+mig,ok+mig", "vmm"), ("ok,ok+mig", "pool")] {
        let out = run(simulated(gpus).args(["--ipc", mechanism]));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{gpus} {mechanism}: {all}");
        let line =
            format!("No CUDA devices support IPC with --ipc {mechanism} (the processes are on devices 0 (");
        assert!(all.contains(&line) && all.contains("1 (MIG-"), "{all}");
        assert!(
            all.contains("on different GPU instances: CUDA IPC across GPU instances is not supported (NVIDIA's MIG user guide"),
            "{all}"
        );
    }
    let one = run(simulated("ok+mig").args(["--ipc", "vmm", "--procs-per-device", "2"]));
    assert_eq!(one.status.code(), Some(0), "one MIG device: asked by trial: {}", text(&one));

    let out = run(simulated("ok+wsl,ok+wsl").args(["--ipc", "legacy"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(
        all.contains("No CUDA devices support IPC with --ipc legacy (this is WSL2 (simulated: /dev/dxg is present): legacy IPC is not supported there (NCCL probes for it)"),
        "{all}"
    );
    for args in [&["--ipc", "vmm"][..], &["--ipc", "vmm", "--sync", "memops"], &["--ipc", "pool"]] {
        let out = run(simulated("ok+wsl,ok+wsl").args(args));
        assert_eq!(out.status.code(), Some(0), "WSL2 {args:?}: asked by trial: {}", text(&out));
    }
}

#[test]
fn ipc_all_prints_a_table_and_exits_by_the_worst_result() {
    let dir = common::scratch("all-test");
    let json = dir.path().join("all.json");
    // One waived, two passed: exit 0.
    let out = run(simulated("no-vmm,no-vmm")
        .args(["--ipc", "all", "--procs-per-device", "2", "--json"])
        .arg(&json));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let table = table_of(&all);
    assert_eq!(table.len(), 5, "a header and a row per mechanism: {all}");
    assert!(table[1].starts_with("legacy") && table[1].ends_with("passed"), "{}", table[1]);
    assert!(
        table[2].starts_with("vmm") && table[2].contains("waived: No CUDA devices support IPC"),
        "{}",
        table[2]
    );
    assert!(table[3].starts_with("pool") && table[3].ends_with("passed"), "{}", table[3]);
    assert!(table[4].starts_with("fabric") && table[4].contains("waived: "), "{}", table[4]);
    let doc = common::document(&json);
    let rows = doc["mechanisms"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{doc}");
    assert_eq!((rows[0]["mechanism"].as_str(), rows[0]["status"].as_str()), (Some("legacy"), Some("passed")));
    assert!(rows[0]["reason"].is_null() && rows[0]["wall_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{doc}");
    assert_eq!((rows[1]["mechanism"].as_str(), rows[1]["status"].as_str()), (Some("vmm"), Some("waived")));
    assert!(rows[1]["reason"].as_str().is_some_and(|r| r.starts_with("No CUDA devices")), "{doc}");

    // Every mechanism waived: exit 2.
    let out = run(simulated("no-legacy-ipc+no-vmm+no-pools").args(["--ipc", "all"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // One failed: exit 1, and the table says which and why.
    let out = run(simulated("ok").args(["--ipc", "all"]).env(FAULT, "parent@allocate-export:send-none"));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let table = table_of(&all);
    assert!(table[1].ends_with("passed"), "legacy has no descriptors to miss: {all}");
    assert!(table[2].contains("FAILED") && table[3].contains("FAILED"), "{all}");
    assert!(
        table[4].starts_with("fabric") && table[4].contains("waived: "),
        "no descriptors, no fault: {all}"
    );
    assert!(all.contains("--ipc all: vmm, pool failed"), "{all}");
}

#[test]
fn an_unknown_mechanism_is_a_usage_error() {
    let out = run(simulated("ok").args(["--ipc", "nvlink"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("possible values: legacy, vmm, pool, fabric, all"), "{}", text(&out));
}

/// The waiver of a device that reports fabric handles where this process may not create them (no IMEX
/// channel, as on the H200 host): the words both facts need.
const FABRIC_NOT_PERMITTED: &str = "the device reports fabric handles, but this process may not create \
    them: CUDA_ERROR_NOT_PERMITTED; an IMEX channel is needed";

/// `--ipc fabric` where the processes have an IMEX channel: the whole protocol, ordered by events and by
/// stream memory operations, several processes per device; the 64-byte handles travel in the segment, so
/// no descriptor comes to any child.
#[test]
fn fabric_runs_the_whole_protocol_where_there_is_an_imex_channel() {
    for sync in ["events", "memops"] {
        for ppd in ["1", "3"] {
            let what = format!("--ipc fabric --sync {sync} --procs-per-device {ppd}");
            let dir = common::scratch(&format!("fabric-{sync}-{ppd}"));
            let json = dir.path().join("run.json");
            let (pid, code, all) = run_pid(
                simulated("ok+imex,ok+imex")
                    .args(["--ipc", "fabric", "--sync", sync, "--procs-per-device", ppd, "--json"])
                    .arg(&json),
            );
            assert_eq!(code, Some(0), "{what}: {all}");
            let n = 2 * ppd.parse::<usize>().unwrap();
            for i in 0..n {
                assert!(all.contains(&format!("Process {i} complete!\n")), "{what}: {all}");
                assert!(all.contains(&format!("Step {i} done\n")), "{what}: {all}");
            }
            assert!(!all.contains("waived") && !all.contains("ended holding"), "{what}: {all}");
            let doc = common::document(&json);
            assert_eq!(doc["options"]["ipc"], "fabric", "{what}: the JSON names it: {doc}");
            let before = descriptors(&doc, "descriptors_before_open");
            assert_eq!(before.len(), n, "{what}: {doc}");
            assert_eq!(before, descriptors(&doc, "descriptors_after_close"), "{what}: {doc}");
            common::assert_run_clean(pid, &what);
        }
    }
}

/// Without an IMEX channel the device's attribute says yes and the trial says no: waived (2), with both
/// facts; a device that does not report the attribute is waived naming it, whatever its channels.
#[test]
fn fabric_is_waived_by_its_trial_and_by_its_attribute() {
    let (pid, code, all) = run_pid(simulated("ok,ok").args(["--ipc", "fabric", "--procs-per-device", "2"]));
    assert_eq!(code, Some(2), "{all}");
    let line = format!("No CUDA devices support IPC with --ipc fabric (device 0: {FABRIC_NOT_PERMITTED}");
    assert!(all.contains(&line), "{all}");
    assert!(!all.contains("failed!"), "{all}");
    common::assert_run_clean(pid, "--ipc fabric without an IMEX channel");
    for devices in ["no-fabric+imex,no-fabric", "no-fabric,no-fabric+imex"] {
        let out = run(simulated(devices).args(["--ipc", "fabric"]));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{devices}: {all}");
        let line = "No CUDA devices support IPC with --ipc fabric (device 0 does not report \
                    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)";
        assert!(all.contains(line), "{devices}: {all}");
    }
    // A device without the attribute is skipped, and the run goes on on the one that has it.
    let out = run(simulated("ok+imex,no-fabric+imex").args(["--ipc", "fabric"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("Device 1 cannot run --ipc fabric (device 1 does not report"), "{all}");
    // The benchmark asks the same trial.
    let out = run(simulated("ok,ok").args(["--bench", "--ipc", "fabric", "--bench-max-bytes", "65536"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains(FABRIC_NOT_PERMITTED), "{}", text(&out));
}

/// `--ipc all` where fabric is waived by its trial and the others pass: the fourth row says why, and the
/// whole passes (0); with an IMEX channel it is a row like the others.
#[test]
fn ipc_all_shows_fabric_waived_and_passes() {
    let out = run(simulated("ok,ok").args(["--ipc", "all"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let table = table_of(&all);
    assert_eq!(table.len(), 5, "{all}");
    for (row, mechanism) in table[1..4].iter().zip(["legacy", "vmm", "pool"]) {
        assert!(row.starts_with(mechanism) && row.ends_with("passed"), "{all}");
    }
    let waived =
        format!("waived: No CUDA devices support IPC with --ipc fabric (device 0: {FABRIC_NOT_PERMITTED}");
    assert!(table[4].starts_with("fabric") && table[4].contains(&waived), "{all}");
    let out = run(simulated("ok+imex").args(["--ipc", "all"]));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let fabric = all.lines().find(|l| l.starts_with("fabric ")).unwrap_or_default();
    assert!(fabric.ends_with("passed"), "{all}");
}

/// A run whose processes are MPS clients says so on its verdict line, by the parent's own check of its pipe
/// directory (a `control` socket that accepts); a directory whose daemon is gone is no MPS. `--bench` on one
/// GPU says why its figures are what they are: no context switch is paid under MPS.
#[test]
fn a_run_under_mps_says_so() {
    let dir = common::scratch("mps");
    let control = dir.path().join("control");
    let programs = common::scratch("mps-program");
    let mut daemon = common::stand_in_mps_daemon(dir.path(), programs.path());
    let shown = dir.path().display().to_string();
    // The driver says MPS (`mps`: CU_DEVICE_ATTRIBUTE_MPS_ENABLED), and the socket says whose daemon.
    let out = run(simulated("ok+mps").env("CUDA_MPS_PIPE_DIRECTORY", dir.path()));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let under =
        format!("PASSED: 1 process on 1 GPU, legacy IPC, events, under MPS (the daemon of {shown}): every");
    assert!(all.contains(&under), "{all}");
    // The same socket where the driver says no MPS (an impostor in a directory another user made, measured
    // on the H200 host): no MPS, and said why.
    let out = run(simulated("ok").env("CUDA_MPS_PIPE_DIRECTORY", dir.path()));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(!all.contains("under MPS"), "{all}");
    assert!(all.contains("but the driver says this run's contexts are no MPS clients"), "{all}");
    let bench = run(simulated("ok+mps")
        .args(["--bench", "--bench-max-bytes", "4096"])
        .env("CUDA_MPS_PIPE_DIRECTORY", dir.path()));
    let said = text(&bench);
    assert_eq!(bench.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("MPS: a control daemon listens at {shown}: the processes are its clients")),
        "{said}"
    );
    assert!(
        said.contains("why the figures are what they are: one GPU under MPS: both processes are clients of one daemon and share its context's time slice, so no context switch is paid"),
        "{said}"
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
    // Another user's daemon (NVIDIA's program, by its name) in a directory anyone could make: no client of
    // this user's run, and said whose it is.
    if nix::unistd::geteuid().is_root() {
        std::fs::remove_file(&control).unwrap();
        for path in [dir.path(), programs.path()] {
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        }
        let mut theirs = common::stand_in_mps_daemon_of(dir.path(), programs.path(), Some(65534));
        let out = run(simulated("ok").env("CUDA_MPS_PIPE_DIRECTORY", dir.path()));
        let all = text(&out);
        let _ = theirs.kill();
        let _ = theirs.wait();
        assert_eq!(out.status.code(), Some(0), "{all}");
        assert!(!all.contains("under MPS") && !all.contains("no MPS clients"), "{all}");
        assert!(all.contains("a listener of another user (uid 65534, pid "), "{all}");
    } else {
        common::skipped("root", "a_run_under_mps_says_so: another user's daemon");
    }
    // Another program's socket where the daemon's would be is named, and makes no client.
    std::fs::remove_file(&control).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(&control).unwrap();
    let out = run(simulated("ok").env("CUDA_MPS_PIPE_DIRECTORY", dir.path()));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(!all.contains("under MPS"), "{all}");
    let named = format!("MPS: the control socket in {shown} is ");
    assert!(
        all.contains(&named) && all.contains("not NVIDIA's control daemon: this run was no MPS client"),
        "{all}"
    );
    drop(listener);
    // The socket is left, as by a daemon that was killed: no daemon, no MPS.
    let out = run(simulated("ok").env("CUDA_MPS_PIPE_DIRECTORY", dir.path()));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains("MPS"), "{}", text(&out));
}

/// `--fds pidfd`: each child fetches every descriptor from the parent with pidfd_getfd (real calls on the
/// simulation's memfds), passes, and closes all it fetched.
#[test]
fn descriptors_fetched_by_pidfd_getfd_run_the_whole_protocol() {
    for mechanism in ["vmm", "pool"] {
        let dir = common::scratch(&format!("pidfd-{mechanism}"));
        let json = dir.path().join("run.json");
        let (pid, code, all) = run_pid(
            simulated("ok,ok")
                .args(["--ipc", mechanism, "--fds", "pidfd", "--procs-per-device", "2", "--json"])
                .arg(&json),
        );
        assert_eq!(code, Some(0), "{mechanism}: {all}");
        assert!(
            all.contains(&format!(
                "PASSED: 4 processes on 2 GPUs, {mechanism} IPC (descriptors by pidfd_getfd), events"
            )),
            "{all}"
        );
        let doc = common::document(&json);
        assert_eq!(
            descriptors(&doc, "descriptors_before_open"),
            descriptors(&doc, "descriptors_after_close"),
            "{doc}"
        );
        common::assert_run_clean(pid, mechanism);
    }
}
