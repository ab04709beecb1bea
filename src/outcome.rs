//! How a run ends, as a value with its reason, in cuda-samples' terms: passed with what it did, waived with
//! why, or failed; and the exit statuses that say so. A failure that stops a run on its way is an error
//! instead, which carries its cause and fix where they are known (`ipc::diagnose::Diagnosis`,
//! `report::Refused`); so is a [`Waiver`] found deep down (no driver, no namespace, a mechanism missing).

/// How a run ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// What the run did, for the verdict line (`4 processes on 1 GPU, legacy IPC, events`), where its role
    /// says.
    Passed(Option<String>),
    Waived(Waiver),
    /// The run went to its end, and some of what it ran failed (a mechanism of `--ipc all`, a run of the
    /// matrix): the error says which.
    Failed(anyhow::Error),
    /// Decided by the process of this program that ran it (the run inside an isolation), as its document
    /// says.
    Ended(Ending),
}

/// How a run ended, decided once: what its verdict line says, what its document holds, its exit status,
/// and what a served run tells its joiners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ending {
    pub status: Status,
    pub reason: Option<String>,
    /// What a run that passed did.
    pub summary: Option<String>,
    pub exit_status: u8,
}

impl Ending {
    /// Passed, with what the run did (where its role says).
    pub(crate) fn passed(summary: Option<String>) -> Self {
        Self { status: Status::Passed, reason: None, summary, exit_status: EXIT_SUCCESS }
    }

    /// Not passed, for `reason`.
    pub(crate) fn not_passed(status: Status, reason: String, exit_status: u8) -> Self {
        Self { status, reason: Some(reason), summary: None, exit_status }
    }

    /// `note` after the first line of the reason (a cause's own lines follow it).
    pub(crate) fn add_to_first_line(&mut self, note: &str) {
        let why = self.reason.take().unwrap_or_default();
        let (first, rest) = why.split_once('\n').unwrap_or((&why, ""));
        let rest = if rest.is_empty() { String::new() } else { format!("\n{rest}") };
        self.reason = Some(format!("{first}{note}{rest}"));
    }
}

/// How a run ended, in short: as a served run's server tells each joiner once the run is over, and as a
/// row of `--ipc all` or a served sequence says it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RunEnd {
    Passed,
    /// It failed: because process `process` failed, where one did, and why (the server's verdict).
    Failed {
        process: Option<usize>,
        why: String,
    },
    /// It was waived after the joiner was admitted (a mechanism the devices lack, found at the export).
    Waived(String),
}

impl RunEnd {
    /// The end a run decided, in short.
    pub fn of(ending: &Ending) -> Self {
        let why = ending.reason.clone().unwrap_or_default();
        match ending.status {
            Status::Passed => Self::Passed,
            Status::Waived => Self::Waived(why),
            // A run still running by its document's word never said how it ended.
            Status::Failed | Status::Interrupted | Status::Running => Self::Failed { process: None, why },
        }
    }
}

/// How a run ended, in a word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed,
    Waived,
    /// A stop signal, or the reader of standard output going away.
    Interrupted,
    /// Begun and not ended: only in the document a run writes to its files as it begins (`report::open`),
    /// which the one it writes as it ends replaces. Still there once the run's time is past, it says that
    /// the run ended without writing another: killed by SIGKILL (the OOM killer), or its machine stopped.
    Running,
}

impl Outcome {
    /// Passed, with what the run did.
    pub(crate) fn passed(summary: String) -> Self {
        Self::Passed(Some(summary))
    }
}

impl From<Waiver> for Outcome {
    fn from(waiver: Waiver) -> Self {
        Self::Waived(waiver)
    }
}

/// Why nothing can run here: the run is waived, not failed. The one reason a waived run gives, on its
/// verdict line and in its document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiver(pub(crate) String);

impl std::fmt::Display for Waiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Waiver {}

/// cuda-samples' exit statuses.
pub(crate) const EXIT_SUCCESS: u8 = 0;
pub(crate) const EXIT_FAILURE: u8 = 1;
pub(crate) const EXIT_WAIVED: u8 = 2;
