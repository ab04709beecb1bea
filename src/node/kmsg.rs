//! The kernel's log, as `/dev/kmsg` gives it, from the start of a run on: each `read` one record,
//! `PRI,SEQ,TIMESTAMP_US,FLAGS[,...];MESSAGE\n` then its dictionary, each line of which starts with a space;
//! `EAGAIN` past the last record (the descriptor is non-blocking), `EPIPE` where the next record was
//! overwritten before it was read (the reader goes on at the oldest one left).
//!
//! Which records are the run's: where `/dev/kmsg` can be opened as the run begins ([`RunStart::now`]), the
//! descriptor is moved past the newest record (`lseek(SEEK_END)`) and kept, so that the records read from
//! it at the end are exactly those logged since, whatever the clocks say. Where it could only be opened
//! later (or for a test's log, [`TEST_LOG_ENV`]), the records are filtered by time: a record's timestamp is
//! the kernel's `local_clock()` in microseconds, which counts from boot like `CLOCK_MONOTONIC` and, like it,
//! stops while the machine is suspended (`CLOCK_BOOTTIME` goes on, so after a suspend it runs ahead of the
//! log and would drop the run's own records). Measured here: a record written right after a read of
//! `CLOCK_MONOTONIC` was stamped 0.3 ms before it (`CLOCK_BOOTTIME` the same, on a machine never
//! suspended; `CLOCK_MONOTONIC_RAW` 260 ms away after 3 hours): so records up to [`CLOCK_SLACK`] before the
//! run's start on `CLOCK_MONOTONIC` are taken. The two clocks drift apart on a machine up for weeks
//! (`local_clock()` follows the TSC, `CLOCK_MONOTONIC` is slewed by NTP): the kept descriptor is why the
//! filter by time is only the fall-back.
//!
//! Where the log cannot be read (`kernel.dmesg_restrict` is 1 and the process lacks `CAP_SYSLOG`: `EPERM`;
//! a container without `/dev/kmsg`), [`since`] says why, once, for the document.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

/// The kernel's log.
const KMSG: &str = "/dev/kmsg";

/// A test's kernel log: a file of records in `/dev/kmsg`'s format, one a line, read instead of the
/// kernel's, filtered by time. While it is set, the simulated GPUs have PCI addresses to match its Xid lines
/// against ([`simulated_pci_bus_id`]), and every run says so as it starts ([`test_hook_said`]).
pub const TEST_LOG_ENV: &str = "SIMPLE_IPC_TEST_KERNEL_LOG";

/// How long before the run's start (on `CLOCK_MONOTONIC`) a record is still taken as the run's, where the
/// records are filtered by time: the kernel's log clock was seen 0.3 ms behind; a second leaves room.
pub const CLOCK_SLACK: Duration = Duration::from_secs(1);

/// The largest record `/dev/kmsg` gives (the kernel's `CONSOLE_EXT_LOG_MAX`, 8 KiB), with room.
const RECORD_BYTES: usize = 16 * 1024;

/// At most this many records are read, so that a log flooded while it is read still ends.
const MOST_RECORDS: usize = 1 << 20;

/// The largest test's log read ([`TEST_LOG_ENV`]): a larger one is refused, not read, whatever it holds.
const MOST_TEST_LOG_BYTES: u64 = 16 << 20;

/// When a run began: on `CLOCK_MONOTONIC`, and in the kernel's log, where it could be opened then.
#[derive(Debug)]
pub struct RunStart {
    /// `CLOCK_MONOTONIC` at the start, in microseconds.
    micros: u64,
    /// `/dev/kmsg`, past its newest record at the start; or why it could not be opened then.
    log: Result<std::fs::File, String>,
}

impl RunStart {
    /// Now; `anchored`: also open the kernel's log and keep it past its newest record (for a process that
    /// may read it at its end: not a child, nor the guardian).
    pub fn now(anchored: bool) -> Self {
        let micros = monotonic_micros();
        let log = match std::env::var_os(TEST_LOG_ENV) {
            Some(_) => Err("a test's log is read instead".to_owned()),
            None if anchored => open(Path::new(KMSG)).and_then(|mut log| {
                log.seek(SeekFrom::End(0)).map_err(|e| format!("{KMSG}: lseek: {e}"))?;
                Ok(log)
            }),
            None => Err("not asked".to_owned()),
        };
        Self { micros, log }
    }

    /// The start, in the log's microseconds.
    pub fn micros(&self) -> u64 {
        self.micros
    }
}

/// One record of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its timestamp: microseconds of the kernel's log clock.
    pub micros: u64,
    /// Its text, its dictionary left out.
    pub message: String,
}

/// The records logged since `start`: from the descriptor kept at the start; else from the log (the test's,
/// where [`TEST_LOG_ENV`] is set) opened now, those stamped at most [`CLOCK_SLACK`] before the start. `Err`:
/// why the log cannot be read, in words.
pub fn since(start: &mut RunStart) -> Result<Vec<Record>, String> {
    if let Some(test_log) = std::env::var_os(TEST_LOG_ENV) {
        let text = read_test_log(Path::new(&test_log))?;
        let records = String::from_utf8_lossy(&text).lines().take(MOST_RECORDS).filter_map(parse).collect();
        return Ok(after(records, start.micros));
    }
    match &mut start.log {
        Ok(log) => read_all(log),
        Err(_) => Ok(after(read_all(&mut open(Path::new(KMSG))?)?, start.micros)),
    }
}

/// A test's log, whole: a regular file of at most [`MOST_TEST_LOG_BYTES`], opened without blocking (a FIFO
/// or a device, which could hold the run past its `--timeout` and its watchdog, is refused unread, as is a
/// larger file). `Err`: why not, in words.
fn read_test_log(path: &Path) -> Result<Vec<u8>, String> {
    let said = |why: String| {
        format!("the test's kernel log {}: {why}", crate::output::printable(&path.display().to_string()))
    };
    let flags = nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC | nix::libc::O_NOCTTY;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| said(e.to_string()))?;
    let meta = file.metadata().map_err(|e| said(e.to_string()))?;
    if !meta.is_file() {
        return Err(said("not a regular file: not read".to_owned()));
    }
    if meta.len() > MOST_TEST_LOG_BYTES {
        return Err(said(format!(
            "{} bytes, more than the {MOST_TEST_LOG_BYTES} read: not read",
            meta.len()
        )));
    }
    let mut text = Vec::new();
    // Bounded as well should the file grow while it is read.
    file.take(MOST_TEST_LOG_BYTES).read_to_end(&mut text).map_err(|e| said(e.to_string()))?;
    Ok(text)
}

/// Those of `records` stamped at most [`CLOCK_SLACK`] before `start` (microseconds), or later.
fn after(records: Vec<Record>, start: u64) -> Vec<Record> {
    let from = start.saturating_sub(CLOCK_SLACK.as_micros() as u64);
    records.into_iter().filter(|r| r.micros >= from).collect()
}

/// Opens the log for reading, non-blocking; `Err`: why it cannot be, in words.
fn open(path: &Path) -> Result<std::fs::File, String> {
    let flags = nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC;
    std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path).map_err(|e| {
        match e.raw_os_error().map(nix::errno::Errno::from_raw) {
            Some(nix::errno::Errno::ENOENT) => {
                format!("{} is not there (as in a container that was not given it)", path.display())
            }
            Some(nix::errno::Errno::EPERM | nix::errno::Errno::EACCES) => {
                let restrict = std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict")
                    .map(|s| format!(" (kernel.dmesg_restrict is {})", s.trim()))
                    .unwrap_or_default();
                let needs = "reading the kernel's log needs CAP_SYSLOG where kernel.dmesg_restrict is 1";
                format!("{}: {e}: {needs}{restrict}", path.display())
            }
            _ => format!("{}: {e}", path.display()),
        }
    })
}

/// Every record `log` has left to read: one a `read`, until `EAGAIN`; an overwritten record (`EPIPE`) is
/// passed over.
fn read_all(log: &mut std::fs::File) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    let mut buffer = vec![0u8; RECORD_BYTES];
    while records.len() < MOST_RECORDS {
        match log.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => records.extend(parse(&String::from_utf8_lossy(&buffer[..n]))),
            Err(e) => match e.kind() {
                std::io::ErrorKind::WouldBlock => break,
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::Interrupted => continue,
                _ => return Err(format!("reading {KMSG}: {e}")),
            },
        }
    }
    Ok(records)
}

/// A record's timestamp and text, from `PRI,SEQ,TIMESTAMP_US,FLAGS[,...];MESSAGE` (its dictionary, the
/// lines after the first, left out); `None` for a line that is not one (a dictionary line of a test's log).
fn parse(record: &str) -> Option<Record> {
    let (header, message) = record.split_once(';')?;
    let micros = header.split(',').nth(2)?.parse().ok()?;
    let message = message.lines().next().unwrap_or_default().to_owned();
    Some(Record { micros, message })
}

/// `CLOCK_MONOTONIC` now, in microseconds (0 where it cannot be read, which takes every record).
fn monotonic_micros() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|now| Duration::from(now).as_micros() as u64)
        .unwrap_or(0)
}

/// What a run that the test's log changes says as it starts (on standard error, which `--quiet` keeps),
/// where [`TEST_LOG_ENV`] is set.
pub fn test_hook_said() -> Option<String> {
    let path = test_log()?;
    Some(format!(
        "TEST KERNEL LOG ({TEST_LOG_ENV}={path}): the kernel's log is read from this file, not from {KMSG}, and \
         simulated GPUs have PCI addresses to match its Xid lines against"
    ))
}

/// The test's log ([`TEST_LOG_ENV`]) where one is read instead of the kernel's, fit to print: the document
/// and the metrics mark a run it changed.
pub fn test_log() -> Option<String> {
    let path = std::env::var_os(TEST_LOG_ENV)?;
    Some(crate::output::printable(&Path::new(&path).display().to_string()))
}

/// The PCI address of the simulated GPU of ordinal `physical`, where a test's log is read
/// ([`TEST_LOG_ENV`]): `0000:1N:00.0`; none otherwise, as a simulated device has none.
pub fn simulated_pci_bus_id(physical: i32) -> Option<String> {
    std::env::var_os(TEST_LOG_ENV)?;
    Some(format!("0000:{:02x}:00.0", 0x10 + physical.clamp(0, 0xef)))
}

/// The records of a test's log, as [`since`] reads them.
#[cfg(test)]
fn records_of(text: &str) -> Vec<Record> {
    text.lines().filter_map(parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record gives its timestamp and its first line; a dictionary line, or a line of no record, is
    /// passed over; a record of a test's log before the run's start (less the slack) is not the run's.
    #[test]
    fn records_are_read_from_their_header_and_filtered_by_time() {
        let log = "6,355,526846,-;nvidia-nvlink: Nvlink Core is being initialized\n \
                   SUBSYSTEM=pci\n\
                   4,358,3530082,c;NVRM: Xid (PCI:0000:17:00): 31, pid=7, name=a\n\
                   not a record\n\
                   4,359,x,-;no timestamp\n";
        let records = records_of(log);
        assert_eq!(
            records,
            vec![
                Record { micros: 526846, message: "nvidia-nvlink: Nvlink Core is being initialized".into() },
                Record { micros: 3530082, message: "NVRM: Xid (PCI:0000:17:00): 31, pid=7, name=a".into() },
            ]
        );
        let kept = after(records.clone(), 3530082 + CLOCK_SLACK.as_micros() as u64);
        assert_eq!(kept, records[1..], "a record within the slack before the start is the run's");
        assert!(after(records, 3530083 + CLOCK_SLACK.as_micros() as u64).is_empty());
        let from_read = parse("4,1,12,-;NVRM: first\n SUBSYSTEM=pci\n DEVICE=+pci:0000:17:00.0\n");
        assert_eq!(from_read, Some(Record { micros: 12, message: "NVRM: first".into() }));
    }

    /// A log that is not there says so, as a container's is not.
    #[test]
    fn a_log_that_cannot_be_opened_says_why() {
        let Err(why) = open(Path::new("/no/such/kmsg")) else { panic!("opened") };
        assert!(why.contains("is not there"), "{why}");
    }
}
