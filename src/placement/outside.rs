//! Where a running process stands, read from outside it (`--between PID PID`): the same [`Place`] a
//! process of this program reads of itself, read from `/proc/<pid>` of a process this program did not start
//! and may not enter: without signalling, stopping or tracing it, and without running anything in it. Its
//! namespaces, pid as it sees itself (`NSpid`), uid and user namespace (`uid_map`), capabilities and seccomp
//! mode (`status`), the environment it was started with (`environ`), its `/dev/shm`, GPUs and IMEX channel
//! through its root (`/proc/<pid>/root`), its hostname (its UTS namespace, entered by a thread of this
//! process for one `gethostname`), and the libraries it has mapped (`maps`), with their versions read from
//! their files. A fact that cannot be read is an error that names it, never a guess; a fact nothing readable
//! decides (what a seccomp filter allows) is "not known".
//!
//! The process may be another user's, and may lie or hide: all it says of itself is read as bytes, up to a
//! bound, through its `/proc/<pid>` held open ([`ProcDir`]: never another process that took its number);
//! its paths are resolved in its own root ([`Root`]); its files are looked at before they are opened; and
//! what is read through its own file systems and memory is read within [`ANSWER_WITHIN`].

mod mapped;
mod pair_seen;
mod proc_dir;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};

use mapped::loaded;
#[cfg(test)]
use mapped::range_and_path;
pub use mapped::{Loaded, Mapped};
pub use pair_seen::{pair, with_outside};
use proc_dir::MOST_STATUS;
pub(crate) use proc_dir::ProcDir;

use super::root::Root;
use super::versions::{self, Version};
use super::{Capabilities, Namespaces, Place, Platform, libraries, mps};

/// The most of its `uid_map`: 340 lines at most, each three numbers.
const MOST_UID_MAP: u64 = 64 << 10;
/// The most of its `environ`: what `execve` takes of the arguments and the environment together is at most
/// 6 MiB (three quarters of the 8 MiB stack limit, whatever the limit), so a longer one was made by the
/// process itself (`prctl(PR_SET_MM)`).
const MOST_ENVIRON: u64 = 8 << 20;
/// The most of its `maps`: 65530 mappings (`vm.max_map_count`) of paths of 250 bytes, on average.
const MOST_MAPS: u64 = 16 << 20;

/// A running process, as read from outside.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// Its pid as this process sees it (as given).
    pub pid: i32,
    /// Its program's name (`comm`), made printable.
    pub name: String,
    pub place: Place,
    pub loaded: Loaded,
    /// How many seccomp filters it runs under (`Seccomp_filters`); their rules cannot be read from outside.
    pub seccomp_filters: Option<u32>,
}

/// The place of the process whose `/proc/<pid>` is `proc`, every fact read through it: all of one process,
/// which still runs once they are read (a process that ends meanwhile reads as one without an environment
/// or maps, which would be a guess). `Err` names the fact that could not be read, and why.
pub(crate) fn observe_in(proc: &ProcDir) -> Result<Observed> {
    let pid = proc.pid;
    let status = proc
        .read_string("status", MOST_STATUS)
        .map_err(|e| proc_dir::cannot_be_read(pid, &format!("/proc/{pid}/status"), &e))?;
    let field = |name: &str| crate::os::access::status_field(&status, name);
    let unreadable = |fact: &str| format!("process {pid}: its {fact} could not be read");
    let name = crate::output::printable(&field("Name").unwrap_or_default());
    let own_pid =
        field("NSpid").and_then(|list| list.split_whitespace().last()?.parse().ok()).ok_or_else(|| {
            anyhow!("{} (no NSpid in /proc/{pid}/status)", unreadable("pid in its own PID namespace"))
        })?;
    let node_uid: u32 = field("Uid")
        .and_then(|uids| uids.split_whitespace().nth(1)?.parse().ok())
        .ok_or_else(|| anyhow!("{} (no Uid in /proc/{pid}/status)", unreadable("uid")))?;
    let effective = field("CapEff").and_then(|hex| u64::from_str_radix(&hex, 16).ok()).unwrap_or(0);
    let has = |bit: u32| effective & (1u64 << bit) != 0;
    let seccomp: Option<u8> = field("Seccomp").and_then(|s| s.parse().ok());
    let seccomp_filters = field("Seccomp_filters").and_then(|s| s.parse().ok());
    let namespace = |kind: &str| -> Result<Option<u64>> {
        let link = proc.read_link(&format!("ns/{kind}")).with_context(|| {
            format!("{} (/proc/{pid}/ns/{kind})", unreadable(&format!("{kind} namespace")))
        })?;
        Ok(super::parse_namespace_link(&link.to_string_lossy()))
    };
    let namespaces = Namespaces {
        pid: namespace("pid")?,
        ipc: namespace("ipc")?,
        mnt: namespace("mnt")?,
        net: namespace("net")?,
        uts: namespace("uts")?,
        user: namespace("user")?,
        cgroup: namespace("cgroup")?,
    };
    let uid_map = proc
        .read_string("uid_map", MOST_UID_MAP)
        .with_context(|| format!("{} (/proc/{pid}/uid_map)", unreadable("user namespace's uid map")))?;
    let hostname =
        hostname_of(proc, namespaces.uts).with_context(|| unreadable("hostname (its UTS namespace)"))?;
    let held = proc.try_clone().with_context(|| format!("holding /proc/{pid}"))?;
    let Through { env, loaded, gpus_present, gpus, imex_channel, dev_shm, mps, platform } =
        within(pid, move |reading| through_its_files(&held, node_uid, reading))?;
    let cuda_visible_devices = env.get("CUDA_VISIBLE_DEVICES").map(str::to_owned);
    let place = Place {
        pid: own_pid,
        namespaces,
        dev_shm,
        hostname,
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_owned()),
        cuda_visible_devices,
        nvidia_visible_devices: env.get("NVIDIA_VISIBLE_DEVICES").map(str::to_owned),
        nccl_hostid: env.get("NCCL_HOSTID").map(str::to_owned),
        gpus,
        imex_channel,
        uid: uid_as_it_sees_itself(node_uid, &uid_map),
        in_user_namespace: !crate::os::access::is_identity_map(uid_map.trim()),
        capabilities: Capabilities { sys_ptrace: has(19), sys_nice: has(23), ipc_lock: has(14) },
        ptrace_scope: std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        seccomp,
        mps,
        settings: libraries::SETTINGS
            .iter()
            .filter_map(|&name| Some((name.to_owned(), env.get(name)?.to_owned())))
            .collect(),
        pidfd_getfd_itself: pidfd_getfd_from_outside(seccomp),
        nccl_version: loaded.nccl.as_ref().and_then(|n| Version::at_start_of(n.version.as_deref()?)),
        gpus_present,
        platform,
        node_uid: Some(node_uid),
    };
    // Held to what each field can truly hold, as a joiner's place is: a process may say anything of itself.
    let place = place.received().map_err(|why| anyhow!("process {pid}: {why}"))?;
    proc.running()?;
    Ok(Observed { pid, name, place, loaded, seccomp_filters })
}

/// How long the reads of a process's own files and memory may take together ([`through_its_files`]): far
/// more than they take (a few milliseconds), far less than a user waits. Each may wait for good: a file
/// system of the process's own mounts (a FUSE server of its own that never answers, a hung network mount)
/// or its memory (an environment in a mapped file of such a file system) can keep a read waiting, in a
/// wait that only SIGKILL ends.
const ANSWER_WITHIN: Duration = Duration::from_millis(500);

/// What a thread reading through a process's files is reading now, for the error that says where it waited.
type Reading = Arc<Mutex<String>>;

/// Runs `read` on a thread of its own and waits for it up to [`ANSWER_WITHIN`]: its answer, or an error
/// that names the fact it was reading when the time ran out. A thread that waits for good is left waiting
/// (nothing can end it but the process's end, which comes next).
fn within<T: Send + 'static>(
    pid: i32,
    read: impl FnOnce(&Reading) -> Result<T> + Send + 'static,
) -> Result<T> {
    let reading: Reading = Arc::new(Mutex::new(String::new()));
    let (answer, answered) = std::sync::mpsc::sync_channel(1);
    let now = reading.clone();
    std::thread::Builder::new()
        .name("outside".into())
        .spawn(move || {
            let _ = answer.send(read(&now));
        })
        .context("starting the thread that reads through its files")?;
    match answered.recv_timeout(ANSWER_WITHIN) {
        Ok(read) => read,
        Err(_) => {
            let what = reading.lock().map(|what| what.clone()).unwrap_or_default();
            Err(anyhow!(
                "process {pid}: its {what} could not be read within {} ms: a file system of its own did not \
                 answer in that time (a FUSE server that never replies, a hung network mount, a disk that \
                 slow), or its memory is such a file's",
                ANSWER_WITHIN.as_millis()
            ))
        }
    }
}

/// What is read through a process's own files and memory.
struct Through {
    env: Environment,
    loaded: Loaded,
    gpus_present: Option<Vec<String>>,
    gpus: Option<Vec<String>>,
    imex_channel: bool,
    dev_shm: Option<super::DevShm>,
    mps: mps::Mps,
    platform: Platform,
}

/// The facts of process `proc`, of user `node_uid`, that are read through its own files and memory (its
/// environment, its root's paths, its maps and its libraries' files: a kernel may read the maps under the
/// lock of its memory, which a thread of its own may keep taken, waiting on such a file), each named in
/// `reading` as it is read.
fn through_its_files(proc: &ProcDir, node_uid: u32, reading: &Reading) -> Result<Through> {
    let pid = proc.pid;
    let unreadable = |fact: &str| format!("process {pid}: its {fact} could not be read");
    let now = |what: &str| {
        if let Ok(mut now) = reading.lock() {
            *now = what.to_owned();
        }
    };
    now(&format!("environment (/proc/{pid}/environ)"));
    let environ = proc
        .read("environ", MOST_ENVIRON)
        .with_context(|| format!("{} (/proc/{pid}/environ)", unreadable("environment")))?;
    // A read stops where its memory does: a process that unmapped the pages of its environment reads as one
    // started without one, unless its length is held to what the kernel says it is.
    let length = proc
        .environment_length()
        .with_context(|| format!("{} (/proc/{pid}/stat)", unreadable("environment's length")))?;
    if (environ.len() as u64) < length {
        bail!(
            "{} (/proc/{pid}/environ): {} of its {length} bytes, the rest of its memory gone (unmapped, or \
             not readable from outside)",
            unreadable("environment"),
            environ.len()
        );
    }
    let env = Environment::parse(&environ);
    // Its root, in which each of its paths is resolved as it resolves them ([`Root`]).
    now(&format!("root directory (/proc/{pid}/root)"));
    let root = proc
        .open_file("root", OFlag::O_PATH | OFlag::O_DIRECTORY)
        .map(Root::of)
        .with_context(|| format!("{} (/proc/{pid}/root)", unreadable("root directory")))?;
    root.find("/", true)
        .and_then(|top| std::fs::read_dir(top.path()).map(drop))
        .with_context(|| format!("{} (/proc/{pid}/root)", unreadable("root directory")))?;
    now(&format!("mapped libraries (/proc/{pid}/maps)"));
    let maps = proc
        .read_string("maps", MOST_MAPS)
        .with_context(|| format!("{} (/proc/{pid}/maps)", unreadable("mapped libraries")))?;
    now(&format!("mapped libraries' files (/proc/{pid}/map_files, and their paths in its root)"));
    let by_mapping = |range: &str| {
        versions::reopened_if_regular(proc.open_file(&format!("map_files/{range}"), OFlag::O_PATH).ok()?)
    };
    let loaded = loaded(&maps, &root, &by_mapping);
    let simulated = env.get(crate::driver::host::SIMULATE_ENV);
    let cuda_visible_devices = env.get("CUDA_VISIBLE_DEVICES");
    now(&format!("GPUs' device nodes (/proc/{pid}/root/dev/nvidia*)"));
    let (gpus_present, gpus) = match crate::driver::host::simulated_gpus_of(simulated, None) {
        Some(all) => {
            let visible = Some(cuda_visible_devices);
            (Some(all), crate::driver::host::simulated_gpus_of(simulated, visible))
        }
        None => {
            let present = super::gpus_with_nodes(&root);
            let gpus = present.as_ref().and_then(|all| super::visible(all, cuda_visible_devices));
            (present, gpus)
        }
    };
    now(&format!("IMEX channels (/proc/{pid}/root/dev/nvidia-caps-imex-channels)"));
    let imex_channel = crate::driver::host::simulated_imex_channel_of(simulated).unwrap_or_else(|| {
        let channels = root.find("dev/nvidia-caps-imex-channels", true);
        channels.is_ok_and(|found| std::fs::read_dir(found.path()).is_ok_and(|mut e| e.next().is_some()))
    });
    // Its /dev/shm: none is a fact (a container without one, or one it cannot use: no directory, a loop or
    // a file on the way); one that is there but cannot be read is not.
    now(&format!("/dev/shm (/proc/{pid}/root/dev/shm)"));
    let dev_shm = match root.find("dev/shm", true) {
        // A FIFO or a file: its shm_open meets ENOTDIR.
        Ok(found) if found.kind().is_ok_and(|kind| kind != nix::sys::stat::SFlag::S_IFDIR) => None,
        Ok(found) => {
            let shm = super::dev_shm(&found.path());
            if shm.is_none() {
                let e = nix::sys::statvfs::statvfs(&found.path()).err().unwrap_or(nix::errno::Errno::EIO);
                bail!("{} (/proc/{pid}/root/dev/shm: {e})", unreadable("/dev/shm"));
            }
            shm
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(nix::libc::ENOENT | nix::libc::ENOTDIR | nix::libc::ELOOP)
            ) =>
        {
            None
        }
        Err(e) => bail!("{} (/proc/{pid}/root/dev/shm: {e})", unreadable("/dev/shm")),
    };
    now(&format!("MPS pipe directory (in /proc/{pid}/root)"));
    let mps = mps::Mps::of(env.get(mps::PIPE_DIRECTORY_ENV), Some(&root), node_uid);
    now(&format!("platform's files (/proc/{pid}/root/dev/dxg, /proc/{pid}/root/etc/nv_tegra_release)"));
    let platform = Platform::under(&root, crate::driver::host::simulated_wsl_of(simulated));
    Ok(Through { env, loaded, gpus_present, gpus, imex_channel, dev_shm, mps, platform })
}

/// The text of a file of `/proc` that holds names a process chose (its own in `status`, its files' in
/// `maps`), which need not be UTF-8: read whole, each byte that is not made U+FFFD. Read strictly, one
/// process named `\xff` (`prctl(PR_SET_NAME)`), or one that mapped a file so named, could not be read at all.
fn read_lossily(path: &Path) -> std::io::Result<String> {
    Ok(String::from_utf8_lossy(&std::fs::read(path)?).into_owned())
}

/// What `pidfd_getfd` of one of its own descriptors would answer in a process of this seccomp mode, as far
/// as outside can tell: without a filter, what it answers in this process (the kernel is one: `ENOSYS` on a
/// kernel without it); under a filter, not known (its rules are readable only by a tracer that stops it).
fn pidfd_getfd_from_outside(seccomp: Option<u8>) -> Option<String> {
    match seccomp {
        Some(0) => match crate::ipc::pidfd::tried_on_itself().as_str() {
            "ENOSYS" => Some("ENOSYS".to_owned()),
            _ => Some("allowed".to_owned()),
        },
        Some(_) => Some(super::forecast::UNDER_A_FILTER.to_owned()),
        None => None,
    }
}

/// A process's uid as it sees itself, from its uid as the node sees it and its user namespace's map: where
/// no line maps it, the overflow uid (65534), as `getuid` answers there.
fn uid_as_it_sees_itself(node_uid: u32, uid_map: &str) -> u32 {
    for line in uid_map.lines() {
        let numbers: Vec<u64> = line.split_whitespace().filter_map(|n| n.parse().ok()).collect();
        if let [inside, outside, count] = numbers[..] {
            let node = u64::from(node_uid);
            if node >= outside && node < outside + count {
                return u32::try_from(inside + (node - outside)).unwrap_or(65534);
            }
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65534)
}

/// The environment a process was started with (`/proc/<pid>/environ`: what it changed later is not there).
struct Environment(Vec<(String, String)>);

impl Environment {
    fn parse(environ: &[u8]) -> Self {
        let pairs = environ
            .split(|&b| b == 0)
            .filter_map(|entry| {
                let entry = String::from_utf8_lossy(entry);
                let (name, value) = entry.split_once('=')?;
                Some((name.to_owned(), value.to_owned()))
            })
            .collect();
        Self(pairs)
    }

    /// The value of `name` as the process's own `getenv` answers (the libraries' C `getenv`, and Rust's
    /// `std::env::var`, by which a process of this program reads its own place): the first of a name given
    /// twice.
    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// The hostname of the UTS namespace `uts` that process `proc` is in: this process's own where it is the
/// same namespace; else read by a thread of this process that enters it (`setns`, which needs
/// `CAP_SYS_ADMIN` over it) for one `gethostname` and ends, which touches nothing of the process.
fn hostname_of(proc: &ProcDir, uts: Option<u64>) -> Result<String> {
    let ours = super::namespace("uts");
    if uts.is_some() && uts == ours {
        return Ok(nix::unistd::gethostname()?.to_string_lossy().into_owned());
    }
    let namespace = proc
        .open_file("ns/uts", OFlag::O_RDONLY)
        .with_context(|| format!("opening /proc/{}/ns/uts", proc.pid))?;
    let read = std::thread::Builder::new()
        .name("uts".into())
        .spawn(move || -> Result<String> {
            nix::sched::setns(&namespace, nix::sched::CloneFlags::CLONE_NEWUTS)
                .context("entering its UTS namespace (setns) needs CAP_SYS_ADMIN")?;
            Ok(nix::unistd::gethostname()?.to_string_lossy().into_owned())
        })
        .context("starting the thread that enters its UTS namespace")?;
    read.join().map_err(|_| anyhow!("the thread that read it failed"))?
}

#[cfg(test)]
mod tests;
