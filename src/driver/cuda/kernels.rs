//! The kernel: its module, loaded once per context (and unloaded when the driver goes), its occupancy, and
//! its launch.

use std::ffi::{CStr, c_int, c_void};

use anyhow::{Result, anyhow, bail};
use cudarc::driver::{result, sys};

use super::{CudaDriver, Named, ptr, stream};
use crate::driver::handles::{DevicePtr, RawFunction, RawStream};
use crate::driver::kernels::Kernels;

impl Kernels for CudaDriver {
    fn load_kernel(&self, image: &[u8], name: &CStr) -> Result<RawFunction> {
        let ctx = self.current_context()?;
        let mut kernels = self.kernels.lock().map_err(|_| anyhow!("kernel table poisoned"))?;
        if let Some(&(_, f)) = kernels.get(&ctx) {
            return Ok(f);
        }
        const FATBIN_MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
        let fatbin = image.len() >= 16 && image[..4] == FATBIN_MAGIC;
        if !fatbin && image.last() != Some(&0) {
            bail!("a kernel image must be a fatbin or NUL-terminated PTX");
        }
        // The image is copied to 8-byte aligned memory: a fatbin must be aligned, include_bytes! is not.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        // SAFETY: `aligned` has at least image.len() bytes, and u64 has no invalid bit patterns.
        unsafe {
            std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), image.len())
        };
        // SAFETY: the image is a fatbin (its header gives its size) or NUL-terminated PTX (both checked
        // above), so the driver reads no further than it; it copies what it needs.
        let module = unsafe { result::module::load_data(aligned.as_ptr().cast::<c_void>()) }
            .named(&format!("cuModuleLoadData({name:?})"))?;
        // SAFETY: the module was just loaded; the function lives as long as it (unloaded in Drop).
        let found = unsafe { result::module::get_function(module, name.to_owned()) }
            .named(&format!("cuModuleGetFunction({name:?})"));
        let f = match found {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: the module was just loaded and nothing refers to it; the first error is the one
                // told.
                let _ = unsafe { result::module::unload(module) };
                return Err(e);
            }
        };
        kernels.insert(ctx, (module as usize, RawFunction(f as u64)));
        Ok(RawFunction(f as u64))
    }

    unsafe fn max_active_blocks_per_multiprocessor(&self, kernel: RawFunction, block: u32) -> Result<u32> {
        let function = kernel.0 as sys::CUfunction;
        // SAFETY: the caller promises the function comes from load_kernel, whose module is still loaded; no
        // dynamic shared memory.
        let blocks =
            unsafe { result::occupancy::max_active_block_per_multiprocessor(function, block as c_int, 0) }
                .named("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        Ok(blocks.max(0) as u32)
    }

    unsafe fn launch_ptr_int_char(
        &self,
        kernel: RawFunction,
        grid: u32,
        block: u32,
        s: RawStream,
        (target, size, value): (DevicePtr, i32, u8),
    ) -> Result<()> {
        let mut target = ptr(target);
        let mut size: c_int = size;
        let mut value = value as std::ffi::c_char;
        let mut params: [*mut c_void; 3] = [
            (&mut target as *mut sys::CUdeviceptr).cast(),
            (&mut size as *mut c_int).cast(),
            (&mut value as *mut std::ffi::c_char).cast(),
        ];
        let function = kernel.0 as sys::CUfunction;
        // SAFETY: the caller promises a (char *, int, char) kernel and a live range; the parameters outlive
        // the call (the driver copies them at launch). No shared memory, no `extra`.
        unsafe { result::launch_kernel(function, (grid, 1, 1), (block, 1, 1), 0, stream(s), &mut params) }
            .named("cuLaunchKernel(simpleKernel)")
    }
}
