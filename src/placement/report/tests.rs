use super::*;

/// Who refused: the kernel for a descriptor's fetch (whatever else it says), then the simulation beyond
/// what it models, then the driver.
#[test]
fn who_refused_is_read_from_the_refusal() {
    use crate::ipc::pidfd::PidfdRefusal;
    use crate::ipc::refused::Refused;
    let driver = Refused {
        call: "cuIpcOpenMemHandle".into(),
        code: 201,
        error: "CUDA_ERROR_INVALID_CONTEXT".into(),
        event: false,
        fix: None,
        beyond_the_simulation: false,
        pidfd: None,
    };
    assert_eq!(RefusedBy::of(&driver), RefusedBy::Driver);
    let simulation = Refused { beyond_the_simulation: true, ..driver.clone() };
    assert_eq!(RefusedBy::of(&simulation), RefusedBy::BeyondTheSimulation);
    let kernel = Refused { pidfd: Some(PidfdRefusal::NoSuchCall), ..simulation };
    assert_eq!(RefusedBy::of(&kernel), RefusedBy::Kernel);
}
use crate::placement::share::tests::place;

#[test]
fn the_server_says_the_table_the_forecasts_and_the_fixes() {
    let mut collides = place(1);
    collides.namespaces.pid = Some(8);
    let placement = Placement::of(place(1), vec![(0, place(2)), (1, place(3)), (2, collides)]);
    assert_eq!(placement.processes.len(), 3);
    let text = placement.text();
    assert!(text.starts_with("Where the processes stand (the server is pid 1 on node):\n"), "{text}");
    assert!(
        text.contains(&format!(
            "Forecast for processes 0, 1 (docs/placement.md says why; the libraries as of {READ_IN}):\n  legacy memory: works;"
        )),
        "{text}"
    );
    assert!(text.contains("Forecast for process 2 "), "{text}");
    assert!(text.contains("legacy memory: fails (CUDA_ERROR_INVALID_CONTEXT)"), "{text}");
    assert!(
        text.contains(
            "PyTorch expandable_segments: fails (its legacy event: CUDA_ERROR_INVALID_CONTEXT, forecast)"
        ),
        "{text}"
    );
    assert_eq!(
        text.matches("what fixes it: Docker --pid=container:NAME (one PID namespace)").count(),
        1,
        "once: {text}"
    );
    let json = serde_json::to_value(&placement).unwrap();
    assert_eq!(json["processes"][2]["shares"][0]["same"], "differs");
    assert_eq!(json["processes"][2]["forecast"][0]["verdict"], "fails");
    assert_eq!(serde_json::from_value::<Placement>(json).unwrap(), placement, "it reads back");
}

#[test]
fn the_forecast_stands_beside_the_outcome_and_a_wrong_one_is_called_out() {
    let mut collides = place(1);
    collides.namespaces.pid = Some(8);
    let placement = Placement::of(place(1), vec![(0, place(2)), (1, collides)]);
    let paths = paths_of(Mechanism::Legacy, Sync::Events, Fds::Socket);
    assert_eq!(paths, ["legacy memory", "legacy event"]);
    assert_eq!(paths_of(Mechanism::Vmm, Sync::Memops, Fds::Socket), ["VMM fd"]);
    let refused =
        placement.against(&paths, false, Some((false, "CUDA_ERROR_INVALID_CONTEXT", RefusedBy::Driver)));
    assert_eq!(refused[0].agrees, Some(true), "{refused:?}");
    assert_eq!(refused[1].outcome, PathOutcome::Untried, "the event was never opened");
    let passed = placement.against(&paths, true, None);
    assert_eq!(passed[0].agrees, Some(false), "the worst forecast, the collision, said it fails");
    let text = against_text(&passed);
    assert!(
        text.contains(
            "legacy memory: forecast fails (CUDA_ERROR_INVALID_CONTEXT), it worked <- THE FORECAST WAS WRONG"
        ),
        "{text}"
    );
    let fine = Placement::of(place(1), vec![(0, place(2))]);
    let event = fine.against(&paths, false, Some((true, "CUDA_ERROR_MAP_FAILED", RefusedBy::Driver)));
    assert_eq!((event[0].outcome.clone(), event[0].agrees), (PathOutcome::Worked, Some(true)));
    assert_eq!(event[1].agrees, Some(false), "forecast works, refused");
    let beyond = fine.against(
        &paths,
        false,
        Some((false, "CUDA_ERROR_INVALID_VALUE", RefusedBy::BeyondTheSimulation)),
    );
    assert_eq!((beyond[0].outcome.clone(), beyond[0].agrees), (PathOutcome::NotSimulated, None));
    let json = serde_json::to_value(&event[1]).unwrap();
    assert_eq!(
        (json["outcome"].as_str(), json["detail"].as_str()),
        (Some("refused"), Some("CUDA_ERROR_MAP_FAILED"))
    );
    assert_eq!(json["forecast"]["verdict"], "works");
}

/// A run with `--fds pidfd` holds the forecast of the matrix's "VMM fd by pidfd_getfd" against the
/// kernel's typed refusal: ESRCH across PID namespaces, as forecast.
#[test]
fn a_pidfd_run_is_held_against_the_pidfd_column() {
    let mut elsewhere = place(2);
    elsewhere.namespaces.pid = Some(8);
    let placement = Placement::of(place(1), vec![(0, elsewhere)]);
    let paths = paths_of(Mechanism::Vmm, Sync::Memops, Fds::Pidfd);
    assert_eq!(paths, ["VMM fd by pidfd_getfd"]);
    let against = placement.against(&paths, false, Some((false, "ESRCH", RefusedBy::Kernel)));
    assert_eq!(
        (against[0].forecast.clone(), against[0].agrees),
        (Verdict::Fails("ESRCH".into()), Some(true))
    );
    let wrong = placement.against(&paths, true, None);
    assert_eq!(wrong[0].agrees, Some(false), "forecast ESRCH, it worked");
    let pool = placement.against(
        &paths_of(Mechanism::Pool, Sync::Events, Fds::Pidfd),
        false,
        Some((false, "ESRCH", RefusedBy::Kernel)),
    );
    assert_eq!((pool[0].forecast.clone(), pool[0].agrees), (Verdict::NotKnown, None), "no column for it");
}
