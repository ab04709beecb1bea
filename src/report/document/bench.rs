//! The benchmark's part of the `--json` document: its figures as data (the benchmark converts its results
//! into them: `bench::report`).

use serde::{Deserialize, Serialize};

use super::Status;

/// The benchmark's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    pub mechanism: String,
    /// Whether an MPS control daemon may serve the processes, in words.
    pub mps: String,
    /// Per (producer, consumer) pair, each hand-over and each size of copy, in the order measured.
    pub testcases: Vec<BenchTest>,
}

/// One test of one pair.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchTest {
    /// The hand-over's name (`events, signal only, GPU waits`), or `copy`.
    pub name: String,
    pub producer: i32,
    pub consumer: i32,
    /// `passed` or `waived`.
    pub status: Status,
    /// Why it was waived.
    pub reason: Option<String>,
    /// A hand-over's round trips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<HandoverFigures>,
    /// A copy's rates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy: Option<CopyFigures>,
}

/// Round trips in microseconds: median and 10th to 90th percentiles, or only the mean (where every round
/// was queued ahead at once).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HandoverFigures {
    /// `us`.
    pub unit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p10: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
}

/// The copy rate through the IPC mapping beside the limit of that path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopyFigures {
    /// `GB/s`.
    pub unit: String,
    pub bytes: u64,
    pub ipc: Option<f64>,
    pub reference: Option<f64>,
    /// `local copy` (one GPU) or `in-process peer copy` (two).
    pub reference_name: String,
    pub ipc_percent: Option<f64>,
    /// The size fits in the consumer's L2 cache: the rates are the cache's, not memory's.
    pub fits_in_l2: bool,
}
