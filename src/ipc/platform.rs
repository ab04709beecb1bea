//! Where CUDA IPC cannot work, whatever the devices' attributes say, a waiver that says so:
//! - MIG: NVIDIA's MIG user guide (its application considerations) says that CUDA IPC across GPU instances
//!   is not supported. Processes on different devices where one is a MIG device are waived with that
//!   sentence; processes that share one MIG device (`--procs-per-device`) are asked by trial, as anywhere.
//! - WSL2: legacy IPC is not supported there (NCCL probes for it): legacy is waived; VMM is asked by a trial
//!   export and import (see `vmm`), and `--sync memops` by its attribute and the run itself.

use anyhow::Result;

use super::Mechanism;
use crate::driver::Driver;

/// The sentence of NVIDIA's MIG user guide.
pub const MIG_SENTENCE: &str = "CUDA IPC across GPU instances is not supported";

/// Why `mechanism` cannot work between processes on `devices` (one entry per process), if it cannot.
pub fn waiver(driver: &dyn Driver, mechanism: Mechanism, devices: &[i32]) -> Result<Option<String>> {
    let mut distinct = devices.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() > 1 {
        let mut named = Vec::with_capacity(distinct.len());
        let mut any_mig = false;
        for &device in &distinct {
            let mig = driver.device_info(device)?.mig;
            any_mig |= mig.is_some();
            named.push(format!("{device} ({})", mig.as_deref().unwrap_or("a whole GPU")));
        }
        if any_mig {
            return Ok(Some(format!(
                "the processes are on devices {} on different GPU instances: {MIG_SENTENCE} (NVIDIA's MIG \
                 user guide, application considerations); processes on one MIG device (--procs-per-device \
                 with one GPU chosen) are asked by trial",
                named.join(", ")
            )));
        }
    }
    if mechanism == Mechanism::Legacy
        && let Some(why) = driver.wsl()
    {
        return Ok(Some(format!(
            "this is WSL2 ({why}): legacy IPC is not supported there (NCCL probes for it); --ipc vmm and \
             --sync memops are asked by trial"
        )));
    }
    Ok(None)
}
