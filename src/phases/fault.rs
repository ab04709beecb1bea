//! Test-only fault injection: `SIMPLE_IPC_TEST_FAULT=<who>@<phase>:<action>` makes one process fail at one
//! named phase, so that the tests and the GPU check can prove that every failure stops the whole run.
//!
//! `<who>` is `parent` or `child<N>`; `<phase>` one of [`Phase`]'s names (`round-robin` or `round_robin`):
//! the fault strikes when that process enters that phase. `<action>` is `kill` (the process sends itself
//! SIGKILL, like a crash or `kill -9`), `error` (it fails with an error), `hang` (it sleeps until killed),
//! `stop` (it sends itself SIGSTOP, like a process stopped in a debugger) or, at `verify` only, `corrupt`
//! (two bytes of the copied-back buffer are changed before the comparison, which must then fail), or, at
//! `round-robin` only, `lie` (the process writes nothing, checks nothing, and says it finished and ended well:
//! only a parent that checks every buffer itself, with `--serve` or `--isolate`, can tell, and it must); the
//! parent, at `allocate-export`, can also mistreat the descriptors of `--ipc vmm` and `pool`: `send-fewer`
//! (one descriptor too few), `send-none` (the message without descriptors), `close-socket` (none sent). A value
//! that is malformed, or that cannot strike in the run it is given to, is refused, so a typo cannot silently
//! test nothing; nothing happens unless the variable is set, and a fault that strikes says so on stderr.
//!
//! Whether a fault can strike is derived from where faults strike: a process's [`Stopwatch`] calls [`at`]
//! for every phase it enters, and each role declares the phases it enters ([`Phase::PARENT`],
//! [`Phase::CHILD`], [`Phase::BENCH_PRODUCER`]; [`at`] checks, in debug builds, that no process enters a
//! phase its list lacks). So a fault is refused when its process is not in the run, when that process never
//! enters its phase (the parent has no `verify`), or when its action has nothing to act on there (the
//! descriptor faults where the parent sends no descriptors, as with legacy IPC).
//!
//! [`Stopwatch`]: crate::phases::timings::Stopwatch

use std::ops::Range;

use anyhow::{Result, anyhow, bail, ensure};

use crate::phases::{Phase, Who};

pub const FAULT_ENV: &str = "SIMPLE_IPC_TEST_FAULT";

/// Where a fault can strike in one run: the indices of its children, the phases its parent and each child
/// enter, and whether the parent sends descriptors over sockets (vmm and pool).
#[derive(Clone, Debug)]
pub struct Targets {
    pub children: Range<usize>,
    pub parent: &'static [Phase],
    pub child: &'static [Phase],
    pub parent_sends_descriptors: bool,
    /// The parent checks every buffer itself (`--serve`, `--isolate`), so a process that lies can be caught.
    pub parent_checks_buffers: bool,
}

impl Targets {
    /// A run of no phase at all (`--topology`): no fault can strike.
    pub const NONE: Targets = Targets {
        children: 0..0,
        parent: &[],
        child: &[],
        parent_sends_descriptors: false,
        parent_checks_buffers: false,
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Kill,
    Error,
    Hang,
    Stop,
    Corrupt,
    Lie,
    Descriptors(DescriptorFault),
}

/// What the parent does wrong with the descriptors it sends (test faults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescriptorFault {
    /// One descriptor fewer than the message declares.
    SendFewer,
    /// The message, without any descriptor.
    SendNone,
    /// Nothing: the socket is closed.
    CloseSocket,
}

fn parse(spec: &str) -> Result<(Who, Phase, Action)> {
    let bad = || {
        anyhow!(
            "{FAULT_ENV}={spec:?}: expected <parent|childN>@<phase>:<fault>, the fault one of kill, error, hang, \
             stop; corrupt (at verify); lie (a child, at round-robin); send-fewer, send-none, close-socket (the \
             parent, at allocate-export)"
        )
    };
    let (who, rest) = spec.split_once('@').ok_or_else(bad)?;
    let (phase, action) = rest.split_once(':').ok_or_else(bad)?;
    let who = match who {
        "parent" => Who::Parent,
        child => Who::Child(child.strip_prefix("child").and_then(|n| n.parse().ok()).ok_or_else(bad)?),
    };
    let phase = Phase::from_name(phase).ok_or_else(bad)?;
    let action = match action {
        "kill" => Action::Kill,
        "error" => Action::Error,
        "hang" => Action::Hang,
        "stop" => Action::Stop,
        "corrupt" if phase == Phase::Verify => Action::Corrupt,
        "lie" if phase == Phase::RoundRobin && who != Who::Parent => Action::Lie,
        "send-fewer" | "send-none" | "close-socket"
            if who == Who::Parent && phase == Phase::AllocateExport =>
        {
            Action::Descriptors(match action {
                "send-fewer" => DescriptorFault::SendFewer,
                "send-none" => DescriptorFault::SendNone,
                _ => DescriptorFault::CloseSocket,
            })
        }
        _ => return Err(bad()),
    };
    Ok((who, phase, action))
}

/// Checks the variable once at start-up, so that a malformed value fails the run at once.
pub fn validate_env() -> Result<()> {
    match std::env::var(FAULT_ENV) {
        Ok(spec) => parse(&spec).map(drop),
        Err(_) => Ok(()),
    }
}

/// Refuses the configured fault unless it can strike in this run (see the module's doc): the role checks it
/// once it knows its processes, before anything of the run happens.
pub fn validate_for(run: &Targets) -> Result<()> {
    let Ok(spec) = std::env::var(FAULT_ENV) else { return Ok(()) };
    let (who, phase, action) = parse(&spec)?;
    let phases = match who {
        Who::Parent => run.parent,
        Who::Child(index) => {
            ensure!(
                run.children.contains(&index),
                "{FAULT_ENV}={spec:?} cannot strike: it names process {index}, but this run has {}",
                match (run.children.start, run.children.end.checked_sub(1)) {
                    (first, Some(last)) if first <= last => format!("processes {first} to {last}"),
                    _ => "no child processes".to_owned(),
                }
            );
            run.child
        }
    };
    ensure!(
        phases.contains(&phase),
        "{FAULT_ENV}={spec:?} cannot strike: {who} does not enter {} in this run{}",
        phase.name(),
        match phases {
            [] => " (it enters no phase)".to_owned(),
            _ => format!(" (it enters {})", phases.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")),
        }
    );
    if action == Action::Lie {
        ensure!(
            run.parent_checks_buffers,
            "{FAULT_ENV}={spec:?} cannot strike: the parent of this run trusts its own children's word (only \
             the parent of --serve or --isolate checks every buffer itself)"
        );
    }
    if let Action::Descriptors(_) = action {
        ensure!(
            run.parent_sends_descriptors,
            "{FAULT_ENV}={spec:?} cannot strike: the parent of this run sends no descriptors (only --ipc vmm \
             and pool send them)"
        );
    }
    Ok(())
}

/// Injects the configured fault if it names this process and phase.
pub fn at(who: Who, phase: Phase) -> Result<()> {
    debug_assert!(
        match who {
            Who::Parent => Phase::PARENT_CHECKING,
            Who::Child(_) => Phase::CHILD,
        }
        .contains(&phase),
        "{who} entered {}, which its role's list of phases lacks (phase.rs)",
        phase.name()
    );
    let Ok(spec) = std::env::var(FAULT_ENV) else {
        return Ok(());
    };
    let (target, at, action) = parse(&spec)?;
    if target != who
        || at != phase
        || matches!(action, Action::Corrupt | Action::Lie | Action::Descriptors(_))
    {
        return Ok(());
    }
    eprint_line!("test fault: {spec} strikes");
    match action {
        Action::Kill => {
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL)?;
            bail!("SIGKILL did not end the process")
        }
        Action::Error => bail!("injected fault ({spec})"),
        Action::Hang => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        Action::Stop => {
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP)?;
            Ok(())
        }
        Action::Corrupt | Action::Lie | Action::Descriptors(_) => Ok(()),
    }
}

/// The descriptor fault the parent is asked to commit, if any (it says so on stderr).
pub fn descriptor_fault() -> Option<DescriptorFault> {
    let spec = std::env::var(FAULT_ENV).ok()?;
    match parse(&spec) {
        Ok((Who::Parent, Phase::AllocateExport, Action::Descriptors(fault))) => {
            eprint_line!("test fault: {spec} strikes");
            Some(fault)
        }
        _ => None,
    }
}

/// Whether the configured fault is one of the parent's descriptor faults, which only a mechanism that sends
/// descriptors can suffer (`--ipc all` gives it to those runs alone).
pub fn needs_descriptors() -> bool {
    let Ok(spec) = std::env::var(FAULT_ENV) else { return false };
    matches!(parse(&spec), Ok((_, _, Action::Descriptors(_))))
}

/// The `lie` fault: whether it names this process (it says so on stderr).
pub fn lies(who: Who) -> bool {
    let Ok(spec) = std::env::var(FAULT_ENV) else { return false };
    let lies = matches!(parse(&spec), Ok((target, _, Action::Lie)) if target == who);
    if lies {
        eprint_line!("test fault: {spec} strikes");
    }
    lies
}

/// The `corrupt` fault: if it names this process, says so and changes two bytes of the copied-back buffer
/// (which must hold `expected` everywhere), so that the verification must fail: [`corrupt`]'s, where they
/// fall in `data`, the buffer's bytes from offset `at` of `whole` (a buffer copied back a part at a time
/// has each part given here). It works on a GPU as on the simulation, so the GPU check can prove that a
/// wrong buffer is a failure.
pub fn corrupt_if_asked(who: Who, data: &mut [u8], at: usize, whole: usize, expected: u8) {
    let Ok(spec) = std::env::var(FAULT_ENV) else { return };
    if !matches!(parse(&spec), Ok((target, Phase::Verify, Action::Corrupt)) if target == who) {
        return;
    }
    if at == 0 {
        eprint_line!("test fault: {spec} strikes");
    }
    corrupt(data, at, whole, expected);
}

/// The `corrupt` fault's two bytes of a buffer of `whole` bytes, the one a third of the way in and the
/// last (so that a check that stops short of the end cannot pass), changed where they fall in `data`, the
/// buffer's bytes from offset `at`.
pub fn corrupt(data: &mut [u8], at: usize, whole: usize, expected: u8) {
    let last = whole.saturating_sub(1);
    for (offset, value) in [(last / 3, expected.wrapping_add(7)), (last, expected.wrapping_add(1))] {
        if let Some(byte) = offset.checked_sub(at).and_then(|i| data.get_mut(i)) {
            *byte = value;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_part_and_rejects_typos() {
        assert_eq!(
            parse("child3@round-robin:kill").unwrap(),
            (Who::Child(3), Phase::RoundRobin, Action::Kill)
        );
        assert_eq!(
            parse("parent@wait-children:hang").unwrap(),
            (Who::Parent, Phase::WaitChildren, Action::Hang)
        );
        assert_eq!(parse("child0@verify:corrupt").unwrap(), (Who::Child(0), Phase::Verify, Action::Corrupt));
        assert_eq!(parse("child1@round-robin:lie").unwrap(), (Who::Child(1), Phase::RoundRobin, Action::Lie));
        assert_eq!(parse("child2@wait_ready:stop").unwrap(), (Who::Child(2), Phase::WaitReady, Action::Stop));
        assert_eq!(
            parse("parent@allocate-export:send-fewer").unwrap().2,
            Action::Descriptors(DescriptorFault::SendFewer)
        );
        for bad in [
            "child@attach:kill",
            "child1@atach:kill",
            "child1@attach:explode",
            "child1attach:kill",
            "child1@attach:corrupt",
            "child1@verify:lie",
            "parent@round-robin:lie",
            "child1@allocate-export:send-none",
            "parent@verify:close-socket",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
        // The refusal lists every fault there is.
        let said = parse("child0@verify:nope").unwrap_err().to_string();
        for fault in
            ["kill", "error", "hang", "stop", "corrupt", "lie", "send-fewer", "send-none", "close-socket"]
        {
            assert!(said.contains(fault), "{fault}: {said}");
        }
    }
}
