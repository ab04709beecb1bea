//! How the matrix gets its cells: by default each row is one run (`row`: one exporter, one importer across
//! the boundary, every handle tried); each cell is a whole run of its own instead (as before issue 41)
//! where a test fault is set, for a fault aims at the sample's processes, which only those runs have, or
//! where `SIMPLE_IPC_MATRIX_SERIAL` asks for the matrix as it was, one cell after another (`lanes`).

use anyhow::Result;

use super::axes::{Boundary, COLUMNS};
use super::{Cell, classify, mps, row};
use crate::ipc::{Fds, Sync};
use crate::isolation::Isolation;
use crate::outcome::RunEnd;
use crate::report::Status;
use crate::role::Run;

/// One run a row, or one run a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum How {
    Rows,
    Cells { serial: bool },
}

impl How {
    /// As the environment asks (see the module's doc).
    pub(super) fn asked() -> Self {
        let serial = super::lanes::serial_asked();
        if serial || std::env::var_os(crate::phases::fault::FAULT_ENV).is_some() {
            return How::Cells { serial };
        }
        How::Rows
    }

    /// What the first line says of it, with `lanes` lanes of rows.
    pub(super) fn said(self, lanes: usize) -> String {
        let at_once = format!("the rows in {lanes} lanes at once");
        match self {
            How::Rows => format!("each row one isolated run that tries every handle, {at_once}"),
            How::Cells { serial: true } => format!(
                "each cell an isolated run of its own, one after another: {} is set",
                super::lanes::SERIAL_ENV
            ),
            How::Cells { serial: false } => format!(
                "each cell an isolated run of its own, as {} is set, {at_once}",
                crate::phases::fault::FAULT_ENV
            ),
        }
    }
}

/// The cells of `row` from one run (`row`), with how many of its importers were an MPS daemon's clients
/// (on its first cell). A run that did not pass, or passed without a cell for each column, makes every
/// cell of the row what it says (waived, or broken with why).
pub(super) fn row_cells(run: &Run, row: &Boundary) -> Result<Vec<(Cell, Option<mps::Clients>)>> {
    let row_run = Run {
        sync: Sync::Events,
        fds: Fds::Socket,
        isolate: Some(Isolation::parse(&row.isolate)?),
        json: None,
        ..run.clone()
    };
    let ran = crate::every_mechanism::run_matrix_row(&row_run)?;
    let document = ran.document.as_deref();
    let passed = ran.ending == RunEnd::Passed && document.is_some_and(|d| d.status == Status::Passed);
    let cells = document.and_then(|d| d.matrix.as_deref()).and_then(row::cells_of);
    let (cells, clients) = match (passed, cells) {
        (true, Some(cells)) => (cells, mps::Clients::of_run(document)),
        (true, None) => {
            (vec![Cell::Broken("its run passed without a cell for each handle".into()); COLUMNS.len()], None)
        }
        (false, _) => (vec![classify(&ran.ending, document); COLUMNS.len()], None),
    };
    Ok(cells.into_iter().enumerate().map(|(i, cell)| (cell, clients.filter(|_| i == 0))).collect())
}
