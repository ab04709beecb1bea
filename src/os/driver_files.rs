//! The files the CUDA driver makes in `/dev/shm` for a process's interprocess events,
//! `cuda.shm.<n>.<exporter pid, hex>.<m>` (driver 580), and how to tell whose one is.
//!
//! The pid in the name is the one the exporter has *in its own PID namespace*: two exporters that are both
//! pid 1 in two containers sharing `/dev/shm` make the same name, the second replacing the first's (seen on
//! the H200 host: one name, inodes 43 then 44). So a name says nothing of whose a file is. An [`EventFile`]
//! is the name with the identity (device and inode) of the file that this process maps, read from
//! `/proc/self/maps`: the exporter reads it right after the export, an importer right after the open, and
//! only a file with that identity is ever removed. The driver removes its files only when the exporter exits
//! normally; importers map them when they open the event, so once they all have, the names can go.

use std::path::PathBuf;

use anyhow::{Context, Result};
use nix::errno::Errno;

/// Where the driver makes its files.
pub const SHM_DIR: &str = "/dev/shm";

/// Whether `name` is shaped like one of the driver's event files: `cuda.shm.<a>.<b>.<c>`.
pub fn is_driver_file_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() == 5
        && parts[..2] == ["cuda", "shm"]
        && parts[2..].iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// One of the driver's event files, as a process maps it: its name in `/dev/shm` and the identity of the
/// file behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventFile {
    pub name: String,
    /// `st_dev` of the file: the tmpfs (the `/dev/shm`) it lives in.
    pub dev: u64,
    pub ino: u64,
}

/// What the name of an [`EventFile`] refers to now, in this process's `/dev/shm`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameNow {
    /// The same file.
    Same,
    /// No such name.
    Absent,
    /// The name is there, but it is another file (inode): another process made the same name since.
    Replaced { ino: u64 },
    /// This process's `/dev/shm` is another file system than the one the file lives in.
    OtherShm,
}

/// Bytes of an [`EventFile`] in the segment: device, inode, then the name, NUL-padded.
pub const RECORD_BYTES: usize = 64;
const NAME_BYTES: usize = RECORD_BYTES - 16;

impl EventFile {
    pub fn path(&self) -> PathBuf {
        PathBuf::from(SHM_DIR).join(&self.name)
    }

    /// The exporter's pid as its name gives it: the number the exporter has in its own PID namespace.
    pub fn pid_number(&self) -> Option<u32> {
        u32::from_str_radix(self.name.split('.').nth(3)?, 16).ok()
    }

    /// The record the segment carries; a name too long for it (never seen) leaves the record empty.
    pub fn to_record(&self) -> [u8; RECORD_BYTES] {
        let mut record = [0u8; RECORD_BYTES];
        if self.name.len() <= NAME_BYTES {
            record[..8].copy_from_slice(&self.dev.to_le_bytes());
            record[8..16].copy_from_slice(&self.ino.to_le_bytes());
            record[16..16 + self.name.len()].copy_from_slice(self.name.as_bytes());
        }
        record
    }

    /// The file a record names; `None` for an empty record (the exporter found no file) or a malformed one.
    pub fn from_record(record: &[u8; RECORD_BYTES]) -> Option<Self> {
        let word = |at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&record[at..at + 8]);
            u64::from_le_bytes(bytes)
        };
        let name = &record[16..];
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let name = std::str::from_utf8(&name[..len]).ok()?;
        is_driver_file_name(name).then(|| Self { name: name.to_owned(), dev: word(0), ino: word(8) })
    }

    /// What the name refers to now.
    pub fn name_now(&self) -> NameNow {
        if shm_dev().is_some_and(|dev| dev != self.dev) {
            return NameNow::OtherShm;
        }
        match std::fs::symlink_metadata(self.path()) {
            Ok(meta) => {
                use std::os::unix::fs::MetadataExt;
                if meta.dev() == self.dev && meta.ino() == self.ino {
                    NameNow::Same
                } else {
                    NameNow::Replaced { ino: meta.ino() }
                }
            }
            Err(_) => NameNow::Absent,
        }
    }

    /// Removes the name if it still refers to this very file; another process's file of the same name is
    /// left alone. Returns whether it removed it. (Between the look and the removal another process could
    /// replace the name; the window is two system calls, and no call removes a name by inode.)
    pub fn remove_if_ours(&self) -> Result<bool> {
        if self.name_now() != NameNow::Same {
            return Ok(false);
        }
        match nix::sys::mman::shm_unlink(self.name.as_str()) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e).with_context(|| format!("shm_unlink({})", self.name)),
        }
    }
}

/// `st_dev` of this process's `/dev/shm`, if it has one.
pub fn shm_dev() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(SHM_DIR).ok().map(|meta| meta.dev())
}

/// The names of the driver's shape in `/dev/shm` that carry pid number `pid`, with the files they are now;
/// `None` where `/dev/shm` could not be read (out of descriptors, say): not known is not "none".
pub fn named_by_pid(pid: u32) -> Option<Vec<EventFile>> {
    use std::os::unix::fs::MetadataExt;
    let entries = std::fs::read_dir(SHM_DIR).ok()?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.ok()?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        if !is_driver_file_name(&name) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue }; // gone meanwhile
        let file = EventFile { name, dev: meta.dev(), ino: meta.ino() };
        if file.pid_number() == Some(pid) {
            files.push(file);
        }
    }
    Some(files)
}

/// This process's `/proc/self/maps`, opened once so that it can be read again when no descriptor is left
/// to open it with (the driver may have used the last one for an event's file).
pub struct Maps(std::fs::File);

impl Maps {
    pub fn open() -> Result<Self> {
        std::fs::File::open("/proc/self/maps").map(Self).context("opening /proc/self/maps")
    }

    /// The driver's event files this process maps now.
    pub fn read(&mut self) -> Result<Vec<EventFile>> {
        use std::io::{Read, Seek};
        let mut maps = String::new();
        self.0.rewind().and_then(|_| self.0.read_to_string(&mut maps)).context("reading /proc/self/maps")?;
        let mut files: Vec<EventFile> = maps.lines().filter_map(parse_maps_line).collect();
        files.sort_by_key(|f| (f.dev, f.ino));
        files.dedup();
        Ok(files)
    }
}

/// The driver's event files this process maps now, from `/proc/self/maps`.
#[cfg(test)]
fn mapped() -> Result<Vec<EventFile>> {
    Maps::open()?.read()
}

/// The file that `after` maps and `before` did not, if there is exactly one.
pub fn appeared(before: &[EventFile], after: &[EventFile]) -> Option<EventFile> {
    only(after.iter().filter(|f| !before.contains(f)))
}

/// The file that holds the event that process `pid` (the number it has as it sees itself) just made, from
/// the driver files it mapped `before` and `after` making it: the one that appeared; where none did, the
/// one file of its own it already mapped, which the driver filled further (it keeps a process's events
/// in one file: the second event maps nothing new). Several files of its own, or several new ones: not
/// known.
pub fn holding_new_event(before: &[EventFile], after: &[EventFile], pid: u32) -> Option<EventFile> {
    let mut new = after.iter().filter(|f| !before.contains(f)).peekable();
    match new.peek() {
        Some(_) => only(new),
        None => only(after.iter().filter(|f| f.pid_number() == Some(pid))),
    }
}

/// The one item of `items`, if there is exactly one.
fn only<'f>(mut items: impl Iterator<Item = &'f EventFile>) -> Option<EventFile> {
    match (items.next(), items.next()) {
        (Some(file), None) => Some(file.clone()),
        _ => None,
    }
}

/// One line of `/proc/<pid>/maps`: `start-end perms offset major:minor inode path`, the path of a removed
/// file followed by ` (deleted)`.
fn parse_maps_line(line: &str) -> Option<EventFile> {
    let mut fields = line.splitn(6, ' ');
    let (_range, _perms, _offset) = (fields.next()?, fields.next()?, fields.next()?);
    let (major, minor) = fields.next()?.split_once(':')?;
    let ino: u64 = fields.next()?.parse().ok()?;
    let path = fields.next()?.trim_start();
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    let name = path.rsplit('/').next()?;
    if !is_driver_file_name(name) || !path.starts_with('/') {
        return None;
    }
    let dev =
        nix::sys::stat::makedev(u64::from_str_radix(major, 16).ok()?, u64::from_str_radix(minor, 16).ok()?);
    Some(EventFile { name: name.to_owned(), dev, ino })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn only_names_of_the_drivers_shape_match() {
        assert!(is_driver_file_name("cuda.shm.0.1a2b.1"));
        assert!(!is_driver_file_name("cuda.shm.0.1a2b"));
        assert!(!is_driver_file_name("cuda.shm.0.1a2b.x"));
        assert!(!is_driver_file_name("simpleIPCshm6699"));
        assert!(!is_driver_file_name("nccl.shm.0.1a2b.1"));
    }

    #[test]
    fn maps_lines_give_name_device_and_inode_even_once_removed() {
        let line = "7f12a000-7f12b000 rw-s 00000000 00:1a 43                         /dev/shm/cuda.shm.0.1.1";
        let file = parse_maps_line(line).unwrap();
        assert_eq!(
            file,
            EventFile { name: "cuda.shm.0.1.1".into(), dev: nix::sys::stat::makedev(0, 0x1a), ino: 43 }
        );
        let gone = parse_maps_line(&format!("{line} (deleted)")).unwrap();
        assert_eq!(gone, file);
        assert_eq!(parse_maps_line("7f12a000-7f12b000 r--p 00000000 fd:01 99 /usr/lib/libc.so.6"), None);
        assert_eq!(parse_maps_line("7f12a000-7f12b000 rw-p 00000000 00:00 0 "), None);
    }

    /// The longest name a record holds (48 bytes: the record's 64 less device and inode) goes whole; one
    /// byte more leaves the record empty, never cut or spilled.
    #[test]
    fn a_name_too_long_for_the_record_leaves_it_empty() {
        let named = |len: usize| {
            let head = "cuda.shm.0.2.";
            EventFile { name: format!("{head}{}", "a".repeat(len - head.len())), dev: 7, ino: 9 }
        };
        let longest = named(48);
        assert_eq!(EventFile::from_record(&longest.to_record()), Some(longest));
        assert_eq!(named(49).to_record(), [0u8; RECORD_BYTES], "too long: no file named");
        assert_eq!(EventFile::from_record(&named(49).to_record()), None);
    }

    #[test]
    fn a_record_carries_the_file_and_an_empty_one_none() {
        let file = EventFile { name: "cuda.shm.0.ff.12".into(), dev: 77, ino: u64::MAX - 3 };
        assert_eq!(file.pid_number(), Some(255));
        assert_eq!(EventFile::from_record(&file.to_record()), Some(file));
        assert_eq!(EventFile::from_record(&[0; RECORD_BYTES]), None);
    }

    /// Only the file with the identity is removed: a file of the same name made since (another process of the
    /// same pid number elsewhere) stays, and so does every other name.
    #[test]
    fn removes_its_own_file_and_never_another_of_the_same_name() {
        let name = format!("cuda.shm.0.{:x}.7e57", 0x7fff_fff0 - std::process::id());
        let path = PathBuf::from(SHM_DIR).join(&name);
        std::fs::write(&path, b"").unwrap();
        let _made = tempfile::TempPath::try_from_path(&path).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let mine = EventFile { name: name.clone(), dev: meta.dev(), ino: meta.ino() };
        assert_eq!(mine.name_now(), NameNow::Same);

        // Another process makes the same name: a new file replaces ours.
        let other = PathBuf::from(SHM_DIR).join(format!("{name}.tmp"));
        std::fs::write(&other, b"theirs").unwrap();
        std::fs::rename(&other, &path).unwrap();
        let theirs = std::fs::metadata(&path).unwrap().ino();
        assert_eq!(mine.name_now(), NameNow::Replaced { ino: theirs });
        assert!(!mine.remove_if_ours().unwrap(), "another process's file of the same name was removed");
        assert_eq!(std::fs::read(&path).unwrap(), b"theirs");

        let now_mine = EventFile { ino: theirs, ..mine.clone() };
        assert!(now_mine.remove_if_ours().unwrap());
        assert!(!path.exists());
        assert_eq!(mine.name_now(), NameNow::Absent);
        assert!(!now_mine.remove_if_ours().unwrap(), "nothing left to remove");
    }

    #[test]
    fn a_mapping_of_a_driver_file_shows_with_its_identity() {
        let name = format!("cuda.shm.0.{:x}.5a5a", 0x7fff_ff00 - std::process::id());
        let path = PathBuf::from(SHM_DIR).join(&name);
        let before = mapped().unwrap();
        let _made = tempfile::TempPath::try_from_path(&path).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(4096).unwrap();
        let map = memmap2::MmapRaw::map_raw(&file).unwrap();
        let meta = file.metadata().unwrap();
        let seen = appeared(&before, &mapped().unwrap());
        assert_eq!(seen, Some(EventFile { name, dev: meta.dev(), ino: meta.ino() }));
        drop(map);
    }

    fn file(name: &str, ino: u64) -> EventFile {
        EventFile { name: name.into(), dev: 7, ino }
    }

    #[test]
    fn a_new_event_is_in_the_file_that_appeared_else_in_the_one_file_of_its_own_already_mapped() {
        let mine = file("cuda.shm.0.1c8.1", 10);
        let theirs = file("cuda.shm.0.2a.1", 11);
        let second = file("cuda.shm.0.1c8.2", 12);
        let pid = 0x1c8;
        let files = |list: &[&EventFile]| list.iter().map(|f| (*f).clone()).collect::<Vec<_>>();
        // The first event maps a new file.
        let first = holding_new_event(&files(&[&theirs]), &files(&[&theirs, &mine]), pid);
        assert_eq!(first.as_ref(), Some(&mine));
        // The second maps nothing new: it is in the file of this process's own, not in another's it opened.
        let mapped = files(&[&theirs, &mine]);
        assert_eq!(holding_new_event(&mapped, &mapped, pid).as_ref(), Some(&mine));
        assert_eq!(holding_new_event(&mapped, &mapped, 0x2b), None, "no file of its own: not known");
        // Two files of its own, and nothing new: which one is not known.
        let both = files(&[&mine, &second]);
        assert_eq!(holding_new_event(&both, &both, pid), None);
        // Two new files at once: not known either, though one is its own; one new among its own: that one.
        assert_eq!(holding_new_event(&[], &files(&[&theirs, &mine]), pid), None);
        let later = holding_new_event(&files(&[&mine]), &both, pid);
        assert_eq!(later.as_ref(), Some(&second));
    }
}
