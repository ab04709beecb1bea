//! `--topology`: the peer-access matrix of the GPUs, and the PCI address, NUMA node and CPUs of each.

use std::fmt::Write as _;

use anyhow::Result;

use crate::driver::Driver;
use crate::os::numa::Sysfs;
use crate::outcome::Outcome;

/// `--topology`: prints the report, or is waived where there is no GPU.
pub fn run() -> Result<Outcome> {
    let driver = match crate::devices::load_or_waive()? {
        Ok(driver) => driver,
        Err(waiver) => return Ok(Outcome::Waived(waiver)),
    };
    crate::output::text(&report(&*driver)?)?;
    Ok(Outcome::Passed(None))
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
    let sysfs = Sysfs::default();
    for d in 0..count {
        let info = driver.device_info(d)?;
        let bus = info.pci_bus_id.as_deref().unwrap_or("none");
        let node = info.pci_bus_id.as_deref().and_then(|bus| sysfs.numa_node(bus));
        let placement = match node {
            Some(node) => {
                format!("NUMA node {node}, CPUs {}", sysfs.node_cpulist(node).unwrap_or_else(|| "?".into()))
            }
            None => "NUMA node unknown".into(),
        };
        let _ = writeln!(out, "GPU{d}: {}, PCI {bus}, {placement}", info.name);
    }
    Ok(out)
}
