//! Starting and watching the run's processes: the one way to start a process of this program (`relaunch`),
//! the guardian that removes a killed run's files, the watchdog of `--timeout`, the parent's peers (children
//! and joiners, one wait loop), the time a process was held stopped, and a peer killed by SIGBUS. It may
//! import the run's data (segment, wire, report) and the ground floor (`os`), never the story or a mode.

pub(crate) mod guardian;
pub(crate) mod held;
pub(crate) mod peers;
pub(crate) mod relaunch;
pub(crate) mod sigbus;
pub(crate) mod watchdog;
