//! The NUMA node and CPUs of a GPU, read from sysfs through its PCI address, and pinning a process to them
//! (`--bind-numa`). The sysfs root is a parameter, so that the tests can give a fake one.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

/// Where sysfs is: `/sys` on a real machine.
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::at("/sys")
    }
}

impl Sysfs {
    pub fn at(root: impl AsRef<Path>) -> Self {
        Self { root: root.as_ref().to_owned() }
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(path)).ok()
    }

    /// The NUMA node of the PCI device at `bus_id` as CUDA writes it (`00000000:17:00.0`), if sysfs knows
    /// one. A device without affinity information (-1, as in many VMs) is on node 0 when the machine has one
    /// node.
    pub fn numa_node(&self, bus_id: &str) -> Option<u32> {
        let (domain, rest) = bus_id.split_once(':')?;
        let domain = u32::from_str_radix(domain, 16).ok()?;
        let path = format!("bus/pci/devices/{domain:04x}:{}/numa_node", rest.to_ascii_lowercase());
        let node: i64 = self.read(&path)?.trim().parse().ok()?;
        match u32::try_from(node) {
            Ok(node) => Some(node),
            Err(_) if self.node_count() == Some(1) => Some(0),
            Err(_) => None,
        }
    }

    /// NUMA nodes the kernel reports online.
    fn node_count(&self) -> Option<usize> {
        let online = self.read("devices/system/node/online")?;
        parse_cpulist(&online).ok().map(|nodes| nodes.len())
    }

    /// The CPUs of NUMA node `node`, as the kernel lists them (`0-47,96-143`).
    pub fn node_cpulist(&self, node: u32) -> Option<String> {
        Some(self.read(&format!("devices/system/node/node{node}/cpulist"))?.trim().to_owned())
    }

    /// The node of the device at `bus_id` and the CPUs to pin to, if sysfs knows them.
    pub fn placement(&self, bus_id: Option<&str>) -> Result<Option<(u32, String, CpuSet)>> {
        let Some(node) = bus_id.and_then(|bus| self.numa_node(bus)) else { return Ok(None) };
        let Some(list) = self.node_cpulist(node) else { return Ok(None) };
        let mut set = CpuSet::new();
        for cpu in parse_cpulist(&list)? {
            set.set(cpu).with_context(|| format!("CPU {cpu} of node {node}"))?;
        }
        Ok(Some((node, list, set)))
    }
}

/// Parses a kernel CPU list (`0-3,8,10-11`) into CPU numbers.
pub fn parse_cpulist(list: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let (first, last): (usize, usize) =
            (first.parse().context("CPU list")?, last.parse().context("CPU list")?);
        cpus.extend(first..=last);
    }
    Ok(cpus)
}

/// Pins every thread of this process to the CPUs of the device at `bus_id`'s NUMA node; returns what it
/// did, or `None` where the node is not known (then nothing changes).
pub fn bind_to_device_node(sysfs: &Sysfs, bus_id: Option<&str>) -> Result<Option<String>> {
    let Some((node, list, set)) = sysfs.placement(bus_id)? else { return Ok(None) };
    pin_every_thread(&set)?;
    Ok(Some(format!("node {node}, CPUs {list}")))
}

/// Pins every thread of this process, including those the driver started in cuInit, to `set`; threads
/// started later inherit it.
fn pin_every_thread(set: &CpuSet) -> Result<()> {
    let threads = std::fs::read_dir("/proc/self/task").context("listing this process's threads")?;
    for tid in threads.filter_map(|t| t.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        match sched_setaffinity(Pid::from_raw(tid), set) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(e).with_context(|| format!("sched_setaffinity(thread {tid})")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_like_the_kernel_writes_them() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist("").unwrap(), Vec::<usize>::new());
        assert!(parse_cpulist("3-x").is_err());
    }

    /// A fake sysfs with one GPU at `0000:17:00.0` on `node` (as sysfs writes it) and `nodes` online.
    fn fake_sysfs(node: &str, nodes: &str) -> (tempfile::TempDir, Sysfs) {
        let dir = tempfile::Builder::new().prefix("simple-ipc-sysfs-").tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("bus/pci/devices/0000:17:00.0/numa_node", node);
        write("devices/system/node/online", nodes);
        write("devices/system/node/node0/cpulist", "0\n");
        write("devices/system/node/node1/cpulist", "0-1\n");
        let sysfs = Sysfs::at(dir.path());
        (dir, sysfs)
    }

    #[test]
    fn the_node_comes_from_the_pci_address_and_unknown_means_node_0_on_one_node_hosts() {
        let (_dir, sysfs) = fake_sysfs("1\n", "0-1\n");
        assert_eq!(sysfs.numa_node("00000000:17:00.0"), Some(1), "CUDA's 8-digit domain, upper case too");
        assert_eq!(sysfs.numa_node("00000000:18:00.0"), None, "no such device");
        assert_eq!(sysfs.numa_node("not a bus id"), None);
        let (_dir, one_node) = fake_sysfs("-1\n", "0\n");
        assert_eq!(one_node.numa_node("0000:17:00.0"), Some(0));
        let (_dir, two_nodes) = fake_sysfs("-1\n", "0-1\n");
        assert_eq!(two_nodes.numa_node("0000:17:00.0"), None, "unknown on a host with two nodes");
    }

    #[test]
    fn binding_pins_this_process_to_the_nodes_cpus() {
        let (_dir, sysfs) = fake_sysfs("0\n", "0-1\n");
        let before = nix::sched::sched_getaffinity(Pid::from_raw(0)).unwrap();
        let bound = bind_to_device_node(&sysfs, Some("0000:17:00.0")).unwrap();
        let after = nix::sched::sched_getaffinity(Pid::from_raw(0)).unwrap();
        // Restore before asserting, so that the other tests of this process keep every CPU.
        pin_every_thread(&before).unwrap();
        assert_eq!(bound.as_deref(), Some("node 0, CPUs 0"));
        assert!(after.is_set(0).unwrap() && !after.is_set(1).unwrap(), "pinned to CPU 0 only");
        assert_eq!(bind_to_device_node(&sysfs, None).unwrap(), None, "no PCI address: nothing changes");
    }
}
