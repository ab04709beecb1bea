//! The benchmark's rendezvous: the named steps at which the consumer and the producer meet, in the order
//! both go through them, and [`Rendezvous::meet`], which crosses the segment's barrier and then checks that
//! the other side met at the same step. Two sides out of step fail at once with an error that names both
//! steps ("the consumer is at step X, the producer at step Y"), instead of waiting for each other in later
//! barriers until the watchdog.
//!
//! Each side writes the step it is at into the segment (`BenchFlags::steps`) before it checks in. The words
//! alternate by the parity of the meeting: after meeting `k` the other side may already write its step of
//! meeting `k + 1`, but it cannot write the slot of meeting `k` again before meeting `k + 2`, which needs
//! this side. Each side's `k`-th barrier crossing is the other's `k`-th, so both read the same slot.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Result, bail};

use super::handover::Handover;
use super::report::human;
use crate::os::stop::StopCheck;
use crate::segment::SharedState;
use crate::segment::barrier::Barrier;

/// A point where the two sides meet, for each pair of devices in this order: `PairAnnounced`,
/// `EndpointsPublished`, one `Handover` per kind measured, `HandoversDone`, then for each size
/// `BufferPublished` and `MappingClosed`, and last `FlagsClosed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The consumer has written the producer's device of the pair.
    PairAnnounced,
    /// Both events and the producer's flags are published.
    EndpointsPublished,
    /// Both are ready to measure this kind of hand-over.
    Handover(Handover),
    /// The hand-overs of the pair are done.
    HandoversDone,
    /// The producer's buffer of this many bytes is published.
    BufferPublished(usize),
    /// The consumer has closed its mapping of the buffer of this many bytes: the producer may free it.
    MappingClosed(usize),
    /// The consumer has closed the flags: the producer may free them.
    FlagsClosed,
}

impl Step {
    /// The step as the word in the segment: a kind in the top byte, its argument below (the hand-over's
    /// index, or the size's power of two). Never 0, which is no step yet.
    pub fn word(self) -> u32 {
        let power = |size: usize| size.trailing_zeros();
        match self {
            Step::PairAnnounced => 1 << 24,
            Step::EndpointsPublished => 2 << 24,
            Step::Handover(h) => 3 << 24 | Handover::ALL.iter().position(|&k| k == h).unwrap_or(0) as u32,
            Step::HandoversDone => 4 << 24,
            Step::BufferPublished(size) => 5 << 24 | power(size),
            Step::MappingClosed(size) => 6 << 24 | power(size),
            Step::FlagsClosed => 7 << 24,
        }
    }

    /// The step a word of the segment names, if it names one.
    pub fn from_word(word: u32) -> Option<Step> {
        let argument = word & 0xff_ffff;
        let size = || 1usize.checked_shl(argument);
        match word >> 24 {
            1 if argument == 0 => Some(Step::PairAnnounced),
            2 if argument == 0 => Some(Step::EndpointsPublished),
            3 => Handover::ALL.get(argument as usize).map(|&h| Step::Handover(h)),
            4 if argument == 0 => Some(Step::HandoversDone),
            5 => size().map(Step::BufferPublished),
            6 => size().map(Step::MappingClosed),
            7 if argument == 0 => Some(Step::FlagsClosed),
            _ => None,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::PairAnnounced => f.write_str("\"the pair is announced\""),
            Step::EndpointsPublished => f.write_str("\"both events and the flags are published\""),
            Step::Handover(h) => write!(f, "\"hand-over: {}\"", h.name()),
            Step::HandoversDone => f.write_str("\"the hand-overs are done\""),
            Step::BufferPublished(size) => write!(f, "\"the buffer of {} is published\"", human(*size)),
            Step::MappingClosed(size) => write!(f, "\"the mapping of {} is closed\"", human(*size)),
            Step::FlagsClosed => f.write_str("\"the flags are closed\""),
        }
    }
}

/// A side's step as the other side reads it: the word it wrote.
fn describe(word: u32) -> String {
    match (word, Step::from_word(word)) {
        (0, _) => "none yet".into(),
        (_, Some(step)) => step.to_string(),
        (_, None) => format!("unknown ({word:#010x})"),
    }
}

/// Which side of the benchmark this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The parent: it measures.
    Consumer = 0,
    /// The child: it exports and answers.
    Producer = 1,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::Consumer => Side::Producer,
            Side::Producer => Side::Consumer,
        }
    }
}

/// One side's rendezvous with the other, on the segment's barrier and step words.
pub struct Rendezvous<'s> {
    barrier: Barrier<'s>,
    steps: &'s [[AtomicU32; 2]; 2],
    side: Side,
    /// Meetings so far: its parity chooses the slot of the next.
    meetings: u32,
}

impl<'s> Rendezvous<'s> {
    /// `side`'s rendezvous on the segment `state`.
    pub fn on(state: &'s SharedState, side: Side) -> Self {
        Self { barrier: state.barrier(2), steps: &state.bench.steps, side, meetings: 0 }
    }

    /// Returns once the other side has met at `step` too; fails (on both sides) where it met at another
    /// step, naming both, or with the stop check's error while waiting.
    pub fn meet(&mut self, step: Step, stop: &dyn StopCheck) -> Result<()> {
        let slot = (self.meetings % 2) as usize;
        self.meetings = self.meetings.wrapping_add(1);
        self.steps[self.side as usize][slot].store(step.word(), Ordering::Release);
        self.barrier.wait(stop)?;
        let theirs = self.steps[self.side.other() as usize][slot].load(Ordering::Acquire);
        if theirs != step.word() {
            let (consumer, producer) = match self.side {
                Side::Consumer => (step.to_string(), describe(theirs)),
                Side::Producer => (describe(theirs), step.to_string()),
            };
            bail!(
                "the benchmark's two sides are out of step: the consumer is at step {consumer}, the producer at step {producer}"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_is_its_word_and_back() {
        let mut steps =
            vec![Step::PairAnnounced, Step::EndpointsPublished, Step::HandoversDone, Step::FlagsClosed];
        steps.extend(Handover::ALL.map(Step::Handover));
        for size in [4096, 1 << 30, 1 << 40] {
            steps.extend([Step::BufferPublished(size), Step::MappingClosed(size)]);
        }
        for step in &steps {
            assert_ne!(step.word(), 0);
            assert_eq!(Step::from_word(step.word()), Some(*step), "{step}");
        }
        let words: std::collections::HashSet<u32> = steps.iter().map(|s| s.word()).collect();
        assert_eq!(words.len(), steps.len(), "no two steps share a word");
        assert_eq!(Step::from_word(0), None);
        assert_eq!(Step::from_word(3 << 24 | 6), None);
        assert_eq!(describe(0), "none yet");
        assert_eq!(describe(9 << 24), "unknown (0x09000000)");
    }
}

#[cfg(test)]
mod out_of_step {
    /// Two sides of a benchmark out of step fail at their first meeting, both with an error that names both
    /// steps, instead of meeting at later steps or waiting for each other until a watchdog: here the producer
    /// skips a step, on a segment of this test's own with a thread per side.
    #[test]
    fn a_rendezvous_out_of_step_is_an_error_naming_both_steps_not_a_hang() {
        use super::*;
        use crate::bench::handover::Handover;
        use std::time::{Duration, Instant};

        let segment = crate::segment::Segment::create("simple-ipc-rendezvous-test").unwrap();
        let state = segment.state();
        let start = Instant::now();
        let limit = Duration::from_secs(20);
        let deadline = || -> anyhow::Result<()> {
            anyhow::ensure!(
                start.elapsed() < limit,
                "the test's deadline passed: a side waited for the other"
            );
            Ok(())
        };
        // Each side goes through its steps; the first error ends it.
        let walk = |side: Side, steps: &[Step]| -> anyhow::Result<()> {
            let mut rendezvous = Rendezvous::on(state, side);
            steps.iter().try_for_each(|&step| rendezvous.meet(step, &deadline))
        };
        let both = |consumer_steps: &[Step], producer_steps: &[Step]| {
            std::thread::scope(|s| {
                let consumer = s.spawn(|| walk(Side::Consumer, consumer_steps));
                let producer = walk(Side::Producer, producer_steps);
                (consumer.join().unwrap(), producer)
            })
        };

        // In step, over many meetings (the step words alternate by parity: none is read after it is rewritten).
        let many: Vec<Step> = (0..2000)
            .map(|i| match i % 3 {
                0 => Step::BufferPublished(4096 << (i % 5)),
                1 => Step::MappingClosed(4096 << (i % 5)),
                _ => Step::Handover(Handover::ALL[i % 6]),
            })
            .collect();
        let (consumer, producer) = both(&many, &many);
        assert!(consumer.is_ok() && producer.is_ok(), "{consumer:?} {producer:?}");

        // The producer skips a step.
        let consumer_steps = [
            Step::PairAnnounced,
            Step::EndpointsPublished,
            Step::Handover(Handover::EventsGpuWaits),
            Step::HandoversDone,
        ];
        let producer_steps =
            [Step::PairAnnounced, Step::Handover(Handover::EventsGpuWaits), Step::HandoversDone];
        let (consumer, producer) = both(&consumer_steps, &producer_steps);
        let expected = "the benchmark's two sides are out of step: the consumer is at step \"both events and the flags \
                        are published\", the producer at step \"hand-over: events, signal only, GPU waits\"";
        for (side, result) in [("consumer", consumer), ("producer", producer)] {
            let error = result.err().map(|e| format!("{e:#}"));
            assert_eq!(error.as_deref(), Some(expected), "the {side}'s error");
        }
        assert!(start.elapsed() < limit / 2, "found at once, not by a deadline: {:?}", start.elapsed());
    }
}
