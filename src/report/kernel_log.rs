//! The kernel's word beside a run's end: where the run failed (or was the benchmark, passed or not), the Xid
//! errors that the kernel logged for its chosen GPUs since it began (see `node`), said on standard error,
//! named in the failure's reason (so on its verdict line, and in the reason a process outside an isolation
//! or the top of `--ipc all` reads back), and kept for the document: its `xid` list, its `cause` and `fix`.
//! Only the run's own Xids (the node's, or one of its processes' faults: `Xid::is_the_runs`) are named as its
//! cause; another process's is listed and said as such.
//! Where the log could not be read, the document says why, once; a run that passed says nothing of it.

use super::document::{Mode, Status};
use super::{Findings, document::Device};
use crate::node::{Gpu, KernelLog, RunStart, Xid};

/// Reads the kernel's log for the run's chosen GPUs (those with a PCI address: no simulated one, unless a
/// test's log is read) where the run ended with `status` in `mode` and that calls for it; says what it
/// found, names it in `reason` where the run failed, and keeps it in `findings` for the document.
pub fn look_at_the_kernel_log(
    start: &mut RunStart,
    status: Status,
    mode: Mode,
    findings: &mut Findings,
    reason: &mut Option<String>,
) {
    let failed = status == Status::Failed;
    let measured = mode == Mode::Bench && status == Status::Passed;
    if !(failed || measured) {
        return;
    }
    let Some(log) = crate::node::look(start, &gpus(&findings.devices)) else { return };
    for line in log.lines() {
        eprint_line!("simple-ipc: {line}");
    }
    if failed {
        if let Some(why) = &log.unread {
            eprint_line!("simple-ipc: the kernel's log could not be read for Xid errors: {why}");
        }
        if let (Some(said), Some(named)) = (reason.as_mut(), log.named()) {
            let (first, rest) = said.split_once('\n').map_or((said.as_str(), None), |(f, r)| (f, Some(r)));
            *said = match rest {
                Some(rest) => format!("{first}; {named}\n{rest}"),
                None => format!("{first}; {named}"),
            };
        }
    }
    findings.kernel_log = Some(log);
}

/// The chosen devices that have a PCI address.
fn gpus(devices: &[Device]) -> Vec<Gpu> {
    devices
        .iter()
        .filter(|d| d.chosen)
        .filter_map(|d| Some(Gpu { index: d.index, uuid: d.uuid.clone(), pci_bus_id: d.pci_bus_id.clone()? }))
        .collect()
}

/// `said` (a diagnosis's cause or fix), with each of the run's own Xids of `log` as `each` words it, once
/// per number and GPU, where the run `status` failed; `said` as it is otherwise.
pub(super) fn beside(
    said: Option<String>,
    log: &KernelLog,
    status: Status,
    each: impl Fn(&Xid) -> String,
) -> Option<String> {
    let runs: Vec<&Xid> = log.xid.iter().filter(|x| x.is_the_runs()).collect();
    if status != Status::Failed || runs.is_empty() {
        return said;
    }
    let mut words: Vec<String> = Vec::new();
    for xid in runs {
        let one = each(xid);
        if !words.contains(&one) {
            words.push(one);
        }
    }
    let words = words.join("; ");
    Some(match said {
        Some(said) => format!("{said}\n{words}"),
        None => words,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::xid::{Faulting, Whose};

    fn xid(number: u32) -> Xid {
        Xid {
            xid: number,
            device: 1,
            uuid: "GPU-1".into(),
            pci_bus_id: "0000:11:00.0".into(),
            seconds_into_run: 0.5,
            message: "NVRM: Xid (PCI:0000:11:00): 79".into(),
            meaning: "GPU has fallen off the bus: gone".into(),
            action: "the node needs attention".into(),
            whose: Whose::Node,
            pid: None,
            process_name: None,
            process: Faulting::NotKnown,
        }
    }

    /// A failure's cause and fix gain each Xid once, after what the diagnosis said; a run that did not fail,
    /// or a log without Xid, leaves them as they were.
    #[test]
    fn a_failures_cause_names_each_xid_once() {
        let log = KernelLog { xid: vec![xid(79), xid(79), xid(31)], unread: None };
        let number = |x: &Xid| format!("Xid {}", x.xid);
        assert_eq!(beside(None, &log, Status::Failed, number).as_deref(), Some("Xid 79; Xid 31"));
        let diagnosed = beside(Some("a cause".into()), &log, Status::Failed, number);
        assert_eq!(diagnosed.as_deref(), Some("a cause\nXid 79; Xid 31"));
        assert_eq!(beside(Some("a".into()), &log, Status::Passed, number).as_deref(), Some("a"));
        assert_eq!(beside(None, &KernelLog::default(), Status::Failed, number), None);
        // Another process's fault on the run's GPU is no cause of the run's; one of the run's processes' is.
        let of = |process| Xid { whose: Whose::Program, process, pid: Some(7), ..xid(31) };
        let another = KernelLog { xid: vec![of(Faulting::Another), of(Faulting::NotKnown)], unread: None };
        assert_eq!(beside(Some("a".into()), &another, Status::Failed, number).as_deref(), Some("a"));
        let ours = KernelLog { xid: vec![of(Faulting::Another), of(Faulting::Run)], unread: None };
        assert_eq!(beside(None, &ours, Status::Failed, number).as_deref(), Some("Xid 31"));
    }

    /// Only the chosen devices with a PCI address are looked for.
    #[test]
    fn the_runs_gpus_are_the_chosen_ones_with_an_address() {
        let device = |index, pci: Option<&str>, chosen| Device {
            index,
            name: "GPU".into(),
            uuid: format!("GPU-{index}"),
            pci_bus_id: pci.map(str::to_owned),
            l2_cache_bytes: 0,
            chosen,
        };
        let devices = [
            device(0, Some("0000:10:00.0"), true),
            device(1, Some("0000:11:00.0"), false),
            device(2, None, true),
        ];
        assert_eq!(
            gpus(&devices),
            vec![Gpu { index: 0, uuid: "GPU-0".into(), pci_bus_id: "0000:10:00.0".into() }]
        );
    }
}
