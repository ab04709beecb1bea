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
pub(crate) mod versions;

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
    /// The NCCL it would load, where it finds one (`versions::nccl`); `None`: the newest release is assumed.
    #[serde(default)]
    pub nccl_version: Option<versions::Version>,
}

impl Place {
    /// This process's place, read now.
    pub fn here() -> Self {
        let access = crate::access::Access::here();
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
        }
    }
}

/// The most characters each text of a place can truly hold, as the kernel and this program make it (a
/// place's JSON is at most 3000 bytes as this program sends it; the wire takes 64 KiB). A process that says
/// more is lying or broken, and the server, which prints these texts in a table and keeps them in its
/// document, takes none of its place ([`Place::received`]): one 60 KB hostname once made a 723 KB table.
pub(crate) mod bounds {
    /// `HOST_NAME_MAX`: the kernel's UTS nodename holds 64 bytes.
    pub const HOSTNAME: usize = 64;
    /// `/proc/sys/kernel/random/boot_id`: a UUID, 36 characters.
    pub const BOOT_ID: usize = 36;
    /// `PATH_MAX`: the MPS pipe directory is a path.
    pub const PATH: usize = 4096;
    /// An environment setting's value (`CUDA_VISIBLE_DEVICES`, `NCCL_HOSTID`, `PYTORCH_CUDA_ALLOC_CONF`,
    /// ...): far more than any of them needs (64 GPU UUIDs are 2.6 KB).
    pub const SETTING: usize = 4096;
    /// GPUs one process sees: more than any node has.
    pub const GPUS: usize = 64;
    /// A GPU's UUID (`GPU-` and 36 characters; a MIG device's is longer), with room to spare.
    pub const GPU: usize = 96;
    /// `/dev/shm`'s file system: `tmpfs`, `unknown`, or its magic number in hex (`0x` and 16 digits).
    pub const FILE_SYSTEM: usize = 18;
    /// What answered at the MPS control socket: a program's name (`NAME_MAX`, escaped) and its pid.
    pub const ANSWERED: usize = 4096;
    /// `pidfd_getfd` of itself: `allowed`, or an errno's name.
    pub const WORD: usize = 32;
}

impl Place {
    /// A place that came from another process, as the server takes it: the settings this program does not
    /// read dropped (a joiner of a newer simple-ipc may read more; nothing here would look at them), then
    /// held to [`bounds`] as it was sent, then every text made [`printable`](Self::printable). `Err` says,
    /// naming the field, why it is no place this program sends.
    pub fn received(mut self) -> Result<Self, String> {
        self.settings.retain(|(name, _)| libraries::SETTINGS.contains(&name.as_str()));
        match self.out_of_bounds() {
            Some(why) => Err(why),
            None => Ok(self.printable()),
        }
    }

    /// Where a place holds more than its field can truly hold ([`bounds`]), or a setting this program does
    /// not read (or one twice): which field, in words.
    fn out_of_bounds(&self) -> Option<String> {
        // A setting's name labels its value below: only the names this program reads, each once.
        for (at, (name, _)) in self.settings.iter().enumerate() {
            if !libraries::SETTINGS.contains(&name.as_str()) {
                let name = crate::output::printable(&name.chars().take(bounds::HOSTNAME).collect::<String>());
                return Some(format!("it names a setting, '{name}', that this program does not read"));
            }
            if self.settings[..at].iter().any(|(earlier, _)| earlier == name) {
                return Some(format!("it names the setting {name} twice"));
            }
        }
        if let Some(gpus) = self.gpus.as_ref().filter(|g| g.len() > bounds::GPUS) {
            let most = bounds::GPUS;
            return Some(format!("it names {} GPUs, where a node has at most {most}", gpus.len()));
        }
        let env = "a setting of the environment this program reads";
        let mut texts: Vec<(&str, &str, usize, &str)> = vec![
            ("hostname", &self.hostname, bounds::HOSTNAME, "a hostname (HOST_NAME_MAX)"),
            ("MPS pipe directory", &self.mps.pipe_directory, bounds::PATH, "a path (PATH_MAX)"),
        ];
        let optional = [
            ("boot id", &self.boot_id, bounds::BOOT_ID, "a boot id (a UUID)"),
            ("CUDA_VISIBLE_DEVICES", &self.cuda_visible_devices, bounds::SETTING, env),
            ("NVIDIA_VISIBLE_DEVICES", &self.nvidia_visible_devices, bounds::SETTING, env),
            ("NCCL_HOSTID", &self.nccl_hostid, bounds::SETTING, env),
            (
                "answer at the MPS control socket",
                &self.mps.answered,
                bounds::ANSWERED,
                "what this program says of it",
            ),
            ("pidfd_getfd of itself", &self.pidfd_getfd_itself, bounds::WORD, "an errno's name"),
        ];
        texts.extend(optional.into_iter().filter_map(|(f, t, m, w)| Some((f, t.as_deref()?, m, w))));
        if let Some(shm) = &self.dev_shm {
            let what = "a file system's name or magic number";
            texts.push(("/dev/shm file system", &shm.file_system, bounds::FILE_SYSTEM, what));
        }
        for (name, value) in &self.settings {
            texts.push((name, value, bounds::SETTING, env));
        }
        for gpu in self.gpus.iter().flatten() {
            texts.push(("GPU UUID", gpu, bounds::GPU, "a GPU's UUID"));
        }
        // Counted in characters: a text read lossily (a hostname, a path) holds one per byte it was read
        // from.
        texts.into_iter().find_map(|(field, text, most, what)| {
            let count = text.chars().count();
            (count > most)
                .then(|| format!("its {field} is {count} characters, where {what} holds at most {most}"))
        })
    }

    /// The same place with every text in it made [`printable`](crate::output::printable), so that none said
    /// by another process reaches a terminal raw (an escape sequence in a hostname, a newline in a setting).
    pub fn printable(mut self) -> Self {
        let printable = crate::output::printable;
        self.hostname = printable(&self.hostname);
        self.mps.pipe_directory = printable(&self.mps.pipe_directory);
        for text in [&mut self.boot_id, &mut self.cuda_visible_devices, &mut self.nvidia_visible_devices]
            .into_iter()
            .chain([&mut self.nccl_hostid, &mut self.mps.answered, &mut self.pidfd_getfd_itself])
            .flatten()
        {
            *text = printable(text);
        }
        if let Some(shm) = self.dev_shm.as_mut() {
            shm.file_system = printable(&shm.file_system);
        }
        for gpu in self.gpus.iter_mut().flatten() {
            *gpu = printable(gpu);
        }
        for (name, value) in &mut self.settings {
            *name = printable(name);
            *value = printable(value);
        }
        self
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

/// `/dev/shm` at `path` as this process sees it (statfs, statvfs); `None` where it cannot be read.
pub(crate) fn dev_shm(path: &std::path::Path) -> Option<DevShm> {
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
}
