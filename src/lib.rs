//! simple-ipc: a Rust port of NVIDIA's CUDA sample `simpleIPC`.
//!
//! The story, in the order of the original: [`parent`] creates the [`segment`], chooses the [`devices`],
//! exports a buffer and an event per process through [`ipc`] handles and starts the [`children`]; each
//! [`child`] opens every handle, writes the others' buffers round-robin with the [`kernel`], synchronised by
//! IPC events and the [`barrier`], and checks its own buffer ([`verify`]). The GPU is reached through
//! [`driver`]; [`signals`], [`fault`] and [`timings`] serve the parent and the children alike.

#[macro_use]
pub mod output;

pub mod attach;
pub mod barrier;
pub mod bench;
pub mod child;
pub mod children;
pub mod cli;
pub mod devices;
pub mod driver;
pub mod driver_files;
pub mod every_mechanism;
pub mod fault;
pub mod futex;
pub mod guardian;
pub mod host_buffer;
pub mod inherit;
pub mod ipc;
pub mod kernel;
pub mod numa;
pub mod parent;
pub mod phase;
pub mod report;
pub mod segment;
pub mod setup;
pub mod signals;
pub mod stop;
pub mod stream;
pub mod timings;
pub mod topology;
pub mod verify;

/// How a run that did not fail ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    /// Nothing can run here; the reason was printed.
    Waived,
}

/// cuda-samples' exit statuses.
pub const EXIT_SUCCESS: u8 = 0;
pub const EXIT_FAILURE: u8 = 1;
pub const EXIT_WAIVED: u8 = 2;
