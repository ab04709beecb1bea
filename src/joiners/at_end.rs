//! What the joiners leave for the end of the run, once the server's [`Joiners`](super::Joiners) are gone:
//! the connections still open, to be told how the whole run ended, and what the processes that joined said
//! of themselves, for the document; in a served sequence, what a run inherits from its top parent and hands
//! back at its end.

use std::cell::RefCell;
use std::os::fd::OwnedFd;

use anyhow::{Result, bail};

use crate::meeting;
use crate::outcome::Outcome;
use crate::placement::Placement;
use crate::report::{Findings, Refused};
use crate::supervise::peers::PeerFailed;
use crate::wire::{self, Message, Round, RunEnd};

/// The joiners as the end of the run finds them, held by the role that started the run and lent to its
/// [`Joiners`](super::Joiners), which hand over where the joiners stand once they all have joined, and their
/// connections as they go. The connections still open when the run is over are told how the whole run
/// ended: a joiner's verdict is the run's, not its own part's.
#[derive(Default)]
pub struct JoinersAtEnd {
    /// The joiners' connections handed over, to be told how the run ended.
    pub(super) to_tell: RefCell<Vec<OwnedFd>>,
    pub(super) sequence: Option<InSequence>,
    /// Where the processes that joined stand, once they all have (see `Joiners::report_placement`).
    pub(super) placement: RefCell<Option<Placement>>,
    /// A refusal that a process the run started in namespaces of its own reported (see `parent::isolated`).
    pub(crate) refused: RefCell<Option<Refused>>,
}

/// What a run of a served sequence inherits from the sequence's top parent: the listener, the connections
/// the top parent holds (joiners that ask again after the run before, or that it had not admitted), and the
/// socket every connection still open goes back over at the run's end.
pub(super) struct InSequence {
    pub(super) round: Round,
    pub(super) listener: RefCell<Option<OwnedFd>>,
    pub(super) waiting: RefCell<Vec<OwnedFd>>,
    pub(super) back: OwnedFd,
}

impl JoinersAtEnd {
    /// Whether these are the joiners of a run of a served sequence (which inherited the listener).
    pub fn is_in_sequence(&self) -> bool {
        self.sequence.is_some()
    }

    /// The joiners of run `round` of a served sequence, from the descriptors `--served-fds` names: the
    /// listener, the socket back to the top parent, then the connections it holds.
    pub fn in_sequence(round: Round, fds: &[i32]) -> Result<Self> {
        let [listener, back, held @ ..] = fds else {
            bail!("--served-fds {fds:?}: the listener and the socket back come first");
        };
        let held = held.iter().map(|&fd| crate::os::inherit::take(fd, "held connection"));
        Ok(Self {
            to_tell: RefCell::default(),
            placement: RefCell::default(),
            refused: RefCell::default(),
            sequence: Some(InSequence {
                round,
                listener: RefCell::new(Some(crate::os::inherit::take(*listener, "sequence's listener")?)),
                waiting: RefCell::new(held.collect::<Result<_>>()?),
                back: crate::os::inherit::take(*back, "socket back to the top parent")?,
            }),
        })
    }

    /// The sequence's listener and the connections held, for this run's joiners (once).
    pub(super) fn door(&self) -> Option<(Round, OwnedFd, Vec<OwnedFd>)> {
        let sequence = self.sequence.as_ref()?;
        Some((sequence.round, sequence.listener.take()?, sequence.waiting.take()))
    }

    /// Hands what the run's processes said of themselves over to `findings`: where they stand, if they all
    /// joined, and a refusal one reported.
    pub fn hand_over(&self, findings: &mut Findings) {
        findings.placement = self.placement.take();
        findings.refused = self.refused.take();
    }

    /// Tells each joiner how the run ended, by the server's verdict `ended`; then closes its connection, or,
    /// in a served sequence, hands it back to the top parent with every other connection still open.
    pub fn tell(self, ended: &Outcome) {
        let mut connections = self.to_tell.into_inner();
        let end = match ended {
            Outcome::Passed(_) => RunEnd::Passed,
            Outcome::Waived(waiver) => RunEnd::Waived(waiver.to_string()),
            Outcome::Failed(e) => RunEnd::Failed {
                process: e.chain().find_map(|c| c.downcast_ref::<PeerFailed>()).map(|j| j.index),
                why: format!("{e:#}"),
            },
            Outcome::Ended(ending) => RunEnd::of(ending),
        };
        // One that is gone has nothing to hear.
        connections.retain(|connection| wire::send(connection, &Message::RunEnded(end.clone()), &[]).is_ok());
        if let Some(sequence) = self.sequence {
            connections.extend(sequence.waiting.into_inner());
            if let Err(e) = meeting::hand_back(&sequence.back, &connections) {
                eprint_line!("simple-ipc: {e:#}");
            }
        }
    }
}
