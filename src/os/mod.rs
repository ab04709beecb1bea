//! What this program uses of the operating system, with no CUDA and nothing of a run in it: signals and how
//! a process stops, descriptors inherited across exec, `/proc` (a process's parent, its access check, its
//! container), namespaces by kind, NUMA nodes, futexes, and the CUDA driver's files in `/dev/shm`. The
//! ground floor: it imports nothing of the program.

pub(crate) mod access;
pub(crate) mod container;
pub(crate) mod driver_files;
pub(crate) mod futex;
pub(crate) mod inherit;
pub(crate) mod made_path;
pub(crate) mod namespace_kinds;
pub(crate) mod numa;
pub(crate) mod proc_stat;
pub(crate) mod signals;
pub(crate) mod stop;
