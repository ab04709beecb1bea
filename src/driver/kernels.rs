//! The kernel: loaded from its image, sized by occupancy, launched on a stream ([`Kernels`]).

use std::ffi::CStr;

use anyhow::Result;

use super::handles::{DevicePtr, RawFunction, RawStream};

/// `simpleKernel`'s module, occupancy and launch.
pub trait Kernels {
    /// Loads the kernel `name` from `image` (PTX, NUL-terminated, or a fatbin) on the current device; the
    /// module stays loaded for the driver's life.
    fn load_kernel(&self, image: &[u8], name: &CStr) -> Result<RawFunction>;
    /// # Safety
    /// `kernel` came from [`Kernels::load_kernel`] of this driver.
    unsafe fn max_active_blocks_per_multiprocessor(&self, kernel: RawFunction, block: u32) -> Result<u32>;
    /// Enqueues `kernel(ptr, size, value)` (the signature of `simpleKernel`) on `stream`.
    /// # Safety
    /// The common contract (see [`Driver`](super::Driver)); `kernel` takes `(char *, int, char)`, and `size`
    /// bytes at `ptr` stay allocated until the launch has run.
    unsafe fn launch_ptr_int_char(
        &self,
        kernel: RawFunction,
        grid: u32,
        block: u32,
        stream: RawStream,
        args: (DevicePtr, i32, u8),
    ) -> Result<()>;
}
