//! What the benchmark says: the figures of each test ([`Figures`], [`TestResult`]), their lines on the
//! terminal (each pair's header, with why its figures are what they are, the hand-over rows and the table
//! of rates), and whether MPS may serve the processes ([`mps_note`]); the `--json` document takes the
//! figures as they are (`report::document`).

use anyhow::Result;

use super::copy::{Rates, Reference};
use super::handover::{Handover, Trips};
use crate::driver::Driver;
use crate::ipc::Mechanism;
use crate::report::Status;
use crate::report::document::{BenchResults, BenchTest, CopyFigures, HandoverFigures, rounded};

/// One line of the results.
#[derive(Clone, Debug, PartialEq)]
pub enum Figures {
    Handover(Trips),
    Copy(Rates),
    Waived(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct TestResult {
    pub name: String,
    pub producer: i32,
    pub consumer: i32,
    pub figures: Figures,
}

/// Whether an MPS control daemon serves the processes (its pipe directory's `control` socket accepts), in
/// words.
/// As the driver says it (`driver_says`: `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`), not a socket alone.
pub fn mps_note(driver_says: bool) -> String {
    mps_note_for(&crate::placement::mps::Mps::here(), driver_says)
}

/// [`mps_note`] for `mps`.
fn mps_note_for(mps: &crate::placement::mps::Mps, driver_says: bool) -> String {
    let dir = &mps.pipe_directory;
    match (driver_says, mps.client) {
        (true, true) => format!("MPS: a control daemon listens at {dir}: the processes are its clients"),
        (true, false) => {
            format!("MPS: the driver says the processes are clients (no daemon answered at {dir})")
        }
        (false, true) => format!("MPS: a control socket at {dir} answers, but the driver says no MPS"),
        (false, false) => format!("MPS: no control daemon at {dir}"),
    }
}

/// The header of pair number `pair`: its GPUs, and why its figures are what they are.
pub fn print_pair_header(
    driver: &dyn Driver,
    producer: i32,
    consumer: i32,
    mps: &str,
    pair: usize,
) -> Result<()> {
    let name = |d: i32| driver.device_info(d).map(|i| i.name);
    let same = producer == consumer;
    print_line!(
        "== pair {pair}: producer on device {producer} ({}), consumer on device {consumer} ({}): {}",
        name(producer)?,
        name(consumer)?,
        if same { "one GPU" } else { "two GPUs" }
    )?;
    let why = match (same, mps.contains("clients")) {
        (true, false) => {
            "one GPU without MPS: a hand-over of GPU work between two processes waits for a time-slice \
             context switch (about 140 us each way); signals alone do not"
        }
        (true, true) => {
            "one GPU under MPS: both processes are clients of one daemon and share its context's time slice, \
             so no context switch is paid (about 140 us each way without MPS)"
        }
        (false, _) => {
            "two GPUs: each side's work runs on its own GPU; a hand-over costs the signal's trip between them"
        }
    };
    print_line!("   why the figures are what they are: {why}")?;
    print_line!("   hand-over round trips in us, p50 (p10-p90):")
}

/// The row of one kind of hand-over.
pub fn print_handover(handover: Handover, figures: &Figures) -> Result<()> {
    print_line!("  {:<52} {}", handover.name(), figure_text(figures))
}

/// The heading of the table of rates, compared with `reference`.
pub fn print_rates_heading(reference: Reference) -> Result<()> {
    print_line!("  {:>9}  {:>10}  {:>22}  {:>7}", "size", "IPC GB/s", reference.column(), "IPC %")
}

/// The row of one size; `*` marks a size that fits in the L2 cache.
pub fn print_rates(rates: &Rates) -> Result<()> {
    print_line!(
        "  {:>9}{} {:>10.1}  {:>22.1}  {:>6.1}%",
        human(rates.bytes),
        if rates.in_l2 { "*" } else { " " },
        rates.ipc,
        rates.reference,
        rates.ipc_percent()
    )
}

/// The note under the table: what the `*` means.
pub fn print_l2_note(consumer: i32, l2: u64) -> Result<()> {
    print_line!(
        "  * fits in device {consumer}'s L2 cache ({}): a rate of the cache, not of memory",
        human(l2 as usize)
    )
}

fn figure_text(figures: &Figures) -> String {
    match figures {
        Figures::Handover(Trips::Mean(mean)) => format!("{mean:.1} (mean)"),
        Figures::Handover(Trips::Spread(s)) => format!("{:.1} ({:.1}-{:.1})", s.p50, s.p10, s.p90),
        Figures::Waived(reason) => format!("waived: {reason}"),
        Figures::Copy(rates) => format!("{:.1} GB/s", rates.ipc),
    }
}

/// `size` as people write it: 4 KiB, 64 MiB, 1 GiB.
pub fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 30 => format!("{} GiB", s >> 30),
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s => format!("{} KiB", s >> 10),
    }
}

// The `--json` document's part of the benchmark, from its results.

impl BenchResults {
    pub fn of(mechanism: Mechanism, mps: &str, results: &[TestResult]) -> Self {
        Self {
            mechanism: mechanism.name().to_owned(),
            mps: mps.to_owned(),
            testcases: results.iter().map(BenchTest::of).collect(),
        }
    }
}
impl BenchTest {
    pub fn of(test: &TestResult) -> Self {
        let mut out = Self {
            name: test.name.clone(),
            producer: test.producer,
            consumer: test.consumer,
            status: Status::Passed,
            reason: None,
            handover: None,
            copy: None,
        };
        match &test.figures {
            Figures::Handover(trips) => out.handover = Some(HandoverFigures::of(trips)),
            Figures::Copy(rates) => out.copy = Some(CopyFigures::of(rates)),
            Figures::Waived(reason) => {
                out.status = Status::Waived;
                out.reason = Some(reason.clone());
            }
        }
        out
    }
}
impl HandoverFigures {
    fn of(trips: &Trips) -> Self {
        let none = Self { unit: "us".into(), p50: None, p10: None, p90: None, mean: None };
        match trips {
            Trips::Spread(s) => {
                Self { p50: rounded(s.p50), p10: rounded(s.p10), p90: rounded(s.p90), ..none }
            }
            Trips::Mean(mean) => Self { mean: rounded(*mean), ..none },
        }
    }
}
impl CopyFigures {
    fn of(rates: &Rates) -> Self {
        Self {
            unit: "GB/s".into(),
            bytes: rates.bytes as u64,
            ipc: rounded(rates.ipc),
            reference: rounded(rates.reference),
            reference_name: rates.compared_with.name().to_owned(),
            ipc_percent: rounded(rates.ipc_percent()),
            fits_in_l2: rates.in_l2,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn figures_that_are_not_finite_are_null_and_the_rest_three_decimals() {
        assert_eq!(rounded(f64::NAN), None);
        assert_eq!(rounded(f64::INFINITY), None);
        assert_eq!(rounded(1.23456), Some(1.235));
        let mean = HandoverFigures::of(&Trips::Mean(4.25));
        assert_eq!((mean.mean, mean.p50), (Some(4.25), None));
        let json = serde_json::to_string(&mean).unwrap();
        assert_eq!(json, r#"{"unit":"us","mean":4.25}"#);
    }

    use super::*;
    use crate::bench::handover::Spread;

    #[test]
    fn sizes_read_as_people_write_them_and_mps_is_said_as_found() {
        assert_eq!(human(4096), "4 KiB");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(human(1 << 30), "1 GiB");
        let shown = "/run/mps".to_owned();
        let mut mps = crate::placement::mps::Mps {
            pipe_directory: shown.clone(),
            from_env: true,
            client: false,
            answered: None,
        };
        assert_eq!(mps_note_for(&mps, false), format!("MPS: no control daemon at {shown}"));
        mps.client = true;
        assert_eq!(
            mps_note_for(&mps, true),
            format!("MPS: a control daemon listens at {shown}: the processes are its clients")
        );
        // A socket the driver does not confirm (another user's impostor in /tmp/nvidia-mps) makes no MPS.
        assert_eq!(
            mps_note_for(&mps, false),
            format!("MPS: a control socket at {shown} answers, but the driver says no MPS")
        );
    }

    #[test]
    fn a_spread_reads_p50_p10_p90_and_a_mean_says_so() {
        let spread = Spread { p50: 6.0, p10: 2.0, p90: 10.0 };
        assert_eq!(figure_text(&Figures::Handover(Trips::Spread(spread))), "6.0 (2.0-10.0)");
        assert_eq!(figure_text(&Figures::Handover(Trips::Mean(4.25))), "4.2 (mean)");
    }
}
