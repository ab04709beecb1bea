//! The processes that join a served run (`--serve SOCKET`), as the server sees them: the listening socket,
//! each joiner admitted at the door (`door`), watched through its connection until it says how it ended
//! (`watch`), and told how the whole run ended (`at_end`: what the joiners leave for the run's end). A run
//! of a served sequence (`--serve --ipc all`) neither binds nor removes the socket: it inherits the
//! sequence's listener and the connections its top parent holds, and hands every connection still open back
//! at its end. The server cannot kill a joiner: it stops one by aborting the run in the segment and closing
//! the connection, which every wait of a joiner looks at.
//!
//! A joiner's death is its connection closing without a word: the run fails at once, naming it, as a child's
//! death does. A socket path is made by the server and removed by it (or by its guardian, if it is killed),
//! and only while it is still the socket it made (`socket_file`).

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::meeting::Address;
use crate::os::made_path::MadePath;
use crate::phases::timings::Timeout;
use crate::placement::Place;
use crate::segment::{Segment, SharedState};
use crate::supervise::guardian::Guardian;
use crate::supervise::peers::{PeerFailed, Peers};
use crate::wire::Round;

mod at_end;
mod door;
mod socket_file;
mod watch;

pub use at_end::JoinersAtEnd;
pub(crate) use door::{started_by, stranger};
pub(crate) use socket_file::{bind_at, remove_if_made};

/// How long the server waits, after it aborted the run, for the joiners to leave before it closes their
/// connections (which stops any that is still waiting).
const GRACE: Duration = Duration::from_millis(300);
/// How long a new connection has to ask to join before it is let go (a joiner asks at once).
const ASK_WITHIN: Duration = Duration::from_millis(500);
/// New connections taken at one look, and connections that have not asked yet kept at most.
const DOOR_PER_LOOK: usize = 8;
const MAX_WAITING: usize = 64;
/// Connections of one process that have not asked yet kept at most: a flood of one cannot push others out.
const PER_PEER: usize = 4;
/// How often the server looks at its socket and its joiners.
const POLL: Duration = Duration::from_millis(1);

/// One admitted joiner: its index, its pid (in our namespace, as the socket says), its connection (kept
/// after it said how it ended, to tell it how the run ended; gone when it is) and whether it is done (it said
/// how it ended, or is gone).
struct Joined {
    index: usize,
    pid: i32,
    connection: Option<OwnedFd>,
    done: bool,
    /// Where it said it stands, if it said.
    place: Option<Box<Place>>,
}

/// A connection that has not asked to join yet: the process's pid (by the socket), since when it waits,
/// and why it will be refused, if it will.
struct Waiting {
    connection: OwnedFd,
    pid: i32,
    /// How long it has had to ask (see [`Waiting::look`]).
    waited: Duration,
    last_look: Instant,
    refusal: Option<String>,
}

/// The most of one gap between two looks at a waiting connection that counts against [`ASK_WITHIN`]: a
/// server held stopped (Ctrl-Z) or starved of a CPU counts only this much.
const LOOK_COUNTS_AT_MOST: Duration = Duration::from_millis(50);

impl Waiting {
    fn new(connection: OwnedFd, pid: i32, refusal: Option<String>) -> Self {
        Self { connection, pid, waited: Duration::ZERO, last_look: Instant::now(), refusal }
    }

    /// Counts the time since the last look against [`ASK_WITHIN`], at most [`LOOK_COUNTS_AT_MOST`], and
    /// none while the process that connected is stopped (Ctrl-Z holds a whole isolated run, server and
    /// joiners, for as long as the user likes); true while it still has time to ask.
    fn look(&mut self) -> bool {
        let gap = self.last_look.elapsed().min(LOOK_COUNTS_AT_MOST);
        self.last_look = Instant::now();
        let stopped =
            crate::os::proc_stat::read(self.pid).is_some_and(|stat| matches!(stat.state, 'T' | 't'));
        if !stopped {
            self.waited += gap;
        }
        self.waited < ASK_WITHIN
    }
}

/// The served run's joiners.
pub struct Joiners<'s> {
    segment: &'s Segment,
    /// `None` once the door is closed (every process of a run of a sequence has joined).
    listener: Option<OwnedFd>,
    address: Address,
    /// The socket file the server made (device, inode), removed on drop if it is still that one.
    made: Option<(u64, u64)>,
    processes: usize,
    /// The index of the first joiner: 0, or 1 where the server is process 0 (the benchmark's consumer).
    first: usize,
    /// The server's end is kept; the joiner's end of each descriptor socket goes to the joiner of its index.
    descriptor_sockets: Vec<Option<OwnedFd>>,
    joined: Vec<Joined>,
    /// Connections that have not asked to join yet.
    waiting: Vec<Waiting>,
    deadline: Option<(Instant, Duration)>,
    /// How long this process was held stopped while it waited (said where the deadline passes).
    held: crate::supervise::held::Held,
    /// The socket's file goes once every process has joined (`--isolate`: nobody else is to come, and a
    /// server killed after that leaves no file).
    remove_when_full: bool,
    /// The run's place in a sequence (`--serve --ipc all`), said to each joiner as it is admitted.
    round: Option<Round>,
    /// `--isolate`: only processes these processes started may join (the server started them itself).
    only_started_by: Option<Vec<i32>>,
    /// Where the placement goes once every process has joined, for the run's end; and where the joiners'
    /// connections go when these joiners do, to be told how the run ended, if they are
    /// (`hands_over_connections`).
    at_end: Option<&'s JoinersAtEnd>,
    hands_over_connections: bool,
    /// The guardian told of the socket's file (as made), which removes it if this server is killed.
    guardian: Option<(&'s Guardian, Box<MadePath>)>,
}

impl<'s> Joiners<'s> {
    /// The joiners are processes `first` and on of the run's `processes` (the server is the ones before).
    pub fn starting_at_index(mut self, first: usize) -> Self {
        self.first = first;
        self
    }

    /// How many processes are to join.
    fn expected(&self) -> usize {
        self.processes - self.first.min(self.processes)
    }

    /// Admits whoever is at the door and fails if a joiner has failed or is gone, or the watchdog's time is
    /// up: for a server that takes part in the run itself (the benchmark's consumer), between its steps.
    pub fn check_alive(&mut self) -> Result<()> {
        self.check_deadline()?;
        self.answer_the_door()?;
        match self.look_at_joiners()? {
            Some(failure) => Err(failure.into()),
            None => Ok(()),
        }
    }

    /// Admits only processes that `pids` started (or are): the processes an isolated run started itself.
    pub fn only_started_by(mut self, pids: Vec<i32>) -> Self {
        self.only_started_by = Some(pids);
        self
    }

    /// Hands where the joiners stand to `at_end` (as [`handing_placement_to`](Self::handing_placement_to)),
    /// and, when these joiners go, their connections, to be told how the run ended.
    pub fn handing_placement_and_connections_to(mut self, at_end: &'s JoinersAtEnd) -> Self {
        self.hands_over_connections = true;
        self.handing_placement_to(at_end)
    }

    /// Hands where the joiners stand, once they all have, to `at_end`, for the run's end.
    pub fn handing_placement_to(mut self, at_end: &'s JoinersAtEnd) -> Self {
        self.at_end = Some(at_end);
        self
    }

    /// The joiners of a run of a served sequence, at the listener (and with the connections) that
    /// `at_end` inherited from the sequence's top parent.
    pub fn in_sequence(
        segment: &'s Segment,
        at_end: &'s JoinersAtEnd,
        processes: usize,
        descriptor_sockets: Vec<OwnedFd>,
        started: Instant,
        timeout: Timeout,
    ) -> Result<Self> {
        let (round, listener, held) =
            at_end.door().context("a run of a served sequence without the sequence's listener")?;
        let address = Address::Abstract("(the sequence's)".to_owned()); // never bound or removed here
        let mut joiners =
            Self::at(segment, (listener, None), address, processes, descriptor_sockets, started, timeout);
        joiners.round = Some(round);
        for connection in held {
            joiners.arrived(connection);
        }
        Ok(joiners.handing_placement_and_connections_to(at_end))
    }

    /// Removes the socket's file once every process has joined.
    pub fn removing_the_socket_when_full(mut self) -> Self {
        self.remove_when_full = true;
        self
    }

    /// Has `guardian` remove the socket's file (if it is still the one this server made) should this server
    /// be killed before it removes it itself.
    pub fn covered_by(mut self, guardian: &'s Guardian) -> Self {
        let made = match (&self.address, self.made) {
            (Address::Path(path), Some((dev, ino))) => {
                MadePath::of(path).filter(|now| (now.dev, now.ino, now.dir) == (dev, ino, false))
            }
            _ => None,
        };
        if let Some(made) = made {
            guardian.cover_path(&made);
            self.guardian = Some((guardian, Box::new(made)));
        }
        self
    }

    /// Removes the socket's file, if it is still the one this server made (and tells the guardian so).
    fn remove_socket_file(&mut self) {
        remove_if_made(&self.address, self.made.take());
        if let Some((guardian, made)) = self.guardian.take() {
            guardian.forget_path(&made);
        }
    }

    /// Listens at `address` for the run's `processes` joiners; `descriptor_sockets` has the joiners' ends
    /// of their descriptor sockets (vmm and pool), the first for process 0.
    pub fn listen(
        segment: &'s Segment,
        address: Address,
        processes: usize,
        descriptor_sockets: Vec<OwnedFd>,
        started: Instant,
        timeout: Timeout,
    ) -> Result<Self> {
        let door = bind_at(&address)?;
        Ok(Self::at(segment, door, address, processes, descriptor_sockets, started, timeout))
    }

    /// Joiners at the listener `door` (and the socket file it made, if it made one).
    fn at(
        segment: &'s Segment,
        (listener, made): (OwnedFd, Option<(u64, u64)>),
        address: Address,
        processes: usize,
        descriptor_sockets: Vec<OwnedFd>,
        started: Instant,
        timeout: Timeout,
    ) -> Self {
        let mut sockets: Vec<Option<OwnedFd>> = descriptor_sockets.into_iter().map(Some).collect();
        sockets.resize_with(processes, || None);
        Self {
            segment,
            listener: Some(listener),
            address,
            made,
            processes,
            first: 0,
            descriptor_sockets: sockets,
            joined: Vec::new(),
            waiting: Vec::new(),
            deadline: timeout.deadline_from(started),
            held: crate::supervise::held::Held::new(),
            remove_when_full: false,
            round: None,
            only_started_by: None,
            at_end: None,
            hands_over_connections: false,
            guardian: None,
        }
    }

    fn state(&self) -> &'s SharedState {
        self.segment.state()
    }

    /// Aborts the run, gives the joiners [`GRACE`] to say how they ended, then lets every connection go: to
    /// `at_end`, which tells them how the run ended, or closed (a joiner still waiting stops when it sees
    /// it closed).
    pub fn stop(&mut self) {
        // A run that ends before its last joiner joined keeps the forecast of those that did: it matters
        // most when the run fails.
        if self.joined.len() < self.expected()
            && let Err(e) = self.report_placement()
        {
            eprint_line!("simple-ipc: {e:#}");
        }
        self.state().abort();
        let until = Instant::now() + GRACE;
        while self.joined.iter().any(|j| !j.done) && Instant::now() < until {
            let _ = self.look_at_joiners();
            std::thread::sleep(POLL);
        }
        let Some(at_end) = self.at_end.filter(|_| self.hands_over_connections) else { return };
        for joiner in &mut self.joined {
            if let Some(connection) = joiner.connection.take() {
                at_end.to_tell.borrow_mut().push(connection);
            }
        }
        // In a sequence, those that have not asked yet may be for the next run.
        if let Some(sequence) = &at_end.sequence {
            sequence.waiting.borrow_mut().extend(self.waiting.drain(..).map(|w| w.connection));
        }
    }
}

impl Peers for Joiners<'_> {
    const STOPPED: &'static str = "every joiner told to stop";

    fn all_ended(&self) -> bool {
        Joiners::all_ended(self)
    }

    fn check_deadline(&self) -> Result<()> {
        Joiners::check_deadline(self)
    }

    fn look(&mut self) -> Result<Option<PeerFailed>> {
        self.answer_the_door()?;
        self.look_at_joiners()
    }

    /// The server cannot kill a joiner: whichever failed, it stops them all the same way.
    fn stop(&mut self, _: Option<usize>) {
        Joiners::stop(self);
    }
}

impl Drop for Joiners<'_> {
    fn drop(&mut self) {
        self.stop();
        self.remove_socket_file();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection whose process is stopped (Ctrl-Z holding the whole isolated run) keeps its place at
    /// the door for as long as it is stopped; once it runs, it has ASK_WITHIN to ask, counted only while
    /// the door looks.
    #[test]
    fn a_stopped_joiner_keeps_its_time_to_ask() {
        let (ours, _theirs) = crate::wire::descriptors::pair().unwrap();
        /// Killed and reaped however the test ends (stopped, it would outlive a failed assertion).
        struct Sleeper(std::process::Child);
        impl Drop for Sleeper {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let sleeper = Sleeper(std::process::Command::new("sleep").arg("30").spawn().unwrap());
        let pid = sleeper.0.id() as i32;
        let signal = |signal| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
        signal(nix::sys::signal::Signal::SIGSTOP);
        while crate::os::proc_stat::read(pid).is_none_or(|s| s.state != 'T') {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut waiting = Waiting::new(ours, pid, None);
        let start = Instant::now();
        while start.elapsed() < ASK_WITHIN * 2 {
            assert!(waiting.look(), "stopped, it keeps its time");
            std::thread::sleep(Duration::from_millis(10));
        }
        signal(nix::sys::signal::Signal::SIGCONT);
        let running = Instant::now();
        while waiting.look() {
            assert!(running.elapsed() < ASK_WITHIN * 3, "running, its time runs out");
            std::thread::sleep(Duration::from_millis(10));
        }
        // (The first look after SIGCONT counts the gap since the one before it.)
        let ran = running.elapsed() + LOOK_COUNTS_AT_MOST;
        assert!(ran >= ASK_WITHIN, "after ASK_WITHIN of looks: {ran:?}");
        drop(sleeper);
    }
}
