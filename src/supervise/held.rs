//! How long this process was itself held while it waited for its peers: stopped (SIGSTOP, Ctrl-Z) and then
//! continued. Its deadline (`--timeout`) counts that time, as it must (a peer may have been running), but a
//! run that fails its deadline then says so, so that the user does not take the time it held the run for
//! the run's own. A wait loop looks often ([`Held::look`]); a gap between two looks during which a SIGCONT
//! came (`signals::continues`) is time held.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// A gap shorter than this is a wait loop's own pace, whatever came meanwhile.
const LEAST: Duration = Duration::from_millis(100);

/// The time held so far, from the looks of one wait.
pub(crate) struct Held {
    last: Cell<(Instant, u32)>,
    total: Cell<Duration>,
}

impl Held {
    pub(crate) fn new() -> Self {
        Self {
            last: Cell::new((Instant::now(), crate::os::signals::continues())),
            total: Cell::new(Duration::ZERO),
        }
    }

    /// A look of the wait loop: the gap since the last one counts where a SIGCONT came during it.
    pub(crate) fn look(&self) {
        let (now, continues) = (Instant::now(), crate::os::signals::continues());
        let (then, before) = self.last.replace((now, continues));
        let gap = now.saturating_duration_since(then);
        if continues != before && gap >= LEAST {
            self.total.set(self.total.get() + gap);
        }
    }

    /// What to add to a deadline's failure: ` This process was itself held stopped ... for 3.1 s of it ...`,
    /// or nothing.
    pub(crate) fn said(&self) -> String {
        let total = self.total.get();
        if total < LEAST {
            return String::new();
        }
        format!(
            " This process was itself held stopped (SIGSTOP or Ctrl-Z, then continued) for {:.1} s of it, which \
             --timeout counted.",
            total.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gap counts only where a SIGCONT came during it; a short one never.
    #[test]
    fn a_gap_counts_only_where_the_process_was_continued() {
        let held = Held::new();
        held.last.set((Instant::now() - Duration::from_secs(2), crate::os::signals::continues()));
        held.look();
        assert_eq!(held.said(), "", "no SIGCONT came: the process was busy, not held");
        held.last
            .set((Instant::now() - Duration::from_secs(2), crate::os::signals::continues().wrapping_sub(1)));
        held.look();
        assert!(
            held.said().contains("held stopped (SIGSTOP or Ctrl-Z, then continued) for 2.0 s"),
            "{}",
            held.said()
        );
        held.last.set((
            Instant::now() - Duration::from_millis(10),
            crate::os::signals::continues().wrapping_sub(1),
        ));
        held.look();
        assert!(held.said().contains("for 2.0 s"), "a short gap adds nothing: {}", held.said());
    }
}
