//! Where the time goes, and where each process is: a [`Stopwatch`] marks each phase a process enters. That
//! one call records the time of the phase it ends, tells the segment which phase the process is in (for the
//! watchdog's report), and is where a test fault may strike. Children leave their timings in the segment;
//! the parent prints them all (`--timings`) or hands them to the `--json` document (`report`). The
//! watchdog's limit, [`Timeout`] (`--timeout`), is here too: one type from the parser to every deadline.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::phases::fault;
use crate::phases::{Phase, Who};
use crate::segment::{SharedState, TIMING_SLOTS};

/// The slot of the whole run's wall time, after the phases'.
const TOTAL: usize = Phase::ALL.len();
const _: () = assert!(TOTAL < TIMING_SLOTS);

/// What a process's progress word in the segment holds: 0 before it attached, 1 + the phase's index while
/// it runs, [`FINISHED`] once it is done.
pub const FINISHED: u32 = u32::MAX;

/// Where a process stands, as its progress word says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// It has not attached to the segment yet.
    Starting,
    In(Phase),
    Finished,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Progress::Starting => f.write_str("starting (not attached yet)"),
            Progress::In(phase) => write!(f, "in {}", phase.name()),
            Progress::Finished => f.write_str("finished"),
        }
    }
}

/// What a progress word says.
pub fn progress_of(word: u32) -> Progress {
    match word {
        FINISHED => Progress::Finished,
        n => n
            .checked_sub(1)
            .and_then(|i| Phase::from_index(i as usize))
            .map_or(Progress::Starting, Progress::In),
    }
}

/// `--timeout`: the watchdog's limit in whole seconds; 0: never. Parsed once (`cli`), carried as is to each
/// process and loop that keeps a deadline by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeout(u64);

impl Timeout {
    /// The longest limit: about a century, past which a deadline is as good as none. A longer one (a user's
    /// `u64::MAX` for "never") is this, since the clock cannot be given more: `Instant + Duration` panics.
    const LONGEST_S: u64 = 100 * 365 * 24 * 3600;

    pub(crate) const fn from_secs(seconds: u64) -> Self {
        Timeout(seconds)
    }

    /// The seconds as given (`--timeout`, the document's `timeout_s`).
    pub(crate) fn seconds(self) -> u64 {
        self.0
    }

    /// The limit, `None` for `--timeout 0`; at most [`LONGEST_S`](Self::LONGEST_S) seconds.
    pub(crate) fn limit(self) -> Option<Duration> {
        (self.0 > 0).then(|| Duration::from_secs(self.0.min(Self::LONGEST_S)))
    }

    /// The deadline of what began at `start`: the moment, and the limit (which a message past it names);
    /// `None` for none, or where the clock cannot count that far.
    pub(crate) fn deadline_from(self, start: Instant) -> Option<(Instant, Duration)> {
        let limit = self.limit()?;
        Some((start.checked_add(limit)?, limit))
    }
}

impl Default for Timeout {
    /// A generous default.
    fn default() -> Self {
        Timeout(60)
    }
}

/// The seconds, as `--timeout` takes them (`--help`'s default, `Role::to_args`).
impl std::fmt::Display for Timeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Phase durations of one process.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Phases {
    spent: [Option<Duration>; TOTAL + 1],
}

impl Phases {
    #[cfg(test)]
    pub fn get(&self, phase: Phase) -> Option<Duration> {
        self.spent[phase.index()]
    }

    #[cfg(test)]
    pub fn total(&self) -> Option<Duration> {
        self.spent[TOTAL]
    }

    fn add(&mut self, phase: Phase, d: Duration) {
        let slot = &mut self.spent[phase.index()];
        *slot = Some(slot.unwrap_or_default() + d);
    }

    /// Stores them in the segment's slot of process `index` (microseconds + 1; 0 means "not measured"). A
    /// process publishes them once it has finished its part (see [`finished`]).
    pub fn publish(&self, state: &SharedState, index: usize) {
        for (slot, spent) in state.timings[index].iter().zip(self.spent.iter()) {
            slot.store(spent.map_or(0, |d| d.as_micros() as u64 + 1), Ordering::Relaxed);
        }
    }

    /// Every phase measured, in the order a run goes through them, then `total`: its name and milliseconds
    /// (to the microsecond, as the segment holds them).
    pub fn in_ms(&self) -> Vec<(&'static str, f64)> {
        let rows = Phase::ALL.into_iter().map(|p| (p.name(), p.index())).chain([("total", TOTAL)]);
        rows.filter_map(|(name, slot)| self.spent[slot].map(|d| (name, d.as_micros() as f64 / 1e3))).collect()
    }

    /// Reads what process `index` published.
    pub fn read(state: &SharedState, index: usize) -> Self {
        let mut phases = Self::default();
        for (slot, spent) in state.timings[index].iter().zip(phases.spent.iter_mut()) {
            let micros = slot.load(Ordering::Relaxed);
            *spent = micros.checked_sub(1).map(Duration::from_micros);
        }
        phases
    }
}

/// Whether process `index` has finished its part: it published its phases, the total among them.
pub fn finished(state: &SharedState, index: usize) -> bool {
    state.timings[index][TOTAL].load(Ordering::Relaxed) != 0
}

/// Marks the phases of one process.
pub struct Stopwatch<'s> {
    who: Who,
    start: Instant,
    last: Instant,
    current: Phase,
    phases: Phases,
    progress: Option<&'s AtomicU32>,
}

impl Stopwatch<'static> {
    /// Starts the clock in the process's first phase (where a fault may strike at once).
    pub fn start(who: Who, first: Phase) -> Result<Self> {
        let now = Instant::now();
        let watch =
            Self { who, start: now, last: now, current: first, phases: Phases::default(), progress: None };
        fault::at(who, first)?;
        Ok(watch)
    }
}

impl<'s> Stopwatch<'s> {
    /// From now on, tells `progress` (this process's word in the segment) which phase the process is in.
    pub fn report_to<'t>(self, progress: &'t AtomicU32) -> Stopwatch<'t> {
        progress.store(self.current.index() as u32 + 1, Ordering::Release);
        Stopwatch { progress: Some(progress), ..self }
    }

    /// Ends the current phase and enters `phase`; a test fault for `phase` strikes here.
    pub fn enter(&mut self, phase: Phase) -> Result<()> {
        self.enter_with_part(phase, None)
    }

    /// [`Stopwatch::enter`], where `part.1` of the phase that ends is counted as `part.0` instead.
    pub fn enter_with_part(&mut self, phase: Phase, part: Option<(Phase, Duration)>) -> Result<()> {
        let now = Instant::now();
        let whole = now - self.last;
        let (part_phase, part) = part.unwrap_or((self.current, Duration::ZERO));
        self.phases.add(part_phase, part.min(whole));
        self.phases.add(self.current, whole.saturating_sub(part));
        self.last = now;
        self.current = phase;
        if let Some(progress) = self.progress {
            progress.store(phase.index() as u32 + 1, Ordering::Release);
        }
        fault::at(self.who, phase)
    }

    /// Ends the current phase; returns every phase so far with the total wall time since start, and marks the
    /// process finished.
    pub fn finish(&mut self) -> Phases {
        let now = Instant::now();
        self.phases.add(self.current, now - self.last);
        self.last = now;
        if let Some(progress) = self.progress {
            progress.store(FINISHED, Ordering::Release);
        }
        let mut phases = self.phases.clone();
        phases.spent[TOTAL] = Some(self.start.elapsed());
        phases
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.2}", d.as_secs_f64() * 1e3))
}

/// A table: one row per phase, one column per process (the parent first), in milliseconds.
pub fn table(parent: &Phases, children: &[Phases]) -> String {
    let mut out = String::from("Timings (ms)\n");
    let _ = write!(out, "{:<18}{:>10}", "phase", "parent");
    for i in 0..children.len() {
        let _ = write!(out, "{:>10}", format!("child {i}"));
    }
    out.push('\n');
    let rows = Phase::ALL.into_iter().map(|p| (p.name(), p.index())).chain([("total", TOTAL)]);
    for (name, slot) in rows {
        let _ = write!(out, "{:<18}{:>10}", name, ms(parent.spent[slot]));
        for child in children {
            let _ = write!(out, "{:>10}", ms(child.spent[slot]));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_of_0_is_none() {
        assert_eq!(Timeout::from_secs(0).limit(), None);
        assert_eq!(Timeout::from_secs(0).deadline_from(Instant::now()), None);
        assert_eq!(Timeout::from_secs(1).limit(), Some(Duration::from_secs(1)));
        assert_eq!(Timeout::default().limit(), Some(Duration::from_secs(60)));
        assert_eq!((Timeout::default().seconds(), Timeout::default().to_string()), (60, "60".to_owned()));
    }

    /// A deadline is the limit past its start, and a limit too long for the clock (a user's `u64::MAX` for
    /// "never") is a deadline a century away, not a panic.
    #[test]
    fn a_deadline_is_the_limit_past_its_start() {
        let start = Instant::now();
        let five = Duration::from_secs(5);
        assert_eq!(Timeout::from_secs(5).deadline_from(start), Some((start + five, five)));
        let never = Timeout::from_secs(u64::MAX);
        assert_eq!(never.seconds(), u64::MAX, "the document says what was given");
        let century = Duration::from_secs(Timeout::LONGEST_S);
        assert_eq!(never.limit(), Some(century));
        assert!(
            never.deadline_from(start).is_none_or(|(at, limit)| at == start + century && limit == century)
        );
    }

    /// What a process publishes in the segment is what the parent reads back, to the microsecond; a phase
    /// of no time is a phase, not "not measured".
    #[test]
    fn published_phases_read_back_exactly() {
        let segment = crate::segment::Segment::create("simple-ipc-timings-test").unwrap();
        let mut phases = Phases::default();
        phases.add(Phase::Attach, Duration::from_micros(0));
        phases.add(Phase::RoundRobin, Duration::from_micros(1234));
        phases.publish(segment.state(), 3);
        let read = Phases::read(segment.state(), 3);
        assert_eq!(read, phases);
        assert_eq!(read.get(Phase::Attach), Some(Duration::ZERO));
        assert_eq!(read.get(Phase::RoundRobin), Some(Duration::from_micros(1234)));
        assert_eq!(read.get(Phase::Verify), None);
    }

    #[test]
    fn laps_add_up_and_round_trip_through_the_segment() {
        let mut phases = Phases::default();
        phases.add(Phase::RoundRobin, Duration::from_micros(1500));
        phases.add(Phase::RoundRobin, Duration::from_micros(500));
        phases.spent[TOTAL] = Some(Duration::from_millis(7));
        assert_eq!(phases.get(Phase::RoundRobin), Some(Duration::from_millis(2)));
        assert_eq!(phases.get(Phase::CopyBack), None);
        phases.add(Phase::CudaStart, Duration::from_nanos(1_234_567));
        let in_ms = phases.in_ms();
        assert_eq!(
            in_ms,
            [("cuda_start", 1.234), ("round_robin", 2.0), ("total", 7.0)],
            "in the phases' order, to the microsecond; unmeasured phases are left out"
        );
        let text = table(&phases, &[]);
        assert!(text.contains("round_robin") && text.contains("2.00"), "{text}");
    }

    #[test]
    fn the_stopwatch_reports_each_phase_entered_and_the_end() {
        let progress = AtomicU32::new(0);
        let mut watch = Stopwatch::start(Who::Child(0), Phase::CudaStart).unwrap().report_to(&progress);
        assert_eq!(progress_of(progress.load(Ordering::Relaxed)), Progress::In(Phase::CudaStart));
        std::thread::sleep(Duration::from_millis(2));
        watch.enter(Phase::RoundRobin).unwrap();
        assert_eq!(progress_of(progress.load(Ordering::Relaxed)), Progress::In(Phase::RoundRobin));
        watch.enter_with_part(Phase::CleanUp, Some((Phase::Context, Duration::from_secs(9)))).unwrap();
        let phases = watch.finish();
        assert_eq!(progress_of(progress.load(Ordering::Relaxed)), Progress::Finished);
        assert!(phases.get(Phase::CudaStart).unwrap() >= Duration::from_millis(2));
        assert!(phases.get(Phase::Context).is_some(), "the part is counted as its own phase");
        assert_eq!(phases.get(Phase::RoundRobin), Some(Duration::ZERO), "all of it went to the part");
        assert!(phases.total().unwrap() >= phases.get(Phase::CudaStart).unwrap());
        assert_eq!(progress_of(0), Progress::Starting);
        assert_eq!(Progress::In(Phase::Verify).to_string(), "in verify");
    }
}
