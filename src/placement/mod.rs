//! Where a process stands: the facts about its place on the node that decide whether CUDA IPC can reach it
//! from another process (its namespaces by inode, its pid as it sees it, its /dev/shm, hostname and boot id,
//! the GPUs it is given, an IMEX channel, its user and capabilities, whether it is an MPS client), read from /proc and the file system
//! without CUDA. Each process of a served or isolated run hands its record to the server, which compares
//! them ([`share`]) and forecasts each mechanism and library path for the pair ([`forecast`]).

use serde::{Deserialize, Serialize};

use root::Root;

pub(crate) mod forecast;
pub(crate) mod libraries;
pub(crate) mod mps;
pub(crate) mod outside;
mod received;
mod report;
pub(crate) mod root;
pub(crate) mod share;
pub(crate) mod versions;

pub use report::{Placement, ProcessPlacement, RefusedBy, against_text, paths_of};

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
    /// The NCCL it would load, where it finds one (`versions::nccl`); `None`: the newest release is assumed.
    #[serde(default)]
    pub nccl_version: Option<versions::Version>,
    /// The GPUs its container has, by UUID, before `CUDA_VISIBLE_DEVICES` hides any (`gpus` is what is left):
    /// the driver's GPUs whose device node is in its root. `None`: not read.
    #[serde(default)]
    pub gpus_present: Option<Vec<String>>,
    /// The machine it runs on, where that decides CUDA IPC by itself (WSL2, Tegra).
    #[serde(default)]
    pub platform: Platform,
    /// Its uid as the node's user namespace sees it (`uid` is as it sees itself), where known: the owner
    /// of the files it makes in a /dev/shm.
    #[serde(default)]
    pub node_uid: Option<u32>,
}

/// The machine a process runs on, as far as CUDA IPC cares: WSL2 and Tegra (Jetson, DRIVE) have no legacy
/// CUDA IPC (CUDA on WSL's and CUDA for Tegra's documentation: "CUDA IPC is not supported").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "why")]
pub enum Platform {
    /// A Linux machine with a discrete GPU, where nothing else says otherwise.
    #[default]
    Linux,
    /// WSL2: `/dev/dxg`, or "microsoft" in the kernel's release.
    Wsl2(String),
    /// Tegra: `/etc/nv_tegra_release`, or the device tree's `nvidia,tegra`.
    Tegra(String),
}

impl Platform {
    /// The platform of the machine whose root (and /proc, for the kernel's release) is `root`; `simulated`:
    /// the simulation's `wsl`, where the simulation was asked for.
    pub fn under(root: &Root, simulated_wsl: Option<bool>) -> Self {
        if simulated_wsl == Some(true) {
            return Platform::Wsl2("simulated: /dev/dxg is present".into());
        }
        if root.exists("dev/dxg") {
            return Platform::Wsl2("/dev/dxg is present".into());
        }
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if release.to_ascii_lowercase().contains("microsoft") {
            return Platform::Wsl2(format!("the kernel release is {}", release.trim()));
        }
        if root.exists("etc/nv_tegra_release") {
            return Platform::Tegra("/etc/nv_tegra_release is present".into());
        }
        let tree = std::fs::read("/proc/device-tree/compatible").unwrap_or_default();
        if memchr::memmem::find(&tree, b"nvidia,tegra").is_some() {
            return Platform::Tegra("the device tree is compatible with nvidia,tegra".into());
        }
        Platform::Linux
    }
}

impl Place {
    /// This process's place, read now.
    pub fn here() -> Self {
        let access = crate::os::access::Access::here();
        let root = Root::here();
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
            uid: access.uid,
            in_user_namespace: access.in_user_namespace,
            capabilities: Capabilities {
                sys_ptrace: access.sys_ptrace,
                sys_nice: access.sys_nice,
                ipc_lock: access.ipc_lock,
            },
            ptrace_scope: access.ptrace_scope,
            seccomp: access.seccomp,
            mps: mps::Mps::here(),
            settings: libraries::SETTINGS
                .iter()
                .filter_map(|&name| Some((name.to_owned(), std::env::var(name).ok()?)))
                .collect(),
            pidfd_getfd_itself: Some(crate::ipc::pidfd::tried_on_itself()),
            nccl_version: versions::nccl(),
            gpus_present: crate::driver::host::simulated_gpus_of(simulated().as_deref(), None)
                .or_else(|| gpus_with_nodes(root.as_ref().ok()?)),
            platform: root
                .as_ref()
                .map_or(Platform::Linux, |root| Platform::under(root, crate::driver::host::simulated_wsl())),
            node_uid: node_uid(access.uid),
        }
    }
}

/// This process's uid `uid` (as it sees itself) as its user namespace's parent sees it, by
/// `/proc/self/uid_map` (the node's, where the parent is the node's user namespace).
fn node_uid(uid: u32) -> Option<u32> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    map.lines().find_map(|line| {
        let numbers: Vec<u64> = line.split_whitespace().filter_map(|n| n.parse().ok()).collect();
        let [inside, outside, count] = numbers[..] else { return None };
        let uid = u64::from(uid);
        (uid >= inside && uid < inside + count).then(|| u32::try_from(outside + (uid - inside)).ok())?
    })
}

/// The simulation's device list, where this process was asked to simulate its GPUs.
fn simulated() -> Option<String> {
    std::env::var(crate::driver::host::SIMULATE_ENV).ok()
}

/// The GPUs this process sees, by UUID, without CUDA: the NVIDIA driver's
/// `/proc/driver/nvidia/gpus/<PCI address>/information` (a container sees the GPUs its engine gave it),
/// less those `CUDA_VISIBLE_DEVICES` hides (UUIDs or their prefixes; ordinals in PCI order, as with
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID`). `None` where the driver's files cannot be read or a MIG device is named.
fn gpus_seen() -> Option<Vec<String>> {
    let all = gpus_with_nodes(&Root::here().ok()?)?;
    visible(&all, std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref())
}

/// The NVIDIA driver's GPUs (`/proc/driver/nvidia/gpus/<PCI address>/information`, in PCI order) whose
/// device node (`/dev/nvidia<minor>`) is under `root`: the GPUs a container was given. A root whose `/dev`
/// has no `nvidiactl` was given no nodes at all, and its nodes say nothing: a host's are made by the first
/// CUDA start (nvidia-modprobe), so every GPU the driver lists counts there. `None` where the driver's files
/// cannot be read.
pub(crate) fn gpus_with_nodes(root: &Root) -> Option<Vec<String>> {
    gpus_with_nodes_in(std::path::Path::new("/proc/driver/nvidia/gpus"), root)
}

/// [`gpus_with_nodes`], the driver's GPUs listed in `driver` (its `gpus` folder).
fn gpus_with_nodes_in(driver: &std::path::Path, root: &Root) -> Option<Vec<String>> {
    let nodes_given = root.exists("dev/nvidiactl");
    let mut found: Vec<(String, String)> = Vec::new();
    for entry in std::fs::read_dir(driver).ok()?.flatten() {
        let information = std::fs::read_to_string(entry.path().join("information")).ok()?;
        let field =
            |name: &str| information.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_owned());
        let uuid = field("GPU UUID:")?;
        let has_node = !nodes_given
            || field("Device Minor:").is_none_or(|minor| root.exists(&format!("dev/nvidia{minor}")));
        if has_node {
            found.push((entry.file_name().to_string_lossy().into_owned(), uuid));
        }
    }
    found.sort();
    Some(found.into_iter().map(|(_, uuid)| uuid).collect())
}

/// Of `all` (in PCI order), those that `CUDA_VISIBLE_DEVICES=list` keeps, as the driver does: each entry an
/// ordinal or a UUID prefix, the list ending at the first entry that names none; `None` for a MIG device.
pub(crate) fn visible(all: &[String], list: Option<&str>) -> Option<Vec<String>> {
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

pub(crate) fn parse_namespace_link(link: &str) -> Option<u64> {
    link.split_once(":[")?.1.strip_suffix(']')?.parse().ok()
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// `/dev/shm` at `path` as this process sees it (statfs, statvfs); `None` where it cannot be read, or is no
/// directory (`shm_open` there meets `ENOTDIR`).
pub(crate) fn dev_shm(path: &std::path::Path) -> Option<DevShm> {
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(path).ok().filter(std::fs::Metadata::is_dir)?.dev();
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
mod tests;
