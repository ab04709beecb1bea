//! The phases of a run, in the order a run goes through them: one list for the timings, the watchdog's
//! report of where each process was, and the places a test fault can strike. A leaf.

pub(crate) mod fault;
pub(crate) mod timings;

/// One phase of the parent's or a child's run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A child maps the parent's segment and checks it.
    Attach,
    /// `cuInit` (and, for the parent, creating the segment).
    CudaStart,
    /// A child waits for the parent to choose the devices: the first device's children start before it has.
    WaitPlan,
    /// Creating the device's context (and a child's stream).
    Context,
    /// The parent chooses the devices and enables peer access.
    DeviceSelection,
    /// The parent starts its children.
    StartChildren,
    /// The parent allocates and exports every buffer and event.
    AllocateExport,
    /// A child loads the kernel and prepares its host buffer.
    Prepare,
    /// A child waits until every handle is in the segment.
    WaitReady,
    /// A child opens every other process's buffer and event.
    OpenHandles,
    /// The round-robin of kernels, events and barriers.
    RoundRobin,
    /// A child copies its own buffer back.
    CopyBack,
    /// A child compares its buffer with the value it must hold (and a parent that checks every buffer
    /// itself, each buffer).
    Verify,
    /// The parent waits for its children.
    WaitChildren,
    /// Closing, freeing and destroying what was opened or made.
    CleanUp,
}

impl Phase {
    pub const ALL: [Phase; 15] = [
        Phase::Attach,
        Phase::CudaStart,
        Phase::WaitPlan,
        Phase::Context,
        Phase::DeviceSelection,
        Phase::StartChildren,
        Phase::AllocateExport,
        Phase::Prepare,
        Phase::WaitReady,
        Phase::OpenHandles,
        Phase::RoundRobin,
        Phase::CopyBack,
        Phase::Verify,
        Phase::WaitChildren,
        Phase::CleanUp,
    ];

    /// The phases the parent of a run enters, where a fault of the parent can strike (see `parent::run`).
    pub const PARENT: &[Phase] = &[
        Phase::CudaStart,
        Phase::DeviceSelection,
        Phase::StartChildren,
        Phase::AllocateExport,
        Phase::WaitChildren,
        Phase::CleanUp,
    ];

    /// ... and those of a parent that checks every buffer itself (`--serve`, `--isolate`).
    pub const PARENT_CHECKING: &[Phase] = &[
        Phase::CudaStart,
        Phase::DeviceSelection,
        Phase::StartChildren,
        Phase::AllocateExport,
        Phase::WaitChildren,
        Phase::Verify,
        Phase::CleanUp,
    ];

    /// The phases a child of a run enters, where its faults can strike (see `child::run`).
    pub const CHILD: &[Phase] = &[
        Phase::Attach,
        Phase::CudaStart,
        Phase::WaitPlan,
        Phase::Context,
        Phase::Prepare,
        Phase::WaitReady,
        Phase::OpenHandles,
        Phase::RoundRobin,
        Phase::CopyBack,
        Phase::Verify,
        Phase::CleanUp,
    ];

    /// The phases the benchmark's producer enters (`bench::run_producer`); its consumer enters none.
    pub const BENCH_PRODUCER: &[Phase] = &[Phase::Attach, Phase::CudaStart, Phase::RoundRobin];

    /// The name in the timings table and the JSON (`round_robin`); fault specs write it with dashes.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Attach => "attach",
            Phase::CudaStart => "cuda_start",
            Phase::WaitPlan => "wait_plan",
            Phase::Context => "context",
            Phase::DeviceSelection => "device_selection",
            Phase::StartChildren => "start_children",
            Phase::AllocateExport => "allocate_export",
            Phase::Prepare => "prepare",
            Phase::WaitReady => "wait_ready",
            Phase::OpenHandles => "open_handles",
            Phase::RoundRobin => "round_robin",
            Phase::CopyBack => "copy_back",
            Phase::Verify => "verify",
            Phase::WaitChildren => "wait_children",
            Phase::CleanUp => "clean_up",
        }
    }

    /// The phase named `name`, with dashes or underscores.
    pub fn from_name(name: &str) -> Option<Phase> {
        let name = name.replace('-', "_");
        Phase::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Its position in [`Phase::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn from_index(index: usize) -> Option<Phase> {
        Phase::ALL.get(index).copied()
    }
}

/// Which process of a run: the parent, or child `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Parent,
    Child(usize),
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Who::Parent => f.write_str("the parent"),
            Who::Child(index) => write!(f, "process {index}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_indices_round_trip() {
        for (i, phase) in Phase::ALL.into_iter().enumerate() {
            assert_eq!(phase.index(), i);
            assert_eq!(Phase::from_index(i), Some(phase));
            assert_eq!(Phase::from_name(phase.name()), Some(phase));
            assert_eq!(Phase::from_name(&phase.name().replace('_', "-")), Some(phase));
        }
        assert_eq!(Phase::from_name("round-robin"), Some(Phase::RoundRobin));
        assert_eq!(Phase::from_name("nowhere"), None);
        assert_eq!(Phase::from_index(Phase::ALL.len()), None);
    }
}
