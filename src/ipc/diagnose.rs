//! Why opening another process's legacy handle failed, said from evidence, with the least sharing that
//! fixes it. What the driver answers across namespaces was measured on the H200 host (driver 580):
//! - a legacy memory or event handle fails with `CUDA_ERROR_INVALID_CONTEXT` exactly when the importer's
//!   pid number equals the exporter's (each in a PID namespace of its own: the driver takes the handle for
//!   one of its own);
//! - a legacy event fails with `CUDA_ERROR_MAP_FAILED` when the driver's file for it is not in the
//!   importer's `/dev/shm`: another `/dev/shm`, or the name gone or replaced by a process of the same pid
//!   number elsewhere;
//! - memory handles, VMM and pool descriptors do not depend on `/dev/shm`.
//!
//! Blanket advice (`--ipc=host`) is wrong for most of these; each message names only what its case needs.

use anyhow::anyhow;

use crate::driver::{code, failed_code};
use crate::driver_files::{EventFile, NameNow};

/// What the importer tried to open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    LegacyMemory,
    Event,
}

/// What an importer knows of the exporter of a handle.
#[derive(Clone, Debug, Default)]
pub struct Exporter {
    /// Its pid as it sees it (its own namespace's number), where the importer knows it.
    pub pid: Option<u32>,
    /// For an event, the driver's file behind it as the exporter maps it.
    pub file: Option<EventFile>,
}

const SAME_PID_FIX: &str = "what fixes it: one PID namespace for both (Docker --pid=container:NAME or \
    --pid=host, Kubernetes shareProcessNamespace: true), or an init process that gives them different pids";
/// What else fixes the same pid number, for each kind of handle: the one thing that needs no such handle.
const SAME_PID_MEMORY: &str = "or --ipc vmm or pool, which share the memory by descriptor";
const SAME_PID_EVENT: &str = "or --sync memops, which orders without interprocess events";
const SHM_FIX: &str = "what fixes it: share /dev/shm (Docker --ipc=container:NAME or --ipc=host, or the same \
    pod), or --sync memops, which needs no interprocess event";
const COLLISION: &str = "Processes of the same pid number in PID namespaces that share /dev/shm (containers \
    with --ipc=host, pods with hostIPC) make the same names for their events' files, each replacing the \
    other's: run them in one PID namespace, or use --sync memops, which needs no such file";

/// The explanation of a failed open, added to `error` where the evidence supports one.
pub fn open_failed(error: anyhow::Error, opening: Opening, exporter: &Exporter) -> anyhow::Error {
    match explain(failed_code(&error), opening, exporter, std::process::id()) {
        Some(why) => error.context(why),
        None => error,
    }
}

fn explain(code: Option<u32>, opening: Opening, exporter: &Exporter, me: u32) -> Option<String> {
    let code = code?;
    if code == code::INVALID_CONTEXT && exporter.pid == Some(me) {
        let other = if opening == Opening::Event { SAME_PID_EVENT } else { SAME_PID_MEMORY };
        return Some(format!(
            "this process and the handle's exporter are both pid {me}, each in a PID namespace of its own: \
             the driver takes the handle for one of its own; {SAME_PID_FIX}; {other}"
        ));
    }
    if opening != Opening::Event || code != code::MAP_FAILED {
        return None;
    }
    let Some(file) = &exporter.file else {
        return Some(format!(
            "the driver could not map the event's file in /dev/shm, where its exporter made it: if this \
             process has a /dev/shm of its own, {SHM_FIX}"
        ));
    };
    let path = file.path().display().to_string();
    Some(match file.name_now() {
        NameNow::OtherShm => {
            format!(
                "the event's file {path} is in its exporter's /dev/shm, and this process has another: {SHM_FIX}"
            )
        }
        NameNow::Absent => format!(
            "the event's file {path} is gone from the /dev/shm this process shares with its exporter: \
             its exporter's run ended, or another process removed it. {COLLISION}"
        ),
        NameNow::Replaced { ino } => format!(
            "the name of the event's file {path} is another file now (inode {ino}, the exporter's is {}). \
             {COLLISION}",
            file.ino
        ),
        NameNow::Same => return None,
    })
}

/// The error of an event that opened, but whose file is not its exporter's: the name was made again by a
/// process of the same pid number in another PID namespace, and ordering with this event would order with
/// that process's. `None` when they agree, or when either side saw no file.
pub fn collision(exporter: &Exporter, opened: Option<&EventFile>) -> Option<anyhow::Error> {
    let (theirs, mine) = (exporter.file.as_ref()?, opened?);
    (theirs != mine).then(|| {
        let pid = mine.pid_number().map_or_else(|| "?".to_owned(), |p| p.to_string());
        anyhow!(
            "the event opened is another process's: this process mapped {} as inode {}, its exporter made it \
             as inode {}; a process of the same pid number ({pid}) elsewhere made that name again. {COLLISION}",
            mine.path().display(),
            mine.ino,
            theirs.ino
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exporter(pid: u32) -> Exporter {
        Exporter { pid: Some(pid), file: None }
    }

    #[test]
    fn the_same_pid_number_is_named_with_its_fixes_and_nothing_else_is() {
        let why = explain(Some(code::INVALID_CONTEXT), Opening::LegacyMemory, &exporter(1), 1).unwrap();
        assert!(why.contains("both pid 1") && why.contains("--pid=container"), "{why}");
        assert!(
            why.contains("--ipc vmm") && !why.contains("memops"),
            "a memory handle: by descriptor: {why}"
        );
        let event = explain(Some(code::INVALID_CONTEXT), Opening::Event, &exporter(1), 1).unwrap();
        assert!(event.contains("--sync memops") && !event.contains("--ipc vmm"), "an event: memops: {event}");
        assert!(!why.contains("--ipc=host"), "{why}");
        assert_eq!(explain(Some(code::INVALID_CONTEXT), Opening::LegacyMemory, &exporter(1), 2), None);
        assert_eq!(explain(Some(code::MAP_FAILED), Opening::LegacyMemory, &exporter(1), 2), None);
        assert_eq!(explain(None, Opening::Event, &exporter(1), 1), None);
    }

    #[test]
    fn an_event_file_that_is_not_there_says_where_it_went() {
        let absent = EventFile {
            name: "cuda.shm.0.7ffffffe.1".into(),
            dev: crate::driver_files::shm_dev().unwrap(),
            ino: 1,
        };
        let known = Exporter { pid: Some(1), file: Some(absent.clone()) };
        let why = explain(Some(code::MAP_FAILED), Opening::Event, &known, 2).unwrap();
        assert!(why.contains("is gone") && why.contains("--sync memops"), "{why}");

        let elsewhere = Exporter { file: Some(EventFile { dev: u64::MAX, ..absent }), ..known };
        let why = explain(Some(code::MAP_FAILED), Opening::Event, &elsewhere, 2).unwrap();
        assert!(why.contains("has another") && why.contains("--ipc=container"), "{why}");

        let unknown = explain(Some(code::MAP_FAILED), Opening::Event, &exporter(1), 2).unwrap();
        assert!(unknown.contains("/dev/shm of its own"), "{unknown}");
    }

    #[test]
    fn a_collision_is_another_inode_behind_the_name() {
        let theirs = EventFile { name: "cuda.shm.0.1.1".into(), dev: 5, ino: 43 };
        let exporter = Exporter { pid: Some(1), file: Some(theirs.clone()) };
        assert!(collision(&exporter, Some(&theirs)).is_none());
        assert!(collision(&exporter, None).is_none(), "nothing seen: nothing to compare");
        let replaced = EventFile { ino: 44, ..theirs };
        let error = collision(&exporter, Some(&replaced)).unwrap().to_string();
        assert!(
            error.contains("inode 44") && error.contains("inode 43") && error.contains("same pid number"),
            "{error}"
        );
    }
}
