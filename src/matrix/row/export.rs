//! The row's exporter: one context, every column's handle exported once, the importer started across the
//! row's boundary, the offer sent, the answer read back into the row's document.

use std::cell::RefCell;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{SockFlag, accept4, getsockopt, sockopt::PeerCredentials};

use super::super::axes::{Boundary, COLUMNS, Column};
use super::{Answer, BYTES, Offer, Offered, OfferedEvent, cell_of, talk};
use crate::driver::{Capability, Driver};
use crate::ipc::{ExportedBuffer, ExportedEvent, Fds, Sync, pidfd};
use crate::isolation::launch::Launched;
use crate::matrix::Cell;
use crate::outcome::{Outcome, Waiver};
use crate::placement::{Place, Placement};
use crate::report::{Results, RoleEnd};
use crate::role::Run;
use crate::supervise::guardian::Guardian;

/// The device every row runs on: the handles cross between processes, not between devices.
const DEVICE: i32 = 0;

/// One column's exports, dropped (the event first) when the row has its answer.
struct Export<'d> {
    event: Option<ExportedEvent<'d>>,
    buffer: ExportedBuffer<'d>,
}

/// Runs the row of `run`'s isolation (already entered, where it includes this process): see the module.
pub(crate) fn export(run: &Run) -> Result<RoleEnd> {
    let Some(isolation) = &run.isolate else { bail!("a row of the container matrix is always isolated") };
    let started = Instant::now();
    let deadline = run.timeout.limit().map(|limit| started + limit);
    let driver = crate::driver::load()?;
    if driver.device_count()? < 1 {
        return Err(Waiver("No CUDA devices support IPC".into()).into());
    }
    driver.use_device(DEVICE).context("making device 0 current")?;
    let guardian = Guardian::start()?;
    let exports: Vec<Result<Export, Cell>> =
        COLUMNS.iter().map(|column| export_column(&*driver, column, &guardian)).collect();
    let (offer, fds) = offer_of(&exports)?;

    // The importer, across the boundary, at a socket only it is let through.
    let refused = RefCell::new(None);
    let mut launched = Launched::prepare(isolation, &guardian, &refused, run.socket_dir.as_deref())?;
    let address = launched.address();
    let (listener, made) = crate::joiners::bind_at(&address)?;
    launched.start(&address, 1, isolation, run.timeout, run.quiet, true)?;
    let mut look = || -> Result<()> {
        crate::os::signals::check()?;
        launched.ended_early().map_or(Ok(()), Err)
    };
    let connection = accept(&listener, deadline, &mut look);
    crate::joiners::remove_if_made(&address, made);
    let connection = connection?;
    talk::send(&connection, &offer, &fds)?;
    let (answer, _): (Answer, _) = talk::hear(&connection, deadline, &mut look)?;
    if answer.cells.len() != COLUMNS.len() {
        bail!("the row's importer answered {} cells, not {}", answer.cells.len(), COLUMNS.len());
    }
    drop(exports);

    let row = Boundary { title: String::new(), isolate: isolation.to_string() };
    let cells = super::super::table::document(&[row], &[answer.cells]);
    let driver_says = driver.supports(DEVICE, Capability::MpsEnabled).unwrap_or(false);
    let under = crate::placement::mps::Mps::here().under(driver_says).map(|u| format!(", {u}"));
    let summary = format!("a row of the container matrix ({isolation}){}", under.unwrap_or_default());
    let mut end = RoleEnd::with(Outcome::passed(summary), Results::Matrix(cells));
    end.findings.placement = Some(Placement::of(Place::here(), vec![(0, *answer.place)]));
    Ok(end)
}

/// A column's buffer of its mechanism (and its event, where its run orders by events), or its cell where
/// its run would not get as far as an import: waived where the device lacks the mechanism (the trial of
/// legacy and fabric, as a run makes it) or the kernel `pidfd_getfd`.
fn export_column<'d>(
    driver: &'d dyn Driver,
    column: &Column,
    guardian: &Guardian,
) -> Result<Export<'d>, Cell> {
    if column.fds == Fds::Pidfd && pidfd::unsupported().is_some() {
        return Err(Cell::Waived);
    }
    match column.mechanism.unsupported(driver, DEVICE) {
        Ok(Some(_)) => return Err(Cell::Waived),
        Ok(None) => {}
        Err(e) => return Err(cell_of(&e)),
    }
    // A column ordered by stream memory operations is that run's: waived where the device has none, as the
    // run would be, though the handle itself would cross.
    if column.sync == Sync::Memops {
        match driver.stream_memops_unsupported(DEVICE) {
            Ok(Some(_)) => return Err(Cell::Waived),
            Ok(None) => {}
            Err(e) => return Err(cell_of(&e)),
        }
    }
    let event = match column.sync {
        Sync::Events => Some(
            guardian
                .covering(|| ExportedEvent::create(driver, DEVICE), ExportedEvent::file)
                .map_err(|e| cell_of(&e))?,
        ),
        Sync::Memops => None,
    };
    let buffer =
        ExportedBuffer::allocate(driver, column.mechanism, DEVICE, BYTES).map_err(|e| cell_of(&e))?;
    Ok(Export { event, buffer })
}

/// The offer of `exports`, and the descriptors that go with it.
fn offer_of<'e>(exports: &'e [Result<Export, Cell>]) -> Result<(Offer, Vec<BorrowedFd<'e>>)> {
    let mut fds = Vec::new();
    let mut columns = Vec::new();
    for (column, export) in COLUMNS.iter().zip(exports) {
        let export = match export {
            Ok(export) => export,
            Err(cell) => {
                columns.push(Err(cell.clone()));
                continue;
            }
        };
        let descriptor = export.buffer.descriptor();
        let (mut sent, mut number) = (None, None);
        match (descriptor, column.fds) {
            (Some(fd), Fds::Socket) => {
                sent = Some(fds.len());
                fds.push(fd);
            }
            (Some(fd), Fds::Pidfd) => number = Some(fd.as_raw_fd()),
            (None, _) => {}
        }
        let event = export.event.as_ref().map(|event| {
            let file = event.file().map(|f| (f.name.clone(), f.dev, f.ino));
            OfferedEvent { handle: event.handle().to_vec(), file }
        });
        let handle = export.buffer.handle().to_vec();
        columns.push(Ok(Offered { handle, bytes: BYTES, descriptor: sent, number, event }));
    }
    Ok((Offer { pid: std::process::id(), columns }, fds))
}

/// The importer's connection: the first of this user (or root) that this process started (through the
/// process that entered its namespaces, and its init); anyone else is closed unheard.
fn accept(
    listener: &OwnedFd,
    deadline: Option<Instant>,
    look: &mut dyn FnMut() -> Result<()>,
) -> Result<OwnedFd> {
    let me = nix::unistd::getpid().as_raw();
    loop {
        look()?;
        if deadline.is_some_and(|at| Instant::now() >= at) {
            bail!("the row's importer did not connect within --timeout");
        }
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(50u16)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e).context("poll on the row's socket"),
        }
        let connection = match accept4(listener, SockFlag::SOCK_CLOEXEC) {
            Ok(connection) => connection,
            Err(Errno::EAGAIN | Errno::EINTR | Errno::ECONNABORTED) => continue,
            Err(e) => return Err(anyhow!(e).context("accepting the row's importer")),
        };
        let peer = getsockopt(&connection, PeerCredentials).context("the importer's credentials")?;
        if crate::joiners::stranger(peer.uid()).is_none() && crate::joiners::started_by(peer.pid(), &[me]) {
            return Ok(connection);
        }
    }
}
