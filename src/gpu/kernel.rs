//! `simpleKernel`: its embedded image (see build.rs), its occupancy-sized grid, and its launch.

use anyhow::{Context, Result, ensure};

use super::{DeviceMemory, Stream};
use crate::driver::{Driver, RawFunction};

/// The kernel image build.rs embedded: a fatbin made by nvcc, or the committed PTX (NUL-terminated).
pub static IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/simple_kernel.image"));
/// `"ptx"` or `"fatbin"`.
#[cfg(test)]
pub const IMAGE_FORMAT: &str = env!("SIMPLE_IPC_KERNEL_FORMAT");
/// Said when the driver refuses the image: the committed PTX is ISA 9.0, from nvcc 13.0.
pub const LOAD_HINT: &str = "the driver could not load simpleKernel; the embedded PTX comes from CUDA 13.0 \
     and needs a driver of version 580 or newer (or build with a local nvcc, which embeds a fatbin)";

/// The original's block size.
pub const THREADS_PER_BLOCK: u32 = 128;

/// `simpleKernel`, loaded on the current device, with the grid the original computes.
pub struct SimpleKernel<'d> {
    driver: &'d dyn Driver,
    /// The device whose context the kernel's module was loaded into.
    device: i32,
    function: RawFunction,
    grid: u32,
}

impl<'d> SimpleKernel<'d> {
    /// Loads the kernel; grid = max active blocks per multiprocessor (128 threads, no dynamic shared memory)
    /// times the number of multiprocessors.
    pub fn load(driver: &'d dyn Driver, device: i32, multiprocessors: u32) -> Result<Self> {
        driver.use_device(device)?;
        let function = driver.load_kernel(IMAGE, c"simpleKernel").context(LOAD_HINT)?;
        // SAFETY: the function was just loaded by this driver and stays loaded as long as it.
        let per_sm = unsafe { driver.max_active_blocks_per_multiprocessor(function, THREADS_PER_BLOCK) }?;
        let grid = per_sm.saturating_mul(multiprocessors);
        ensure!(
            grid > 0,
            "simpleKernel cannot run: occupancy {per_sm} blocks x {multiprocessors} multiprocessors"
        );
        Ok(Self { driver, device, function, grid })
    }

    /// `simpleKernel<<<grid, 128, 0, stream>>>(target, size, value)`, with the launch checked.
    pub fn launch(&self, stream: &Stream, target: &impl DeviceMemory, size: usize, value: u8) -> Result<()> {
        ensure!(
            size <= target.bytes(),
            "simpleKernel: {size} bytes do not fit a buffer of {}",
            target.bytes()
        );
        let size = i32::try_from(size).context("buffer size does not fit simpleKernel's int")?;
        ensure!(
            stream.device() == self.device,
            "simpleKernel was loaded on device {}, the stream is on device {}",
            self.device,
            stream.device()
        );
        self.driver.use_device(self.device)?;
        // SAFETY: simpleKernel takes (char *, int, char); `size` bytes fit in `target` (checked), which is
        // borrowed, and freeing or closing device memory waits for the work that uses it.
        unsafe {
            self.driver.launch_ptr_int_char(
                self.function,
                self.grid,
                THREADS_PER_BLOCK,
                stream.raw(),
                (target.ptr(), size, value),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_image_has_the_entry_point() {
        let needle: &[u8] = if IMAGE_FORMAT == "ptx" { b".entry simpleKernel(" } else { b"simpleKernel" };
        assert!(
            IMAGE.windows(needle.len()).any(|w| w == needle),
            "no simpleKernel in the {IMAGE_FORMAT} image"
        );
        if IMAGE_FORMAT == "ptx" {
            assert_eq!(IMAGE.last(), Some(&0), "PTX must be NUL-terminated for cuModuleLoadData");
        }
    }

    #[test]
    fn committed_ptx_declares_the_three_parameters() {
        let ptx = include_str!("../../kernels/simple_kernel.ptx");
        assert!(ptx.contains(".visible .entry simpleKernel("));
        assert!(ptx.contains(".param .u64 simpleKernel_param_0"), "ptr is a 64-bit pointer");
        assert!(ptx.contains(".param .u32 simpleKernel_param_1"), "sz is a 32-bit int");
        assert!(ptx.contains(".param .u8 simpleKernel_param_2"), "val is a char");
        assert!(ptx.contains(".version 9.0"), "README's driver floor (580) is stated for PTX ISA 9.0");
    }
}
