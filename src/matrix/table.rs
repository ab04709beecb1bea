//! What the matrix shows of its cells: the table it prints (each cause after it, with the least sharing
//! that fixes it) and the cells of its `--json` document.

use super::Cell;
use super::axes::{Boundary, COLUMNS};

/// The cells for the `--json` document.
pub(super) fn document(rows: &[Boundary], cells: &[Vec<Cell>]) -> Vec<crate::report::MatrixCell> {
    let mut out = Vec::new();
    for (row, line) in rows.iter().zip(cells) {
        for (column, cell) in COLUMNS.iter().zip(line) {
            let (result, error, event_refused, fix) = match cell {
                Cell::Ok => ("ok", None, None, None),
                Cell::Waived => ("waived", None, None, None),
                Cell::NotSimulated => ("not_simulated", None, None, None),
                Cell::Failed { error, event, fix, .. } => {
                    ("failed", Some(error.clone()), Some(*event), fix.clone())
                }
                Cell::Broken(why) => ("error", Some(why.clone()), None, None),
            };
            out.push(crate::report::MatrixCell {
                boundary: row.title.clone(),
                isolate: row.isolate.clone(),
                handle: column.title.to_owned(),
                ipc: column.mechanism.name().to_owned(),
                sync: column.sync.name().to_owned(),
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
pub(super) fn table(rows: &[Boundary], cells: &[Vec<Cell>]) -> String {
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
        let mut cells = String::new();
        for (cell, width) in line.iter().zip(&widths) {
            cells.push_str(&format!("  {:<width$}", cell.word()));
        }
        text.push_str(cells.trim_end());
        text.push('\n');
    }
    let mut fixes: Vec<(String, String, Vec<String>)> = Vec::new();
    let mut broken = String::new();
    for (row, line) in rows.iter().zip(cells) {
        for (column, cell) in COLUMNS.iter().zip(line) {
            if let Cell::Broken(why) = cell {
                broken.push_str(&format!("\nFAILED, not refused: {} / {}: {why}\n", row.title, column.title));
            }
            let Cell::Failed { error, event, fix, kernel } = cell else { continue };
            let handle = if *event { "legacy event" } else { column.title };
            let fix = fix.clone().unwrap_or_else(|| "(the run gave no diagnosis: see its output)".to_owned());
            let key = if *kernel {
                format!("{error} from the kernel, fetching a descriptor by pidfd_getfd")
            } else {
                format!("{error} opening a {handle} handle")
            };
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
