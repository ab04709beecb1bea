//! Attaching to the parent's segment, and the stop check of every wait that follows: what every process the
//! parent starts begins with (a child of the sample, the benchmark's producer). It owns the checks that the
//! segment is the parent's and fits the process, and the three reasons to stop waiting.

use std::sync::atomic::Ordering;

use anyhow::{Context, Result, bail, ensure};
use nix::unistd::getppid;

use crate::segment::{self, Segment, SharedState};
use crate::signals;

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

/// The stop check of every wait in a process attached to the parent's segment (a child, the benchmark's
/// producer): a stop signal came, the run was aborted, or the parent is gone.
pub fn still_running(state: &SharedState, parent_pid: i32) -> Result<()> {
    signals::check()?;
    if state.run_state() == segment::RunState::Aborted {
        bail!("stopped: the run was aborted (another process failed or the parent was interrupted)");
    }
    if getppid().as_raw() != parent_pid {
        bail!("stopped: the parent process {parent_pid} is gone");
    }
    Ok(())
}
