//! Step 3, export (the original's allocate-and-export loop: `cudaMalloc` and `cudaIpcGetMemHandle`,
//! `cudaEventCreate(cudaEventInterprocess)` and `cudaIpcGetEventHandle`, for every process): each chosen
//! device's context, every process's buffer and event exported into the segment, in parallel per device, and
//! (vmm and pool) the descriptors sent to each child. The tool's additions come through [`ExportExtras`].

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

use super::extras::ExportExtras;
use crate::devices;
use crate::driver::Driver;
use crate::ipc::{ExportedBuffer, ExportedEvent, Mechanism, ProcessExports};
use crate::outcome::Waiver;
use crate::phases::Phase;
use crate::phases::timings::Stopwatch;
use crate::segment::SharedState;
use crate::supervise::guardian::Guardian;
use crate::wire::descriptors;

/// The exports of some processes, with their indices.
type Indexed<'d> = Vec<(usize, ProcessExports<'d>)>;

/// For vmm and pool, one socket pair per child: the parent's ends, and the ends the children inherit.
pub(super) fn descriptor_sockets(mechanism: Mechanism, n: usize) -> Result<(Vec<OwnedFd>, Vec<OwnedFd>)> {
    if !mechanism.uses_descriptors() {
        return Ok((Vec::new(), Vec::new()));
    }
    (0..n).map(|_| descriptors::pair()).collect::<Result<Vec<_>>>().map(|pairs| pairs.into_iter().unzip())
}

/// What the parent needs to export every process's buffer and event.
pub(super) struct Exporter<'a, 'd> {
    pub(super) driver: &'d dyn Driver,
    pub(super) state: &'a SharedState,
    pub(super) chosen: &'a [i32],
    pub(super) process_devices: &'a [i32],
    pub(super) mechanism: Mechanism,
    /// What the tool adds to each buffer and event.
    pub(super) extras: &'a dyn ExportExtras,
    /// The parent's end of each child's descriptor socket (vmm and pool only).
    pub(super) sockets: Vec<OwnedFd>,
    /// Told of each event's file as soon as it exists.
    pub(super) guardian: &'a Guardian,
}

impl<'d> Exporter<'_, 'd> {
    /// Makes each chosen device's context current, allocates and exports every process's buffer and event
    /// into the segment (and, for vmm and pool, sends every child the descriptors), then lets the children go
    /// on. Several devices are set up in parallel, one thread each, while this thread calls `meanwhile` every
    /// millisecond (the processes already started are watched, joiners admitted). `next` is the phase the
    /// parent enters when the handles are published.
    pub(super) fn export_all(
        self,
        watch: &mut Stopwatch,
        next: Phase,
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Vec<ProcessExports<'d>>> {
        let this = &self;
        type PerDevice<'d> = Vec<Result<(Duration, Indexed<'d>)>>;
        let per_device = std::thread::scope(|scope| -> Result<PerDevice<'d>> {
            let mut workers = Vec::with_capacity(this.chosen.len());
            for &device in this.chosen {
                let worker = std::thread::Builder::new()
                    .spawn_scoped(scope, move || this.export_device(device))
                    .with_context(|| format!("starting the set-up thread of device {device}"));
                workers.push(worker);
            }
            // The workers that failed to start are joined below; a failure meanwhile waits for the others
            // (the scope joins them) and is the export's.
            while workers.iter().any(|w| w.as_ref().is_ok_and(|w| !w.is_finished())) {
                meanwhile()?;
                std::thread::sleep(Duration::from_millis(1));
            }
            let joined = workers.into_iter().map(|worker| {
                worker?.join().unwrap_or_else(|_| Err(anyhow!("a device set-up thread failed")))
            });
            Ok(joined.collect())
        })?;
        let mut exports: Indexed<'d> = Vec::with_capacity(self.process_devices.len());
        let mut slowest_context = Duration::ZERO;
        for result in per_device {
            let (context, exported) = result?;
            slowest_context = slowest_context.max(context);
            exports.extend(exported);
        }
        exports.sort_by_key(|(index, _)| *index);
        for (index, export) in &exports {
            self.state.mem_handles[*index].store(export.buffer.handle());
            if let Some(descriptor) = export.buffer.descriptor() {
                self.state.descriptor_numbers[*index].store(descriptor.as_raw_fd(), Ordering::Relaxed);
            }
            if let Some(event) = &export.event {
                self.state.publish_event(*index, event.handle(), event.file());
            }
        }
        let exports: Vec<ProcessExports<'d>> = exports.into_iter().map(|(_, e)| e).collect();
        self.send_descriptors(&exports, meanwhile)?;
        self.state.publish_ready();
        // Not needed for IPC, but it sets the peers up, as the original does; the children go on meanwhile.
        devices::enable_peers(self.driver, self.chosen)?;
        watch.enter_with_part(next, Some((Phase::Context, slowest_context)))?;
        Ok(exports)
    }

    /// One device's share of [`Exporter::export_all`]: its context (timed), then the buffer and event of each
    /// of its processes.
    fn export_device(&self, device: i32) -> Result<(Duration, Indexed<'d>)> {
        let driver = self.driver;
        let start = Instant::now();
        driver.use_device(device).with_context(|| format!("making device {device} current"))?;
        let context = start.elapsed();
        // A mechanism with a trial (legacy: a small export) is asked now that the device has a context.
        if let Some(probe) = self.mechanism.spec().probe
            && let Some(reason) = probe(driver, device)?
        {
            return Err(Waiver(reason).into());
        }
        let data = self.state.data_size();
        let bytes = data + self.extras.bytes_after_data();
        let mut exported = Vec::new();
        for (index, _) in self.process_devices.iter().enumerate().filter(|(_, d)| **d == device) {
            // cudaEventCreate(cudaEventDisableTiming | cudaEventInterprocess), its file told to the guardian.
            let event = self.extras.event(&mut || {
                self.guardian.covering(|| ExportedEvent::create(driver, device), ExportedEvent::file)
            })?;
            // cudaMalloc(DATA_SIZE), exportable as the mechanism asks.
            let buffer = ExportedBuffer::allocate(driver, self.mechanism, device, bytes)
                .with_context(|| format!("the {} buffer of process {index}", self.mechanism.name()))?;
            exported.push((index, ProcessExports { event, buffer }));
        }
        let buffers: Vec<&ExportedBuffer> = exported.iter().map(|(_, e)| &e.buffer).collect();
        self.extras.prepare(driver, device, &buffers, data)?;
        Ok((context, exported))
    }

    /// vmm and pool: sends each child one message with every buffer's descriptor, in process order. A
    /// socket found closed means its process has ended: its ending, as the watch (`meanwhile`) names it, is
    /// the run's error, not the broken socket.
    fn send_descriptors(
        &self,
        exports: &[ProcessExports],
        meanwhile: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        if self.sockets.is_empty() {
            return Ok(());
        }
        let all: Vec<BorrowedFd> = exports.iter().filter_map(|e| e.buffer.descriptor()).collect();
        for (child, socket) in self.sockets.iter().enumerate() {
            let sent = self.extras.send_descriptors(socket, self.mechanism.code(), &all);
            if let Err(e) = sent {
                if other_end_closed(&e) {
                    watch_for(PEER_GONE_GRACE, meanwhile)?;
                }
                return Err(e.context(format!("sending process {child} its descriptors")));
            }
        }
        Ok(())
    }
}

/// How long a send that found its socket closed watches the processes to learn why: the process at the
/// other end has ended or is ending, and the watch sees that within milliseconds (its exit closed the socket
/// a moment before it can be reaped, or before its connection's end is read).
const PEER_GONE_GRACE: Duration = Duration::from_millis(500);

/// Whether a send failed because the other end of its socket is closed.
fn other_end_closed(error: &anyhow::Error) -> bool {
    use nix::errno::Errno;
    error.chain().any(|cause| matches!(cause.downcast_ref::<Errno>(), Some(Errno::EPIPE | Errno::ECONNRESET)))
}

/// Calls `meanwhile` every millisecond for `grace`: its error (a process that failed) ends it early.
fn watch_for(grace: Duration, meanwhile: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        meanwhile()?;
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_to_a_closed_socket_is_told_from_other_failures() {
        let (ours, theirs) = descriptors::pair().unwrap();
        descriptors::send(&ours, 1, &[]).unwrap();
        drop(theirs);
        let broken = descriptors::send(&ours, 1, &[]).unwrap_err();
        assert!(other_end_closed(&broken), "{broken:#}");
        assert!(!other_end_closed(&anyhow!("the buffer of process 1")));
        assert!(!other_end_closed(&anyhow::Error::new(nix::errno::Errno::EBADF).context("sending")));
    }

    #[test]
    fn the_watch_after_a_broken_send_ends_with_the_first_failure_it_sees() {
        let mut looks = 0;
        let started = Instant::now();
        let why = watch_for(Duration::from_secs(5), &mut || {
            looks += 1;
            if looks == 3 { Err(anyhow!("Process 1 failed!")) } else { Ok(()) }
        });
        assert_eq!(why.unwrap_err().to_string(), "Process 1 failed!");
        assert_eq!(looks, 3);
        assert!(started.elapsed() < Duration::from_secs(5));
        let mut quiet_looks = 0;
        watch_for(Duration::from_millis(20), &mut || {
            quiet_looks += 1;
            Ok(())
        })
        .unwrap();
        assert!(quiet_looks >= 2, "{quiet_looks}");
    }
}
