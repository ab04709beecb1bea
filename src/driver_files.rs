//! The files the CUDA driver makes in `/dev/shm` for a process's interprocess events,
//! `cuda.shm.<n>.<exporter pid, hex>.<m>` (driver 580). The driver removes them only when the exporter exits
//! normally; importers map them when they open the event handle, so once they all have, or once the exporter
//! is dead, the names can go.

use anyhow::{Context, Result};
use nix::errno::Errno;

/// Whether `name` is one of the driver's event files of the process `pid`.
pub fn is_event_file_of(name: &str, pid: u32) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() == 5 && parts[..2] == ["cuda", "shm"] && parts[3] == format!("{pid:x}")
}

/// Removes the names of `pid`'s event files from `/dev/shm`; returns how many it removed.
pub fn remove_event_files_of(pid: u32) -> Result<usize> {
    let entries = std::fs::read_dir("/dev/shm").context("listing /dev/shm")?;
    let mut removed = 0;
    for name in entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()) {
        if is_event_file_of(&name, pid) {
            match nix::sys::mman::shm_unlink(name.as_str()) {
                Ok(()) => removed += 1,
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(e).with_context(|| format!("shm_unlink({name})")),
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_event_files_of_that_pid_match() {
        assert!(is_event_file_of("cuda.shm.0.1a2b.1", 0x1a2b));
        assert!(!is_event_file_of("cuda.shm.0.1a2b.1", 0x1a2c));
        assert!(!is_event_file_of("cuda.shm.0.1a2b", 0x1a2b));
        assert!(!is_event_file_of("simpleIPCshm6699", 6699));
        assert!(!is_event_file_of("nccl.shm.0.1a2b.1", 0x1a2b));
    }

    #[test]
    fn removes_those_names_and_leaves_the_others() {
        let pid = 0x7fff_fff0 - std::process::id(); // not a live process's pid here
        let mine = format!("/dev/shm/cuda.shm.0.{pid:x}.1");
        let other = format!("/dev/shm/cuda.shm.0.{:x}.1", pid + 1);
        std::fs::write(&mine, b"").unwrap();
        std::fs::write(&other, b"").unwrap();
        assert_eq!(remove_event_files_of(pid).unwrap(), 1);
        assert!(!std::path::Path::new(&mine).exists());
        assert!(std::path::Path::new(&other).exists());
        std::fs::remove_file(other).unwrap();
    }
}
