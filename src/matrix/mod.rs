//! `--ipc all --isolate KINDS`: the container matrix of this host, from real imports. Each row is one
//! boundary between the exporter (placed as a run's serving parent is) and the importer (placed as a
//! process that joins it), each column one kind of handle that has to cross it, tried as the run of
//! this program with the user's other options and these would try it alone:
//! - a legacy memory handle: `--ipc legacy --sync memops` (no event);
//! - a legacy event handle: `--ipc vmm --sync events` (the memory goes by descriptor, so only the event is
//!   a legacy handle);
//! - a VMM descriptor: `--ipc vmm --sync memops`;
//! - a pool descriptor: `--ipc pool --sync events` (memops cannot order pool memory, so its event comes
//!   too: a failure of the event is said as such);
//! - a fabric handle: `--ipc fabric --sync memops`;
//! - a VMM descriptor fetched by the importers with `pidfd_getfd`: `--ipc vmm --sync memops --fds pidfd`
//!   (the kernel's column: PyTorch's expandable segments and UCX do this).
//!
//! The columns and rows are defined in `axes`. Each row is one isolated run (`row`: one exporter that
//! exports every column's handles, one importer across the boundary that opens each as that column's
//! child would), or, where `how` says so, each cell a whole run of its own. The rows run at once, except
//! rows whose runs could change each other's cells, which share a lane (`lanes`).
//!
//! Each cell is read from the typed `--json` document its run hands back (`--report-fd`, as under `--ipc
//! all`), never from what it printed. A cell counts as refused only where the document says the driver
//! refused to open the handle (the call's error, whether it was the event's, the fix the run diagnosed:
//! `report::Refused`), or the kernel to hand over its descriptor (`Refused::pidfd`: `ESRCH`, `EPERM`); it
//! is named by that error, and the table ends with each cause and its fix. Exit 1
//! if any run failed for another reason (a socket, TMPDIR, a start, a run that wrote no document: then the
//! table is not the host's, and the matrix names why), or if a handle was refused in the same namespaces
//! (then nothing else can be read from the table); 2 if every cell was waived; 0 otherwise: a boundary
//! that the driver refuses is a fact of the host, which the table reports.

mod axes;
mod how;
mod lanes;
mod mps;
pub(crate) mod row;
mod table;

use anyhow::{Result, anyhow};

use crate::isolation::Isolation;
use crate::outcome::RunEnd;
use crate::outcome::{Outcome, Waiver};
use crate::report::{Document, Results, RoleEnd, Status};
use crate::role::Run;
use axes::{Boundary, COLUMNS, Column, boundaries};
use table::{document, table};

/// How one cell's run ended (or, in a row's run, its import: `row`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
enum Cell {
    Ok,
    Waived,
    /// The simulation does not model this boundary for this handle.
    NotSimulated,
    /// The driver refused the handle: its error (`CUDA_ERROR_...`), whether it was the event's, and the
    /// least sharing that fixes it, where the run diagnosed it; or the kernel refused to hand over the
    /// descriptor (`kernel`: `pidfd_getfd`'s errno, `ESRCH` or `EPERM`, as the run typed it).
    Failed {
        error: String,
        event: bool,
        fix: Option<String>,
        kernel: bool,
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
fn classify(ending: &RunEnd, document: Option<&Document>) -> Cell {
    let Some(document) = document else {
        return Cell::Broken(match ending {
            RunEnd::Failed { why, .. } | RunEnd::Waived(why) => why.clone(),
            RunEnd::Passed => "it passed without its document".to_owned(),
        });
    };
    let reason = || document.reason.clone().unwrap_or_else(|| "it gave no reason".to_owned());
    match (document.status, ending) {
        (Status::Passed, RunEnd::Passed) => Cell::Ok,
        // The simulation waives what it does not model (entry.rs), and says so in the refusal it keeps.
        (Status::Waived, RunEnd::Waived(_)) => match &document.refused {
            Some(refused) if refused.beyond_the_simulation => Cell::NotSimulated,
            _ => Cell::Waived,
        },
        (Status::Failed, RunEnd::Failed { process: None, why: _ }) => match &document.refused {
            Some(refused) if refused.beyond_the_simulation => Cell::NotSimulated,
            Some(refused) => Cell::Failed {
                error: refused.error.clone(),
                event: refused.event,
                fix: refused.fix.clone(),
                kernel: refused.pidfd.is_some(),
            },
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

/// The matrix of the boundaries of `asked`, each cell a run with `run`'s options, the rows at once where
/// nothing of one changes another (`lanes`).
pub fn run(run: &Run, asked: &Isolation) -> Result<RoleEnd> {
    let rows = boundaries(asked);
    let how = how::How::asked();
    let lanes = lanes::lanes(&rows, how == how::How::Cells { serial: true });
    print_line!(
        "The container matrix ({} boundaries by {} kinds of handle, {})",
        rows.len(),
        COLUMNS.len(),
        how.said(lanes.len())
    )?;
    // Under MPS, whether each run's importers were the daemon's clients (see `mps`).
    let daemon = crate::placement::mps::Mps::here();
    let mut cells: Vec<Vec<Cell>> = vec![vec![Cell::Broken("not run".to_owned()); COLUMNS.len()]; rows.len()];
    let mut clients: Vec<Vec<Option<mps::Clients>>> = vec![vec![None; COLUMNS.len()]; rows.len()];
    let bar = crate::output::progress::Bar::start(
        (rows.len() * COLUMNS.len()) as u64,
        "--ipc all --isolate",
        run.quiet,
    );
    let run_row = |row: usize, send: &dyn Fn(lanes::Done) -> bool| -> Result<()> {
        if how == how::How::Rows {
            for (column, (cell, clients)) in how::row_cells(run, &rows[row])?.into_iter().enumerate() {
                send(lanes::Done { row, column, cell, clients });
            }
            return Ok(());
        }
        for (column, each) in COLUMNS.iter().enumerate() {
            let (cell, clients) = run_cell(run, &rows[row], each)?;
            if !send(lanes::Done { row, column, cell, clients }) {
                break;
            }
            crate::os::signals::check()?;
        }
        Ok(())
    };
    lanes::run_all(&lanes, &run_row, &mut |done| {
        let (row, column) = (&rows[done.row], &COLUMNS[done.column]);
        print_line!("  {} / {}: {}", row.title, column.title, done.cell.word())?;
        bar.doing(format!("{} / {}: {}", row.title, column.title, done.cell.word()));
        bar.step_done();
        cells[done.row][done.column] = done.cell;
        clients[done.row][done.column] = done.clients;
        Ok(())
    })?;
    drop(bar);
    crate::output::text(&table(&rows, &cells))?;
    let titles: Vec<&str> = rows.iter().map(|r| r.title.as_str()).collect();
    // Under MPS where a run's driver said so (`mps::Clients::of_run`), not where a socket alone did.
    let driver_says = clients.iter().flatten().flatten().any(|c| c.clients > 0);
    if let Some(text) = mps::lines(&daemon, driver_says, &titles, &mps::per_row(&clients)) {
        crate::output::text(&text)?;
    }
    if !nix::unistd::geteuid().is_root() {
        // (The matrix's own process enters no namespace: it is still the user who started it.)
        print_line!(
            "(Not root: every isolated run here is in a user namespace of its own too, which the kernel needs.)"
        )?;
    }
    let outcome = match outcome(&rows, &cells) {
        Outcome::Passed(Some(summary)) => match daemon.under(driver_says) {
            Some(under) => Outcome::passed(format!("{summary}, {under}")),
            None => Outcome::passed(summary),
        },
        other => other,
    };
    let mut end = RoleEnd::with(outcome, Results::Matrix(document(&rows, &cells)));
    // The matrix loads no driver itself (its rows do): it says which one ran them, a simulation included.
    end.findings.note_driver_asked();
    Ok(end)
}

/// Passed with what the matrix found; waived where every run was; failed where a run failed for another
/// reason than a refusal across a boundary, or a handle was refused in the same namespaces.
fn outcome(rows: &[Boundary], cells: &[Vec<Cell>]) -> Outcome {
    let failed = cells.iter().flatten().filter(|c| matches!(c, Cell::Failed { .. })).count();
    let ran = cells.iter().flatten().filter(|c| !matches!(c, Cell::Waived)).count();
    let broken: Vec<String> = rows
        .iter()
        .zip(cells)
        .flat_map(|(row, line)| COLUMNS.iter().zip(line).map(move |(column, cell)| (row, column, cell)))
        .filter_map(|(row, column, cell)| match cell {
            Cell::Broken(why) => Some(format!("{} / {}: {why}", row.title, column.title)),
            _ => None,
        })
        .collect();
    if let Some(first) = broken.first() {
        return Outcome::Failed(anyhow!(
            "{} of the matrix's runs failed for another reason than the driver's refusal of a handle, so the \
             table is not this host's; the first, {first}",
            broken.len()
        ));
    }
    let baseline_failed: Vec<&str> = COLUMNS
        .iter()
        .zip(&cells[0])
        .filter(|(_, cell)| matches!(cell, Cell::Failed { .. }))
        .map(|(column, _)| column.title)
        .collect();
    if !baseline_failed.is_empty() {
        return Outcome::Failed(anyhow!(
            "in the same namespaces, {} failed: nothing across a boundary can be read",
            baseline_failed.join(", ")
        ));
    }
    if ran == 0 {
        return Outcome::Waived(Waiver("nothing can run here".into()));
    }
    Outcome::passed(format!(
        "the container matrix: {} boundaries by {} handles, {failed} of {ran} imports refused across a boundary",
        rows.len(),
        COLUMNS.len()
    ))
}

/// One isolated run, its output kept (not shown: the cell says how it ended), its document read back
/// through a pipe, stopped with this process (a signal to the matrix goes on to it at once).
/// With how many of its importers were an MPS daemon's clients, where it said.
fn run_cell(run: &Run, row: &Boundary, column: &Column) -> Result<(Cell, Option<mps::Clients>)> {
    let ran = crate::every_mechanism::run_one(&cell_run(run, row, column)?, column.mechanism, false)?;
    let document = ran.document.as_deref();
    Ok((classify(&ran.ending, document), mps::Clients::of_run(document)))
}

/// The options of a cell's run: the matrix's, with the cell's own ordering, isolation and way of moving
/// descriptors, its document to its pipe.
fn cell_run(run: &Run, row: &Boundary, column: &Column) -> Result<Run> {
    let (sync, fds, isolate) = (column.sync, column.fds, Some(Isolation::parse(&row.isolate)?));
    Ok(Run { sync, fds, isolate, json: None, ..run.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::{Fds, Sync};
    use crate::phases::timings::Timeout;

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
            pidfd: None,
        }
    }

    #[test]
    fn a_cell_is_named_by_the_drivers_typed_refusal_and_nothing_it_printed() {
        let failed = RunEnd::Failed { process: None, why: "x".into() };
        let passed = said(Status::Passed, "", None);
        assert_eq!(classify(&RunEnd::Passed, Some(&passed)), Cell::Ok);
        let waived = said(Status::Waived, "No CUDA devices", None);
        assert_eq!(classify(&RunEnd::Waived("w".into()), Some(&waived)), Cell::Waived);
        let shm = said(Status::Failed, "opening", Some(refused("CUDA_ERROR_MAP_FAILED", true, false)));
        assert_eq!(
            classify(&failed, Some(&shm)),
            Cell::Failed {
                error: "CUDA_ERROR_MAP_FAILED".into(),
                event: true,
                fix: Some("share /dev/shm".into()),
                kernel: false,
            }
        );
        // The kernel's refusal of a descriptor (--fds pidfd) is a refusal too, by its type, named by its errno.
        let mut esrch = refused("ESRCH", false, false);
        esrch.pidfd = Some(crate::ipc::pidfd::PidfdRefusal::NotVisible { pid: 0 });
        let pid = said(Status::Failed, "fetching", Some(esrch));
        let cell = classify(&failed, Some(&pid));
        assert!(matches!(&cell, Cell::Failed { error, kernel: true, .. } if error == "ESRCH"), "{cell:?}");
        assert_eq!(cell.word(), "ESRCH");
        let beyond = said(Status::Failed, "opening", Some(refused("CUDA_ERROR_NOT_SUPPORTED", false, true)));
        assert_eq!(classify(&failed, Some(&beyond)), Cell::NotSimulated);
        // As a run now ends where the simulation does not model a call: waived, its refusal kept.
        let waived_beyond =
            said(Status::Waived, "not simulated", Some(refused("CUDA_ERROR_NOT_SUPPORTED", false, true)));
        let waived = RunEnd::Waived("not simulated".into());
        assert_eq!(classify(&waived, Some(&waived_beyond)), Cell::NotSimulated);
        assert_eq!(classify(&waived, Some(&said(Status::Waived, "no vmm", None))), Cell::Waived);
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
    fn each_cell_sets_its_own_sync_isolate_and_fds() {
        let matrix = Run { timeout: Timeout::from_secs(5), json: Some("m.json".into()), ..Run::default() };
        let row = Boundary { title: "own PID namespace".into(), isolate: "pid".into() };
        let cell = cell_run(&matrix, &row, &COLUMNS[0]).unwrap();
        let expected = Run {
            sync: Sync::Memops,
            isolate: Some(Isolation::parse("pid").unwrap()),
            json: None,
            ..matrix.clone()
        };
        assert_eq!(cell, expected, "its own ordering and isolation, the matrix's other options, no --json");
        let by_pidfd = COLUMNS.iter().find(|c| c.fds == Fds::Pidfd).unwrap();
        assert_eq!(cell_run(&matrix, &row, by_pidfd).unwrap().fds, Fds::Pidfd, "the kernel's column");
    }
}
