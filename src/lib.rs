//! simple-ipc: a Rust port of NVIDIA's CUDA sample `simpleIPC`.
//!
//! The story, in the order of the original, is `sample` (its `mod.rs` lists the steps): the parent creates
//! the `segment`, chooses the `devices`, exports a buffer and an event per process through `ipc` handles
//! and starts its children; each child opens every handle, writes the others' buffers round-robin with
//! `gpu::kernel`, synchronised by IPC events and the `barrier`, and checks its own buffer. What the tool
//! adds to it is `tool`, through the story's seams. The GPU is reached through `driver`; `signals`,
//! `fault` and `timings` serve the parent and the children alike.

#[macro_use]
pub(crate) mod output;

mod entry;
pub use entry::main;

pub(crate) mod access;
pub(crate) mod barrier;
pub(crate) mod bench;
pub(crate) mod cli;
pub(crate) mod container;
pub(crate) mod devices;
pub(crate) mod driver;
pub(crate) mod driver_files;
pub(crate) mod every_mechanism;
pub(crate) mod fault;
pub(crate) mod futex;
pub(crate) mod gpu;
pub(crate) mod guardian;
pub(crate) mod held;
pub(crate) mod inherit;
pub(crate) mod ipc;
pub(crate) mod isolation;
pub(crate) mod join;
pub(crate) mod joiners;
pub(crate) mod made_path;
pub(crate) mod matrix;
pub(crate) mod meeting;
pub(crate) mod namespace_kinds;
pub(crate) mod node;
pub(crate) mod numa;
pub(crate) mod outcome;
pub(crate) mod peers;
pub mod phase;
pub(crate) mod placement;
pub(crate) mod proc_stat;
pub(crate) mod progress;
pub(crate) mod relaunch;
pub(crate) mod report;
pub(crate) mod role;
pub(crate) mod sample;
pub mod segment;
pub(crate) mod setup;
pub(crate) mod sigbus;
pub(crate) mod signals;
pub(crate) mod stop;
pub(crate) mod timings;
pub(crate) mod tool;
pub(crate) mod topology;
pub(crate) mod verdict;
pub(crate) mod watchdog;
pub(crate) mod wire;
