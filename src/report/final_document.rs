//! The document made whole once the verdict is known, and written: as JSON and as metrics, each to its
//! destination, where one that could not be written is said in the other.

use std::sync::Arc;

use anyhow::{Context, Result};

use super::{Document, Findings, Opened, Status, Target, Verdict, document, metrics};

/// This run's document, made whole once the verdict is known ([`final_document`]). `main` writes it before it
/// says the verdict line, so that the line, the run's last word, can say whether the document was written;
/// and writes it again where that line then found the reader of standard output gone, so that the document
/// says how the run ended.
pub struct FinalDocument {
    pub(super) opened: Arc<Opened>,
    pub(super) document: Document,
}

/// The document of `opened` (if the run was given `--json`), with the verdict and what the role found.
pub fn final_document(
    opened: Option<Arc<Opened>>,
    verdict: &Verdict,
    findings: Findings,
) -> Option<FinalDocument> {
    let opened = opened?;
    let document = document(&opened, verdict, findings);
    Some(FinalDocument { opened, document })
}

impl FinalDocument {
    /// Writes the document: to a new file beside the path, renamed over it (or to the inherited pipe, or to
    /// standard output), and its metrics likewise. Where one could not be written, the other says so: the
    /// run did not pass (as `main` then says it), or its reader went away.
    pub fn write(&self) -> Result<()> {
        let metrics_written = self.write_metrics(&self.document);
        let document = not_written(&self.document, &metrics_written);
        let json_written = match &self.opened.json {
            Some(json) => document::text(document.as_ref().unwrap_or(&self.document))
                .context("writing the --json document")
                .and_then(|text| json.write(&text)),
            None => Ok(()),
        };
        if metrics_written.is_ok()
            && let Some(document) = not_written(&self.document, &json_written)
        {
            self.write_metrics(&document)?;
        }
        json_written.and(metrics_written)
    }

    fn write_metrics(&self, document: &Document) -> Result<()> {
        self.opened.metrics.as_ref().map_or(Ok(()), |metrics| metrics.write(&metrics::text(document)))
    }

    /// The run ended otherwise after its document was written: interrupted, for `reason`, with
    /// `exit_status` (the verdict line found the reader of standard output gone). A file is written again
    /// to say so; a stream (a pipe, standard output) has taken the document already, and is left alone.
    pub fn rewrite_interrupted(&mut self, reason: String, exit_status: u8) -> Result<()> {
        self.rewrite_ended(Status::Interrupted, reason, exit_status)
    }

    /// The run ended otherwise after its document was written: `status` (interrupted, or failed where the
    /// verdict line could not be written), for `reason`, with `exit_status`. A file is written again to say
    /// so; a stream has taken the document already, and is left alone.
    pub fn rewrite_ended(&mut self, status: Status, reason: String, exit_status: u8) -> Result<()> {
        let is_file = |target: &Option<Target>| target.as_ref().is_some_and(|t| t.destination.is_file());
        if !is_file(&self.opened.json) && !is_file(&self.opened.metrics) {
            return Ok(());
        }
        let document = &mut self.document;
        document.status = status;
        (document.reason, document.exit_status) = (Some(reason), Some(exit_status));
        // What only a pass or a failure of the run itself carries (as `document` leaves them out of an
        // interrupted run's).
        (document.summary, document.cause, document.fix, document.refused) = (None, None, None, None);
        if is_file(&self.opened.metrics) {
            self.write_metrics(&self.document)?;
        }
        match &self.opened.json {
            Some(json) if json.destination.is_file() => {
                json.write(&document::text(&self.document).context("writing the --json document")?)
            }
            _ => Ok(()),
        }
    }
}

/// `document` as it must read where the other form of it could not be written (`written`): the run did not
/// pass (a pass or a waiver becomes a failure, for that reason), or its reader went away (interrupted, 141);
/// `None` where it was written.
pub(super) fn not_written(document: &Document, written: &Result<()>) -> Option<Document> {
    let Err(e) = written else { return None };
    let mut document = document.clone();
    if e.chain().any(|cause| cause.is::<crate::output::ReaderGone>()) {
        document.status = Status::Interrupted;
        document.reason = Some(crate::output::ReaderGone.to_string());
        document.exit_status = Some(crate::output::READER_GONE_STATUS);
    } else if matches!(document.status, Status::Passed | Status::Waived) {
        document.status = Status::Failed;
        document.reason = Some(format!("{e:#}"));
        document.exit_status = Some(crate::outcome::EXIT_FAILURE);
        document.summary = None;
    }
    Some(document)
}
