//! Owners over the driver's raw handles, below the IPC mechanisms (cudarc's "safe" layer): device memory
//! ([`memory`]), streams and the events they wait for and record ([`stream`]), the kernel ([`kernel`]) and
//! host memory for copies ([`host_buffer`]). Each owner stores the device it belongs to and makes it current
//! in every call it makes, `Drop` included (see `release`), so no call depends on which device a thread last
//! used.

pub mod host_buffer;
pub mod kernel;
pub mod memory;
mod release;
pub mod stream;

pub use memory::{DeviceBuffer, DeviceMemory, Slice};
pub(crate) use release::release;
pub use stream::{Event, Stream};
