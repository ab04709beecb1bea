//! One row of the container matrix as one run: an exporter placed as a run's parent is for that boundary
//! (`--isolate` of the row; in namespaces of its own where the row gives the parent some), which makes one
//! context and exports every column's handle once, and one importer placed across the boundary as a
//! run's joiner is (`join --isolated --matrix-row`), which opens each handle in turn with the calls a
//! child of that column's run makes, and says how each went. Today's whole run per cell paid two CUDA
//! starts for each; a row pays two for its six cells.
//!
//! ```text
//! matrix ── lane ── @internal run --matrix-row --isolate ROW      (the row's exporter, placed as a parent)
//!                     exports: legacy memory; VMM + event; VMM; pool + event; fabric; VMM (number)
//!                     └── @internal join --isolated ROW --matrix-row   (the importer, across the boundary)
//!                          opens column by column, as that column's child would; answers each cell
//! ```
//!
//! Each column has exports of its own (a buffer of its mechanism, and an interprocess event where its
//! run orders by events), so that no open in the importer meets a handle another column opened: the
//! driver answers each open as it would in that column's run. The importer closes what it opened before
//! the next column. An open that failed leaves nothing behind that a later one sees: a refusal of a
//! handle (`INVALID_CONTEXT`, `MAP_FAILED`, the kernel's `ESRCH`/`EPERM`) is the driver's or the kernel's
//! answer to that call, not an error that sticks to the context. A cell that an import by this process
//! would change still runs alone: the matrix runs every cell as a whole run of its own while a test
//! fault is set (it aims at the sample's processes, which only those runs have), and under
//! `SIMPLE_IPC_MATRIX_SERIAL` (see `lanes`).
//!
//! The cells go back in the row's `--json` document (its `matrix`, the handles' typed refusals as the
//! whole matrix writes them), with where the importer stood (its `placement`, for MPS), through the same
//! pipes as a cell's run's document.

mod export;
mod import;
mod talk;

use anyhow::anyhow;
use serde::{Deserialize, Serialize};

use super::Cell;
use super::axes::COLUMNS;
use crate::driver::IpcHandleBytes;
use crate::report::{MatrixCell, Refused};

pub(crate) use export::export;
pub(crate) use import::import;

/// The bytes of every column's buffer: the smallest that every mechanism allocates whole (2 MiB, the VMM
/// granularity of the GPUs this runs on); the driver's answer to an open does not depend on the size.
const BYTES: usize = 2 << 20;

/// What the exporter offers: its pid in its own PID namespace (the number its legacy handles carry), and
/// for each column (in `COLUMNS`' order) what crosses, or the cell where nothing can (waived, say).
#[derive(Serialize, Deserialize)]
struct Offer {
    pid: u32,
    columns: Vec<Result<Offered, Cell>>,
}

/// One column's handles.
#[derive(Serialize, Deserialize)]
struct Offered {
    handle: Vec<u8>,
    bytes: usize,
    /// Its descriptor's index among those that came with the offer (a mechanism with descriptors, `--fds
    /// socket`).
    descriptor: Option<usize>,
    /// Its descriptor's number in the exporter, which the importer fetches by `pidfd_getfd` (`--fds pidfd`).
    number: Option<i32>,
    /// Its interprocess event (a column whose run orders by events).
    event: Option<OfferedEvent>,
}

/// An interprocess event's handle, and the driver's file behind it as the exporter maps it (name, device,
/// inode), which the diagnosis of a refusal compares with the importer's.
#[derive(Serialize, Deserialize)]
struct OfferedEvent {
    handle: Vec<u8>,
    file: Option<(String, u64, u64)>,
}

/// What the importer answers: each column's cell, and where it stands.
#[derive(Serialize, Deserialize)]
struct Answer {
    cells: Vec<Cell>,
    place: Box<crate::placement::Place>,
}

/// The 64 bytes of a handle that came as a list.
fn handle_of(bytes: &[u8]) -> anyhow::Result<IpcHandleBytes> {
    bytes.try_into().map_err(|_| anyhow!("a handle of {} bytes, not 64", bytes.len()))
}

/// The cell that an error of this row's process makes, as the whole run of that cell would have ended:
/// waived where the run would be (no device, a mechanism the device lacks, a call the simulation does not
/// model outside an open), not simulated where the simulation does not model an open, refused where the
/// driver or the kernel refused to open the handle (typed, `Refused`), and broken for anything else.
fn cell_of(error: &anyhow::Error) -> Cell {
    if let Some(refused) = Refused::of(error) {
        return match refused.beyond_the_simulation {
            true => Cell::NotSimulated,
            false => Cell::Failed {
                kernel: refused.pidfd.is_some(),
                error: refused.error,
                event: refused.event,
                fix: refused.fix,
            },
        };
    }
    let beyond = error.chain().any(|cause| {
        cause.downcast_ref::<crate::driver::CallFailed>().is_some_and(|f| f.beyond_the_simulation)
    });
    if beyond || error.chain().any(|cause| cause.is::<crate::outcome::Waiver>()) {
        return Cell::Waived;
    }
    Cell::Broken(format!("{error:#}"))
}

/// A row's cells from its document's `matrix` (as `table::document` wrote them); `None` where they are
/// not one a column. A refusal is the kernel's where its error is an errno's name, not a `CUresult`'s.
pub(super) fn cells_of(said: &[MatrixCell]) -> Option<Vec<Cell>> {
    if said.len() != COLUMNS.len() {
        return None;
    }
    let cell = |c: &MatrixCell| -> Option<Cell> {
        Some(match c.result.as_str() {
            "ok" => Cell::Ok,
            "waived" => Cell::Waived,
            "not_simulated" => Cell::NotSimulated,
            "failed" => {
                let error = c.error.clone()?;
                let kernel = !error.starts_with("CUDA_ERROR_") && !error.starts_with("CUresult ");
                Cell::Failed { error, event: c.event_refused.unwrap_or(false), fix: c.fix.clone(), kernel }
            }
            _ => Cell::Broken(c.error.clone().unwrap_or_else(|| "it gave no reason".to_owned())),
        })
    };
    said.iter().map(cell).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::CallFailed;
    use crate::ipc::diagnose::Diagnosis;

    fn failed(call: &str, code: u32, beyond: bool) -> anyhow::Error {
        anyhow::Error::new(CallFailed {
            call: call.into(),
            code,
            text: "words".into(),
            beyond_the_simulation: beyond,
        })
    }

    /// A cell is what the whole run of that cell would have said: the typed refusal of an open, with its fix;
    /// not simulated for an open the simulation does not model; waived for what would waive the run;
    /// broken for anything else, with why.
    #[test]
    fn a_cell_is_what_its_whole_run_would_have_said() {
        let event = failed("cuIpcOpenEventHandle", 205, false).context(Diagnosis::new(
            "another /dev/shm".into(),
            ": ",
            "share /dev/shm".into(),
        ));
        let expected = Cell::Failed {
            error: "CUDA_ERROR_MAP_FAILED".into(),
            event: true,
            fix: Some("share /dev/shm".into()),
            kernel: false,
        };
        assert_eq!(cell_of(&event), expected);
        assert_eq!(cell_of(&failed("cuIpcOpenMemHandle", 801, true)), Cell::NotSimulated);
        assert_eq!(cell_of(&failed("cuMemCreate", 801, true)), Cell::Waived, "beyond, outside an open");
        let waived = anyhow::Error::new(crate::outcome::Waiver("no vmm".into()));
        assert_eq!(cell_of(&waived), Cell::Waived);
        assert_eq!(cell_of(&anyhow!("no socket")), Cell::Broken("no socket".into()));
    }

    /// The cells a row's document carries come back as they went, the kernel's refusal told from the
    /// driver's by its error's name.
    #[test]
    fn a_rows_cells_come_back_from_its_document() {
        let cells = vec![
            Cell::Failed {
                error: "CUDA_ERROR_INVALID_CONTEXT".into(),
                event: false,
                fix: Some("f".into()),
                kernel: false,
            },
            Cell::Failed { error: "CUDA_ERROR_MAP_FAILED".into(), event: true, fix: None, kernel: false },
            Cell::Ok,
            Cell::NotSimulated,
            Cell::Waived,
            Cell::Failed { error: "ESRCH".into(), event: false, fix: Some("g".into()), kernel: true },
        ];
        let row = super::super::axes::Boundary { title: "t".into(), isolate: "pid".into() };
        let document =
            super::super::table::document(std::slice::from_ref(&row), std::slice::from_ref(&cells));
        assert_eq!(cells_of(&document), Some(cells));
        assert_eq!(cells_of(&document[..5]), None, "one a column");
        let broken = vec![Cell::Broken("why".into()); COLUMNS.len()];
        let document = super::super::table::document(&[row], std::slice::from_ref(&broken));
        assert_eq!(cells_of(&document), Some(broken));
    }
}
