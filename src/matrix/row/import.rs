//! The row's importer, across the boundary from its exporter: it opens each column's handles with the calls
//! a child of that column's run makes (the same owners, the same diagnosis of a refusal), closes them, and
//! answers each column's cell with where it stands.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::errno::Errno;
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use super::super::axes::{COLUMNS, Column};
use super::{Answer, Offer, Offered, cell_of, handle_of, talk};
use crate::driver::Driver;
use crate::ipc::diagnose::Exporter;
use crate::ipc::{Fds, OpenedBuffer, OpenedEvent, pidfd};
use crate::matrix::Cell;
use crate::meeting::Address;
use crate::os::driver_files::EventFile;
use crate::outcome::Outcome;
use crate::report::RoleEnd;
use crate::role::Isolated;

/// The device the row runs on (the exporter's).
const DEVICE: i32 = 0;

/// Joins the row at its address (namespaces entered), opens what it offers, answers.
pub(crate) fn import(isolated: &Isolated) -> Result<RoleEnd> {
    let joiner = &isolated.joiner;
    let deadline = joiner.timeout.limit().map(|limit| Instant::now() + limit);
    let connection = connect(&joiner.address, deadline)?;
    let (offer, fds): (Offer, Vec<OwnedFd>) =
        talk::hear(&connection, deadline, &mut || crate::os::signals::check())?;
    // The exporter as this process sees it (0: outside this PID namespace), for `pidfd_getfd`.
    let peer =
        getsockopt(&connection, PeerCredentials).context("the exporter's credentials (SO_PEERCRED)")?;
    if let Some(why) = crate::joiners::stranger(peer.uid()) {
        bail!("the process at the row's socket is not the row's exporter: {why}");
    }
    let peer = u32::try_from(peer.pid()).unwrap_or(0);
    let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
    let cells = match crate::driver::load().and_then(|driver| driver.use_device(DEVICE).map(|()| driver)) {
        Ok(driver) => {
            let cells = COLUMNS
                .iter()
                .zip(&offer.columns)
                .map(|(column, offered)| match offered {
                    Ok(offered) => open(&*driver, column, offered, &offer, peer, &mut fds),
                    Err(cell) => cell.clone(),
                })
                .collect();
            driver.end_with_the_process();
            cells
        }
        // No CUDA here (another CUDA_VISIBLE_DEVICES, no device in this container): every column's run would
        // have ended so.
        Err(e) => vec![cell_of(&e); COLUMNS.len()],
    };
    let place = Box::new(crate::placement::Place::here());
    talk::send(&connection, &Answer { cells, place }, &[])?;
    Ok(Outcome::Passed(None).into())
}

/// A connection to the row's exporter at `address`, which listens there before it starts this process:
/// a socket that is not there (or refuses) means the exporter is gone.
fn connect(address: &Address, deadline: Option<Instant>) -> Result<OwnedFd> {
    loop {
        crate::os::signals::check()?;
        let connection = crate::meeting::seqpacket()?;
        match nix::sys::socket::connect(connection.as_raw_fd(), &address.unix()?) {
            Ok(()) => return Ok(connection),
            Err(Errno::EINTR | Errno::EAGAIN) if deadline.is_none_or(|at| Instant::now() < at) => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => {
                return Err(e).with_context(|| format!("connecting to the row's exporter at {address}"));
            }
        }
    }
}

/// Opens `column`'s handles as its run's child would (its descriptor from the offer, or fetched by
/// `pidfd_getfd`; its buffer; its event), closes them, and says how it went.
fn open(
    driver: &dyn Driver,
    column: &Column,
    offered: &Offered,
    offer: &Offer,
    peer: u32,
    fds: &mut [Option<OwnedFd>],
) -> Cell {
    let mut opened = || -> Result<()> {
        let file = offered.event.as_ref().and_then(|event| event.file.clone());
        let file = file.map(|(name, dev, ino)| EventFile { name, dev, ino });
        let exporter = Exporter { pid: Some(offer.pid), file };
        let descriptor = match (column.fds, offered.descriptor, offered.number) {
            (Fds::Pidfd, _, Some(number)) => {
                Some(pidfd::fetch(pidfd::exporter_seen_from(peer, offer.pid)?, number, 0)?)
            }
            (_, Some(index), _) => Some(
                fds.get_mut(index)
                    .and_then(Option::take)
                    .ok_or_else(|| anyhow!("no descriptor came for the {} column", column.title))?,
            ),
            _ => None,
        };
        let handle = handle_of(&offered.handle)?;
        let buffer = OpenedBuffer::open(
            driver,
            column.mechanism,
            &handle,
            descriptor,
            offered.bytes,
            DEVICE,
            &exporter,
        )
        .with_context(|| format!("opening the {} buffer", column.mechanism.name()))?;
        let event = match &offered.event {
            Some(event) => Some(
                OpenedEvent::open(driver, DEVICE, &handle_of(&event.handle)?, &exporter)
                    .context("opening the event")?,
            ),
            None => None,
        };
        drop(event);
        drop(buffer);
        Ok(())
    };
    opened().map_or_else(|e| cell_of(&e), |()| Cell::Ok)
}
