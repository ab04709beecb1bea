//! Where the GPUs sit: the peer-access matrix (`--topology`), the NUMA node and CPUs of each device (from
//! sysfs, through its PCI address), and pinning a child to those CPUs (`--bind-numa`).

use std::fmt::Write as _;

use anyhow::{Context, Result};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::Pid;

use crate::driver::Driver;

/// The NUMA node of the PCI device at `bus_id` as CUDA writes it (`00000000:17:00.0`), if sysfs knows one.
/// A device without affinity information (-1, as in many VMs) is on node 0 when the machine has one node.
pub fn numa_node(bus_id: &str) -> Option<u32> {
    let (domain, rest) = bus_id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let path = format!("/sys/bus/pci/devices/{domain:04x}:{}/numa_node", rest.to_ascii_lowercase());
    let node: i64 = std::fs::read_to_string(path).ok()?.trim().parse().ok()?;
    match u32::try_from(node) {
        Ok(node) => Some(node),
        Err(_) if node_count() == Some(1) => Some(0),
        Err(_) => None,
    }
}

/// NUMA nodes the kernel reports online.
fn node_count() -> Option<usize> {
    let online = std::fs::read_to_string("/sys/devices/system/node/online").ok()?;
    parse_cpulist(&online).ok().map(|nodes| nodes.len())
}

/// The CPUs of NUMA node `node`, as the kernel lists them (`0-47,96-143`).
pub fn node_cpulist(node: u32) -> Option<String> {
    let list = std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/cpulist")).ok()?;
    Some(list.trim().to_owned())
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

/// `--topology`: prints the report, or the waived line where there is no GPU.
pub fn run() -> Result<crate::Outcome> {
    let Some(driver) = crate::driver::load_or_waive()? else { return Ok(crate::Outcome::Waived) };
    print!("{}", report(&*driver)?);
    Ok(crate::Outcome::Passed)
}

/// The `--topology` report.
pub fn report(driver: &dyn Driver) -> Result<String> {
    let count = driver.device_count()?;
    let mut out = String::new();
    let _ = writeln!(out, "Peer access (can the row's device access the column's memory):");
    let _ = write!(out, "{:>8}", "");
    for d in 0..count {
        let _ = write!(out, "{:>6}", format!("GPU{d}"));
    }
    out.push('\n');
    for row in 0..count {
        let _ = write!(out, "{:>8}", format!("GPU{row}"));
        for col in 0..count {
            let cell = if row == col {
                "-"
            } else if driver.can_access_peer(row, col)? {
                "yes"
            } else {
                "no"
            };
            let _ = write!(out, "{cell:>6}");
        }
        out.push('\n');
    }
    for d in 0..count {
        let info = driver.device_info(d)?;
        let bus = info.pci_bus_id.as_deref().unwrap_or("none");
        let node = info.pci_bus_id.as_deref().and_then(numa_node);
        let placement = match node {
            Some(node) => {
                format!("NUMA node {node}, CPUs {}", node_cpulist(node).unwrap_or_else(|| "?".into()))
            }
            None => "NUMA node unknown".into(),
        };
        let _ = writeln!(out, "GPU{d}: {}, PCI {bus}, {placement}", info.name);
    }
    Ok(out)
}

/// Pins every thread of this process to the CPUs of `device`'s NUMA node; returns the CPU list, or `None` where the node is
/// not known (then nothing changes).
pub fn bind_to_device_node(driver: &dyn Driver, device: i32) -> Result<Option<String>> {
    let info = driver.device_info(device)?;
    let Some(node) = info.pci_bus_id.as_deref().and_then(numa_node) else { return Ok(None) };
    let Some(list) = node_cpulist(node) else { return Ok(None) };
    let mut set = CpuSet::new();
    for cpu in parse_cpulist(&list)? {
        set.set(cpu).with_context(|| format!("CPU {cpu} of node {node}"))?;
    }
    // Every thread, including those the driver started in cuInit; threads started later inherit it.
    let threads = std::fs::read_dir("/proc/self/task").context("listing this process's threads")?;
    for tid in threads.filter_map(|t| t.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        match sched_setaffinity(Pid::from_raw(tid), &set) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => return Err(e).with_context(|| format!("sched_setaffinity(thread {tid})")),
        }
    }
    Ok(Some(format!("node {node}, CPUs {list}")))
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

    #[test]
    fn unknown_pci_addresses_have_no_node() {
        assert_eq!(numa_node("not a bus id"), None);
        assert_eq!(numa_node("0000ffff:ff:1f.7"), None);
    }
}
