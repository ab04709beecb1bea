//! Whose process an Xid names. The kernel's Xid record names the process that faulted (`pid=<pid>,
//! name=<comm>`), by its pid in the kernel's own (initial) PID namespace. A run's processes are noted here as
//! they come ([`note`]: every process this process starts, through `relaunch`, and every process the server
//! admits, by its socket's credentials), so that at the end an Xid's pid is said to be one of the run's, another
//! process's, or not known: no pid in the record (`pid=0`, as for a GPU fallen off the bus), or this process
//! is in a PID namespace of its own, whose pids are not the kernel's.
//!
//! The note is kept process-wide, as a list of pids and nothing more: the processes are started and admitted
//! deep in the run's story, and the kernel's log is read at its end, in `main`. It carries no result.

use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// The pids of the processes of this run that this process started or admitted, as this process sees them.
static NOTED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The inode of the kernel's initial PID namespace (`PROC_PID_INIT_INO`): `/proc/self/ns/pid` names it
/// where this process's pids are the kernel's.
const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// Notes `pid` (as this process sees it) as one of the run's processes.
pub(crate) fn note(pid: u32) {
    NOTED.lock().unwrap_or_else(PoisonError::into_inner).push(pid);
}

/// Whose process the one an Xid record names is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Faulting {
    /// One of the run's processes.
    Run,
    /// Another process on the node: another user's, another program's.
    Another,
    /// The record names no process, or this process cannot tell (its pids are not the kernel's).
    NotKnown,
}

impl Faulting {
    /// The process with `pid` in the kernel's record (`None`, or 0: none named).
    pub(crate) fn of(pid: Option<u32>) -> Self {
        match pid {
            None | Some(0) => Faulting::NotKnown,
            Some(_) if !pids_are_the_kernels() => Faulting::NotKnown,
            Some(pid) => Self::among(pid, &run_pids()),
        }
    }

    /// The process with `pid` where the run's processes are `run`.
    fn among(pid: u32, run: &[u32]) -> Self {
        if run.contains(&pid) { Faulting::Run } else { Faulting::Another }
    }

    /// In a few words, for the text: `one of the run's processes`.
    pub(crate) fn words(self) -> &'static str {
        match self {
            Faulting::Run => "one of the run's processes",
            Faulting::Another => "another process, not one of the run's",
            Faulting::NotKnown => "whose process is not known",
        }
    }
}

/// This process and every process of the run noted so far.
fn run_pids() -> Vec<u32> {
    let mut pids = NOTED.lock().unwrap_or_else(PoisonError::into_inner).clone();
    pids.push(std::process::id());
    pids
}

/// Whether this process's pids are the kernel's: it is in the initial PID namespace.
fn pids_are_the_kernels() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|ns| ns.ino() == INITIAL_PID_NAMESPACE)
}

/// The pid and the name of the process an Xid record names: `..., pid=1234, name=a.out, channel ...`; the
/// name as the kernel wrote it (up to the next `, `).
pub(crate) fn named_in(message: &str) -> (Option<u32>, Option<String>) {
    let field =
        |key: &str| message.split(", ").find_map(|part| part.trim().strip_prefix(key)).map(str::to_owned);
    let pid = field("pid=").and_then(|pid| pid.trim().parse().ok());
    let name = field("name=").filter(|name| !name.is_empty());
    (pid, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pid and name are read from the record as the H200 host's kernel wrote them, and from records that
    /// lack either.
    #[test]
    fn an_xid_record_names_its_process() {
        let h200 = "NVRM: Xid (PCI:0000:00:06): 31, pid=4242, name=xid, channel 0x00000002, intr 00000000. \
                    MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted @ 0x7f1e_00000000. Fault is of type \
                    FAULT_PDE ACCESS_TYPE_VIRT_WRITE";
        assert_eq!(named_in(h200), (Some(4242), Some("xid".to_owned())));
        let bus = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.";
        assert_eq!(named_in(bus), (Some(0), None));
        assert_eq!(named_in("NVRM: Xid (PCI:0000:17:00): 119, Timeout after 6s"), (None, None));
        assert_eq!(named_in("NVRM: Xid (PCI:0000:17:00): 13, pid='<unknown>', name=<unknown>, x").0, None);
    }

    /// A pid of the run's is the run's; any other is another's; none (or 0) is not known.
    #[test]
    fn a_pid_is_the_runs_only_where_the_run_has_it() {
        assert_eq!(Faulting::among(7, &[5, 7]), Faulting::Run);
        assert_eq!(Faulting::among(8, &[5, 7]), Faulting::Another);
        assert_eq!(Faulting::of(None), Faulting::NotKnown);
        assert_eq!(Faulting::of(Some(0)), Faulting::NotKnown);
    }
}
