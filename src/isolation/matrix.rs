//! `--ipc all --isolate KINDS`: the container matrix of this host, from real runs. Each row is one boundary
//! between the exporter (the serving parent) and the importers (the processes that join it), each column
//! one kind of handle that has to cross it; each cell is a whole isolated run of this program, with the
//! user's other options, that tries that handle alone:
//! - a legacy memory handle: `--ipc legacy --sync memops` (no event);
//! - a legacy event handle: `--ipc vmm --sync events` (the memory goes by descriptor, so only the event is
//!   a legacy handle);
//! - a VMM descriptor: `--ipc vmm --sync memops`;
//! - a pool descriptor: `--ipc pool --sync events` (memops cannot order pool memory, so its event comes
//!   too: a failure of the event is said as such);
//! - a fabric handle: `--ipc fabric --sync memops`.
//!
//! Each cell is read from the typed `--json` document its run hands back (`--report-fd`, as under `--ipc
//! all`), never from what it printed. A cell counts as refused only where the document says the driver
//! refused to open the handle (the call's error, whether it was the event's, the fix the run diagnosed:
//! `report::Refused`); it is named by that error, and the table ends with each cause and its fix. Exit 1
//! if any run failed for another reason (a socket, TMPDIR, a start, a run that wrote no document: then the
//! table is not the host's, and the matrix names why), or if a run in the same namespaces was refused
//! (then nothing else can be read from the table); 2 if every run was waived; 0 otherwise: a boundary
//! that the driver refuses is a fact of the host, which the table reports.

use anyhow::{Result, bail};

use super::{Isolation, Kind};
use crate::every_mechanism::Ending;
use crate::ipc::{Mechanism, Sync};
use crate::outcome::Outcome;
use crate::report::{Document, Status};
use crate::role::Run;
use crate::signals;

/// One kind of handle: the run that tries it.
struct Column {
    title: &'static str,
    mechanism: Mechanism,
    sync: &'static str,
}

const COLUMNS: [Column; 5] = [
    Column { title: "legacy memory", mechanism: Mechanism::Legacy, sync: "memops" },
    Column { title: "legacy event", mechanism: Mechanism::Vmm, sync: "events" },
    Column { title: "VMM fd", mechanism: Mechanism::Vmm, sync: "memops" },
    Column { title: "pool fd", mechanism: Mechanism::Pool, sync: "events" },
    Column { title: "fabric", mechanism: Mechanism::Fabric, sync: "memops" },
];

/// One boundary: the `--isolate` of its runs.
struct Boundary {
    title: String,
    isolate: String,
}

/// The boundaries of a container, one at a time, then all of Docker's default set together.
const BOUNDARIES: [(&str, &str, &[Kind]); 7] = [
    ("same namespaces", "none", &[]),
    ("own PID namespaces, other pid numbers", "joiners:pid", &[Kind::Pid]),
    ("own PID namespaces, the same pid number", "pid", &[Kind::Pid]),
    ("own /dev/shm", "shm", &[Kind::Shm]),
    (
        "own SysV IPC, net, UTS, cgroup",
        "ipc,net,uts,cgroup",
        &[Kind::Ipc, Kind::Net, Kind::Uts, Kind::Cgroup],
    ),
    ("own user namespace (root mapped)", "user", &[Kind::User]),
    ("Docker's default set (container)", "container", &Kind::CONTAINER),
];

/// The rows for `asked`: the same namespaces, every boundary made only of asked kinds, and the asked set
/// itself where no row is it.
fn boundaries(asked: &Isolation) -> Vec<Boundary> {
    let mut rows: Vec<Boundary> = BOUNDARIES
        .iter()
        .filter(|(_, _, kinds)| kinds.iter().all(|k| asked.has(*k)))
        .map(|(title, isolate, _)| Boundary { title: (*title).to_owned(), isolate: (*isolate).to_owned() })
        .collect();
    let is_asked = |row: &Boundary| {
        Isolation::parse(&row.isolate).is_ok_and(|i| i.kinds == asked.kinds && !i.joiners_only)
    };
    if !asked.kinds.is_empty() && !rows.iter().any(is_asked) {
        rows.push(Boundary { title: format!("own {}", asked.kinds_arg()), isolate: asked.to_string() });
    }
    rows
}

/// How one cell's run ended.
#[derive(Clone, Debug, PartialEq)]
enum Cell {
    Ok,
    Waived,
    /// The simulation does not model this boundary for this handle.
    NotSimulated,
    /// The driver refused the handle: its error (`CUDA_ERROR_...`), whether it was the event's, and the
    /// least sharing that fixes it, where the run diagnosed it.
    Failed {
        error: String,
        event: bool,
        fix: Option<String>,
    },
    /// The run failed for another reason than a refusal of the handle (or said nothing of how it ended):
    /// why. The matrix fails.
    Broken(String),
}

impl Cell {
    fn word(&self) -> String {
        match self {
            Cell::Ok => "ok".to_owned(),
            Cell::Waived => "waived".to_owned(),
            Cell::NotSimulated => "not simulated".to_owned(),
            Cell::Failed { error, event: true, .. } => format!("{} (event)", short(error)),
            Cell::Failed { error, .. } => short(error).to_owned(),
            Cell::Broken(_) => "FAILED".to_owned(),
        }
    }
}

/// `INVALID_CONTEXT` for `CUDA_ERROR_INVALID_CONTEXT`: the table's cells are narrow, its notes say it whole.
fn short(error: &str) -> &str {
    error.strip_prefix("CUDA_ERROR_").unwrap_or(error)
}

/// What a cell's run says of itself, in its typed document, beside how it exited; nothing it printed.
fn classify(ending: &Ending, document: Option<&Document>) -> Cell {
    let Some(document) = document else {
        return Cell::Broken(match ending {
            Ending::Failed(why) | Ending::Waived(why) => why.clone(),
            Ending::Passed => "it passed without its document".to_owned(),
        });
    };
    let reason = || document.reason.clone().unwrap_or_else(|| "it gave no reason".to_owned());
    match (document.status, ending) {
        (Status::Passed, Ending::Passed) => Cell::Ok,
        (Status::Waived, Ending::Waived(_)) => Cell::Waived,
        (Status::Failed, Ending::Failed(_)) => match &document.refused {
            Some(refused) if refused.beyond_the_simulation => Cell::NotSimulated,
            Some(refused) => {
                Cell::Failed { error: refused.error.clone(), event: refused.event, fix: refused.fix.clone() }
            }
            None => Cell::Broken(reason()),
        },
        (Status::Interrupted, _) => Cell::Broken(format!("interrupted: {}", reason())),
        (status, ending) => Cell::Broken(format!(
            "its document says {status:?} and its exit status {}: {}",
            crate::every_mechanism::ending_word(ending),
            reason()
        )),
    }
}

/// The matrix of the boundaries of `asked`, each cell a run with `run`'s options.
pub fn run(run: &Run, asked: &Isolation) -> Result<Outcome> {
    let json = crate::report::JsonFile::requested();
    let rows = boundaries(asked);
    say!(
        "The container matrix ({} boundaries by {} kinds of handle, each an isolated run of its own)",
        rows.len(),
        COLUMNS.len()
    )?;
    let mut cells: Vec<Vec<Cell>> = Vec::new();
    let bar =
        crate::progress::Bar::start((rows.len() * COLUMNS.len()) as u64, "--ipc all --isolate", run.quiet);
    for row in &rows {
        let mut line = Vec::new();
        for column in &COLUMNS {
            bar.doing(format!("{} / {}", row.title, column.title));
            let cell = run_cell(run, row, column)?;
            say!("  {} / {}: {}", row.title, column.title, cell.word())?;
            bar.step_done();
            line.push(cell);
            signals::check()?;
        }
        cells.push(line);
    }
    drop(bar);
    crate::output::text(&table(&rows, &cells))?;
    if !nix::unistd::geteuid().is_root() {
        // (The matrix's own process enters no namespace: it is still the user who started it.)
        say!(
            "(Not root: every isolated run here is in a user namespace of its own too, which the kernel needs.)"
        )?;
    }
    if let Some(json) = json {
        json.write(crate::report::Results::Matrix(document(&rows, &cells)))?;
    }
    let failed = cells.iter().flatten().filter(|c| matches!(c, Cell::Failed { .. })).count();
    let ran = cells.iter().flatten().filter(|c| !matches!(c, Cell::Waived)).count();
    crate::report::note_summary(format!(
        "the container matrix: {} boundaries by {} handles, {failed} of {ran} runs refused across a boundary",
        rows.len(),
        COLUMNS.len()
    ));
    let broken: Vec<String> = rows
        .iter()
        .zip(&cells)
        .flat_map(|(row, line)| COLUMNS.iter().zip(line).map(move |(column, cell)| (row, column, cell)))
        .filter_map(|(row, column, cell)| match cell {
            Cell::Broken(why) => Some(format!("{} / {}: {why}", row.title, column.title)),
            _ => None,
        })
        .collect();
    if let Some(first) = broken.first() {
        bail!(
            "{} of the matrix's runs failed for another reason than the driver's refusal of a handle, so the \
             table is not this host's; the first, {first}",
            broken.len()
        );
    }
    let baseline_failed: Vec<&str> = COLUMNS
        .iter()
        .zip(&cells[0])
        .filter(|(_, cell)| matches!(cell, Cell::Failed { .. }))
        .map(|(column, _)| column.title)
        .collect();
    if !baseline_failed.is_empty() {
        bail!(
            "in the same namespaces, {} failed: nothing across a boundary can be read",
            baseline_failed.join(", ")
        );
    }
    if cells.iter().flatten().all(|c| matches!(c, Cell::Waived)) {
        return Ok(Outcome::Waived);
    }
    Ok(Outcome::Passed)
}

/// One isolated run, its output kept (not shown: the cell says how it ended), its document read back
/// through a pipe, stopped with this process (a signal to the matrix goes on to it at once).
fn run_cell(run: &Run, row: &Boundary, column: &Column) -> Result<Cell> {
    let ran = crate::every_mechanism::run_one(&cell_run(run, row, column)?, column.mechanism, false)?;
    Ok(classify(&ran.ending, ran.document.as_deref()))
}

/// The options of a cell's run: the matrix's, with the cell's own ordering and isolation, its document to
/// its pipe.
fn cell_run(run: &Run, row: &Boundary, column: &Column) -> Result<Run> {
    let sync = <Sync as clap::ValueEnum>::from_str(column.sync, false).map_err(anyhow::Error::msg)?;
    Ok(Run { sync, isolate: Some(Isolation::parse(&row.isolate)?), json: None, ..run.clone() })
}

/// The cells for the `--json` document.
fn document(rows: &[Boundary], cells: &[Vec<Cell>]) -> Vec<crate::report::MatrixCell> {
    let mut out = Vec::new();
    for (row, line) in rows.iter().zip(cells) {
        for (column, cell) in COLUMNS.iter().zip(line) {
            let (result, error, event_refused, fix) = match cell {
                Cell::Ok => ("ok", None, None, None),
                Cell::Waived => ("waived", None, None, None),
                Cell::NotSimulated => ("not_simulated", None, None, None),
                Cell::Failed { error, event, fix } => {
                    ("failed", Some(error.clone()), Some(*event), fix.clone())
                }
                Cell::Broken(why) => ("error", Some(why.clone()), None, None),
            };
            out.push(crate::report::MatrixCell {
                boundary: row.title.clone(),
                isolate: row.isolate.clone(),
                handle: column.title.to_owned(),
                ipc: column.mechanism.name().to_owned(),
                sync: column.sync.to_owned(),
                result: result.to_owned(),
                error,
                event_refused,
                fix,
            });
        }
    }
    out
}

/// The table, then each cause with the least sharing that fixes it.
fn table(rows: &[Boundary], cells: &[Vec<Cell>]) -> String {
    let first = rows.iter().map(|r| r.title.len()).max().unwrap_or(0).max("importer vs exporter".len());
    let widths: Vec<usize> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, c)| cells.iter().map(|line| line[i].word().len()).max().unwrap_or(0).max(c.title.len()))
        .collect();
    let mut text = format!("{:<first$}", "importer vs exporter");
    for (column, width) in COLUMNS.iter().zip(&widths) {
        text.push_str(&format!("  {:<width$}", column.title));
    }
    text.push('\n');
    for (row, line) in rows.iter().zip(cells) {
        text.push_str(&format!("{:<first$}", row.title));
        for (cell, width) in line.iter().zip(&widths) {
            text.push_str(&format!("  {:<width$}", cell.word()));
        }
        text.push('\n');
    }
    let mut fixes: Vec<(String, String, Vec<String>)> = Vec::new();
    let mut broken = String::new();
    for (row, line) in rows.iter().zip(cells) {
        for (column, cell) in COLUMNS.iter().zip(line) {
            if let Cell::Broken(why) = cell {
                broken.push_str(&format!("\nFAILED, not refused: {} / {}: {why}\n", row.title, column.title));
            }
            let Cell::Failed { error, event, fix } = cell else { continue };
            let handle = if *event { "legacy event" } else { column.title };
            let fix = fix.clone().unwrap_or_else(|| "(the run gave no diagnosis: see its output)".to_owned());
            let key = format!("{error} opening a {handle} handle");
            match fixes.iter_mut().find(|(k, f, _)| *k == key && *f == fix) {
                Some((_, _, wheres)) => wheres.push(row.title.clone()),
                None => fixes.push((key, fix, vec![row.title.clone()])),
            }
        }
    }
    for (key, fix, wheres) in fixes {
        let mut wheres = wheres;
        wheres.dedup();
        text.push_str(&format!("\n{key} ({}): what fixes it: {fix}\n", wheres.join("; ")));
    }
    text.push_str(&broken);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cell's document as its run wrote it: `status`, `reason`, and the driver's refusal where there was
    /// one.
    fn said(status: Status, reason: &str, refused: Option<crate::report::Refused>) -> Document {
        let mut document = crate::report::document::example();
        document.status = status;
        document.reason = Some(reason.to_owned());
        document.refused = refused;
        document
    }

    fn refused(error: &str, event: bool, beyond: bool) -> crate::report::Refused {
        crate::report::Refused {
            call: if event { "cuIpcOpenEventHandle" } else { "cuIpcOpenMemHandle" }.into(),
            code: 205,
            error: error.into(),
            event,
            fix: Some("share /dev/shm".into()),
            beyond_the_simulation: beyond,
        }
    }

    #[test]
    fn a_cell_is_named_by_the_drivers_typed_refusal_and_nothing_it_printed() {
        let failed = Ending::Failed("x".into());
        let passed = said(Status::Passed, "", None);
        assert_eq!(classify(&Ending::Passed, Some(&passed)), Cell::Ok);
        let waived = said(Status::Waived, "No CUDA devices", None);
        assert_eq!(classify(&Ending::Waived("w".into()), Some(&waived)), Cell::Waived);
        let shm = said(Status::Failed, "opening", Some(refused("CUDA_ERROR_MAP_FAILED", true, false)));
        assert_eq!(
            classify(&failed, Some(&shm)),
            Cell::Failed {
                error: "CUDA_ERROR_MAP_FAILED".into(),
                event: true,
                fix: Some("share /dev/shm".into())
            }
        );
        let beyond = said(Status::Failed, "opening", Some(refused("CUDA_ERROR_NOT_SUPPORTED", false, true)));
        assert_eq!(classify(&failed, Some(&beyond)), Cell::NotSimulated);
        // A failure that is no refusal, whatever its text says, fails the matrix, named.
        let text = "making a private directory in /nonexistent: CUDA_ERROR_MAP_FAILED cuIpcOpenEventHandle \
                    what fixes it: share /dev/shm";
        let other = said(Status::Failed, text, None);
        assert_eq!(classify(&failed, Some(&other)), Cell::Broken(text.into()));
        assert_eq!(classify(&failed, None), Cell::Broken("x".into()), "no document: how it ended");
        assert!(matches!(classify(&failed, Some(&passed)), Cell::Broken(_)), "a document that disagrees");
        let stopped = said(Status::Interrupted, "interrupted by SIGTERM", None);
        assert!(matches!(classify(&failed, Some(&stopped)), Cell::Broken(_)));
    }

    #[test]
    fn the_rows_are_the_boundaries_made_of_the_asked_kinds() {
        let titles = |asked: &str| -> Vec<String> {
            boundaries(&Isolation::parse(asked).unwrap()).into_iter().map(|b| b.isolate).collect()
        };
        assert_eq!(
            titles("container"),
            ["none", "joiners:pid", "pid", "shm", "ipc,net,uts,cgroup", "container"]
        );
        assert_eq!(titles("pid"), ["none", "joiners:pid", "pid"]);
        assert_eq!(titles("net"), ["none", "net"], "a set that is no row is a row of its own");
        assert_eq!(titles("container,user").len(), 8, "every row, and the asked set whole");
    }

    #[test]
    fn each_cell_sets_its_own_sync_and_isolate() {
        let matrix = Run { timeout: crate::role::Timeout(5), json: Some("m.json".into()), ..Run::default() };
        let row = Boundary { title: "own PID namespace".into(), isolate: "pid".into() };
        let cell = cell_run(&matrix, &row, &COLUMNS[0]).unwrap();
        let expected =
            Run { sync: Sync::Memops, isolate: Some(Isolation::parse("pid").unwrap()), json: None, ..matrix };
        assert_eq!(cell, expected, "its own ordering and isolation, the matrix's other options, no --json");
    }
}
