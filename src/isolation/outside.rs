//! The process outside an isolated run: an isolation that includes the parent (`--isolate shm`, `pid`,
//! `container`, ...) runs in this program started again (`@internal run --outside-fd`), which enters its
//! namespaces first thing. The process the user started stays in the user's own namespaces and follows it
//! (`relaunch::follow`):
//! - it passes its stop signal on to the run (which is in a process group of its own, so that a signal to
//!   the user's job reaches it once, through this process);
//! - it passes job control on: Ctrl-Z stops the run, then this process, so that the shell's stopped job is
//!   the whole run; `fg` continues them. The time stopped does not count against its deadline, and a run
//!   whose own watchdog ended it for the time it was stopped says so. `kill -9 %1` of the stopped job leaves
//!   no run stopped: the init of its PID namespace (or, without one, the kernel) continues it, and it stops
//!   in order;
//! - it stops the run at its deadline (`--timeout` and a grace for the run to stop itself): whatever the run
//!   started is killed, and the verdict names a stopped process, where one is;
//! - where the run enters a PID namespace, its process hands the namespace's init over to this one and
//!   ends: the init is this process's child, and no process stands between them;
//! - where the run's processes meet at a socket in a private directory (a network namespace of their own), it
//!   chooses where that directory is made, and removes it should the run leave it: the run's guardian, in
//!   the run's PID namespace, dies with the namespace's init, so an init killed early would leave it;
//! - the run hands its `--json` document back through a pipe, as a run of `--ipc all` does, and `main`
//!   writes it where the user asked (not into the run's private `/dev/shm`, and with the user's own rights,
//!   which a user namespace's root lacks; with `--json -`, to the standard output the user gave, which only
//!   this process holds: the run's descriptor 1 is standard error's copy), then says the verdict.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use nix::sys::signal::Signal;

use crate::ipc::Mechanism;
use crate::outcome::{EXIT_FAILURE, Ending, Outcome};
use crate::report::{self, Status};
use crate::role::{MechanismRun, Role, Run, Served};
use crate::supervise::relaunch::{Ended, Followed, OnDrop, Policies, Relaunch, follow};

/// How long past `--timeout` the run has to stop itself (its watchdog stops its processes within about a
/// second and a half) before the process outside stops it.
const STOP_GRACE: Duration = Duration::from_secs(4);

/// Runs `mechanism` with `run`'s options (its place in a served sequence, `served`, too; a row of the
/// container matrix where `matrix_row`) inside namespaces of `run`'s isolation, and follows it until it
/// ends (see the module's doc). Returns how it ended, as its document says, with that document, for `main`
/// to write and say.
pub(crate) fn run_inside(
    run: &Run,
    mechanism: Mechanism,
    served: Option<&Served>,
    matrix_row: bool,
) -> Result<report::RoleEnd> {
    crate::os::signals::take_job_control()?;
    let mut launch = Relaunch::new("the isolated run");
    let report_fd = launch.report_pipe()?;
    let outside_fd = Some(launch.outside_socket()?);
    for &fd in served.map_or(&[][..], |served| &served.fds) {
        launch.keep(fd);
    }
    // Declared before the process: removed (if the run left it) once the process is reaped.
    let socket_dir = LeftBehind::chosen();
    let run = Run { socket_dir: Some(socket_dir.path.clone()), ..run.clone() };
    let inside = MechanismRun {
        mechanism,
        run: run.clone(),
        report_fd,
        served: served.cloned(),
        outside_fd,
        matrix_row,
    };
    launch
        .args(Role::MechanismRun(inside).to_args())
        // A group of its own: a signal to the user's job reaches the run once, through this process; if
        // this process is killed, the run stops in order.
        .own_group()
        .stopped_at_death()?
        .killing_what_it_started()
        .on_drop(OnDrop::Stop { signal: Some(Signal::SIGTERM), grace: STOP_GRACE });
    let started = Instant::now();
    let mut process = launch.spawn()?;
    let policies = Policies {
        deadline: run.timeout.limit().map(|t| started + t + STOP_GRACE),
        stop_grace: STOP_GRACE,
        job_control: true,
    };
    let Followed { ended, late, held, .. } = follow(&mut process, &policies, &mut [])?;
    let pid = process.pid();
    if let Some(stopped) = late {
        let timeout = run.timeout.limit().unwrap_or_default().as_secs();
        let what =
            stopped.map_or_else(|| "it did not stop itself".to_owned(), |who| format!("{who} is stopped"));
        anyhow::bail!(
            "the isolated run (pid {pid}) did not end within --timeout {timeout} s and {} s more: {what}; \
             the process outside stopped it and all it started",
            STOP_GRACE.as_secs()
        );
    }
    let timed_out = run.timeout.limit().is_some_and(|t| started.elapsed() > t);
    Ok(match process.document() {
        Some(document) => {
            let mut ending = document.ending(exit_status(ended));
            // A run past its --timeout whose watchdog counted the time the user held it stopped: say so.
            if ending.status == Status::Failed && timed_out && held >= Duration::from_millis(100) {
                ending.add_to_first_line(&format!(
                    "; the run was held stopped by job control (Ctrl-Z until continued) for {:.1} s, which its \
                     --timeout counted",
                    held.as_secs_f64()
                ));
            }
            report::RoleEnd::handed_back(ending, document)
        }
        None => Outcome::Ended(without_document(exit_status(ended))).into(),
    })
}

/// The path at which the run inside makes its socket's private directory, if it makes one: removed when
/// dropped, should the run have left it (a directory of this user's, never followed if a link).
struct LeftBehind {
    path: PathBuf,
}

impl LeftBehind {
    /// A name in TMPDIR of this process's own (its pid, and the time's nanoseconds).
    fn chosen() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("simple-ipc-{}-outside-{nanos:x}", std::process::id());
        Self { path: std::env::temp_dir().join(name) }
    }
}

impl Drop for LeftBehind {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| meta.is_dir() && meta.uid() == nix::unistd::geteuid().as_raw());
        if ours {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// How a run that ended with `code` and handed back no document ended.
fn without_document(code: i32) -> Ending {
    let (status, why, code) = match u8::try_from(code) {
        Ok(0) | Err(_) => {
            (Status::Failed, "the isolated run ended without its document".to_owned(), EXIT_FAILURE)
        }
        Ok(code) if code > 128 => (
            Status::Interrupted,
            format!("the isolated run was stopped (exit status {code}) before its document"),
            code,
        ),
        Ok(code) => (
            Status::Failed,
            format!("the isolated run ended with exit status {code} without its document"),
            code,
        ),
    };
    Ending::not_passed(status, why, code)
}

/// The exit status `ended` stands for (128+N for signal N, as a shell says it).
fn exit_status(ended: Ended) -> i32 {
    match ended {
        Ended::Exited(code) => code,
        Ended::Killed(signal) => 128 + signal as i32,
        Ended::Lost(_) => i32::from(EXIT_FAILURE),
    }
}
