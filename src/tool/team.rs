//! The processes that come instead of the sample's children (step 4's seam, `ParentExtras::others`): those
//! that join the parent (`--serve`), or those it starts in namespaces of their own (`--isolate`), which join
//! it; waited for and stopped as the children are (`sample::children::Processes`).

use std::os::fd::OwnedFd;
use std::time::Instant;

use anyhow::Result;

use crate::isolation::launch::Launched;
use crate::joiners::{Joiners, JoinersAtEnd};
use crate::role::Run;
use crate::sample::extras::Processes;
use crate::segment::{Segment, SharedState};
use crate::supervise::guardian::Guardian;
use crate::supervise::peers;

/// The run's other processes where they are not the sample's children: the processes that join it
/// (`--serve`), or the processes it starts in namespaces of their own, which join it (`--isolate`).
pub(super) enum Team<'s> {
    Joined(Joiners<'s>),
    /// Dropped in this order: the joiners' connections close, then the processes end.
    Isolated(Joiners<'s>, Launched<'s>),
}

impl<'s> Team<'s> {
    /// With `--isolate`, starts the processes that join; with `--serve`, listens for the processes that
    /// join (each gets its end of its descriptor socket from `their_sockets` when it joins, and is told how
    /// the run ended by `joiners_at_end`); else `None`: the children come.
    pub(super) fn start(
        run: &Run,
        segment: &'s Segment,
        n: usize,
        their_sockets: &mut Vec<OwnedFd>,
        started: Instant,
        joiners_at_end: &'s JoinersAtEnd,
        guardian: &'s Guardian,
    ) -> Result<Option<Self>> {
        let timeout = run.timeout;
        if let Some(isolation) = &run.isolate {
            let mut launched =
                Launched::prepare(isolation, guardian, &joiners_at_end.refused, run.socket_dir.as_deref())?;
            let address = launched.address();
            let sockets = std::mem::take(their_sockets);
            let joiners = Joiners::listen(segment, address.clone(), n, sockets, started, timeout)?
                .covered_by(guardian)
                .removing_the_socket_when_full()
                .handing_placement_to(joiners_at_end);
            launched.start(&address, n, isolation, run.timeout, run.quiet, false)?;
            // Its descendants: each started process hands its namespace's init over to this one.
            let joiners = joiners.only_started_by(vec![nix::unistd::getpid().as_raw()]);
            print_line!(
                "Isolated ({isolation}): {n} processes started in namespaces of their own join at {address}"
            )?;
            return Ok(Some(Team::Isolated(joiners, launched)));
        }
        let Some(address) = &run.serve else { return Ok(None) };
        let sockets = std::mem::take(their_sockets);
        let joiners = match joiners_at_end.is_in_sequence() {
            true => Joiners::in_sequence(segment, joiners_at_end, n, sockets, started, timeout)?,
            false => Joiners::listen(segment, address.clone(), n, sockets, started, timeout)?
                .covered_by(guardian)
                .handing_placement_and_connections_to(joiners_at_end),
        };
        let processes = if n == 1 { "process" } else { "processes" };
        print_line!(
            "Serving the run at {address}: waiting for {n} {processes} to join (--join {address}), {}",
            gpus_of(segment.state(), n)
        )?;
        Ok(Some(Team::Joined(joiners)))
    }
}

impl Processes for Team<'_> {
    fn wait(&mut self, enough: &dyn Fn() -> bool, tick: &mut dyn FnMut()) -> Result<()> {
        match self {
            Team::Joined(joiners) => peers::wait(joiners, enough, tick, || None),
            Team::Isolated(joiners, launched) => {
                peers::wait(joiners, enough, tick, || launched.ended_early())
            }
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        match self {
            Team::Joined(joiners) => peers::look_once(joiners, || None),
            Team::Isolated(joiners, launched) => peers::look_once(joiners, || launched.ended_early()),
        }
    }

    fn stop(&mut self) {
        match self {
            Team::Joined(joiners) | Team::Isolated(joiners, ..) => joiners.stop(),
        }
    }
}

/// The GPUs the processes run on, each with its UUID and how many processes it takes: `for GPU 0
/// (GPU-...) x2 and GPU 1 (GPU-...) x2` (a joiner must see the GPU it is given).
fn gpus_of(state: &SharedState, n: usize) -> String {
    let mut gpus: Vec<(i32, String, usize)> = Vec::new();
    for index in 0..n {
        let uuid =
            state.device_uuid_of(index).map_or_else(|| "?".to_owned(), |u| crate::driver::uuid_text(&u));
        match gpus.iter_mut().find(|(device, ..)| *device == state.device_of(index)) {
            Some((.., count)) => *count += 1,
            None => gpus.push((state.device_of(index), uuid, 1)),
        }
    }
    let each: Vec<String> =
        gpus.iter().map(|(device, uuid, count)| format!("GPU {device} ({uuid}) x{count}")).collect();
    format!("for {}", each.join(" and "))
}
