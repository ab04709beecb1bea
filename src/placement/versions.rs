//! The library versions the forecast's answer depends on, read from the libraries' files: nothing of a
//! library is loaded or run to learn its version (a library's constructors are its author's code, and a
//! library found on a search path another user can write to is that user's). NCCL's version is in its
//! file's name where the file is `libnccl.so.2.<minor>.<patch>`, and always in its read-only data, as the
//! banner it prints (`NCCL version 2.28.3+cuda13.0`, src/init.cc `VERSION_STRING`); PyTorch's is in the
//! `version.py` beside its `lib/` folder. The library a process would load is found as the dynamic loader
//! finds it, absolute paths only ([`nccl`]); the one a running process has loaded is in its maps (see
//! `placement::outside`). Where a version cannot be read, the forecast takes the newest release and names the
//! range where the answer differs.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A library's version, as `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Version(pub u32, pub u32, pub u32);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

impl Version {
    /// `2.28.3` at the start of `text` (what follows, `+cuda13.0` or `-1`, is left).
    pub fn at_start_of(text: &str) -> Option<Self> {
        let mut numbers = text.splitn(3, '.');
        let mut number = |last: bool| -> Option<u32> {
            let part = numbers.next()?;
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            let whole = digits.len() == part.len();
            (!digits.is_empty() && digits.len() <= 6 && (last || whole)).then(|| digits.parse().ok())?
        };
        Some(Version(number(false)?, number(false)?, number(true)?))
    }
}

/// NCCL's banner in its read-only data, followed by its version.
const NCCL_BANNER: &[u8] = b"NCCL version ";

/// The version of the NCCL library in the file at `path`: from its name (`libnccl.so.2.28.3`), else from the
/// banner in its read-only data (read, never loaded). `None` where the file cannot be read, is no regular
/// file, or holds no banner.
pub fn nccl_of_file(path: &Path) -> Option<Version> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    if let Some(version) = name.strip_prefix("libnccl.so.").and_then(Version::at_start_of) {
        return Some(version);
    }
    nccl_of_open_file(&open_regular(path)?)
}

/// [`nccl_of_file`] of a file open already (a process's mapped file, `/proc/<pid>/map_files/...`).
pub fn nccl_of_open_file(file: &std::fs::File) -> Option<Version> {
    let data = read_only_data(file)?;
    memchr::memmem::find_iter(&data, NCCL_BANNER).find_map(|at| {
        let rest = &data[at + NCCL_BANNER.len()..];
        let text: String =
            rest.iter().take(24).take_while(|b| b.is_ascii_graphic()).map(|&b| b as char).collect();
        Version::at_start_of(&text)
    })
}

/// The file at `path` opened for reading where it is a regular file: never a FIFO or a device, whose open
/// could wait for good or do what its driver does on open (a process read from outside may have put one
/// where its library was), and without following a last symbolic link (another root's link may name a file
/// of this one). It is looked at before it is opened ([`reopened_if_regular`]): an open of a FIFO, even
/// non-blocking, let its waiting writer in, and an open of a device called its driver.
pub fn open_regular(path: &Path) -> Option<std::fs::File> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    reopened_if_regular(nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty()).ok()?)
}

/// What `found` (open `O_PATH`, which opens nothing) is, opened for reading where it is a regular file:
/// through `/proc/self/fd`, so the very file that was looked at.
pub fn reopened_if_regular(found: std::os::fd::OwnedFd) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd as _;
    let mode = nix::sys::stat::fstat(&found).ok()?.st_mode;
    if mode & nix::libc::S_IFMT != nix::libc::S_IFREG {
        return None;
    }
    std::fs::File::open(format!("/proc/self/fd/{}", found.as_raw_fd())).ok()
}

/// The most of a file searched for a banner: a library's `.rodata` is a few MB (NCCL's, of a file of
/// hundreds); a file that is no ELF file is searched this far from its start.
const MOST: u64 = 64 << 20;

/// The `.rodata` section of an ELF64 little-endian file, where its section headers say where it is (NCCL's
/// banner is there), else the file's first [`MOST`] bytes; read with `pread`, never mapped (a file cut
/// short while it is read ends a read, not the process).
fn read_only_data(file: &std::fs::File) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let length = file.metadata().ok()?.len();
    let read = |at: u64, bytes: u64| -> Option<Vec<u8>> {
        let bytes = bytes.min(MOST).min(length.saturating_sub(at));
        let mut buffer = vec![0u8; usize::try_from(bytes).ok()?];
        file.read_exact_at(&mut buffer, at).ok()?;
        Some(buffer)
    };
    let elf = |header: &[u8]| -> Option<(u64, u64)> {
        let u16_at = |b: &[u8], at: usize| Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?));
        let u32_at = |b: &[u8], at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
        let u64_at = |b: &[u8], at: usize| Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?));
        // ELF64 (class 2), little-endian (data 1).
        if header.get(..6)? != b"\x7fELF\x02\x01" {
            return None;
        }
        let headers_at = u64_at(header, 0x28)?;
        let (size, count, names) = (u16_at(header, 0x3a)?, u16_at(header, 0x3c)?, u16_at(header, 0x3e)?);
        if size < 0x40 || names >= count {
            return None;
        }
        let table = read(headers_at, u64::from(size) * u64::from(count))?;
        let section = |index: u16| -> Option<(u32, u64, u64)> {
            let at = usize::from(index) * usize::from(size);
            Some((u32_at(&table, at)?, u64_at(&table, at + 0x18)?, u64_at(&table, at + 0x20)?))
        };
        let (_, names_at, names_length) = section(names)?;
        let names = read(names_at, names_length)?;
        (0..count).find_map(|index| {
            let (name, offset, length) = section(index)?;
            let name = names.get(usize::try_from(name).ok()?..)?;
            name.starts_with(b".rodata\0").then_some((offset, length))
        })
    };
    let header = read(0, 0x40)?;
    match elf(&header) {
        Some((offset, length)) => read(offset, length),
        None => read(0, MOST),
    }
}

/// PyTorch's version, from the `version.py` of its package folder `package`, whose `lib/` holds its
/// `libtorch_cuda.so`: `__version__ = '2.11.0+cu130'`.
pub fn torch_of_package(package: &Path) -> Option<String> {
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(open_regular(&package.join("version.py"))?, 64 << 10),
        &mut text,
    )
    .ok()?;
    let line = text.lines().find(|l| l.trim_start().starts_with("__version__"))?;
    let value = line.split_once('=')?.1.trim().trim_matches(|c| c == '\'' || c == '"');
    (!value.is_empty() && value.len() <= 64 && value.chars().all(|c| c.is_ascii_graphic()))
        .then(|| value.to_owned())
}

/// The version of the NCCL this process would load (`libnccl.so.2`, found as the dynamic loader finds it:
/// [`loader_candidates`]), or of the file `SIMPLE_IPC_NCCL_LIBRARY` names (the path of one in a Python
/// package, say), if one is there. Nothing is loaded.
pub fn nccl() -> Option<Version> {
    if let Some(path) = std::env::var_os("SIMPLE_IPC_NCCL_LIBRARY") {
        return nccl_of_file(Path::new(&path));
    }
    loader_candidates("libnccl.so.2").into_iter().find(|p| p.is_file()).and_then(|p| nccl_of_file(&p))
}

/// Where the dynamic loader would look for `soname`, in its order, absolute paths only: each absolute
/// element of `LD_LIBRARY_PATH` (an empty or relative one names the directory the process stands in, which
/// is nobody's choice of a library: left out), then `/etc/ld.so.cache`'s entries of that name, then the
/// default directories.
pub fn loader_candidates(soname: &str) -> Vec<PathBuf> {
    let cache = std::fs::read("/etc/ld.so.cache").unwrap_or_default();
    candidates(std::env::var_os("LD_LIBRARY_PATH").as_deref(), &cache, soname)
}

/// [`loader_candidates`] for this `LD_LIBRARY_PATH` and this `ld.so.cache`.
fn candidates(ld_library_path: Option<&std::ffi::OsStr>, cache: &[u8], soname: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    if let Some(path) = ld_library_path {
        for directory in std::env::split_paths(path).filter(|d| d.is_absolute()) {
            found.push(directory.join(soname));
        }
    }
    found.extend(ld_so_cache(cache, soname));
    for directory in
        ["/lib64", "/usr/lib64", "/lib", "/usr/lib", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"]
    {
        found.push(Path::new(directory).join(soname));
    }
    found
}

/// The paths `/etc/ld.so.cache` (glibc's format, `glibc-ld.so.cache1.1`) gives for `soname`.
fn ld_so_cache(cache: &[u8], soname: &str) -> Vec<PathBuf> {
    const MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    // The new format may follow the old one's table: find its header.
    let Some(start) = memchr::memmem::find(cache, MAGIC) else { return Vec::new() };
    let u32_at = |at: usize| -> Option<usize> {
        let bytes = cache.get(start + at..start + at + 4)?;
        usize::try_from(u32::from_le_bytes(bytes.try_into().ok()?)).ok()
    };
    let string = |at: usize| -> Option<&[u8]> {
        let rest = cache.get(start + at..)?;
        rest.get(..memchr::memchr(0, rest)?)
    };
    let Some(count) = u32_at(20) else { return Vec::new() };
    // The header is 48 bytes; each entry 24: flags, key, value, osversion, hwcap (8).
    (0..count.min(1 << 16))
        .filter_map(|entry| {
            let at = 48 + entry * 24;
            (string(u32_at(at + 4)?)? == soname.as_bytes()).then(|| {
                Some(PathBuf::from(String::from_utf8_lossy(string(u32_at(at + 8)?)?).into_owned()))
            })?
        })
        .collect()
}

#[cfg(test)]
mod tests;
