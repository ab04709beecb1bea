//! Where the time goes: each process measures its phases with a [`Stopwatch`]; children leave theirs in the
//! segment, and the parent prints them all (`--timings`) or writes them as JSON (`--json FILE`).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::segment::{SharedState, TIMING_SLOTS};

/// The phases, in the order a run goes through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    CudaStart,
    Context,
    DeviceSelection,
    StartChildren,
    AllocateExport,
    /// A child's kernel loading and host buffer for the copy back.
    Prepare,
    WaitReady,
    OpenHandles,
    RoundRobin,
    CopyBack,
    Compare,
    WaitChildren,
    CleanUp,
    Total,
}

impl Step {
    pub const ALL: [Step; 14] = [
        Step::CudaStart,
        Step::Context,
        Step::DeviceSelection,
        Step::StartChildren,
        Step::AllocateExport,
        Step::Prepare,
        Step::WaitReady,
        Step::OpenHandles,
        Step::RoundRobin,
        Step::CopyBack,
        Step::Compare,
        Step::WaitChildren,
        Step::CleanUp,
        Step::Total,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Step::CudaStart => "cuda_start",
            Step::Context => "context",
            Step::DeviceSelection => "device_selection",
            Step::StartChildren => "start_children",
            Step::AllocateExport => "allocate_export",
            Step::Prepare => "prepare",
            Step::WaitReady => "wait_ready",
            Step::OpenHandles => "open_handles",
            Step::RoundRobin => "round_robin",
            Step::CopyBack => "copy_back",
            Step::Compare => "compare",
            Step::WaitChildren => "wait_children",
            Step::CleanUp => "clean_up",
            Step::Total => "total",
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

const _: () = assert!(Step::ALL.len() <= TIMING_SLOTS);

/// Phase durations of one process.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Phases {
    spent: [Option<Duration>; Step::ALL.len()],
}

impl Phases {
    pub fn get(&self, step: Step) -> Option<Duration> {
        self.spent[step.slot()]
    }

    fn add(&mut self, step: Step, d: Duration) {
        let slot = &mut self.spent[step.slot()];
        *slot = Some(slot.unwrap_or_default() + d);
    }

    /// Stores them in the segment's slot of process `index` (microseconds + 1; 0 means "not measured").
    pub fn publish(&self, state: &SharedState, index: usize) {
        for (slot, spent) in state.timings[index].iter().zip(self.spent.iter()) {
            slot.store(spent.map_or(0, |d| d.as_micros() as u64 + 1), Ordering::Relaxed);
        }
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

/// Measures consecutive phases of one process.
pub struct Stopwatch {
    start: Instant,
    last: Instant,
    phases: Phases,
}

impl Stopwatch {
    pub fn start() -> Self {
        let now = Instant::now();
        Self { start: now, last: now, phases: Phases::default() }
    }

    /// Ends the current phase as `step`.
    pub fn lap(&mut self, step: Step) {
        let now = Instant::now();
        self.phases.add(step, now - self.last);
        self.last = now;
    }

    /// Ends the current phase as `step`, of which `part.1` is counted as `part.0` instead.
    pub fn lap_with_part(&mut self, step: Step, part: (Step, Duration)) {
        let now = Instant::now();
        let whole = now - self.last;
        self.phases.add(part.0, part.1.min(whole));
        self.phases.add(step, whole.saturating_sub(part.1));
        self.last = now;
    }

    /// The phases so far, with the total wall time since start.
    pub fn finish(&self) -> Phases {
        let mut phases = self.phases.clone();
        phases.spent[Step::Total.slot()] = Some(self.start.elapsed());
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
    for step in Step::ALL {
        let _ = write!(out, "{:<18}{:>10}", step.name(), ms(parent.get(step)));
        for child in children {
            let _ = write!(out, "{:>10}", ms(child.get(step)));
        }
        out.push('\n');
    }
    out
}

fn json_object(phases: &Phases) -> String {
    let fields: Vec<String> = Step::ALL
        .iter()
        .filter_map(|&s| phases.get(s).map(|d| format!("\"{}\": {:.3}", s.name(), d.as_secs_f64() * 1e3)))
        .collect();
    format!("{{{}}}", fields.join(", "))
}

/// The same as [`table`], as one JSON document: `{"unit": "ms", "parent": {...}, "children": [{...}]}`.
pub fn json(parent: &Phases, children: &[Phases], extra: &[(&str, String)]) -> String {
    let children: Vec<String> = children.iter().map(json_object).collect();
    let mut out = format!(
        "{{\"unit\": \"ms\", \"parent\": {}, \"children\": [{}]",
        json_object(parent),
        children.join(", ")
    );
    for (key, value) in extra {
        let _ = write!(out, ", \"{key}\": {value}");
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_and_round_trip_through_the_segment() {
        let mut phases = Phases::default();
        phases.add(Step::RoundRobin, Duration::from_micros(1500));
        phases.add(Step::RoundRobin, Duration::from_micros(500));
        phases.add(Step::Total, Duration::from_millis(7));
        assert_eq!(phases.get(Step::RoundRobin), Some(Duration::from_millis(2)));
        assert_eq!(phases.get(Step::CopyBack), None);
        let json = json(&phases, std::slice::from_ref(&phases), &[("procs_per_device", "1".into())]);
        assert!(json.contains("\"round_robin\": 2.000"), "{json}");
        assert!(json.contains("\"procs_per_device\": 1"), "{json}");
        assert!(!json.contains("copy_back"), "unmeasured phases are left out: {json}");
        let text = table(&phases, &[]);
        assert!(text.contains("round_robin") && text.contains("2.00"), "{text}");
    }
}
