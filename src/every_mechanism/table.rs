//! What `--ipc all` shows of its runs: the table, and the open time read from each run's document.

use super::Row;
use crate::outcome::RunEnd;
use crate::report::document::RunResults;

/// From a run's results: the median over the children of `open_handles`, divided by the process count.
pub fn open_one_ms(run: Option<&RunResults>) -> Option<f64> {
    let run = run?;
    let mut opens: Vec<f64> = run.children.iter().filter_map(|c| c.phases.get("open_handles")).collect();
    opens.sort_by(f64::total_cmp);
    let median = *opens.get(opens.len().checked_sub(1)? / 2)?;
    (run.processes > 0).then(|| median / run.processes as f64)
}

fn result_text(result: &RunEnd) -> String {
    match result {
        RunEnd::Passed => "passed".into(),
        RunEnd::Failed { why, .. } => format!("FAILED: {why}"),
        RunEnd::Waived(why) => format!("waived: {why}"),
    }
}

/// Beside a served run's result, how it stood against its forecast (the run's document says): ` (as
/// forecast)`, or each path forecast otherwise than it went, called out; nothing for a run without one.
fn against_forecast(row: &Row) -> String {
    let Some(against) = row.document.as_ref().and_then(|d| d.placement.as_ref()?.against.as_ref()) else {
        return String::new();
    };
    let wrong: Vec<&str> =
        against.iter().filter(|a| a.agrees == Some(false)).map(|a| a.path.as_str()).collect();
    match (wrong.is_empty(), against.iter().any(|a| a.agrees == Some(true))) {
        (false, _) => format!(" (NOT AS FORECAST: {})", wrong.join(", ")),
        (true, true) => " (as forecast)".to_owned(),
        (true, false) => String::new(),
    }
}

/// The table printed at the end.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!("{:<10}{:>10}{:>20}  {}\n", "mechanism", "wall ms", "open one, ms", "result");
    for row in rows {
        let open = row.open_one_ms.map_or_else(|| "-".into(), |ms| format!("{ms:.3}"));
        let wall = row.wall_ms.map_or_else(|| "-".into(), |ms| format!("{ms:.1}"));
        out.push_str(&format!(
            "{:<10}{:>10}{:>20}  {}\n",
            row.mechanism.name(),
            wall,
            open,
            result_text(&row.ending) + &against_forecast(row)
        ));
    }
    out
}

/// One word for how a mechanism's run ended: passed, failed or waived.
pub fn ending_word(ending: &RunEnd) -> &'static str {
    match ending {
        RunEnd::Passed => "passed",
        RunEnd::Failed { .. } => "failed",
        RunEnd::Waived(_) => "waived",
    }
}
