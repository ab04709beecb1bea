//! Cost of one barrier round across real processes: `cargo bench --bench barrier`.
//! Prints, for 2, 8 and 32 processes, the median over 5 runs of (wall time / rounds), and the CPU time the
//! processes spent per round (what spinning would inflate).

use std::mem::size_of;
use std::time::{Duration, Instant};

use memmap2::MmapMut;
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork};
use simple_ipc::segment::SharedState;

fn shared_state() -> MmapMut {
    let fd = memfd_create(c"barrier-bench", MFdFlags::empty()).expect("memfd");
    let file = std::fs::File::from(fd);
    file.set_len(size_of::<SharedState>() as u64).expect("size");
    // SAFETY: (bench) nobody truncates the memfd while it is mapped.
    unsafe { MmapMut::map_mut(&file) }.expect("map")
}

fn cpu_of_children() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| Duration::new(tv.tv_sec() as u64, tv.tv_usec() as u32 * 1000);
    t(usage.user_time()) + t(usage.system_time())
}

/// Wall and CPU time per round for `processes` processes crossing the barrier `rounds` times.
fn one_run(processes: usize, rounds: usize) -> (Duration, Duration) {
    let map = shared_state();
    // SAFETY: (bench) page-aligned, large enough, all fields atomics.
    let state = unsafe { &*(map.as_ptr() as *const SharedState) };
    let cpu_before = cpu_of_children();
    let start = Instant::now();
    let children: Vec<_> = (0..processes)
        .map(|_| {
            // SAFETY: (bench) the child runs only atomics, futex calls and _exit.
            match unsafe { fork() }.expect("fork") {
                ForkResult::Child => {
                    let barrier = state.barrier(processes);
                    let stop = || Ok(());
                    let ok = (0..rounds).all(|_| barrier.wait(&stop).is_ok());
                    // SAFETY: (bench) leaves the child without running the parent's atexit handlers.
                    unsafe { nix::libc::_exit(if ok { 0 } else { 1 }) }
                }
                ForkResult::Parent { child } => child,
            }
        })
        .collect();
    for child in children {
        assert_eq!(waitpid(child, None).expect("waitpid"), WaitStatus::Exited(child, 0));
    }
    let wall = start.elapsed();
    let cpu = cpu_of_children() - cpu_before;
    (wall / rounds as u32, cpu / rounds as u32)
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("barrier round cost, {cores} cores (median of 5 runs)");
    println!("{:>10} {:>8} {:>14} {:>14}", "processes", "rounds", "wall/round", "cpu/round");
    for (processes, rounds) in [(2, 20_000), (8, 5_000), (32, 2_000)] {
        let mut runs: Vec<(Duration, Duration)> = (0..5).map(|_| one_run(processes, rounds)).collect();
        runs.sort();
        let (wall, cpu) = runs[2];
        println!(
            "{processes:>10} {rounds:>8} {:>11.1} us {:>11.1} us",
            wall.as_secs_f64() * 1e6,
            cpu.as_secs_f64() * 1e6
        );
    }
}
