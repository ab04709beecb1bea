//! Attaching to the parent's segment, and the stop check of every wait that follows: what every process the
//! parent starts begins with (a child of the sample, the benchmark's producer). It owns the checks that the
//! segment is the parent's and fits the process, and the three reasons to stop waiting.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, bail, ensure};
use nix::unistd::getppid;

use crate::driver::{Driver, uuid_text};
use crate::ipc::diagnose::Diagnosis;
use crate::meeting;
use crate::os::signals;
use crate::outcome::Waiver;
use crate::segment::barrier;
use crate::segment::{self, Segment, SharedState};

/// Why a process of the run stopped before its part was done, where that was no failure of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The parent waived the run once this process had started (no device, the mechanism missing here): it
    /// has nothing to say (the parent says why).
    Waived,
    /// The parent ended the run before it wrote the plan (it failed, or was stopped, choosing the devices):
    /// it has nothing to say (the parent says why).
    BeforeThePlan,
    /// The run was aborted while this process took part: another process failed, or the parent was
    /// interrupted (or its output's reader went away: then this process ends as quietly as the parent).
    Aborted,
}

impl Stopped {
    /// How `e` says a process stopped, if it does.
    pub fn of(e: &anyhow::Error) -> Option<Stopped> {
        e.chain().find_map(|cause| cause.downcast_ref::<Stopped>()).copied()
    }
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stopped::Waived => "stopped: the parent waived the run (it says why)",
            Stopped::BeforeThePlan => {
                "stopped: the parent ended the run before it chose the devices (it says why)"
            }
            Stopped::Aborted => {
                "stopped: the run was aborted (another process failed or the parent was interrupted)"
            }
        })
    }
}

impl std::error::Error for Stopped {}

/// The process whose run this is, and how to tell that it is gone.
pub enum Parent<'a> {
    /// The parent that started this process (its pid): gone when `getppid()` changes.
    Pid(i32),
    /// The server this process joined (`--join`): gone when the connection closes. A server that is stopped
    /// or frozen keeps its connection open, so a joiner keeps a watchdog of its own: past `deadline`
    /// (`--timeout` of the joiner), it stops.
    Server { connection: &'a OwnedFd, deadline: Option<(std::time::Instant, std::time::Duration)> },
}

/// Maps the segment a joiner was handed (`--join`), after checking it, and says its name as a child does.
pub fn joined_segment(index: usize, processes: usize, fd: OwnedFd) -> Result<Segment> {
    let segment = Segment::open(fd).context("Failed to create shared memory slab")?;
    let state = segment.state();
    print_line!("CP: lshmName = {}", segment::name_for(state.parent_pid.load(Ordering::Relaxed)))?;
    let n = state.process_count();
    ensure!(index < n, "this is process {index}, but the segment has {n} processes");
    ensure!(n == processes, "the server said the run has {processes} processes, its segment says {n}");
    Ok(segment)
}

/// The CUDA driver, for process `index`, as `loaded` (read once the plan is there): where this process sees
/// no GPU at all (a container given none, `CUDA_VISIBLE_DEVICES=`), the failure says which GPU the run
/// gives it and what gives it that GPU.
pub fn driver(state: &SharedState, index: usize, loaded: Result<Box<dyn Driver>>) -> Result<Box<dyn Driver>> {
    loaded.map_err(|e| match (e.downcast_ref::<Waiver>(), state.device_uuid_of(index)) {
        (Some(none), Some(uuid)) => lacks_gpu(index, &uuid_text(&uuid), &none.to_string()).into(),
        _ => not_waived(e.context("starting CUDA")),
    })
}

/// `e`, where it would waive a process that its parent's run needs (no GPU here, when the parent found one),
/// as a failure that says the same.
pub fn not_waived(e: anyhow::Error) -> anyhow::Error {
    match e.chain().any(|cause| cause.is::<Waiver>()) {
        true => anyhow::anyhow!("{e:#}"),
        false => e,
    }
}

/// A process that does not see the GPU the run gives it: the cause, with what it sees and the variables
/// that choose it, and the fix in the words of Docker and Kubernetes.
fn lacks_gpu(index: usize, uuid: &str, sees: &str) -> Diagnosis {
    let variable = |name: &str| match std::env::var(name) {
        Ok(value) => format!("{name}={value:?}"),
        Err(_) => format!("{name} unset"),
    };
    Diagnosis::new(
        format!(
            "process {index} is given the GPU {uuid}, which this process does not see ({sees}; {}, {})",
            variable("CUDA_VISIBLE_DEVICES"),
            variable("NVIDIA_VISIBLE_DEVICES")
        ),
        "; what fixes it: ",
        format!(
            "give this container that GPU: Docker --gpus device={uuid} (or NVIDIA_VISIBLE_DEVICES={uuid}), and a \
             CUDA_VISIBLE_DEVICES that does not hide it; Kubernetes: both pods need that GPU (two containers of one pod \
             too, each nvidia.com/gpu request being given its own): a ResourceClaim that both use (DRA), or the device \
             plugin's time-slicing or MPS sharing, which gives one GPU for certain only where the node has one"
        ),
    )
}

/// The device process `index` is given: the one whose UUID the segment names (a process that joined from
/// another container may number the GPUs otherwise), or the parent's ordinal where it names none.
pub fn device(driver: &dyn Driver, state: &SharedState, index: usize) -> Result<i32> {
    let count = driver.device_count()?;
    let Some(uuid) = state.device_uuid_of(index) else {
        let device = state.device_of(index);
        ensure!(
            device < count,
            "the segment gives process {index} device {device}, but there are {count} devices"
        );
        return Ok(device);
    };
    let mut seen = Vec::new();
    for device in 0..count {
        let here = driver.device_info(device)?.uuid;
        if here == uuid {
            return Ok(device);
        }
        seen.push(uuid_text(&here));
    }
    let sees =
        if seen.is_empty() { "it sees none".to_owned() } else { format!("it sees {}", seen.join(", ")) };
    Err(lacks_gpu(index, &uuid_text(&uuid), &sees).into())
}

/// Maps the parent's segment (`simpleIPCshm<getppid()>`), inherited as descriptor `segment_fd`, after
/// checking it. Returns the segment and the parent's pid. The run's plan may not be in it yet (see
/// [`wait_for_the_plan`]).
/// (`index` is below `MAX_PROCESSES`: the internal command line's parser holds it there.)
pub fn segment(segment_fd: Option<i32>) -> Result<(Segment, i32)> {
    let parent_pid = getppid().as_raw();
    let segment = segment_fd
        .context("no segment descriptor: children are started by the parent, not by hand")
        .and_then(Segment::open_inherited)
        .context("Failed to create shared memory slab")?;
    let creator = segment.state().parent_pid.load(Ordering::Relaxed);
    ensure!(
        creator == parent_pid as u32,
        "the segment was made by process {creator}, not by our parent {parent_pid}"
    );
    Ok((segment, parent_pid))
}

/// Waits until the parent has written the run's plan (`describe_run`: how many processes, who runs where,
/// the mechanism): the first device's children start before the devices are chosen. `Err(Stopped::Waived)`
/// where the parent waived the run instead. Then checks that the plan has a place for process `index`.
pub fn wait_for_the_plan(state: &SharedState, index: usize, parent: &Parent) -> Result<()> {
    let stop = || still_running(state, parent);
    let planning = segment::RunState::Planning as u32;
    let before_the_plan =
        |e: anyhow::Error| match Stopped::of(&e) == Some(Stopped::Aborted) && state.process_count() == 0 {
            // An abort with no plan written is the parent's ending (a signal, or the parent gone, is said as
            // ever; an abort once the plan is there, a failure of another process, too).
            true => Stopped::BeforeThePlan.into(),
            false => e,
        };
    barrier::wait_until(&state.run_state, |s| s != planning, &stop).map_err(before_the_plan)?;
    stop().map_err(before_the_plan)?;
    state.validate_plan().context("Failed to create shared memory slab")?;
    let n = state.process_count();
    ensure!(index < n, "this is process {index}, but the segment has {n} processes");
    Ok(())
}

/// The stop check of every wait in a process attached to the parent's segment (a child, a joiner, the
/// benchmark's producer): a stop signal came, the run was aborted, or the parent (or server) is gone.
pub fn still_running(state: &SharedState, parent: &Parent) -> Result<()> {
    signals::check()?;
    if state.run_state() == segment::RunState::Waived {
        return Err(Stopped::Waived.into());
    }
    if state.run_state() == segment::RunState::Aborted {
        return Err(Stopped::Aborted.into());
    }
    match parent {
        Parent::Pid(pid) if getppid().as_raw() != *pid => bail!("stopped: the parent process {pid} is gone"),
        Parent::Server { connection, .. } if meeting::peer_is_gone(connection) => {
            bail!("stopped: the server of the run is gone (its socket closed)")
        }
        Parent::Server { deadline: Some((at, timeout)), .. } if std::time::Instant::now() >= *at => bail!(
            "stopped: the run did not finish within {} s (--timeout of this joiner); is the server stopped?",
            timeout.as_secs_f64()
        ),
        _ => Ok(()),
    }
}
