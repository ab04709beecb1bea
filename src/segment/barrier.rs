//! The sense-reversal barrier of the original (`barrierWait`), on the two counters in the segment, and the
//! waiting that it and the start-up share.
//!
//! Unlike the original, a wait can end early: every few milliseconds it asks a [`StopCheck`] (the run was
//! aborted, the parent died, a signal came), and it does not spin a core: it spins briefly, then yields, then
//! sleeps on a futex in the shared word until the process that changes the word wakes it.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::os::futex;
pub use crate::os::stop::StopCheck;

/// How long one futex sleep lasts before the waiter looks at its [`StopCheck`] again.
const SLEEP_SLICE: Duration = Duration::from_millis(10);
/// Busy polls before the first yield, and yields before the first sleep.
const SPINS: u32 = 64;
/// How long a waiter yields before it sleeps: a futex wake costs tens of microseconds or more (more in a VM),
/// so short waits stay awake, while a waiter that yields still lets the others run on a busy machine
/// (`cargo bench --bench barrier`: with 20 us, 2 processes cross in about 1 us, 32 on 2 cores in about 200 us).
const YIELD_FOR: Duration = Duration::from_micros(20);

/// A barrier for `participants` processes on the segment's `barrier` and `sense` fields.
pub struct Barrier<'s> {
    count: &'s AtomicI32,
    sense: &'s AtomicU32,
    participants: i32,
}

impl<'s> Barrier<'s> {
    /// The barrier on the shared words `count` (check-ins) and `sense`.
    pub fn new(count: &'s AtomicI32, sense: &'s AtomicU32, participants: usize) -> Self {
        Self { count, sense, participants: participants as i32 }
    }

    /// Returns once all participants have called it, or with the stop check's error.
    pub fn wait(&self, stop: &dyn StopCheck) -> Result<()> {
        // Check in: the last to arrive turns the sense to 1 and wakes everyone.
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.participants {
            self.sense.store(1, Ordering::Release);
            futex::wake_all(self.sense);
        }
        wait_until(self.sense, |v| v == 1, stop)?;
        // Check out: the last to leave turns it back to 0, so the next round starts clean.
        if self.count.fetch_sub(1, Ordering::AcqRel) - 1 == 0 {
            self.sense.store(0, Ordering::Release);
            futex::wake_all(self.sense);
        }
        wait_until(self.sense, |v| v == 0, stop)
    }
}

/// Waits until the shared word satisfies `done`, asking `stop` while it waits.
pub fn wait_until(word: &AtomicU32, done: impl Fn(u32) -> bool, stop: &dyn StopCheck) -> Result<()> {
    let mut round = 0u32;
    let mut yielding_since = None;
    loop {
        let value = word.load(Ordering::Acquire);
        if done(value) {
            return Ok(());
        }
        if round < SPINS {
            std::hint::spin_loop();
            round += 1;
        } else if yielding_since.get_or_insert_with(Instant::now).elapsed() < YIELD_FOR {
            std::thread::yield_now();
        } else {
            stop.check()?;
            futex::wait(word, value, SLEEP_SLICE);
        }
    }
}
