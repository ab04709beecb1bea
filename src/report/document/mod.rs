//! The `--json` document as data: one set of serde structs for every mode and every outcome (the schema is
//! docs/json.md), and the conversions from what each role measured. Numbers are numbers; a figure that is
//! not finite is `null`. A run of one mechanism under `--ipc all` writes the same document, which the top
//! parent reads back with serde_json and keeps whole in its row. The benchmark's part is [`bench`]; a mode
//! converts what it measured into its part (the benchmark in `bench::report`).

mod bench;
mod run;
pub use bench::{BenchResults, BenchTest, CopyFigures, HandoverFigures};
pub use run::RunResults;
#[cfg(test)]
pub use run::{ChildResult, ParentResult, PhaseTimes};

use serde::{Deserialize, Serialize};

use crate::driver::{DeviceInfo, uuid_text};

/// The whole document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// `simple-ipc`.
    pub program: String,
    /// This program's version (Cargo's).
    pub version: String,
    pub status: Status,
    /// Why the run failed, was waived or interrupted; `null` for a pass.
    pub reason: Option<String>,
    /// Where the failure was diagnosed (see `ipc::diagnose`): what the evidence says happened.
    pub cause: Option<String>,
    /// ... and the least change that fixes it.
    pub fix: Option<String>,
    /// Where the run failed because the driver refused to open a handle that another process made (in
    /// this process, or in one that joined it): the typed facts of that refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refused>,
    /// The Xid errors the kernel logged for the run's GPUs while it ran, where the run failed or was the
    /// benchmark (see `node`): absent where there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xid: Vec<crate::node::Xid>,
    /// Why the kernel's log could not be read, where it was to be read for Xid errors and could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_log: Option<String>,
    /// The test's file read instead of the kernel's log (`SIMPLE_IPC_TEST_KERNEL_LOG`), where one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_kernel_log: Option<String>,
    /// What a run that passed did, as its verdict line says it (`2 processes on 2 GPUs, ...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The process's exit status; `null` in the document of a run still [`Status::Running`].
    pub exit_status: Option<u8>,
    pub mode: Mode,
    /// `null` where the driver could not be loaded (or, for `--ipc all`, no run loaded it).
    pub driver: Option<DriverFacts>,
    /// Every device the driver reports, those the run chose marked; empty where the driver is not known.
    pub devices: Vec<Device>,
    pub options: Options,
    /// `mode` "run", once every process finished: the phase timings per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunResults>,
    /// `mode` "ipc_all": one entry per mechanism.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanisms: Option<Vec<MechanismResult>>,
    /// `mode` "bench", once every pair was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<BenchResults>,
    /// `mode` "container_matrix": one entry per boundary and kind of handle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix: Option<Vec<MatrixCell>>,
    /// A served or isolated run, once every process joined: where each stands, what it shares with the
    /// server, and the forecast for each pair (docs/placement.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::placement::Placement>,
}

/// One cell of the container matrix (`--ipc all --isolate KINDS`): an isolated run that tries one kind of
/// handle across one boundary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatrixCell {
    /// The row: `own /dev/shm`, say.
    pub boundary: String,
    /// The run's `--isolate`: `shm`.
    pub isolate: String,
    /// The column: `legacy event`, say.
    pub handle: String,
    /// The run's `--ipc` and `--sync`.
    pub ipc: String,
    pub sync: String,
    /// `ok`, `waived`, `not_simulated` (beyond what the simulation models) or `failed`.
    pub result: String,
    /// Where it failed: the driver's error (`CUDA_ERROR_MAP_FAILED`), or how the run ended.
    pub error: Option<String>,
    /// Where it failed: whether the interprocess event's handle was the one refused.
    pub event_refused: Option<bool>,
    /// Where it failed: the least sharing that fixes it, as the run diagnosed it.
    pub fix: Option<String>,
}

pub use crate::ipc::refused::Refused;

pub use crate::outcome::Status;

/// What the run was asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The sample's run (also with `--serve`).
    Run,
    /// `--ipc all`: one run per mechanism.
    IpcAll,
    /// `--bench`.
    Bench,
    /// `--ipc all --isolate KINDS`: the container matrix.
    ContainerMatrix,
}

/// The CUDA driver the run loaded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DriverFacts {
    /// The kernel module's version (`/proc/driver/nvidia/version`: "580.65.06"), where known.
    pub version: Option<String>,
    /// `cuDriverGetVersion`: 12080 for CUDA 12.8; `null` in a simulation.
    pub cuda_version: Option<i32>,
    /// GPUs simulated in host memory (`SIMPLE_IPC_SIMULATE_GPUS`).
    pub simulated: bool,
}

/// One device the driver reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub index: i32,
    pub name: String,
    /// As `nvidia-smi -L` writes it: `GPU-6511edb2-...`.
    pub uuid: String,
    /// `0000:17:00.0`, where the device has one.
    pub pci_bus_id: Option<String>,
    pub l2_cache_bytes: u64,
    /// The run chose it (the original's filters: unified addressing, default compute mode, peer access).
    pub chosen: bool,
}

impl Device {
    pub fn of(index: i32, info: &DeviceInfo, chosen: bool) -> Self {
        Self {
            index,
            name: info.name.clone(),
            uuid: uuid_text(&info.uuid),
            pci_bus_id: info.pci_bus_id.clone(),
            l2_cache_bytes: info.l2_cache_bytes,
            chosen,
        }
    }
}

/// The options the run was given (or their defaults).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Options {
    /// `legacy`, `vmm`, `pool`, `fabric` or `all`.
    pub ipc: String,
    /// `events` or `memops`.
    pub sync: String,
    pub procs_per_device: u32,
    pub sequential: bool,
    pub timings: bool,
    /// `--timeout`; 0: none.
    pub timeout_s: u64,
    pub bind_numa: bool,
    pub quiet: bool,
    /// `--bench-max-bytes`, with `--bench` only.
    pub bench_max_bytes: Option<u64>,
    /// `--serve SOCKET`.
    pub serve: Option<String>,
    /// `--isolate KINDS`.
    #[serde(default)]
    pub isolate: Option<String>,
}

/// One mechanism's run under `--ipc all`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MechanismResult {
    pub mechanism: String,
    pub status: Status,
    pub reason: Option<String>,
    /// The run's wall time; `null` where it was not run (pool under `--sync memops`).
    pub wall_ms: Option<f64>,
    /// The median over the children of their time to open every handle, divided by the process count.
    pub open_one_ms: Option<f64>,
    /// The run's own document, as it wrote it; `null` where it was not run or wrote none (killed).
    pub document: Option<Box<Document>>,
}

impl MechanismResult {
    /// One mechanism's run as `--ipc all` saw it end; the times are rounded here.
    pub fn new(
        mechanism: &str,
        (status, reason): (Status, Option<String>),
        wall_ms: Option<f64>,
        open_one_ms: Option<f64>,
        document: Option<Box<Document>>,
    ) -> Self {
        Self {
            mechanism: mechanism.to_owned(),
            status,
            reason,
            wall_ms: wall_ms.and_then(rounded),
            open_one_ms: open_one_ms.and_then(|ms| finite(ms, 1e6)),
            document,
        }
    }
}

/// `x` to `scale` (1e3: three decimals), or `None` where it is not finite (JSON has no NaN).
pub fn finite(x: f64, scale: f64) -> Option<f64> {
    x.is_finite().then(|| (x * scale).round() / scale)
}

/// `x` to three decimals, or `None` where it is not finite.
pub fn rounded(x: f64) -> Option<f64> {
    finite(x, 1e3)
}

/// The document's text: indented, one field a line, ending with a newline.
pub fn text(document: &Document) -> serde_json::Result<String> {
    serde_json::to_string_pretty(document).map(|mut text| {
        text.push('\n');
        text
    })
}

/// The document a run of one mechanism wrote, read back (`None` if it is not one).
pub fn parse(text: &[u8]) -> Option<Document> {
    serde_json::from_slice(text).ok()
}

/// A document of a failed run, for tests.
#[cfg(test)]
pub fn example() -> Document {
    tests::document()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn document() -> Document {
        Document {
            program: "simple-ipc".into(),
            version: "0.1.0".into(),
            status: Status::Failed,
            reason: Some("--json /tmp/a\"b\\c\nd: refused".into()),
            cause: None,
            fix: None,
            refused: None,
            xid: Vec::new(),
            kernel_log: None,
            test_kernel_log: None,
            summary: None,
            exit_status: Some(1),
            mode: Mode::Run,
            driver: Some(DriverFacts { version: None, cuda_version: None, simulated: true }),
            devices: Vec::new(),
            options: Options {
                ipc: "legacy".into(),
                sync: "events".into(),
                procs_per_device: 1,
                sequential: false,
                timings: false,
                timeout_s: 60,
                bind_numa: false,
                quiet: false,
                bench_max_bytes: None,
                serve: None,
                isolate: Some("joiners:pid".into()),
            },
            run: None,
            mechanisms: None,
            bench: None,
            matrix: None,
            placement: None,
        }
    }

    /// The document reads back as it was written (the top parent of `--ipc all` depends on it), phases in
    /// their order; a reason with quotes, backslashes and newlines is escaped, and results a mode did not
    /// reach are left out.
    #[test]
    fn a_document_reads_back_as_written_and_strings_are_escaped() {
        let mut doc = document();
        let written = text(&doc).unwrap();
        assert!(written.contains(r#""reason": "--json /tmp/a\"b\\c\nd: refused""#), "{written}");
        assert!(written.ends_with("}\n") && !written.contains("\"run\":"), "{written}");
        assert_eq!(parse(written.as_bytes()), Some(doc.clone()));

        let times = PhaseTimes(vec![("round_robin".into(), 2.5), ("cuda_start".into(), 1.0)]);
        doc.run = Some(RunResults {
            unit: "ms".into(),
            processes: 1,
            buffer_bytes: 4096,
            parent_checked_every_buffer: false,
            parent: ParentResult { phases: times.clone() },
            children: vec![ChildResult {
                index: 0,
                device: 0,
                phases: times,
                descriptors_before_open: 5,
                descriptors_after_close: 5,
            }],
        });
        let written = text(&doc).unwrap();
        assert!(written.find("round_robin") < written.find("cuda_start"), "in the order given: {written}");
        assert_eq!(parse(written.as_bytes()), Some(doc));
        let value: serde_json::Value = serde_json::from_str(&written).unwrap();
        assert!(value.get("run").is_some() && value.get("bench").is_none(), "{written}");
        assert_eq!(parse(b"not a document"), None);
    }
}
