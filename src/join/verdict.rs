//! A joiner's verdict: on the run it took part in, the run's (its own part's failure first), and on a served
//! sequence, every run's.

use anyhow::{Result, anyhow, bail};

use crate::meeting::Address;
use crate::os::signals;
use crate::outcome::{Outcome, Waiver};
use crate::wire::{Round, RunEnd};

/// A joiner's verdict on a served sequence: it fails if any run failed (naming each, with this process's
/// own part's failure where it took part), is waived if every run was, and passes otherwise. Each run it
/// did not take part in is said, with how it ended.
pub(super) fn the_sequences_verdict(
    address: &Address,
    mut took_part: Vec<(Round, Result<()>)>,
    ends: &[RunEnd],
) -> Result<Outcome> {
    let of = ends.len() as u32;
    let mut failed = Vec::new();
    for (number, end) in (1..).zip(ends) {
        let round = Round { number, of };
        let own = took_part.iter().position(|(r, _)| r.number == number).map(|i| took_part.remove(i).1);
        match (own, end) {
            (Some(Err(e)), _) => failed.push(format!("run {round}: {e:#}")),
            (Some(Ok(())), _) | (None, RunEnd::Passed) => {}
            (None, RunEnd::Waived(why)) => print_line!("The server's run {round} was waived: {why}")?,
            (None, RunEnd::Failed { why, .. }) => failed.push(format!("run {round} failed: {why}")),
        }
    }
    if !failed.is_empty() {
        bail!("--join {address}: {}", failed.join("; "));
    }
    if ends.iter().all(|end| matches!(end, RunEnd::Waived(_))) {
        return Ok(Outcome::Waived(Waiver(format!(
            "every run of the served sequence at {address} was waived"
        ))));
    }
    Ok(Outcome::passed(format!("took part in the served sequence of {of} runs at {address}")))
}

/// This process's verdict: the run's. Its own part's failure comes first (with the run's, where another
/// process's failed it); a part that ended well passes only a run that passed.
pub(super) fn the_runs_verdict(index: usize, own: Result<()>, run: Result<RunEnd>) -> Result<()> {
    let interrupted = |e: &anyhow::Error| e.chain().any(|c| c.is::<signals::Interrupted>());
    match (own, run) {
        (Err(e), _) if interrupted(&e) => Err(e),
        (_, Err(e)) if interrupted(&e) => Err(e),
        (Ok(()), Ok(RunEnd::Passed)) => Ok(()),
        (Ok(()), Ok(RunEnd::Failed { why, .. })) => bail!("the run failed: {why}"),
        (Ok(()), Ok(RunEnd::Waived(why))) => bail!("the run was waived after this process joined it: {why}"),
        (Ok(()), Err(e)) => Err(e.context("this process's part ended well, but the run's end is not known")),
        (Err(e), Ok(RunEnd::Failed { process, why })) if process != Some(index) => {
            Err(e.context(format!("the run failed: {why}")))
        }
        // What the simulation does not model would waive the run, but a server gone (killed just after this
        // process joined: its memory is then no longer in /proc, as if in another PID namespace) is no
        // waiver: the run's end comes first, and the part's failure is said as text only.
        (Err(e), Err(gone)) if beyond_the_simulation(&e) => Err(anyhow!(
            "{gone:#}; this process's own part then met what the simulated GPUs do not model, which a \
             server that is gone causes: {e:#}"
        )),
        (Err(e), _) => Err(e),
    }
}

/// Whether `e` is the simulated driver's answer to what it does not model (which `main` takes for a waiver).
fn beyond_the_simulation(e: &anyhow::Error) -> bool {
    e.chain().filter_map(|c| c.downcast_ref::<crate::driver::CallFailed>()).any(|f| f.beyond_the_simulation)
}
