//! What a parent tells its guardian (see `guardian`), typed: [`Note`], its encoding and decoding, and the two
//! socket calls that carry it. Its notes carry no descriptors and no text to print, and are never answered:
//! the parent sends each without blocking ([`tell`]), and the guardian's reader never fails ([`notes`]): it
//! reads until end of file, and what is not a note is skipped.
//!
//! A note is a kind byte, then the fixed records `driver_files` defines or a [`MadePath`] (device, inode,
//! change time, 8 bytes each, little-endian; a byte 1 for a directory; the path's bytes), or a path's bytes
//! alone (a directory being made, or not made after all): the same bytes as
//! before it was typed, so that a hand-made parent (`tests/guardian.rs`) still speaks it.

use std::os::fd::{AsFd, AsRawFd};

use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, recv, send};

use crate::os::driver_files::{EventFile, RECORD_BYTES};
use crate::os::made_path::MadePath;

/// The most records a `Making` note lists; with more, the guardian removes nothing it was not told of.
const MAX_LISTED: usize = 256;
/// The longest path a [`MadePath`] note carries (Linux's `PATH_MAX`); a longer one is not sent.
const PATH_MAX: usize = 4096;
/// Bytes of a [`MadePath`] before its path.
const PATH_HEAD: usize = 33;
/// The longest note: a kind byte and a `Making` list of [`MAX_LISTED`] records (a path's is shorter).
const MAX_NOTE: usize = 1 + MAX_LISTED * RECORD_BYTES;
const _: () = assert!(PATH_HEAD + PATH_MAX < MAX_LISTED * RECORD_BYTES);

/// What a parent tells its guardian.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Note {
    /// Remove this file at the end, if it is still that file (`F`, a record).
    File(EventFile),
    /// An event file is about to be made (`M`): the names of the driver's shape with the parent's pid number
    /// that exist now (records), so that what it makes next is not among them; `None` (`!`): too many to
    /// list, or not known, and the guardian guesses nothing. A record that names no file is left out.
    Making(Option<Vec<EventFile>>),
    /// The event file announced by `Making` is this one (`D`, a record; an empty record: none was made).
    Made(Option<EventFile>),
    /// Remove this path at the end, if it is still what was made (`P`).
    Path(MadePath),
    /// The parent removed this path itself (`G`): the guardian forgets it.
    Forget(MadePath),
    /// A directory is about to be made at this path (`N`, the path's bytes): should the parent die before it
    /// says `Path` of it, the guardian removes it if it is an empty directory of its own user.
    MakingDir(std::path::PathBuf),
    /// The directory announced by `MakingDir` was not made (`X`, the path's bytes): the name was taken.
    NotMadeDir(std::path::PathBuf),
}

impl Note {
    /// The note's bytes; `None` for a path longer than [`PATH_MAX`] (it is not sent). A `Making` list of more
    /// than [`MAX_LISTED`] says "not known".
    pub(crate) fn encode(&self) -> Option<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        // (A path of a `MakingDir` note is checked as a `Path`'s: absolute, at most PATH_MAX bytes.)
        Some(match self {
            Self::File(file) => [&[b'F'][..], &file.to_record()].concat(),
            Self::Making(Some(listed)) if listed.len() <= MAX_LISTED => {
                std::iter::once(b'M').chain(listed.iter().flat_map(EventFile::to_record)).collect()
            }
            Self::Making(_) => b"M!".to_vec(),
            Self::Made(file) => {
                [&[b'D'][..], &file.as_ref().map_or([0; RECORD_BYTES], EventFile::to_record)].concat()
            }
            Self::MakingDir(path) | Self::NotMadeDir(path) => {
                let path = path.as_os_str().as_bytes();
                if path.len() > PATH_MAX {
                    return None;
                }
                let kind = if matches!(self, Self::MakingDir(_)) { b'N' } else { b'X' };
                [&[kind][..], path].concat()
            }
            Self::Path(made) | Self::Forget(made) => {
                let path = made.path.as_os_str().as_bytes();
                if path.len() > PATH_MAX {
                    return None;
                }
                let kind = if matches!(self, Self::Path(_)) { b'P' } else { b'G' };
                let (dev, ino) = (made.dev.to_le_bytes(), made.ino.to_le_bytes());
                let ctime = [made.ctime.0.to_le_bytes(), made.ctime.1.to_le_bytes()].concat();
                [&[kind][..], &dev, &ino, &ctime, &[u8::from(made.dir)], path].concat()
            }
        })
    }

    /// The note `bytes` are; `None` where they are none (an unknown kind, a record of the wrong length, a
    /// list over [`MAX_LISTED`], a path that is empty, relative or over [`PATH_MAX`]). Never panics.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let (&kind, body) = bytes.split_first()?;
        let record = |chunk: &[u8]| EventFile::from_record(chunk.try_into().ok()?);
        match kind {
            b'F' => (body.len() == RECORD_BYTES).then(|| record(body)).flatten().map(Self::File),
            b'M' if body == b"!" => Some(Self::Making(None)),
            b'M' => (body.len() % RECORD_BYTES == 0 && body.len() <= MAX_LISTED * RECORD_BYTES)
                .then(|| Self::Making(Some(body.chunks_exact(RECORD_BYTES).filter_map(record).collect()))),
            b'D' => (body.len() == RECORD_BYTES).then(|| Self::Made(record(body))),
            b'N' | b'X' => {
                use std::os::unix::ffi::OsStrExt;
                let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(body));
                let is: fn(std::path::PathBuf) -> Self =
                    if kind == b'N' { Self::MakingDir } else { Self::NotMadeDir };
                (body.len() <= PATH_MAX && path.is_absolute()).then(|| is(path))
            }
            b'P' | b'G' => {
                use std::os::unix::ffi::OsStrExt;
                let word = |at: usize| -> Option<[u8; 8]> { body.get(at..at + 8)?.try_into().ok() };
                let path = body.get(PATH_HEAD..).filter(|p| !p.is_empty() && p.len() <= PATH_MAX)?;
                let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(path));
                let dir = *body.get(PATH_HEAD - 1)?;
                let (dev, ino) = (u64::from_le_bytes(word(0)?), u64::from_le_bytes(word(8)?));
                let ctime = (i64::from_le_bytes(word(16)?), i64::from_le_bytes(word(24)?));
                let is: fn(MadePath) -> Self = if kind == b'P' { Self::Path } else { Self::Forget };
                (dir <= 1 && path.is_absolute())
                    .then(|| is(MadePath { dev, ino, dir: dir == 1, ctime, path }))
            }
            _ => None,
        }
    }
}

/// Sends `note` over `socket` without blocking and without SIGPIPE (a note that cannot be said is not
/// sent); the error says why the guardian could not be told (`EAGAIN`: it is not reading).
pub(crate) fn tell(socket: &impl AsFd, note: &Note) -> Result<(), Errno> {
    let Some(bytes) = note.encode() else { return Ok(()) };
    loop {
        match send(socket.as_fd().as_raw_fd(), &bytes, MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT) {
            Err(Errno::EINTR) => continue,
            sent => return sent.map(drop),
        }
    }
}

/// The notes that come over `socket`, until end of file or an error; what is not a note (a message cut
/// short by the buffer included: it is one byte longer than the longest note) is skipped.
pub(crate) fn notes(socket: &impl AsFd) -> impl Iterator<Item = Note> + '_ {
    let mut buffer = vec![0u8; MAX_NOTE + 1];
    std::iter::from_fn(move || {
        loop {
            match recv(socket.as_fd().as_raw_fd(), &mut buffer, MsgFlags::empty()) {
                Err(Errno::EINTR) => {}
                Ok(0) | Err(_) => return None,
                Ok(n) => {
                    if let Some(note) = buffer.get(..n).and_then(Note::decode) {
                        return Some(note);
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests;
