//! Owners over the driver's raw handles, below the IPC mechanisms (cudarc's "safe" layer): device memory
//! ([`memory`]), streams and the events they wait for and record ([`stream`]), the kernel ([`kernel`]) and
//! host memory for copies ([`host_buffer`]). Each owner stores the device it belongs to and makes it current
//! in every call it makes, `Drop` included, so no call depends on which device a thread last used.

pub mod host_buffer;
pub mod kernel;
pub mod memory;
pub mod stream;

pub use memory::{DeviceBuffer, DeviceMemory, Slice};
pub use stream::{Event, Stream};

/// Says a failure to release something on drop (there is no caller left to return it to).
pub(crate) fn warn_on_error(what: &str, result: anyhow::Result<()>) {
    if let Err(e) = result {
        warn!("warning: {what}: {e:#}");
    }
}
