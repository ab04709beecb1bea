//! A process that joins a served run (`--join SOCKET`), from another container say: it connects to the
//! server's socket, is admitted with its index, the segment and (for vmm and pool) its descriptor socket,
//! and from then on is a child in every respect (its lines, its round-robin, its verification, its exit
//! status), with the connection standing for its parent: when the server is gone, it stops. At its end it
//! tells the server how it ended.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::socket::connect;

use crate::attach;
use crate::child;
use crate::meeting::{self, Address, Heard};
use crate::phase::{Phase, Who};
use crate::signals;
use crate::timings::Stopwatch;

/// How long a joiner waits for the server to answer: it admits or refuses at once.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// A process its parent started to join (`--isolate`) found the run over before it joined: the parent has
/// said how the run ended, and this process has nothing to add.
#[derive(Debug)]
pub struct RunOverBeforeJoining;

impl std::fmt::Display for RunOverBeforeJoining {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the run was over before this process could join it")
    }
}

impl std::error::Error for RunOverBeforeJoining {}

/// Joins the run at `address`; `started_by_server`: the server started this process (`--isolate`).
pub fn run(address: &str, timeout: Option<Duration>, started_by_server: bool) -> Result<()> {
    let address = Address::parse(address).with_context(|| format!("--join {address}"))?;
    let connection = meeting::seqpacket()?;
    match connect(connection.as_raw_fd(), &address.unix()?) {
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ECONNREFUSED) if started_by_server => {
            return Err(RunOverBeforeJoining.into());
        }
        connected => connected.with_context(|| {
            format!("--join {address}: no run is served there, or this process cannot reach the socket")
        })?,
    }
    meeting::ask_to_join(&connection)?;
    let asked = Instant::now();
    let admission = loop {
        signals::check()?;
        match meeting::hear(&connection, 10)? {
            Heard::Admitted(admission) => break admission,
            Heard::Refused(why) => bail!("--join {address}: the server refused this process: {why}"),
            Heard::Closed => bail!("--join {address}: the server closed the connection without an answer"),
            Heard::Ended(..) | Heard::Asked => {
                bail!("--join {address}: the server sent what only a joiner sends")
            }
            Heard::Nothing if asked.elapsed() > ANSWER_WITHIN => {
                bail!("--join {address}: the server did not answer within {} s", ANSWER_WITHIN.as_secs())
            }
            Heard::Nothing => {}
        }
    };
    let index = admission.index;
    let watch = Stopwatch::start(Who::Child(index), Phase::Attach)?;
    let segment = attach::joined_segment(index, admission.processes, admission.segment)?;
    let ended = child::take_part(
        index,
        watch,
        &segment,
        admission.descriptor_socket,
        &attach::Parent::Server {
            connection: &connection,
            deadline: timeout.and_then(|t| asked.checked_add(t).map(|at| (at, t))),
        },
    );
    let (status, why) = match &ended {
        Ok(()) => (crate::outcome::EXIT_SUCCESS, String::new()),
        Err(e) => (crate::outcome::EXIT_FAILURE, format!("{e:#}")),
    };
    // The server may be gone already (that may be why this process stopped): nothing more to say then.
    let _ = meeting::say_ended(&connection, status, &why);
    ended
}
