//! simple-ipc: a Rust port of NVIDIA's CUDA sample `simpleIPC`.
//!
//! The story, in the order of the original, is `sample` (its `mod.rs` lists the steps): the parent creates
//! the `segment`, chooses the `devices`, exports a buffer and an event per process through `ipc` handles
//! and starts its children; each child opens every handle, writes the others' buffers round-robin with
//! `gpu::kernel`, synchronised by IPC events and the `barrier`, and checks its own buffer. What the tool
//! adds to it is `tool`, through the story's seams. The GPU is reached through `driver`; `supervise` starts
//! and watches the processes, `phases` times them (and holds the test faults), `os` is the ground floor.
//! docs/details.md draws the layout.

#[macro_use]
pub(crate) mod output;

mod entry;
pub use entry::main;

pub(crate) mod bench;
pub(crate) mod between;
pub(crate) mod cli;
pub(crate) mod devices;
pub(crate) mod driver;
pub(crate) mod every_mechanism;
pub(crate) mod gpu;
pub(crate) mod ipc;
pub(crate) mod isolation;
pub(crate) mod join;
pub(crate) mod joiners;
pub(crate) mod matrix;
pub(crate) mod meeting;
pub(crate) mod node;
pub(crate) mod os;
pub(crate) mod outcome;
pub mod phases;
pub(crate) mod placement;
pub(crate) mod report;
pub(crate) mod role;
pub(crate) mod sample;
pub mod segment;
pub(crate) mod setup;
pub(crate) mod supervise;
pub(crate) mod tool;
pub(crate) mod topology;
pub(crate) mod wire;
