//! Waiting that can always be interrupted: a [`StopCheck`] asked while waiting (the run was aborted, the
//! parent died, a signal came, the watchdog fired), and [`poll`], which waits for a condition the driver
//! answers (a stream or event query) without blocking where an abort cannot reach. A leaf.

use std::time::{Duration, Instant};

use anyhow::Result;

/// Asked while waiting: `Err` ends the wait with that error.
pub trait StopCheck {
    fn check(&self) -> Result<()>;
}

impl<F: Fn() -> Result<()>> StopCheck for F {
    fn check(&self) -> Result<()> {
        self()
    }
}

/// How long [`poll`] spins, without even a system call, before it yields between looks: a hand-over of
/// signals alone takes about 10 us.
const SPIN_FOR: Duration = Duration::from_micros(30);
/// How long [`poll`] stays awake (yielding) before it sleeps between looks: GPU work handed over between
/// processes takes tens of microseconds, so short waits are answered at once.
const AWAKE_FOR: Duration = Duration::from_micros(200);
/// The longest sleep between two looks once the wait is long.
const MAX_SLEEP: Duration = Duration::from_micros(500);

/// Waits until `ready()` answers true, asking `stop` between looks; an error of either ends the wait.
/// With `limit`, gives up after that long and returns `Ok(false)`.
pub fn poll(
    mut ready: impl FnMut() -> Result<bool>,
    stop: &dyn StopCheck,
    limit: Option<Duration>,
) -> Result<bool> {
    let start = Instant::now();
    let mut sleep = Duration::from_micros(10);
    loop {
        if ready()? {
            return Ok(true);
        }
        let waited = start.elapsed();
        if limit.is_some_and(|limit| waited >= limit) {
            return Ok(false);
        }
        if waited < SPIN_FOR {
            // Short waits stay cheap: no stop check (it may cost a system call) until the wait is long.
            std::hint::spin_loop();
        } else if waited < AWAKE_FOR {
            std::thread::yield_now();
        } else {
            stop.check()?;
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(MAX_SLEEP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short wait is answered without a stop check (which may cost a system call); a long one asks
    /// `stop` between looks, and sleeps longer and longer between them, up to MAX_SLEEP.
    #[test]
    fn poll_asks_stop_only_once_awake_a_while_and_then_sleeps_longer_between_looks() {
        let start = Instant::now();
        let first_check = Cell::new(None);
        let stop = || {
            first_check.set(Some(start.elapsed()));
            anyhow::bail!("stop")
        };
        assert!(poll(|| Ok(false), &stop, None).is_err());
        let first = first_check.get().unwrap();
        assert!(first >= AWAKE_FOR, "stop was asked after {first:?}, before the wait was {AWAKE_FOR:?} long");

        let checks = Cell::new(0u32);
        let count = || {
            checks.set(checks.get() + 1);
            Ok(())
        };
        assert!(!poll(|| Ok(false), &count, Some(Duration::from_millis(50))).unwrap());
        // From 10 us doubling to 500 us: about a hundred looks in 50 ms, not thousands.
        assert!(checks.get() < 500, "{} stop checks in 50 ms: the sleeps do not grow", checks.get());
    }
    use std::cell::Cell;

    fn never() -> Result<()> {
        Ok(())
    }

    #[test]
    fn poll_returns_when_ready_stops_on_request_and_honours_its_limit() {
        let looks = Cell::new(0);
        let ready = || {
            looks.set(looks.get() + 1);
            Ok(looks.get() == 3)
        };
        assert!(poll(ready, &never, None).unwrap());
        assert_eq!(looks.get(), 3);

        let stopped = poll(|| Ok(false), &|| anyhow::bail!("aborted"), None);
        assert_eq!(stopped.unwrap_err().to_string(), "aborted");

        let start = Instant::now();
        assert!(!poll(|| Ok(false), &never, Some(Duration::from_millis(20))).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(20));

        let failed = poll(|| anyhow::bail!("query failed"), &never, None);
        assert_eq!(failed.unwrap_err().to_string(), "query failed");
    }
}
