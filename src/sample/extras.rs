//! The seams: the named points where the tool's branches meet the story. The story calls each at its step
//! and goes on; the tool (`tool/`) answers for its options (`--serve`, `--isolate`, `--fds pidfd`,
//! `--sync memops`, `--bind-numa`, the test faults, MPS, `--timings`, `--json`). A default method is the
//! plain run's answer: nothing to add, or `None` where the story then does the original's. No step of the
//! story asks which option is on. [`Processes`] and [`WriteOrder`] are what the story and the tool both make.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Instant;

use anyhow::Result;

use crate::driver::Driver;
use crate::gpu::Stream;
use crate::ipc::{ExportedBuffer, ExportedEvent, Mechanism, OpenedBuffer, OpenedEvent, ProcessExports};
use crate::outcome::Waiver;
use crate::phases::timings::{Phases, Stopwatch};
use crate::report::Results;
use crate::segment::{Segment, SharedState};
use crate::supervise::guardian::Guardian;
use crate::wire::descriptors;

/// What the tool adds to the parent's story (`parent.rs`), step by step.
pub(crate) trait ParentExtras {
    /// Step 2, before any device is asked: why this host cannot run the tool's options (`--fds pidfd`: the
    /// kernel lacks `pidfd_getfd`).
    fn refusal(&self, _mechanism: Mechanism) -> Option<Waiver> {
        None
    }

    /// Step 2, each device: what it lacks for the tool's options, as (the option, the reason) (`--sync
    /// memops`: stream memory operations).
    fn lacks(&self, _driver: &dyn Driver, _device: i32) -> Result<Option<(String, String)>> {
        Ok(None)
    }

    /// After step 2, with the `n` processes placed on `chosen`: what the tool reads of the devices while CUDA
    /// is up (whether MPS runs them), and the check that its test fault can strike in this run.
    fn devices_chosen(&self, _driver: &dyn Driver, _chosen: &[i32], _n: usize) -> Result<()> {
        Ok(())
    }

    /// The segment's `OPTION_*` bits that tell the children the tool's options.
    fn options(&self) -> u32 {
        0
    }

    /// Step 3: how many processes get a descriptor socket for the vmm and pool buffers (`--fds pidfd`: none,
    /// each fetches them).
    fn descriptor_sockets(&self, n: usize) -> usize {
        n
    }

    /// Step 3, on each device's set-up thread.
    fn export(&self) -> &dyn ExportExtras;

    /// Step 4, known from the start: whether the children are this program's own (`false` where others
    /// come instead, below); the first device's are started before the devices are chosen.
    fn children_come(&self) -> bool {
        true
    }

    /// Step 4: the processes that come instead of the children (`--serve`: they join; `--isolate`: started
    /// in namespaces of their own, they join); `None`: the children.
    fn others<'s>(
        &'s self,
        _segment: &'s Segment,
        _guardian: &'s Guardian,
        _n: usize,
        _their_sockets: &mut Vec<OwnedFd>,
        _started: Instant,
    ) -> Result<Option<Box<dyn Processes + 's>>> {
        Ok(None)
    }

    /// Step 9, after the last event's work: the parent's own check of every buffer, where processes it did
    /// not start from its own program, or cannot see, took part (`--serve`, `--isolate`).
    fn check_every_buffer(
        &self,
        _watch: &mut Stopwatch,
        _driver: &dyn Driver,
        _exports: &[ProcessExports],
        _devices: &[i32],
        _state: &SharedState,
    ) -> Result<()> {
        Ok(())
    }

    /// After step 9: the results for the `--json` document (and `--timings`' table).
    fn results(&self, state: &SharedState, parent: &Phases) -> Result<Results>;

    /// The verdict's words for a run of `n` processes on `gpus` GPUs that passed.
    fn summary(&self, n: usize, gpus: usize) -> Result<String>;
}

/// What the tool adds to step 3 (`export.rs`), on each device's set-up thread.
pub(crate) trait ExportExtras: Sync {
    /// Bytes after each buffer's data (`--sync memops`: its flag).
    fn bytes_after_data(&self) -> usize {
        0
    }

    /// A process's interprocess event, as `make` makes it (the original's), or none (`--sync memops` orders
    /// the round-robin without events).
    fn event<'d>(
        &self,
        make: &mut dyn FnMut() -> Result<ExportedEvent<'d>>,
    ) -> Result<Option<ExportedEvent<'d>>> {
        make().map(Some)
    }

    /// Prepares one device's new buffers of `data` bytes before any child may use them (`--sync memops`:
    /// each flag zeroed; a parent that checks every buffer: each filled with a byte no process writes).
    fn prepare(
        &self,
        _driver: &dyn Driver,
        _device: i32,
        _buffers: &[&ExportedBuffer],
        _data: usize,
    ) -> Result<()> {
        Ok(())
    }

    /// Sends one child every buffer's descriptor (vmm and pool); a test fault sends them wrong.
    fn send_descriptors(&self, socket: &OwnedFd, mechanism: u32, all: &[BorrowedFd]) -> Result<()> {
        descriptors::send(socket, mechanism, all)
    }
}

/// What the tool adds to a child's story (`child.rs`), step by step. The segment says the options.
pub(crate) trait ChildExtras {
    /// Once on its device: where the process runs (`--bind-numa`: the CPUs of its device's NUMA node).
    fn place(&self, _driver: &dyn Driver, _device: i32, _state: &SharedState) -> Result<()> {
        Ok(())
    }

    /// Step 6: every buffer's descriptor (vmm and pool), in process order, where the process has no socket
    /// to receive them over (`--fds pidfd`: fetched from the exporter); `None`: over the socket.
    fn fetched_descriptors(
        &self,
        _has_socket: bool,
        _state: &SharedState,
        _mechanism: Mechanism,
    ) -> Result<Option<Vec<OwnedFd>>> {
        Ok(None)
    }

    /// Step 6: bytes after each buffer's data (`--sync memops`: its flag).
    fn bytes_after_data(&self, _state: &SharedState) -> usize {
        0
    }

    /// Step 6: a process's event, as `open` opens it (the original's), or none (`--sync memops`).
    fn event<'d>(
        &self,
        _state: &SharedState,
        open: &mut dyn FnMut() -> Result<OpenedEvent<'d>>,
    ) -> Result<Option<OpenedEvent<'d>>> {
        open().map(Some)
    }

    /// Step 7: how the writes of each buffer are ordered where not by the events (`--sync memops`: flags).
    fn write_order<'a>(
        &self,
        _state: &SharedState,
        _buffers: &'a [OpenedBuffer],
    ) -> Result<Option<Box<dyn WriteOrder + 'a>>> {
        Ok(None)
    }

    /// Step 7, before the first write: a test fault may end the process here, saying that it finished.
    fn before_writing(&self, _watch: &mut Stopwatch, _state: &SharedState) -> Result<()> {
        Ok(())
    }

    /// Step 8, before the comparison: a test fault may change the copy of the buffer.
    fn before_comparing(&self, _data: &mut [u8], _expected: u8) {}

    /// Step 9, once it said it finished: CUDA is left to the process's exit, which follows, as the original's
    /// child leaves it (a joiner, whose exit waits for the server's word, releases it now instead).
    fn leave_cuda(&self, cuda: Box<dyn Driver>) {
        cuda.end_with_the_process();
    }
}

/// The run's other processes, however they came: the children (`spawnProcess`), or the processes that the
/// tool lets in instead (`ParentExtras::others`).
pub(crate) trait Processes {
    /// `waitProcess` for each: returns once each has ended well, or `enough()`, calling `tick` as it
    /// watches; the first failure stops the others (see `peers::wait`).
    fn wait(&mut self, enough: &dyn Fn() -> bool, tick: &mut dyn FnMut()) -> Result<()>;
    /// While the parent works (its exports), one look of `wait`: admits whoever is at the door (joiners); the
    /// first that failed, a stop signal or the watchdog's deadline stops them all, and is the error.
    fn check_alive(&mut self) -> Result<()>;
    /// Stops them all: the run was waived after they started.
    fn stop(&mut self);
}

/// How a writer of a buffer waits for the one before it and tells the one after it: the original's
/// interprocess events (`Events`, in `child`), or the tool's (`--sync memops`).
pub(crate) trait WriteOrder {
    /// Work on `stream` from now on waits until buffer `target` has been written `step` times.
    fn wait_for_writes(&self, stream: &Stream, target: usize, step: usize) -> Result<()>;
    /// Tells the next writer of buffer `target` that the write of `step` is done, once the stream's work is.
    fn after_writing(&self, stream: &Stream, target: usize, step: usize) -> Result<()>;
}
