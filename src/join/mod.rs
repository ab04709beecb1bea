//! A process that joins a served run (`--join SOCKET`), from another container say: it connects to the
//! server's socket, is admitted with its index, the segment and (for vmm and pool) its descriptor socket,
//! and from then on is a child in every respect (its lines, its round-robin, its verification, its exit
//! status), with the connection standing for its parent: when the server is gone, it stops. At its end it
//! tells the server how it ended.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::socket::connect;

use crate::driver::Driver;
use crate::meeting::{self, Address};
use crate::os::signals;
use crate::outcome::Outcome;
use crate::phases::timings::Stopwatch;
use crate::phases::{Phase, Who};
use crate::role::Joiner;
use crate::sample::attach;
use crate::segment;
use crate::tool::child;
use crate::wire::{self, Heard, Message, Round, RunEnd};
use verdict::{the_runs_verdict, the_sequences_verdict};

mod verdict;

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

/// What one run's server said to this process.
enum Answer {
    /// Admitted: it took part, and this is how its part ended (the run's verdict with it), and how the run
    /// ended.
    TookPart(Result<()>, Option<Round>, Option<RunEnd>),
    /// How every run of a served sequence ended (`--serve --ipc all`), said by its top parent at the end.
    SequenceEnded(Vec<RunEnd>),
}

/// `cuInit` begun on a thread of its own as the joiner starts, so that it overlaps the wait for the server.
/// Dropped unused (a joiner refused, or one of a benchmark, which starts its own), it still waits for the
/// thread: a process must not exit while a thread is inside the driver.
struct CudaStarting(Option<std::thread::JoinHandle<Result<Box<dyn Driver>>>>);

impl CudaStarting {
    fn now() -> Result<Self> {
        let thread = std::thread::Builder::new().name("cuda start".into()).spawn(crate::driver::load);
        Ok(Self(Some(thread.context("starting the thread that starts CUDA")?)))
    }

    /// The driver, once loaded (or why not).
    fn driver(mut self) -> Result<Box<dyn Driver>> {
        match self.0.take().map(std::thread::JoinHandle::join) {
            Some(Ok(loaded)) => loaded,
            Some(Err(_)) => bail!("the thread that started CUDA failed"),
            None => crate::driver::load(),
        }
    }
}

impl Drop for CudaStarting {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}

/// Joins the run at `address`, and, where the server says it is one of a sequence of runs (`--serve --ipc
/// all`), each run after it that it is admitted to, over the same connection, until the sequence's top
/// parent says how every run ended; fails if any of them failed. `timeout` bounds the whole of it.
/// `started_by_server`: the server started this process (`--isolate`).
/// `joiner.bench`: the user said `--bench`, and the run must be the benchmark.
pub fn run(joiner: &Joiner, started_by_server: bool) -> Result<Outcome> {
    let (address, timeout, bench) = (&joiner.address, joiner.timeout.limit(), joiner.bench);
    let deadline = joiner.timeout.deadline_from(Instant::now());
    // No other process of this program watches a joiner: a call that never returns would keep it for good.
    let _watchdog = crate::supervise::watchdog::Watchdog::start(deadline);
    // CUDA starts while this process waits for its server and to be admitted (the first run's; each later
    // run of a sequence starts its own).
    let mut cuda = Some(CudaStarting::now()?);
    let connection = connect_to(address, started_by_server, timeout)?;
    let mut took_part: Vec<(Round, Result<()>)> = Vec::new();
    let ends = loop {
        match take_part_once(address, &connection, deadline, bench, started_by_server, cuda.take())? {
            Answer::TookPart(ended, None, _) => return ended.map(|()| Outcome::Passed(None)),
            Answer::TookPart(ended, Some(round), end) => {
                // A run waived once this process had joined is waived, as the sequence's table says.
                let ended = match (ended, end) {
                    (Err(_), Some(RunEnd::Waived(why))) => {
                        print_line!("The server's run {round} was waived: {why}")?;
                        Ok(())
                    }
                    (ended, _) => ended,
                };
                if let Err(e) = &ended {
                    eprint_line!("simple-ipc: run {round} of the sequence: {e:#}");
                }
                took_part.push((round, ended));
            }
            Answer::SequenceEnded(ends) => break ends,
        }
    };
    the_sequences_verdict(address, took_part, &ends)
}

/// A connection to the server at `address`. The connect does not block: a server whose backlog is full
/// (stopped, or flooded) is tried again until `timeout` (the joiner's watchdog), and a stop signal stops it
/// at once.
fn connect_to(address: &Address, started_by_server: bool, timeout: Option<Duration>) -> Result<OwnedFd> {
    use nix::errno::Errno;
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let since = Instant::now();
    let mut said_waiting = false;
    loop {
        signals::check()?;
        no_socket_there(address)?;
        let connection = meeting::seqpacket()?;
        fcntl(&connection, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).context("making a socket non-blocking")?;
        match connect(connection.as_raw_fd(), &address.unix()?) {
            Ok(()) => {
                // Blocking again: every wait from here on polls first.
                fcntl(&connection, FcntlArg::F_SETFL(OFlag::empty())).context("making a socket blocking")?;
                check_the_server(address, &connection)?;
                return Ok(connection);
            }
            Err(Errno::EAGAIN | Errno::EINTR) => {
                if let Some(timeout) = timeout
                    && since.elapsed() >= timeout
                {
                    bail!(
                        "--join {address}: the server did not take the connection within {} s (--timeout of \
                         this joiner): its backlog is full; is it stopped?",
                        timeout.as_secs_f64()
                    );
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(Errno::ENOENT | Errno::ECONNREFUSED) if started_by_server => {
                return Err(RunOverBeforeJoining.into());
            }
            // Containers of a pod start together: the server may not listen yet. Wait for it, within the
            // watchdog, and say once for what.
            Err(e @ (Errno::ENOENT | Errno::ECONNREFUSED)) => {
                if !said_waiting {
                    said_waiting = true;
                    let within = timeout.map_or("for as long as it takes (--timeout 0)".to_owned(), |t| {
                        format!("up to {} s (--timeout)", t.as_secs_f64())
                    });
                    let link = link_of(address).map(|to| format!(", a link to {to}")).unwrap_or_default();
                    print_line!(
                        "Waiting for the server at {address}{link} (nothing listens there yet): {within}"
                    )?;
                }
                if let Some(timeout) = timeout
                    && since.elapsed() >= timeout
                {
                    bail!(
                        "--join {address}: no server came within {} s (--timeout): {}{}",
                        timeout.as_secs_f64(),
                        match (e, link_of(address)) {
                            (Errno::ENOENT, Some(to)) => format!("the end of its link, {to}, never appeared"),
                            (Errno::ENOENT, None) => "the socket's path never appeared".to_owned(),
                            _ => "nothing listened there".to_owned(),
                        },
                        match address {
                            Address::Abstract(_) => {
                                "; an abstract socket is reachable only from the server's own network \
                                 namespace: across network namespaces (two pods, a container of its own \
                                 network), serve at a path on a volume both mount"
                            }
                            Address::Path(_) => "",
                        }
                    );
                }
                // Started beside its server, a joiner connects within a few ms of its listening; one that
                // waits longer for it looks less often.
                let often = since.elapsed() < Duration::from_secs(2);
                std::thread::sleep(Duration::from_millis(if often { 2 } else { 20 }));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "--join {address}: no run is served there, or this process cannot reach the socket"
                    )
                });
            }
        }
    }
}

/// `Err` where the path of `address` is there but is no socket, so that no run can be served there: said at
/// once, not waited for. A link is followed, as connect(2) follows it: the server at its end is held to the
/// same rule as one at the path itself (this user or root, by its credentials on the connection:
/// [`check_the_server`]); one to what is no socket says where it points. A link whose end is not there yet
/// is waited for, as a path that is not there yet is: the server may bind there later.
fn no_socket_there(address: &Address) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Address::Path(path) = address else { return Ok(()) };
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !meta.file_type().is_symlink() {
        if !meta.file_type().is_socket() {
            bail!("--join {address}: that path is no socket, so no run is served there");
        }
        return Ok(());
    }
    let to = link_of(address).unwrap_or_else(|| "what cannot be read".to_owned());
    match std::fs::metadata(path) {
        Ok(end) if !end.file_type().is_socket() => bail!(
            "--join {address}: that path is a link to {to}, which is no socket, so no run is served there"
        ),
        _ => Ok(()),
    }
}

/// Where the path of `address` points, if it is a link (made printable: it is the file system's word).
fn link_of(address: &Address) -> Option<String> {
    let Address::Path(path) = address else { return None };
    let to = std::fs::read_link(path).ok()?;
    Some(crate::output::printable(&to.to_string_lossy()))
}

/// Who listens at the other end of `connection`, before anything it says is trusted: a process of this
/// user, or root (as the server admits a joiner); a stranger is refused, named by its uid and pid (as the
/// socket says: pid 0 for one outside this process's PID namespace).
fn check_the_server(address: &Address, connection: &OwnedFd) -> Result<()> {
    let peer = nix::sys::socket::getsockopt(connection, nix::sys::socket::sockopt::PeerCredentials)
        .with_context(|| format!("--join {address}: asking the socket who the server is (SO_PEERCRED)"))?;
    let me = nix::unistd::geteuid().as_raw();
    if peer.uid() != me && peer.uid() != 0 {
        bail!(
            "--join {address}: refused to join: the process serving there (pid {}, uid {}) is neither of this \
             user (uid {me}) nor root",
            peer.pid(),
            peer.uid()
        );
    }
    Ok(())
}

/// Asks to join the run at the other end of `connection` and, once admitted, takes part in it; then, unless
/// the server started this process (`--isolate`: it says the verdict itself), hears how the whole run ended,
/// which is this process's verdict too.
fn take_part_once(
    address: &Address,
    connection: &OwnedFd,
    deadline: Option<(Instant, Duration)>,
    bench_asked: bool,
    started_by_server: bool,
    cuda: Option<CudaStarting>,
) -> Result<Answer> {
    // A server that refuses a stranger at once may have closed already: its refusal is read next.
    let place = Some(Box::new(crate::placement::Place::here()));
    let _ = wire::send(connection, &Message::Ask { bench_only: bench_asked, place }, &[]);
    let admission = loop {
        signals::check()?;
        match wire::hear(connection, 10)? {
            Heard::Said(Message::Admit { index, processes, round }, fds) => {
                break meeting::Admission::of(index, processes, round, fds)
                    .with_context(|| format!("--join {address}"))?;
            }
            Heard::Said(Message::SequenceEnded(ends), _) => return Ok(Answer::SequenceEnded(ends)),
            Heard::Said(Message::Refuse(why), _) => {
                bail!("--join {address}: the server refused this process: {why}")
            }
            Heard::Closed => bail!("--join {address}: the server closed the connection without an answer"),
            Heard::Said(..) => {
                bail!("--join {address}: the server sent what it should not before it admitted this process")
            }
            Heard::Nothing => {
                if let Some((at, timeout)) = deadline
                    && Instant::now() >= at
                {
                    bail!(
                        "--join {address}: no run admitted this process within {} s (--timeout of this joiner)",
                        timeout.as_secs_f64()
                    )
                }
            }
        }
    };
    let (index, round) = (admission.index, admission.round);
    // Killed by SIGBUS (a full /dev/shm) in its part, it still tells the server why.
    let sigbus = crate::supervise::sigbus::diagnosis();
    let why = format!("killed by SIGBUS: {sigbus}");
    let bus = Message::Ended(128 + nix::libc::SIGBUS as u8, why, Some(sigbus), None).encode()?;
    crate::supervise::sigbus::leave_last_word(connection.as_fd(), bus)?;
    let server = attach::Parent::Server { connection, deadline };
    // However its part ends, from the segment's checks on, the server is told why: its verdict names it.
    let ended = take_part(address, admission, &server, bench_asked, cuda);
    let (status, why) = match &ended {
        Ok(()) => (crate::outcome::EXIT_SUCCESS, String::new()),
        Err(e) => (crate::outcome::EXIT_FAILURE, format!("{e:#}")),
    };
    // With the diagnosis of its failure, where there is one (the server's `--json` document carries it), and
    // the driver's refusal of a handle in it, as typed facts (the server's forecast is held against it).
    let diagnosis = ended.as_ref().err().and_then(|e| e.downcast_ref::<crate::ipc::diagnose::Diagnosis>());
    let refused = ended.as_ref().err().and_then(crate::ipc::refused::Refused::of).map(Box::new);
    // The server may be gone already (that may be why this process stopped): nothing more to say then.
    let _ = wire::send(connection, &Message::Ended(status, why, diagnosis.cloned(), refused), &[]);
    if started_by_server {
        return Ok(Answer::TookPart(ended, round, None));
    }
    let run = hear_how_the_run_ended(address, connection, deadline);
    let end = run.as_ref().ok().cloned();
    Ok(Answer::TookPart(the_runs_verdict(index, ended, run), round, end))
}

/// This process's part in the run it was admitted to.
fn take_part(
    address: &Address,
    admission: meeting::Admission,
    server: &attach::Parent,
    bench_asked: bool,
    cuda: Option<CudaStarting>,
) -> Result<()> {
    let index = admission.index;
    let watch = Stopwatch::start(Who::Child(index), Phase::Attach)?;
    let segment = attach::joined_segment(index, admission.processes, admission.segment)?;
    // A served benchmark's joiner is its producer; any other, a child of the sample.
    let bench =
        segment.state().options.load(std::sync::atomic::Ordering::Relaxed) & segment::OPTION_BENCH != 0;
    if bench_asked && !bench {
        bail!(
            "--join {address} --bench: the run served there is not the benchmark (leave --bench out to join it)"
        );
    }
    if bench {
        crate::bench::produce(index, watch, &segment, admission.descriptor_socket, server)
    } else {
        let start_cuda = || cuda.map_or_else(crate::driver::load, CudaStarting::driver);
        child::take_part(index, watch, &segment, admission.descriptor_socket, server, start_cuda)
    }
}

/// How the whole run ended, as the server tells each joiner once it is over; `Err` where it never says (it
/// is gone, or this process's watchdog ran out first) or a stop signal came.
fn hear_how_the_run_ended(
    address: &Address,
    connection: &OwnedFd,
    deadline: Option<(Instant, Duration)>,
) -> Result<RunEnd> {
    loop {
        signals::check()?;
        match wire::hear(connection, 10)? {
            Heard::Said(Message::RunEnded(end), _) => return Ok(end),
            Heard::Closed => bail!(
                "--join {address}: the server closed the connection without saying how the run ended (is it \
                 gone?)"
            ),
            Heard::Nothing => {
                if let Some((at, timeout)) = deadline
                    && Instant::now() >= at
                {
                    bail!(
                        "--join {address}: the server did not say how the run ended within {} s (--timeout of \
                         this joiner); is it stopped?",
                        timeout.as_secs_f64()
                    )
                }
            }
            _ => bail!("--join {address}: the server sent what it should not at the run's end"),
        }
    }
}
