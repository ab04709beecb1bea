//! `--metrics FILE`: the run's document in Prometheus' text exposition format (version 0.0.4), for
//! node_exporter's textfile collector or a Pushgateway. Every metric is derived from the [`Document`], the
//! one `--json` writes, so that every mode has them and one writer writes them: how the run ended, the GPUs,
//! each phase of each process, each mechanism of `--ipc all`, the container matrix's cells, the benchmark's
//! figures, MPS, what the processes of a served run share with the server and how each path fared, the
//! driver's refusal, and the Xid errors the kernel logged for the run's GPUs.
//!
//! Names follow Prometheus' conventions: the `simple_ipc_` prefix, base units in the name (`_seconds`,
//! `_bytes`, `_bytes_per_second`, `_ratio`), every metric a gauge (a run's figures, none a counter, so none
//! ends in `_total`); a state (a status, a verdict) is a set of series, one per state, 1 for the one that
//! holds and 0 for the others, so that `== 1` selects it and nothing goes stale when it changes. Label
//! values are escaped (`\\`, `\"`, `\n`); those of this program's own vocabulary are words without commas
//! (a benchmark's hand-over by its `snake_case` name, `--isolate`'s kinds joined by `+`). docs/metrics.md
//! lists them.

use serde::Serialize;

use super::document::{BenchResults, Document, MatrixCell, MechanismResult, RunResults, Status};
use crate::placement::Placement;
#[cfg(test)]
use exposition::{HELP, PREFIX};
use exposition::{Labels, Metrics};

mod exposition;

/// The states of a run (and, but `running`, of a mechanism of `--ipc all`), as the document names them.
const STATUSES: [(Status, &str); 5] = [
    (Status::Passed, "passed"),
    (Status::Failed, "failed"),
    (Status::Waived, "waived"),
    (Status::Interrupted, "interrupted"),
    (Status::Running, "running"),
];

/// A matrix cell's results, as the document names them (`error`: its run failed for another cause than
/// the driver's refusal).
const CELL_RESULTS: [&str; 5] = ["ok", "waived", "not_simulated", "failed", "error"];

/// The metrics of `document`, in Prometheus' text format.
pub fn text(document: &Document) -> String {
    let mut metrics = Metrics::default();
    let mechanism = document.options.ipc.clone();
    run_ended(&mut metrics, document);
    devices(&mut metrics, document);
    if let Some(run) = &document.run {
        phases(&mut metrics, run, &mechanism);
    }
    xid(&mut metrics, document, &mechanism);
    for result in document.mechanisms.iter().flatten() {
        of_mechanism(&mut metrics, result);
    }
    for cell in document.matrix.iter().flatten() {
        matrix_cell(&mut metrics, cell);
    }
    if let Some(bench) = &document.bench {
        benchmark(&mut metrics, bench);
    }
    mps(&mut metrics, document);
    if let Some(placement) = &document.placement {
        served(&mut metrics, placement);
    }
    metrics.text()
}

/// How the run ended, with what, and the driver's refusal where it failed on one.
fn run_ended(metrics: &mut Metrics, document: &Document) {
    let options = &document.options;
    let mut info = vec![
        ("version", document.version.clone()),
        ("mode", tag(&document.mode)),
        ("ipc", options.ipc.clone()),
        ("sync", options.sync.clone()),
        ("isolate", options.isolate.as_deref().map(kinds).unwrap_or_default()),
    ];
    if let Some(driver) = &document.driver {
        info.push(("simulated", driver.simulated.to_string()));
        info.push(("driver_version", driver.version.clone().unwrap_or_default()));
        info.push(("cuda_version", driver.cuda_version.map(|v| v.to_string()).unwrap_or_default()));
    }
    info.retain(|(_, value)| !value.is_empty());
    metrics.gauge("info", info, 1.0);
    let status = status_name(document.status);
    metrics.states("status", Vec::new(), ("status", &status_names(), status));
    if let Some(exit_status) = document.exit_status {
        metrics.gauge("exit_status", Vec::new(), f64::from(exit_status));
    }
    if let Some(refused) = &document.refused {
        let handle = if refused.event { "event" } else { "memory" };
        let labels = vec![
            ("call", refused.call.clone()),
            ("error", refused.error.clone()),
            ("handle", handle.to_owned()),
        ];
        metrics.gauge("refused", labels, 1.0);
    }
    if document.kernel_log.is_some() {
        metrics.gauge("kernel_log_unreadable", Vec::new(), 1.0);
    }
    if document.test_kernel_log.is_some() {
        metrics.gauge("test_kernel_log", Vec::new(), 1.0);
    }
}

/// Every GPU the driver reports.
fn devices(metrics: &mut Metrics, document: &Document) {
    for device in &document.devices {
        let labels = vec![
            ("device", device.index.to_string()),
            ("name", device.name.clone()),
            ("uuid", device.uuid.clone()),
            ("pci_bus_id", device.pci_bus_id.clone().unwrap_or_default()),
            ("chosen", device.chosen.to_string()),
        ];
        metrics.gauge("device_info", labels, 1.0);
    }
}

/// Each phase of each process of a run of `mechanism`, and its whole time.
fn phases(metrics: &mut Metrics, run: &RunResults, mechanism: &str) {
    let of = |process: String| vec![("mechanism", mechanism.to_owned()), ("process", process)];
    metrics.gauge("processes", of_mechanism_only(mechanism), run.processes as f64);
    metrics.gauge("buffer_bytes", of_mechanism_only(mechanism), run.buffer_bytes as f64);
    let processes = std::iter::once(("parent".to_owned(), &run.parent.phases))
        .chain(run.children.iter().map(|child| (child.index.to_string(), &child.phases)));
    for (process, times) in processes {
        for (phase, ms) in &times.0 {
            if phase == "total" {
                metrics.gauge("process_seconds", of(process.clone()), ms / 1e3);
            } else {
                let mut labels = of(process.clone());
                labels.push(("phase", phase.clone()));
                metrics.gauge("phase_seconds", labels, ms / 1e3);
            }
        }
    }
}

fn of_mechanism_only(mechanism: &str) -> Labels {
    vec![("mechanism", mechanism.to_owned())]
}

/// The Xid errors the kernel logged for the run's GPUs, by GPU and number, in the run of `mechanism`.
fn xid(metrics: &mut Metrics, document: &Document, mechanism: &str) {
    let mut counted: Vec<(Labels, f64)> = Vec::new();
    for xid in &document.xid {
        let labels = vec![
            ("mechanism", mechanism.to_owned()),
            ("device", xid.device.to_string()),
            ("uuid", xid.uuid.clone()),
            ("pci_bus_id", xid.pci_bus_id.clone()),
            ("xid", xid.xid.to_string()),
            ("whose", tag(&xid.whose)),
            ("process", tag(&xid.process)),
        ];
        match counted.iter_mut().find(|(seen, _)| *seen == labels) {
            Some((_, count)) => *count += 1.0,
            None => counted.push((labels, 1.0)),
        }
    }
    for (labels, count) in counted {
        metrics.gauge("xid_errors", labels, count);
    }
}

/// One mechanism's run under `--ipc all`: how it ended and its times, and what its own document says.
fn of_mechanism(metrics: &mut Metrics, result: &MechanismResult) {
    let labels = of_mechanism_only(&result.mechanism);
    let status = status_name(result.status);
    metrics.states("mechanism_status", labels.clone(), ("status", &ended_status_names(), status));
    if let Some(ms) = result.wall_ms {
        metrics.gauge("mechanism_seconds", labels.clone(), ms / 1e3);
    }
    if let Some(ms) = result.open_one_ms {
        metrics.gauge("mechanism_open_handle_seconds", labels, ms / 1e3);
    }
    if let Some(document) = &result.document {
        if let Some(run) = &document.run {
            phases(metrics, run, &result.mechanism);
        }
        xid(metrics, document, &result.mechanism);
        if let Some(refused) = &document.refused {
            let handle = if refused.event { "event" } else { "memory" };
            let labels = vec![
                ("mechanism", result.mechanism.clone()),
                ("call", refused.call.clone()),
                ("error", refused.error.clone()),
                ("handle", handle.to_owned()),
            ];
            metrics.gauge("mechanism_refused", labels, 1.0);
        }
    }
}

/// One cell of the container matrix: its result, and the driver's error where it failed.
fn matrix_cell(metrics: &mut Metrics, cell: &MatrixCell) {
    let labels = vec![
        ("isolate", kinds(&cell.isolate)),
        ("handle", cell.handle.clone()),
        ("ipc", cell.ipc.clone()),
        ("sync", cell.sync.clone()),
    ];
    metrics.states("matrix_result", labels.clone(), ("result", &CELL_RESULTS, &cell.result));
    // The driver's error, where it is one (`CUDA_ERROR_MAP_FAILED`); how a run ended otherwise is the
    // document's to say.
    if let Some(error) = cell
        .error
        .as_ref()
        .filter(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        let mut labels = labels;
        labels.push(("error", error.clone()));
        labels.push((
            "handle_refused",
            if cell.event_refused == Some(true) { "event" } else { "memory" }.to_owned(),
        ));
        metrics.gauge("matrix_refused", labels, 1.0);
    }
}

/// The benchmark's figures: each hand-over's round trip and each copy's rate, per pair of GPUs.
fn benchmark(metrics: &mut Metrics, bench: &BenchResults) {
    for test in &bench.testcases {
        let pair = vec![
            ("mechanism", bench.mechanism.clone()),
            ("producer", test.producer.to_string()),
            ("consumer", test.consumer.to_string()),
        ];
        if let Some(trips) = &test.handover {
            for (statistic, us) in
                [("p10", trips.p10), ("p50", trips.p50), ("p90", trips.p90), ("mean", trips.mean)]
            {
                let Some(us) = us else { continue };
                let mut labels = pair.clone();
                labels.push(("handover", snake_case(&test.name)));
                labels.push(("statistic", statistic.to_owned()));
                metrics.gauge("bench_round_trip_seconds", labels, us / 1e6);
            }
        }
        if let Some(copy) = &test.copy {
            let mut labels = pair.clone();
            labels.push(("size_bytes", copy.bytes.to_string()));
            labels.push(("fits_in_l2", copy.fits_in_l2.to_string()));
            let reference = snake_case(&copy.reference_name);
            for (path, rate) in [("ipc", copy.ipc), (reference.as_str(), copy.reference)] {
                let Some(rate) = rate else { continue };
                let mut labels = labels.clone();
                labels.push(("path", path.to_owned()));
                metrics.gauge("bench_copy_bytes_per_second", labels, rate * 1e9);
            }
            if let Some(percent) = copy.ipc_percent {
                metrics.gauge("bench_copy_ipc_ratio", labels, percent / 100.0);
            }
        }
    }
}

/// Whether the run's processes were MPS clients, as the driver said it: the benchmark's words, or the
/// passed run's summary (`under MPS`).
fn mps(metrics: &mut Metrics, document: &Document) {
    let client = match (&document.bench, &document.summary) {
        (Some(bench), _) => bench.mps.contains("clients"),
        (None, Some(summary)) => summary.contains("under MPS"),
        (None, None) => return,
    };
    metrics.gauge("mps_client", Vec::new(), f64::from(u8::from(client)));
}

/// A served or isolated run: what each process that joined shares with the server, the forecast of each
/// path for it, and how each path the run took fared.
fn served(metrics: &mut Metrics, placement: &Placement) {
    let sameness = ["same", "differs", "unknown"];
    let verdicts = ["works", "fails", "falls_back", "not_known"];
    for process in &placement.processes {
        let index = process.index.to_string();
        for fact in &process.shares {
            let labels = vec![("process", index.clone()), ("fact", fact.fact.clone())];
            metrics.states("joiner_shares", labels, ("same", &sameness, &tag(&fact.same)));
        }
        for forecast in &process.forecast {
            let labels = vec![("process", index.clone()), ("path", forecast.path.clone())];
            let verdict = tag_of(&forecast.verdict, "verdict");
            metrics.states("joiner_forecast", labels, ("verdict", &verdicts, &verdict));
        }
        metrics.gauge(
            "joiner_mps_client",
            vec![("process", index)],
            f64::from(u8::from(process.place.mps.client)),
        );
    }
    let outcomes = ["worked", "refused", "kernel_refused", "not_simulated", "untried"];
    for against in placement.against.iter().flatten() {
        let labels = vec![("path", against.path.clone())];
        let outcome = tag_of(&against.outcome, "outcome");
        metrics.states("path_outcome", labels.clone(), ("outcome", &outcomes, &outcome));
        if let Some(agrees) = against.agrees {
            metrics.gauge("path_forecast_agrees", labels, f64::from(u8::from(agrees)));
        }
    }
}

fn status_name(status: Status) -> &'static str {
    STATUSES.iter().find(|(s, _)| *s == status).map_or("failed", |(_, name)| name)
}

fn status_names() -> [&'static str; 5] {
    STATUSES.map(|(_, name)| name)
}

/// The states of a mechanism's run of `--ipc all`, which has ended when its row is made: all but `running`.
fn ended_status_names() -> Vec<&'static str> {
    STATUSES.iter().filter(|(status, _)| *status != Status::Running).map(|(_, name)| *name).collect()
}

/// The name serde gives `value` (an enum of unit variants: `snake_case`).
fn tag(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}

/// The variant's name that serde writes at `key` for `value` (an enum tagged by `key`).
fn tag_of(value: &impl Serialize, key: &str) -> String {
    let value = serde_json::to_value(value).unwrap_or_default();
    value.get(key).and_then(|name| name.as_str()).unwrap_or_default().to_owned()
}

/// `--isolate`'s kinds joined by `+` (`pid+shm`): a label value without commas.
fn kinds(isolate: &str) -> String {
    isolate.replace(',', "+")
}

/// `events, signal only, GPU waits` as `events_signal_only_gpu_waits`.
fn snake_case(words: &str) -> String {
    let mut out = String::new();
    for c in words.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    }
    out.trim_end_matches('_').to_owned()
}

#[cfg(test)]
mod tests;
