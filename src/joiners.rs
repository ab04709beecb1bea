//! The processes that join a served run (`--serve SOCKET`), as the server sees them: the listening socket,
//! who may join (a process of the same user, or root, by the socket's peer credentials read at accept: a
//! stranger is refused and closed at once; a bounded number of connections per process; no more than the
//! run needs, the rest refused with the reason), and each joiner watched through its connection until it
//! says how it ended. A run of a served sequence (`--serve --ipc all`) neither binds nor removes the
//! socket: it inherits the sequence's listener and the connections its top parent holds, and hands every
//! connection still open back at its end. The server cannot kill a joiner: it stops one by aborting the run in the segment and
//! closing the connection, which every wait of a joiner looks at.
//!
//! A joiner's death is its connection closing without a word: the run fails at once, naming it, as a child's
//! death does. A socket path is made by the server and removed by it (or by its guardian, if it is killed),
//! and only while it is still the socket it made: an existing path is never taken over or removed, but for a
//! socket nothing listens on that this process's own user left; another user's is refused, naming its owner.

use std::cell::RefCell;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::errno::Errno;
use nix::sys::socket::{Backlog, accept4, bind, listen, sockopt::PeerCredentials};

use crate::guardian::{Guardian, MadePath};
use crate::meeting::{self, Address};
use crate::placement::{Place, Placement};
use crate::segment::{Segment, SharedState};
use crate::signals;
use crate::timings::progress_of;
use crate::wire::{self, Heard, Message, Round, RunEnd};

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

/// A joiner that ended badly: which, and how.
#[derive(Debug)]
pub struct JoinerFailed {
    pub index: usize,
    pub how: String,
    /// The joiner's diagnosis of its failure, where it had one (for the `--json` document).
    pub diagnosis: Option<crate::ipc::diagnose::Diagnosis>,
    /// The driver's refusal of a handle in the joiner, where that was why (its word: it fails the run).
    pub refused: Option<crate::ipc::refused::Refused>,
}

impl std::fmt::Display for JoinerFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Process {} failed! ({})", self.index, self.how)
    }
}

impl std::error::Error for JoinerFailed {}

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

/// The joiners still connected when the run is over, to be told how the whole run ended: a joiner's verdict
/// is the run's, not its own part's. A server's [`Joiners`] hand their connections over as they go.
#[derive(Default)]
pub struct Audience {
    told: RefCell<Vec<OwnedFd>>,
    sequence: Option<InSequence>,
}

/// What a run of a served sequence inherits from the sequence's top parent: the listener, the connections
/// the top parent holds (joiners that ask again after the run before, or that it had not admitted), and the
/// socket every connection still open goes back over at the run's end.
struct InSequence {
    round: Round,
    listener: RefCell<Option<OwnedFd>>,
    waiting: RefCell<Vec<OwnedFd>>,
    back: OwnedFd,
}

impl Audience {
    /// The audience of run `round` of a served sequence, from the descriptors `--served-fds` names: the
    /// listener, the socket back to the top parent, then the connections it holds.
    pub fn in_sequence(round: Round, fds: &[i32]) -> Result<Self> {
        let [listener, back, held @ ..] = fds else {
            bail!("--served-fds {fds:?}: the listener and the socket back come first");
        };
        let held = held.iter().map(|&fd| crate::inherit::take(fd, "held connection"));
        Ok(Self {
            told: RefCell::default(),
            sequence: Some(InSequence {
                round,
                listener: RefCell::new(Some(crate::inherit::take(*listener, "sequence's listener")?)),
                waiting: RefCell::new(held.collect::<Result<_>>()?),
                back: crate::inherit::take(*back, "socket back to the top parent")?,
            }),
        })
    }

    /// The sequence's listener and the connections held, for this run's joiners (once).
    fn door(&self) -> Option<(Round, OwnedFd, Vec<OwnedFd>)> {
        let sequence = self.sequence.as_ref()?;
        Some((sequence.round, sequence.listener.take()?, sequence.waiting.take()))
    }

    /// Tells each joiner how the run ended, by the server's verdict `ended`; then closes its connection, or,
    /// in a served sequence, hands it back to the top parent with every other connection still open.
    pub fn tell(self, ended: &Result<crate::outcome::Outcome>) {
        let mut connections = self.told.into_inner();
        let end = match ended {
            Ok(crate::outcome::Outcome::Passed) => RunEnd::Passed,
            Ok(crate::outcome::Outcome::Waived) => {
                RunEnd::Waived(crate::report::waiver().unwrap_or_else(|| "waived".to_owned()))
            }
            Err(e) => RunEnd::Failed {
                process: e.chain().find_map(|c| c.downcast_ref::<JoinerFailed>()).map(|j| j.index),
                why: format!("{e:#}"),
            },
        };
        // One that is gone has nothing to hear.
        connections.retain(|connection| wire::send(connection, &Message::RunEnded(end.clone()), &[]).is_ok());
        if let Some(sequence) = self.sequence {
            connections.extend(sequence.waiting.into_inner());
            if let Err(e) = meeting::hand_back(&sequence.back, &connections) {
                warn!("simple-ipc: {e:#}");
            }
        }
    }
}

/// A connection that has not asked to join yet: the process's pid (by the socket), since when it waits,
/// and why it will be refused, if it will.
struct Waiting {
    connection: OwnedFd,
    pid: i32,
    since: Instant,
    refusal: Option<String>,
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
    /// The socket's file goes once every process has joined (`--isolate`: nobody else is to come, and a
    /// server killed after that leaves no file).
    remove_when_full: bool,
    /// The run's place in a sequence (`--serve --ipc all`), said to each joiner as it is admitted.
    round: Option<Round>,
    /// `--isolate`: only processes these processes started may join (the server started them itself).
    only_started_by: Option<Vec<i32>>,
    /// Where the joiners' connections go when these joiners do, to be told how the run ended.
    audience: Option<&'s Audience>,
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

    /// Hands the joiners' connections to `audience` at the end, to be told how the run ended.
    pub fn telling_the_end_to(mut self, audience: &'s Audience) -> Self {
        self.audience = Some(audience);
        self
    }

    /// The joiners of a run of a served sequence, at the listener (and with the connections) that
    /// `audience` inherited from the sequence's top parent.
    pub fn in_sequence(
        segment: &'s Segment,
        audience: &'s Audience,
        processes: usize,
        descriptor_sockets: Vec<OwnedFd>,
        started: Instant,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        let (round, listener, held) =
            audience.door().context("a run of a served sequence without the sequence's listener")?;
        let address = Address::Abstract("(the sequence's)".to_owned()); // never bound or removed here
        let mut joiners =
            Self::at(segment, (listener, None), address, processes, descriptor_sockets, started, timeout);
        joiners.round = Some(round);
        for connection in held {
            joiners.arrived(connection);
        }
        Ok(joiners.telling_the_end_to(audience))
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
        timeout: Option<Duration>,
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
        timeout: Option<Duration>,
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
            deadline: timeout.map(|t| (started + t, t)),
            remove_when_full: false,
            round: None,
            only_started_by: None,
            audience: None,
            guardian: None,
        }
    }

    fn state(&self) -> &'s SharedState {
        self.segment.state()
    }

    /// Admits or refuses whoever is at the socket now.
    fn answer_the_door(&mut self) -> Result<()> {
        // Take a bounded number of new connections a look, so that a flood cannot hold the server (its
        // watchdog, its signals, its joiners) at the door.
        for _ in 0..DOOR_PER_LOOK {
            let Some(listener) = &self.listener else { break };
            let connection = match accept4(listener, nix::sys::socket::SockFlag::SOCK_CLOEXEC) {
                Ok(fd) => fd,
                Err(Errno::EAGAIN | Errno::EINTR) => break,
                Err(e) => return Err(e).context("accepting a joiner"),
            };
            self.arrived(connection);
        }
        // Those that have asked to join by now are admitted; the silent ones are let go after a while, and
        // one that says anything else, or leaves, takes no place.
        let mut still = Vec::new();
        for waiting in std::mem::take(&mut self.waiting) {
            match wire::hear(&waiting.connection, 0) {
                Ok(Heard::Said(Message::Ask { bench_only, place }, _)) => match &waiting
                    .refusal
                    .clone()
                    .or_else(|| {
                        let bench = self.state().options.load(std::sync::atomic::Ordering::Relaxed)
                            & crate::segment::OPTION_BENCH
                            != 0;
                        (bench_only && !bench)
                            .then(|| "this run is not the benchmark (join it without --bench)".to_owned())
                    }) {
                    // Refused once it has asked, so that the answer is read, not lost with the close.
                    Some(why) => {
                        warn!("simple-ipc: a process (pid {}) asked to join: refused: {why}", waiting.pid);
                        let _ = meeting::refuse(&waiting.connection, why);
                    }
                    None => self.admit(waiting.connection, waiting.pid, place)?,
                },
                Ok(Heard::Nothing) if waiting.since.elapsed() < ASK_WITHIN => still.push(waiting),
                _ => {}
            }
        }
        self.waiting = still;
        Ok(())
    }

    /// A new connection at the door: who it is, before anything it says is trusted. A stranger (another
    /// user, not root) is refused and closed at once; one more of a process that has [`PER_PEER`] waiting
    /// already, or beyond [`MAX_WAITING`], is dropped; the rest wait to ask.
    fn arrived(&mut self, connection: OwnedFd) {
        let Ok(peer) = nix::sys::socket::getsockopt(&connection.as_fd(), PeerCredentials) else { return };
        if let Some(why) = stranger(peer.uid()) {
            let _ = wire::hear(&connection, 0); // what it said already, so that the refusal is read
            let _ = meeting::refuse(&connection, &why);
            return;
        }
        let refusal = self.only_started_by.as_ref().and_then(|ours| {
            (!started_by(peer.pid(), ours)).then(|| {
                "this run admits only the processes it started in their namespaces (--isolate)".to_owned()
            })
        });
        let of_this_peer = self.waiting.iter().filter(|w| w.pid == peer.pid()).count();
        if self.waiting.len() >= MAX_WAITING || of_this_peer >= PER_PEER {
            return; // dropped: too many connections that have not asked yet
        }
        self.waiting.push(Waiting { connection, pid: peer.pid(), since: Instant::now(), refusal });
    }

    /// Admits a process that asked to join, or refuses it when the run has all its processes.
    fn admit(&mut self, connection: OwnedFd, pid: i32, place: Option<Box<Place>>) -> Result<()> {
        let position = self.joined.len();
        let index = self.first + position;
        if position >= self.expected() {
            let why = format!("the run has all the {} processes it needs", self.processes);
            warn!("simple-ipc: a process (pid {pid}) asked to join: refused: {why}");
            let _ = meeting::refuse(&connection, &why);
            return Ok(());
        }
        let socket = self.descriptor_sockets[position].as_ref().map(|s| s.as_fd());
        let fds: Vec<_> = std::iter::once(self.segment.fd_borrowed()).chain(socket).collect();
        let admit = Message::Admit { index, processes: self.processes, round: self.round };
        if let Err(e) = wire::send(&connection, &admit, &fds) {
            // It left while it was being admitted: it takes no place.
            warn!("simple-ipc: a process (pid {pid}) that asked to join is gone: {e:#}");
            return Ok(());
        }
        self.descriptor_sockets[position] = None;
        say!("Process {index} joined (pid {pid})")?;
        self.joined.push(Joined { index, pid, connection: Some(connection), done: false, place });
        if self.joined.len() == self.expected() {
            self.say_where_they_stand()?;
        }
        // A run of a sequence closes its door once full: a joiner that comes now waits at the sequence's
        // listener for the next run. So does an isolated run, and removes its socket: nobody else is to come.
        if self.joined.len() == self.expected() && (self.round.is_some() || self.remove_when_full) {
            self.remove_socket_file();
            self.listener = None;
        }
        Ok(())
    }

    /// Once every process has joined, before anything runs: what each shares with the server and the
    /// forecast for each pair (`placement`), in the output and the document. A joiner that said no place
    /// is left out of it.
    fn say_where_they_stand(&self) -> Result<()> {
        let places: Vec<(usize, Place)> =
            self.joined.iter().filter_map(|j| Some((j.index, (**j.place.as_ref()?).clone()))).collect();
        if places.is_empty() {
            return Ok(());
        }
        let placement = Placement::of(Place::here(), places);
        say!("{}", placement.text().trim_end())?;
        crate::report::note_placement(placement);
        Ok(())
    }

    /// Reads what each joiner said and notices the ones that are gone; returns the first failure.
    fn look_at_joiners(&mut self) -> Result<Option<JoinerFailed>> {
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
                    if crate::timings::finished(self.segment.state(), joiner.index) =>
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
                failure = Some(JoinerFailed { index: joiner.index, how, diagnosis, refused });
            }
        }
        Ok(failure)
    }

    fn all_ended(&self) -> bool {
        self.joined.len() == self.expected() && self.joined.iter().all(|j| j.done)
    }

    /// Waits until every joiner has come and said it ended well, or until `enough()`, calling `tick` at every
    /// look; the first that fails, a stop signal or the watchdog aborts the run.
    /// `ended_early` says whether a process the server started itself (`--isolate`) has ended badly.
    pub fn wait(
        &mut self,
        enough: &dyn Fn() -> bool,
        tick: &mut dyn FnMut(),
        ended_early: &mut dyn FnMut() -> Option<anyhow::Error>,
    ) -> Result<()> {
        while !self.all_ended() {
            tick();
            if enough() {
                return Ok(());
            }
            if let Err(interrupted) = signals::check() {
                self.stop();
                return Err(interrupted);
            }
            if let Err(late) = self.check_deadline() {
                self.stop();
                return Err(late);
            }
            self.answer_the_door()?;
            if let Some(failure) = self.look_at_joiners()? {
                let seen = Instant::now();
                self.stop();
                warn!(
                    "simple-ipc: every joiner told to stop {:.0} ms after process {} was seen to fail",
                    seen.elapsed().as_secs_f64() * 1e3,
                    failure.index
                );
                return Err(failure.into());
            }
            if let Some(failure) = ended_early() {
                self.stop();
                return Err(failure);
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    /// `Err` once the watchdog's deadline has passed, naming the processes that never joined and where
    /// each one that did was.
    fn check_deadline(&self) -> Result<()> {
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
        let missing = match never.len() {
            0 => String::new(),
            count => format!(" {count} of the {} joiners never joined.", self.expected()),
        };
        places.extend(never.map(|i| format!("process {i} never joined")));
        Err(anyhow!(
            "the run did not finish within {} s (--timeout); stopped it.{missing} Not finished: {}.",
            timeout.as_secs_f64(),
            places.join("; ")
        ))
    }

    /// Aborts the run, gives the joiners [`GRACE`] to say how they ended, then lets every connection go: to
    /// the audience, which tells them how the run ended, or closed (a joiner still waiting stops when it sees
    /// it closed).
    pub fn stop(&mut self) {
        self.state().abort();
        let until = Instant::now() + GRACE;
        while self.joined.iter().any(|j| !j.done) && Instant::now() < until {
            let _ = self.look_at_joiners();
            std::thread::sleep(POLL);
        }
        let Some(audience) = self.audience else { return };
        for joiner in &mut self.joined {
            if let Some(connection) = joiner.connection.take() {
                audience.told.borrow_mut().push(connection);
            }
        }
        // In a sequence, those that have not asked yet may be for the next run.
        if let Some(sequence) = &audience.sequence {
            sequence.waiting.borrow_mut().extend(self.waiting.drain(..).map(|w| w.connection));
        }
    }
}

/// Why a process of user `uid` may not join a run of this user: `None` for this user or root.
pub(crate) fn stranger(uid: u32) -> Option<String> {
    let me = nix::unistd::geteuid().as_raw();
    (uid != me && uid != 0).then(|| {
        format!("this run admits processes of its own user (uid {me}) or root; this one is uid {uid}")
    })
}

/// Whether process `pid` (as this process sees it; 0 for one outside its PID namespace) is one of `pids` or
/// was started by one of them, up to a few generations (a process outside, its init, the process itself).
fn started_by(pid: i32, pids: &[i32]) -> bool {
    let mut current = pid;
    for _ in 0..4 {
        if current <= 1 {
            return false;
        }
        if pids.contains(&current) {
            return true;
        }
        match crate::proc_stat::read(current) {
            Some(stat) => current = stat.parent,
            None => return false,
        }
    }
    false
}

/// A non-blocking listening socket bound at `address`, and the file it made there (device, inode); a path
/// that exists is taken only where it is a socket nothing listens on (a server killed before it could
/// remove it).
pub(crate) fn bind_at(address: &Address) -> Result<(OwnedFd, Option<(u64, u64)>)> {
    if let Address::Path(path) = address
        && std::fs::symlink_metadata(path).is_ok()
    {
        if !is_stale_socket(address)? {
            bail!(
                "--serve {address}: the path exists and is no socket a run has left; another run may be \
                 serving there (remove it if none is)"
            );
        }
        std::fs::remove_file(path).with_context(|| format!("--serve {address}: removing a stale socket"))?;
        warn!("simple-ipc: removed the stale socket {address} (nothing listened there)");
    }
    listen_at(address)
}

fn listen_at(address: &Address) -> Result<(OwnedFd, Option<(u64, u64)>)> {
    let listener = meeting::seqpacket()?;
    bind(listener.as_raw_fd(), &address.unix()?).with_context(|| format!("--serve {address}: bind"))?;
    let made = match address {
        Address::Path(path) => std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino())),
        Address::Abstract(_) => None,
    };
    listen(&listener, Backlog::new(32).unwrap_or(Backlog::MAXCONN))
        .with_context(|| format!("--serve {address}: listen"))?;
    nix::fcntl::fcntl(&listener, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
        .context("making the run's socket non-blocking")?;
    Ok((listener, made))
}

/// Removes the socket's file at `address`, if it is still the one that `made` says was made there.
pub(crate) fn remove_if_made(address: &Address, made: Option<(u64, u64)>) {
    if let (Address::Path(path), Some((dev, ino))) = (address, made)
        && std::fs::symlink_metadata(path).is_ok_and(|m| m.dev() == dev && m.ino() == ino)
    {
        let _ = std::fs::remove_file(path);
    }
}

/// Whether the path is a socket that nothing listens on (a connection is refused), which this process may
/// remove: one of another user's is an error naming its owner (root too takes no other user's path).
fn is_stale_socket(address: &Address) -> Result<bool> {
    let Address::Path(path) = address else { return Ok(false) };
    let Some(meta) = std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
    else {
        return Ok(false);
    };
    let probe = meeting::seqpacket()?;
    let stale =
        matches!(nix::sys::socket::connect(probe.as_raw_fd(), &address.unix()?), Err(Errno::ECONNREFUSED));
    let me = nix::unistd::geteuid().as_raw();
    if stale && meta.uid() != me {
        let owner = match nix::unistd::User::from_uid(meta.uid().into()) {
            Ok(Some(user)) => format!("uid {} ({})", meta.uid(), wire::printable(&user.name)),
            _ => format!("uid {}", meta.uid()),
        };
        bail!(
            "--serve {address}: the path is a socket nothing listens on, left by {owner}, not by this user \
             (uid {me}): it is not this run's to remove (its owner may remove it, or serve elsewhere)"
        );
    }
    Ok(stale)
}

impl Drop for Joiners<'_> {
    fn drop(&mut self) {
        self.stop();
        self.remove_socket_file();
    }
}
