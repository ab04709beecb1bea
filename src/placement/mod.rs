//! Where a process stands: the facts about its place on the node that decide whether CUDA IPC can reach it
//! from another process (its namespaces by inode, its pid as it sees it, its /dev/shm, hostname and boot id,
//! the GPUs it is given, an IMEX channel, its user and capabilities, whether it is an MPS client), read from /proc and the file system
//! without CUDA. Each process of a served or isolated run hands its record to the server, which compares
//! them ([`share`]) and forecasts each mechanism and library path for the pair ([`forecast`]).

use serde::{Deserialize, Serialize};

pub(crate) mod forecast;
pub(crate) mod libraries;
pub(crate) mod mps;
mod report;
pub(crate) mod share;

pub use report::{Placement, RefusedBy, against_text, paths_of};

/// The namespaces that a container may give a process of its own, by the inode of `/proc/self/ns/<kind>`;
/// `None` where it cannot be read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespaces {
    pub pid: Option<u64>,
    pub ipc: Option<u64>,
    pub mnt: Option<u64>,
    pub net: Option<u64>,
    pub uts: Option<u64>,
    pub user: Option<u64>,
    pub cgroup: Option<u64>,
}

/// `/dev/shm` as this process sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevShm {
    /// `st_dev` of the directory: two processes with the same one share its files.
    pub device: u64,
    /// `tmpfs` or the file system's magic number.
    pub file_system: String,
    pub size_bytes: u64,
    pub free_bytes: u64,
}

/// Its effective capabilities that CUDA IPC and its libraries ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// `pidfd_getfd` of another user's process, or past Yama's `ptrace_scope`.
    pub sys_ptrace: bool,
    pub sys_nice: bool,
    /// Pinning host memory past `RLIMIT_MEMLOCK`.
    pub ipc_lock: bool,
}

/// Where one process stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    /// Its pid, in its own PID namespace.
    pub pid: u32,
    pub namespaces: Namespaces,
    /// `None` where /dev/shm is missing.
    pub dev_shm: Option<DevShm>,
    pub hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: one per boot of the node's kernel.
    pub boot_id: Option<String>,
    /// `CUDA_VISIBLE_DEVICES` and `NVIDIA_VISIBLE_DEVICES`, as set.
    pub cuda_visible_devices: Option<String>,
    pub nvidia_visible_devices: Option<String>,
    /// `NCCL_HOSTID`, which NCCL takes for its host hash instead of the hostname and boot id.
    pub nccl_hostid: Option<String>,
    /// The GPUs it sees, by UUID, where its driver was asked (`None`: not yet).
    pub gpus: Option<Vec<String>>,
    /// `/dev/nvidia-caps-imex-channels/` holds a channel (fabric handles need one).
    pub imex_channel: bool,
    pub uid: u32,
    /// Its user namespace is not the node's own (its uid map is not the identity of every uid).
    pub in_user_namespace: bool,
    pub capabilities: Capabilities,
    /// `/proc/sys/kernel/yama/ptrace_scope`, where Yama is there.
    pub ptrace_scope: Option<u8>,
    /// `Seccomp:` of `/proc/self/status`: 0 none, 1 strict, 2 a filter (Docker's default profile).
    pub seccomp: Option<u8>,
    /// Whether its CUDA is an MPS client, and of which daemon (its pipe directory).
    pub mps: mps::Mps,
    /// The settings in its environment that change a library's path (`libraries::SETTINGS`), as set.
    #[serde(default)]
    pub settings: Vec<(String, String)>,
    /// `pidfd_getfd` of one of its own descriptors, tried (ptrace always allows a process itself, so only a
    /// seccomp filter or an old kernel refuses): `allowed`, or the errno's name; `None` where not tried.
    #[serde(default)]
    pub pidfd_getfd_itself: Option<String>,
}

impl Place {
    /// This process's place, read now.
    pub fn here() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
        };
        let effective = field("CapEff").and_then(|hex| u64::from_str_radix(&hex, 16).ok()).unwrap_or(0);
        let has = |bit: u32| effective & (1u64 << bit) != 0;
        let env = |name: &str| std::env::var(name).ok();
        Place {
            pid: std::process::id(),
            namespaces: Namespaces {
                pid: namespace("pid"),
                ipc: namespace("ipc"),
                mnt: namespace("mnt"),
                net: namespace("net"),
                uts: namespace("uts"),
                user: namespace("user"),
                cgroup: namespace("cgroup"),
            },
            dev_shm: dev_shm(std::path::Path::new("/dev/shm")),
            hostname: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            cuda_visible_devices: env("CUDA_VISIBLE_DEVICES"),
            nvidia_visible_devices: env("NVIDIA_VISIBLE_DEVICES"),
            nccl_hostid: env("NCCL_HOSTID"),
            gpus: crate::driver::host::simulated_gpus().or_else(gpus_seen),
            imex_channel: crate::driver::host::simulated_imex_channel().unwrap_or_else(|| {
                std::fs::read_dir("/dev/nvidia-caps-imex-channels")
                    .is_ok_and(|mut entries| entries.next().is_some())
            }),
            uid: nix::unistd::geteuid().as_raw(),
            in_user_namespace: read_trimmed("/proc/self/uid_map").is_some_and(|map| !is_identity_map(&map)),
            capabilities: Capabilities { sys_ptrace: has(19), sys_nice: has(23), ipc_lock: has(14) },
            ptrace_scope: read_trimmed("/proc/sys/kernel/yama/ptrace_scope").and_then(|s| s.parse().ok()),
            seccomp: field("Seccomp").and_then(|s| s.parse().ok()),
            mps: mps::Mps::here(),
            settings: libraries::SETTINGS
                .iter()
                .filter_map(|&name| Some((name.to_owned(), std::env::var(name).ok()?)))
                .collect(),
            pidfd_getfd_itself: Some(crate::ipc::pidfd::tried_on_itself()),
        }
    }
}

/// The GPUs this process sees, by UUID, without CUDA: the NVIDIA driver's
/// `/proc/driver/nvidia/gpus/<PCI address>/information` (a container sees the GPUs its engine gave it),
/// less those `CUDA_VISIBLE_DEVICES` hides (UUIDs or their prefixes; ordinals in PCI order, as with
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID`). `None` where the driver's files cannot be read or a MIG device is named.
fn gpus_seen() -> Option<Vec<String>> {
    let mut found: Vec<(String, String)> = Vec::new();
    for entry in std::fs::read_dir("/proc/driver/nvidia/gpus").ok()?.flatten() {
        let information = std::fs::read_to_string(entry.path().join("information")).ok()?;
        let uuid =
            information.lines().find_map(|l| l.strip_prefix("GPU UUID:")).map(|u| u.trim().to_owned())?;
        found.push((entry.file_name().to_string_lossy().into_owned(), uuid));
    }
    found.sort();
    let all: Vec<String> = found.into_iter().map(|(_, uuid)| uuid).collect();
    visible(&all, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref())
}

/// Of `all` (in PCI order), those that `CUDA_VISIBLE_DEVICES=list` keeps, as the driver does: each entry an
/// ordinal or a UUID prefix, the list ending at the first entry that names none; `None` for a MIG device.
fn visible(all: &[String], list: Option<&str>) -> Option<Vec<String>> {
    let Some(list) = list else { return Some(all.to_vec()) };
    let mut kept: Vec<String> = Vec::new();
    for entry in list.split(',').map(str::trim) {
        if entry.starts_with("MIG-") {
            return None;
        }
        let named = match entry.parse::<usize>() {
            Ok(ordinal) => all.get(ordinal),
            Err(_) if entry.starts_with("GPU-") && entry.len() > 4 => {
                all.iter().find(|u| u.starts_with(entry))
            }
            Err(_) => None,
        };
        match named {
            Some(uuid) if !kept.contains(uuid) => kept.push(uuid.clone()),
            _ => break,
        }
    }
    Some(kept)
}

/// The inode of this process's namespace of `kind` (`/proc/self/ns/pid` reads `pid:[4026531836]`).
fn namespace(kind: &str) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/self/ns/{kind}")).ok()?;
    parse_namespace_link(&link.to_string_lossy())
}

fn parse_namespace_link(link: &str) -> Option<u64> {
    link.split_once(":[")?.1.strip_suffix(']')?.parse().ok()
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Whether a uid map is the node's own: every uid to itself (`0 0 4294967295`).
fn is_identity_map(map: &str) -> bool {
    let fields: Vec<&str> = map.split_whitespace().collect();
    fields == ["0", "0", "4294967295"]
}

fn dev_shm(path: &std::path::Path) -> Option<DevShm> {
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(path).ok()?.dev();
    let stats = nix::sys::statvfs::statvfs(path).ok()?;
    let file_system = match nix::sys::statfs::statfs(path) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC => "tmpfs".to_owned(),
        Ok(fs) => format!("{:#x}", fs.filesystem_type().0),
        Err(_) => "unknown".to_owned(),
    };
    let block = stats.fragment_size() as u64;
    Some(DevShm {
        device,
        file_system,
        size_bytes: stats.blocks() as u64 * block,
        free_bytes: stats.blocks_available() as u64 * block,
    })
}

#[cfg(test)]
mod tests {
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
    fn only_the_identity_of_every_uid_is_the_nodes_own_user_namespace() {
        assert!(is_identity_map("         0          0 4294967295\n".trim()));
        assert!(!is_identity_map("0 1000 1"));
        assert!(!is_identity_map("0 0 65536"));
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
        let seccomp =
            status.lines().find(|l| l.starts_with("Seccomp:")).map(|l| l[8..].trim().parse().unwrap());
        assert_eq!(here.seccomp, seccomp);
    }
}
