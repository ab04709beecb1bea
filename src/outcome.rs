//! How a run ends, in cuda-samples' terms: passed, failed or waived, and the exit statuses that say so.

/// How a run that did not fail ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Passed,
    /// Nothing can run here; the reason was printed.
    Waived,
}

/// cuda-samples' exit statuses.
pub(crate) const EXIT_SUCCESS: u8 = 0;
pub(crate) const EXIT_FAILURE: u8 = 1;
pub(crate) const EXIT_WAIVED: u8 = 2;
