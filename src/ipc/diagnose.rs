//! Why opening another process's legacy handle failed, said from evidence, with the least sharing that
//! fixes it. What the driver answers across namespaces was measured on the H200 host (driver 580):
//! - a legacy memory or event handle fails with `CUDA_ERROR_INVALID_CONTEXT` exactly when the importer's
//!   pid number equals the exporter's (each in a PID namespace of its own: the driver takes the handle for
//!   one of its own);
//! - a legacy event fails with `CUDA_ERROR_MAP_FAILED` when the driver's file for it is not in the
//!   importer's `/dev/shm`: another `/dev/shm`, or the name gone or replaced by a process of the same pid
//!   number elsewhere; or when the importer is another uid (as it sees itself) than the exporter, whose uid
//!   names the file (`cuda.shm.<uid>.<pid>.<n>`): the driver looks for it under the importer's own
//!   (measured 2026-12-07);
//! - memory handles, VMM and pool descriptors do not depend on `/dev/shm`.
//!
//! Blanket advice (`--ipc=host`) is wrong for most of these; each message names only what its case needs.

use crate::driver::{code, failed_code};
use crate::os::driver_files::{EventFile, NameNow};

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

const SAME_PID_FIX: &str = "one PID namespace for both (Docker --pid=container:NAME or --pid=host, \
    Kubernetes shareProcessNamespace: true), or an init process that gives them different pids";
/// What else fixes the same pid number, for each kind of handle: the one thing that needs no such handle.
const SAME_PID_MEMORY: &str = "or --ipc vmm or pool, which share the memory by descriptor";
const SAME_PID_EVENT: &str = "or --sync memops, which orders without interprocess events";
const SHM_FIX: &str = "share /dev/shm (Docker --ipc=container:NAME or --ipc=host, or the same pod), or --sync \
    memops, which needs no interprocess event";
const COLLISION: &str = "Processes of the same pid number in PID namespaces that share /dev/shm (containers \
    with --ipc=host, pods with hostIPC) make the same names for their events' files, each replacing the \
    other's";
const COLLISION_FIX: &str = "run them in one PID namespace, or use --sync memops, which needs no such file";
const UID_FIX: &str = "one user for both, in one user namespace mapping (Docker --user with the exporter's uid, \
    --userns=host; Kubernetes runAsUser, hostUsers: true), or --sync memops, which needs no interprocess event";

/// An explanation of a failure, from evidence: what happened and the least change that fixes it. It reads
/// as one message (an error's context); the `--json` document carries its two parts as fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnosis {
    pub cause: String,
    pub fix: String,
    /// The whole message, as the user reads it.
    said: String,
}

impl Diagnosis {
    /// The message `cause`, `joint`, `fix`.
    pub fn new(cause: String, joint: &str, fix: String) -> Self {
        Self { said: format!("{cause}{joint}{fix}"), cause, fix }
    }
}

impl std::fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.said)
    }
}

impl std::error::Error for Diagnosis {}

/// The explanation of a failed open, added to `error` where the evidence supports one.
pub fn open_failed(error: anyhow::Error, opening: Opening, exporter: &Exporter) -> anyhow::Error {
    let uid = nix::unistd::getuid().as_raw();
    match explain(failed_code(&error), opening, exporter, (std::process::id(), uid)) {
        Some(why) => error.context(why),
        None => error,
    }
}

/// Why an open failed, for a process that is pid `me` and uid `my_uid` as it sees itself.
fn explain(
    code: Option<u32>,
    opening: Opening,
    exporter: &Exporter,
    (me, my_uid): (u32, u32),
) -> Option<Diagnosis> {
    let code = code?;
    if code == code::INVALID_CONTEXT && exporter.pid == Some(me) {
        let cause = format!(
            "this process and the handle's exporter are both pid {me}, each in a PID namespace of its own: \
             the driver takes the handle for one of its own"
        );
        let other = if opening == Opening::Event { SAME_PID_EVENT } else { SAME_PID_MEMORY };
        return Some(Diagnosis::new(cause, "; what fixes it: ", format!("{SAME_PID_FIX}; {other}")));
    }
    if opening != Opening::Event || code != code::MAP_FAILED {
        return None;
    }
    let Some(file) = &exporter.file else {
        let cause = "the driver could not map the event's file in /dev/shm, where its exporter made it";
        let fix = format!("if this process has a /dev/shm of its own, {SHM_FIX}");
        return Some(Diagnosis {
            said: format!("{cause}: if this process has a /dev/shm of its own, what fixes it: {SHM_FIX}"),
            cause: cause.into(),
            fix,
        });
    };
    let path = file.path().display().to_string();
    // The driver looks for `cuda.shm.<its own uid>.<pid>.<n>`: another uid's file is never found.
    let theirs = file.name.split('.').nth(2).and_then(|uid| u32::from_str_radix(uid, 16).ok());
    if let Some(theirs) = theirs.filter(|theirs| *theirs != my_uid) {
        return Some(Diagnosis::new(
            format!(
                "the event's file {path} is named by its exporter's uid ({theirs}), and this process is uid {my_uid} \
                 as it sees itself (another user, or a user namespace that maps it otherwise): the driver looks \
                 for the file under its own uid"
            ),
            ": what fixes it: ",
            UID_FIX.into(),
        ));
    }
    Some(match file.name_now() {
        NameNow::OtherShm => Diagnosis::new(
            format!("the event's file {path} is in its exporter's /dev/shm, and this process has another"),
            ": what fixes it: ",
            SHM_FIX.into(),
        ),
        NameNow::Absent => Diagnosis::new(
            format!(
                "the event's file {path} is gone from the /dev/shm this process shares with its exporter: \
                 its exporter's run ended, or another process removed it. {COLLISION}"
            ),
            ": ",
            COLLISION_FIX.into(),
        ),
        NameNow::Replaced { ino } => Diagnosis::new(
            format!(
                "the name of the event's file {path} is another file now (inode {ino}, the exporter's is {}). \
                 {COLLISION}",
                file.ino
            ),
            ": ",
            COLLISION_FIX.into(),
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
        let cause = format!(
            "the event opened is another process's: this process mapped {} as inode {}, its exporter made it \
             as inode {}; a process of the same pid number ({pid}) elsewhere made that name again. {COLLISION}",
            mine.path().display(),
            mine.ino,
            theirs.ino
        );
        anyhow::Error::new(Diagnosis::new(cause, ": ", COLLISION_FIX.into()))
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
        let diagnosis =
            explain(Some(code::INVALID_CONTEXT), Opening::LegacyMemory, &exporter(1), (1, 0)).unwrap();
        let why = diagnosis.to_string();
        assert!(why.contains("both pid 1") && why.contains("--pid=container"), "{why}");
        assert!(
            why.contains("--ipc vmm") && !why.contains("memops"),
            "a memory handle: by descriptor: {why}"
        );
        let event =
            explain(Some(code::INVALID_CONTEXT), Opening::Event, &exporter(1), (1, 0)).unwrap().to_string();
        assert!(event.contains("--sync memops") && !event.contains("--ipc vmm"), "an event: memops: {event}");
        assert!(!why.contains("--ipc=host"), "{why}");
        // The message as the user reads it, and its two parts for the --json document.
        assert_eq!(why, format!("{}; what fixes it: {}", diagnosis.cause, diagnosis.fix));
        assert!(diagnosis.cause.ends_with("for one of its own"), "{}", diagnosis.cause);
        assert!(
            diagnosis.fix.starts_with("one PID namespace for both")
                && diagnosis.fix.contains("pids; or --ipc vmm")
        );
        assert_eq!(explain(Some(code::INVALID_CONTEXT), Opening::LegacyMemory, &exporter(1), (2, 0)), None);
        assert_eq!(explain(Some(code::MAP_FAILED), Opening::LegacyMemory, &exporter(1), (2, 0)), None);
        assert_eq!(explain(None, Opening::Event, &exporter(1), (1, 0)), None);
    }

    #[test]
    fn an_event_file_that_is_not_there_says_where_it_went() {
        let absent = EventFile {
            name: "cuda.shm.0.7ffffffe.1".into(),
            dev: crate::os::driver_files::shm_dev().unwrap(),
            ino: 1,
        };
        let known = Exporter { pid: Some(1), file: Some(absent.clone()) };
        let diagnosis = explain(Some(code::MAP_FAILED), Opening::Event, &known, (2, 0)).unwrap();
        let why = diagnosis.to_string();
        assert!(why.contains("is gone") && why.contains("--sync memops"), "{why}");
        assert!(diagnosis.cause.ends_with("each replacing the other's"), "{}", diagnosis.cause);
        assert!(why.ends_with("each replacing the other's: run them in one PID namespace, or use --sync memops, which needs no such file"), "{why}");

        let elsewhere = Exporter { file: Some(EventFile { dev: u64::MAX, ..absent }), ..known };
        let diagnosis = explain(Some(code::MAP_FAILED), Opening::Event, &elsewhere, (2, 0)).unwrap();
        let why = diagnosis.to_string();
        assert!(why.contains("has another") && why.contains("--ipc=container"), "{why}");
        assert!(
            why.contains("has another: what fixes it: share /dev/shm (Docker")
                && diagnosis.fix.starts_with("share"),
            "{why}"
        );

        // Another uid than the exporter's, whatever else: the driver looks for the file under its own uid.
        let other_uid = explain(Some(code::MAP_FAILED), Opening::Event, &elsewhere, (2, 65534)).unwrap();
        assert!(
            other_uid.cause.contains("named by its exporter's uid (0), and this process is uid 65534"),
            "{other_uid}"
        );
        assert!(
            other_uid.fix.starts_with("one user for both") && other_uid.fix.contains("--sync memops"),
            "{other_uid}"
        );

        let unknown = explain(Some(code::MAP_FAILED), Opening::Event, &exporter(1), (2, 0)).unwrap();
        assert!(unknown.to_string().contains("made it: if this process has a /dev/shm of its own, what fixes it: share /dev/shm (Docker --ipc=container:NAME or --ipc=host, or the same pod), or --sync memops"), "{unknown}");
        assert!(
            unknown.fix.starts_with("if this process has a /dev/shm of its own, share"),
            "{}",
            unknown.fix
        );
    }

    /// `main` finds the diagnosis in the error it ends with, under the context added on the way up.
    #[test]
    fn the_diagnosis_of_a_failed_open_is_found_under_later_context() {
        let failed = crate::driver::CallFailed {
            call: "cuIpcOpenMemHandle".into(),
            code: code::INVALID_CONTEXT,
            text: "CUDA_ERROR_INVALID_CONTEXT".into(),
            beyond_the_simulation: false,
        };
        let opened = open_failed(failed.into(), Opening::LegacyMemory, &exporter(std::process::id()));
        let error = opened.context("opening process 1's buffer");
        let diagnosis = error.downcast_ref::<Diagnosis>().expect("found under the context");
        assert!(
            diagnosis.cause.contains("both pid") && diagnosis.fix.contains("--pid=host"),
            "{diagnosis:?}"
        );
        assert!(format!("{error:#}").contains("what fixes it: one PID namespace"), "{error:#}");
    }

    #[test]
    fn a_collision_is_another_inode_behind_the_name() {
        let theirs = EventFile { name: "cuda.shm.0.1.1".into(), dev: 5, ino: 43 };
        let exporter = Exporter { pid: Some(1), file: Some(theirs.clone()) };
        assert!(collision(&exporter, Some(&theirs)).is_none());
        assert!(collision(&exporter, None).is_none(), "nothing seen: nothing to compare");
        let replaced = EventFile { ino: 44, ..theirs };
        let error = collision(&exporter, Some(&replaced)).unwrap();
        let diagnosis = error.downcast_ref::<Diagnosis>().expect("a diagnosis the --json document can carry");
        assert_eq!(diagnosis.fix, COLLISION_FIX);
        let error = error.to_string();
        assert!(
            error.contains("inode 44") && error.contains("inode 43") && error.contains("same pid number"),
            "{error}"
        );
    }
}
