//! More of the recipes' unit tests: the version ranges, the settings and the boundaries each rule names.

use super::tests::{roomy, row, rows, set, verdict_of};
use super::*;
use crate::placement::forecast::forecast as handles;
use crate::placement::share::compare;
use crate::placement::share::tests::place;
use crate::placement::versions::Version;

/// NCCL before 2.5.6 hashed the UTS and mount namespaces' inodes (2.3.x the UTS namespace's alone): two
/// containers were two hosts, whatever their hostnames; from 2.5.6 the hostname and boot id decide.
#[test]
fn nccl_before_2_5_6_takes_two_containers_for_two_hosts() {
    let (mut exporter, mut importer) = (roomy(place(1)), roomy(place(2)));
    importer.namespaces.mnt = Some(5);
    exporter.nccl_version = Some(Version(2, 4, 8));
    let p2p = row(&exporter, &importer, NCCL_P2P);
    assert!(matches!(p2p.verdict, Verdict::FallsBack(_)), "{p2p:?}");
    assert!(p2p.rule.contains("NCCL 2.4.8 (before 2.5.6)"), "{p2p:?}");
    exporter.nccl_version = Some(Version(2, 3, 7));
    assert_eq!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::Works, "2.3.x: the UTS namespace alone");
    importer.namespaces.uts = Some(5);
    assert!(matches!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::FallsBack(_)));
    exporter.nccl_version = Some(Version(2, 5, 6));
    assert_eq!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::Works, "one hostname, one boot id");
}

/// A /dev/shm under 512 MiB free: NCCL >= 2.19.1 fails its fallocate (an error); older ones only ftruncate,
/// and meet it later as SIGBUS; 512 MiB is room.
#[test]
fn nccl_shms_room_is_decided_by_its_version() {
    let small = |mut p: Place, free: u64| {
        if let Some(shm) = p.dev_shm.as_mut() {
            (shm.size_bytes, shm.free_bytes) = (free, free);
        }
        set(&mut p, "NCCL_CUMEM_HOST_ENABLE", "0");
        p
    };
    let (exporter, importer) = (small(place(1), 64 << 20), small(place(2), 64 << 20));
    let shm = row(&exporter, &importer, NCCL_SHM);
    assert_eq!(shm.verdict, Verdict::NotKnown, "{shm:?}");
    assert!(shm.rule.contains("fallocate"), "{shm:?}");
    let mut older = exporter.clone();
    older.nccl_version = Some(Version(2, 18, 6));
    let shm = row(&older, &importer, NCCL_SHM);
    assert!(shm.rule.contains("only ftruncates") && shm.rule.contains("SIGBUS"), "{shm:?}");
    let (exporter, importer) = (small(place(1), 512 << 20), small(place(2), 512 << 20));
    assert_eq!(verdict_of(&exporter, &importer, NCCL_SHM), Verdict::Works, "512 MiB is room");
    let (exporter, importer) = (small(place(1), (512 << 20) - 1), small(place(2), 512 << 20));
    assert_eq!(
        verdict_of(&exporter, &importer, NCCL_SHM),
        Verdict::NotKnown,
        "one byte short, on either side"
    );
}

/// PYTORCH_CUDA_ALLOC_CONF says whether expandable segments are taken at all, as either process set it.
#[test]
fn pytorchs_allocator_setting_is_named_in_its_row() {
    let (mut exporter, importer) = (place(1), place(2));
    assert!(row(&exporter, &importer, TORCH_EXPANDABLE).rule.contains("not set in either process"));
    set(&mut exporter, "PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64, expandable_segments:True");
    assert!(row(&exporter, &importer, TORCH_EXPANDABLE).rule.contains("(set here)"));
    let mut importer = importer;
    set(&mut importer, "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True");
    assert!(row(&place(1), &importer, TORCH_EXPANDABLE).rule.contains("(set here)"), "the importer's too");
    let mut off = place(1);
    set(&mut off, "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False");
    assert!(row(&off, &place(2), TORCH_EXPANDABLE).rule.contains("not set in either"));
}

/// UCX 1.22.0 does not check PID namespaces for legacy handles: its rule says so where they differ.
#[test]
fn ucx_says_which_pid_namespaces_it_does_not_check() {
    let (exporter, mut importer) = (place(1), place(2));
    assert!(row(&exporter, &importer, UCX_LEGACY).rule.starts_with("one boot id (src/ucs/sys/uid.c"));
    importer.namespaces.pid = Some(9);
    let ucx = row(&exporter, &importer, UCX_LEGACY);
    assert!(ucx.rule.contains("other PID namespaces, which UCX 1.22.0 does not check"), "{ucx:?}");
}

/// PyTorch's untranslated pid is the row's cause whether or not the run measured its event: a served run
/// whose legacy paths were measured still says EBADF where the importer's own pid 1 stands at the
/// exporter's number (the H200 host's library check found the measured row saying ESRCH).
#[test]
fn the_untranslated_pid_stays_the_cause_after_a_run_measured_the_event() {
    let (exporter, mut importer) = (place(1), place(2));
    importer.namespaces.pid = Some(9);
    let measured =
        [("legacy event".to_owned(), Verdict::Works), ("legacy memory".to_owned(), Verdict::Works)];
    let row = rows(&exporter, &importer, &measured).into_iter().find(|f| f.path == TORCH_EXPANDABLE).unwrap();
    assert!(matches!(&row.verdict, Verdict::Fails(e) if e.contains("EBADF")), "{row:?}");
    assert!(row.measured, "it rests on a measured primitive too");
}

/// Across nodes, fabric handles are only for a pair with an IMEX channel on both: one side's alone sends
/// every library to the network.
#[test]
fn another_node_with_one_imex_channel_falls_back_to_the_network() {
    let (mut exporter, mut importer) = (place(1), place(2));
    importer.boot_id = Some("c".into());
    for (exporter_has, importer_has) in [(true, false), (false, true)] {
        (exporter.imex_channel, importer.imex_channel) = (exporter_has, importer_has);
        let all = rows(&exporter, &importer, &[]);
        assert!(all.iter().all(|f| f.verdict == Verdict::FallsBack("the network".into())), "{all:?}");
    }
}

/// Two host hashes with an IMEX channel on one side only: no MNNVL, NCCL's NET transport.
#[test]
fn nccls_mnnvl_needs_an_imex_channel_on_both() {
    let (mut exporter, mut importer) = (place(1), place(2));
    importer.hostname = "other".into();
    importer.namespaces.uts = Some(4);
    for (exporter_has, importer_has) in [(true, false), (false, true)] {
        (exporter.imex_channel, importer.imex_channel) = (exporter_has, importer_has);
        assert!(matches!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::FallsBack(_)));
    }
}

/// NCCL 2.4.x hashed the mount namespace too (2.4.0 included); two hostnames under NCCL 2.5.6 are said in
/// the words of the hash from 2.5.6 on, not of the older one.
#[test]
fn nccls_host_hash_ranges_start_at_their_first_release() {
    let (mut exporter, mut importer) = (roomy(place(1)), roomy(place(2)));
    importer.namespaces.mnt = Some(5);
    exporter.nccl_version = Some(Version(2, 4, 0));
    assert!(matches!(verdict_of(&exporter, &importer, NCCL_P2P), Verdict::FallsBack(_)), "2.4.0 hashes mnt");
    exporter.nccl_version = Some(Version(2, 5, 6));
    importer.namespaces.uts = Some(5);
    importer.hostname = "other".into();
    let p2p = row(&exporter, &importer, NCCL_P2P);
    assert!(p2p.rule.starts_with("NCCL takes two hostnames for two nodes"), "{p2p:?}");
}

/// NCCL before 2.19.1 only ftruncates its /dev/shm files: a roomy /dev/shm works, and 512 MiB free is room
/// for it too.
#[test]
fn an_older_nccls_shm_files_fit_a_dev_shm_with_room() {
    let older = |mut p: Place, free: u64| {
        if let Some(shm) = p.dev_shm.as_mut() {
            (shm.size_bytes, shm.free_bytes) = (free, free);
        }
        p.nccl_version = Some(Version(2, 18, 6));
        p
    };
    for free in [8 << 30, 512 << 20] {
        let (exporter, importer) = (older(place(1), free), older(place(2), free));
        let shm = row(&exporter, &importer, NCCL_SHM);
        assert_eq!(shm.verdict, Verdict::Works, "{free} bytes free: {shm:?}");
    }
}

/// Fabric handles are PyTorch's only where both have an IMEX channel: one side's alone leaves expandable
/// segments on pidfd_getfd.
#[test]
fn pytorch_takes_fabric_handles_only_with_an_imex_channel_on_both() {
    let (mut exporter, importer) = (place(1), place(2));
    exporter.imex_channel = true;
    let expandable = row(&exporter, &importer, TORCH_EXPANDABLE);
    assert_eq!(expandable.verdict, Verdict::Works, "{expandable:?}");
    assert!(expandable.rule.contains("legacy event + VMM fd by pidfd_getfd"), "{expandable:?}");
}

/// Known from outside that no process of the importer's PID namespace has the exporter's number: PyTorch's
/// pidfd_open finds none (ESRCH), said as known, not as a guess.
#[test]
fn pytorchs_pidfd_open_finds_no_process_where_none_has_the_number() {
    let (exporter, mut importer) = (place(7), place(2));
    importer.namespaces.pid = Some(9);
    let mut facts = compare(&exporter, &importer);
    let taken = facts.iter_mut().find(|f| f.fact == crate::placement::forecast::EXPORTERS_NUMBER_THERE);
    taken.unwrap().same = Sameness::Differs;
    let forecast = handles(&exporter, &importer, &facts);
    let all = libraries(&exporter, &importer, &facts, &Primitives { forecast: &forecast, measured: &[] });
    let expandable = all.into_iter().find(|f| f.path == TORCH_EXPANDABLE).unwrap();
    assert_eq!(expandable.verdict, Verdict::Fails("its VMM fd by pidfd_getfd: ESRCH, forecast".into()));
    assert!(
        expandable.rule.contains("no process of the importer's PID namespace is pid 7"),
        "{expandable:?}"
    );
}
