//! The recipes' unit tests: each gate, setting and primitive changes the row it should, and only it.

use super::ucx_torch::ucx_tls_excludes_cuda_ipc;
use super::*;
use crate::placement::forecast::{forecast as handles, pidfd_getfd_refused};
use crate::placement::share::compare;
use crate::placement::share::tests::place;
use crate::placement::versions::Version;

pub(super) fn rows(exporter: &Place, importer: &Place, measured: &[(String, Verdict)]) -> Vec<Forecast> {
    let facts = compare(exporter, importer);
    let forecast = handles(exporter, importer, &facts);
    libraries(exporter, importer, &facts, &Primitives { forecast: &forecast, measured })
}

pub(super) fn row(exporter: &Place, importer: &Place, path: &str) -> Forecast {
    rows(exporter, importer, &[]).into_iter().find(|f| f.path == path).unwrap()
}

pub(super) fn verdict_of(exporter: &Place, importer: &Place, path: &str) -> Verdict {
    row(exporter, importer, path).verdict
}

pub(super) fn set(place: &mut Place, name: &str, value: &str) {
    place.settings.push((name.to_owned(), value.to_owned()));
}

/// A /dev/shm with room for NCCL's buffers.
pub(super) fn roomy(mut place: Place) -> Place {
    if let Some(shm) = place.dev_shm.as_mut() {
        (shm.size_bytes, shm.free_bytes) = (8 << 30, 8 << 30);
    }
    place
}

#[test]
fn one_place_works_for_every_library() {
    let (exporter, importer) = (roomy(place(1)), roomy(place(2)));
    for row in rows(&exporter, &importer, &[]) {
        assert_eq!(row.verdict, Verdict::Works, "{row:?}");
        assert!(row.rule.contains("(forecast)"), "a row says its primitives' evidence: {row:?}");
    }
}

#[test]
fn two_hostnames_send_nccl_to_its_network_transport_unless_one_hostid() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.namespaces.uts = Some(4);
    importer.hostname = "other".into();
    assert!(matches!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::FallsBack(_)));
    assert!(matches!(verdict_of(&exporter, &importer, NCCL_SHM), Verdict::FallsBack(_)));
    assert_eq!(verdict_of(&exporter, &importer, UCX_LEGACY), Verdict::Works, "UCX asks the boot id only");
    let (mut exporter, mut importer) = (exporter, importer);
    set(&mut exporter, "NCCL_HOSTID", "node-7");
    set(&mut importer, "NCCL_HOSTID", "node-7");
    assert_eq!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::Works, "one NCCL_HOSTID is one host");
    importer.settings.clear();
    assert!(matches!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::FallsBack(_)));
    // Two host hashes with an IMEX channel on both: NCCL's MNNVL may join them; nobody measured it.
    let (mut exporter, mut importer) = (place(1), place(2));
    importer.hostname = "other".into();
    importer.namespaces.uts = Some(4);
    (exporter.imex_channel, importer.imex_channel) = (true, true);
    assert_eq!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::NotKnown);
}

/// The H200 host's finding: an expandable segment's share carries a legacy interprocess event, whose file
/// lives in the exporter's /dev/shm; PyTorch failed where the forecast had said "works".
#[test]
fn another_dev_shm_fails_pytorchs_expandable_segments_by_its_legacy_event() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.dev_shm.as_mut().unwrap().device = 9;
    let expandable = row(&exporter, &importer, TORCH_EXPANDABLE);
    assert_eq!(
        expandable.verdict,
        Verdict::Fails("its legacy event: CUDA_ERROR_MAP_FAILED, forecast".into()),
        "{expandable:?}"
    );
    assert!(expandable.fix.as_ref().is_some_and(|f| f.docker.contains("--ipc=container")), "{expandable:?}");
    assert!(
        matches!(verdict_of(&exporter, &importer, TORCH_LEGACY), Verdict::Fails(e) if e.contains("MAP_FAILED"))
    );
    assert!(matches!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::FallsBack(_)));
    assert!(matches!(verdict_of(&exporter, &importer, NCCL_SHM), Verdict::FallsBack(_)));
    assert_eq!(verdict_of(&exporter, &importer, UCX_LEGACY), Verdict::Works, "UCX opens no event");
}

#[test]
fn another_network_namespace_fails_nccls_cumem_socket_but_not_its_legacy_ipc() {
    let (exporter, mut importer) = (roomy(place(1)), roomy(place(2)));
    importer.namespaces.net = Some(9);
    assert_eq!(
        verdict_of(&exporter, &importer, NCCL_P2P),
        Verdict::Fails("the descriptors' abstract socket is not reachable".into())
    );
    assert!(matches!(verdict_of(&exporter, &importer, NCCL_SHM), Verdict::Fails(_)), "cuMem host memory");
    assert_eq!(verdict_of(&exporter, &importer, TORCH_LEGACY), Verdict::Works);
    // NCCL_CUMEM_ENABLE=0 (SGLang, OpenRLHF): legacy handles, which no network namespace stops; SHM's
    // buffers are /dev/shm files then.
    let mut legacy = exporter.clone();
    set(&mut legacy, "NCCL_CUMEM_ENABLE", "0");
    assert_eq!(verdict_of(&legacy, &importer, NCCL_P2P), Verdict::Works);
    assert_eq!(verdict_of(&legacy, &importer, NCCL_SHM), Verdict::Works);
    // A path socket (NCCL >= 2.29.2): where /tmp is shared, which nothing here reads.
    let mut named = exporter.clone();
    set(&mut named, "NCCL_IPC_USE_ABSTRACT_SOCKET", "0");
    assert_eq!(verdict_of(&named, &importer, NCCL_P2P), Verdict::NotKnown);
}

#[test]
fn nccl_legacy_ipc_fails_where_pid_numbers_collide() {
    let (mut exporter, mut importer) = (place(1), place(1));
    importer.namespaces.pid = Some(9);
    assert_eq!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::Works, "cuMem needs no PID namespace");
    set(&mut exporter, "NCCL_CUMEM_ENABLE", "0");
    assert!(
        matches!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::Fails(e) if e.contains("INVALID_CONTEXT"))
    );
}

#[test]
fn nccls_own_switches_and_ucx_tls_take_their_paths_out() {
    let (mut exporter, importer) = (roomy(place(1)), roomy(place(2)));
    set(&mut exporter, "NCCL_P2P_DISABLE", "1");
    set(&mut exporter, "NCCL_SHM_DISABLE", "1");
    set(&mut exporter, "UCX_TLS", "tcp,self");
    for path in [NCCL_P2P, NCCL_SHM, UCX_LEGACY, UCX_CUMEM] {
        assert!(matches!(verdict_of(&exporter, &importer, path), Verdict::FallsBack(_)), "{path}");
    }
    assert!(ucx_tls_excludes_cuda_ipc("^cuda_ipc"));
    assert!(!ucx_tls_excludes_cuda_ipc("^tcp"));
    assert!(!ucx_tls_excludes_cuda_ipc("cuda_copy,cuda_ipc,tcp"));
    assert!(!ucx_tls_excludes_cuda_ipc("all"));
    assert!(ucx_tls_excludes_cuda_ipc("rc,tcp"));
}

/// NCCL's buffers as /dev/shm files (cuMem host memory off): a /dev/shm too small for them is no
/// fallback (fallocate's ENOSPC is an error), and how small is too small was not measured: not known.
#[test]
fn a_small_dev_shm_is_not_known_for_nccls_shm_files() {
    let (mut exporter, importer) = (place(1), place(2));
    set(&mut exporter, "NCCL_CUMEM_HOST_ENABLE", "0");
    let shm = row(&exporter, &importer, NCCL_SHM);
    assert_eq!(shm.verdict, Verdict::NotKnown, "{shm:?}");
    assert!(shm.fix.is_some_and(|f| f.docker == "--shm-size=1g"));
    let (exporter, importer) = (roomy(exporter), roomy(importer));
    assert_eq!(verdict_of(&exporter, &importer, NCCL_SHM), Verdict::Works);
    // Docker's seccomp without SYS_NICE refuses cuMem host memory; NCCL >= 2.26.3 uses /dev/shm files then.
    let (exporter, mut importer) = (roomy(place(1)), roomy(place(2)));
    importer.seccomp = Some(2);
    importer.namespaces.net = Some(9);
    let shm = row(&exporter, &importer, NCCL_SHM);
    assert_eq!(shm.verdict, Verdict::Works, "no socket is needed for files: {shm:?}");
    assert!(shm.rule.contains("2.26.3"), "{shm:?}");
}

#[test]
fn pid_namespaces_decide_ucx_and_pytorch() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.namespaces.pid = Some(9);
    // UCX 1.22.0 tries a legacy handle across PID namespaces: fine where the pid numbers differ.
    assert_eq!(verdict_of(&exporter, &importer, UCX_LEGACY), Verdict::Works);
    assert!(matches!(verdict_of(&exporter, &importer, UCX_CUMEM), Verdict::FallsBack(_)), "silently");
    // The exporter is pid 1 in its namespace: the importer's own pid 1 (its init) is what PyTorch's
    // pidfd_open opens (measured on the H200 host: EBADF); an exporter of a number nobody has there: ESRCH.
    let expandable = row(&exporter, &importer, TORCH_EXPANDABLE);
    assert!(matches!(&expandable.verdict, Verdict::Fails(e) if e.contains("EBADF")), "{expandable:?}");
    assert!(
        expandable.rule.contains("untranslated") && expandable.rule.contains("its own init"),
        "{expandable:?}"
    );
    let mut elsewhere = place(4321);
    elsewhere.namespaces.pid = Some(3);
    let expandable = row(&elsewhere, &importer, TORCH_EXPANDABLE);
    assert!(matches!(&expandable.verdict, Verdict::Fails(e) if e.contains("ESRCH")), "{expandable:?}");
    assert!(expandable.rule.contains("not known from inside"), "{expandable:?}");
    assert_eq!(
        verdict_of(&exporter, &importer, NCCL_P2P),
        Verdict::Works,
        "NCCL needs no shared PID namespace"
    );
    // The same pid number: the driver takes the handle for one of its own.
    importer.pid = 1;
    assert!(matches!(verdict_of(&exporter, &importer, UCX_LEGACY), Verdict::FallsBack(_)));
    assert!(
        matches!(verdict_of(&exporter, &importer, TORCH_LEGACY), Verdict::Fails(e) if e.contains("INVALID_CONTEXT"))
    );
}

/// UCX takes a refused pidfd_getfd as an unreachable peer and another transport, without a word; only its
/// cuMem memory goes so, cudaMalloc memory by legacy handle.
#[test]
fn ucx_falls_back_where_pidfd_getfd_is_refused() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.uid = 1000;
    assert_eq!(verdict_of(&exporter, &importer, UCX_LEGACY), Verdict::Works);
    let cumem = row(&exporter, &importer, UCX_CUMEM);
    assert_eq!(cumem.verdict, Verdict::FallsBack("another UCX transport (TCP, say)".into()), "{cumem:?}");
    assert!(cumem.rule.contains("EPERM"), "{cumem:?}");
    // PyTorch opens the event first, whose file another uid's driver does not find (measured).
    assert!(
        matches!(verdict_of(&exporter, &importer, TORCH_EXPANDABLE), Verdict::Fails(e) if e.contains("legacy event: CUDA_ERROR_MAP_FAILED"))
    );
}

/// A filter is tried, not inferred: a process that fetched its own descriptor has no filter in the way,
/// whatever its seccomp mode; one that was refused has, whatever its capabilities.
#[test]
fn pidfd_getfd_tried_on_itself_outweighs_the_seccomp_mode() {
    let refused = |exporter: &Place, importer: &Place| {
        pidfd_getfd_refused(exporter, importer, &compare(exporter, importer)).map(|r| (r.errno, r.why))
    };
    let (exporter, mut importer) = (place(1), place(2));
    importer.seccomp = Some(2);
    assert!(refused(&exporter, &importer).is_some_and(|r| r.1.contains("Docker's default")), "inferred");
    importer.pidfd_getfd_itself = Some("allowed".into());
    assert_eq!(refused(&exporter, &importer), None, "tried");
    importer.capabilities.sys_ptrace = true;
    importer.pidfd_getfd_itself = Some("EPERM".into());
    assert!(
        refused(&exporter, &importer).is_some_and(|r| r.0 == "EPERM" && r.1.contains("tried it on itself"))
    );
    importer.pidfd_getfd_itself = Some("ENOSYS".into());
    assert_eq!(refused(&exporter, &importer).map(|r| r.0), Some("ENOSYS"));
}

/// After a run, what it measured of a primitive stands in for the forecast: a library row made of it says
/// so, and a row made of other primitives does not change.
#[test]
fn a_measured_primitive_stands_in_for_its_forecast() {
    let (exporter, importer) = (roomy(place(1)), roomy(place(2)));
    let measured = [("legacy event".to_owned(), Verdict::Fails("CUDA_ERROR_MAP_FAILED".into()))];
    let after = rows(&exporter, &importer, &measured);
    let find = |path: &str| after.iter().find(|f| f.path == path).unwrap().clone();
    assert_eq!(
        find(TORCH_EXPANDABLE).verdict,
        Verdict::Fails("its legacy event: CUDA_ERROR_MAP_FAILED, measured".into())
    );
    assert!(matches!(find(TORCH_LEGACY).verdict, Verdict::Fails(e) if e.ends_with(", measured")));
    assert_eq!(find(NCCL_P2P).verdict, Verdict::Works, "NCCL opens no interprocess event");
    assert!(
        find(TORCH_EXPANDABLE).measured && !find(NCCL_P2P).measured,
        "a row says whether it rests on a measure"
    );
    assert!(
        rows(&exporter, &importer, &[]).iter().all(|row| !row.measured),
        "before a run, nothing is measured"
    );
    let worked = [("legacy memory".to_owned(), Verdict::Works)];
    let ucx = rows(&exporter, &importer, &worked).into_iter().find(|f| f.path == UCX_LEGACY).unwrap();
    assert!(ucx.rule.contains("legacy memory: works (measured)"), "{ucx:?}");
}

#[test]
fn another_node_falls_back_to_the_network_or_is_not_known_with_imex() {
    let (mut exporter, mut importer) = (place(1), place(2));
    importer.boot_id = Some("c".into());
    let all = rows(&exporter, &importer, &[]);
    assert_eq!(all.len(), 6);
    assert!(all.iter().all(|f| f.verdict == Verdict::FallsBack("the network".into())), "{all:?}");
    (exporter.imex_channel, importer.imex_channel) = (true, true);
    assert!(rows(&exporter, &importer, &[]).iter().all(|f| f.verdict == Verdict::NotKnown), "never 'fails'");
}

#[test]
fn a_setting_is_the_exporters_where_both_set_it() {
    let (mut exporter, mut importer) = (place(1), place(2));
    set(&mut importer, "NCCL_CUMEM_ENABLE", "0");
    assert_eq!(setting(&exporter, &importer, "NCCL_CUMEM_ENABLE"), Some("0"));
    set(&mut exporter, "NCCL_CUMEM_ENABLE", "1");
    assert_eq!(setting(&exporter, &importer, "NCCL_CUMEM_ENABLE"), Some("1"));
    assert!(off(Some(" 0")) && !off(Some("1")) && !off(None));
}

/// The NCCL a process would load, where it read one, decides the ranges: before 2.19 P2P is legacy IPC
/// (no network namespace needed), before 2.10.3 P2P asks no shared /dev/shm, before 2.24.3 SHM's buffers are
/// /dev/shm files, before 2.29.2 NCCL_IPC_USE_ABSTRACT_SOCKET does not exist.
#[test]
fn the_nccl_version_read_picks_the_range_of_each_rule() {
    let nccl = |v: Version, place: Place| Place { nccl_version: Some(v), ..place };
    let (exporter, mut importer) = (roomy(place(1)), roomy(place(2)));
    importer.namespaces.net = Some(9);
    let old = nccl(Version(2, 18, 6), exporter.clone());
    let p2p = row(&old, &importer, NCCL_P2P);
    assert_eq!(p2p.verdict, Verdict::Works, "{p2p:?}");
    assert!(p2p.rule.contains("NCCL 2.18.6, as read here"), "{p2p:?}");
    assert_eq!(verdict_of(&nccl(Version(2, 23, 4), exporter.clone()), &importer, NCCL_SHM), Verdict::Works);
    let mut named = nccl(Version(2, 28, 9), exporter.clone());
    set(&mut named, "NCCL_IPC_USE_ABSTRACT_SOCKET", "0");
    assert!(
        matches!(verdict_of(&named, &importer, NCCL_P2P), Verdict::Fails(_)),
        "no such setting before 2.29.2"
    );
    let (exporter, mut importer) = (roomy(place(1)), roomy(place(2)));
    importer.dev_shm.as_mut().unwrap().device = 9;
    assert_eq!(verdict_of(&nccl(Version(2, 9, 9), exporter.clone()), &importer, NCCL_P2P), Verdict::Works);
    assert!(matches!(
        verdict_of(&nccl(Version(2, 10, 3), exporter), &importer, NCCL_P2P),
        Verdict::FallsBack(_)
    ));
}
