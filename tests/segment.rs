//! The segment between real processes: a child refuses every segment it cannot trust (missing, empty,
//! short, zeroed, forged, stale, out of range) with exit 1 and a message, never a panic or a signal; and the
//! layout round-trips from the parent's process to another.
//!
//! The test process plays the parent: a child finds `simpleIPCshm<getppid()>`, which is this process's pid.
//! The cases share that one name, so they run one after another in a single test.

mod common;

use std::io::Write;
use std::mem::size_of;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::Ordering;

use common::{FAULT, SIMULATE, bin, text};
use simple_ipc::segment::{self, LAYOUT_VERSION, MAGIC, SharedState};

fn path() -> String {
    format!("/dev/shm/{}", segment::name_for(std::process::id()))
}

fn write_object(bytes: &[u8]) {
    let _ = std::fs::remove_file(path());
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path()).unwrap();
    file.write_all(bytes).unwrap();
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
        devices: &vec![0; n as usize],
        procs_per_device: n as usize,
        data_size: 4096,
        options: 0,
    });
    forge(state);
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    bytes[..size_of::<SharedState>()].to_vec()
}

fn child(index: &str) -> (Option<i32>, String) {
    let out =
        std::process::Command::new(bin()).arg(index).env(SIMULATE, "ok").env_remove(FAULT).output().unwrap();
    (out.status.code(), text(&out))
}

#[test]
fn child_refuses_every_segment_it_cannot_trust() {
    let _ = std::fs::remove_file(path());
    let (code, out) = child("0");
    assert_eq!(code, Some(1), "no segment: {out}");
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
        write_object(&bytes);
        let (code, out) = child("0");
        assert_eq!(code, Some(1), "{what}: must exit 1, not crash: {out}");
        assert!(out.contains(message), "{what}: expected {message:?} in {out}");
        assert!(!out.contains("panicked"), "{what}: {out}");
    }

    // An index past the segment's process count.
    write_object(&segment_bytes(2, |_| {}));
    let (code, out) = child("5");
    assert_eq!(code, Some(1));
    assert!(out.contains("this is process 5, but the segment has 2 processes"), "{out}");

    // A valid segment whose parent never gets ready: the child waits, and stops when the run is aborted.
    write_object(&segment_bytes(1, |s| {
        s.run_state.store(segment::RunState::Aborted as u32, Ordering::Relaxed)
    }));
    let (code, out) = child("0");
    assert_eq!(code, Some(1));
    assert!(out.contains("the run was aborted"), "{out}");
    assert!(!std::path::Path::new(&path()).exists(), "the last child to attach removes the name");
}

/// What one process writes through `Segment::create` another reads through `Segment::open`.
#[test]
fn layout_round_trips_between_processes() {
    let name = format!("simpleIPCshm-roundtrip-{}", std::process::id());
    let created = segment::Segment::create(&name).unwrap();
    let state = created.state();
    state.describe_run(&segment::RunPlan {
        devices: &[3, 3, 5],
        procs_per_device: 2,
        data_size: 1 << 20,
        options: 0,
    });
    for i in 0..3 {
        state.mem_handles[i].store(&[i as u8 + 1; 64]);
        state.event_handles[i].store(&[i as u8 + 101; 64]);
    }
    state.publish_ready();

    // SAFETY: (test) the forked child only reads the segment, then leaves with _exit.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let ok = segment::Segment::open(&name).is_ok_and(|opened| {
                let s = opened.state();
                s.process_count() == 3
                    && (0..3).map(|i| s.device_of(i)).eq([3, 3, 5])
                    && s.data_size() == 1 << 20
                    && s.run_state() == segment::RunState::Ready
                    && (0..3).all(|i| s.mem_handles[i].load() == [i as u8 + 1; 64])
                    && (0..3).all(|i| s.event_handles[i].load() == [i as u8 + 101; 64])
                    && opened.mark_attached().is_ok()
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
    assert_eq!(state.attached.load(Ordering::Relaxed), 1, "the other process's write came back");
    assert!(std::path::Path::new(&format!("/dev/shm/{name}")).exists(), "1 of 3 attached: the name stays");
    drop(created);
    assert!(
        !std::path::Path::new(&format!("/dev/shm/{name}")).exists(),
        "the creator removes the name on drop"
    );
}
