//! `--isolate`: the container matrix on one machine. The run's processes meet over the socket protocol of
//! `--serve`/`--join`, each in fresh namespaces of the kinds asked for, as processes in containers would:
//! the parent enters its own (unless only the joiners are isolated) and serves the run at a socket in a
//! private directory; each other process is this program again, started by the parent in the internal
//! role `join SOCKET --isolated KINDS` (`role::Isolated`), which enters its namespaces before it does
//! anything else.
//!
//! Where the parent enters namespaces, it does so in this program started again, as every other process
//! of the program is (`relaunch`): the process the user started stays outside, in the user's namespaces,
//! follows the run, and hands its document and ending to `main`, which writes and says them (`outside`).
//!
//! This module owns entering an isolation (`enter`), the process outside (`outside`) and the processes the
//! parent starts that way (`launch`); what an isolation is (the kinds, as typed) is `namespace_kinds`'s, a
//! leaf the parse and the role name it by, and the table of every boundary by every mechanism is `matrix`'s.

mod enter;
pub(crate) mod launch;
mod outside;

pub use enter::enter;
pub(crate) use outside::run_inside;

pub(crate) use crate::os::namespace_kinds::{Isolation, Kind};
