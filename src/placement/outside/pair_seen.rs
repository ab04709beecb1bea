//! Facts of a pair of processes that only a view from outside reads: whether the importer is an ancestor of
//! the exporter (Yama's scope 1), and which process holds the exporter's own pid number in the importer's
//! PID namespace.

use std::path::Path;

use super::super::share::{EXPORTERS_NUMBER_THERE, Fact, IMPORTER_IS_ANCESTOR, Sameness};
use super::{Observed, read_lossily};

/// Facts of the pair that only an outside view reads, given as the pids this process sees.
pub struct PairSeen {
    /// Whether the importer is an ancestor of the exporter (Yama's scope 1 lets an ancestor in).
    pub importer_is_ancestor: bool,
    /// The process at the exporter's own pid number in the importer's PID namespace, where the two differ:
    /// `Some(name)`, or `None` where there is none.
    pub at_exporters_number: Option<String>,
}

/// [`PairSeen`] of `exporter` and `importer`.
pub fn pair(exporter: &Observed, importer: &Observed) -> PairSeen {
    let mut importer_is_ancestor = false;
    let mut current = exporter.pid;
    for _ in 0..64 {
        match crate::os::proc_stat::read(current) {
            Some(stat) if stat.parent > 0 => {
                current = stat.parent;
                if current == importer.pid {
                    importer_is_ancestor = true;
                    break;
                }
            }
            _ => break,
        }
    }
    let number = exporter.place.pid;
    let there = importer.place.namespaces.pid;
    let at_exporters_number = std::fs::read_dir("/proc").ok().and_then(|entries| {
        entries.flatten().find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
            if super::super::parse_namespace_link(&link.to_string_lossy()) != there {
                return None;
            }
            let status = read_lossily(Path::new(&format!("/proc/{pid}/status"))).ok()?;
            let own: u32 =
                crate::os::access::status_field(&status, "NSpid")?.split_whitespace().last()?.parse().ok()?;
            (own == number).then(|| {
                let name = crate::os::access::status_field(&status, "Name").unwrap_or_default();
                format!("{} (pid {pid} here)", crate::output::printable(&name))
            })
        })
    });
    // Every PID namespace has its pid 1 (its init), whether or not its link can be read here.
    let at_exporters_number =
        at_exporters_number.or_else(|| (number == 1).then(|| "its own init (pid 1)".to_owned()));
    PairSeen { importer_is_ancestor, at_exporters_number }
}

/// `facts` with what an outside view read of the pair ([`PairSeen`](PairSeen)) in place
/// of what the places alone could tell.
pub fn with_outside(mut facts: Vec<Fact>, seen: &PairSeen) -> Vec<Fact> {
    let pid_namespaces_differ =
        facts.iter().any(|f| f.fact == super::super::share::FACTS[0].0 && f.same == Sameness::Differs);
    for fact in &mut facts {
        if fact.fact == IMPORTER_IS_ANCESTOR {
            fact.same = if seen.importer_is_ancestor { Sameness::Same } else { Sameness::Differs };
        }
        if fact.fact == EXPORTERS_NUMBER_THERE && pid_namespaces_differ {
            fact.same = if seen.at_exporters_number.is_some() { Sameness::Same } else { Sameness::Differs };
            fact.detail = seen.at_exporters_number.clone();
        }
    }
    facts
}
