//! What `--ipc all` shows of its runs: the table and its JSON document, and the open time read from each
//! run's document.

use super::{Ending, Row};
use crate::report::json_string;

/// From a run's JSON: the median over the children of `open_handles`, divided by the process count.
pub fn open_one_ms(document: &str) -> Option<f64> {
    let processes: f64 = number_after(document, "\"processes\": ")?;
    let children = document.split("\"children\": [").nth(1)?.split(']').next()?;
    let mut opens: Vec<f64> =
        children.split('}').filter_map(|child| number_after(child, "\"open_handles\": ")).collect();
    opens.sort_by(f64::total_cmp);
    let median = *opens.get(opens.len().checked_sub(1)? / 2)?;
    (processes > 0.0).then(|| median / processes)
}

fn number_after(text: &str, key: &str) -> Option<f64> {
    let rest = text.split(key).nth(1)?;
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn result_text(result: &Ending) -> String {
    match result {
        Ending::Passed => "passed".into(),
        Ending::Failed(why) => format!("FAILED: {why}"),
        Ending::Waived(why) => format!("waived: {why}"),
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
            result_text(&row.ending)
        ));
    }
    out
}

/// The same as [`table`], as one JSON document.
pub fn json_document(rows: &[Row]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|row| {
            let (result, why) = match &row.ending {
                Ending::Passed => ("passed", None),
                Ending::Failed(why) => ("failed", Some(why)),
                Ending::Waived(why) => ("waived", Some(why)),
            };
            format!(
                "{{\"mechanism\": \"{}\", \"result\": \"{result}\", \"reason\": {}, \"wall_ms\": {}, \"open_one_ms\": {}}}",
                row.mechanism.name(),
                why.map_or_else(|| "null".into(), |w| json_string(w)),
                row.wall_ms.map_or_else(|| "null".into(), |ms| format!("{ms:.3}")),
                row.open_one_ms.map_or_else(|| "null".into(), |ms| format!("{ms:.4}"))
            )
        })
        .collect();
    format!("{{\"mechanisms\": [{}]}}\n", rows.join(", "))
}

/// One word for how a mechanism's run ended: passed, failed or waived.
pub fn ending_word(ending: &Ending) -> &'static str {
    match ending {
        Ending::Passed => "passed",
        Ending::Failed(_) => "failed",
        Ending::Waived(_) => "waived",
    }
}
