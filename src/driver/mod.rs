//! The GPU operations simpleIPC needs, over raw handles: the `result` layer of cudarc's three (`sys` ->
//! `result` -> `safe`), by concern. Of the rest of the crate it imports only the waiver (`outcome`) and, for
//! its message, the container engine's fix (`container`).
//!
//! Each concern is a small trait in a file of its own, implemented beside it in the file of the same name
//! in each half: [`devices`] ([`Devices`]), [`memory`] ([`Memory`]), [`ipc`] ([`Ipc`]: legacy memory
//! handles), [`events`] ([`Events`]: interprocess events and their handles), [`streams`] ([`Streams`]),
//! [`kernels`] ([`Kernels`]), [`vmm`] ([`Vmm`]), [`fabric`] ([`Fabric`]) and [`pool`] ([`Pools`]).
//! [`Driver`] is their sum: callers hold a `&dyn Driver`, on which every concern's methods are called
//! (code that holds a driver of a named type imports the concern it calls).
//! [`cuda::CudaDriver`] implements them with the CUDA driver API, loaded at run time (`cuda/<concern>.rs`).
//! [`host::HostDriver`] implements them in host memory, asynchronously like a GPU, for the tests of the
//! process protocol on machines without a GPU (`host/<concern>.rs`); it is chosen only through the
//! environment variable [`host::SIMULATE_ENV`]. The two halves import the files below this one, never this
//! one.
//!
//! The raw handles ([`handles`]) are made only in this module and its children. Every method that takes one
//! is an `unsafe fn`: the caller promises that the handle came from this driver and is still alive.
//! Ownership (who frees or closes what, and when) lives one level up, in the owning types of `ipc` and
//! `gpu`.

pub mod cuda;
mod devices;
mod error;
mod events;
mod fabric;
mod handles;
pub mod host;
mod ipc;
mod kernels;
mod memory;
mod pool;
mod streams;
mod vmm;

pub use devices::{Capability, DeviceInfo, Devices, foreign_proc, uuid_text};
pub use error::{CallFailed, code, failed_code};
pub use events::Events;
pub use fabric::Fabric;
pub use handles::{DevicePtr, IpcHandleBytes, RawAllocation, RawEvent, RawFunction, RawPool, RawStream};
pub use ipc::Ipc;
pub use kernels::Kernels;
pub use memory::Memory;
pub use pool::Pools;
pub use streams::Streams;
pub use vmm::Vmm;

use anyhow::Result;

/// The driver operations of simpleIPC: every concern, on the device made current on the calling thread by
/// [`Devices::use_device`], like the CUDA runtime the original uses.
///
/// The common contract of the `unsafe fn`s: every handle passed in was made by this driver in this process
/// and has not been freed, closed or destroyed; device memory named by a pointer stays allocated (or mapped)
/// until the work that uses it has finished (a stream or event query says so, or a synchronisation returned).
pub trait Driver:
    Devices + Memory + Ipc + Events + Streams + Kernels + Vmm + Fabric + Pools + Send + Sync
{
}

impl<T> Driver for T where
    T: Devices + Memory + Ipc + Events + Streams + Kernels + Vmm + Fabric + Pools + Send + Sync
{
}

/// Whether a driver library is here to load, without asking it for a GPU: the simulation where the tests
/// ask for it, else `libcuda`, which stays loaded for [`load`].
pub fn library_here() -> bool {
    std::env::var_os(host::SIMULATE_ENV).is_some() || cuda::CudaDriver::library_here()
}

/// The driver for this process: the host simulation when the tests ask for it, else CUDA.
/// `Err(Waiver)` (no library, no driver, no device) means the run is waived.
pub fn load() -> Result<Box<dyn Driver>> {
    let loaded: Result<Box<dyn Driver>> = match host::HostDriver::from_env() {
        Ok(Some(simulated)) => Ok(Box::new(simulated)),
        Ok(None) => cuda::CudaDriver::load().map(|cuda| Box::new(cuda) as Box<dyn Driver>),
        Err(e) => Err(e),
    };
    loaded.map_err(|e| match (failed_code(&e), foreign_proc()) {
        (Some(code::OPERATING_SYSTEM), Some(why)) => e.context(why),
        _ => e,
    })
}
