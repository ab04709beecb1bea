//! A process's `/proc/<pid>` directory, held open while the process is read: every file read through it is
//! that process's, or an error once it has ended (the kernel ties the directory to the process, not to its
//! number), never that of a process that took its pid number since. Read by number, a process that ended
//! between two reads lent its facts to whichever process was given its number next.

use std::ffi::OsString;
use std::io::Read as _;
use std::os::fd::OwnedFd;

use anyhow::{Result, anyhow, bail};
use nix::fcntl::{OFlag, openat, readlinkat};
use nix::sys::stat::Mode;

/// The most of a process's `status` read: with 65536 supplementary groups (`NGROUPS_MAX`), 720 KB.
pub(super) const MOST_STATUS: u64 = 1 << 20;

/// Where `env_start` and `env_end` are among the fields of `/proc/<pid>/stat` after the name (its 50th and
/// 51st, since Linux 3.5).
const ENV_START: usize = 47;
const ENV_END: usize = 48;

/// `PF_KTHREAD` in the flags of `/proc/<pid>/stat`: a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Process `pid` cannot be read, by `error` at `path`: where the kernel says there is no such process, the
/// error asks whether it ended; otherwise (too many open files, say) the error is this process's own.
pub(super) fn cannot_be_read(pid: i32, path: &str, error: &std::io::Error) -> anyhow::Error {
    let gone = matches!(error.raw_os_error(), Some(nix::libc::ENOENT | nix::libc::ESRCH));
    let hint = if gone { " (has it ended?)" } else { "" };
    anyhow!("process {pid} cannot be read: {path}: {error}{hint}")
}

/// `/proc/<pid>` of one process, held open.
pub(crate) struct ProcDir {
    pub pid: i32,
    dir: OwnedFd,
}

impl ProcDir {
    /// `/proc/<pid>`, of a process and not of one of its threads, that has not ended: `Err` says which
    /// (a thread names its process; a kernel thread and a zombie are no process to forecast for).
    pub fn open(pid: i32) -> Result<Self> {
        if pid <= 0 {
            bail!("{pid} is no process id");
        }
        let path = format!("/proc/{pid}");
        let dir = nix::fcntl::open(
            path.as_str(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| cannot_be_read(pid, &path, &e.into()))?;
        let held = Self { pid, dir };
        let status = held
            .read_string("status", MOST_STATUS)
            .map_err(|e| cannot_be_read(pid, &format!("{path}/status"), &e))?;
        let field = |name: &str| crate::os::access::status_field(&status, name);
        if let Some(tgid) = field("Tgid").filter(|tgid| *tgid != pid.to_string()) {
            bail!("{pid} is a thread of process {tgid}, not a process: give {tgid}");
        }
        held.running()?;
        Ok(held)
    }

    /// Another hold of the same directory, for another thread.
    pub fn try_clone(&self) -> std::io::Result<Self> {
        Ok(Self { pid: self.pid, dir: self.dir.try_clone()? })
    }

    /// `Ok` while the process runs: `Err` once it has ended (a zombie, or gone), and for a kernel thread.
    pub fn running(&self) -> Result<()> {
        let pid = self.pid;
        let stat = self
            .read_string("stat", 4096)
            .map_err(|e| anyhow!("process {pid} has ended while it was read (/proc/{pid}/stat: {e})"))?;
        // The name, in parentheses, may hold anything: the fields are after its last ')'.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let state = fields.first().copied().unwrap_or_default();
        if state == "Z" || state == "X" {
            bail!("process {pid} has ended (a zombie: its parent has not reaped it yet)");
        }
        let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).ok_or_else(|| {
            anyhow!("process {pid}: its flags could not be read (/proc/{pid}/stat: {stat:?})")
        })?;
        if flags & PF_KTHREAD != 0 {
            bail!("{pid} is a kernel thread, not a process: it has no place of its own to read");
        }
        Ok(())
    }

    /// How long its environment is, in bytes, as the kernel keeps its bounds (`env_start`, `env_end` of
    /// `/proc/<pid>/stat`; 0 where this process may not read them).
    pub fn environment_length(&self) -> std::io::Result<u64> {
        let stat = self.read_string("stat", 4096)?;
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let field = |at: usize| fields.get(at).and_then(|f| f.parse::<u64>().ok());
        match (field(ENV_START), field(ENV_END)) {
            (Some(start), Some(end)) => Ok(end.saturating_sub(start)),
            _ => Err(std::io::Error::other(format!("no environment's bounds in its stat: {stat:?}"))),
        }
    }

    /// The file `name` under it, opened with `flags` (`O_CLOEXEC` added).
    pub fn open_file(&self, name: &str, flags: OFlag) -> std::io::Result<OwnedFd> {
        Ok(openat(&self.dir, name, flags | OFlag::O_CLOEXEC, Mode::empty())?)
    }

    /// The file `name` under it, whole, where it holds at most `most` bytes: more is an error (a process
    /// that lies about itself may make its `environ` or `maps` as long as it likes).
    pub fn read(&self, name: &str, most: u64) -> std::io::Result<Vec<u8>> {
        let file = std::fs::File::from(self.open_file(name, OFlag::O_RDONLY)?);
        let mut bytes = Vec::new();
        file.take(most + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > most {
            return Err(std::io::Error::other(format!("more than {most} bytes")));
        }
        Ok(bytes)
    }

    /// [`read`](Self::read), as text: each byte that is not UTF-8 made U+FFFD (a process's name, its files'
    /// names, are bytes).
    pub fn read_string(&self, name: &str, most: u64) -> std::io::Result<String> {
        Ok(String::from_utf8_lossy(&self.read(name, most)?).into_owned())
    }

    /// The link `name` under it.
    pub fn read_link(&self, name: &str) -> std::io::Result<OsString> {
        Ok(readlinkat(&self.dir, name)?)
    }
}
