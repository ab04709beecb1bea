//! The module's own tests: each starts `sh` with the policies under test.

use super::*;
use nix::errno::Errno;
use std::os::fd::{AsFd, FromRawFd};
use std::time::Instant;

fn sh(script: &str) -> Relaunch {
    let mut launch = Relaunch::of("/bin/sh", "a shell");
    launch.args(["-c", script, "sh"]);
    launch
}

/// Whether `/proc` has the process, a zombie included.
fn in_proc(pid: Pid) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_process_that_ignores_sigterm_is_killed_and_reaped_when_its_handle_goes() {
    let (ready, ready_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
    let fd = ready_end.as_raw_fd();
    let grace = Duration::from_millis(150);
    let mut launch = sh("trap '' TERM; echo >/proc/self/fd/$1; exec sleep 30");
    let mut process = launch
        .args([fd.to_string()])
        .give(ready_end)
        .on_drop(OnDrop::Stop { signal: Some(Signal::SIGTERM), grace })
        .spawn()
        .unwrap();
    // Once it has said so, SIGTERM is ignored (by the `sleep` it became, too).
    assert_eq!(nix::unistd::read(ready.as_fd(), &mut [0u8; 8]).unwrap(), 1);
    let pid = process.pid();
    let start = Instant::now();
    assert_eq!(stop_all([&mut process]), [true], "it had to be killed");
    assert!(start.elapsed() >= grace, "it was given its grace first");
    assert_eq!(process.try_wait(), Some(Ended::Killed(Signal::SIGKILL)));
    drop(process);
    assert!(!in_proc(pid), "process {pid} is still in /proc (a zombie?)");

    // The same by drop alone.
    let process = sh("trap '' TERM; exec sleep 30").on_drop(OnDrop::Stop { signal: None, grace }).spawn();
    let pid = process.unwrap().pid(); // dropped here
    assert!(!in_proc(pid), "process {pid} is still in /proc (a zombie?)");
}

#[test]
fn its_status_is_a_value_and_a_peek_does_not_reap_it() {
    let mut process = sh("exit 3").spawn().unwrap();
    let ended = loop {
        if let Some(ended) = process.peek() {
            break ended;
        }
        std::thread::sleep(LOOK);
    };
    assert_eq!(ended, Ended::Exited(3));
    assert!(in_proc(process.pid()), "a peek reaps nothing");
    assert_eq!(process.wait(), Ended::Exited(3));
    assert!(!in_proc(process.pid()));
    let mut killed = sh("kill -9 $$").spawn().unwrap();
    assert_eq!(killed.wait(), Ended::Killed(Signal::SIGKILL));
}

#[test]
fn its_result_is_read_from_its_pipe_and_not_from_what_it_printed() {
    let mut written = crate::report::document::example();
    written.reason = Some("through the pipe".into());
    let mut printed = written.clone();
    printed.reason = Some("printed".into());
    let mut launch = sh(r#"printf '%s' "$1"; printf '%s' "$2" >/proc/self/fd/$3"#);
    let fd = launch.report_pipe().unwrap();
    let text = |d: &crate::report::Document| crate::report::document::text(d).unwrap();
    let mut process = launch
        .args([text(&printed), text(&written), fd.to_string()])
        .streams(Streams::Piped)
        .spawn()
        .unwrap();
    let (stdout, _) = process.take_output();
    assert_eq!(process.wait(), Ended::Exited(0));
    assert_eq!(process.document(), Some(written));
    let mut out = [0u8; 8];
    assert!(nix::unistd::read(stdout.unwrap().as_fd(), &mut out).unwrap() > 0, "it printed too");

    let mut silent = sh("exit 0");
    silent.report_pipe().unwrap();
    let mut process = silent.spawn().unwrap();
    process.wait();
    assert_eq!(process.document(), None, "no document written, none read");
}

/// A descriptor this process has without close-on-exec, as one the invoker left open (a shell's fd 3..9),
/// reaches no program it starts: only those kept do.
#[test]
fn a_descriptor_left_open_by_the_invoker_is_not_inherited() {
    let (read, _write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
    // A read end (harmless if another test's child, started meanwhile, got it) without close-on-exec.
    let left_open = fcntl(&read, FcntlArg::F_DUPFD(10)).unwrap();
    // SAFETY: (test) F_DUPFD just made this descriptor, owned by nothing else.
    let left_open = unsafe { OwnedFd::from_raw_fd(left_open) };
    let mut process =
        sh("! test -e /proc/self/fd/$1").args([left_open.as_raw_fd().to_string()]).spawn().unwrap();
    assert_eq!(process.wait(), Ended::Exited(0), "fd {} was inherited", left_open.as_raw_fd());
}

#[test]
fn it_inherits_the_descriptors_kept_and_no_other() {
    let (kept, _kept_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
    let (other, _other_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
    let (kept, other) = (kept.as_raw_fd(), other.as_raw_fd());
    let mut process = sh("test -e /proc/self/fd/$1 && ! test -e /proc/self/fd/$2")
        .args([kept.to_string(), other.to_string()])
        .keep(kept)
        .spawn()
        .unwrap();
    assert_eq!(process.wait(), Ended::Exited(0), "fd {kept} kept, fd {other} not");
}

#[test]
fn one_left_on_drop_is_waited_for_a_while_then_left() {
    let within = Duration::from_millis(50);
    let process = sh("exec sleep 0.5").on_drop(OnDrop::Leave { within }).spawn().unwrap();
    let pid = process.pid();
    let start = Instant::now();
    drop(process);
    assert!(start.elapsed() < Duration::from_millis(400), "it was not waited for to its end");
    assert_eq!(Ended::of(waitpid(pid, None)), Some(Ended::Exited(0)), "it ran on");
}

#[test]
fn it_gets_its_death_signal_when_the_thread_that_started_it_ends() {
    // PR_SET_PDEATHSIG follows the thread that forked: its end is the parent's death, as far as the
    // kernel's signal goes.
    let started = std::thread::spawn(|| sh("exec sleep 5").death_signal(Signal::SIGKILL).spawn().unwrap());
    let mut process = started.join().unwrap();
    let start = Instant::now();
    assert_eq!(process.wait(), Ended::Killed(Signal::SIGKILL));
    assert!(start.elapsed() < Duration::from_secs(4), "it lived on past its parent");
}

/// Whether `pid` has ended: gone from `/proc`, or a zombie its new parent has not reaped yet.
fn ended(pid: Pid) -> bool {
    crate::os::proc_stat::read(pid.as_raw()).is_none_or(|stat| stat.state == 'Z')
}

/// Waits up to `within` for `done`.
fn within(within: Duration, done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > within {
            return false;
        }
        std::thread::sleep(LOOK);
    }
    true
}

/// What `script` printed on its standard output, once it ended.
fn printed(mut launch: Relaunch) -> String {
    let mut process = launch.streams(Streams::Piped).spawn().unwrap();
    let (stdout, _) = process.take_output();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(stdout.unwrap()), &mut out).unwrap();
    assert_eq!(process.wait(), Ended::Exited(0));
    out
}

#[test]
fn a_new_session_is_its_own_and_otherwise_it_stays_in_ours() {
    use nix::unistd::getsid;
    let own = sh("exec sleep 30").new_session().spawn().unwrap();
    assert_eq!(getsid(Some(own.pid())).unwrap(), own.pid(), "a session of its own");
    let ours = sh("exec sleep 30").spawn().unwrap();
    assert_eq!(getsid(Some(ours.pid())).unwrap(), getsid(None).unwrap(), "this process's session");
}

#[test]
fn its_environment_is_cleared_or_loses_what_is_removed() {
    let env = || {
        let mut launch = Relaunch::of("/usr/bin/env", "env");
        launch.args(["-0"]);
        launch
    };
    let (key, _) = std::env::vars_os().next().expect("a variable in this process's environment");
    let key = key.into_string().unwrap();
    let has = |out: &str| out.split('\0').any(|var| var.starts_with(&format!("{key}=")));
    assert!(has(&printed(env())), "{key} is inherited");
    let mut removed = env();
    removed.env_remove(&key);
    let out = printed(removed);
    assert!(!has(&out) && !out.is_empty(), "{key} removed, the rest kept: {out:?}");
    let mut cleared = env();
    cleared.env_clear();
    assert_eq!(printed(cleared), "", "nothing inherited");
}

#[test]
fn what_it_started_is_killed_with_it_only_where_asked() {
    for tree in [true, false] {
        let (ready, ready_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let fd = ready_end.as_raw_fd();
        let mut launch = sh("trap '' TERM; sleep 30 & echo $! >/proc/self/fd/$1; wait");
        launch.args([fd.to_string()]).give(ready_end);
        launch.on_drop(OnDrop::Stop { signal: None, grace: Duration::ZERO });
        if tree {
            launch.killing_what_it_started();
        }
        let process = launch.spawn().unwrap();
        // (Its sleep holds the pipe too: one read, not to the end.)
        let mut said = [0u8; 32];
        let n = nix::unistd::read(ready.as_fd(), &mut said).unwrap();
        let sleep = Pid::from_raw(std::str::from_utf8(&said[..n]).unwrap().trim().parse().unwrap());
        drop(process);
        let gone = within(Duration::from_millis(if tree { 2000 } else { 200 }), || ended(sleep));
        if !gone || !tree {
            let _ = kill(sleep, Signal::SIGKILL);
        }
        assert_eq!(gone, tree, "killing what it started: {tree}; its sleep (pid {sleep}) ended: {gone}");
    }
}

#[test]
fn a_process_stopped_by_a_signal_is_seen_stopped() {
    let mut launch = sh("exec sleep 30");
    let mut process = launch
        .on_drop(OnDrop::Stop { signal: Some(Signal::SIGTERM), grace: Duration::ZERO })
        .spawn()
        .unwrap();
    assert!(!process.is_stopped(), "running");
    process.signal(Signal::SIGSTOP);
    assert!(within(Duration::from_secs(2), || process.is_stopped()), "stopped by SIGSTOP");
}

#[test]
fn a_status_another_reaped_is_lost_and_said_so() {
    let mut process = sh("exit 0").spawn().unwrap();
    assert_eq!(Ended::of(waitpid(process.pid(), None)), Some(Ended::Exited(0)));
    assert_eq!(process.try_wait(), Some(Ended::Lost(Errno::ECHILD)));
    assert_eq!(process.wait(), Ended::Lost(Errno::ECHILD));
}

#[test]
fn a_result_longer_than_the_pipe_is_read_while_it_runs() {
    const LONG: usize = 1 << 20;
    let mut launch = sh(r#"head -c "$2" /dev/zero >/proc/self/fd/$1"#);
    let fd = launch.report_pipe().unwrap();
    let mut process = launch.args([fd.to_string(), LONG.to_string()]).spawn().unwrap();
    let start = Instant::now();
    let ended = loop {
        process.read_report().unwrap();
        if let Some(ended) = process.try_wait() {
            break Some(ended);
        }
        if start.elapsed() > Duration::from_secs(5) {
            break None;
        }
        std::thread::sleep(LOOK);
    };
    assert_eq!(ended, Some(Ended::Exited(0)), "it could write all of it");
    process.read_report().unwrap();
    let report = process.report.as_ref().unwrap();
    assert_eq!(report.got.len(), LONG);
    assert!(report.fd.is_none(), "read to its end: the pipe's other end is its alone, closed here");
}

#[test]
fn one_left_on_drop_that_ends_within_its_while_is_reaped() {
    // Timed from before the spawn: the sleep ends at least 0.1 s after it, however late the spawn returns
    // on a loaded machine (timed from after it, this test failed under load).
    let start = Instant::now();
    let process =
        sh("exec sleep 0.1").on_drop(OnDrop::Leave { within: Duration::from_secs(5) }).spawn().unwrap();
    let pid = process.pid();
    drop(process);
    let reaped = !in_proc(pid);
    if !reaped {
        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG)); // (still ours: its pid is no other's yet)
    }
    assert!(reaped, "process {pid} was left a zombie");
    assert!(start.elapsed() >= Duration::from_millis(100), "it was waited for");
}

#[test]
fn one_that_ends_on_its_stop_signal_was_not_killed() {
    let mut process = sh("exec sleep 30").spawn().unwrap();
    assert_eq!(stop_all([&mut process]), [false]);
    assert_eq!(process.try_wait(), Some(Ended::Killed(Signal::SIGTERM)));
}

/// A process left to end on its own (the guardian) that someone stopped (SIGSTOP) is continued when its
/// handle goes: left stopped, it would stay so for good, its work undone.
#[test]
fn a_stopped_process_left_to_end_on_its_own_is_continued_first() {
    let mut process = sh("exec sleep 0.2").on_drop(OnDrop::Leave { within: Duration::ZERO }).spawn().unwrap();
    let pid = process.pid();
    kill(pid, Signal::SIGSTOP).unwrap();
    while !process.is_stopped() {
        std::thread::sleep(LOOK);
    }
    stop_all([&mut process]);
    let continued = Instant::now();
    while process.is_stopped() && continued.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(LOOK);
    }
    assert!(!process.is_stopped(), "process {pid} was left stopped");
    assert_eq!(process.wait(), Ended::Exited(0), "it went on to its end");
}

/// Ctrl-Z's stopping of a run: every process below the top is stopped but the leaders of sessions, which
/// only wait (the guardian); an init of a PID namespace that has not started its process yet is stopped too,
/// lest it start it while the run is held.
#[test]
fn holding_a_run_stops_an_init_yet_to_start_its_process_and_leaves_other_leaders_awake() {
    if !nix::unistd::geteuid().is_root() {
        return; // unshare --pid needs root (CI is root)
    }
    let state = |pid: Pid| crate::os::proc_stat::read(pid.as_raw()).map(|s| s.state);
    // top (sh) -> a leader that is no init (the guardian's shape), and unshare -> an init without a child.
    let mut top = std::process::Command::new("sh")
        .args(["-c", "setsid sleep 30 & unshare --pid --fork setsid sleep 30 & wait"])
        .spawn()
        .unwrap();
    let top_pid = Pid::from_raw(top.id() as i32);
    // Whatever the test's end, nothing of it stays (stopped, it would hold the test's output open).
    struct KillAll(Pid);
    impl Drop for KillAll {
        fn drop(&mut self) {
            for pid in crate::os::proc_stat::descendants(self.0).into_iter().chain([self.0]) {
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
    }
    let _kill_all = KillAll(top_pid);
    let found = |top| {
        let below = crate::os::proc_stat::descendants(top);
        // (Leaders only: what else is below is stopped with the top.)
        let leaders: Vec<Pid> = below
            .iter()
            .copied()
            .filter(|p| crate::os::proc_stat::read(p.as_raw()).is_some_and(|s| s.session == p.as_raw()))
            .collect();
        let init = leaders.iter().copied().find(|p| crate::os::proc_stat::innermost_pid(*p) == Some(1));
        let other = leaders.iter().copied().find(|p| crate::os::proc_stat::innermost_pid(*p) != Some(1));
        (init, other)
    };
    let since = Instant::now();
    let (mut init, mut other) = found(top_pid);
    while (init.is_none() || other.is_none()) && since.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(LOOK);
        (init, other) = found(top_pid);
    }
    let (Some(init), Some(other)) = (init, other) else { panic!("no init and other leader below {top_pid}") };
    super::supervise::stop_the_run(top_pid);
    let stopped = |pid: Pid| {
        let since = Instant::now();
        while !matches!(state(pid), Some('T' | 't')) && since.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(LOOK);
        }
        matches!(state(pid), Some('T' | 't'))
    };
    assert!(stopped(top_pid), "the top is stopped");
    assert!(stopped(init), "the init without a child is stopped");
    std::thread::sleep(Duration::from_millis(50));
    assert!(matches!(state(other), Some('S' | 'R')), "the other leader stays awake: {:?}", state(other));
    drop(_kill_all);
    let _ = top.wait();
}
