//! UCX's cuda_ipc and PyTorch's CUDA IPC, default and expandable segments, as recipes: what each is made of,
//! the settings that take it off, and how each takes a refusal (UCX silently, PyTorch as an error).

use super::super::Place;
use super::super::forecast::{EXPORTERS_NUMBER_THERE, Forecast, Verdict, fact, same_pid_number_fix};
use super::super::share::{Fact, Sameness};
use super::{
    Primitives, Recipe, TORCH_EXPANDABLE, TORCH_LEGACY, UCX_CUMEM, UCX_LEGACY, forecast, from_primitives,
    setting,
};

/// Whether `UCX_TLS` leaves cuda_ipc out (`UCX_TLS=tcp`, or `^cuda_ipc`).
pub(super) fn ucx_tls_excludes_cuda_ipc(tls: &str) -> bool {
    let (negated, list) = match tls.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, tls),
    };
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    let named = names.iter().any(|n| matches!(*n, "cuda_ipc" | "cuda" | "all"));
    if negated { names.contains(&"cuda_ipc") || names.contains(&"cuda") } else { !named }
}

pub(super) fn ucx(
    exporter: &Place,
    importer: &Place,
    facts: &[Fact],
    primitives: &Primitives,
    cumem: bool,
) -> Forecast {
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
pub(super) fn torch_legacy(primitives: &Primitives) -> Forecast {
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
pub(super) fn torch_expandable(
    exporter: &Place,
    importer: &Place,
    facts: &[Fact],
    primitives: &Primitives,
) -> Forecast {
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
