//! The barrier across real processes (fork), more processes than this machine has cores, many rounds.

use std::mem::size_of;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapMut;
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};
use simple_ipc::segment::{RunState, SharedState};

/// A SharedState and a counter in anonymous shared memory, inherited by forked processes.
struct Shared {
    map: MmapMut,
}

impl Shared {
    fn new() -> Self {
        // MAP_SHARED, so that forked processes see each other's writes (map_anon would be private).
        let fd = memfd_create(c"barrier-test", MFdFlags::MFD_CLOEXEC).unwrap();
        let file = std::fs::File::from(fd);
        file.set_len((size_of::<SharedState>() + 64) as u64).unwrap();
        // SAFETY: (test) nobody truncates the memfd while it is mapped.
        Self { map: unsafe { MmapMut::map_mut(&file) }.unwrap() }
    }
    fn state(&self) -> &SharedState {
        // SAFETY: (test) page-aligned, large enough, all fields atomics.
        unsafe { &*(self.map.as_ptr() as *const SharedState) }
    }
    fn arrivals(&self) -> &AtomicU64 {
        let offset = size_of::<SharedState>().next_multiple_of(8);
        // SAFETY: (test) 8-aligned, inside the mapping.
        unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU64) }
    }
}

/// Forks one process running `body`, which returns its exit code.
fn spawn(body: impl FnOnce() -> i32) -> Pid {
    // SAFETY: (test) the child runs only atomics, futex calls and _exit.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            let code = body();
            // SAFETY: (test) leaves the forked child without the harness's atexit handlers.
            unsafe { nix::libc::_exit(code) }
        }
        ForkResult::Parent { child } => child,
    }
}

fn aborted(state: &SharedState) -> anyhow::Result<()> {
    anyhow::ensure!(state.run_state() != RunState::Aborted, "aborted");
    Ok(())
}

#[test]
fn nobody_passes_a_round_before_everyone_arrived() {
    const PROCESSES: usize = 40;
    const ROUNDS: u64 = 200;
    let shared = Shared::new();
    let children: Vec<Pid> = (0..PROCESSES)
        .map(|_| {
            spawn(|| {
                let state = shared.state();
                let barrier = state.barrier(PROCESSES);
                let stop = || aborted(state);
                for round in 0..ROUNDS {
                    shared.arrivals().fetch_add(1, Ordering::AcqRel);
                    if barrier.wait(&stop).is_err() {
                        return 3;
                    }
                    // Everyone arrived for this round; nobody can have arrived twice for the next one.
                    let seen = shared.arrivals().load(Ordering::Acquire);
                    let n = PROCESSES as u64;
                    if seen < (round + 1) * n || seen > (round + 2) * n - 1 {
                        return 4;
                    }
                }
                0
            })
        })
        .collect();
    for child in children {
        assert_eq!(
            waitpid(child, None).unwrap(),
            WaitStatus::Exited(child, 0),
            "process {child} saw a broken round"
        );
    }
    assert_eq!(shared.arrivals().load(Ordering::Relaxed), PROCESSES as u64 * ROUNDS);
    let state = shared.state();
    assert_eq!(state.barrier.load(Ordering::Relaxed), 0, "the count returns to 0");
    assert_eq!(state.sense.load(Ordering::Relaxed), 0, "the sense returns to 0");
}

#[test]
fn a_dead_participant_ends_every_wait_through_the_abort_flag() {
    const PROCESSES: usize = 6;
    let shared = Shared::new();
    let waiting: Vec<Pid> = (0..PROCESSES - 1)
        .map(|_| {
            spawn(|| {
                let state = shared.state();
                let stop = || aborted(state);
                match state.barrier(PROCESSES).wait(&stop) {
                    Err(_) => 3,
                    Ok(()) => 0,
                }
            })
        })
        .collect();
    // The last participant dies before it reaches the barrier.
    let dead = spawn(|| 9);
    assert_eq!(waitpid(dead, None).unwrap(), WaitStatus::Exited(dead, 9));
    std::thread::sleep(Duration::from_millis(100)); // everyone is asleep in the barrier by now
    let start = Instant::now();
    shared.state().abort();
    for child in waiting {
        assert_eq!(
            waitpid(child, None).unwrap(),
            WaitStatus::Exited(child, 3),
            "the wait ends with an error"
        );
    }
    assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
}
