//! The socket file of a served run: bound where nothing is (or only a stale socket of this user), removed only
//! while it is still the one made.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::sys::socket::{Backlog, bind, listen};

use crate::meeting::{self, Address};

/// A non-blocking listening socket bound at `address`, and the file it made there (device, inode); a path
/// that exists is taken only where it is a socket nothing listens on (a server killed before it could
/// remove it).
pub(crate) fn bind_at(address: &Address) -> Result<(OwnedFd, Option<(u64, u64)>)> {
    if let Address::Path(path) = address
        && std::fs::symlink_metadata(path).is_ok()
    {
        if !is_stale_socket(address)? {
            bail!(
                "--serve {address}: the path exists and is no socket a run has left; another run may be \
                 serving there (remove it if none is)"
            );
        }
        std::fs::remove_file(path).with_context(|| format!("--serve {address}: removing a stale socket"))?;
        eprint_line!("simple-ipc: removed the stale socket {address} (nothing listened there)");
    }
    listen_at(address)
}

pub(super) fn listen_at(address: &Address) -> Result<(OwnedFd, Option<(u64, u64)>)> {
    let listener = meeting::seqpacket()?;
    bind(listener.as_raw_fd(), &address.unix()?).with_context(|| format!("--serve {address}: bind"))?;
    let made = match address {
        Address::Path(path) => std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino())),
        Address::Abstract(_) => None,
    };
    listen(&listener, Backlog::new(32).unwrap_or(Backlog::MAXCONN))
        .with_context(|| format!("--serve {address}: listen"))?;
    nix::fcntl::fcntl(&listener, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
        .context("making the run's socket non-blocking")?;
    Ok((listener, made))
}

/// Removes the socket's file at `address`, if it is still the one that `made` says was made there.
pub(crate) fn remove_if_made(address: &Address, made: Option<(u64, u64)>) {
    if let (Address::Path(path), Some((dev, ino))) = (address, made)
        && std::fs::symlink_metadata(path).is_ok_and(|m| m.dev() == dev && m.ino() == ino)
    {
        let _ = std::fs::remove_file(path);
    }
}

/// Whether the path is a socket that nothing listens on (a connection is refused), which this process may
/// remove: one of another user's is an error naming its owner (root too takes no other user's path).
pub(super) fn is_stale_socket(address: &Address) -> Result<bool> {
    let Address::Path(path) = address else { return Ok(false) };
    let Some(meta) = std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
    else {
        return Ok(false);
    };
    let probe = meeting::seqpacket()?;
    let stale =
        matches!(nix::sys::socket::connect(probe.as_raw_fd(), &address.unix()?), Err(Errno::ECONNREFUSED));
    let me = nix::unistd::geteuid().as_raw();
    if stale && meta.uid() != me {
        let owner = match nix::unistd::User::from_uid(meta.uid().into()) {
            Ok(Some(user)) => format!("uid {} ({})", meta.uid(), crate::output::printable(&user.name)),
            _ => format!("uid {}", meta.uid()),
        };
        bail!(
            "--serve {address}: the path is a socket nothing listens on, left by {owner}, not by this user \
             (uid {me}): it is not this run's to remove (its owner may remove it, or serve elsewhere)"
        );
    }
    Ok(stale)
}
