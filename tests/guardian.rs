//! The guardian, attacked as a hostile user would: stopped, killed, signalled with the run's whole process
//! group, typed by hand. Nothing it does or suffers may hang, kill or silence the run, a signal to the
//! group does not reach it, and in every case nothing of the run stays in /dev/shm, and nothing of anyone
//! else's is removed.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    FAULT, assert_nothing_left, bin, guardian_of, leftovers, run_with_pid, simulated, text, wait_pid_gone,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn signal(pid: u32, signal: Signal) {
    kill(Pid::from_raw(pid as i32), signal).unwrap();
}

/// A stopped guardian does not hold the run: the watchdog, SIGINT and SIGTERM still end it at once, and a
/// group stop followed by a continue of the parent alone ends in the watchdog. The parent continues it as it
/// leaves it (stopped, it would stay so for good), and it still removes what it was told of.
#[test]
fn a_stopped_guardian_hangs_nothing() {
    for how in ["watchdog", "SIGINT", "SIGTERM", "group stop"] {
        let mut run = simulated("ok")
            .args(["--procs-per-device", "3", "--timeout", "2"])
            .env(FAULT, "child0@round-robin:hang")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = run.id();
        let guardian = guardian_of(pid).expect("the run has a guardian");
        assert_eq!(common::wait_for_lines(&mut run, "Starting on device", 3, Duration::from_secs(10)), 3);
        let children: Vec<u32> = common::descendants(pid).into_iter().filter(|&c| c != guardian).collect();
        signal(guardian, Signal::SIGSTOP);
        let start = Instant::now();
        match how {
            "SIGINT" => signal(pid, Signal::SIGINT),
            "SIGTERM" => signal(pid, Signal::SIGTERM),
            "group stop" => {
                kill(Pid::from_raw(-(pid as i32)), Signal::SIGSTOP).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                signal(pid, Signal::SIGCONT);
            }
            _ => {}
        }
        let status = run.wait().unwrap();
        let took = start.elapsed();
        let expected = match how {
            "SIGINT" => None,
            "SIGTERM" => None,
            _ => Some(1),
        };
        if let Some(code) = expected {
            assert_eq!(status.code(), Some(code), "{how}");
        } else {
            use std::os::unix::process::ExitStatusExt;
            let n = if how == "SIGINT" { 130 } else { 143 };
            assert!(status.code() == Some(n) || status.signal().is_some(), "{how}: {status:?}");
        }
        assert!(took < Duration::from_secs(4), "{how}: the run took {took:?} with its guardian stopped");
        assert!(wait_pid_gone(guardian, Duration::from_secs(3)), "{how}: the guardian was left stopped");
        assert_nothing_left(pid, &children, how);
    }
}

/// A guardian killed before the parent tells it anything: the run neither dies of SIGPIPE (141) nor goes
/// silent. It passes, says that the guardian is gone, and leaves nothing, also with --sequential.
#[test]
fn a_killed_guardian_kills_nothing_and_is_said() {
    for sequential in [false, true] {
        let mut command = simulated("ok");
        command.args(["--procs-per-device", "4"]).env(FAULT, "parent@device-selection:stop");
        if sequential {
            command.arg("--sequential");
        }
        let run = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let pid = run.id();
        let guardian = guardian_of(pid).expect("the run has a guardian");
        // The parent stops itself once the guardian runs and before it exports anything.
        let start = Instant::now();
        while !common::is_stopped(pid) && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        signal(guardian, Signal::SIGKILL);
        assert!(wait_pid_gone(guardian, Duration::from_secs(3)));
        signal(pid, Signal::SIGCONT);
        let out = run.wait_with_output().unwrap();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "sequential {sequential}: {all}");
        assert!(all.contains("the guardian of this run's driver files") && all.contains("is gone"), "{all}");
        assert_nothing_left(pid, &[], &format!("guardian killed, sequential {sequential}"));
    }
}

/// A signal to the whole process group (`kill -KILL -PGID`, `timeout -s KILL`, Ctrl-\, and the other
/// signals whose default is to end a process) ends the run but not its guardian, which then removes the
/// driver's files of the run's events.
#[test]
fn a_signal_to_the_process_group_leaves_the_guardian_to_clean_up() {
    // (SIGPIPE is not among them: the program ignores it, and a write to a reader that went away answers EPIPE.)
    for sig in [Signal::SIGKILL, Signal::SIGQUIT, Signal::SIGUSR1, Signal::SIGUSR2, Signal::SIGALRM] {
        let mut command = simulated("ok");
        // Child 0 never opens the handles, so the event files keep their names until the run ends.
        command.args(["--procs-per-device", "4"]).env(FAULT, "child0@open-handles:hang");
        // SIGQUIT would dump cores of the whole group into the working directory; and the signal's default
        // action is what is tested, whatever this test inherited (a shell leaves SIGQUIT ignored in the
        // background).
        // SAFETY: (test) setrlimit and signal in the forked child before exec.
        unsafe {
            command.pre_exec(move || {
                if sig != Signal::SIGKILL {
                    nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl)
                        .map_err(std::io::Error::from)?;
                }
                nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
                    .map_err(std::io::Error::from)
            });
        }
        let mut run =
            command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let pid = run.id();
        let guardian = guardian_of(pid).expect("the run has a guardian");
        assert_eq!(common::wait_for_lines(&mut run, "Starting on device", 4, Duration::from_secs(10)), 4);
        std::thread::sleep(Duration::from_millis(200)); // the events are exported
        let children: Vec<u32> = common::descendants(pid).into_iter().filter(|&c| c != guardian).collect();
        assert!(!leftovers(pid, &[]).is_empty(), "{sig}: the run's event files exist while it runs");
        kill(Pid::from_raw(-(pid as i32)), sig).unwrap();
        run.wait().unwrap();
        assert!(wait_pid_gone(guardian, Duration::from_secs(3)), "{sig}: the guardian did not end");
        assert!(common::wait_group_gone(pid, Duration::from_secs(3)).is_some(), "{sig}: a process is left");
        assert_nothing_left(pid, &children, &format!("{sig} to the group"));
    }
}

/// The guardian's role typed by hand removes nothing: it takes no pid, and serves only a socket of the
/// kind its parent makes; the old way of naming a process to clean up is no option at all.
#[test]
fn a_guardian_typed_by_hand_removes_nothing() {
    let me = std::process::id();
    let decoy = format!("/dev/shm/cuda.shm.0.{me:x}.777");
    std::fs::write(&decoy, b"mine").unwrap();
    let _decoy = common::removed_at_end(&decoy);
    let (read, _write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let mut command = Command::new(bin());
    command.args(["@internal", "guardian", "--fd", "3"]);
    let read = std::os::fd::AsRawFd::as_raw_fd(&read);
    common::with_fds(&mut command, &[(read, 3)]);
    let (_, out) = run_with_pid(&mut command);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("not a socket"), "{}", text(&out));
    let (_, out) =
        run_with_pid(Command::new(bin()).args(["--guardian-for", &me.to_string(), "--guardian-fd", "0"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(std::path::Path::new(&decoy).exists(), "a hand-typed guardian removed another process's file");
}

/// A guardian spoken to by hand, as a parent speaks to it: this end of its socket, and the guardian.
fn hand_spoken_guardian() -> (std::os::fd::OwnedFd, std::process::Child) {
    use std::os::fd::AsRawFd;
    let (ours, theirs) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    let mut command = Command::new(bin());
    command.args(["@internal", "guardian", "--fd", "3"]).stdin(Stdio::null());
    common::with_fds(&mut command, &[(theirs.as_raw_fd(), 3)]);
    (ours, command.spawn().unwrap())
}

/// Whether `guardian` ends within 5 s (it is killed and reaped otherwise).
fn ends_within_5_s(mut guardian: std::process::Child) -> bool {
    let start = Instant::now();
    let mut status = None;
    while status.is_none() && start.elapsed() < Duration::from_secs(5) {
        status = guardian.try_wait().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    if status.is_none() {
        let _ = guardian.kill();
    }
    let _ = guardian.wait();
    status.is_some()
}

/// A parent that dies after telling its guardian it is making an event file, and before saying which file
/// it made: the guardian removes the file of the driver's shape with the parent's pid number that appeared
/// meanwhile (`driver_files::named_by_pid`, at the end), and keeps the one the parent listed as there
/// before. Spoken to by hand, as the parent speaks (`Making`, then the socket closes).
#[test]
fn a_parent_killed_while_it_makes_an_event_file_leaves_that_file_to_the_guardian() {
    use std::os::fd::AsRawFd;
    let me = std::process::id();
    let before = format!("/dev/shm/cuda.shm.0.{me:x}.5eed1");
    let made = format!("/dev/shm/cuda.shm.0.{me:x}.5eed2");
    let _before = common::removed_at_end(&before);
    let _made = common::removed_at_end(&made);
    std::fs::write(&before, b"there before").unwrap();
    let (ours, guardian) = hand_spoken_guardian();
    // `Making`, listing the one file of this pid number there now (as `Guardian::covering` does).
    let meta = std::fs::metadata(&before).unwrap();
    let mut record = [0u8; 64];
    record[..8].copy_from_slice(&std::os::unix::fs::MetadataExt::dev(&meta).to_le_bytes());
    record[8..16].copy_from_slice(&std::os::unix::fs::MetadataExt::ino(&meta).to_le_bytes());
    let name = before.trim_start_matches("/dev/shm/");
    record[16..16 + name.len()].copy_from_slice(name.as_bytes());
    let mut message = vec![b'M'];
    message.extend_from_slice(&record);
    nix::sys::socket::send(ours.as_raw_fd(), &message, nix::sys::socket::MsgFlags::empty()).unwrap();
    // The driver makes the file; the parent dies before it says which (its end closes).
    std::fs::write(&made, b"made while making").unwrap();
    drop(ours);
    assert!(ends_within_5_s(guardian), "the guardian ends once its parent is gone");
    assert!(!std::path::Path::new(&made).exists(), "the file made between Making and Made is removed");
    assert!(std::path::Path::new(&before).exists(), "the file listed as there before is kept");
}

/// The guardian removes only what its own run made: files of the driver's shape named by the pids of the
/// run's parent and children, made by someone else, stay when the run is killed.
#[test]
fn a_killed_run_removes_only_its_own_files() {
    let mut run = simulated("ok")
        .args(["--procs-per-device", "4"])
        .env(FAULT, "child0@open-handles:hang")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = run.id();
    let guardian = guardian_of(pid).expect("the run has a guardian");
    assert_eq!(common::wait_for_lines(&mut run, "Starting on device", 4, Duration::from_secs(10)), 4);
    std::thread::sleep(Duration::from_millis(200)); // the events are exported
    assert!(!leftovers(pid, &[]).is_empty(), "the run's event files exist while it runs");
    let mut decoys: Vec<String> =
        common::descendants(pid).into_iter().map(|p| format!("/dev/shm/cuda.shm.0.{p:x}.777")).collect();
    decoys.push(format!("/dev/shm/cuda.shm.0.{pid:x}.777"));
    let made: Vec<_> = decoys
        .iter()
        .map(|decoy| {
            std::fs::write(decoy, b"someone else's").unwrap();
            common::removed_at_end(decoy)
        })
        .collect();
    kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL).unwrap();
    run.wait().unwrap();
    assert!(wait_pid_gone(guardian, Duration::from_secs(3)));
    for decoy in &decoys {
        assert!(std::path::Path::new(decoy).exists(), "{decoy}, not the run's, was removed");
    }
    drop(made); // the decoys go before the run's own files are looked for
    assert_nothing_left(pid, &[], "killed run");
}

/// A server of a path socket killed (SIGKILL to its whole process group, the guardian outside it) while it
/// waits for its joiners: the guardian removes the socket file it was told of. At several moments, the
/// earliest before the socket exists. Another run's socket made at the same path once the first server's is
/// gone stays (the guardian removes only what was made).
#[test]
fn a_killed_server_leaves_no_socket_file_and_takes_no_other() {
    let dir = common::scratch("killed-server");
    let path = dir.path().join("run.sock");
    let serve = path.to_str().unwrap().to_owned();
    for after_ms in [5u64, 20, 60, 150, 400] {
        let mut server = simulated("ok")
            .args(["--serve", &serve, "--timeout", "20"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = server.id();
        let guardian = guardian_of(pid);
        std::thread::sleep(Duration::from_millis(after_ms));
        kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL).unwrap();
        server.wait().unwrap();
        if let Some(guardian) = guardian {
            assert!(wait_pid_gone(guardian, Duration::from_secs(3)), "{after_ms} ms: the guardian ended");
        }
        assert!(
            std::fs::symlink_metadata(&path).is_err(),
            "{after_ms} ms in: the killed server's socket file is left at {serve}"
        );
    }
    // Killed before the guardian could look: the path another made since is not touched.
    let mut server = simulated("ok")
        .args(["--serve", &serve, "--timeout", "20"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = server.id();
    assert_eq!(common::wait_for_lines(&mut server, "Serving the run", 1, Duration::from_secs(10)), 1);
    let guardian = guardian_of(pid).expect("the server has a guardian");
    signal(guardian, Signal::SIGSTOP);
    kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL).unwrap();
    server.wait().unwrap();
    std::fs::remove_file(&path).unwrap();
    let theirs = std::os::unix::net::UnixListener::bind(&path).unwrap();
    signal(guardian, Signal::SIGCONT);
    assert!(wait_pid_gone(guardian, Duration::from_secs(3)), "the guardian ended");
    assert!(std::fs::symlink_metadata(&path).is_ok(), "the guardian removed another's socket at {serve}");
    drop(theirs);
}

/// A stale socket (nothing listens) of another user at the path: root's server does not take it over
/// (docs/details.md: a path that exists is never taken over), refuses naming its owner, and leaves it.
/// A stale socket of its own user is still removed and the path served.
#[test]
fn a_stale_socket_of_another_user_is_not_taken() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        common::skipped(
            "root",
            "a_stale_socket_of_another_user_is_not_taken: needs root to make another's file",
        );
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("user nobody exists");
    let dir = common::scratch("stale-socket");
    let path = dir.path().join("theirs.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap()); // stale: nobody listens
    nix::unistd::chown(&path, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let ino = std::fs::symlink_metadata(&path).unwrap().ino();
    let out = common::run(simulated("ok").args(["--serve", path.to_str().unwrap(), "--timeout", "5"]));
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("uid {}", nobody.uid)) && said.contains("not this run's"), "{said}");
    assert_eq!(std::fs::symlink_metadata(&path).map(|m| m.ino()).ok(), Some(ino), "another's socket is gone");

    // One of this user's own: removed, and the path served (until the watchdog, no joiner coming).
    let mine = dir.path().join("mine.sock");
    drop(std::os::unix::net::UnixListener::bind(&mine).unwrap());
    let out = common::run(simulated("ok").args(["--serve", mine.to_str().unwrap(), "--timeout", "1"]));
    let said = text(&out);
    assert!(said.contains("removed the stale socket"), "{said}");
    assert!(std::fs::symlink_metadata(&mine).is_err(), "the server's own socket is left: {said}");
}

/// A parent that dies after telling its guardian it is making a directory, and before saying it made it:
/// the guardian removes the empty directory of its user at that path; one announced and then said not
/// made (the name was taken) is left, as is one that is not empty. Spoken to by hand, as the parent speaks
/// (`N` and `X` notes, then the socket closes).
#[test]
fn a_parent_killed_while_it_makes_a_directory_leaves_that_directory_to_the_guardian() {
    use std::os::fd::AsRawFd;
    let scratch = common::scratch("making-dir");
    let (made, taken, full) =
        (scratch.path().join("made"), scratch.path().join("taken"), scratch.path().join("full"));
    let (ours, guardian) = hand_spoken_guardian();
    let say = |kind: u8, path: &std::path::Path| {
        let note = [&[kind][..], path.as_os_str().as_encoded_bytes()].concat();
        nix::sys::socket::send(ours.as_raw_fd(), &note, nix::sys::socket::MsgFlags::empty()).unwrap();
    };
    for dir in [&made, &taken, &full] {
        say(b'N', dir);
        std::fs::create_dir(dir).unwrap();
    }
    say(b'X', &taken);
    std::fs::write(full.join("kept"), b"not empty").unwrap();
    drop(ours);
    assert!(ends_within_5_s(guardian), "the guardian ends once its parent is gone");
    assert!(!made.exists(), "the directory made between N and its P is removed");
    assert!(taken.exists(), "a directory said not made is left");
    assert!(full.join("kept").exists(), "a directory that is not empty is left");
}
