//! Which GPUs take part: the original's three filters (unified addressing, default compute mode, peer access
//! both ways with every device already chosen), peer access enabled between the chosen ones (later, off the
//! children's path), and the plan of which process runs on which device.

use anyhow::{Context, Result, ensure};

use crate::driver::{self, Driver};
use crate::outcome::Waiver;
use crate::segment::MAX_PROCESSES;

/// The variable that sets how many hardware work queues a context gets (CUDA's default is 8).
pub const MAX_CONNECTIONS_ENV: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// Asks for one hardware work queue per context unless the user chose a number: every process here uses one
/// stream, and on the H200 host it made the whole run about 200 ms faster (contexts are created faster, and
/// the creations of concurrent processes, which the driver serialises, shorter). Call it before any thread
/// starts; children inherit it.
pub fn prefer_fast_context_creation() {
    if std::env::var_os(MAX_CONNECTIONS_ENV).is_none() {
        // SAFETY: main calls this first, while the process has a single thread, so no other thread can be
        // reading the environment.
        unsafe { std::env::set_var(MAX_CONNECTIONS_ENV, "1") };
    }
}

/// The driver for the parent, or the waiver where nothing can run here.
pub fn load_or_waive() -> Result<Result<Box<dyn Driver>, Waiver>> {
    match driver::load() {
        Ok(driver) => Ok(Ok(driver)),
        Err(e) => match e.downcast::<Waiver>() {
            Ok(reason) => Ok(Err(Waiver(format!("No CUDA devices support IPC ({reason})")))),
            Err(e) => Err(e),
        },
    }
}

/// Chooses the devices, printing the original's message for each one it skips.
pub fn select(driver: &dyn Driver) -> Result<Vec<i32>> {
    let count = driver.device_count()?;
    let mut chosen: Vec<i32> = Vec::new();
    for device in 0..count {
        if chosen.len() == MAX_PROCESSES {
            break;
        }
        let info = driver.device_info(device).with_context(|| format!("querying device {device}"))?;
        if !info.unified_addressing {
            print_line!("Device {device} does not support unified addressing, skipping...")?;
            continue;
        }
        if !info.default_compute_mode {
            print_line!("Device {device} is in an unsupported compute mode for this sample")?;
            continue;
        }
        if !peers_both_ways(driver, device, &chosen)? {
            print_line!("Device {device} is not peer capable with some other selected peers, skipping")?;
            continue;
        }
        chosen.push(device);
    }
    Ok(chosen)
}

/// Enables peer access both ways between every two chosen devices, as the original does while it chooses
/// them. IPC does not need it (the children open with lazy peer access), so the parent does it once the
/// handles are published, off the children's path: it creates a context on every device, which is slow.
pub fn enable_peers(driver: &dyn Driver, chosen: &[i32]) -> Result<()> {
    for (i, &device) in chosen.iter().enumerate() {
        for &peer in &chosen[..i] {
            driver.use_device(device)?;
            driver.enable_peer_access(peer).with_context(|| format!("device {device} to peer {peer}"))?;
            driver.use_device(peer)?;
            driver.enable_peer_access(device).with_context(|| format!("device {peer} to peer {device}"))?;
        }
    }
    Ok(())
}

fn peers_both_ways(driver: &dyn Driver, device: i32, chosen: &[i32]) -> Result<bool> {
    for &peer in chosen {
        if !driver.can_access_peer(device, peer)? || !driver.can_access_peer(peer, device)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The device of each process: `procs_per_device` consecutive processes per chosen device.
pub fn plan(devices: &[i32], procs_per_device: usize) -> Result<Vec<i32>> {
    let n = devices.len() * procs_per_device;
    ensure!(
        n <= MAX_PROCESSES,
        "{} devices x {procs_per_device} processes per device makes {n} processes; at most {MAX_PROCESSES}",
        devices.len()
    );
    Ok(devices.iter().flat_map(|&d| std::iter::repeat_n(d, procs_per_device)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_groups_processes_by_device_and_caps_the_total() {
        assert_eq!(plan(&[0, 2], 3).unwrap(), vec![0, 0, 0, 2, 2, 2]);
        assert_eq!(plan(&[5], 1).unwrap(), vec![5]);
        assert_eq!(plan(&[0, 1, 2, 3], 8).unwrap().len(), 32);
        assert!(plan(&[0, 1, 2, 3], 9).is_err());
    }
}
