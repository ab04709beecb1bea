//! A process's root directory, and the paths in it resolved as that process resolves them: a symbolic
//! link's absolute target from that root, `..` never above it. Another process's root is reached through
//! `/proc/<pid>/root`, below which the kernel resolves an absolute link from this process's root instead:
//! a container whose `/dev/shm` is a link to `/dev/shm` (a loop, to itself: it has none) read as the node's
//! `/dev/shm`, and so would its `/dev/nvidia0`, `/etc/nv_tegra_release`, its MPS pipe directory and its
//! libraries' files, each a name in the node's files that the process chose. Here each name is looked at
//! (opened `O_PATH`, never read, never followed by the kernel) and each link is read and resolved in the
//! root by this module, as `openat2`'s `RESOLVE_IN_ROOT` would (which kernels before 5.6 lack).
//!
//! Why by hand: `openat2` is missing before Linux 5.6; cap-std resolves beneath a directory, refusing an
//! absolute link where a process resolves it from its root; libpathrs (`pathrs` 0.2.6, tried) resolves in a
//! root but panics where this process is out of descriptors ("at least one candidate /proc/thread-self path
//! should work", with `ulimit -n 7`), which here is an error that names the fact being read.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, readlinkat};
use nix::sys::stat::{Mode, SFlag, fstat};

/// How many symbolic links a path may take, as the kernel's `ELOOP` (40).
const MOST_LINKS: usize = 40;

/// A process's root directory, held open (`O_PATH`).
pub(crate) struct Root(OwnedFd);

/// What a path in a [`Root`] names, held open (`O_PATH`): reached by [`path`](Found::path), which the kernel
/// follows to it and no further.
pub(crate) struct Found(OwnedFd);

impl Found {
    /// `/proc/self/fd/<fd>`: the object itself, for calls that take a path (`statvfs`, `connect`, `opendir`,
    /// an `open` of a name below it).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
    }

    /// Its type, as `fstat` says.
    pub fn kind(&self) -> std::io::Result<SFlag> {
        let stat = fstat(&self.0)?;
        Ok(SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()))
    }
}

impl Root {
    /// This process's own root, `/`.
    pub fn here() -> std::io::Result<Self> {
        Self::at(Path::new("/"))
    }

    /// The directory at `path` as a root.
    pub fn at(path: &Path) -> std::io::Result<Self> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        Ok(Self(nix::fcntl::open(path, flags, Mode::empty())?))
    }

    /// The directory `dir` (open, `O_PATH` will do) as a root.
    pub fn of(dir: OwnedFd) -> Self {
        Self(dir)
    }

    /// Whether `path` names something in this root, its last link followed.
    pub fn exists(&self, path: &str) -> bool {
        self.find(path, true).is_ok()
    }

    /// What `path` names in this root (absolute or not, it starts from the root), resolved as a process
    /// whose root this is resolves it, with the last name's link followed where `follow` is: `ENOENT`,
    /// `ENOTDIR`, `ELOOP` where that process would meet them.
    pub fn find(&self, path: &str, follow: bool) -> std::io::Result<Found> {
        // The directories below the root that the path has gone through, the last the one it is in.
        let mut walked: Vec<OwnedFd> = Vec::new();
        let mut todo: Vec<String> = names_of(path);
        let mut links = 0;
        while let Some(name) = todo.pop() {
            if name == ".." {
                walked.pop();
                continue;
            }
            let here = walked.last().map_or(self.0.as_fd(), |dir| dir.as_fd());
            let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let found = openat(here, name.as_str(), flags, Mode::empty())?;
            let kind = fstat(&found)?.st_mode & SFlag::S_IFMT.bits();
            if kind == SFlag::S_IFLNK.bits() && (follow || !todo.is_empty()) {
                links += 1;
                if links > MOST_LINKS {
                    return Err(Errno::ELOOP.into());
                }
                // The link itself, read through what was opened: the name may have changed since.
                let target = readlinkat(&found, "")?;
                let target = target.to_string_lossy();
                if target.starts_with('/') {
                    walked.clear();
                }
                todo.extend(names_of(&target));
                continue;
            }
            if !todo.is_empty() && kind != SFlag::S_IFDIR.bits() {
                return Err(Errno::ENOTDIR.into());
            }
            walked.push(found);
        }
        match walked.pop() {
            Some(found) => Ok(Found(found)),
            None => Ok(Found(self.0.try_clone()?)),
        }
    }
}

/// The names of `path`, last first (a stack: the next name is popped), without the empty ones and `.`.
fn names_of(path: &str) -> Vec<String> {
    path.split('/').filter(|n| !n.is_empty() && *n != ".").rev().map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A root's links are resolved in it: an absolute one from the root, `..` never above it, a loop is
    /// `ELOOP`, and the last link is followed only where asked; what is reached is the object itself.
    #[test]
    fn a_path_is_resolved_in_its_root_as_its_process_resolves_it() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "outside").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let at = |p: &str| dir.path().join(p);
        std::fs::create_dir_all(at("dev/shm")).unwrap();
        std::fs::create_dir_all(at("etc")).unwrap();
        std::fs::write(at("etc/secret"), "inside").unwrap();
        symlink("/etc/secret", at("absolute")).unwrap();
        symlink("../../../../../../../etc/secret", at("dev/up")).unwrap();
        symlink(outside.path().join("secret"), at("escape")).unwrap();
        symlink("/loop", at("loop")).unwrap();
        symlink("shm", at("dev/relative")).unwrap();
        let root = Root::at(dir.path()).unwrap();
        let read = |p: &str| std::fs::read_to_string(root.find(p, true)?.path());
        assert_eq!(read("absolute").unwrap(), "inside", "an absolute link from the root");
        assert_eq!(read("dev/up").unwrap(), "inside", "never above the root");
        assert_eq!(read("/dev/../../etc/secret").unwrap(), "inside");
        assert_eq!(read("escape").unwrap_err().kind(), std::io::ErrorKind::NotFound, "not the node's file");
        assert_eq!(read("loop").unwrap_err().raw_os_error(), Some(nix::libc::ELOOP));
        assert_eq!(read("etc/secret/x").unwrap_err().raw_os_error(), Some(nix::libc::ENOTDIR));
        let shm = root.find("dev/relative", true).unwrap();
        assert_eq!(shm.kind().unwrap(), SFlag::S_IFDIR);
        let link = root.find("dev/relative", false).unwrap();
        assert_eq!(link.kind().unwrap(), SFlag::S_IFLNK, "the last link, not followed");
        assert!(root.exists("/") && root.exists("dev/shm") && !root.exists("dev/nvidia0"));
        // A name below what was found is looked up in it.
        let etc = root.find("/etc", true).unwrap();
        assert_eq!(std::fs::read_to_string(etc.path().join("secret")).unwrap(), "inside");
    }
}
