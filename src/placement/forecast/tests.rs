use super::*;
use crate::placement::share::tests::place;
use crate::placement::share::{Fact, compare};
use crate::placement::{Place, Platform};

fn verdicts(forecasts: &[Forecast]) -> Vec<Verdict> {
    forecasts.iter().map(|f| f.verdict.clone()).collect()
}

fn fails(error: &str) -> Verdict {
    Verdict::Fails(error.into())
}

/// Each row of the matrix measured on the H200 host, forecast from the facts alone.
#[test]
fn each_measured_row_is_forecast() {
    let no_imex = fails("CUDA_ERROR_NOT_PERMITTED");
    let (exporter, mut importer) = (place(1), place(2));
    let row = |importer: &Place| verdicts(&forecast(&exporter, importer, &compare(&exporter, importer)));

    use Verdict::Works;
    let esrch = fails("ESRCH");
    assert_eq!(row(&importer), [Works, Works, Works, Works, no_imex.clone(), Works], "same namespaces");
    importer.namespaces.pid = Some(9);
    assert_eq!(
        row(&importer),
        [Works, Works, Works, Works, no_imex.clone(), esrch.clone()],
        "other pid numbers"
    );
    importer.pid = 1;
    let invalid = fails("CUDA_ERROR_INVALID_CONTEXT");
    assert_eq!(
        row(&importer),
        [invalid.clone(), invalid, Works, Works, no_imex.clone(), esrch],
        "the same pid number"
    );
    let mut importer = place(2);
    importer.dev_shm.as_mut().unwrap().device = 99;
    assert_eq!(
        row(&importer),
        [Works, fails("CUDA_ERROR_MAP_FAILED"), Works, Works, no_imex.clone(), Works],
        "own /dev/shm"
    );
    let mut importer = place(2);
    importer.namespaces.net = Some(3);
    importer.namespaces.user = Some(3);
    importer.namespaces.ipc = Some(3);
    assert_eq!(row(&importer), [Works, Works, Works, Works, no_imex.clone(), Works], "own SysV IPC, net");
    // A user namespace of its own (root mapped): its capabilities are not the exporter's namespace's.
    importer.in_user_namespace = true;
    importer.capabilities.sys_ptrace = true;
    assert_eq!(row(&importer), [Works, Works, Works, Works, no_imex, fails("EPERM")], "own user namespace");
}

#[test]
fn a_forecast_never_says_works_for_what_nobody_measured() {
    let (mut exporter, mut importer) = (place(1), place(2));
    exporter.imex_channel = true;
    importer.imex_channel = true;
    let forecasts = forecast(&exporter, &importer, &compare(&exporter, &importer));
    assert_eq!(forecasts[4].verdict, Verdict::NotKnown);
    importer.namespaces.pid = None;
    let forecasts = forecast(&exporter, &importer, &compare(&exporter, &importer));
    assert_eq!(forecasts[0].verdict, Verdict::NotKnown, "a PID namespace not read");
    importer.boot_id = Some("elsewhere".into());
    let forecasts = forecast(&exporter, &importer, &compare(&exporter, &importer));
    let (fabric, others): (Vec<_>, Vec<_>) = forecasts.iter().partition(|f| f.path == "fabric");
    assert!(others.iter().all(|f| matches!(&f.verdict, Verdict::Fails(e) if e == "not on one node")));
    assert_eq!(fabric[0].verdict, Verdict::NotKnown, "across nodes with IMEX on both: made for it");
    importer.imex_channel = false;
    let forecasts = forecast(&exporter, &importer, &compare(&exporter, &importer));
    assert!(forecasts.iter().all(|f| matches!(&f.verdict, Verdict::Fails(e) if e == "not on one node")));
}

/// An importer whose container has the exporter's GPU, hidden by its CUDA_VISIBLE_DEVICES alone: a
/// legacy handle still opens (CUDA's documentation), the descriptors' paths are not known; the event,
/// which is no memory of a GPU, is unchanged; seeing them all changes nothing.
#[test]
fn a_gpu_hidden_by_cuda_visible_devices_alone_still_opens_legacy_handles() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.gpus = Some(vec!["GPU-b".into()]);
    importer.gpus_present = Some(vec!["GPU-a".into(), "GPU-b".into()]);
    let rows = forecast(&exporter, &importer, &compare(&exporter, &importer));
    let verdict = |path: &str| rows.iter().find(|f| f.path == path).unwrap().clone();
    for path in ["VMM fd", "pool fd", "VMM fd by pidfd_getfd"] {
        let row = verdict(path);
        assert_eq!(row.verdict, Verdict::NotKnown, "{row:?}");
        assert!(row.rule.contains("lacks GPU-a") && row.fix.is_some(), "{row:?}");
    }
    let legacy = verdict("legacy memory");
    assert_eq!(legacy.verdict, Verdict::Works, "{legacy:?}");
    assert!(legacy.rule.contains("only by its CUDA_VISIBLE_DEVICES"), "{legacy:?}");
    assert_eq!(verdict("legacy event").verdict, Verdict::Works);
    assert!(matches!(verdict("fabric").verdict, Verdict::Fails(_)), "a failure stays one");
    // Its container does not have it at all: every memory path fails, fabric too, before any pid rule.
    importer.gpus_present = Some(vec!["GPU-b".into()]);
    importer.namespaces.pid = Some(9);
    importer.pid = 1;
    let rows = forecast(&exporter, &importer, &compare(&exporter, &importer));
    for row in rows.iter().filter(|r| r.path != "legacy event") {
        assert_eq!(row.verdict, Verdict::Fails("the importer's container has no such GPU".into()), "{row:?}");
        assert!(row.rule.contains("does not have GPU-a"), "{row:?}");
    }
    importer.namespaces.pid = Some(1);
    importer.pid = 2;
    importer.gpus = Some(vec!["GPU-b".into(), "GPU-a".into()]);
    let rows = forecast(&exporter, &importer, &compare(&exporter, &importer));
    assert_eq!(rows.iter().find(|f| f.path == "legacy memory").unwrap().verdict, Verdict::Works);
}

#[test]
fn each_failing_forecast_names_the_least_change_in_docker_and_kubernetes_words() {
    let (exporter, mut importer) = (place(1), place(1));
    importer.namespaces.pid = Some(2);
    importer.dev_shm.as_mut().unwrap().device = 3;
    for forecast in forecast(&exporter, &importer, &compare(&exporter, &importer)) {
        if let Verdict::Fails(_) = forecast.verdict {
            let fix = forecast.fix.as_ref().unwrap_or_else(|| panic!("{forecast:?}"));
            assert!(fix.docker.starts_with("--") && !fix.kubernetes.is_empty(), "{fix:?}");
        }
    }
    let json =
        serde_json::to_value(&forecast(&exporter, &importer, &compare(&exporter, &importer))[0]).unwrap();
    assert_eq!(json["verdict"], "fails");
    assert_eq!(json["detail"], "CUDA_ERROR_INVALID_CONTEXT");
    assert_eq!(
        json["fix"]["kubernetes"],
        "shareProcessNamespace: true (both containers in one pod), or hostPID: true"
    );
}

fn row_of(exporter: &Place, importer: &Place, path: &str) -> Forecast {
    let rows = forecast(exporter, importer, &compare(exporter, importer));
    rows.into_iter().find(|f| f.path == path).unwrap()
}

/// The driver names an event's file by the exporter's uid as it sees itself and looks for it under the
/// importer's own (measured on the H200 host, 2026-12-07): another uid, or root in a user namespace without
/// a map (uid 65534 there), finds none; root mapped as root, or two processes of one uid, do.
#[test]
fn an_event_crosses_only_to_the_exporters_own_uid() {
    let map_failed = Verdict::Fails("CUDA_ERROR_MAP_FAILED".into());
    let exporter = place(1);
    let mut nobody = place(2);
    (nobody.uid, nobody.node_uid) = (65534, Some(65534));
    let event = row_of(&exporter, &nobody, "legacy event");
    assert_eq!(event.verdict, map_failed, "{event:?}");
    assert!(event.rule.contains("cuda.shm.<uid>.<pid>.<n>") && event.fix.is_some(), "{event:?}");
    assert_eq!(row_of(&exporter, &nobody, "legacy memory").verdict, Verdict::Works, "memory crosses uids");
    let mut unmapped = place(2);
    (unmapped.uid, unmapped.in_user_namespace, unmapped.node_uid) = (65534, true, Some(0));
    assert_eq!(row_of(&exporter, &unmapped, "legacy event").verdict, map_failed, "unshare --user");
    let mut mapped_root = place(2);
    mapped_root.in_user_namespace = true;
    assert_eq!(row_of(&exporter, &mapped_root, "legacy event").verdict, Verdict::Works, "unshare --user -r");
    // Root of a user namespace that maps it to another uid: its name matches, but the file is not its own.
    let mut other_owner = mapped_root.clone();
    other_owner.node_uid = Some(1000);
    assert_eq!(row_of(&exporter, &other_owner, "legacy event").verdict, map_failed);
    // Node root looks for the file under uid 0, not the exporter's.
    let mut nobody_exporter = place(1);
    (nobody_exporter.uid, nobody_exporter.node_uid) = (65534, Some(65534));
    assert_eq!(row_of(&nobody_exporter, &place(2), "legacy event").verdict, map_failed);
    assert_eq!(row_of(&nobody_exporter, &nobody, "legacy event").verdict, Verdict::Works, "one uid");
}

/// WSL2 and Tegra have no legacy CUDA IPC, on either side; what nobody measured there is not known.
#[test]
fn the_platform_decides_before_the_namespaces() {
    for platform in [Platform::Wsl2("/dev/dxg is present".into()), Platform::Tegra("x".into())] {
        let mut importer = place(2);
        importer.platform = platform.clone();
        for (exporter, importer) in [(place(1), importer.clone()), (importer.clone(), place(1))] {
            let rows = forecast(&exporter, &importer, &compare(&exporter, &importer));
            for row in &rows {
                let expected = match row.path.starts_with("legacy") {
                    true => Verdict::Fails("CUDA_ERROR_NOT_SUPPORTED".into()),
                    false => Verdict::NotKnown,
                };
                assert_eq!(row.verdict, expected, "{platform:?}: {row:?}");
            }
        }
    }
}

/// Yama's scope 1 lets an ancestor in: known from outside, where both pids are; unknown (a served run's
/// joiner, which is no ancestor of its server) stays a refusal.
#[test]
fn yamas_scope_one_lets_an_ancestor_in() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.ptrace_scope = Some(1);
    let by_pidfd = |importer: &Place, ancestor: Sameness| {
        let mut facts: Vec<Fact> = compare(&exporter, importer);
        facts.iter_mut().find(|f| f.fact == IMPORTER_IS_ANCESTOR).unwrap().same = ancestor;
        forecast(&exporter, importer, &facts)[5].clone()
    };
    assert_eq!(by_pidfd(&importer, Sameness::Same).verdict, Verdict::Works);
    let refused = by_pidfd(&importer, Sameness::Differs);
    assert_eq!(refused.verdict, Verdict::Fails("EPERM".into()));
    assert!(refused.rule.contains("no ancestor of the exporter"), "{refused:?}");
    assert_eq!(by_pidfd(&importer, Sameness::Unknown).verdict, Verdict::Fails("EPERM".into()));
    importer.ptrace_scope = Some(2);
    assert_eq!(
        by_pidfd(&importer, Sameness::Same).verdict,
        Verdict::Fails("EPERM".into()),
        "scope 2: admins only"
    );
}

/// A seccomp filter read from outside: whether it allows pidfd_getfd is not known, not inferred.
#[test]
fn a_filter_read_from_outside_is_not_known() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.seccomp = Some(2);
    importer.capabilities.sys_ptrace = true;
    importer.pidfd_getfd_itself = Some(UNDER_A_FILTER.to_owned());
    let row = row_of(&exporter, &importer, "VMM fd by pidfd_getfd");
    assert_eq!(row.verdict, Verdict::NotKnown, "{row:?}");
    assert!(row.rule.contains("not known"), "{row:?}");
    importer.pidfd_getfd_itself = Some("allowed".into());
    assert_eq!(row_of(&exporter, &importer, "VMM fd by pidfd_getfd").verdict, Verdict::Works);
}

/// An importer that sees no GPU at all has no context: every path fails, the event's too (measured:
/// CUDA_ERROR_NO_DEVICE).
#[test]
fn an_importer_that_sees_no_gpu_opens_nothing() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.gpus = Some(vec![]);
    for row in forecast(&exporter, &importer, &compare(&exporter, &importer)) {
        assert_eq!(row.verdict, Verdict::Fails("CUDA_ERROR_NO_DEVICE".into()), "{row:?}");
    }
}

/// The node's root opens the exporter's event file whoever owns it on the node: root of a user namespace
/// mapped to another node uid still names the file uid 0, which node root finds and may open; two
/// processes of one uid as each sees it, each mapped to another node uid, do not.
#[test]
fn node_root_opens_the_event_file_of_any_owner() {
    let mut mapped_exporter = place(1);
    (mapped_exporter.in_user_namespace, mapped_exporter.node_uid) = (true, Some(100_000));
    assert_eq!(row_of(&mapped_exporter, &place(2), "legacy event").verdict, Verdict::Works);
    let (mut exporter, mut importer) = (place(1), place(2));
    (exporter.uid, exporter.in_user_namespace, exporter.node_uid) = (1000, true, Some(101_000));
    (importer.uid, importer.in_user_namespace, importer.node_uid) = (1000, true, Some(201_000));
    let event = row_of(&exporter, &importer, "legacy event");
    assert_eq!(event.verdict, Verdict::Fails("CUDA_ERROR_MAP_FAILED".into()), "another owner: {event:?}");
    importer.in_user_namespace = false;
    importer.node_uid = Some(1000);
    assert_eq!(row_of(&exporter, &importer, "legacy event").verdict, event.verdict, "not root: no way in");
}

/// ptrace's check for one uid: the importer must hold every capability the exporter holds (CAP_SYS_PTRACE,
/// CAP_SYS_NICE, CAP_IPC_LOCK, each alone refuses), or CAP_SYS_PTRACE; holding the same is enough.
#[test]
fn a_capability_the_exporter_holds_and_the_importer_lacks_refuses_pidfd_getfd() {
    let holds: [fn(&mut Place); 3] = [
        |p| p.capabilities.sys_ptrace = true,
        |p| p.capabilities.sys_nice = true,
        |p| p.capabilities.ipc_lock = true,
    ];
    for hold in holds {
        let mut exporter = place(1);
        hold(&mut exporter);
        let refused = row_of(&exporter, &place(2), "VMM fd by pidfd_getfd");
        assert_eq!(refused.verdict, fails("EPERM"), "{:?}: {refused:?}", exporter.capabilities);
        assert!(refused.rule.contains("holds capabilities the importer lacks"), "{refused:?}");
        let mut importer = place(2);
        hold(&mut importer);
        let row = row_of(&exporter, &importer, "VMM fd by pidfd_getfd");
        assert_eq!(row.verdict, Verdict::Works, "{:?}: {row:?}", importer.capabilities);
    }
}

/// Without Yama's scope (0), ptrace asks nothing of ancestry: an importer known to be no ancestor of the
/// exporter fetches its descriptor all the same.
#[test]
fn without_yama_an_importer_need_not_be_an_ancestor() {
    let (exporter, importer) = (place(1), place(2));
    let mut facts = compare(&exporter, &importer);
    facts.iter_mut().find(|f| f.fact == IMPORTER_IS_ANCESTOR).unwrap().same = Sameness::Differs;
    assert_eq!(forecast(&exporter, &importer, &facts)[5].verdict, Verdict::Works);
}

/// Across PID namespaces, pidfd_getfd's least change is one PID namespace, or the program's own way that
/// needs none: the descriptor over the run's socket (not the legacy paths' `--ipc vmm`).
#[test]
fn across_pid_namespaces_pidfd_getfds_option_is_the_socket() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.namespaces.pid = Some(9);
    let row = row_of(&exporter, &importer, "VMM fd by pidfd_getfd");
    assert_eq!(row.verdict, fails("ESRCH"), "{row:?}");
    let fix = row.fix.unwrap_or_else(|| panic!("a fix"));
    assert_eq!(fix.option.as_deref(), Some(pidfd::BY_SOCKET));
    assert_eq!(fix.docker, same_pid_number_fix().docker);
}

/// An importer that sees no GPU says so in every row, with the fix that gives it the exporter's GPU; one
/// whose container lacks the GPU gets the same fix on every memory path.
#[test]
fn an_unseen_gpu_is_the_rule_and_the_fix_of_every_row_it_fails() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.gpus = Some(vec![]);
    for row in forecast(&exporter, &importer, &compare(&exporter, &importer)) {
        assert!(row.rule.starts_with("the importer sees no GPU at all"), "{row:?}");
        assert!(row.fix.as_ref().is_some_and(|f| f.docker.starts_with("--gpus all")), "{row:?}");
    }
    importer.gpus = Some(vec!["GPU-b".into()]);
    importer.gpus_present = Some(vec!["GPU-b".into()]);
    for row in forecast(&exporter, &importer, &compare(&exporter, &importer)) {
        let fixed = row.fix.as_ref().is_some_and(|f| f.docker.starts_with("--gpus all"));
        assert_eq!(fixed, row.path != "legacy event", "{row:?}");
    }
}
