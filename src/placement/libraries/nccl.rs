//! NCCL's two transports within a node, P2P and SHM, as recipes: the host hash and /dev/shm gates it applies
//! before either is tried, the abstract socket its cuMem descriptors take, and the version ranges where an
//! older NCCL answers otherwise (docs/placement.md cites each in NCCL's sources).

use super::super::Place;
use super::super::forecast::{Fix, Forecast, Verdict, dev_shm_fix, fact};
use super::super::share::{Fact, Sameness};
use super::super::versions::Version;
use super::{NCCL_P2P, NCCL_SHM, Primitives, Recipe, forecast, from_primitives, off, setting};

fn shm_room_fix() -> Fix {
    Fix {
        docker: "--shm-size=1g".into(),
        kubernetes: "an emptyDir of medium: Memory, sizeLimit: 1Gi, mounted at /dev/shm".into(),
        option: None,
    }
}

fn same_host_fix() -> Fix {
    Fix {
        docker: "--uts=container:NAME (one hostname), or the same NCCL_HOSTID in both".into(),
        kubernetes:
            "both containers in one pod (they share its hostname), or the same NCCL_HOSTID env in both".into(),
        option: Some("NCCL_HOSTID=<one value> in both (only on one node)".into()),
    }
}

fn same_network_fix() -> Fix {
    Fix {
        docker: "--network=container:NAME".into(),
        kubernetes: "both containers in one pod (one network namespace)".into(),
        option: Some("NCCL_IPC_USE_ABSTRACT_SOCKET=0 (NCCL >= 2.29.2) with a /tmp both mount".into()),
    }
}

/// The NCCL the pair would run: the exporter's where it read one, else the importer's (`None`: the newest
/// release, whose sources the rules were read in).
fn nccl_version(exporter: &Place, importer: &Place) -> Option<Version> {
    exporter.nccl_version.or(importer.nccl_version)
}

/// Whether the pair's NCCL is `at_least` (the newest release is).
fn nccl_at_least(exporter: &Place, importer: &Place, at_least: Version) -> bool {
    nccl_version(exporter, importer).is_none_or(|v| v >= at_least)
}

/// Which NCCL a row speaks of, for its rule.
fn nccl_said(exporter: &Place, importer: &Place) -> String {
    match nccl_version(exporter, importer) {
        Some(v) => format!("NCCL {v}, as read here"),
        None => "NCCL 2.30.7 assumed (no libnccl.so.2 found here)".to_owned(),
    }
}

/// NCCL's host hash: the hostname and the boot id, or `NCCL_HOSTID` alone where it is set (src/misc/
/// utils.cc getHostHash, since 2.5.6; 2.4.x hashed the UTS and mount namespaces' inodes instead of the
/// boot id, 2.3.x the UTS namespace's).
fn nccl_one_host(exporter: &Place, importer: &Place, facts: &[Fact]) -> bool {
    // Before 2.5.6 the hash took the namespaces' inodes (2.4.x the UTS and mount namespaces', 2.3.x the
    // UTS namespace's) and no NCCL_HOSTID: two containers were two hosts.
    if let Some(version) = nccl_version(exporter, importer).filter(|v| *v < Version(2, 5, 6)) {
        let uts = fact(facts, "uts_namespace") == Sameness::Same;
        let mnt = fact(facts, "mnt_namespace") == Sameness::Same;
        return uts && (mnt || version < Version(2, 4, 0));
    }
    let hostid = |p: &Place| p.settings.iter().find(|(n, _)| n == "NCCL_HOSTID").map(|(_, v)| v.clone());
    match (
        hostid(exporter).or(exporter.nccl_hostid.clone()),
        hostid(importer).or(importer.nccl_hostid.clone()),
    ) {
        (Some(a), Some(b)) => a == b,
        (None, None) => {
            fact(facts, "uts_namespace") == Sameness::Same || exporter.hostname == importer.hostname
        }
        _ => false,
    }
}

/// NCCL's gates before either transport is tried: one host hash (or MNNVL), one /dev/shm.
fn nccl_gates(path: &str, exporter: &Place, importer: &Place, facts: &[Fact]) -> Option<Forecast> {
    let net = || Verdict::FallsBack("NCCL's NET transport".into());
    if !nccl_one_host(exporter, importer, facts) {
        if exporter.imex_channel && importer.imex_channel {
            return Some(forecast(
                path,
                Verdict::NotKnown,
                "two host hashes, but both have an IMEX channel: NCCL >= 2.20.3 may join them by MNNVL over fabric \
                 handles (src/mnnvl.cc ncclMnnvlCheck), which was not measured here"
                    .into(),
                None,
            ));
        }
        let rule = match nccl_version(exporter, importer).filter(|v| *v < Version(2, 5, 6)) {
            Some(v) => format!(
                "NCCL {v} (before 2.5.6) hashed the UTS and mount namespaces' inodes into its host hash (2.3.x the UTS \
                 namespace's alone; src/misc/utils.cc getHostHash): two containers are two nodes to it"
            ),
            None => "NCCL takes two hostnames for two nodes (host hash: hostname + boot id, or NCCL_HOSTID; \
                     src/misc/utils.cc getHostHash, NCCL >= 2.5.6)"
                .into(),
        };
        return Some(forecast(path, net(), rule, Some(same_host_fix())));
    }
    // P2P has asked for one /dev/shm since 2.10.3 (src/transport/p2p.cc:57), SHM always.
    let shm_gated = path != NCCL_P2P || nccl_at_least(exporter, importer, Version(2, 10, 3));
    match fact(facts, "dev_shm") {
        Sameness::Differs if !shm_gated => None,
        Sameness::Differs => Some(forecast(
            path,
            net(),
            format!(
                "NCCL takes {path} only where /dev/shm is one (st_dev; src/init.cc fillInfo; the P2P check since \
                 2.10.3, in src/graph/paths.cc ncclTopoCheckP2p since 2.24.3; SHM's in src/transport/shm.cc \
                 shmCanConnect)"
            ),
            Some(dev_shm_fix()),
        )),
        Sameness::Unknown => {
            Some(forecast(path, Verdict::NotKnown, "/dev/shm could not be read".into(), None))
        }
        Sameness::Same => None,
    }
}

/// NCCL's cuMem descriptors travel over an abstract Unix socket, which only one network namespace reaches
/// (src/os/linux_ipcsocket.cc; `NCCL_IPC_USE_ABSTRACT_SOCKET=0`, from 2.29.2, makes it a path in /tmp).
fn nccl_socket_gate(path: &str, exporter: &Place, importer: &Place, facts: &[Fact]) -> Option<Forecast> {
    let named = off(setting(exporter, importer, "NCCL_IPC_USE_ABSTRACT_SOCKET"))
        && nccl_at_least(exporter, importer, Version(2, 29, 2));
    match (fact(facts, "net_namespace"), named) {
        (Sameness::Same, _) => None,
        (Sameness::Differs, true) => Some(forecast(
            path,
            Verdict::NotKnown,
            "NCCL_IPC_USE_ABSTRACT_SOCKET=0 (NCCL >= 2.29.2): the descriptors' socket is a path under /tmp, \
             which works only where both mount one /tmp (not read here)"
                .into(),
            None,
        )),
        (Sameness::Differs, false) => Some(forecast(
            path,
            Verdict::Fails("the descriptors' abstract socket is not reachable".into()),
            "NCCL's cuMem descriptors travel over an abstract Unix socket (SCM_RIGHTS), which only one network \
             namespace reaches (src/os/linux_ipcsocket.cc, src/proxy.cc); a failed import is an error, not a \
             fallback"
                .into(),
            Some(same_network_fix()),
        )),
        (Sameness::Unknown, _) => {
            Some(forecast(path, Verdict::NotKnown, "the network namespace could not be read".into(), None))
        }
    }
}

pub(super) fn nccl_p2p(
    exporter: &Place,
    importer: &Place,
    facts: &[Fact],
    primitives: &Primitives,
) -> Forecast {
    if setting(exporter, importer, "NCCL_P2P_DISABLE").is_some_and(|v| v.trim() == "1") {
        return forecast(
            NCCL_P2P,
            Verdict::FallsBack("NCCL's SHM or NET transport".into()),
            "NCCL_P2P_DISABLE=1 sets the P2P level to LOC (src/graph/paths.cc ncclGetUserP2pLevel)".into(),
            None,
        );
    }
    if let Some(gated) = nccl_gates(NCCL_P2P, exporter, importer, facts) {
        return gated;
    }
    // The exporter's NCCL_CUMEM_ENABLE decides the handle (src/misc/cudawrap.cc ncclCuMemEnable: 0 in 2.18,
    // on where the driver has VMM from 2.19.1).
    let before_cumem = !nccl_at_least(exporter, importer, Version(2, 19, 0));
    if off(setting(exporter, importer, "NCCL_CUMEM_ENABLE")) || before_cumem {
        let recipe = Recipe {
            path: NCCL_P2P,
            versions: "NCCL_CUMEM_ENABLE=0, or NCCL < 2.19",
            primitives: vec!["legacy memory"],
            falls_back_to: None,
            source: "cudaIpcGetMemHandle / cudaIpcOpenMemHandle (src/transport/p2p.cc p2pMap, legacy CUDA IPC); \
                     no interprocess event",
        };
        let why =
            format!("NCCL_CUMEM_ENABLE=0 or NCCL < 2.19 ({}): legacy IPC", nccl_said(exporter, importer));
        return from_primitives(&recipe, primitives, &why);
    }
    if let Some(gated) = nccl_socket_gate(NCCL_P2P, exporter, importer, facts) {
        return gated;
    }
    let recipe = Recipe {
        path: NCCL_P2P,
        versions: "NCCL >= 2.19 with cuMem (the default where the driver has VMM)",
        primitives: vec!["VMM fd"],
        falls_back_to: None,
        source: "cuMem POSIX descriptors handed over by the exporter's proxy (src/transport/p2p.cc \
                 ncclP2pImportShareableBuffer); NCCL needs no shared PID namespace",
    };
    let why =
        format!("one host hash, one /dev/shm, one network namespace ({})", nccl_said(exporter, importer));
    from_primitives(&recipe, primitives, &why)
}

/// What NCCL's SHM transport needs of /dev/shm where its buffers are files there: room for them (a failed
/// `fallocate` is an error, not a fallback: src/os/linux.cc ncclShmOpen, NCCL >= 2.19.1).
const NCCL_SHM_ROOM: u64 = 512 << 20;

pub(super) fn nccl_shm(
    exporter: &Place,
    importer: &Place,
    facts: &[Fact],
    primitives: &Primitives,
) -> Forecast {
    if setting(exporter, importer, "NCCL_SHM_DISABLE").is_some_and(|v| v.trim() == "1") {
        return forecast(
            NCCL_SHM,
            Verdict::FallsBack("NCCL's NET transport".into()),
            "NCCL_SHM_DISABLE=1 (src/transport/shm.cc shmCanConnect)".into(),
            None,
        );
    }
    if let Some(gated) = nccl_gates(NCCL_SHM, exporter, importer, facts) {
        return gated;
    }
    // cuMem host memory (NCCL >= 2.24.3 with a driver >= 12.6, unless NCCL_CUMEM_HOST_ENABLE=0 or cuMem is
    // off): its descriptors take NCCL's IPC socket. From 2.26.3 NCCL falls back to /dev/shm files where
    // cuMemCreate on host NUMA fails (a container without SYS_NICE: get_mempolicy refused).
    let cumem_host = !off(setting(exporter, importer, "NCCL_CUMEM_ENABLE"))
        && !off(setting(exporter, importer, "NCCL_CUMEM_HOST_ENABLE"))
        && nccl_at_least(exporter, importer, Version(2, 24, 3));
    let numa_refused = [exporter, importer].iter().any(|p| p.seccomp == Some(2) && !p.capabilities.sys_nice);
    if cumem_host && !numa_refused {
        if let Some(gated) = nccl_socket_gate(NCCL_SHM, exporter, importer, facts) {
            return forecast(
                NCCL_SHM,
                gated.verdict,
                format!(
                    "{} (NCCL >= 2.24.3 with a driver >= 12.6 puts SHM buffers in cuMem host memory, whose \
                     descriptors take this socket: src/transport/shm.cc; older NCCL uses /dev/shm files)",
                    gated.rule
                ),
                gated.fix,
            );
        }
        let recipe = Recipe {
            path: NCCL_SHM,
            versions: "NCCL >= 2.24.3 with a driver >= 12.6 (NCCL_CUMEM_HOST_ENABLE unset or 1)",
            primitives: vec!["VMM fd"],
            falls_back_to: None,
            source: "cuMem host memory exported as a POSIX descriptor and handed over by the exporter's proxy \
                     (src/transport/shm.cc: ncclCuMemHostAlloc, ncclProxyClientGetFdBlocking), the driver's \
                     descriptor path of VMM memory, on the host",
        };
        return from_primitives(&recipe, primitives, "one host hash, one /dev/shm, one network namespace");
    }
    let room = [exporter, importer].iter().filter_map(|p| p.dev_shm.as_ref()).map(|s| s.free_bytes).min();
    let fallocates = nccl_at_least(exporter, importer, Version(2, 19, 1));
    match room {
        Some(free) if free < NCCL_SHM_ROOM && !fallocates => forecast(
            NCCL_SHM,
            Verdict::NotKnown,
            format!(
                "its buffers are files in /dev/shm, which has {} MiB free: {} (before 2.19.1) only ftruncates them, so \
                 a /dev/shm too small is met later, as SIGBUS where a page cannot be had (src/misc/shmutils.cc)",
                free >> 20,
                nccl_said(exporter, importer)
            ),
            Some(shm_room_fix()),
        ),
        Some(free) if free < NCCL_SHM_ROOM => forecast(
            NCCL_SHM,
            Verdict::NotKnown,
            format!(
                "its buffers are files in /dev/shm, which has {} MiB free (Docker's default is 64 MiB): NCCL's \
                 buffers for several channels may not fit, and a failed fallocate is an error, not a fallback \
                 (src/os/linux.cc ncclShmOpen, NCCL >= 2.19.1)",
                free >> 20
            ),
            Some(shm_room_fix()),
        ),
        Some(_) => forecast(
            NCCL_SHM,
            Verdict::Works,
            format!(
                "one host hash and one /dev/shm with room, its buffers as files there ({}; src/transport/shm.cc \
                 shmCanConnect)",
                if numa_refused {
                    "cuMem host memory refused without SYS_NICE under seccomp: NCCL >= 2.26.3 falls back to \
                     /dev/shm files, 2.24.3 to 2.26.2 fail"
                } else {
                    "cuMem host memory off"
                }
            ),
            None,
        ),
        None => forecast(NCCL_SHM, Verdict::NotKnown, "/dev/shm could not be read".into(), None),
    }
}
