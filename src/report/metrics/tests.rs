//! The unit tests of `metrics`: each mode's metrics as written, and docs/metrics.md naming each.

use super::*;

/// A label's value is escaped as the format says; HELP and TYPE come once, before the family's series;
/// a figure that is not finite is left out.
#[test]
fn the_text_is_the_exposition_format() {
    let mut metrics = Metrics::default();
    metrics.gauge("phase_seconds", vec![("k", "x\"y\\z\nw".into())], 0.25);
    metrics.gauge("processes", Vec::new(), f64::NAN);
    metrics.gauge("phase_seconds", vec![("k", "2".into())], 3.0);
    // An empty label is left out; a millisecond figure made seconds carries no float noise.
    metrics.gauge("phase_seconds", vec![("k", "3".into()), ("pci_bus_id", String::new())], 42.642 / 1000.0);
    assert_eq!(
        metrics.text(),
        "# HELP simple_ipc_phase_seconds A process's time in one phase of the run\n\
         # TYPE simple_ipc_phase_seconds gauge\n\
         simple_ipc_phase_seconds{k=\"x\\\"y\\\\z\\nw\"} 0.25\nsimple_ipc_phase_seconds{k=\"2\"} 3\n\
         simple_ipc_phase_seconds{k=\"3\"} 0.042642\n"
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
    let doc = include_str!("../../../docs/metrics.md");
    let mut from = 0;
    for (name, _) in HELP {
        let row = format!("| `{PREFIX}{name}` |");
        let at = doc[from..].find(&row).unwrap_or_else(|| panic!("docs/metrics.md lacks {row} (in order)"));
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
