//! The tool's child: the story's child (`sample::child`), with the seams answered for the options its
//! segment says (`--bind-numa`, `--fds pidfd`, `--sync memops`) and for the test faults (`lie`, `corrupt`).

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};

use super::memops::{self, Flags};
use crate::driver::Driver;
use crate::ipc::{Mechanism, OpenedBuffer, OpenedEvent, Sync, pidfd};
use crate::os::numa::{self, Sysfs};
use crate::phases::Who;
use crate::phases::fault;
use crate::phases::timings::Stopwatch;
use crate::sample::attach::Parent;
use crate::sample::child as story;
use crate::sample::extras::{ChildExtras, WriteOrder};
use crate::segment::{self, Segment, SharedState};

/// A child the parent started: its index, and the segment and descriptor socket it inherited.
pub fn run(index: usize, segment_fd: Option<i32>, socket_fd: Option<i32>) -> Result<()> {
    said_it_finished(story::child_process(index, segment_fd, socket_fd, &Options { index, server: None }))
}

/// Everything a child does once it has its segment, whoever handed it over (its parent, or the server it
/// joined: see `join`), with `socket` the one its buffers' descriptors come over (vmm and pool).
pub fn take_part(
    index: usize,
    watch: Stopwatch,
    segment: &Segment,
    socket: Option<OwnedFd>,
    parent: &Parent,
    start_cuda: impl FnOnce() -> Result<Box<dyn Driver>>,
) -> Result<()> {
    let server = match parent {
        Parent::Server { connection, .. } => Some(*connection),
        Parent::Pid(_) => None,
    };
    let options = Options { index, server };
    said_it_finished(story::take_part(index, watch, segment, socket, parent, start_cuda, &options))
}

/// A process the `lie` fault names ended here, having said in the segment that it finished.
#[derive(Debug)]
struct Lied;

impl std::fmt::Display for Lied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a test fault: this process said it finished without writing")
    }
}

impl std::error::Error for Lied {}

/// A process that lied ends well, as it said.
fn said_it_finished(ended: Result<()>) -> Result<()> {
    match ended {
        Err(e) if e.is::<Lied>() => Ok(()),
        ended => ended,
    }
}

/// The options of process `index`, read from its segment as each seam needs them.
struct Options<'a> {
    index: usize,
    /// The connection to the server this process joined (`--join`); `None`: its parent started it.
    server: Option<&'a OwnedFd>,
}

impl Options<'_> {
    /// The exporter's pid as this process sees it: its parent's (which made the segment: see
    /// `attach::segment`), or the server's as the connection's peer credentials say (the kernel gives 0 for a
    /// process outside this one's PID namespace), or in a served sequence the run below it that `published`
    /// its pid (see `pidfd::exporter_seen_from`).
    fn exporter_pid(&self, published: u32) -> Result<u32> {
        let Some(connection) = self.server else { return Ok(published) };
        let peer = nix::sys::socket::getsockopt(connection, nix::sys::socket::sockopt::PeerCredentials)
            .context("asking the socket for the server's pid (SO_PEERCRED)")?;
        pidfd::exporter_seen_from(peer.pid().max(0) as u32, published)
    }
}

/// Whether the segment's options have `bit`.
fn has(state: &SharedState, bit: u32) -> bool {
    state.options.load(Ordering::Relaxed) & bit != 0
}

impl ChildExtras for Options<'_> {
    fn place(&self, driver: &dyn Driver, device: i32, state: &SharedState) -> Result<()> {
        if !has(state, segment::OPTION_BIND_NUMA) {
            return Ok(());
        }
        let index = self.index;
        let bus = driver.device_info(device)?.pci_bus_id;
        match numa::bind_to_device_node(&Sysfs::default(), bus.as_deref())? {
            Some(place) => {
                print_line!("Process {index}: bound to the CPUs of device {device}'s NUMA {place}")
            }
            None => print_line!("Process {index}: device {device} has no known NUMA node; not bound"),
        }
    }

    fn fetched_descriptors(
        &self,
        has_socket: bool,
        state: &SharedState,
        mechanism: Mechanism,
    ) -> Result<Option<Vec<OwnedFd>>> {
        if has_socket || !has(state, segment::OPTION_FDS_PIDFD) || !mechanism.uses_descriptors() {
            return Ok(None);
        }
        // --fds pidfd: fetched from the exporter, by the numbers it published.
        let exporter = self.exporter_pid(state.parent_pid.load(Ordering::Relaxed))?;
        let fetched = (0..state.process_count()).map(|other| {
            let number = state.descriptor_numbers[other].load(Ordering::Relaxed);
            pidfd::fetch(exporter, number, other)
        });
        fetched.collect::<Result<_>>().map(Some)
    }

    fn bytes_after_data(&self, state: &SharedState) -> usize {
        // With --sync memops, each buffer has its flag after the data.
        if state.sync() == Sync::Memops { memops::FLAG_BYTES } else { 0 }
    }

    fn event<'d>(
        &self,
        state: &SharedState,
        open: &mut dyn FnMut() -> Result<OpenedEvent<'d>>,
    ) -> Result<Option<OpenedEvent<'d>>> {
        // --sync memops orders the round-robin without interprocess events: it opens none.
        if state.sync() == Sync::Memops { Ok(None) } else { open().map(Some) }
    }

    fn write_order<'a>(
        &self,
        state: &SharedState,
        buffers: &'a [OpenedBuffer],
    ) -> Result<Option<Box<dyn WriteOrder + 'a>>> {
        if state.sync() != Sync::Memops {
            return Ok(None);
        }
        Ok(Some(Box::new(Flags::of(buffers, state.data_size())?)))
    }

    fn before_writing(&self, watch: &mut Stopwatch, state: &SharedState) -> Result<()> {
        if !fault::lies(Who::Child(self.index)) {
            return Ok(());
        }
        // A test of the parent's own check: a process that did nothing writes into the segment that it
        // finished, and says it ended well.
        watch.finish().publish(state, self.index);
        state.finished.fetch_add(1, Ordering::AcqRel);
        Err(Lied.into())
    }

    fn before_comparing(&self, data: &mut [u8], expected: u8) {
        fault::corrupt_if_asked(Who::Child(self.index), data, 0, data.len(), expected);
    }

    fn leave_cuda(&self, cuda: Box<dyn Driver>) {
        match self.server {
            // A joiner's exit waits for the server, which checks every buffer itself meanwhile: its context
            // is released while it does.
            Some(_) => drop(cuda),
            None => cuda.end_with_the_process(),
        }
    }
}
