//! The document a run writes to its files as it begins: running, not ended. The one it writes as it ends
//! replaces it; a run killed with SIGKILL, which can write nothing as it dies, leaves this one, never an
//! earlier run's pass.

use anyhow::{Context, Result};

use super::destination::Output;
use super::{Findings, Opened, Status, Verdict, document, metrics};

impl Opened {
    /// Writes, to each file of `--json` and `--metrics`, the document of a run that has begun and not ended
    /// ([`Status::Running`]): a run killed before it can write how it ended (SIGKILL) leaves that, never an
    /// earlier run's pass. A stream (standard output, the pipe of `--report-fd`) takes one document, the last,
    /// and gets none of it.
    ///
    /// Each file is tried whatever became of the other, metrics first (as the document of the run's end
    /// writes them): one that cannot be written (its file system full) must not leave the other, which may
    /// well take it (the textfile collector's directory, on another disk), with the earlier run's pass. The
    /// errors are those of the files that could not be written.
    pub(super) fn write_running(&self) -> Vec<anyhow::Error> {
        let reason = format!(
            "the run (pid {}) has begun and not ended; still here once its time is past, it ended without \
             writing how (killed by SIGKILL or the OOM killer, or the machine stopped)",
            std::process::id()
        );
        let verdict = Verdict {
            status: Status::Running,
            reason: Some(&reason),
            summary: None,
            diagnosis: None,
            refused: None,
            exit_status: 0,
        };
        let mut running = document(self, &verdict, Findings::default());
        // No exit status yet.
        running.exit_status = None;
        let mut failed = Vec::new();
        for target in [&self.metrics, &self.json].into_iter().flatten() {
            if !target.destination.is_file() {
                continue;
            }
            let text: Result<String> = match target.output {
                Output::Json => document::text(&running).context("writing the --json document"),
                Output::Metrics => Ok(metrics::text(&running)),
            };
            if let Err(e) = text.and_then(|text| target.write(&text)) {
                failed.push(e);
            }
        }
        failed
    }
}
