//! The documents of a run that its watchdog ends (see `watchdog`): the same `--json` and `--metrics` as
//! [`FinalDocument::write`] writes at any other end, failed for the watchdog's reason, with exit status 1 and
//! nothing the roles found (the main thread that holds it is the one that did not come back).

use std::sync::Arc;

use super::{FinalDocument, Findings, Opened, Status, Verdict, document};
use crate::outcome::EXIT_FAILURE;

/// Writes the run's documents as failed for the reason it is given; `Err` says why it could not.
pub(crate) type LastWord = Box<dyn Fn(&str) -> anyhow::Result<()> + Send>;

/// What writes the documents of `opened` should the watchdog end this process.
pub(crate) fn for_the_watchdog(opened: &Arc<Opened>) -> LastWord {
    let opened = Arc::clone(opened);
    Box::new(move |why: &str| {
        let verdict = Verdict {
            status: Status::Failed,
            reason: Some(why),
            summary: None,
            diagnosis: None,
            refused: None,
            exit_status: EXIT_FAILURE,
        };
        let document = document(&opened, &verdict, Findings::default());
        FinalDocument { opened: Arc::clone(&opened), document }.write()
    })
}
