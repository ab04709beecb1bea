//! Attaching to the parent's segment, and the stop check of every wait that follows: what every process the
//! parent starts begins with (a child of the sample, the benchmark's producer). It owns the checks that the
//! segment is the parent's and fits the process, and the three reasons to stop waiting.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result, bail, ensure};
use nix::unistd::getppid;

use crate::driver::{Driver, uuid_text};
use crate::meeting;
use crate::segment::{self, Segment, SharedState};
use crate::signals;

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
    say!("CP: lshmName = {}", segment::name_for(state.parent_pid.load(Ordering::Relaxed)))?;
    let n = state.process_count();
    ensure!(index < n, "this is process {index}, but the segment has {n} processes");
    ensure!(n == processes, "the server said the run has {processes} processes, its segment says {n}");
    Ok(segment)
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
    bail!(
        "process {index} is given the GPU {}, which this process does not see (it sees {}): give it that GPU \
         (docker run --gpus device=..., NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES)",
        uuid_text(&uuid),
        if seen.is_empty() { "none".to_owned() } else { seen.join(", ") }
    )
}

/// Maps the parent's segment (`simpleIPCshm<getppid()>`), inherited as descriptor `segment_fd`, after
/// checking it. Returns the segment and the parent's pid.
pub fn segment(index: usize, segment_fd: Option<i32>) -> Result<(Segment, i32)> {
    let parent_pid = getppid().as_raw();
    let name = segment::name_for(parent_pid as u32);
    say!("CP: lshmName = {name}")?;
    let segment = segment_fd
        .context("no segment descriptor: children are started by the parent, not by hand")
        .and_then(Segment::open_inherited)
        .context("Failed to create shared memory slab")?;
    let state = segment.state();
    let n = state.process_count();
    ensure!(index < n, "this is process {index}, but the segment has {n} processes");
    let creator = state.parent_pid.load(Ordering::Relaxed);
    ensure!(
        creator == parent_pid as u32,
        "the segment was made by process {creator}, not by our parent {parent_pid}"
    );
    Ok((segment, parent_pid))
}

/// The stop check of every wait in a process attached to the parent's segment (a child, a joiner, the
/// benchmark's producer): a stop signal came, the run was aborted, or the parent (or server) is gone.
pub fn still_running(state: &SharedState, parent: &Parent) -> Result<()> {
    signals::check()?;
    if state.run_state() == segment::RunState::Aborted {
        bail!("stopped: the run was aborted (another process failed or the parent was interrupted)");
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
