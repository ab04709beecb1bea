//! Simulated legacy IPC memory handles, and the shape every simulated handle has ([`encode`]): a tag, the
//! exporter's pid, a number of its own and a length. A legacy memory handle names the exporter's pid and its
//! descriptor of the buffer's memfd; opening it maps `/proc/<pid>/fd/<fd>` (through the `/proc` this process
//! had before it mounted its own, where it kept one: [`super::keep_outer_proc`]). A handle whose exporter has
//! this process's own pid number is refused as the CUDA driver refuses it ([`refuse_own_pid`]).

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;

use anyhow::{Context, Result, anyhow};

use super::memory::{Kind, Mapping};
use super::{HostDriver, OUTER_PROC, SimulatedDevice, beyond, failed};
use crate::driver::error::code;
use crate::driver::handles::{DevicePtr, IPC_HANDLE_SIZE, IpcHandleBytes};
use crate::driver::ipc::Ipc;

const BUFFER_TAG: &[u8; 8] = b"SIMIPC\0\x02";

/// A simulated IPC handle: `tag`, then the exporter's pid, a number of its own (a descriptor, an event's
/// number) and a length.
pub(super) fn encode(tag: &[u8; 8], pid: u32, number: i32, len: u64) -> IpcHandleBytes {
    let mut handle = [0u8; IPC_HANDLE_SIZE];
    handle[..8].copy_from_slice(tag);
    handle[8..12].copy_from_slice(&pid.to_le_bytes());
    handle[12..16].copy_from_slice(&number.to_le_bytes());
    handle[16..24].copy_from_slice(&len.to_le_bytes());
    handle
}

/// What [`encode`] put in `handle`; `None` if it is not a handle of `tag`'s kind.
pub(super) fn decode(handle: &IpcHandleBytes, tag: &[u8; 8]) -> Option<(u32, i32, u64)> {
    if &handle[..8] != tag {
        return None;
    }
    let word = |at: usize| [handle[at], handle[at + 1], handle[at + 2], handle[at + 3]];
    let mut len = [0u8; 8];
    len.copy_from_slice(&handle[16..24]);
    Some((u32::from_le_bytes(word(8)), i32::from_le_bytes(word(12)), u64::from_le_bytes(len)))
}

/// The handle of another process whose pid number is this process's own: the CUDA driver takes it for one
/// of its own and refuses it, as when two containers' first processes (both pid 1) meet.
pub(super) fn refuse_own_pid(call: &str, exporter: u32) -> Result<()> {
    if exporter == std::process::id() {
        let why = format!("the exporter's pid number is this process's own ({exporter})");
        return Err(failed(call, code::INVALID_CONTEXT, why));
    }
    Ok(())
}

impl Ipc for HostDriver {
    unsafe fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> Result<IpcHandleBytes> {
        let call = "cuIpcGetMemHandle";
        let (mapping, kind) = self.memory.get(call, ptr)?;
        let Kind::Allocated { device } = kind else {
            return Err(failed(
                call,
                code::INVALID_VALUE,
                format!("{:#x} is {kind:?} memory, not cuMemAlloc's", ptr.0),
            ));
        };
        if self.device(call, device).is_ok_and(|d| d.lacks(SimulatedDevice::NoLegacyIpc)) {
            return Err(failed(call, code::NOT_SUPPORTED, format!("device {device} has no legacy IPC")));
        }
        if self.device(call, device).is_ok_and(|d| d.has(SimulatedDevice::Wsl)) {
            return Err(failed(call, code::NOT_SUPPORTED, "WSL2 has no legacy IPC"));
        }
        Ok(encode(BUFFER_TAG, std::process::id(), mapping.raw_fd(), mapping.len() as u64))
    }

    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr> {
        let call = "cuIpcOpenMemHandle";
        let (pid, fd, len) = decode(handle, BUFFER_TAG)
            .ok_or_else(|| failed(call, code::INVALID_VALUE, "not a simulated legacy memory handle"))?;
        refuse_own_pid(call, pid)?;
        let path = match OUTER_PROC.get() {
            Some(proc) => format!("/proc/self/fd/{}/{pid}/fd/{fd}", proc.as_raw_fd()),
            None => format!("/proc/{pid}/fd/{fd}"),
        };
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                // The driver's kernel module reaches the memory whatever the namespaces; /proc does not.
                let why = format!(
                    "it opens another process's memory as {path}, which a process in another user namespace \
                     may not ({e}); the CUDA driver's kernel module is not held back so"
                );
                return beyond(call, code::NOT_SUPPORTED, why);
            }
            // A process in another PID namespace (`unshare --pid`) does not see the exporter in its /proc;
            // the driver's kernel module reaches the memory all the same (the H200 host passes there).
            let why = format!(
                "the exporting process is not visible from here ({path}: {e}); the CUDA driver's kernel module \
                 reaches it whatever the namespaces"
            );
            beyond(call, code::NOT_SUPPORTED, why)
        })?;
        let size = file.metadata().with_context(|| format!("fstat of {path}"))?.len();
        if size != len {
            let why = format!("{path} has {size} bytes, the handle says {len}");
            return Err(failed(call, code::INVALID_VALUE, why));
        }
        let bytes = usize::try_from(len).map_err(|_| anyhow!("{len} bytes do not fit this address space"))?;
        self.memory.insert(Mapping::new(file, bytes)?, Kind::Opened)
    }

    unsafe fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> Result<()> {
        self.memory.remove("cuIpcCloseMemHandle", ptr, |kind, _| kind == Kind::Opened).map(drop)
    }
}
