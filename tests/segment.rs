//! The segment between real processes: a child refuses every segment it cannot trust (missing, not a
//! descriptor, unsealed, empty, short, zeroed, forged, stale, out of range) with exit 1 and a message, never
//! a panic or a signal; and the layout round-trips from the parent's process to another.
//!
//! The test process plays the parent: it hands each child an object as the inherited `--segment-fd`.

mod common;

use std::io::Write;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::sync::atomic::Ordering;

use nix::fcntl::{FcntlArg, FdFlag, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

use common::{FAULT, SIMULATE, bin, text};
use simple_ipc::segment::{self, LAYOUT_VERSION, MAGIC, SharedState};

/// An anonymous shared memory object holding `bytes`, sealed against resizing when `sealed`, as the parent
/// makes its segment.
fn object(bytes: &[u8], sealed: bool) -> OwnedFd {
    let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    let fd = memfd_create(c"simpleIPCshm-test", flags).unwrap();
    let mut file = std::fs::File::from(fd.try_clone().unwrap());
    file.write_all(bytes).unwrap();
    if sealed {
        let seals = SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).unwrap();
    }
    fd
}

/// A well-formed segment for `n` processes, as bytes, with one field changed by `forge`.
fn segment_bytes(n: u64, forge: impl FnOnce(&SharedState)) -> Vec<u8> {
    let mut words = vec![0u64; size_of::<SharedState>().div_ceil(8)];
    // SAFETY: (test) the buffer is 8-aligned and large enough, and every field of SharedState is an atomic.
    let state = unsafe { &*(words.as_mut_ptr() as *const SharedState) };
    state.magic.store(MAGIC, Ordering::Relaxed);
    state.layout_version.store(LAYOUT_VERSION, Ordering::Relaxed);
    state.segment_size.store(size_of::<SharedState>() as u64, Ordering::Relaxed);
    state.parent_pid.store(std::process::id(), Ordering::Relaxed);
    state.describe_run(&segment::RunPlan {
        uuids: &[],
        devices: &vec![0; n as usize],
        procs_per_device: n as usize,
        data_size: 4096,
        options: 0,
        mechanism: 0,
    });
    forge(state);
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    bytes[..size_of::<SharedState>()].to_vec()
}

/// Runs child `index` with `segment` as its inherited descriptor (or with none).
fn child(index: &str, segment: Option<&OwnedFd>) -> (Option<i32>, String) {
    let mut command = std::process::Command::new(bin());
    command.args(["@internal", "child", index]).env(SIMULATE, "ok").env_remove(FAULT);
    if let Some(fd) = segment.map(|fd| fd.as_raw_fd()) {
        command.arg("--segment-fd").arg(fd.to_string());
        // SAFETY: (test) between fork and exec; fcntl is async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                let fd = BorrowedFd::borrow_raw(fd);
                fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).map(drop).map_err(std::io::Error::from)
            });
        }
    }
    let out = command.output().unwrap();
    (out.status.code(), text(&out))
}

fn child_with(index: &str, bytes: &[u8]) -> (Option<i32>, String) {
    child(index, Some(&object(bytes, true)))
}

#[test]
fn child_refuses_every_segment_it_cannot_trust() {
    let (code, out) = child("0", None);
    assert_eq!(code, Some(1), "no segment: {out}");
    assert!(out.contains("children are started by the parent"), "{out}");
    assert!(out.contains("Failed to create shared memory slab"), "{out}");

    let full = size_of::<SharedState>();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty object", vec![], "has 0 bytes"),
        ("short object", vec![0; 100], "has 100 bytes"),
        ("zeroed segment", vec![0; full], "not a simple-ipc segment"),
        (
            "forged magic",
            segment_bytes(1, |s| s.magic.store(0x1234, Ordering::Relaxed)),
            "not a simple-ipc segment",
        ),
        (
            "stale layout",
            segment_bytes(1, |s| s.layout_version.store(0, Ordering::Relaxed)),
            "layout version 0",
        ),
        (
            "wrong declared size",
            segment_bytes(1, |s| s.segment_size.store(12, Ordering::Relaxed)),
            "declares 12 bytes",
        ),
        ("no processes", segment_bytes(0, |_| {}), "declares 0 processes"),
        (
            "too many processes",
            segment_bytes(1, |s| s.nprocesses.store(33, Ordering::Relaxed)),
            "declares 33 processes",
        ),
        (
            "negative device",
            segment_bytes(2, |s| s.devices[1].store(-5, Ordering::Relaxed)),
            "invalid device -5",
        ),
        ("huge buffers", segment_bytes(1, |s| s.data_size.store(1 << 40, Ordering::Relaxed)), "buffers of"),
        ("other parent", segment_bytes(1, |s| s.parent_pid.store(1, Ordering::Relaxed)), "made by process 1"),
        (
            "device out of range",
            segment_bytes(1, |s| s.devices[0].store(7, Ordering::Relaxed)),
            "device 7, but there are 1",
        ),
    ];
    for (what, bytes, message) in cases {
        let (code, out) = child_with("0", &bytes);
        assert_eq!(code, Some(1), "{what}: must exit 1, not crash: {out}");
        assert!(out.contains(message), "{what}: expected {message:?} in {out}");
        assert!(!out.contains("panicked"), "{what}: {out}");
    }

    // A well-formed segment that could still grow or shrink under the child's mapping.
    let (code, out) = child("0", Some(&object(&segment_bytes(1, |_| {}), false)));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("not sealed"), "{out}");

    // Descriptors that are not a segment.
    // A pipe: not sealed, not a segment.
    let (read, _write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (code, out) = child("0", Some(&read));
    assert_eq!(code, Some(1), "a pipe: {out}");
    let mut command = std::process::Command::new(bin());
    let out = command
        .args(["@internal", "child", "0", "--segment-fd", "977"])
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a descriptor that is not open: {}", text(&out));
    assert!(text(&out).contains("fstat"), "{}", text(&out));
    let out = std::process::Command::new(bin())
        .args(["@internal", "child", "0", "--segment-fd", "1"])
        .env(SIMULATE, "ok")
        .output()
        .unwrap();
    assert!(text(&out).contains("descriptor 1 is not the segment"), "{}", text(&out));

    // An index past the segment's process count.
    let (code, out) = child_with("5", &segment_bytes(2, |_| {}));
    assert_eq!(code, Some(1));
    assert!(out.contains("this is process 5, but the segment has 2 processes"), "{out}");
    // ... and past any run's, refused by the parser before the segment's per-process fields are looked at.
    let (code, out) = child_with("40", &segment_bytes(2, |_| {}));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("40 is not in 0..32"), "{out}");
    assert!(!out.contains("internal error") && !out.contains("panicked"), "{out}");

    // A valid segment whose parent never gets ready: the child waits, and stops when the run is aborted.
    let aborted =
        segment_bytes(1, |s| s.run_state.store(segment::RunState::Aborted as u32, Ordering::Relaxed));
    let (code, out) = child_with("0", &aborted);
    assert_eq!(code, Some(1));
    assert!(out.contains("the run was aborted"), "{out}");
}

/// What one process writes through `Segment::create` another reads through `Segment::open`.
#[test]
fn layout_round_trips_between_processes() {
    let name = format!("simpleIPCshm-roundtrip-{}", std::process::id());
    let created = segment::Segment::create(&name).unwrap();
    assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists(), "the segment never has a name");
    let state = created.state();
    state.describe_run(&segment::RunPlan {
        uuids: &[],
        devices: &[3, 3, 5],
        procs_per_device: 2,
        data_size: 1 << 20,
        options: 0,
        mechanism: 0,
    });
    for i in 0..3 {
        state.mem_handles[i].store(&[i as u8 + 1; 64]);
        state.event_handles[i].store(&[i as u8 + 101; 64]);
    }
    state.publish_ready();

    // SAFETY: (test) the forked child only reads the segment, then leaves with _exit.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            // As a child started by exec inherits it: not close-on-exec (which `open_inherited` checks).
            // SAFETY: (test) the descriptor is the segment's, open in this forked copy.
            let fd = unsafe { BorrowedFd::borrow_raw(created.fd()) };
            let inherited = fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).is_ok();
            let ok = inherited
                && segment::Segment::open_inherited(created.fd()).is_ok_and(|opened| {
                    let s = opened.state();
                    s.process_count() == 3
                        && (0..3).map(|i| s.device_of(i)).eq([3, 3, 5])
                        && s.data_size() == 1 << 20
                        && s.run_state() == segment::RunState::Ready
                        && (0..3).all(|i| s.mem_handles[i].load() == [i as u8 + 1; 64])
                        && (0..3).all(|i| s.event_handles[i].load() == [i as u8 + 101; 64])
                        && opened.state().opened.fetch_add(1, Ordering::AcqRel) == 0
                });
            // SAFETY: (test) ends the forked child without running the test harness's atexit handlers.
            unsafe { nix::libc::_exit(if ok { 0 } else { 1 }) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).unwrap();
            assert_eq!(
                status,
                nix::sys::wait::WaitStatus::Exited(child, 0),
                "the other process read it back"
            );
        }
    }
    assert_eq!(state.opened.load(Ordering::Relaxed), 1, "the other process's write came back");
}

/// The size of every buffer is the original's 64 MiB on GPUs (nothing on the CPU would notice if it
/// changed), and the simulation's in a simulated run, which is what that run's `--json` says it checked.
#[test]
fn buffers_are_the_originals_64_mib_and_a_simulated_run_says_its_size() {
    assert_eq!(segment::DATA_SIZE, 64 * 1024 * 1024, "the original's DATA_SIZE");
    assert_eq!(segment::data_size(false), segment::DATA_SIZE);
    assert_eq!(segment::data_size(true), segment::SIMULATED_DATA_SIZE);
    let dir = common::scratch("size-test");
    let json = dir.path().join("run.json");
    let out = common::run(common::simulated("ok,ok").arg("--json").arg(&json));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc = common::document(&json);
    assert_eq!(doc["run"]["buffer_bytes"].as_u64(), Some(segment::SIMULATED_DATA_SIZE as u64), "{doc}");
    assert_eq!(doc["driver"]["simulated"], true, "{doc}");
}
