//! Prometheus' text exposition format (version 0.0.4) for the run's metrics: each metric's name and help,
//! its families of series, their labels escaped, written in the order of [`HELP`].

use std::fmt::Write as _;

/// The prefix of every metric's name.
pub const PREFIX: &str = "simple_ipc_";

/// Each metric's name (less [`PREFIX`]) and what it means (its `# HELP`), in the order written.
pub const HELP: [(&str, &str); 27] = [
    ("info", "The run: this program's version, its mode and options, the driver's versions (always 1)"),
    ("status", "How the run ended (running: begun and not ended yet): 1 for its status, 0 for the others"),
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
pub(super) type Labels = Vec<(&'static str, String)>;

/// One metric: its name (without the prefix) and its series.
struct Family {
    name: &'static str,
    series: Vec<(Labels, f64)>,
}

/// The metrics of one document, each family once.
#[derive(Default)]
pub(super) struct Metrics {
    families: Vec<Family>,
}

impl Metrics {
    /// Adds a series of `name` (one of [`HELP`]'s); a value that is not finite is left out, as the document
    /// leaves it out (`null`).
    pub(super) fn gauge(&mut self, name: &'static str, labels: Labels, value: f64) {
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
    pub(super) fn states(&mut self, name: &'static str, labels: Labels, (key, states, holds): StateSet) {
        for state in states {
            let mut labels = labels.clone();
            labels.push((key, (*state).to_owned()));
            self.gauge(name, labels, f64::from(u8::from(*state == holds)));
        }
    }

    /// The exposition's text: each family's `# HELP` and `# TYPE` lines, then its series; the families in
    /// [`HELP`]'s order.
    pub(super) fn text(&self) -> String {
        let at = |name: &str| HELP.iter().position(|(n, _)| *n == name).unwrap_or(HELP.len());
        let mut families: Vec<&Family> = self.families.iter().collect();
        families.sort_by_key(|family| at(family.name));
        let mut text = String::new();
        for family in families {
            let name = format!("{PREFIX}{}", family.name);
            let help = HELP.get(at(family.name)).map_or("", |(_, help)| help);
            let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (labels, value) in &family.series {
                // An empty label is no label (Prometheus takes them as one): left out, as docs/metrics.md says.
                let labels: Vec<String> = labels
                    .iter()
                    .filter(|(_, value)| !value.is_empty())
                    .map(|(key, value)| format!("{key}=\"{}\"", escaped(value)))
                    .collect();
                let labels =
                    if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
                let _ = writeln!(text, "{name}{labels} {}", without_float_noise(*value));
            }
        }
        text
    }
}

/// A state set: its label's name, every state, and the one that holds.
pub(super) type StateSet<'a> = (&'static str, &'a [&'a str], &'a str);

/// A label's value as the exposition format writes it: `\`, `"` and newlines escaped.
fn escaped(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// `value` as its shortest decimal once the noise of a unit's conversion is gone (`ms / 1000` makes
/// 0.042642000000000006 of 42.642 ms): rounded to the nanosecond, or nano-unit, where it is small enough for
/// that to be exact.
fn without_float_noise(value: f64) -> f64 {
    if !value.is_finite() || value.abs() >= 1e6 {
        return value;
    }
    (value * 1e9).round() / 1e9
}
