//! What the libraries that users run between two containers will do for this pair: NCCL's P2P and SHM
//! transports, UCX's cuda_ipc, PyTorch's CUDA IPC and its `expandable_segments`. Each library path is a
//! [`Recipe`]: the primitives it is made of (the container matrix's columns: legacy memory, legacy event,
//! a descriptor over a socket or by `pidfd_getfd`, fabric), for a version range and its settings, behind the
//! gates the library applies itself (host hash, /dev/shm identity, its own switches), each read in its
//! source (docs/placement.md cites file and line at a tag). A row's verdict is computed from its
//! primitives': forecast ones before a run, the run's measured ones after it ([`Primitives`]). Where the
//! library takes a slower path without a word, the row says it falls back, to what; where it rests on
//! something nobody measured, it says "not known", never "works".

use super::Place;
use super::forecast::{
    EXPORTERS_NUMBER_THERE, Fix, Forecast, Verdict, dev_shm_fix, fact, same_pid_number_fix,
};
use super::share::{Fact, Sameness};
use super::versions::Version;

/// The settings in a process's environment that change a library's path: read by `Place::here`, carried
/// with the place, and named in the rule of every row they change.
pub const SETTINGS: [&str; 9] = [
    "NCCL_CUMEM_ENABLE",
    "NCCL_CUMEM_HOST_ENABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_HOSTID",
    "NCCL_IPC_USE_ABSTRACT_SOCKET",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC",
    "UCX_TLS",
];

/// The newest releases whose sources the rules were read in (docs/placement.md); a rule names the range
/// where an older one answers otherwise.
pub const READ_IN: &str = "NCCL 2.30.7, UCX 1.22.0 (and master 9466d104a3), PyTorch 2.11";

/// What a library path is made of, and how the library takes a failure of it.
pub struct Recipe {
    pub path: &'static str,
    /// The versions the recipe holds for, and where it came from.
    pub versions: &'static str,
    /// The primitives, by the container matrix's column names (`forecast::PATHS`).
    pub primitives: Vec<&'static str>,
    /// What the library does where a primitive fails: `None`, it fails (an error the user sees); else the
    /// transport it takes instead, without a word.
    pub falls_back_to: Option<&'static str>,
    pub source: &'static str,
}

/// The verdict of each primitive for the pair: the forecast's, or (after a run) what the run measured of
/// the primitives it took, which then stands in for the forecast.
pub struct Primitives<'a> {
    pub forecast: &'a [Forecast],
    /// Each primitive the run took, and what it saw: works, or the error it met.
    pub measured: &'a [(String, Verdict)],
}

impl Primitives<'_> {
    /// The verdict of `primitive`, and whether it was measured (not forecast).
    fn of(&self, primitive: &str) -> (Verdict, bool) {
        if let Some((_, seen)) = self.measured.iter().find(|(path, _)| path == primitive) {
            return (seen.clone(), true);
        }
        let forecast = self.forecast.iter().find(|f| f.path == primitive);
        (forecast.map_or(Verdict::NotKnown, |f| f.verdict.clone()), false)
    }
}

/// A setting of the pair: the exporter's where it set it, else the importer's (each process of a library
/// reads its own; a pair that disagrees is misconfigured, and the exporter decides what it exports).
fn setting<'a>(exporter: &'a Place, importer: &'a Place, name: &str) -> Option<&'a str> {
    let of = |place: &'a Place| place.settings.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    of(exporter).or_else(|| of(importer))
}

fn forecast(path: &str, verdict: Verdict, rule: String, fix: Option<Fix>) -> Forecast {
    Forecast { path: path.to_owned(), verdict, rule, fix, measured: false }
}

/// `recipe`'s row: its primitives' verdicts combined (a failure of any is the recipe's, as the library
/// takes it; then "not known" where any is), with `why` (its gates passed, its settings) before them.
fn from_primitives(recipe: &Recipe, primitives: &Primitives, why: &str) -> Forecast {
    let mut failed = None;
    let mut unknown = Vec::new();
    let mut said = Vec::new();
    for &primitive in &recipe.primitives {
        let (verdict, measured) = primitives.of(primitive);
        let how = if measured { "measured" } else { "forecast" };
        match &verdict {
            Verdict::Fails(error) if failed.is_none() => {
                // The least change is the failing primitive's, as its own forecast says it.
                let fix =
                    primitives.forecast.iter().find(|f| f.path == primitive).and_then(|f| f.fix.clone());
                failed = Some((format!("its {primitive}: {error}, {how}"), fix));
            }
            Verdict::Works => said.push(format!("{primitive}: works ({how})")),
            Verdict::NotKnown => unknown.push(primitive),
            _ => {}
        }
    }
    let rule = format!(
        "{why}; {} ({}) is made of {}; {}",
        recipe.path,
        recipe.versions,
        recipe.primitives.join(" + "),
        recipe.source
    );
    let measured = recipe.primitives.iter().any(|primitive| primitives.of(primitive).1);
    let row = match (failed, unknown.as_slice()) {
        (Some((failure, fix)), _) => match recipe.falls_back_to {
            None => forecast(recipe.path, Verdict::Fails(failure), rule, fix),
            Some(to) => forecast(
                recipe.path,
                Verdict::FallsBack(to.into()),
                format!("{failure}, which the library takes as unreachable; {rule}"),
                fix,
            ),
        },
        (None, []) => {
            let rule = if said.is_empty() { rule } else { format!("{rule} ({})", said.join(", ")) };
            forecast(recipe.path, Verdict::Works, rule, None)
        }
        (None, unknown) => forecast(
            recipe.path,
            Verdict::NotKnown,
            format!("rests on {}, which nobody measured for this pair; {rule}", unknown.join(", ")),
            None,
        ),
    };
    Forecast { measured, ..row }
}

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

/// Whether a setting says "off" as the libraries read it (`0`).
fn off(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim() == "0")
}

/// The forecast of each library path between `exporter` and `importer`, whose shared facts are `facts`
/// and whose primitives' verdicts are `primitives`.
pub fn libraries(
    exporter: &Place,
    importer: &Place,
    facts: &[Fact],
    primitives: &Primitives,
) -> Vec<Forecast> {
    let node = fact(facts, "boot_id");
    if node == Sameness::Differs {
        let rule = "the boot ids differ: another node, where every library uses its network transport (or, with \
                    an IMEX channel on both, fabric handles, which NCCL's MNNVL and PyTorch >= 2.8 use: not known \
                    here)";
        let both_imex = exporter.imex_channel && importer.imex_channel;
        return [NCCL_P2P, NCCL_SHM, UCX_LEGACY, UCX_CUMEM, TORCH_LEGACY, TORCH_EXPANDABLE]
            .into_iter()
            .map(|path| {
                let verdict =
                    if both_imex { Verdict::NotKnown } else { Verdict::FallsBack("the network".into()) };
                forecast(path, verdict, rule.into(), None)
            })
            .collect();
    }
    vec![
        nccl_p2p(exporter, importer, facts, primitives),
        nccl_shm(exporter, importer, facts, primitives),
        ucx(exporter, importer, facts, primitives, false),
        ucx(exporter, importer, facts, primitives, true),
        torch_legacy(primitives),
        torch_expandable(exporter, importer, facts, primitives),
    ]
}

const NCCL_P2P: &str = "NCCL P2P";
const NCCL_SHM: &str = "NCCL SHM";
const UCX_LEGACY: &str = "UCX cuda_ipc";
const UCX_CUMEM: &str = "UCX cuda_ipc, cuMem memory";
const TORCH_LEGACY: &str = "PyTorch CUDA IPC";
const TORCH_EXPANDABLE: &str = "PyTorch expandable_segments";

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

fn nccl_p2p(exporter: &Place, importer: &Place, facts: &[Fact], primitives: &Primitives) -> Forecast {
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

fn nccl_shm(exporter: &Place, importer: &Place, facts: &[Fact], primitives: &Primitives) -> Forecast {
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

/// Whether `UCX_TLS` leaves cuda_ipc out (`UCX_TLS=tcp`, or `^cuda_ipc`).
fn ucx_tls_excludes_cuda_ipc(tls: &str) -> bool {
    let (negated, list) = match tls.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, tls),
    };
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    let named = names.iter().any(|n| matches!(*n, "cuda_ipc" | "cuda" | "all"));
    if negated { names.contains(&"cuda_ipc") || names.contains(&"cuda") } else { !named }
}

fn ucx(exporter: &Place, importer: &Place, facts: &[Fact], primitives: &Primitives, cumem: bool) -> Forecast {
    let path = if cumem { UCX_CUMEM } else { UCX_LEGACY };
    let other = "another UCX transport (TCP, say)";
    if let Some(tls) = setting(exporter, importer, "UCX_TLS").filter(|tls| ucx_tls_excludes_cuda_ipc(tls)) {
        return forecast(
            path,
            Verdict::FallsBack(format!("the transports UCX_TLS={tls} names")),
            "UCX_TLS leaves cuda_ipc out".into(),
            None,
        );
    }
    let pid = fact(facts, "pid_namespace");
    if cumem {
        // v1.22.0 (the first with POSIX descriptors, PR #11653) refuses them across PID namespaces at import
        // and takes any refusal of pidfd_getfd as unreachable (cuda_ipc_cache.c
        // uct_cuda_ipc_open_memhandle_posix_fd; cuda_ipc_md.c uct_cuda_ipc_is_peer_accessible).
        let recipe = Recipe {
            path,
            versions: "UCX >= 1.22.0 (older UCX has no POSIX descriptors: cuMem memory takes another transport)",
            primitives: vec!["VMM fd by pidfd_getfd"],
            falls_back_to: Some(other),
            source: "cuMem memory that is neither legacy- nor fabric-exportable goes as a POSIX descriptor that \
                     the importer fetches with pidfd_open and pidfd_getfd (src/uct/cuda/cuda_ipc/cuda_ipc_md.c, \
                     cuda_ipc_cache.c); a refusal is logged at debug level and the rkey dropped: silent",
        };
        return from_primitives(&recipe, primitives, "one boot id (src/ucs/sys/uid.c ucs_get_system_id)");
    }
    // cudaMalloc memory by legacy handle: v1.22.0 tries it across PID namespaces (works unless the pid
    // numbers collide); master (PR #11514, in no release yet) takes other PID namespaces as unreachable
    // unless both have fabric handles; 1.13 to 1.20 took an equal pid number for the same process, and
    // <= 1.12 another hostname or network namespace (a MAC address) for another machine.
    let recipe = Recipe {
        path,
        versions: "UCX 1.22.0",
        primitives: vec!["legacy memory"],
        falls_back_to: Some(other),
        source: "cudaMalloc memory by cuIpcOpenMemHandle, tried at rkey unpack and dropped silently if refused \
                 (src/uct/cuda/cuda_ipc/cuda_ipc_md.c uct_cuda_ipc_is_peer_accessible); UCX master (PR #11514, \
                 unreleased) falls back across PID namespaces without fabric handles; <= 1.12 takes another \
                 hostname or network namespace for another machine",
    };
    let why = match pid {
        Sameness::Differs => {
            "one boot id; other PID namespaces, which UCX 1.22.0 does not check for legacy handles"
        }
        _ => "one boot id (src/ucs/sys/uid.c ucs_get_system_id)",
    };
    from_primitives(&recipe, primitives, why)
}

/// torch.multiprocessing shares cudaMalloc blocks by legacy IPC, with an interprocess event the importer
/// opens first (torch/csrc/StorageSharing.cpp THPStorage_shareCuda and _newSharedCuda;
/// c10/cuda/CUDACachingAllocator.cpp shareIpcHandle).
fn torch_legacy(primitives: &Primitives) -> Forecast {
    let recipe = Recipe {
        path: TORCH_LEGACY,
        versions: "PyTorch, every version with torch.multiprocessing's CUDA sharing",
        primitives: vec!["legacy memory", "legacy event"],
        falls_back_to: None,
        source: "cudaIpcGetMemHandle and cudaIpcGetEventHandle (c10/cuda/CUDACachingAllocator.cpp shareIpcHandle, \
                 torch/csrc/StorageSharing.cpp); its reference counter, a file in /dev/shm, fails silently \
                 (torch/csrc/CudaIPCTypes.cpp)",
    };
    from_primitives(&recipe, primitives, "the default allocator")
}

/// `expandable_segments`' shares (PyTorch >= 2.5, PR #130890) carry the legacy interprocess event too, and
/// their memory as a POSIX descriptor that the importer fetches by `pidfd_open(the exporter's own pid)`,
/// untranslated; from about 2.8 (PR #156074), as a fabric handle where both have an IMEX channel.
fn torch_expandable(exporter: &Place, importer: &Place, facts: &[Fact], primitives: &Primitives) -> Forecast {
    let fabric = exporter.imex_channel && importer.imex_channel;
    let memory = if fabric { "fabric" } else { "VMM fd by pidfd_getfd" };
    let asked = [exporter, importer].iter().any(|p| {
        p.settings.iter().any(|(n, v)| {
            n == "PYTORCH_CUDA_ALLOC_CONF" && v.replace(' ', "").contains("expandable_segments:True")
        })
    });
    let recipe = Recipe {
        path: TORCH_EXPANDABLE,
        versions: "PyTorch >= 2.5 (PR #130890); fabric handles from about 2.8 (PR #156074)",
        primitives: vec!["legacy event", memory],
        falls_back_to: None,
        source: "ExpandableSegment::share and ::fromShared (c10/cuda/CUDACachingAllocator.cpp: \
                 pidfd_open(header.pid), pidfd_getfd, cuMemImportFromShareableHandle), the event from \
                 THPStorage_shareCuda (torch/csrc/StorageSharing.cpp)",
    };
    let why = format!(
        "taken where PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True ({})",
        if asked { "set here" } else { "not set in either process" }
    );
    let mut row = from_primitives(&recipe, primitives, &why);
    // The exporter's pid is sent as it sees it: in another PID namespace the importer's pidfd_open finds no
    // process (ESRCH), or another process of that number (EPERM, EBADF or a wrong descriptor).
    if !fabric
        && fact(facts, "pid_namespace") == Sameness::Differs
        && matches!(&row.verdict, Verdict::Fails(e) if e.starts_with("its VMM fd by pidfd_getfd"))
        && !primitives.of(memory).1
    {
        let taken = facts.iter().find(|f| f.fact == EXPORTERS_NUMBER_THERE);
        let (errno, what) = match taken.map(|f| (f.same, f.detail.as_deref())) {
            // Measured on the H200 host (2026-12-07): producer pid 1 in its namespace, consumer pid 2 beside
            // its own pid 1: `pidfd_getfd: Bad file descriptor`.
            Some((Sameness::Same, detail)) => (
                "EBADF",
                format!(
                    "pid {} in the importer's PID namespace is another process ({}): pidfd_open opens that one, and \
                     pidfd_getfd answers EBADF where it has no descriptor of that number (measured on the H200 host, \
                     2026-12-07), EPERM where ptrace refuses it, or fetches that process's descriptor, not the \
                     exporter's",
                    exporter.pid,
                    detail.unwrap_or("its own")
                ),
            ),
            Some((Sameness::Differs, _)) => (
                "ESRCH",
                format!(
                    "no process of the importer's PID namespace is pid {}: pidfd_open finds none",
                    exporter.pid
                ),
            ),
            _ => (
                "ESRCH",
                format!(
                    "pidfd_open({}) in the importer's PID namespace finds no process (ESRCH), or, where a process there \
                     has that number (not known from inside), opens that one (EBADF, EPERM, or its descriptor)",
                    exporter.pid
                ),
            ),
        };
        row.verdict = Verdict::Fails(format!("its VMM fd by pidfd_getfd: {errno}, forecast"));
        row.rule = format!("PyTorch sends the exporter's getpid() untranslated: {what}; {}", row.rule);
        row.fix = Some(same_pid_number_fix());
    }
    row
}

#[cfg(test)]
mod tests;
