//! What a process asked of the simulation, read from its environment (`SIMPLE_IPC_SIMULATE_GPUS`, and
//! `CUDA_VISIBLE_DEVICES` as the driver honours it), or from another process's (`--between` reads them from
//! `/proc/<pid>/environ`): its GPUs by UUID, an IMEX channel, WSL2, a kernel without `pidfd_getfd`.

use super::super::devices::uuid_text;

/// The environment variable that selects the simulation (test-only; README documents it).
pub const SIMULATE_ENV: &str = "SIMPLE_IPC_SIMULATE_GPUS";

/// Whether this process was asked to simulate its GPUs.
pub fn requested() -> bool {
    std::env::var_os(SIMULATE_ENV).is_some()
}

/// Whether the simulation was asked for a kernel without `pidfd_getfd` (`no-pidfd` on any device): a fact
/// of the machine, not of the driver, so that `ipc::pidfd` asks it (the calls are the kernel's, made for
/// real in the simulation otherwise).
pub fn kernel_lacks_pidfd_getfd() -> bool {
    std::env::var(SIMULATE_ENV).is_ok_and(|spec| {
        spec.split(',').flat_map(|kind| kind.split('+')).any(|kind| kind.trim() == "no-pidfd")
    })
}

/// Whether the simulated process has an IMEX channel (`imex` on any device), where the simulation was
/// asked for: the fact that `placement` reads from `/dev/nvidia-caps-imex-channels/` otherwise, so that the
/// forecast of fabric handles and the simulated driver's answer rest on the same channel.
pub fn simulated_imex_channel() -> Option<bool> {
    let spec = std::env::var(SIMULATE_ENV).ok()?;
    Some(spec.split(',').flat_map(|kind| kind.split('+')).any(|kind| kind.trim() == "imex"))
}

/// The UUIDs of the simulated GPUs this process sees (`CUDA_VISIBLE_DEVICES` honoured), where the
/// simulation was asked for: the fact `placement` reads from the NVIDIA driver's /proc files otherwise.
pub fn simulated_gpus() -> Option<Vec<String>> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    simulated_gpus_of(std::env::var(SIMULATE_ENV).ok().as_deref(), Some(visible.as_deref()))
}

/// The UUIDs of the simulated GPUs of a process whose simulation was asked for with `spec` (`None`: it
/// was not), less those its `CUDA_VISIBLE_DEVICES` hides where `visible` is given (`Some(None)`: unset);
/// `visible: None`: every GPU it has, hidden or not. For another process, read from its environment.
pub fn simulated_gpus_of(spec: Option<&str>, visible: Option<Option<&str>>) -> Option<Vec<String>> {
    let count = spec?.split(',').filter(|kind| !kind.trim().is_empty()).count();
    let physical = match visible.flatten() {
        Some(list) => visible_devices(list, count),
        None => (0..count as i32).collect(),
    };
    Some(physical.into_iter().map(|d| uuid_text(&simulated_uuid(d))).collect())
}

/// Whether the simulated machine is WSL2 (`wsl` on any device), where the simulation was asked for.
pub fn simulated_wsl() -> Option<bool> {
    simulated_wsl_of(std::env::var(SIMULATE_ENV).ok().as_deref())
}

/// [`simulated_wsl`] of a process whose simulation was asked for with `spec`.
pub fn simulated_wsl_of(spec: Option<&str>) -> Option<bool> {
    Some(spec?.split(',').flat_map(|kind| kind.split('+')).any(|kind| kind.trim() == "wsl"))
}

/// [`simulated_imex_channel`] of a process whose simulation was asked for with `spec`.
pub fn simulated_imex_channel_of(spec: Option<&str>) -> Option<bool> {
    Some(spec?.split(',').flat_map(|kind| kind.split('+')).any(|kind| kind.trim() == "imex"))
}

/// The machine's ordinals that `CUDA_VISIBLE_DEVICES=list` keeps of `count` devices, in its order: each entry
/// an ordinal or a UUID (or its prefix); the list ends at the first entry that names none, as the driver's.
pub(super) fn visible_devices(list: &str, count: usize) -> Vec<i32> {
    let mut kept = Vec::new();
    for entry in list.split(',').map(str::trim) {
        let named = match entry.parse::<usize>() {
            Ok(ordinal) => (ordinal < count).then_some(ordinal as i32),
            Err(_) if entry.starts_with("GPU-") && entry.len() > 4 => {
                (0..count as i32).find(|&d| uuid_text(&simulated_uuid(d)).starts_with(entry))
            }
            Err(_) => None,
        };
        match named {
            Some(device) if !kept.contains(&device) => kept.push(device),
            _ => break,
        }
    }
    kept
}

/// A simulated device's UUID: the same for device N in every process that simulates it, so that processes
/// which see fewer devices (a joiner in another container, say) lack the others' UUIDs, as on a GPU host.
pub(super) fn simulated_uuid(device: i32) -> [u8; 16] {
    let mut uuid = *b"SIMULATEDGPU\0\0\0\0";
    uuid[12..].copy_from_slice(&(device as u32).to_be_bytes());
    uuid
}
