//! What two processes share: each fact of their [`Place`]s side by side (same, differs, or not known), with
//! the pid numbers where they collide, and the table the server prints of the exporter against each importer.

use serde::{Deserialize, Serialize};

use super::Place;

/// A fact of the pair beyond the table's (`share::compare` adds it): the importer is an ancestor of the
/// exporter (`same`), or is not (`differs`); known only from outside (`--between`), where both pids are.
pub const IMPORTER_IS_ANCESTOR: &str = "importer_is_ancestor";
/// A fact of the pair beyond the table's: where their PID namespaces differ, a process of the importer's
/// namespace has the exporter's own pid number (`same`, its name the detail), or none has (`differs`).
/// Known of any namespace's pid 1 (its init), and from outside of every number.
pub const EXPORTERS_NUMBER_THERE: &str = "exporters_pid_number_taken_there";

/// How one fact compares between the exporter and an importer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sameness {
    Same,
    Differs,
    /// One side could not read it.
    Unknown,
}

/// One fact of the comparison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fact {
    /// `pid_namespace`, `dev_shm`, ...: what `--json` calls it.
    pub fact: String,
    pub same: Sameness,
    /// What differs, where it does: `pid 1 and 1: the same pid number`.
    pub detail: Option<String>,
}

/// The facts, in the order the table shows them, with their names in the table.
pub const FACTS: [(&str, &str); 11] = [
    ("pid_namespace", "PID namespace"),
    ("dev_shm", "/dev/shm"),
    ("ipc_namespace", "SysV IPC namespace"),
    ("net_namespace", "network namespace"),
    ("uts_namespace", "hostname (UTS)"),
    ("boot_id", "node (boot id)"),
    ("mnt_namespace", "mount namespace"),
    ("user_namespace", "user namespace"),
    ("cgroup_namespace", "cgroup namespace"),
    ("gpus", "GPUs"),
    ("imex_channel", "IMEX channel"),
];

fn same_if<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> Sameness {
    match (a, b) {
        (Some(a), Some(b)) if a == b => Sameness::Same,
        (Some(_), Some(_)) => Sameness::Differs,
        _ => Sameness::Unknown,
    }
}

/// The exporter's place against an importer's, one [`Fact`] for each of [`FACTS`].
pub fn compare(exporter: &Place, importer: &Place) -> Vec<Fact> {
    let (e, i) = (&exporter.namespaces, &importer.namespaces);
    let fact = |name: &str, same: Sameness, detail: Option<String>| Fact {
        fact: name.to_owned(),
        detail: detail.filter(|_| same == Sameness::Differs),
        same,
    };
    let pid = same_if(&e.pid, &i.pid);
    let pids = match exporter.pid == importer.pid {
        true => format!("pid {} and {}: the same pid number", exporter.pid, importer.pid),
        false => format!("pid {} and {}", exporter.pid, importer.pid),
    };
    let shm =
        same_if(&exporter.dev_shm.as_ref().map(|s| s.device), &importer.dev_shm.as_ref().map(|s| s.device));
    let gpus = match (&exporter.gpus, &importer.gpus) {
        (Some(theirs), Some(ours)) => match theirs.iter().filter(|g| !ours.contains(g)).collect::<Vec<_>>() {
            lacks if lacks.is_empty() => (Sameness::Same, None),
            lacks => (
                Sameness::Differs,
                Some(format!("lacks {}", lacks.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(", "))),
            ),
        },
        _ => (Sameness::Unknown, None),
    };
    let imex = match (exporter.imex_channel, importer.imex_channel) {
        (true, true) => (Sameness::Same, None),
        (false, false) => (Sameness::Same, Some("neither has one".to_owned())),
        (a, _) => {
            (Sameness::Differs, Some(format!("only the {} has one", if a { "exporter" } else { "importer" })))
        }
    };
    vec![
        fact(FACTS[0].0, pid, Some(pids)),
        fact(FACTS[1].0, shm, Some("another tmpfs".to_owned())),
        fact(FACTS[2].0, same_if(&e.ipc, &i.ipc), None),
        fact(FACTS[3].0, same_if(&e.net, &i.net), Some("an abstract socket does not reach it".to_owned())),
        fact(
            FACTS[4].0,
            same_if(&e.uts, &i.uts),
            Some(format!("{} and {}", exporter.hostname, importer.hostname)),
        ),
        fact(FACTS[5].0, same_if(&exporter.boot_id, &importer.boot_id), Some("another node".to_owned())),
        fact(FACTS[6].0, same_if(&e.mnt, &i.mnt), None),
        fact(FACTS[7].0, same_if(&e.user, &i.user), None),
        fact(FACTS[8].0, same_if(&e.cgroup, &i.cgroup), None),
        fact(FACTS[9].0, gpus.0, gpus.1),
        Fact { fact: FACTS[10].0.to_owned(), same: imex.0, detail: imex.1 },
        // The pair's facts beyond the table, as far as the two places tell them: whether a process holds
        // the exporter's pid number in the importer's PID namespace is known of pid 1 (every namespace has
        // its init); whether the importer is the exporter's ancestor, only from outside (`with_outside`).
        Fact {
            fact: EXPORTERS_NUMBER_THERE.to_owned(),
            same: match (pid, exporter.pid) {
                (Sameness::Differs, 1) => Sameness::Same,
                _ => Sameness::Unknown,
            },
            detail: (pid == Sameness::Differs && exporter.pid == 1)
                .then(|| "its own init (pid 1)".to_owned()),
        },
        Fact { fact: IMPORTER_IS_ANCESTOR.to_owned(), same: Sameness::Unknown, detail: None },
    ]
}

/// The word of a table cell: `same`, `differs` (with its detail), `?`.
fn cell(fact: &Fact) -> String {
    match (fact.same, &fact.detail) {
        (Sameness::Same, None) => "same".to_owned(),
        (Sameness::Same, Some(detail)) => detail.clone(),
        (Sameness::Differs, Some(detail)) => format!("differs: {detail}"),
        (Sameness::Differs, None) => "differs".to_owned(),
        (Sameness::Unknown, _) => "?".to_owned(),
    }
}

/// The widest a column of the table is, in characters: the widest cell this program words whole (a pid
/// collision at `pid_max`, `differs: pid 4194304 and 4194304: the same pid number`, 53; one GPU lacked,
/// `differs: lacks GPU-<36>`, 55). Every row is padded to its column's widest cell, so one long hostname or
/// GPU list would widen every line of the table: what a place brings beyond this is elided in the middle.
const MAX_COLUMN: usize = 56;

/// `text` fit for a cell: made [`printable`](crate::output::printable) (the exporter's own hostname is not
/// escaped on the wire, as an importer's is), and elided in the middle with '…' past `most` characters,
/// keeping its start and its end (where two hostnames or GPU lists differ).
fn fit(text: &str, most: usize) -> String {
    let text = crate::output::printable(text);
    let count = text.chars().count();
    if count <= most || most == 0 {
        return text;
    }
    let tail = (most - 1) / 2;
    let head = most - 1 - tail;
    let mut fitted: String = text.chars().take(head).collect();
    fitted.push('…');
    fitted.extend(text.chars().skip(count - tail));
    fitted
}

/// The table of what the exporter shares with each importer: a row per fact, a column per importer
/// (named as `importers` says: `process 1`), each cell at most [`MAX_COLUMN`] characters.
pub fn table(importers: &[(String, Vec<Fact>)]) -> String {
    let mut rows: Vec<Vec<String>> = vec![
        std::iter::once("shared with the server".to_owned())
            .chain(importers.iter().map(|(name, _)| fit(name, MAX_COLUMN)))
            .collect(),
    ];
    for (at, (_, title)) in FACTS.iter().enumerate() {
        let cells = importers
            .iter()
            .map(|(_, facts)| facts.get(at).map_or("?".to_owned(), |fact| fit(&cell(fact), MAX_COLUMN)));
        rows.push(std::iter::once((*title).to_owned()).chain(cells).collect());
    }
    let columns = rows[0].len();
    let widths: Vec<usize> =
        (0..columns).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut text = String::new();
    for row in rows {
        let line: Vec<String> =
            row.iter().zip(&widths).map(|(cell, width)| format!("{cell:width$}")).collect();
        text.push_str(line.join("  ").trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::placement::{Capabilities, DevShm, Namespaces};

    /// A place with every namespace `1`, /dev/shm device 7, on node `b`, pid `pid`, root without
    /// capabilities where Yama's `ptrace_scope` is 0 (ptrace allows the same uid).
    pub(crate) fn place(pid: u32) -> Place {
        let ns = Some(1);
        Place {
            pid,
            namespaces: Namespaces { pid: ns, ipc: ns, mnt: ns, net: ns, uts: ns, user: ns, cgroup: ns },
            dev_shm: Some(DevShm { device: 7, file_system: "tmpfs".into(), size_bytes: 64, free_bytes: 64 }),
            hostname: "node".into(),
            boot_id: Some("b".into()),
            cuda_visible_devices: None,
            nvidia_visible_devices: None,
            nccl_hostid: None,
            gpus: Some(vec!["GPU-a".into()]),
            imex_channel: false,
            uid: 0,
            in_user_namespace: false,
            capabilities: Capabilities::default(),
            ptrace_scope: Some(0),
            seccomp: Some(0),
            mps: crate::placement::mps::Mps {
                pipe_directory: "/tmp/nvidia-mps".into(),
                from_env: false,
                client: false,
                answered: None,
            },
            settings: Vec::new(),
            pidfd_getfd_itself: None,
            nccl_version: None,
            gpus_present: Some(vec!["GPU-a".into()]),
            platform: crate::placement::Platform::Linux,
            node_uid: Some(0),
        }
    }

    fn the(facts: &[Fact], name: &str) -> Fact {
        facts.iter().find(|f| f.fact == name).cloned().unwrap()
    }

    #[test]
    fn every_fact_is_same_between_two_processes_of_one_place() {
        let facts = compare(&place(10), &place(11));
        assert_eq!(facts.len(), FACTS.len() + 2, "the table's, and the pair's two beyond it");
        assert!(facts[..FACTS.len()].iter().all(|f| f.same == Sameness::Same), "{facts:?}");
    }

    #[test]
    fn each_fact_that_differs_is_said_with_its_detail() {
        let mut other = place(1);
        other.namespaces = Namespaces {
            pid: Some(2),
            ipc: Some(2),
            mnt: Some(2),
            net: Some(2),
            uts: Some(2),
            user: Some(2),
            cgroup: Some(2),
        };
        other.dev_shm.as_mut().unwrap().device = 8;
        other.hostname = "other".into();
        other.boot_id = Some("c".into());
        other.gpus = Some(vec![]);
        other.imex_channel = true;
        let facts = compare(&place(1), &other);
        assert!(facts[..FACTS.len()].iter().all(|f| f.same == Sameness::Differs), "{facts:?}");
        let taken = the(&facts, crate::placement::forecast::EXPORTERS_NUMBER_THERE);
        assert_eq!((taken.same, taken.detail.as_deref()), (Sameness::Same, Some("its own init (pid 1)")));
        assert_eq!(the(&facts, "pid_namespace").detail.unwrap(), "pid 1 and 1: the same pid number");
        assert_eq!(the(&facts, "uts_namespace").detail.unwrap(), "node and other");
        assert_eq!(the(&facts, "gpus").detail.unwrap(), "lacks GPU-a");
        assert_eq!(the(&facts, "imex_channel").detail.unwrap(), "only the importer has one");
        other.pid = 2;
        assert_eq!(the(&compare(&place(1), &other), "pid_namespace").detail.unwrap(), "pid 1 and 2");
        other.namespaces.pid = None;
        assert_eq!(the(&compare(&place(1), &other), "pid_namespace").same, Sameness::Unknown);
    }

    #[test]
    fn the_table_has_a_row_per_fact_and_a_column_per_importer() {
        let mut other = place(1);
        other.dev_shm = None;
        other.namespaces.pid = Some(5);
        let table = table(&[
            ("process 0".into(), compare(&place(1), &place(2))),
            ("process 1".into(), compare(&place(1), &other)),
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 1 + FACTS.len(), "{table}");
        assert!(lines[0].starts_with("shared with the server"), "{table}");
        let column = lines[0].find("process 1").unwrap();
        assert_eq!(lines[1].find("differs: pid 1 and 1: the same pid number"), Some(column), "{table}");
        assert!(lines[1].starts_with("PID namespace") && lines[1][..column].trim_end().ends_with("same"));
        assert!(lines[2].starts_with("/dev/shm") && lines[2].ends_with('?'), "{table}");
        assert!(lines[11].starts_with("IMEX channel") && lines[11].ends_with("neither has one"), "{table}");
    }

    /// A cell past [`MAX_COLUMN`] characters is elided in the middle, keeping both ends; a short one is kept.
    #[test]
    fn a_long_cell_is_elided_in_the_middle() {
        assert_eq!(fit("abcdef", 5), "ab…ef");
        assert_eq!(fit("abcdef", 6), "abcdef");
        assert_eq!(fit("a\nb", 10), "a\\nb", "made printable first");
        let long = fit(&format!("start{}end", "x".repeat(1000)), MAX_COLUMN);
        assert_eq!(long.chars().count(), MAX_COLUMN);
        assert!(long.starts_with("startxx") && long.ends_with("xxend") && long.contains('…'), "{long}");
    }

    /// One importer of a 60 KB hostname (and one that lacks 64 GPUs) widens no line of the table past its
    /// columns' cap, where every row was once padded to the widest cell (723 KB of table); and the
    /// exporter's own hostname, which no wire escaped, reaches the table escaped.
    #[test]
    fn a_long_or_raw_text_neither_widens_the_table_nor_reaches_the_terminal_raw() {
        let mut exporter = place(1);
        exporter.hostname = "server\x1b[2J\r".into();
        exporter.gpus = Some((0..64).map(|i| format!("GPU-{i:036}")).collect());
        let mut far = place(2);
        far.namespaces.uts = Some(2);
        far.hostname = format!("{}end", "h".repeat(60_000));
        let importers = [
            ("process 0".to_owned(), compare(&exporter, &far)),
            ("process 1".to_owned(), compare(&exporter, &place(3))),
        ];
        let table = table(&importers);
        let widest = "shared with the server".len() + 2 * (2 + MAX_COLUMN);
        for line in table.lines() {
            assert!(line.chars().count() <= widest, "{} characters: {line}", line.chars().count());
        }
        assert!(table.chars().all(|c| c == '\n' || !c.is_control()), "{table:?}");
        let uts = table.lines().find(|l| l.starts_with("hostname (UTS)")).unwrap_or_default();
        assert!(uts.contains("differs: server\\u{1b}[2J\\r a…hhh") && uts.contains("hhhend  same"), "{uts}");
        let gpus = table.lines().find(|l| l.starts_with("GPUs")).unwrap_or_default();
        assert!(gpus.contains("differs: lacks GPU-") && gpus.contains('…'), "{gpus}");
    }
}
