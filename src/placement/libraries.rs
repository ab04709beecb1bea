//! What the libraries that users run between two containers will do for this pair: NCCL's P2P and SHM
//! transports, UCX's cuda_ipc, PyTorch's CUDA IPC and its `expandable_segments`. Each rule is the code
//! condition of the version named in it, read in its source (docs/placement.md cites file and function);
//! where the library would take a slower path without a word, the forecast says it falls back, to what.

use super::Place;
use super::forecast::{Fix, Forecast, Verdict, dev_shm_fix, fact, pidfd_getfd_refused, same_pid_number_fix};
use super::share::{Fact, Sameness};

fn forecast(path: &str, verdict: Verdict, rule: &str, fix: Option<Fix>) -> Forecast {
    Forecast { path: path.to_owned(), verdict, rule: rule.to_owned(), fix }
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
        option: Some("NCCL_IPC_USE_ABSTRACT_SOCKET=0 with a /tmp both mount".into()),
    }
}

/// The forecast of each library path between `exporter` and `importer`, whose shared facts are `facts`.
pub fn libraries(exporter: &Place, importer: &Place, facts: &[Fact]) -> Vec<Forecast> {
    let (uts, node, shm, net, pid) = (
        fact(facts, "uts_namespace"),
        fact(facts, "boot_id"),
        fact(facts, "dev_shm"),
        fact(facts, "net_namespace"),
        fact(facts, "pid_namespace"),
    );
    let mut out = Vec::new();
    if node == Sameness::Differs {
        let rule = "the boot ids differ: another node, where every library uses its network transport";
        for path in
            ["NCCL P2P", "NCCL SHM", "UCX cuda_ipc", "PyTorch CUDA IPC", "PyTorch expandable_segments"]
        {
            out.push(forecast(path, Verdict::FallsBack("the network".into()), rule, None));
        }
        return out;
    }
    // NCCL 2.30.7: the host hash is the hostname and the boot id (src/misc/utils.cc getHostHashOnce);
    // P2P needs the same host hash and, since 2.24.3, the same /dev/shm (src/graph/paths.cc
    // ncclTopoCheckP2p); its cuMem descriptors travel over an abstract socket (src/os/linux_ipcsocket.cc).
    let nccl_host = match (&exporter.nccl_hostid, &importer.nccl_hostid) {
        (Some(a), Some(b)) => a == b,
        (None, None) => uts == Sameness::Same || exporter.hostname == importer.hostname,
        _ => false,
    };
    let p2p = if !nccl_host {
        forecast(
            "NCCL P2P",
            Verdict::FallsBack("NCCL's NET transport".into()),
            "NCCL 2.30.7 takes two hostnames for two nodes (host hash: hostname + boot id, src/misc/utils.cc)",
            Some(same_host_fix()),
        )
    } else if shm == Sameness::Differs {
        forecast(
            "NCCL P2P",
            Verdict::FallsBack("NCCL's NET transport".into()),
            "NCCL >= 2.24.3 takes P2P only where /dev/shm is one (st_dev, src/graph/paths.cc ncclTopoCheckP2p)",
            Some(dev_shm_fix()),
        )
    } else if net == Sameness::Differs {
        forecast(
            "NCCL P2P",
            Verdict::Fails("the descriptor's abstract socket is not reachable".into()),
            "NCCL's cuMem descriptors (the default) travel over an abstract Unix socket, which only one network \
             namespace reaches (src/os/linux_ipcsocket.cc)",
            Some(same_network_fix()),
        )
    } else {
        forecast(
            "NCCL P2P",
            Verdict::Works,
            "one host hash, one /dev/shm, one network namespace; descriptors by SCM_RIGHTS need no shared PID \
             namespace (NCCL 2.30.7)",
            None,
        )
    };
    out.push(p2p);
    let shm_ok = nccl_host && shm == Sameness::Same;
    out.push(forecast(
        "NCCL SHM",
        if shm_ok { Verdict::Works } else { Verdict::FallsBack("NCCL's NET transport".into()) },
        "NCCL 2.30.7's SHM transport needs one host hash and one /dev/shm (src/transport/shm.cc shmCanConnect)",
        (!shm_ok).then(|| if nccl_host { dev_shm_fix() } else { same_host_fix() }),
    ));
    // UCX: one machine is one boot id (src/ucs/sys/uid.c); master (PR #11514) marks cuda_ipc unreachable
    // across PID namespaces unless both have fabric handles; v1.22.0 tries legacy handles and fails there.
    // Its POSIX descriptors (cuMem memory) are fetched with pidfd_getfd (cuda_ipc_cache.c
    // uct_cuda_ipc_open_memhandle_posix_fd): the container matrix's "VMM fd by pidfd_getfd".
    let pidfd = pidfd_getfd_refused(exporter, importer, facts);
    let ucx = match (pid, &pidfd) {
        (Sameness::Same, Some(refused)) => forecast(
            "UCX cuda_ipc",
            Verdict::Fails(format!("for cuMem memory, pidfd_getfd: {} ({})", refused.why, refused.errno)),
            "one PID namespace, but UCX fetches a POSIX descriptor (cuMem memory) with pidfd_open and \
             pidfd_getfd (cuda_ipc_cache.c uct_cuda_ipc_open_memhandle_posix_fd), which ptrace refuses here \
             (the container matrix's VMM fd by pidfd_getfd); cudaMalloc memory goes by legacy handle",
            Some(refused.fix.clone()),
        ),
        (Sameness::Same, None) => forecast(
            "UCX cuda_ipc",
            Verdict::Works,
            "one PID namespace (UCX v1.22.0 and master), and ptrace allows pidfd_getfd of its POSIX descriptors",
            None,
        ),
        _ if exporter.imex_channel && importer.imex_channel => forecast(
            "UCX cuda_ipc",
            Verdict::NotKnown,
            "different PID namespaces: UCX master takes fabric handles only (PR #11514); not measured here",
            None,
        ),
        _ => forecast(
            "UCX cuda_ipc",
            Verdict::FallsBack("another UCX transport (TCP, say)".into()),
            "different PID namespaces without fabric handles: UCX master marks cuda_ipc unreachable \
             (src/uct/cuda/cuda_ipc/cuda_ipc_iface.c, PR #11514); v1.22.0 fails to open the handle and falls \
             back (vLLM PR #55906)",
            Some(same_pid_number_fix()),
        ),
    };
    out.push(ucx);
    // PyTorch's torch.multiprocessing shares cudaMalloc blocks by legacy IPC, with an interprocess event
    // (c10/cuda/CUDACachingAllocator.cpp shareIpcHandle): the driver's rules, as this program measured them.
    let collide = pid == Sameness::Differs && exporter.pid == importer.pid;
    out.push(if collide {
        forecast(
            "PyTorch CUDA IPC",
            Verdict::Fails("CUDA_ERROR_INVALID_CONTEXT".into()),
            "legacy IPC (cudaIpcOpenMemHandle) between processes of the same pid number in two PID namespaces",
            Some(same_pid_number_fix()),
        )
    } else if shm == Sameness::Differs {
        forecast(
            "PyTorch CUDA IPC",
            Verdict::Fails("CUDA_ERROR_MAP_FAILED".into()),
            "its interprocess event's file lives in the exporter's /dev/shm",
            Some(dev_shm_fix()),
        )
    } else {
        forecast("PyTorch CUDA IPC", Verdict::Works, "legacy IPC: no pid number collides and /dev/shm is one", None)
    });
    // expandable_segments: pidfd_open(exporter's pid) and pidfd_getfd (CUDACachingAllocator.cpp
    // ExpandableSegment::fromShared); pytorch/pytorch#165685.
    // The container matrix's "VMM fd by pidfd_getfd" is this path, measured.
    out.push(match pidfd {
        None => forecast(
            "PyTorch expandable_segments",
            Verdict::Works,
            "pidfd_getfd: the exporter is visible and ptrace allows it (the container matrix's VMM fd by \
             pidfd_getfd)",
            None,
        ),
        Some(refused) => forecast(
            "PyTorch expandable_segments",
            Verdict::Fails(format!("pidfd_getfd: {} ({})", refused.why, refused.errno)),
            "PyTorch fetches the exporter's descriptor with pidfd_open and pidfd_getfd (CUDACachingAllocator.cpp \
             ExpandableSegment::fromShared), as the container matrix's VMM fd by pidfd_getfd does",
            Some(refused.fix),
        ),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::share::compare;
    use crate::placement::share::tests::place;

    fn verdict_of(exporter: &Place, importer: &Place, path: &str) -> Verdict {
        let all = libraries(exporter, importer, &compare(exporter, importer));
        all.into_iter().find(|f| f.path == path).map(|f| f.verdict).unwrap()
    }

    #[test]
    fn two_hostnames_send_nccl_to_its_network_transport() {
        let (exporter, mut importer) = (place(1), place(2));
        assert_eq!(verdict_of(&exporter, &importer, "NCCL P2P"), Verdict::Works);
        importer.namespaces.uts = Some(4);
        importer.hostname = "other".into();
        assert!(matches!(verdict_of(&exporter, &importer, "NCCL P2P"), Verdict::FallsBack(_)));
        assert!(matches!(verdict_of(&exporter, &importer, "NCCL SHM"), Verdict::FallsBack(_)));
        assert_eq!(
            verdict_of(&exporter, &importer, "UCX cuda_ipc"),
            Verdict::Works,
            "UCX asks the boot id only"
        );
        let (mut exporter, mut importer) = (exporter, importer);
        exporter.nccl_hostid = Some("node-7".into());
        importer.nccl_hostid = Some("node-7".into());
        assert_eq!(
            verdict_of(&exporter, &importer, "NCCL P2P"),
            Verdict::Works,
            "one NCCL_HOSTID is one host"
        );
        importer.nccl_hostid = None;
        assert!(matches!(verdict_of(&exporter, &importer, "NCCL P2P"), Verdict::FallsBack(_)));
    }

    #[test]
    fn another_dev_shm_or_network_namespace_breaks_ncclp2p() {
        let (exporter, mut importer) = (place(1), place(2));
        importer.dev_shm.as_mut().unwrap().device = 9;
        assert!(matches!(verdict_of(&exporter, &importer, "NCCL P2P"), Verdict::FallsBack(_)));
        assert_eq!(
            verdict_of(&exporter, &importer, "PyTorch CUDA IPC"),
            Verdict::Fails("CUDA_ERROR_MAP_FAILED".into())
        );
        let mut importer = place(2);
        importer.namespaces.net = Some(9);
        assert!(matches!(verdict_of(&exporter, &importer, "NCCL P2P"), Verdict::Fails(_)));
        assert_eq!(verdict_of(&exporter, &importer, "NCCL SHM"), Verdict::Works);
    }

    #[test]
    fn pid_namespaces_decide_ucx_and_pytorch() {
        let (exporter, mut importer) = (place(1), place(1));
        importer.namespaces.pid = Some(9);
        assert!(matches!(verdict_of(&exporter, &importer, "UCX cuda_ipc"), Verdict::FallsBack(_)));
        assert_eq!(
            verdict_of(&exporter, &importer, "PyTorch CUDA IPC"),
            Verdict::Fails("CUDA_ERROR_INVALID_CONTEXT".into())
        );
        assert!(
            matches!(verdict_of(&exporter, &importer, "PyTorch expandable_segments"), Verdict::Fails(e) if e.contains("ESRCH"))
        );
        assert_eq!(
            verdict_of(&exporter, &importer, "NCCL P2P"),
            Verdict::Works,
            "NCCL needs no shared PID namespace"
        );
    }

    #[test]
    fn pidfd_getfd_needs_ptrace_as_the_kernel_and_seccomp_grant_it() {
        let refused = |exporter: &Place, importer: &Place| {
            pidfd_getfd_refused(exporter, importer, &compare(exporter, importer)).map(|r| (r.errno, r.why))
        };
        let (mut exporter, mut importer) = (place(1), place(2));
        importer.ptrace_scope = Some(1);
        assert!(refused(&exporter, &importer).unwrap().1.contains("ptrace_scope"));
        importer.ptrace_scope = Some(0);
        assert_eq!(refused(&exporter, &importer), None);
        importer.uid = 1000;
        assert_eq!(refused(&exporter, &importer).unwrap(), ("EPERM", "another uid, and no CAP_SYS_PTRACE"));
        importer.capabilities.sys_ptrace = true;
        assert_eq!(refused(&exporter, &importer), None);
        importer.seccomp = Some(2);
        assert_eq!(refused(&exporter, &importer), None, "with the capability");
        importer.capabilities.sys_ptrace = false;
        assert!(refused(&exporter, &importer).unwrap().1.contains("seccomp"));
        // Root without CAP_SYS_PTRACE, the exporter with it (setpriv --bounding-set -sys_ptrace).
        let mut importer = place(2);
        exporter.capabilities.sys_ptrace = true;
        assert!(refused(&exporter, &importer).unwrap().1.contains("holds capabilities the importer lacks"));
        // Its capabilities in a user namespace of its own do not count towards the exporter's.
        importer.capabilities.sys_ptrace = true;
        importer.in_user_namespace = true;
        importer.namespaces.user = Some(77);
        let (errno, why) = refused(&exporter, &importer).unwrap();
        assert!(errno == "EPERM" && why.contains("user namespace of its own"), "{why}");
        importer.namespaces.pid = Some(9);
        assert_eq!(refused(&exporter, &importer).unwrap().0, "ESRCH", "not visible comes first");
        assert!(
            matches!(verdict_of(&exporter, &importer, "PyTorch expandable_segments"), Verdict::Fails(e) if e.ends_with("(ESRCH)"))
        );
    }

    #[test]
    fn ucx_fetches_its_posix_descriptors_by_pidfd_getfd() {
        let (exporter, mut importer) = (place(1), place(2));
        assert_eq!(verdict_of(&exporter, &importer, "UCX cuda_ipc"), Verdict::Works);
        importer.uid = 1000;
        assert!(
            matches!(verdict_of(&exporter, &importer, "UCX cuda_ipc"), Verdict::Fails(e) if e.contains("pidfd_getfd") && e.ends_with("(EPERM)"))
        );
    }
}
