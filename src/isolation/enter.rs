//! Entering an isolation: this process gets namespaces of its own, before it does anything else (it must
//! still have one thread), as a process started in a container would.
//!
//! - `user` (and any isolation asked by a user who is not root): a user namespace in which this user is
//!   root, so that the other namespaces need no privilege where the kernel allows user namespaces.
//! - `shm`: a mount namespace with an empty tmpfs on `/dev/shm`, private to this process and its children.
//! - `pid`: a PID namespace, with a /proc of its own (in a mount namespace). Its first process is a small
//!   init (as Docker's `--init`) and the run's process is the second, so that every isolated process has the
//!   same pid number, 2, as containers' first processes share 1; the init reaps, passes stop signals on, and
//!   outlives the run's process until everything it started has ended (the guardian that removes the
//!   driver's files among them). These are the two forks a new PID namespace needs. The process that entered
//!   the namespace hands the init over to the process that started it (a child subreaper, which follows it
//!   from then on) and ends; if that process dies, the init stops the run in order.
//!
//! What cannot be had is a [`Waiver`], which the run reports as a waiver with the reason.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MsFlags, mount};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::stat::Mode;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getegid, geteuid, setsid};

use super::{Isolation, Kind};
use crate::os::signals::{self, STOP_SIGNALS};
use crate::outcome::Waiver;

fn unavailable(kind: &str, error: Errno) -> anyhow::Error {
    let why = match error {
        Errno::EPERM => "not permitted: it needs root, or user namespaces (--isolate user), which this host \
                         does not allow either"
            .to_owned(),
        Errno::EINVAL => "this kernel has no such namespace".to_owned(),
        other => other.to_string(),
    };
    Waiver(format!("this host gives this process no {kind} namespace of its own ({why})")).into()
}

/// How long the init gives the run's process to stop in order, once the process outside is gone (a parent
/// gives the processes it started 0.7 s to end).
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long the init waits, after the run's process ended, for what it left (its guardian removes the
/// driver's files within milliseconds); whatever is left then ends with the namespace.
const LEFT_GRACE: Duration = Duration::from_secs(1);

/// Puts this process into fresh namespaces of the kinds `isolation` asks for (nothing for none). With
/// `pid`, this returns in the namespace's second process; the process that called it never returns: it
/// says the init's pid on the socket the process that started it gave it (`outside`, see
/// `relaunch::Relaunch::outside_socket`) and ends, and that process adopts the init.
pub fn enter(isolation: &Isolation, outside: OwnedFd) -> Result<()> {
    if isolation.kinds.is_empty() {
        return Ok(());
    }
    ensure_one_thread()?;
    let (uid, gid) = (geteuid(), getegid());
    if isolation.has(Kind::User) || !uid.is_root() {
        unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| unavailable("user", e))?;
        map_to_root(uid.as_raw(), gid.as_raw())?;
    }
    for &kind in &isolation.kinds {
        let flag = match kind {
            // The CUDA driver fails in a PID namespace whose /proc is another's (cuInit answers
            // CUDA_ERROR_OPERATING_SYSTEM): the namespace gets a /proc of its own, in a mount namespace.
            Kind::Pid => CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS,
            Kind::Shm => CloneFlags::CLONE_NEWNS,
            Kind::Ipc => CloneFlags::CLONE_NEWIPC,
            Kind::Net => CloneFlags::CLONE_NEWNET,
            Kind::Uts => CloneFlags::CLONE_NEWUTS,
            Kind::Cgroup => CloneFlags::CLONE_NEWCGROUP,
            Kind::User => continue,
        };
        unshare(flag).map_err(|e| unavailable(kind.name(), e))?;
    }
    if isolation.has(Kind::Shm) || isolation.has(Kind::Pid) {
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
            .context("making this mount namespace's mounts private")?;
    }
    if isolation.has(Kind::Shm) {
        own_dev_shm()?;
    }
    if isolation.has(Kind::Pid) {
        become_second_process(outside)?;
    }
    Ok(())
}

/// Namespaces (a user namespace above all) can be entered only by a process of one thread.
pub(super) fn ensure_one_thread() -> Result<()> {
    let threads = std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(1);
    ensure!(threads == 1, "internal error: namespaces are entered before any thread starts ({threads} run)");
    Ok(())
}

/// In the new user namespace, this process's user and group are root (and only they are mapped).
fn map_to_root(uid: u32, gid: u32) -> Result<()> {
    let write = |file: &str, text: String| {
        std::fs::write(file, text).with_context(|| format!("writing {file} for a user namespace"))
    };
    // Groups cannot be set in a namespace whose group map an unprivileged process wrote.
    match std::fs::write("/proc/self/setgroups", "deny") {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).context("writing /proc/self/setgroups for a user namespace");
        }
        _ => {}
    }
    write("/proc/self/uid_map", format!("0 {uid} 1"))?;
    write("/proc/self/gid_map", format!("0 {gid} 1"))
}

/// An empty /dev/shm of this mount namespace's own, which no mount outside sees.
fn own_dev_shm() -> Result<()> {
    mount(Some("tmpfs"), "/dev/shm", Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("mode=1777"))
        .map_err(|e| unavailable("/dev/shm (a tmpfs mounted on it)", e))
}

/// The first process of a PID namespace mounts its /proc, as a container's runtime does. The simulated
/// driver keeps the /proc it had (see `driver::host::keep_outer_proc`).
fn own_proc() -> Result<()> {
    if crate::driver::host::requested() {
        let outer =
            nix::fcntl::open("/proc", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
                .context("opening /proc")?;
        crate::driver::host::keep_outer_proc(outer);
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), "/proc", Some("proc"), flags, None::<&str>).map_err(|e| unavailable("/proc", e))
}

/// The stop signals this process passes on: those its invoker did not leave ignored (see `signals`).
pub(super) fn passed_on_signals() -> Result<SigSet> {
    let mut set = SigSet::empty();
    for signal in STOP_SIGNALS {
        if !signals::is_ignored(signal)? {
            set.add(signal);
        }
    }
    Ok(set)
}

/// After `unshare(CLONE_NEWPID)` the namespace begins with this process's next child: that child becomes
/// the init, whose child in turn is the run's process, which returns from here. This process hands the
/// init over to the process outside (`outside`) and ends.
fn become_second_process(outside: OwnedFd) -> Result<()> {
    let mut waited = passed_on_signals()?;
    waited.add(Signal::SIGCHLD);
    let before =
        waited.thread_swap_mask(SigmaskHow::SIG_BLOCK).context("blocking signals to pass them on")?;
    // The init knows that the process outside lives while this socket is open.
    // SAFETY: this process has one thread (checked by `enter`), so the child may run any code.
    let forked = unsafe { fork() }.context("fork into the new PID namespace")?;
    if let ForkResult::Parent { child } = forked {
        hand_over(child, &outside)
    }
    let outside_lives = outside;
    own_proc()?;
    // The init: its own session, so that a kill of the invoker's process group reaches the process outside
    // only, and the init can then stop the run in order instead of dying with everything in the namespace.
    setsid().context("setsid in the init of a PID namespace")?;
    // SAFETY: as above: one thread.
    match unsafe { fork() }.context("fork of the run's process in its PID namespace")? {
        ForkResult::Parent { child } => be_init(child, &waited, outside_lives),
        ForkResult::Child => {
            drop(outside_lives);
            before.thread_set_mask().context("restoring the signal mask")?;
            Ok(())
        }
    }
}

/// Says the init's pid to the process outside, which adopts it (a child subreaper), and ends: no process
/// stays between them only to pass signals on. Where it cannot be said, the init is killed.
fn hand_over(init: Pid, socket: &OwnedFd) -> ! {
    match nix::unistd::write(socket, &init.as_raw().to_ne_bytes()) {
        Ok(4) => exit_now(0),
        _ => {
            let _ = kill(init, Signal::SIGKILL);
            exit_now(1)
        }
    }
}

/// The exit status that a child's end stands for (128+N for signal N, as a shell says it).
fn status_of(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, signal, _) => Some(128 + signal as i32),
        _ => None,
    }
}

/// The init of the PID namespace: reaps every process that ends in it, passes stop signals on to the run's
/// process, stops it in order when the process outside is gone (continuing first what that process held
/// stopped: Ctrl-Z, then `kill -9 %1`), and exits with its status once everything else has ended (or
/// [`LEFT_GRACE`] after it). The init itself is never held stopped (see `outside`).
fn be_init(run: Pid, waited: &SigSet, outside_lives: OwnedFd) -> ! {
    let Ok(signals) = SignalFd::with_flags(waited, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) else {
        let _ = kill(run, Signal::SIGKILL);
        exit_now(1);
    };
    let mut ended: Option<(i32, Instant)> = None;
    let mut outside_gone: Option<Instant> = None;
    loop {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(status) => {
                    if status.pid() == Some(run)
                        && let Some(code) = status_of(status)
                    {
                        ended = Some((code, Instant::now()));
                    }
                }
                Err(Errno::EINTR) => {}
                // Nothing left in the namespace.
                Err(_) => exit_now(ended.map_or(1, |(code, _)| code)),
            }
        }
        if let Some((code, at)) = ended
            && at.elapsed() > LEFT_GRACE
        {
            exit_now(code);
        }
        if let Some(at) = outside_gone
            && ended.is_none()
            && at.elapsed() > STOP_GRACE
        {
            let _ = kill(run, Signal::SIGKILL);
        }
        let mut fds = [
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
            PollFd::new(outside_lives.as_fd(), PollFlags::POLLIN),
        ];
        let watched = if outside_gone.is_some() { 1 } else { 2 };
        let _ = poll(&mut fds[..watched], PollTimeout::from(100u8));
        let outside_hung_up = watched == 2
            && fds[1].revents().is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
        while let Ok(Some(info)) = signals.read_signal() {
            let signal = Signal::try_from(info.ssi_signo as i32).ok();
            if let Some(signal) = signal.filter(|&s| s != Signal::SIGCHLD)
                && ended.is_none()
            {
                let _ = kill(run, signal);
            }
        }
        if outside_hung_up {
            outside_gone = Some(Instant::now());
            for pid in crate::os::proc_stat::descendants(nix::unistd::getpid()) {
                let _ = kill(pid, Signal::SIGCONT);
            }
            if ended.is_none() {
                let _ = kill(run, Signal::SIGTERM);
            }
        }
    }
}

/// Ends this process at once: it printed nothing, and a copy of the buffers it was forked with is not its
/// to flush.
fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process without running anything of it; always sound.
    unsafe { nix::libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace the host does not give is said as such, with what would give it.
    #[test]
    fn an_unavailable_namespace_says_which_and_why() {
        let refused = unavailable("pid", Errno::EPERM);
        assert!(refused.is::<Waiver>(), "a waiver, not a failure");
        let said = refused.to_string();
        assert!(said.contains("no pid namespace of its own") && said.contains("needs root"), "{said}");
        let missing = unavailable("cgroup", Errno::EINVAL).to_string();
        assert!(
            missing.contains("no cgroup namespace") && missing.contains("no such namespace"),
            "{missing}"
        );
    }
}
