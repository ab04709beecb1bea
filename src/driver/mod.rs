//! The GPU operations simpleIPC needs, as one flat trait over raw handles.
//!
//! [`cuda::CudaDriver`] implements it with the CUDA driver API, loaded at run time. [`host::HostDriver`]
//! implements it in host memory for the tests of the process protocol on machines without a GPU; it is chosen
//! only through the environment variable [`host::SIMULATE_ENV`] (see README, "Testing without a GPU").
//!
//! The raw handles here are plain values; ownership (who frees or closes what) lives one level up, in
//! [`crate::ipc`] and [`crate::kernel`].

pub mod cuda;
pub mod host;

use anyhow::Result;

/// Size of an IPC memory or event handle (`CU_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_SIZE: usize = 64;

/// The bytes of a `cudaIpcMemHandle_t` or `cudaIpcEventHandle_t`: what travels through the segment.
pub type IpcHandleBytes = [u8; IPC_HANDLE_SIZE];

/// A device address (`CUdeviceptr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePtr(pub u64);

/// A raw event (`CUevent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEvent(pub u64);

/// A raw stream (`CUstream`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStream(pub u64);

/// A loaded kernel function (`CUfunction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawFunction(pub u64);

/// What device selection asks of each device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub unified_addressing: bool,
    pub default_compute_mode: bool,
    pub multiprocessors: u32,
    /// PCI address (`0000:17:00.0`), used to find the device's NUMA node; `None` where it has none.
    pub pci_bus_id: Option<String>,
}

/// Why no GPU work can happen here: the run is waived, not failed.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// The driver operations of simpleIPC. Every call acts on the device made current on the calling thread by
/// [`Driver::use_device`], like the CUDA runtime the original uses.
pub trait Driver: Send + Sync {
    /// Bytes in each process's buffer: `DATA_SIZE` (64 MiB) on GPUs; the host simulation uses less.
    fn buffer_size(&self) -> usize {
        crate::segment::DATA_SIZE
    }

    /// Devices the driver sees.
    fn device_count(&self) -> Result<i32>;
    fn device_info(&self, device: i32) -> Result<DeviceInfo>;
    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool>;
    /// Lets the current device's context access `peer`'s memory (`cudaDeviceEnablePeerAccess`).
    fn enable_peer_access(&self, peer: i32) -> Result<()>;
    /// Retains `device`'s primary context and makes it current on this thread (`cudaSetDevice`).
    fn use_device(&self, device: i32) -> Result<()>;

    /// Plain `cuMemAlloc`: memory from the stream-ordered pool cannot be exported (SPEC section 9).
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    fn free(&self, ptr: DevicePtr) -> Result<()>;
    fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> Result<IpcHandleBytes>;
    /// Maps another process's buffer, with lazy peer access enabled.
    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr>;
    fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> Result<()>;

    /// An event with `DisableTiming | Interprocess`.
    fn create_interprocess_event(&self) -> Result<RawEvent>;
    fn ipc_get_event_handle(&self, event: RawEvent) -> Result<IpcHandleBytes>;
    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent>;
    fn destroy_event(&self, event: RawEvent) -> Result<()>;
    fn record_event(&self, event: RawEvent, stream: RawStream) -> Result<()>;
    fn synchronize_event(&self, event: RawEvent) -> Result<()>;

    fn create_non_blocking_stream(&self) -> Result<RawStream>;
    fn destroy_stream(&self, stream: RawStream) -> Result<()>;
    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()>;
    fn synchronize_stream(&self, stream: RawStream) -> Result<()>;

    /// Loads `simpleKernel` from the embedded image; the module stays loaded for the process's life.
    fn load_simple_kernel(&self) -> Result<RawFunction>;
    fn max_active_blocks_per_multiprocessor(&self, kernel: RawFunction, block: u32) -> Result<u32>;
    /// Launches `simpleKernel(ptr, size, value)` on `stream`.
    fn launch_simple_kernel(
        &self,
        kernel: RawFunction,
        grid: u32,
        block: u32,
        stream: RawStream,
        args: (DevicePtr, i32, u8),
    ) -> Result<()>;
    /// Copies `dst.len()` bytes from `src` into `dst` in stream order, then waits for the stream.
    fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr, stream: RawStream) -> Result<()>;
    /// Copies `src` (host) into `dst` in stream order, then waits for the stream.
    fn copy_from_host(&self, dst: DevicePtr, src: &[u8], stream: RawStream) -> Result<()>;
    /// Enqueues a device-to-device copy of `bytes` bytes (either side may be an IPC mapping).
    fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// Enqueues setting `bytes` bytes at `dst` to `value`.
    fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, stream: RawStream) -> Result<()>;
    /// Pins `host` memory for fast copies; returns false where the driver cannot (then copies stay pageable).
    fn pin_host_memory(&self, host: &mut [u8]) -> Result<bool>;
    /// Removes the names of the files the driver made in `/dev/shm` for this process's exported events, once
    /// every importer has opened them, so that even a process killed by SIGKILL leaves nothing behind.
    fn remove_exported_names(&self) -> Result<()> {
        Ok(())
    }
    fn unpin_host_memory(&self, host: &mut [u8]) -> Result<()>;
}

/// The driver for the parent, or `None` after printing the waived line where nothing can run here.
pub fn load_or_waive() -> Result<Option<Box<dyn Driver>>> {
    match load() {
        Ok(driver) => Ok(Some(driver)),
        Err(e) => match e.downcast::<Unavailable>() {
            Ok(reason) => {
                println!("No CUDA devices support IPC ({reason})");
                Ok(None)
            }
            Err(e) => Err(e),
        },
    }
}

/// The driver for this process: the host simulation when the tests ask for it, else CUDA.
/// `Err(Unavailable)` (no library, no driver, no device) means the run is waived.
pub fn load() -> Result<Box<dyn Driver>> {
    if let Some(simulated) = host::HostDriver::from_env()? {
        return Ok(Box::new(simulated));
    }
    Ok(Box::new(cuda::CudaDriver::load()?))
}
