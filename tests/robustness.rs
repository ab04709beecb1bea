//! A careless or hostile user, on simulated GPUs: kill the parent at any moment, fill /dev/shm, tight
//! limits, output that cannot be written, a FIFO for --json, two runs in PID namespaces of their own, a
//! stopped or hung child. Each case must end with one of the documented statuses (0, 1, 2, 128+N), a
//! message, no process left and nothing of the run in /dev/shm.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{FAULT, SIMULATE, bin, run, simulated, text};
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The documented statuses: 0, 1, 2, or 128+N after a signal; never a panic's 101.
fn assert_documented(code: Option<i32>, what: &str, out: &str) {
    assert!(matches!(code, Some(0..=2) | None), "{what}: status {code:?} is not documented: {out}");
    assert!(!out.contains("panicked"), "{what}: a panic reached the user: {out}");
}

/// How long a whole run with 8 processes takes here, to spread the kills over its life.
fn run_length() -> Duration {
    let start = Instant::now();
    let out = run(simulated("ok").args(["--procs-per-device", "8"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    start.elapsed()
}

/// Case 1: `kill -9` of the parent at 20 moments spread over a run's life leaves no process and no file,
/// neither the segment nor the driver's files for the events (which the guardian removes).
#[test]
fn killing_the_parent_at_any_moment_leaves_nothing() {
    let length = run_length();
    for i in 0..20u32 {
        let at = length * i / 20;
        let mut parent = simulated("ok")
            .args(["--procs-per-device", "8"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(at);
        let children = common::descendants(parent.id());
        let _ = kill(Pid::from_raw(parent.id() as i32), Signal::SIGKILL);
        parent.wait().unwrap();
        common::assert_clean(parent.id(), &children, &format!("killed at {} ms", at.as_millis()));
    }
}

/// Case 1, the moment the issue names: the parent killed while it waits for its children.
#[test]
fn killing_the_parent_while_it_waits_leaves_nothing() {
    for _ in 0..5 {
        let mut parent = simulated("ok")
            .args(["--procs-per-device", "4"])
            .env(FAULT, "parent@wait-children:kill")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let status = parent.wait().unwrap();
        assert_eq!(status.code(), None, "the parent killed itself");
        common::assert_run_clean(parent.id(), "parent@wait-children:kill");
    }
}

/// Case 2: the benchmark, killed, leaves nothing either.
#[test]
fn killing_the_benchmark_leaves_nothing() {
    let mut parent = simulated("ok")
        .args(["--bench", "--bench-max-bytes", "16777216"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rows = common::wait_for_lines(&mut parent, "KiB", 2, Duration::from_secs(30));
    assert!(rows >= 1, "the benchmark printed its first rows");
    let consumer = common::descendants(parent.id());
    assert!(!consumer.is_empty(), "the consumer runs");
    kill(Pid::from_raw(parent.id() as i32), Signal::SIGKILL).unwrap();
    parent.wait().unwrap();
    common::assert_clean(parent.id(), &consumer, "bench killed: the consumer's event file included");
}

/// Case 3: a file size limit is an error with a message, not SIGXFSZ.
#[test]
fn a_file_size_limit_is_an_error_not_a_signal() {
    let mut command = simulated("ok");
    // SAFETY: (test) setrlimit between fork and exec is async-signal-safe.
    unsafe {
        command.pre_exec(|| setrlimit(Resource::RLIMIT_FSIZE, 0, 0).map_err(std::io::Error::from));
    }
    let (pid, out) = common::run_with_pid(&mut command);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("reserving") && all.contains("segment"), "the message says what failed: {all}");
    common::assert_run_clean(pid, "ulimit -f 0");
}

/// Case 3: a full /dev/shm (a small tmpfs in a mount namespace of its own, filled up) is an error with a
/// message. Needs root and unshare(1); elsewhere it says it was skipped, and asserts nothing.
#[test]
fn a_full_dev_shm_is_an_error_not_a_crash() {
    let script = r#"set -e
        mount -t tmpfs -o size=4k,nr_inodes=4 tmpfs /dev/shm
        i=0; while [ $i -lt 10 ] && touch /dev/shm/fill$i 2>/dev/null; do i=$((i+1)); done
        head -c 4096 /dev/zero > /dev/shm/fill0 2>/dev/null || true
        set +e; "$0" --procs-per-device 2; echo "status $?""#;
    let out = Command::new("unshare")
        .args(["--mount", "sh", "-c", script])
        .arg(bin())
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .output();
    let Ok(out) = out else {
        common::skipped("namespaces", "a_full_dev_shm_is_an_error_not_a_crash: no unshare(1) here");
        return;
    };
    let all = text(&out);
    if !all.contains("status ") {
        common::skipped(
            "namespaces",
            format!("a_full_dev_shm_is_an_error_not_a_crash: no mount namespace here: {all}"),
        );
        return;
    }
    assert!(all.contains("status 1"), "a full /dev/shm fails the run with exit 1: {all}");
    assert!(all.contains("No space left on device"), "and says why: {all}");
    assert!(!all.contains("panicked"), "{all}");
}

/// Case 4: output that cannot be written fails the run with status 1 (or ends it quietly like any
/// program whose reader left), never with a panic.
#[test]
fn unwritable_output_fails_cleanly() {
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = simulated("ok").stdout(full()).stderr(Stdio::piped()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "stdout to /dev/full: {err}");
    assert!(err.contains("writing to standard output"), "{err}");
    assert_eq!(err.matches("No space left on device").count(), 1, "said once: {err}");

    // --quiet: the verdict is all it writes, and a verdict that cannot be written fails a run that passed;
    // the document, written before, is written again to say so.
    let dir = common::scratch("verdict-full");
    let json = dir.path().join("run.json");
    let out = simulated("ok")
        .args(["--quiet", "--json"])
        .arg(&json)
        .stdout(full())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "--quiet, stdout to /dev/full: {err}");
    assert!(err.contains("No space left on device"), "{err}");
    let doc = common::document(&json);
    assert_eq!((doc["status"].as_str(), doc["exit_status"].as_u64()), (Some("failed"), Some(1)), "{doc}");
    assert!(doc["reason"].as_str().is_some_and(|r| r.contains("No space left on device")), "{doc}");

    // stderr to /dev/full while a child fails: the failure is still exit 1.
    let out = simulated("ok")
        .args(["--procs-per-device", "2"])
        .env(FAULT, "child1@round-robin:error")
        .stdout(Stdio::null())
        .stderr(full())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));

    // stdout closed: the run goes on as with /dev/null (no later descriptor takes number 1 by chance).
    let mut command = simulated("ok");
    // SAFETY: (test) close is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            nix::libc::close(1);
            Ok(())
        });
    }
    let child = command.args(["--procs-per-device", "3"]).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    common::assert_run_clean(pid, "stdout closed");

    // A reader that goes away: the run ends as a C program would, with 141 (128 + SIGPIPE), whichever
    // process met the closed pipe first (tests/invoker.rs has more).
    let mut child = simulated("ok").args(["--procs-per-device", "4"]).stdout(Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(141), "{status:?}");
    common::assert_run_clean(child.id(), "reader gone");
}

/// Case 4: tight limits on memory and processes give a documented status and a message, never a panic.
#[test]
fn tight_limits_give_a_documented_status() {
    let mut started = 0;
    for (what, resource, limit) in [
        ("ulimit -v 20000", Resource::RLIMIT_AS, 20_000 * 1024),
        ("ulimit -v 40000", Resource::RLIMIT_AS, 40_000 * 1024),
        ("ulimit -v 80000", Resource::RLIMIT_AS, 80_000 * 1024),
        ("ulimit -n 6", Resource::RLIMIT_NOFILE, 6),
        // Each of these runs out at another step of making an event (its file, the file's second
        // descriptor, /proc/self/maps): none may leave the file behind.
        ("ulimit -n 12", Resource::RLIMIT_NOFILE, 12),
        ("ulimit -n 13", Resource::RLIMIT_NOFILE, 13),
        ("ulimit -n 14", Resource::RLIMIT_NOFILE, 14),
        ("ulimit -n 15", Resource::RLIMIT_NOFILE, 15),
        ("ulimit -n 16", Resource::RLIMIT_NOFILE, 16),
    ] {
        let mut command = simulated("ok");
        command.args(["--procs-per-device", "4"]);
        // SAFETY: (test) setrlimit between fork and exec is async-signal-safe.
        unsafe {
            command.pre_exec(move || setrlimit(resource, limit, limit).map_err(std::io::Error::from));
        }
        let (pid, out) = common::run_with_pid(&mut command);
        if text(&out).contains("error while loading shared libraries") {
            continue; // the dynamic loader gave up before the program began: nothing of ours ran
        }
        started += 1;
        assert_documented(out.status.code(), what, &text(&out));
        common::assert_run_clean(pid, what);
    }
    assert!(started >= 3, "the limits were too tight for the program to start at all");
}

/// Case 4: the process limit just above what the run needs (as an unprivileged user, since root is not
/// held to it). Needs root to switch users; elsewhere it says it was skipped.
#[test]
fn a_process_limit_gives_a_documented_status() {
    if !nix::unistd::geteuid().is_root() {
        common::skipped(
            "root",
            "a_process_limit_gives_a_documented_status: needs root to run as another user",
        );
        return;
    }
    for limit in [3, 5, 9] {
        let mut command = simulated("ok");
        command.args(["--procs-per-device", "4"]);
        // SAFETY: (test) setrlimit, setgid and setuid between fork and exec are async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                setrlimit(Resource::RLIMIT_NPROC, limit, limit)?;
                nix::unistd::setgid(nix::unistd::Gid::from_raw(65534))?;
                nix::unistd::setuid(nix::unistd::Uid::from_raw(65534))?;
                Ok(())
            });
        }
        let (pid, out) = common::run_with_pid(&mut command);
        let all = text(&out);
        if all.contains("Permission denied") && !all.contains("PP:") {
            common::skipped(
                "nobody",
                "a_process_limit_gives_a_documented_status: the binary is not readable by nobody",
            );
            return;
        }
        assert_documented(out.status.code(), &format!("ulimit -u {limit}"), &all);
        common::assert_run_clean(pid, "ulimit -u");
    }
}

/// Case 5: --json naming a FIFO with no reader, or a path that cannot be written, is refused at once,
/// before the run.
#[test]
fn json_to_a_fifo_or_an_unwritable_path_is_refused_before_the_run() {
    let tmp = common::scratch("robust");
    let dir = tmp.path();
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    for path in [fifo.clone(), dir.join("no/such/dir/t.json"), dir.to_owned()] {
        let start = Instant::now();
        let out = run(simulated("ok").arg("--json").arg(&path));
        let all = text(&out);
        assert_eq!(out.status.code(), Some(1), "{}: {all}", path.display());
        assert!(all.contains("--json"), "{all}");
        assert!(!all.contains("PP: lshmName"), "refused before the run started: {all}");
        assert!(start.elapsed() < Duration::from_secs(5), "it did not block");
    }
}

/// Case 7: a stopped child and a hung child are stopped by the watchdog, which names every process that had
/// not finished and where it was.
#[test]
fn the_watchdog_stops_a_stopped_or_hung_child_and_says_where_each_one_was() {
    for (fault, how) in [("child1@round-robin:stop", "stopped (SIGSTOP)"), ("child2@copy-back:hang", "")] {
        let start = Instant::now();
        let (pid, out) = common::run_with_pid(
            simulated("ok").args(["--procs-per-device", "3", "--timeout", "2"]).env(FAULT, fault),
        );
        let all = text(&out);
        let took = start.elapsed();
        assert_eq!(out.status.code(), Some(1), "{fault}: {all}");
        assert!(all.contains("did not finish within 2 s (--timeout)"), "{fault}: {all}");
        let (who, phase) =
            if fault.starts_with("child1") { ("1", "round_robin") } else { ("2", "copy_back") };
        assert!(
            all.contains(&format!(
                "process {who} was in {phase}{}",
                if how.is_empty() { String::new() } else { format!(", {how}") }
            )),
            "{fault}: {all}"
        );
        assert!(took < Duration::from_secs(6), "{fault}: stopped after {took:?}");
        common::assert_run_clean(pid, fault);
    }
}

/// The watchdog also reaches a benchmark whose producer hangs, while the parent measures.
#[test]
fn the_watchdog_stops_a_hung_benchmark() {
    let start = std::time::Instant::now();
    let (pid, out) = common::run_with_pid(
        simulated("ok").args(["--bench", "--timeout", "2"]).env(FAULT, "child1@attach:hang"),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("did not finish within 2 s (--timeout)"), "{all}");
    assert!(all.contains("process 1 was starting (not attached yet)"), "{all}");
    assert!(start.elapsed() < Duration::from_secs(6), "stopped after {:?}", start.elapsed());
    common::assert_run_clean(pid, "hung benchmark");
}

/// The smaller things: a fault naming a process the run lacks is refused; flags that cannot go together
/// are usage errors; a simulated run says so in its JSON.
#[test]
fn smaller_things() {
    let out = run(simulated("ok").args(["--procs-per-device", "2"]).env(FAULT, "child99@verify:kill"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("names process 99, but this run has processes 0 to 1"), "{}", text(&out));

    for flags in [["--topology", "--bench"], ["--bench", "--sequential"]] {
        let out = Command::new(bin()).args(flags).env(SIMULATE, "ok").output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {}", text(&out));
        assert!(text(&out).contains("cannot be used with"), "{}", text(&out));
    }

    let dir = common::scratch("sim");
    let json = dir.path().join("run.json");
    std::fs::write(&json, "an older and longer file that must be replaced, not overwritten in part").unwrap();
    let out = run(simulated("ok").arg("--json").arg(&json));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc = common::document(&json);
    assert_eq!(
        (doc["status"].as_str(), doc["driver"]["simulated"].as_bool()),
        (Some("passed"), Some(true)),
        "{doc}"
    );
}

/// A /dev/shm too small for the events' files (a tmpfs of one page, in a mount namespace of its own): the
/// child that touches a page tmpfs cannot give is killed by SIGBUS, and the run names the likely cause, a
/// full /dev/shm with its size, and the fix, in its verdict and as the `--json` document's cause and fix.
/// Needs root and unshare(1); elsewhere it says it was skipped, and asserts nothing.
#[test]
fn a_child_killed_by_sigbus_names_a_full_dev_shm_and_the_fix() {
    let dir = common::scratch("sigbus");
    let json = dir.path().join("run.json");
    let script = r#"set -e
        mount -t tmpfs -o size=4k tmpfs /dev/shm
        set +e; "$0" --json "$1"; echo "status $?""#;
    let out = Command::new("unshare")
        .args(["--mount", "sh", "-c", script])
        .arg(bin())
        .arg(&json)
        .env(SIMULATE, "ok,ok")
        .env_remove(FAULT)
        .output();
    let Ok(out) = out else {
        common::skipped("namespaces", "a_child_killed_by_sigbus_names_a_full_dev_shm: no unshare(1) here");
        return;
    };
    let all = text(&out);
    if !all.contains("status ") {
        let why = format!("a_child_killed_by_sigbus_names_a_full_dev_shm: no mount namespace here: {all}");
        common::skipped("namespaces", why);
        return;
    }
    assert!(all.contains("status 1"), "{all}");
    assert!(all.contains("failed! (killed by SIGBUS: most likely a full /dev/shm"), "{all}");
    assert!(all.contains("here /dev/shm is 4 KiB"), "{all}");
    assert!(
        all.contains("what fixes it: a larger /dev/shm: Docker --shm-size=1g; Kubernetes an emptyDir"),
        "{all}"
    );
    let doc = common::document(&json);
    assert!(doc["cause"].as_str().is_some_and(|c| c.contains("full /dev/shm")), "{doc}");
    assert!(doc["fix"].as_str().is_some_and(|f| f.contains("--shm-size=1g")), "{doc}");
}

/// The same /dev/shm too small, for processes that joined: a served run's joiners and `--isolate
/// joiners:pid`'s. The server is no parent of theirs and cannot read their exit status, so a joiner that
/// SIGBUS kills tells it first, and the run names the full /dev/shm and the fix instead of a joiner "gone
/// without saying how it ended". Needs root and unshare(1); elsewhere it says it was skipped.
#[test]
fn a_joiner_killed_by_sigbus_names_a_full_dev_shm() {
    let dir = common::scratch("sigbus-joiner");
    let json = dir.path().join("run.json");
    let served = r#"set -e
        mount -t tmpfs -o size=4k tmpfs /dev/shm
        set +e
        "$0" --serve "@simple-ipc-sigbus-$$" --timeout 20 --json "$1" & server=$!
        sleep 0.3
        "$0" --join "@simple-ipc-sigbus-$$" & "$0" --join "@simple-ipc-sigbus-$$"; wait $!
        wait $server; echo "status $?""#;
    let isolated = r#"set -e
        mount -t tmpfs -o size=4k tmpfs /dev/shm
        set +e; "$0" --isolate joiners:pid --json "$1"; echo "status $?""#;
    for (how, script) in [("served", served), ("joiners:pid", isolated)] {
        let out = Command::new("unshare")
            .args(["--mount", "sh", "-c", script])
            .arg(bin())
            .arg(&json)
            .env(SIMULATE, "ok,ok")
            .env_remove(FAULT)
            .output();
        let Ok(out) = out else {
            common::skipped(
                "namespaces",
                "a_joiner_killed_by_sigbus_names_a_full_dev_shm: no unshare(1) here",
            );
            return;
        };
        let all = text(&out);
        if !all.contains("status ") {
            common::skipped(
                "namespaces",
                format!("a_joiner_killed_by_sigbus: no mount namespace here: {all}"),
            );
            return;
        }
        assert!(all.contains("status 1"), "{how}: {all}");
        assert!(
            all.contains("failed! (exit code 135: killed by SIGBUS: most likely a full /dev/shm"),
            "{how}: {all}"
        );
        assert!(!all.contains("gone without saying"), "{how}: {all}");
        let doc = common::document(&json);
        assert!(doc["cause"].as_str().is_some_and(|c| c.contains("full /dev/shm")), "{how}: {doc}");
        assert!(doc["fix"].as_str().is_some_and(|f| f.contains("--shm-size=1g")), "{how}: {doc}");
    }
}

/// A parent held stopped (SIGSTOP) past its --timeout and then continued fails its deadline, as it must,
/// and says it was itself held, and for how long, beside where its children were: the time it held the
/// run is not taken for the run's own.
#[test]
fn a_parent_held_stopped_past_its_deadline_says_so() {
    let mut run = common::simulated("ok")
        .args(["--procs-per-device", "2", "--timeout", "2"])
        .env(FAULT, "child0@round-robin:hang")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(
        common::wait_for_lines(&mut run, "Starting on device", 2, std::time::Duration::from_secs(10)),
        2
    );
    let parent = nix::unistd::Pid::from_raw(run.id() as i32);
    nix::sys::signal::kill(parent, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    nix::sys::signal::kill(parent, nix::sys::signal::Signal::SIGCONT).unwrap();
    let mut said = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut said).unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(1), "{said}");
    assert!(said.contains("the run did not finish within 2 s (--timeout); stopped it."), "{said}");
    assert!(
        said.contains("This process was itself held stopped (SIGSTOP or Ctrl-Z, then continued) for 3."),
        "{said}"
    );
}
