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

use std::fmt::Write as _;

use serde::Serialize;

use super::document::{BenchResults, Document, MatrixCell, MechanismResult, RunResults, Status};
use crate::placement::Placement;

/// The prefix of every metric's name.
const PREFIX: &str = "simple_ipc_";

/// The states of a run (and of a mechanism of `--ipc all`), as the document names them.
const STATUSES: [(Status, &str); 4] = [
    (Status::Passed, "passed"),
    (Status::Failed, "failed"),
    (Status::Waived, "waived"),
    (Status::Interrupted, "interrupted"),
];

/// A matrix cell's results, as the document names them (`error`: its run failed for another cause than
/// the driver's refusal).
const CELL_RESULTS: [&str; 5] = ["ok", "waived", "not_simulated", "failed", "error"];

/// Each metric's name (less [`PREFIX`]) and what it means (its `# HELP`), in the order written.
pub const HELP: [(&str, &str); 27] = [
    ("info", "The run: this program's version, its mode and options, the driver's versions (always 1)"),
    ("status", "How the run ended: 1 for its status, 0 for the others"),
    ("exit_status", "The run's exit status: 0 passed, 1 failed, 2 waived, 128+N stopped by signal N"),
    (
        "refused",
        "The driver (or the kernel) refused to open a handle another process made: its call and error \
         (always 1)",
    ),
    (
        "kernel_log_unreadable",
        "The kernel's log was to be read for Xid errors and could not be (the --json document says why)",
    ),
    ("test_kernel_log", "A test's file was read instead of the kernel's log (SIMPLE_IPC_TEST_KERNEL_LOG)"),
    ("device_info", "A GPU the driver reports, and whether the run chose it (always 1)"),
    ("processes", "How many processes took part in the run"),
    ("buffer_bytes", "The size of each process's buffer, every byte of which was verified"),
    ("process_seconds", "A process's whole wall time in the run"),
    ("phase_seconds", "A process's time in one phase of the run"),
    (
        "xid_errors",
        "Xid errors the kernel logged for a GPU of the run while it ran, by number, whose fault it most \
         likely is (program, node, not_known) and whose process the record names (run, another, not_known)",
    ),
    ("mechanism_status", "How a mechanism's run of --ipc all ended: 1 for its status, 0 for the others"),
    ("mechanism_seconds", "A mechanism's run's wall time under --ipc all"),
    (
        "mechanism_open_handle_seconds",
        "The median over the processes of their time to open every handle, divided by the process count",
    ),
    (
        "mechanism_refused",
        "The driver (or the kernel) refused to open a handle in a mechanism's run of --ipc all: its call \
         and error (always 1)",
    ),
    (
        "matrix_result",
        "A cell of the container matrix: a handle across a boundary (its --isolate): 1 for its result, 0 \
         for the others",
    ),
    ("matrix_refused", "A cell of the container matrix that failed: the driver's error (always 1)"),
    (
        "bench_round_trip_seconds",
        "A hand-over's round trip between the pair's processes (its 10th, 50th and 90th percentiles, or \
         the mean where every round was queued ahead)",
    ),
    (
        "bench_copy_bytes_per_second",
        "A copy's rate through the IPC mapping (path ipc), beside the limit of that path (a local or \
         in-process peer copy)",
    ),
    ("bench_copy_ipc_ratio", "A copy's rate through the IPC mapping over its reference's"),
    (
        "mps_client",
        "Whether the run's processes were clients of an MPS daemon, as the driver says (1) or not (0)",
    ),
    (
        "joiner_shares",
        "What a process that joined shares with the server (a namespace, /dev/shm, the node, the GPUs...): \
         1 for same, differs or unknown, 0 for the others",
    ),
    (
        "joiner_forecast",
        "The forecast of a path (a kind of handle) between the server and a process that joined: 1 for its \
         verdict, 0 for the others",
    ),
    (
        "joiner_mps_client",
        "Whether a process that joined found an MPS daemon's control socket (1) or not (0)",
    ),
    ("path_outcome", "How a path the served run took fared: 1 for its outcome, 0 for the others"),
    (
        "path_forecast_agrees",
        "Whether the forecast of a path the run took agrees with what happened (1) or not (0)",
    ),
];

/// The labels of one series, in the order written.
type Labels = Vec<(&'static str, String)>;

/// One metric: its name (without the prefix) and its series.
struct Family {
    name: &'static str,
    series: Vec<(Labels, f64)>,
}

/// The metrics of one document, each family once.
#[derive(Default)]
struct Metrics {
    families: Vec<Family>,
}

impl Metrics {
    /// Adds a series of `name` (one of [`HELP`]'s); a value that is not finite is left out, as the document
    /// leaves it out (`null`).
    fn gauge(&mut self, name: &'static str, labels: Labels, value: f64) {
        if !value.is_finite() {
            return;
        }
        let at = match self.families.iter().position(|f| f.name == name) {
            Some(at) => at,
            None => {
                self.families.push(Family { name, series: Vec::new() });
                self.families.len() - 1
            }
        };
        self.families[at].series.push((labels, value));
    }

    /// One series per state of `states`, 1 for `holds` and 0 for the others.
    fn states(&mut self, name: &'static str, labels: Labels, (key, states, holds): StateSet) {
        for state in states {
            let mut labels = labels.clone();
            labels.push((key, (*state).to_owned()));
            self.gauge(name, labels, f64::from(u8::from(*state == holds)));
        }
    }

    /// The exposition's text: each family's `# HELP` and `# TYPE` lines, then its series; the families in
    /// [`HELP`]'s order.
    fn text(&self) -> String {
        let at = |name: &str| HELP.iter().position(|(n, _)| *n == name).unwrap_or(HELP.len());
        let mut families: Vec<&Family> = self.families.iter().collect();
        families.sort_by_key(|family| at(family.name));
        let mut text = String::new();
        for family in families {
            let name = format!("{PREFIX}{}", family.name);
            let help = HELP.get(at(family.name)).map_or("", |(_, help)| help);
            let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (labels, value) in &family.series {
                let labels: Vec<String> =
                    labels.iter().map(|(key, value)| format!("{key}=\"{}\"", escaped(value))).collect();
                let labels =
                    if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
                let _ = writeln!(text, "{name}{labels} {value}");
            }
        }
        text
    }
}

/// A state set: its label's name, every state, and the one that holds.
type StateSet<'a> = (&'static str, &'a [&'a str], &'a str);

/// A label's value as the exposition format writes it: `\`, `"` and newlines escaped.
fn escaped(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

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
    metrics.gauge("exit_status", Vec::new(), f64::from(document.exit_status));
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
    metrics.states("mechanism_status", labels.clone(), ("status", &status_names(), status));
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
        let outcome = tag_of(&against.seen, "outcome");
        metrics.states("path_outcome", labels.clone(), ("outcome", &outcomes, &outcome));
        if let Some(agrees) = against.agrees {
            metrics.gauge("path_forecast_agrees", labels, f64::from(u8::from(agrees)));
        }
    }
}

fn status_name(status: Status) -> &'static str {
    STATUSES.iter().find(|(s, _)| *s == status).map_or("failed", |(_, name)| name)
}

fn status_names() -> [&'static str; 4] {
    STATUSES.map(|(_, name)| name)
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
mod tests {
    use super::*;

    /// A label's value is escaped as the format says; HELP and TYPE come once, before the family's series;
    /// a figure that is not finite is left out.
    #[test]
    fn the_text_is_the_exposition_format() {
        let mut metrics = Metrics::default();
        metrics.gauge("phase_seconds", vec![("k", "x\"y\\z\nw".into())], 0.25);
        metrics.gauge("processes", Vec::new(), f64::NAN);
        metrics.gauge("phase_seconds", vec![("k", "2".into())], 3.0);
        assert_eq!(
            metrics.text(),
            "# HELP simple_ipc_phase_seconds A process's time in one phase of the run\n\
             # TYPE simple_ipc_phase_seconds gauge\n\
             simple_ipc_phase_seconds{k=\"x\\\"y\\\\z\\nw\"} 0.25\nsimple_ipc_phase_seconds{k=\"2\"} 3\n"
        );
    }

    /// Each metric has words for its `# HELP`, none of which needs escaping, and a name of Prometheus'
    /// conventions: no `_total` (none is a counter), a unit in base units where it has one.
    #[test]
    fn each_metric_has_its_help_and_a_conventional_name() {
        for (name, help) in HELP {
            assert!(!help.is_empty() && !help.contains(['\\', '\n']), "{name}: {help}");
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{name}");
            assert!(!name.ends_with("_total") && !name.contains("_ms") && !name.contains("_us"), "{name}");
            assert_eq!(HELP.iter().filter(|(n, _)| n == &name).count(), 1, "{name} once");
        }
    }

    /// A state set has one series per state, 1 for the one that holds.
    #[test]
    fn a_state_is_one_series_per_state() {
        let mut metrics = Metrics::default();
        metrics.states("status", Vec::new(), ("status", &status_names(), "failed"));
        let text = metrics.text();
        assert!(text.contains("simple_ipc_status{status=\"failed\"} 1\n"), "{text}");
        for other in ["passed", "waived", "interrupted"] {
            assert!(text.contains(&format!("simple_ipc_status{{status=\"{other}\"}} 0\n")), "{text}");
        }
    }

    /// A failed run's document: its status, exit status and options; the Xid errors by GPU and number.
    #[test]
    fn a_failed_runs_metrics_say_how_it_ended_and_its_xid_errors() {
        let mut document = crate::report::document::example();
        let xid = |number: u32| crate::node::Xid {
            xid: number,
            device: 0,
            uuid: "GPU-0".into(),
            pci_bus_id: "0000:10:00.0".into(),
            seconds_into_run: 0.5,
            message: "NVRM: Xid".into(),
            meaning: "m".into(),
            action: "a".into(),
            whose: crate::node::xid::Whose::Node,
            pid: Some(0),
            process_name: None,
            process: crate::node::xid::Faulting::NotKnown,
        };
        document.xid = vec![xid(79), xid(31), xid(79)];
        let text = text(&document);
        assert!(text.contains("simple_ipc_status{status=\"failed\"} 1\n"), "{text}");
        assert!(text.contains("simple_ipc_exit_status 1\n"), "{text}");
        assert!(text.contains("isolate=\"joiners:pid\""), "{text}");
        let gpu = r#"mechanism="legacy",device="0",uuid="GPU-0",pci_bus_id="0000:10:00.0""#;
        let of = |number: u32| {
            format!("simple_ipc_xid_errors{{{gpu},xid=\"{number}\",whose=\"node\",process=\"not_known\"}}")
        };
        assert!(text.contains(&format!("{} 2\n", of(79))), "counted: {text}");
        assert!(text.contains(&format!("{} 1\n", of(31))), "{text}");
        assert_eq!(text.matches("# TYPE simple_ipc_xid_errors gauge").count(), 1, "{text}");
    }

    /// docs/metrics.md names every metric, in the order written.
    #[test]
    fn docs_metrics_md_lists_every_metric_in_order() {
        let doc = include_str!("../../docs/metrics.md");
        let mut from = 0;
        for (name, _) in HELP {
            let row = format!("| `{PREFIX}{name}` |");
            let at =
                doc[from..].find(&row).unwrap_or_else(|| panic!("docs/metrics.md lacks {row} (in order)"));
            from += at + row.len();
        }
    }

    #[test]
    fn words_become_a_snake_case_name() {
        assert_eq!(snake_case("events, signal only, GPU waits"), "events_signal_only_gpu_waits");
        assert_eq!(
            snake_case("stream memops, signal only, queued ahead (mean)"),
            "stream_memops_signal_only_queued_ahead_mean"
        );
        assert_eq!(snake_case("in-process peer copy"), "in_process_peer_copy");
        assert_eq!(kinds("pid,shm,ipc"), "pid+shm+ipc");
    }
}
