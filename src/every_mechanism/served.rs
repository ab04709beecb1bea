//! `--serve SOCKET --ipc all`: the top parent binds the socket once and holds it for the whole sequence.
//! Each mechanism's run inherits the listener and the connections the top parent holds, and at its end
//! hands every connection still open back (`joiners::JoinersAtEnd`): a joiner keeps one connection from the
//! run it first joins to the end, asking again after each run, and a run waived before anyone joined needs
//! nobody told, for the next run admits whoever waits. Once the last run is over, the top parent tells each
//! connection still open (and each still waiting at the listener) how every run ended, then closes the
//! listener and removes the socket file it made. The user's `--timeout` bounds the whole sequence: each run
//! is given what is left of it.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::sys::socket::{SockFlag, accept4, getsockopt, sockopt::PeerCredentials};

use super::{Row, sub_run};
use crate::ipc::Mechanism;
use crate::joiners;
use crate::meeting::{self, Address};
use crate::os::made_path::MadePath;
use crate::phases::timings::Timeout;
use crate::role::{Run, Served};
use crate::supervise::guardian::Guardian;
use crate::wire::{self, Heard, Message, Round, RunEnd};

/// Connections still waiting at the listener that the top parent tells at the end, at most.
const MOST_AT_THE_END: usize = 256;

/// The served sequence, as its top parent holds it.
pub(crate) struct Sequence {
    address: Address,
    listener: OwnedFd,
    made: Option<(u64, u64)>,
    /// Connections handed back by the last run, for the next.
    held: Vec<OwnedFd>,
    /// How each run of the sequence so far ended, and how many it has.
    ends: Vec<RunEnd>,
    runs: u32,
    /// The end of the user's `--timeout`, from the start of the sequence.
    deadline: Option<(Instant, Duration)>,
    /// Removes the socket file if this process is killed (a run's own guardian covers only its run).
    guardian: Option<(Guardian, MadePath)>,
}

impl Sequence {
    pub(crate) fn open(address: &Address, runs: u32, timeout: Timeout) -> Result<Self> {
        let address = address.clone();
        let (listener, made) = joiners::bind_at(&address)?;
        let deadline = timeout.deadline_from(Instant::now());
        let guardian = match (&address, made) {
            (Address::Path(path), Some((dev, ino))) => {
                let made = MadePath::of(path).filter(|now| (now.dev, now.ino, now.dir) == (dev, ino, false));
                match made {
                    Some(made) => {
                        let guardian = Guardian::start()?;
                        guardian.cover_path(&made);
                        Some((guardian, made))
                    }
                    None => None,
                }
            }
            _ => None,
        };
        Ok(Self { address, listener, made, held: Vec::new(), ends: Vec::new(), runs, deadline, guardian })
    }

    /// Runs `mechanism` as the next run of the sequence, with the listener and the connections held, and
    /// takes back the connections it hands back at its end.
    pub(crate) fn run(&mut self, run: &Run, mechanism: Mechanism) -> Result<Row> {
        let number = self.ends.len() as u32 + 1;
        let left = self.deadline.map(|(at, _)| at.saturating_duration_since(Instant::now()));
        if let (Some(left), Some((_, timeout))) = (left, self.deadline)
            && left.is_zero()
        {
            let why =
                format!("not run: the sequence did not finish within {} s (--timeout)", timeout.as_secs());
            print_line!("{why}")?;
            return Ok(self.ended(Row {
                mechanism,
                ending: RunEnd::Failed { process: None, why },
                ..Row::not_run(mechanism)
            }));
        }
        let (back, their_back) = crate::wire::descriptors::pair()?;
        let mut given =
            vec![self.listener.try_clone().context("dup of the sequence's listener")?, their_back];
        given.append(&mut self.held);
        let fds = given.iter().map(AsRawFd::as_raw_fd).collect();
        let served = Served { round: Round { number, of: self.runs }, fds };
        // What is left of the sequence's --timeout.
        let seconds = left.map_or(0, |left| left.as_secs_f64().ceil() as u64);
        let run = Run { timeout: Timeout::from_secs(seconds), ..run.clone() };
        let row = sub_run::run_one_inheriting(&run, mechanism, Some(served), true, given, false)?;
        while let Ok(Heard::Said(Message::HandBack, connections)) = wire::hear(&back, 0) {
            self.held.extend(connections);
        }
        Ok(self.ended(row))
    }

    fn ended(&mut self, row: Row) -> Row {
        self.ends.push(row.ending.clone());
        row
    }

    /// Tells every connection held, and every one still waiting at the listener, how each run ended (a
    /// stranger is refused), then closes the listener and removes the socket file it made.
    pub(crate) fn end(mut self) {
        for _ in 0..MOST_AT_THE_END {
            let connection = match accept4(&self.listener, SockFlag::SOCK_CLOEXEC) {
                Ok(connection) => connection,
                Err(Errno::EINTR) => continue,
                Err(_) => break,
            };
            let peer = getsockopt(&connection, PeerCredentials);
            match peer.map(|peer| joiners::stranger(peer.uid())) {
                Ok(None) => self.held.push(connection),
                Ok(Some(why)) => {
                    let _ = wire::hear(&connection, 0);
                    let _ = meeting::refuse(&connection, &why);
                }
                Err(_) => {}
            }
        }
        for connection in &self.held {
            // One that is gone has nothing to hear.
            let _ = wire::send(connection, &Message::SequenceEnded(self.ends.clone()), &[]);
        }
    }
}

impl Drop for Sequence {
    /// The socket file goes however the sequence ends (a stop signal, a failure of this process); if this
    /// process is killed, its guardian removes it.
    fn drop(&mut self) {
        joiners::remove_if_made(&self.address, self.made.take());
        if let Some((guardian, made)) = &self.guardian {
            guardian.forget_path(made);
        }
    }
}
