//! NVIDIA's Xid errors in the kernel's log (`NVRM: Xid (PCI:0000:17:00): 31, pid=..., ...`): found among the
//! records of a run (`kmsg`), kept where they name one of the run's GPUs by its PCI address, and named as
//! NVIDIA's Xid catalogue names them, with what to do ([`catalogue`]): whether the program is at fault, or
//! the node needs attention; and whose process the record names ([`Faulting`]). An Xid is the run's, to
//! name as its cause, where it is the node's (every process on the GPU meets it) or where the record names
//! one of the run's processes: another user's fault on a shared GPU is listed, said as another's, and no
//! cause of the run's.

use serde::{Deserialize, Serialize};

pub use super::catalogue::Whose;
use super::catalogue::catalogue;
use super::kmsg::{self, Record, RunStart};
pub use super::processes::Faulting;

/// One of the run's GPUs, to match the log's lines against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Its index, as this process numbers it.
    pub index: i32,
    pub uuid: String,
    /// As CUDA writes it: `0000:17:00.0`.
    pub pci_bus_id: String,
}

/// An Xid the kernel logged during the run for one of its GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Xid {
    /// Its number.
    pub xid: u32,
    /// The GPU: its index as the run numbers it, its UUID and PCI address.
    pub device: i32,
    pub uuid: String,
    pub pci_bus_id: String,
    /// From the run's start to the record, by the kernel's log clock.
    pub seconds_into_run: f64,
    /// The record's text, as the kernel logged it (control characters escaped).
    pub message: String,
    /// What NVIDIA's Xid catalogue says it means.
    pub meaning: String,
    /// What to do.
    pub action: String,
    pub whose: Whose,
    /// The process the record names, as the kernel numbers it (`pid=`), where it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Its name (`name=`, the kernel's `comm`, control characters escaped), where the record has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_name: Option<String>,
    /// Whose process that is: one of the run's, another's, or not known.
    #[serde(default = "not_known")]
    pub process: Faulting,
}

fn not_known() -> Faulting {
    Faulting::NotKnown
}

impl Xid {
    /// Whether it is the run's to name as a cause: the node's, or a fault of one of the run's processes.
    pub fn is_the_runs(&self) -> bool {
        self.whose == Whose::Node || self.process == Faulting::Run
    }

    /// Whose process the record names, in words: `pid 4242 (xid): another process, not one of the run's`.
    fn process_words(&self) -> String {
        let name = self.process_name.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
        match self.pid.filter(|&pid| pid != 0) {
            Some(pid) => format!("pid {pid}{name}, as the kernel numbers it: {}", self.process.words()),
            None => "the record names no process".to_owned(),
        }
    }
}

/// What the kernel's log said of a run's GPUs: its Xids, or why it could not be read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelLog {
    pub xid: Vec<Xid>,
    /// Why the log could not be read, where it could not.
    pub unread: Option<String>,
}

/// The Xids of the run's `gpus` that the kernel logged since `start`; `None` where no GPU has a PCI address
/// to match (a simulation), which reads nothing.
pub fn look(start: &mut RunStart, gpus: &[Gpu]) -> Option<KernelLog> {
    if gpus.is_empty() {
        return None;
    }
    let began = start.micros();
    Some(match kmsg::since(start) {
        Ok(records) => KernelLog { xid: of_gpus(&records, gpus, began), unread: None },
        Err(why) => KernelLog { xid: Vec::new(), unread: Some(why) },
    })
}

/// The Xid lines among `records` that name one of `gpus`, in the log's order; `began`: the run's start on
/// the log's clock (microseconds).
fn of_gpus(records: &[Record], gpus: &[Gpu], began: u64) -> Vec<Xid> {
    records
        .iter()
        .filter_map(|record| {
            let (address, number) = xid_line(&record.message)?;
            let gpu = gpus.iter().find(|gpu| PciAddress::parse(&gpu.pci_bus_id) == Some(address))?;
            let (meaning, action, whose) = catalogue(number);
            let (pid, process_name) = super::processes::named_in(&record.message);
            Some(Xid {
                xid: number,
                device: gpu.index,
                uuid: gpu.uuid.clone(),
                pci_bus_id: gpu.pci_bus_id.clone(),
                seconds_into_run: (record.micros as f64 - began as f64) / 1e6,
                message: escaped(&record.message),
                meaning: meaning.to_owned(),
                action: action.to_owned(),
                whose,
                process: Faulting::of(pid),
                pid,
                process_name: process_name.as_deref().map(escaped),
            })
        })
        .collect()
}

/// A GPU's place on the PCI bus: domain, bus and device (the function left out: the log's Xid lines do
/// not write it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PciAddress {
    domain: u32,
    bus: u32,
    device: u32,
}

impl PciAddress {
    /// From `0000:17:00`, `0000:17:00.0` or `00000000:17:00.0` (hexadecimal, any case).
    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split(':');
        let (domain, bus, device) = (parts.next()?, parts.next()?, parts.next()?);
        let device = device.split_once('.').map_or(device, |(device, _function)| device);
        let hex = |part: &str| u32::from_str_radix(part, 16).ok();
        match parts.next() {
            Some(_) => None,
            None => Some(Self { domain: hex(domain)?, bus: hex(bus)?, device: hex(device)? }),
        }
    }
}

/// The GPU and the Xid's number of an Xid line: `NVRM: Xid (PCI:0000:17:00): 31, ...` (drivers before 470
/// write the address without `PCI:`).
fn xid_line(message: &str) -> Option<(PciAddress, u32)> {
    let (_, rest) = message.split_once("NVRM: Xid (")?;
    let (address, rest) = rest.split_once(')')?;
    let address = PciAddress::parse(address.strip_prefix("PCI:").unwrap_or(address))?;
    let number = rest.strip_prefix(':')?.trim_start();
    let digits = number.find(|c: char| !c.is_ascii_digit()).unwrap_or(number.len());
    Some((address, number[..digits].parse().ok()?))
}

impl KernelLog {
    /// The run's Xids ([`Xid::is_the_runs`]) in a few words, for a verdict line (`the kernel logged Xid 31
    /// (GPU memory page fault ...) on GPU 0 (0000:17:00.0)`), each number and GPU once; `None` where there is
    /// none.
    pub fn named(&self) -> Option<String> {
        let mut seen: Vec<(u32, i32, usize)> = Vec::new();
        for xid in self.xid.iter().filter(|x| x.is_the_runs()) {
            match seen.iter_mut().find(|(n, d, _)| (*n, *d) == (xid.xid, xid.device)) {
                Some((_, _, times)) => *times += 1,
                None => seen.push((xid.xid, xid.device, 1)),
            }
        }
        let named: Vec<String> = seen
            .iter()
            .filter_map(|&(number, device, times)| {
                let xid =
                    self.xid.iter().find(|x| x.is_the_runs() && (x.xid, x.device) == (number, device))?;
                let short = xid.meaning.split(':').next().unwrap_or_default();
                let times = if times > 1 { format!(" ({times} times)") } else { String::new() };
                Some(format!("Xid {number} ({short}) on GPU {device} ({}){times}", xid.pci_bus_id))
            })
            .collect();
        (!named.is_empty()).then(|| format!("the kernel logged {}", named.join(", ")))
    }

    /// Each Xid in a line of its own: when, whose process it names, what it means and what to do (where it
    /// is the run's; another's is said as such, and not how to fix it).
    pub fn lines(&self) -> Vec<String> {
        self.xid
            .iter()
            .map(|x| {
                let at = format!(
                    "the kernel logged Xid {} on GPU {} ({}) {:.3} s into the run, {}",
                    x.xid,
                    x.device,
                    x.pci_bus_id,
                    x.seconds_into_run,
                    x.process_words()
                );
                match x.is_the_runs() {
                    true => format!("{at}: {}; what to do: {} [{}]", x.meaning, x.action, x.message),
                    false => format!("{at}; not this run's cause: {} [{}]", x.meaning, x.message),
                }
            })
            .collect()
    }
}

/// `text` with each control character and bidirectional-text control escaped, fit to print.
fn escaped(text: &str) -> String {
    crate::output::printable(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: i32, pci_bus_id: &str) -> Gpu {
        Gpu { index, uuid: format!("GPU-{index}"), pci_bus_id: pci_bus_id.into() }
    }

    fn record(micros: u64, message: &str) -> Record {
        Record { micros, message: message.into() }
    }

    /// The address is read in each form the driver and CUDA write it, any case; the Xid's number after it.
    #[test]
    fn an_xid_line_gives_its_gpu_and_number() {
        let at = |d, b, v| PciAddress { domain: d, bus: b, device: v };
        for (line, expected) in [
            ("NVRM: Xid (PCI:0000:17:00): 31, pid=1234, name=a.out, Ch 00000008", Some((at(0, 0x17, 0), 31))),
            (
                "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
                Some((at(0, 0x3b, 0), 79)),
            ),
            ("NVRM: Xid (0001:C1:02): 13, Graphics SM Warp Exception", Some((at(1, 0xc1, 2), 13))),
            ("NVRM: Xid (PCI:0000:17:00): 119, Timeout after 6s", Some((at(0, 0x17, 0), 119))),
            ("NVRM: GPU at PCI:0000:17:00: GPU-6511edb2", None),
            ("NVRM: Xid (PCI:0000:17:00): x, no number", None),
            ("NVRM: Xid (PCI:zz:17:00): 31, bad address", None),
        ] {
            assert_eq!(xid_line(line), expected, "{line}");
        }
        assert_eq!(PciAddress::parse("00000000:17:00.0"), Some(at(0, 0x17, 0)), "nvidia-smi's form");
        assert_eq!(PciAddress::parse("0000:17:00.0"), PciAddress::parse("0000:17:00"), "CUDA's, the log's");
        assert_eq!(PciAddress::parse("0000:17:00:00"), None);
    }

    /// Only the run's GPUs' Xids are kept, each with its GPU, its time into the run, the catalogue's words
    /// and whose process it names; another GPU's, or a line of no Xid, are not. Only the run's own are named
    /// (the node's, and its processes' faults): another process's is listed, said as another's.
    #[test]
    fn only_the_runs_gpus_xids_are_named() {
        let gpus = [gpu(0, "0000:17:00.0"), gpu(1, "00000000:3B:00.0")];
        let ours =
            format!("NVRM: Xid (PCI:0000:17:00): 43, pid={}, name=simple-ipc, Ch 8", std::process::id());
        let records = [
            record(2_500_000, "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."),
            record(2_600_000, "NVRM: Xid (PCI:0000:99:00): 31, pid=7, another node's GPU"),
            record(2_700_000, "nvidia-nvlink: Nvlink Core is being initialized"),
            record(3_000_000, "NVRM: Xid (PCI:0000:17:00): 31, pid=7, name=simple-ipc\u{1b}[2J"),
            record(3_100_000, "NVRM: Xid (PCI:0000:17:00): 31, pid=7, name=simple-ipc"),
            record(3_200_000, &ours),
        ];
        let found = of_gpus(&records, &gpus, 2_000_000);
        let summary: Vec<(u32, i32, f64)> =
            found.iter().map(|x| (x.xid, x.device, x.seconds_into_run)).collect();
        assert_eq!(summary, vec![(79, 1, 0.5), (31, 0, 1.0), (31, 0, 1.1), (43, 0, 1.2)]);
        assert_eq!((found[0].whose, found[1].whose), (Whose::Node, Whose::Program));
        let processes: Vec<(Option<u32>, Faulting)> = found.iter().map(|x| (x.pid, x.process)).collect();
        let this = Some(std::process::id());
        assert_eq!(
            processes,
            [
                (Some(0), Faulting::NotKnown),
                (Some(7), Faulting::Another),
                (Some(7), Faulting::Another),
                (this, Faulting::Run)
            ],
            "this test's process is in the initial PID namespace: {found:?}"
        );
        assert_eq!(found[2].process_name.as_deref(), Some("simple-ipc"));
        assert!(found[0].action.starts_with("the node needs attention, not the program"), "{found:?}");
        assert!(found[1].meaning.contains("a mapping used after its exporter freed"), "{found:?}");
        assert!(found[1].message.ends_with("simple-ipc\\u{1b}[2J"), "escaped: {found:?}");
        let log = KernelLog { xid: found, unread: None };
        assert_eq!(
            log.named().as_deref(),
            Some(
                "the kernel logged Xid 79 (GPU has fallen off the bus) on GPU 1 (00000000:3B:00.0), Xid 43 \
                 (GPU stopped processing) on GPU 0 (0000:17:00.0)"
            ),
            "another process's Xid 31 is not named"
        );
        let lines = log.lines();
        assert_eq!(lines.len(), 4);
        assert!(
            lines[1].contains(
                "pid 7 (simple-ipc\\u{1b}[2J), as the kernel numbers it: another process, not one \
                               of the run's; not this run's cause"
            ),
            "{lines:?}"
        );
        assert!(!lines[1].contains("what to do"), "{lines:?}");
        assert!(lines[3].contains("one of the run's processes: GPU stopped processing"), "{lines:?}");
        assert_eq!(KernelLog::default().named(), None);
    }
}
