//! The hand-over measurements: the six kinds measured, what the two sides share to hand over (a [`Pair`]:
//! each side's stream, interprocess event, flag and work buffer), the consumer's timed round trips
//! ([`measure`]) and the producer's mirror of them ([`answer`]), and the figures they give ([`Trips`]).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::gpu::Stream;
use crate::ipc::{DeviceBuffer, DeviceMemory, Event, ExportedEvent, Mechanism, OpenedEvent, Slice};
use crate::os::futex;
use crate::segment::SharedState;
use crate::segment::barrier::{self, StopCheck};

/// The flags' buffer: the consumer's flag at its start, the producer's one cache line further.
pub const FLAGS_BYTES: usize = 4096;
const PRODUCER_FLAG: usize = 128;
/// The work of a hand-over "with work": a fill of this many bytes on each side.
pub const WORK_BYTES: usize = 4096;

/// The hand-overs measured, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Events, no work: each side's stream waits for the other's event (`cuStreamWaitEvent`).
    EventsGpuWaits,
    /// Events, no work: each side's host waits for the other's event (`cuEventSynchronize`).
    EventsHostWaits,
    /// Events, a fill on each side, the GPU waits.
    EventsWithWork,
    /// Stream memory operations, no work; the consumer's host syncs each round.
    MemopsHostSynced,
    /// Stream memory operations, no work; all rounds queued ahead on both sides: the mean of a round.
    MemopsQueued,
    /// Stream memory operations, a fill on each side; the host syncs each round.
    MemopsWithWork,
}

impl Handover {
    pub const ALL: [Handover; 6] = [
        Handover::EventsGpuWaits,
        Handover::EventsHostWaits,
        Handover::EventsWithWork,
        Handover::MemopsHostSynced,
        Handover::MemopsQueued,
        Handover::MemopsWithWork,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Handover::EventsGpuWaits => "events, signal only, GPU waits",
            Handover::EventsHostWaits => "events, signal only, host waits",
            Handover::EventsWithWork => "events, a fill on each side",
            Handover::MemopsHostSynced => "stream memops, signal only, host syncs each round",
            Handover::MemopsQueued => "stream memops, signal only, queued ahead (mean)",
            Handover::MemopsWithWork => "stream memops, a fill on each side",
        }
    }

    pub fn memops(self) -> bool {
        matches!(self, Handover::MemopsHostSynced | Handover::MemopsQueued | Handover::MemopsWithWork)
    }

    pub fn work(self) -> bool {
        matches!(self, Handover::EventsWithWork | Handover::MemopsWithWork)
    }
}

/// How the hand-over flags are shared: by the benchmark's mechanism, except that stream memory operations
/// refuse pool memory (`CUDA_ERROR_INVALID_VALUE` on driver 580), so pool's flags are plain device memory
/// shared by legacy IPC.
pub fn flags_mechanism(mechanism: Mechanism) -> Mechanism {
    if mechanism.spec().refuses_memops.is_some() { Mechanism::Legacy } else { mechanism }
}

/// Round trips per hand-over kind.
pub fn rounds(simulated: bool) -> u32 {
    if simulated { 20 } else { 500 }
}

/// `p50 (p10-p90)` of round trips, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub p50: f64,
    pub p10: f64,
    pub p90: f64,
}

impl Spread {
    pub fn of(trips: &mut [Duration]) -> Self {
        trips.sort();
        let at = |q: usize| {
            trips.get(trips.len().saturating_sub(1) * q / 100).map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        Self { p50: at(50), p10: at(10), p90: at(90) }
    }
}

/// The figures of one kind of hand-over, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trips {
    /// Each round trip timed on its own.
    Spread(Spread),
    /// Every round queued ahead at once: only the mean of a round is known.
    Mean(f64),
}

/// What the two sides of a pair share to hand over: this side's stream, event, flag and work, and the other
/// side's event and flag.
pub struct Pair<'a, 'd> {
    stream: &'a Stream<'d>,
    mine: &'a ExportedEvent<'d>,
    theirs: &'a OpenedEvent<'d>,
    my_flag: Slice<'a>,
    their_flag: Slice<'a>,
    work: &'a DeviceBuffer<'d>,
}

impl<'a, 'd> Pair<'a, 'd> {
    /// The consumer's side; `flags` is its mapping of the producer's flags.
    pub fn consumer(
        stream: &'a Stream<'d>,
        mine: &'a ExportedEvent<'d>,
        theirs: &'a OpenedEvent<'d>,
        flags: &'a impl DeviceMemory,
        work: &'a DeviceBuffer<'d>,
    ) -> Result<Self> {
        let (my_flag, their_flag) = (Slice::of(flags, 0, 4)?, Slice::of(flags, PRODUCER_FLAG, 4)?);
        Ok(Self { stream, mine, theirs, my_flag, their_flag, work })
    }

    /// The producer's side; `flags` is the flags' buffer it exported.
    pub fn producer(
        stream: &'a Stream<'d>,
        mine: &'a ExportedEvent<'d>,
        theirs: &'a OpenedEvent<'d>,
        flags: &'a impl DeviceMemory,
        work: &'a DeviceBuffer<'d>,
    ) -> Result<Self> {
        let (my_flag, their_flag) = (Slice::of(flags, PRODUCER_FLAG, 4)?, Slice::of(flags, 0, 4)?);
        Ok(Self { stream, mine, theirs, my_flag, their_flag, work })
    }
}

/// Round trips of one kind of hand-over, measured by the consumer; the producer does its part in
/// [`answer`]. Host flags (`ping`, `pong`) say when the other side has enqueued its part; `memops_done`
/// counts the flag writes of the pair so far.
pub fn measure(
    handover: Handover,
    side: &Pair,
    state: &SharedState,
    rounds: u32,
    memops_done: &mut u32,
    stop: &dyn StopCheck,
) -> Result<Trips> {
    let stream = side.stream;
    let mut trips = Vec::with_capacity(rounds as usize);
    if handover == Handover::MemopsQueued {
        // Every round queued at once on both sides; the mean includes the hosts' enqueueing. (Holding the
        // chain on a flag and releasing it from a second stream deadlocks: with one hardware queue per
        // context, the release waits behind the held wait.)
        let base = *memops_done;
        let start = Instant::now();
        for k in base + 1..=base + rounds {
            stream.write_flag(&side.my_flag, k)?;
            stream.wait_flag(&side.their_flag, k)?;
        }
        stream.synchronize(stop)?;
        *memops_done += rounds;
        let mean = start.elapsed() / rounds;
        return Ok(Trips::Mean(mean.as_secs_f64() * 1e6));
    }
    for _ in 0..rounds {
        let start = Instant::now();
        if handover.work() {
            stream.fill(side.work, 1, WORK_BYTES)?;
        }
        if handover.memops() {
            *memops_done += 1;
            stream.write_flag(&side.my_flag, *memops_done)?;
            stream.wait_flag(&side.their_flag, *memops_done)?;
            stream.synchronize(stop)?;
        } else {
            stream.record(side.mine)?;
            let ping = state.bench.ping.fetch_add(1, Ordering::AcqRel) + 1;
            futex::wake_all(&state.bench.ping);
            barrier::wait_until(&state.bench.pong, |v| v >= ping, stop)?;
            match handover {
                Handover::EventsHostWaits => side.theirs.synchronize(stop)?,
                _ => {
                    stream.wait_for(side.theirs)?;
                    stream.synchronize(stop)?;
                }
            }
        }
        trips.push(start.elapsed());
    }
    Ok(Trips::Spread(Spread::of(&mut trips)))
}

/// The producer's part of a hand-over kind: the mirror of [`measure`].
pub fn answer(
    handover: Handover,
    side: &Pair,
    state: &SharedState,
    rounds: u32,
    memops_done: &mut u32,
    stop: &dyn StopCheck,
) -> Result<()> {
    let stream = side.stream;
    if handover.memops() {
        // Everything queued ahead: the GPU waits for each of the consumer's writes, and answers.
        for _ in 0..rounds {
            *memops_done += 1;
            stream.wait_flag(&side.their_flag, *memops_done)?;
            if handover.work() {
                stream.fill(side.work, 2, WORK_BYTES)?;
            }
            stream.write_flag(&side.my_flag, *memops_done)?;
        }
        return stream.synchronize(stop);
    }
    for _ in 0..rounds {
        let asked = wait_for_raise(&state.bench.ping, state.bench.pong.load(Ordering::Acquire), stop)?;
        match handover {
            Handover::EventsHostWaits => side.theirs.synchronize(stop)?,
            _ => stream.wait_for(side.theirs)?,
        }
        if handover.work() {
            stream.fill(side.work, 2, WORK_BYTES)?;
        }
        stream.record(side.mine)?;
        state.bench.pong.store(asked, Ordering::Release);
        futex::wake_all(&state.bench.pong);
    }
    stream.synchronize(stop)
}

/// Waits until `word` exceeds `seen`; returns its new value.
fn wait_for_raise(word: &AtomicU32, seen: u32, stop: &dyn StopCheck) -> Result<u32> {
    barrier::wait_until(word, |v| v > seen, stop)?;
    Ok(word.load(Ordering::Acquire))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pool memory refuses stream memory operations, so its hand-over flags are legacy memory; the other
    /// mechanisms share their flags themselves.
    #[test]
    fn the_flags_are_shared_by_a_mechanism_memops_accept() {
        assert_eq!(flags_mechanism(Mechanism::Pool), Mechanism::Legacy);
        assert_eq!(flags_mechanism(Mechanism::Vmm), Mechanism::Vmm);
        assert_eq!(flags_mechanism(Mechanism::Legacy), Mechanism::Legacy);
    }

    #[test]
    fn the_hand_over_kinds_say_what_they_measure() {
        let with_work: Vec<Handover> = Handover::ALL.into_iter().filter(|h| h.work()).collect();
        assert_eq!(with_work, [Handover::EventsWithWork, Handover::MemopsWithWork]);
        let memops: Vec<Handover> = Handover::ALL.into_iter().filter(|h| h.memops()).collect();
        assert_eq!(memops, [Handover::MemopsHostSynced, Handover::MemopsQueued, Handover::MemopsWithWork]);
        assert!(Handover::ALL.iter().all(|h| h.name().contains(if h.memops() {
            "memops"
        } else {
            "events"
        })));
        assert!(rounds(true) >= 10 && rounds(false) >= 100, "enough rounds for percentiles");
    }

    #[test]
    fn spreads_are_percentiles_of_the_sorted_trips() {
        let mut trips: Vec<Duration> = (1..=11).rev().map(Duration::from_micros).collect();
        let spread = Spread::of(&mut trips);
        assert_eq!((spread.p50, spread.p10, spread.p90), (6.0, 2.0, 10.0));
    }
}
