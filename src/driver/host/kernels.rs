//! The simulated kernel: `simpleKernel` is the only one there is; a launch takes a random 4 to 20 ms on its
//! stream before it writes, so that work that is not ordered comes out in the wrong order.

use std::ffi::CStr;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Result;

use super::{HostDriver, failed};
use crate::driver::error::code;
use crate::driver::handles::{DevicePtr, RawFunction, RawStream};
use crate::driver::kernels::Kernels;

/// How long a simulated kernel takes before it writes: random in this range, and longer than a barrier
/// round of a loaded host (on 2 busy cores one can take milliseconds), so that a kernel is still running
/// when the next step's work is enqueued, and work that is not ordered comes out in the wrong order.
const KERNEL_DELAY_US: std::ops::Range<u64> = 4_000..20_000;

/// A kernel's run time: xorshift, good enough to shuffle the order of concurrent work.
fn kernel_delay(sim: &HostDriver) -> Duration {
    let span = KERNEL_DELAY_US.end - KERNEL_DELAY_US.start;
    Duration::from_micros(KERNEL_DELAY_US.start + sim.random() % span)
}

impl Kernels for HostDriver {
    fn load_kernel(&self, _image: &[u8], name: &CStr) -> Result<RawFunction> {
        if name != c"simpleKernel" {
            return Err(failed("cuModuleGetFunction", code::NOT_FOUND, format!("no kernel {name:?}")));
        }
        Ok(RawFunction(1))
    }

    unsafe fn max_active_blocks_per_multiprocessor(&self, _kernel: RawFunction, _block: u32) -> Result<u32> {
        Ok(16)
    }

    unsafe fn launch_ptr_int_char(
        &self,
        _kernel: RawFunction,
        _grid: u32,
        _block: u32,
        stream: RawStream,
        (target, size, value): (DevicePtr, i32, u8),
    ) -> Result<()> {
        let call = "cuLaunchKernel";
        let size = usize::try_from(size)
            .map_err(|_| failed(call, code::INVALID_VALUE, format!("kernel size {size}")))?;
        let (mapping, start) = self.memory.range(call, target, size)?;
        let delay = kernel_delay(self);
        self.streams.enqueue(call, stream, || {
            Box::new(move |_: &AtomicBool| {
                std::thread::sleep(delay);
                // SAFETY: `range` checked that `size` bytes from `start` lie in the mapping, which this
                // closure keeps alive; other processes write it only when the events order them after this
                // work.
                unsafe { std::ptr::write_bytes(start as *mut u8, value, size) };
                drop(mapping);
            })
        })
    }
}
