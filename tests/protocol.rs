//! The whole process protocol with real processes, on GPUs simulated in host memory: the round-robin, the
//! barrier and the handles, then every way a run can go wrong. Each test checks that no process of the run
//! is left and that /dev/shm holds nothing of it.

mod common;

use std::time::Duration;

use common::{FAULT, run, simulated, start_hanging_run, text, wait_group_gone};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[test]
fn one_process_prints_the_original_transcript() {
    let mut command = simulated("ok");
    let (pid, out) = common::run_with_pid(&mut command);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let expected = format!(
        "SIMULATED GPUs (SIMPLE_IPC_SIMULATE_GPUS): a test of the process protocol in host memory, not of a GPU\n\
         PP: lshmName = simpleIPCshm{pid}\nCP: lshmName = simpleIPCshm{pid}\nProcess 0: Starting on device 0...\n\
         Step 0 done\nProcess 0: verifying...\nProcess 0 complete!\n"
    );
    // The original's transcript, then the verdict line.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let verdict = stdout.strip_prefix(&expected).unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        verdict.starts_with("PASSED: 1 process on 1 GPU, legacy IPC, events: every buffer verified in "),
        "{verdict}"
    );
    assert!(verdict.ends_with(" s\n") && verdict.lines().count() == 1, "{verdict}");
    common::assert_run_clean(pid, "protocol");
}

#[test]
fn many_processes_on_several_devices_all_complete_every_step() {
    // Device 1 is rejected by the peer filter; 2 x 6 processes on devices 0 and 2.
    let mut command = simulated("ok,no-peer,ok");
    command.args(["--procs-per-device", "6"]);
    let (pid, out) = common::run_with_pid(&mut command);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let mut lines = stdout.lines();
    assert!(lines.next().is_some_and(|l| l.starts_with("SIMULATED GPUs")), "a simulated run says so first");
    assert!(lines.next().is_some_and(|l| l.starts_with("PP: lshmName")), "then the parent's line: {stdout}");
    assert!(stdout.contains("Device 1 is not peer capable with some other selected peers, skipping\n"));
    for i in 0..12 {
        let device = if i < 6 { 0 } else { 2 };
        assert!(stdout.contains(&format!("Process {i}: Starting on device {device}...\n")), "{stdout}");
        assert!(stdout.contains(&format!("Step {i} done\n")), "{stdout}");
        assert!(stdout.contains(&format!("Process {i} complete!\n")), "{stdout}");
    }
    assert!(!stdout.contains("Step 12 done"));
    common::assert_run_clean(pid, "protocol");
}

/// `--sync memops`: the same round-robin, ordered by stream memory operations on a flag after each buffer.
#[test]
fn the_round_robin_ordered_by_stream_memory_operations() {
    for mechanism in ["legacy", "vmm"] {
        let mut command = simulated("ok,ok");
        command.args(["--sync", "memops", "--ipc", mechanism, "--procs-per-device", "4"]);
        let (pid, out) = common::run_with_pid(&mut command);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{mechanism}: {}", text(&out));
        for i in 0..8 {
            assert!(stdout.contains(&format!("Process {i} complete!\n")), "{mechanism}: {stdout}");
            assert!(stdout.contains(&format!("Step {i} done\n")), "{mechanism}: {stdout}");
        }
        common::assert_run_clean(pid, "protocol");
    }
}

/// Stream memory operations refuse pool memory on the GPU: the combination is refused with the reason.
#[test]
fn memops_cannot_order_pool_memory() {
    let out = run(simulated("ok").args(["--sync", "memops", "--ipc", "pool"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--sync memops cannot order pool memory"), "{}", text(&out));
}

#[test]
fn more_processes_than_cores_in_sequential_order_with_timings() {
    let dir = common::scratch("test");
    let json = dir.path().join("timings.json");
    let out = run(simulated("ok")
        .args(["--procs-per-device", "32", "--sequential", "--timings", "--json"])
        .arg(&json));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Process 31 complete!") && stdout.contains("Step 31 done"));
    assert!(stdout.contains("Timings (ms)") && stdout.contains("child 31"), "{stdout}");
    let doc = common::document(&json);
    let run = &doc["run"];
    assert_eq!(
        (run["processes"].as_u64(), doc["options"]["procs_per_device"].as_u64()),
        (Some(32), Some(32))
    );
    assert_eq!(
        (doc["options"]["sequential"].as_bool(), doc["options"]["timings"].as_bool()),
        (Some(true), Some(true))
    );
    let size = simple_ipc::segment::SIMULATED_DATA_SIZE as u64;
    assert_eq!(run["buffer_bytes"].as_u64(), Some(size), "every byte of the buffers is checked: {doc}");
    let children = run["children"].as_array().unwrap();
    assert_eq!(children.len(), 32, "{doc}");
    for (i, child) in children.iter().enumerate() {
        assert_eq!(child["index"].as_u64(), Some(i as u64), "{doc}");
        assert!(child["phases"]["round_robin"].as_f64().is_some_and(|ms| ms >= 0.0), "{doc}");
        assert!(child["phases"]["cuda_start"].is_f64(), "{doc}");
    }
    assert!(run["parent"]["phases"]["cuda_start"].is_f64(), "{doc}");
}

/// A child that dies (SIGKILL) or fails at any phase stops the whole run quickly, and the parent says who.
#[test]
fn a_child_failing_at_any_phase_stops_everything() {
    for (fault, how) in [
        ("child2@attach:kill", "killed by SIGKILL"),
        ("child1@open-handles:kill", "killed by SIGKILL"),
        ("child3@round-robin:kill", "killed by SIGKILL"),
        ("child0@verify:kill", "killed by SIGKILL"),
        ("child1@round-robin:error", "exit code 1"),
    ] {
        let mut command = simulated("ok");
        command.args(["--procs-per-device", "4"]).env(FAULT, fault);
        let (pid, out) = common::run_with_pid(&mut command);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{fault}: {all}");
        let who = fault.split('@').next().unwrap().trim_start_matches("child");
        assert!(all.contains(&format!("Process {who} failed! ({how})")), "{fault}: {all}");
        let stopped_ms: f64 = all
            .split("every process stopped ")
            .nth(1)
            .and_then(|rest| rest.split(" ms").next())
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("{fault}: no stop time in {all}"));
        assert!(stopped_ms < 2000.0, "{fault}: the others took {stopped_ms} ms to stop");
        if fault.ends_with(":error") {
            assert!(all.contains("injected fault"), "the first error's message reaches the user: {all}");
        }
        common::assert_run_clean(pid, "protocol");
    }
}

/// The first device's children start before the parent has chosen the devices (their CUDA start overlaps
/// the parent's), and wait in the segment for the plan: with the parent held in its device selection, the
/// children of device 0 are there and have said nothing yet, the others are not started.
#[test]
fn the_first_devices_children_start_before_the_devices_are_chosen() {
    let mut parent = simulated("ok,ok")
        .args(["--procs-per-device", "2"])
        .env(FAULT, "parent@device-selection:hang")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the binary starts");
    let pid = parent.id();
    let said_cp = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stdout = parent.stdout.take().expect("piped");
    let seen = said_cp.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("CP:") || line.starts_with("Process") {
                seen.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    let children = || {
        let mut indices: Vec<String> = common::descendants(pid)
            .into_iter()
            .filter_map(|p| {
                let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
                let args: Vec<String> =
                    cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
                let at = args.iter().position(|a| a == "child")?;
                args.get(at + 1).cloned()
            })
            .collect();
        indices.sort();
        indices
    };
    let start = std::time::Instant::now();
    while children().len() < 2 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Time for a child that should not be there to show.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        children(),
        ["0", "1"],
        "device 0's children, and only they, start before the devices are chosen"
    );
    assert!(
        !said_cp.load(std::sync::atomic::Ordering::SeqCst),
        "a child says its first line only once the plan is there"
    );
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    parent.wait().unwrap();
    assert!(
        wait_group_gone(pid, Duration::from_secs(3)).is_some(),
        "the early children outlived their parent"
    );
    common::assert_run_clean(pid, "protocol");
}

/// A run waived once its first children started (no device fits) says nothing of them: they stop quietly,
/// and the output is the parent's alone.
#[test]
fn a_run_waived_after_its_first_children_started_is_the_parents_words_alone() {
    let mut command = simulated("no-uva");
    command.args(["--procs-per-device", "3"]);
    let (pid, out) = common::run_with_pid(&mut command);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert_eq!(lines[2], "Device 0 does not support unified addressing, skipping...");
    assert!(lines[3].starts_with("WAIVED (exit 2, not a failure"), "{stdout}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "the stopped children say nothing");
    common::assert_run_clean(pid, "protocol");
}

/// A parent that fails before it has chosen the devices (a fault there; more processes than a run can have)
/// fails alone: the children it started early stop without a word of their own.
#[test]
fn a_parent_failing_before_the_plan_is_the_only_one_to_say_so() {
    let cases: [(&str, &[&str], Option<&str>); 2] = [
        ("ok,ok", &["--procs-per-device", "2"], Some("parent@device-selection:error")),
        ("ok,ok", &["--procs-per-device", "17"], None),
    ];
    for (gpus, args, fault) in cases {
        let mut command = simulated(gpus);
        command.args(args);
        if let Some(fault) = fault {
            command.env(FAULT, fault);
        }
        let (pid, out) = common::run_with_pid(&mut command);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("Process "), "{args:?}: a child spoke: {stderr}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("FAILED (exit 1)"), "{}", text(&out));
        common::assert_run_clean(pid, "protocol");
    }
}

/// A parent held in a call that never returns (a hung cuInit, here a fault in its device selection) while its
/// first children wait for the plan: its watchdog ends the run at --timeout and its grace, with the verdict,
/// and nothing of the run is left.
#[test]
fn a_parent_that_never_comes_back_is_ended_by_its_watchdog() {
    let mut command = simulated("ok");
    command.args(["--timeout", "1", "--procs-per-device", "2"]).env(FAULT, "parent@device-selection:hang");
    let start = std::time::Instant::now();
    let child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let Ok(out) = rx.recv_timeout(Duration::from_secs(15)) else {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        panic!("the run was not ended 15 s in, past --timeout 1 s and the grace");
    };
    let out = out.expect("the run's output");
    let took = start.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("FAILED (exit 1): this process did not finish within --timeout 1 s")
            && last.contains("its own watchdog ended it"),
        "{stdout}"
    );
    assert!(took < Duration::from_secs(10), "it took {took:?}");
    common::assert_run_clean(pid, "protocol");
}

#[test]
fn parent_killed_leaves_no_child_and_no_segment() {
    let mut parent = start_hanging_run(4);
    let pid = parent.id();
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    parent.wait().unwrap();
    let gone = wait_group_gone(pid, Duration::from_secs(2));
    assert!(gone.is_some(), "children outlived their parent by more than 2 s");
    common::assert_run_clean(pid, "protocol");
}

#[test]
fn sigint_and_sigterm_stop_the_run_in_order() {
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        let mut parent = start_hanging_run(3);
        let pid = parent.id();
        kill(Pid::from_raw(pid as i32), signal).unwrap();
        let status = parent.wait().unwrap();
        assert_eq!(status.code(), Some(128 + signal as i32), "{signal}: exit status says interrupted");
        assert!(wait_group_gone(pid, Duration::from_secs(2)).is_some(), "{signal}: a child is left");
        common::assert_run_clean(pid, "protocol");
    }
}

/// An object already holding the original's segment name (a stale file, or another PID namespace's run)
/// neither stops the run nor is touched: the segment has no name.
#[test]
fn an_existing_object_of_the_segments_name_is_left_alone() {
    // The shell creates the name for its own pid, then becomes the parent through exec (same pid).
    let script = r#"printf precious > /dev/shm/simpleIPCshm$$; exec "$0""#;
    let mut shell = std::process::Command::new("sh");
    shell.args(["-c", script]).arg(common::bin()).env(common::SIMULATE, "ok").env_remove(FAULT);
    let (shell_pid, out) = common::run_with_pid(&mut shell);
    let _made = common::removed_at_end(format!("/dev/shm/simpleIPCshm{shell_pid}"));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    let pid =
        all.split("PP: lshmName = simpleIPCshm").nth(1).and_then(|s| s.split_whitespace().next()).unwrap();
    let path = format!("/dev/shm/simpleIPCshm{pid}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious", "the existing object was touched");
}

#[test]
fn a_wrong_buffer_is_one_line_and_exit_1() {
    let out = run(simulated("ok").args(["--procs-per-device", "3"]).env(FAULT, "child1@verify:corrupt"));
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let size = simple_ipc::segment::SIMULATED_DATA_SIZE;
    let offset = (size - 1) / 3;
    let line = format!(
        "Process 1: verification failed: 2 of {size} bytes differ from 2; the first, at offset {offset}, is 9"
    );
    assert!(all.contains(&line), "{all}");
    assert_eq!(all.matches("differ").count(), 1, "one line, not one per byte: {all}");
    assert!(all.contains("Process 1 failed! (exit code 1)"), "{all}");
    assert!(
        all.contains("test fault: child1@verify:corrupt strikes"),
        "the fault says that it struck: {all}"
    );
}

/// The last line says how the run ended, for a machine and a person alike; `--quiet` prints it alone, and
/// the children are quiet too.
#[test]
fn the_last_line_is_the_verdict_and_quiet_prints_only_it() {
    let out = run(simulated("ok,ok").args(["--procs-per-device", "2", "--quiet"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.starts_with("PASSED: 4 processes on 2 GPUs, legacy IPC, events: every buffer verified in "),
        "{stdout}"
    );

    let out =
        run(simulated("ok").args(["--procs-per-device", "2", "--quiet"]).env(FAULT, "child1@verify:corrupt"));
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout, "FAILED (exit 1): Process 1 failed! (exit code 1)\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("verification failed"), "errors still say why");

    let out = run(simulated("no-uva").arg("--quiet"));
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("WAIVED (exit 2, not a failure") && stdout.lines().count() == 1, "{stdout}");
}
