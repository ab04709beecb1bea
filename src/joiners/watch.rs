//! Watching the joiners of a served run: what each said (its word can fail the run, never pass it: it must
//! have finished in the segment too), who is gone, and the watchdog's deadline, naming who never joined.

use std::time::Instant;

use anyhow::{Result, anyhow};

use super::Joiners;
use crate::phases::timings::progress_of;
use crate::supervise::peers::PeerFailed;
use crate::wire::{self, Heard, Message};

impl Joiners<'_> {
    /// Reads what each joiner said and notices the ones that are gone; returns the first failure.
    pub(super) fn look_at_joiners(&mut self) -> Result<Option<PeerFailed>> {
        let mut failure = None;
        for joiner in &mut self.joined {
            let Some(connection) = &joiner.connection.as_ref().filter(|_| !joiner.done) else { continue };
            let mut diagnosis = None;
            let mut refused = None;
            // One that said how it ended stays connected, to be told how the run ended; one gone, or that
            // said what it should not, is let go.
            let mut keep = true;
            let how = match wire::hear(connection, 0) {
                Err(e) => {
                    keep = false;
                    Some(format!("it sent what simple-ipc does not send: {e:#}"))
                }
                Ok(Heard::Nothing) => continue,
                // Its own word is not enough: it must have finished in the segment too.
                Ok(Heard::Said(Message::Ended(0, ..), _))
                    if crate::phases::timings::finished(self.segment.state(), joiner.index) =>
                {
                    None
                }
                Ok(Heard::Said(Message::Ended(0, ..), _)) => {
                    Some("it said it ended well, but never finished its part".to_owned())
                }
                Ok(Heard::Said(Message::Ended(code, why, _, _), _)) if why.is_empty() => {
                    Some(format!("exit code {code}"))
                }
                Ok(Heard::Said(Message::Ended(code, why, said, refusal), _)) => {
                    diagnosis = said;
                    refused = refusal.map(|r| *r);
                    Some(format!("exit code {code}: {why}"))
                }
                Ok(Heard::Closed) => {
                    keep = false;
                    Some(format!("pid {}: gone without saying how it ended (killed?)", joiner.pid))
                }
                Ok(Heard::Said(..)) => {
                    keep = false;
                    Some("it sent what it should not".to_owned())
                }
            };
            joiner.done = true;
            if !keep {
                joiner.connection = None;
            }
            if let Some(how) = how
                && failure.is_none()
            {
                failure = Some(PeerFailed { diagnosis, refused, ..PeerFailed::new(joiner.index, how) });
            }
        }
        Ok(failure)
    }

    pub(super) fn all_ended(&self) -> bool {
        self.joined.len() == self.expected() && self.joined.iter().all(|j| j.done)
    }

    /// `Err` once the watchdog's deadline has passed, naming the processes that never joined and where
    /// each one that did was.
    pub(super) fn check_deadline(&self) -> Result<()> {
        self.held.look();
        let Some((deadline, timeout)) = self.deadline else { return Ok(()) };
        if Instant::now() < deadline {
            return Ok(());
        }
        let mut places: Vec<String> = self
            .joined
            .iter()
            .filter(|j| !j.done)
            .map(|j| {
                let word = self.state().progress[j.index].load(std::sync::atomic::Ordering::Acquire);
                format!("process {} (pid {}) was {}", j.index, j.pid, progress_of(word))
            })
            .collect();
        let never = self.first + self.joined.len()..self.processes;
        let missing = missing_joiners(never.len(), self.expected());
        places.extend(never.map(|i| format!("process {i} never joined")));
        // No full stop at the end: a context may follow it (`...: in the barrier`).
        Err(anyhow!(
            "the run did not finish within {} s (--timeout); stopped it.{missing}{} Not finished: {}",
            timeout.as_secs_f64(),
            self.held.said(),
            places.join("; ")
        ))
    }
}

/// The sentence that says how many of the `expected` joiners never joined (`count`), in plain words.
fn missing_joiners(count: usize, expected: usize) -> String {
    match (count, expected) {
        (0, _) => String::new(),
        (1, 1) => " The joiner never joined.".to_owned(),
        (count, expected) if count == expected => format!(" None of the {expected} joiners joined."),
        (count, expected) => format!(" {count} of the {expected} joiners never joined."),
    }
}

#[cfg(test)]
mod tests {
    use super::missing_joiners;

    #[test]
    fn the_missing_joiners_are_said_in_plain_words() {
        assert_eq!(missing_joiners(0, 2), "");
        assert_eq!(missing_joiners(1, 1), " The joiner never joined.");
        assert_eq!(missing_joiners(2, 2), " None of the 2 joiners joined.");
        assert_eq!(missing_joiners(1, 2), " 1 of the 2 joiners never joined.");
    }
}
