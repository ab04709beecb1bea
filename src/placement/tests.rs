use super::*;

#[test]
fn a_namespace_link_gives_its_inode() {
    assert_eq!(parse_namespace_link("pid:[4026531836]"), Some(4026531836));
    assert_eq!(parse_namespace_link("net:[12]"), Some(12));
    assert_eq!(parse_namespace_link("pid:4026531836"), None);
    assert_eq!(parse_namespace_link("pid:[x]"), None);
}

#[test]
fn cuda_visible_devices_keeps_what_it_names_as_the_driver_does() {
    let all: Vec<String> = ["GPU-aaa", "GPU-bbb", "GPU-ccc"].map(String::from).to_vec();
    assert_eq!(visible(&all, None), Some(all.clone()));
    assert_eq!(visible(&all, Some("2,0")), Some(vec!["GPU-ccc".into(), "GPU-aaa".into()]));
    assert_eq!(visible(&all, Some("GPU-bb")), Some(vec!["GPU-bbb".into()]));
    assert_eq!(visible(&all, Some("1,7,0")), Some(vec!["GPU-bbb".into()]), "ends at one that names none");
    assert_eq!(visible(&all, Some("")), Some(vec![]));
    assert_eq!(visible(&all, Some("MIG-1234")), None, "not known");
}

#[test]
fn this_process_reads_its_own_place() {
    let here = Place::here();
    assert_eq!(here.pid, std::process::id());
    let ns = &here.namespaces;
    for (kind, inode) in [("pid", ns.pid), ("net", ns.net), ("mnt", ns.mnt), ("user", ns.user)] {
        let link = std::fs::read_link(format!("/proc/self/ns/{kind}")).unwrap();
        assert_eq!(inode, parse_namespace_link(&link.to_string_lossy()), "{kind}");
        assert!(inode.is_some(), "{kind}");
    }
    let shm = here.dev_shm.expect("/dev/shm is there");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(shm.device, std::fs::metadata("/dev/shm").unwrap().dev());
    assert!(shm.size_bytes >= shm.free_bytes && shm.size_bytes > 0, "{shm:?}");
    assert_eq!(here.uid, nix::unistd::geteuid().as_raw());
    assert_eq!(here.boot_id.as_deref().map(str::len), Some(36), "a boot id is a UUID");
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let root_with_all = status.lines().any(|l| l.starts_with("CapEff:") && l.contains("1ff"));
    if root_with_all {
        assert!(here.capabilities.sys_ptrace && here.capabilities.ipc_lock && here.capabilities.sys_nice);
    }
    let seccomp = status.lines().find(|l| l.starts_with("Seccomp:")).map(|l| l[8..].trim().parse().unwrap());
    assert_eq!(here.seccomp, seccomp);
}

/// Each text of a place is held to what its field can truly hold, named by its field where it is not;
/// this process's own place is within every bound.
#[test]
fn a_place_beyond_what_its_fields_can_hold_is_named_by_its_field() {
    assert_eq!(Place::here().out_of_bounds(), None, "{:?}", Place::here());
    let with = |change: &dyn Fn(&mut Place)| {
        let mut place = Place::here();
        change(&mut place);
        place.out_of_bounds()
    };
    assert_eq!(with(&|p| p.hostname = "h".repeat(64)), None, "HOST_NAME_MAX");
    assert_eq!(with(&|p| p.hostname = "\u{fffd}".repeat(64)), None, "a lossy read: one per byte");
    let said = |change: &dyn Fn(&mut Place)| with(change).unwrap_or_default();
    assert_eq!(
        said(&|p| p.hostname = "h".repeat(60_000)),
        "its hostname is 60000 characters, where a hostname (HOST_NAME_MAX) holds at most 64"
    );
    assert!(said(&|p| p.boot_id = Some("b".repeat(37))).starts_with("its boot id is 37 characters"));
    assert!(said(&|p| p.mps.pipe_directory = "/".repeat(4097)).starts_with("its MPS pipe directory"));
    assert!(said(&|p| p.cuda_visible_devices = Some("0".repeat(4097))).starts_with("its CUDA_VISIBLE"));
    assert!(said(&|p| p.pidfd_getfd_itself = Some("E".repeat(33))).starts_with("its pidfd_getfd"));
    let gpu = "GPU-00000000-0000-0000-0000-000000000000".to_owned();
    assert_eq!(with(&|p| p.gpus = Some(vec![gpu.clone(); 64])), None);
    assert_eq!(
        said(&|p| p.gpus = Some(vec![gpu.clone(); 65])),
        "it names 65 GPUs, where a node has at most 64"
    );
    assert!(said(&|p| p.gpus = Some(vec!["G".repeat(97)])).starts_with("its GPU UUID is 97 characters"));
    let setting = |name: &str, value: String| (name.to_owned(), value);
    assert!(
        said(&|p| p.settings = vec![setting("UCX_TLS", "x".repeat(4097))])
            .starts_with("its UCX_TLS is 4097 characters, where a setting of the environment")
    );
    assert_eq!(
        said(&|p| p.settings = vec![setting("EVIL\x1b[2J", String::new())]),
        "it names a setting, 'EVIL\\u{1b}[2J', that this program does not read"
    );
    assert_eq!(
        said(&|p| p.settings = vec![setting("UCX_TLS", "a".into()), setting("UCX_TLS", "b".into())]),
        "it names the setting UCX_TLS twice"
    );
    let mut newer = Place::here();
    newer.settings = vec![setting("UCX_TLS", "cuda_ipc".into()), setting("NCCL_NEWER", "x".repeat(9999))];
    let taken = newer.received().map(|p| p.settings);
    assert_eq!(taken, Ok(vec![setting("UCX_TLS", "cuda_ipc".into())]), "a newer joiner's is dropped");
    let mut liar = Place::here();
    liar.hostname = "h".repeat(65);
    assert!(liar.received().is_err_and(|why| why.starts_with("its hostname is 65 characters")));
    let shm = |p: &mut Place| {
        if let Some(shm) = p.dev_shm.as_mut() {
            shm.file_system = "f".repeat(19);
        }
    };
    assert!(Place::here().dev_shm.is_none() || said(&shm).starts_with("its /dev/shm file system"));
}

/// Every text of a place is made printable, the settings and the MPS pipe directory as the hostname.
#[test]
fn every_text_of_a_place_is_made_printable() {
    let evil = "a\x1b]0;t\x07\n";
    let escaped = "a\\u{1b}]0;t\\u{7}\\n";
    let mut place = Place::here();
    place.hostname = evil.into();
    place.boot_id = Some(evil.into());
    place.nccl_hostid = Some(evil.into());
    place.gpus = Some(vec![evil.into()]);
    place.mps.pipe_directory = evil.into();
    place.mps.answered = Some(evil.into());
    place.pidfd_getfd_itself = Some(evil.into());
    place.settings = vec![("UCX_TLS".into(), evil.into())];
    let place = place.printable();
    assert_eq!(place.hostname, escaped);
    assert_eq!((place.boot_id.as_deref(), place.nccl_hostid.as_deref()), (Some(escaped), Some(escaped)));
    assert_eq!(place.mps.pipe_directory, escaped);
    assert_eq!(place.mps.answered.as_deref(), Some(escaped));
    assert_eq!(place.settings, vec![("UCX_TLS".to_owned(), escaped.to_owned())]);
    assert_eq!(place.gpus, Some(vec![escaped.to_owned()]));
    assert_eq!(place.pidfd_getfd_itself.as_deref(), Some(escaped));
}

/// The GPUs a container was given are those whose device node is in its root, where it was given the
/// driver's control node; a root with no node at all (a host before its first CUDA start) says nothing of
/// them: every GPU the driver lists counts.
#[test]
fn the_gpus_a_root_has_are_those_of_its_device_nodes() {
    let driver = tempfile::tempdir().unwrap();
    for (address, uuid, minor) in [("0000:06:00.0", "GPU-b", 1), ("0000:05:00.0", "GPU-a", 0)] {
        std::fs::create_dir(driver.path().join(address)).unwrap();
        let information = format!("Model: \t\t H200\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\n");
        std::fs::write(driver.path().join(address).join("information"), information).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let root = Root::at(dir.path()).unwrap();
    let all = Some(vec!["GPU-a".to_owned(), "GPU-b".to_owned()]);
    assert_eq!(gpus_with_nodes_in(driver.path(), &root), all, "no nodes given: PCI order, all");
    std::fs::create_dir(dir.path().join("dev")).unwrap();
    std::fs::write(dir.path().join("dev/nvidiactl"), b"").unwrap();
    std::fs::write(dir.path().join("dev/nvidia1"), b"").unwrap();
    assert_eq!(gpus_with_nodes_in(driver.path(), &root), Some(vec!["GPU-b".to_owned()]));
    std::fs::remove_file(dir.path().join("dev/nvidia1")).unwrap();
    assert_eq!(gpus_with_nodes_in(driver.path(), &root), Some(vec![]), "the control node alone: none");
    assert_eq!(gpus_with_nodes_in(&driver.path().join("absent"), &root), None);
}
