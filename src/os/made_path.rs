//! What the guardian removes besides the driver's files: a socket file or directory the run made, known by
//! the identity it had when made, and removed only while it is still that very file. (How the parent tells
//! the guardian of one is `wire::guardian`.) A path this program made, known by its identity: a fact of the
//! file system, below everything that sends or removes it.

/// A socket file or directory the run made (a served run's socket, an isolated run's private directory),
/// with the identity it had when made: the guardian removes a path only while it is still that very file,
/// so never another's file that took the name since.
///
/// Device and inode are not enough: ext4 gives a new file the inode number of one just removed (seen here:
/// a socket bound again at the same path gets the same inode). A socket's status-change time (to the
/// nanosecond) is that of its making, and no server changes it; a directory's changes with what it holds,
/// so a directory goes by device and inode, and only when empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MadePath {
    pub path: std::path::PathBuf,
    pub dev: u64,
    pub ino: u64,
    /// A directory (removed only when empty), else a socket.
    pub dir: bool,
    /// A socket's status-change time (seconds, nanoseconds); 0 for a directory.
    pub ctime: (i64, i64),
}

impl MadePath {
    /// What is at `path` now, if it is a socket or a directory.
    pub fn of(path: &std::path::Path) -> Option<Self> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::symlink_metadata(path).ok()?;
        let dir = meta.is_dir();
        (dir || meta.file_type().is_socket()).then(|| Self {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
            dir,
            ctime: if dir { (0, 0) } else { (meta.ctime(), meta.ctime_nsec()) },
        })
    }

    /// Removes the path if it is still what was made (a directory only if empty). Returns whether it did.
    /// The look and the removal go through one descriptor of the directory that holds it, so a directory of
    /// the path that another process swaps for a symbolic link between the two cannot send the removal
    /// elsewhere. (Within that directory another process could still replace the name between the look and
    /// the removal: no call removes a name by inode.)
    pub fn remove_if_same(&self) -> bool {
        use nix::fcntl::{AtFlags, OFlag, open};
        use nix::unistd::{UnlinkatFlags, unlinkat};
        let (Some(parent), Some(name)) = (self.path.parent(), self.path.file_name()) else { return false };
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let Ok(directory) = open(parent, flags, nix::sys::stat::Mode::empty()) else { return false };
        let Ok(now) = nix::sys::stat::fstatat(&directory, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
            return false;
        };
        let kind = now.st_mode & nix::libc::S_IFMT;
        let is = if self.dir { kind == nix::libc::S_IFDIR } else { kind == nix::libc::S_IFSOCK };
        let ctime = if self.dir { (0, 0) } else { (now.st_ctime, now.st_ctime_nsec) };
        if !is || (now.st_dev, now.st_ino, ctime) != (self.dev, self.ino, self.ctime) {
            return false;
        }
        let how = if self.dir { UnlinkatFlags::RemoveDir } else { UnlinkatFlags::NoRemoveDir };
        unlinkat(&directory, name, how).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the parent tells the guardian is what it reads back: every field of a socket's and of a
    /// directory's, after the message's kind; a path that is not absolute, none or a short body names nothing.
    #[test]
    fn a_made_path_crosses_to_the_guardian_whole() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(MadePath::of(&file), None, "neither a socket nor a directory");
        assert_eq!(MadePath::of(&dir.path().join("absent")), None);
        let made_socket = MadePath::of(&socket).unwrap();
        let made_dir = MadePath::of(dir.path()).unwrap();
        assert!(!made_socket.dir && made_socket.ctime != (0, 0), "{made_socket:?}");
        assert!(made_dir.dir && made_dir.ctime == (0, 0), "{made_dir:?}");
    }

    /// The removal takes only what was made: a socket bound again at the path, a directory that holds
    /// something, or the name reached through a directory swapped for a symbolic link stay.
    #[test]
    fn only_what_was_made_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("s");
        let _first = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let made = MadePath::of(&socket).unwrap();
        std::fs::remove_file(&socket).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let _again = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        assert!(!made.remove_if_same(), "another socket took the name");
        assert!(socket.exists());
        let made = MadePath::of(&socket).unwrap();
        assert!(made.remove_if_same(), "the socket made");
        assert!(!socket.exists());

        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        let made = MadePath::of(&private).unwrap();
        std::fs::write(private.join("f"), b"").unwrap();
        assert!(!made.remove_if_same(), "a directory that holds a file");
        std::fs::remove_file(private.join("f")).unwrap();
        assert!(made.remove_if_same(), "the directory made, empty");
        assert!(!private.exists());

        // The socket's directory moved away and a symbolic link put in its place: the path now reaches
        // another directory, and nothing is removed there or in the moved one.
        let holder = dir.path().join("holder");
        std::fs::create_dir(&holder).unwrap();
        let inner = holder.join("s");
        let _listener = std::os::unix::net::UnixListener::bind(&inner).unwrap();
        let made = MadePath::of(&inner).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("s"), b"not ours").unwrap();
        std::fs::rename(&holder, dir.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &holder).unwrap();
        assert!(!made.remove_if_same(), "through the link is another file");
        assert!(elsewhere.join("s").exists() && dir.path().join("moved/s").exists());
    }
}
