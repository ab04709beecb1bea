//! The libraries of the forecast's rows that a process has mapped (NCCL, UCX, PyTorch's CUDA library), read
//! from its `maps` as bytes, each with its version read from the file it mapped, never by loading it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::super::root::Root;
use super::super::versions::{self, Version};

/// A library a process has mapped, and its version where its file says it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapped {
    /// Its file, as the process's maps name it (a path in its own mounts).
    pub path: String,
    pub version: Option<String>,
}

/// The libraries of the forecast's rows that a process has loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loaded {
    pub nccl: Option<Mapped>,
    pub ucx: Option<Mapped>,
    /// PyTorch's CUDA library (`libtorch_cuda.so`), with PyTorch's version.
    pub torch: Option<Mapped>,
}

/// The libraries of the forecast's rows in a process's `maps`, each with its version read from its file:
/// the file it mapped, by its mapping (`by_mapping` of its address range, which opens
/// `/proc/<pid>/map_files/<range>` where it is a regular file), else by its path in the process's root.
pub(super) fn loaded(maps: &str, root: &Root, by_mapping: &dyn Fn(&str) -> Option<std::fs::File>) -> Loaded {
    let mut loaded = Loaded::default();
    for line in maps.lines() {
        let Some((range, shown)) = range_and_path(line) else { continue };
        if !shown.starts_with('/') {
            continue;
        }
        // A file removed since it was mapped: the name in its root, if any, is another file's now.
        let (path, deleted) = match shown.strip_suffix(" (deleted)") {
            Some(path) => (path, true),
            None => (shown, false),
        };
        let Some(name) = Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let mapped =
            |version: Option<String>| Some(Mapped { path: crate::output::printable(shown), version });
        // The folder `up` levels above the file, in its root, resolved as the process resolves it.
        let folder = |up: usize| {
            let folder = Path::new(path).ancestors().nth(up).filter(|_| !deleted)?;
            root.find(&folder.to_string_lossy(), true).ok()
        };
        if name.starts_with("libnccl.so") && loaded.nccl.is_none() {
            // The file the process mapped, by its mapping (`map_files`, root only), not by a path in its
            // root that it may have changed since; else by that path.
            let by_mapping = || versions::nccl_of_open_file(&by_mapping(range)?);
            let version = name
                .strip_prefix("libnccl.so.")
                .and_then(Version::at_start_of)
                .or_else(by_mapping)
                .or_else(|| versions::nccl_of_file(&folder(1)?.path().join(&name)));
            loaded.nccl = mapped(version.map(|v| v.to_string()));
        } else if name.starts_with("libucp.so") && loaded.ucx.is_none() {
            loaded.ucx = mapped(None);
        } else if name.starts_with("libtorch_cuda.so") && loaded.torch.is_none() {
            // PyTorch's package: the folder above the library's `lib/`.
            loaded.torch = mapped(folder(2).and_then(|package| versions::torch_of_package(&package.path())));
        }
    }
    loaded
}

/// The address range and the path of a line of `maps` (`7f00-7f01 r-xp 0 08:01 12   /usr/lib/x.so`):
/// the path is all that follows the fifth field and the blanks that pad it, blanks in its name included
/// (the kernel escapes only a newline in it, as `\012`); `None` where the line maps no file.
pub(super) fn range_and_path(line: &str) -> Option<(&str, &str)> {
    let mut rest = line;
    let mut range = "";
    for field in 0..5 {
        rest = rest.trim_start_matches(' ');
        let end = rest.find(' ')?;
        if field == 0 {
            range = &rest[..end];
        }
        rest = &rest[end..];
    }
    Some((range, rest.trim_start_matches(' ')))
}
