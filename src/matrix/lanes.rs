//! When the matrix's rows run. Each row's run (or each cell's, see `how`) is isolated and its own: its
//! exporter, its importers, its socket and its namespaces are its own, and nothing of one run is another's.
//! So the rows run at once, each in a lane of its own (a thread that runs the row, or its cells one after
//! another, and waits for each run), and the matrix takes about as long as its slowest row, not the sum.
//!
//! One thing the rows do share is the host's `/dev/shm`, where the driver backs an exported event with a
//! file named by the exporter's pid *in its own PID namespace* (`cuda.shm.0.<pid, hex>.<n>`, SPEC 10).
//! Two exporters that are each in a PID namespace of their own and both use the host's `/dev/shm` take the
//! same small pid numbers: at once, the second would replace the first's file, and the first's importer
//! would open the second's event, a cell that the sharing changed. Those rows run one after another, in
//! one lane ([`lanes`]). An exporter in the host's PID namespace has a pid no other process has; one with
//! a `/dev/shm` of its own names its files where no other exporter does.
//!
//! [`SERIAL_ENV`] (a hook for comparison, `scripts/compare.sh`): every cell in one lane, as the matrix ran
//! before (one run after another); the matrix says so in its first line.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use anyhow::{Result, anyhow};

use super::axes::Boundary;
use super::{Cell, mps};
use crate::isolation::{Isolation, Kind};

/// Set (to anything), every cell runs in one lane, one after another.
pub(super) const SERIAL_ENV: &str = "SIMPLE_IPC_MATRIX_SERIAL";

/// Whether [`SERIAL_ENV`] asks for one lane.
pub(super) fn serial_asked() -> bool {
    std::env::var_os(SERIAL_ENV).is_some()
}

/// The rows' indices, grouped in lanes: the lanes run at once, the rows of a lane one after another.
/// Every row whose exporter is in a PID namespace of its own and uses the host's `/dev/shm` shares one
/// lane (see the module's doc); every other row has a lane of its own. `serial`: one lane for all.
pub(super) fn lanes(rows: &[Boundary], serial: bool) -> Vec<Vec<usize>> {
    if serial {
        return vec![(0..rows.len()).collect()];
    }
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    let mut names_events_by_a_small_pid: Option<usize> = None;
    for (index, row) in rows.iter().enumerate() {
        match (exporter_names_events_by_a_small_pid(row), names_events_by_a_small_pid) {
            (true, Some(lane)) => lanes[lane].push(index),
            (true, None) => {
                names_events_by_a_small_pid = Some(lanes.len());
                lanes.push(vec![index]);
            }
            (false, _) => lanes.push(vec![index]),
        }
    }
    lanes
}

/// Whether the row's exporter (the run's serving parent) is in a PID namespace of its own with the
/// host's `/dev/shm`. A row that does not parse is taken to be one (its run will say what is wrong).
fn exporter_names_events_by_a_small_pid(row: &Boundary) -> bool {
    Isolation::parse(&row.isolate)
        .map_or(true, |i| i.includes_parent() && i.has(Kind::Pid) && !i.has(Kind::Shm))
}

/// One cell, once its run has ended: where it is in the table, and what its run said.
pub(super) struct Done {
    pub row: usize,
    pub column: usize,
    pub cell: Cell,
    pub clients: Option<mps::Clients>,
}

/// How a lane runs a row: its index, and where each of its cells goes as it has it (see [`run_all`]).
pub(super) type RunRow<'a> = dyn Fn(usize, &dyn Fn(Done) -> bool) -> Result<()> + Sync + 'a;

/// Runs every row of `lanes` by `run_row`, the lanes at once, and hands each cell to `each` (on this
/// thread, as it ends). `run_row` hands on each cell of its row as it has it, through the function it is
/// given, which says whether to go on (false once the matrix stops). A lane that fails (a run that could not
/// start, a stop signal) stops the other lanes before their next run; the first failure is the matrix's,
/// a stop signal before any other.
pub(super) fn run_all(
    lanes: &[Vec<usize>],
    run_row: &RunRow,
    each: &mut dyn FnMut(Done) -> Result<()>,
) -> Result<()> {
    let stop = AtomicBool::new(false);
    let (sender, done) = mpsc::channel();
    std::thread::scope(|scope| {
        let mut threads = Vec::new();
        for (number, lane) in lanes.iter().enumerate() {
            let (sender, stop) = (sender.clone(), &stop);
            // The runs a lane starts get SIGTERM should the thread that started them die
            // (`PR_SET_PDEATHSIG`): a lane's thread lives until its last run has ended.
            let thread = std::thread::Builder::new().name(format!("matrix lane {number}")).spawn_scoped(
                scope,
                move || -> Result<()> {
                    // The receiver lives until every lane has ended.
                    let send = |done: Done| sender.send(done).is_ok() && !stop.load(Ordering::SeqCst);
                    for &row in lane {
                        if stop.load(Ordering::SeqCst) {
                            return Ok(());
                        }
                        if let Err(e) = run_row(row, &send).and_then(|()| crate::os::signals::check()) {
                            stop.store(true, Ordering::SeqCst);
                            return Err(e);
                        }
                    }
                    Ok(())
                },
            );
            match thread {
                Ok(thread) => threads.push(thread),
                Err(e) => {
                    stop.store(true, Ordering::SeqCst);
                    threads.push(scope.spawn(move || Err(anyhow!("starting a thread for the matrix: {e}"))));
                    break;
                }
            }
        }
        drop(sender);
        let mut first: Option<anyhow::Error> = None;
        for cell in done {
            if first.is_none()
                && let Err(e) = each(cell)
            {
                stop.store(true, Ordering::SeqCst);
                first = Some(e);
            }
        }
        let ended = threads.into_iter().map(|t| t.join().unwrap_or_else(|_| Err(anyhow!("a lane panicked"))));
        let mut failures: Vec<anyhow::Error> =
            first.into_iter().chain(ended.filter_map(Result::err)).collect();
        // A stop signal is said as such (128+N), whichever lane saw it first.
        let interrupted = failures.iter().position(|e| e.is::<crate::os::signals::Interrupted>());
        match interrupted.or((!failures.is_empty()).then_some(0)) {
            Some(at) => Err(failures.swap_remove(at)),
            None => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::axes::COLUMNS;

    fn rows(isolates: &[&str]) -> Vec<Boundary> {
        isolates.iter().map(|i| Boundary { title: (*i).to_owned(), isolate: (*i).to_owned() }).collect()
    }

    /// The container matrix's rows: the two whose exporter is in a PID namespace of its own with the
    /// host's /dev/shm (`pid`, and a set asked that is no row) share a lane; `joiners:pid` (exporter on the
    /// host) and every row with a /dev/shm of its own have their own.
    #[test]
    fn exporters_that_name_events_by_the_same_small_pids_share_a_lane() {
        let matrix = rows(&[
            "none",
            "joiners:pid",
            "pid",
            "shm",
            "ipc,net,uts,cgroup",
            "user",
            "container",
            "pid,net",
        ]);
        assert_eq!(lanes(&matrix, false), [vec![0], vec![1], vec![2, 7], vec![3], vec![4], vec![5], vec![6]]);
        assert_eq!(lanes(&matrix, true), [(0..8).collect::<Vec<_>>()], "the comparison's one lane");
    }

    /// Every cell is handed on once; a lane that fails stops the others before their next cell, and its
    /// failure is the matrix's.
    #[test]
    fn every_cell_runs_once_and_a_failure_stops_the_lanes() {
        let matrix = rows(&["none", "shm", "user"]);
        let run_row = |row: usize, send: &dyn Fn(Done) -> bool| -> Result<()> {
            for column in 0..COLUMNS.len() {
                send(Done { row, column, cell: Cell::Ok, clients: None });
            }
            Ok(())
        };
        let mut seen = Vec::new();
        run_all(&lanes(&matrix, false), &run_row, &mut |d| {
            seen.push((d.row, d.column));
            Ok(())
        })
        .unwrap();
        seen.sort();
        let every: Vec<(usize, usize)> =
            (0..3).flat_map(|r| (0..COLUMNS.len()).map(move |c| (r, c))).collect();
        assert_eq!(seen, every);
        let failing = |row: usize, send: &dyn Fn(Done) -> bool| -> Result<()> {
            for column in 0..COLUMNS.len() {
                if row == 0 && column == 1 {
                    return Err(anyhow!("could not start"));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
                if !send(Done { row, column, cell: Cell::Ok, clients: None }) {
                    return Ok(());
                }
            }
            Ok(())
        };
        let mut seen = 0;
        let failed = run_all(&lanes(&matrix, false), &failing, &mut |_| {
            seen += 1;
            Ok(())
        });
        assert_eq!(failed.map_err(|e| e.to_string()), Err("could not start".to_owned()));
        assert!(seen < 2 * COLUMNS.len(), "the other lanes stopped early: {seen} cells");
    }
}
