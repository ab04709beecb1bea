//! The GPU operations simpleIPC needs, as one flat trait over raw handles: the `result` layer of cudarc's
//! three (`sys` -> `result` -> `safe`). It imports nothing from the rest of the crate.
//!
//! [`cuda::CudaDriver`] implements it with the CUDA driver API, loaded at run time. [`host::HostDriver`]
//! implements it in host memory, asynchronously like a GPU, for the tests of the process protocol on machines
//! without a GPU; it is chosen only through the environment variable [`host::SIMULATE_ENV`].
//!
//! The raw handles ([`DevicePtr`], [`RawEvent`], [`RawStream`], [`RawFunction`]) are made only in this module
//! and its children. Every method that takes one is an `unsafe fn`: the caller promises that the handle came
//! from this driver and is still alive. Ownership (who frees or closes what, and when) lives one level up, in
//! the owning types of `ipc`, `stream`, `host_buffer` and `kernel`.

pub mod cuda;
mod error;
pub mod host;

pub use error::{CallFailed, code, failed_code};

use std::ffi::CStr;
use std::os::fd::{BorrowedFd, OwnedFd};

use anyhow::Result;

/// Size of an IPC memory or event handle (`CU_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_SIZE: usize = 64;

/// The bytes of a `cudaIpcMemHandle_t` or `cudaIpcEventHandle_t`: what travels through the segment.
pub type IpcHandleBytes = [u8; IPC_HANDLE_SIZE];

/// A device address (`CUdeviceptr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePtr(u64);

impl DevicePtr {
    /// The address `bytes` further on, inside the same allocation as the caller knows; `None` on overflow.
    pub fn offset(self, bytes: usize) -> Option<DevicePtr> {
        self.0.checked_add(bytes as u64).map(DevicePtr)
    }

    /// Whether the address is a multiple of `align`.
    pub fn is_aligned(self, align: u64) -> bool {
        self.0.is_multiple_of(align)
    }
}

/// A raw event (`CUevent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawEvent(u64);

/// A raw stream (`CUstream`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStream(u64);

/// A loaded kernel function (`CUfunction`); its module stays loaded as long as the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawFunction(u64);

/// A physical allocation of the virtual memory management API (`CUmemGenericAllocationHandle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawAllocation(u64);

/// A memory pool, created here or imported (`CUmemoryPool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawPool(u64);

/// What a device may or may not offer, asked of it before a mechanism is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`
    VirtualMemory,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`
    PosixFdHandles,
    /// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`
    MemoryPools,
    /// The POSIX file descriptor bit of `CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES`
    PoolPosixFdHandles,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` (CUDA 12.3; a driver that does not know it answers
    /// no). It says what the device can do, not what this process may: creating one can still be refused.
    FabricHandles,
    /// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`: contexts this process creates on the device are an MPS daemon's
    /// clients. The driver's own word: measured on the H200 host, 1 under NVIDIA's daemon (from a PID
    /// namespace of its own too), 0 without one and 0 beside an impostor's `control` socket.
    MpsEnabled,
}

impl Capability {
    /// The attribute's name, for messages.
    pub fn attribute(self) -> &'static str {
        match self {
            Capability::VirtualMemory => "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
            Capability::PosixFdHandles => "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
            Capability::MemoryPools => "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED",
            Capability::PoolPosixFdHandles => {
                "CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES (POSIX file descriptor)"
            }
            Capability::FabricHandles => "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED",
            Capability::MpsEnabled => "CU_DEVICE_ATTRIBUTE_MPS_ENABLED",
        }
    }
}

/// What device selection asks of each device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub unified_addressing: bool,
    pub default_compute_mode: bool,
    pub multiprocessors: u32,
    /// PCI address (`0000:17:00.0`), used to find the device's NUMA node; `None` where it has none.
    pub pci_bus_id: Option<String>,
    /// Bytes of L2 cache (`CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE`): copies that fit in it are not memory-bound.
    pub l2_cache_bytes: u64,
    /// The device's UUID (`cuDeviceGetUuid`): the same GPU in every process, however a container numbers it.
    pub uuid: [u8; 16],
    /// The MIG device it is, by the name it was given (`MIG-...`), or `None` for a whole GPU: CUDA treats a
    /// MIG device (a compute instance and its GPU instance) as one device of its own.
    pub mig: Option<String>,
}

/// The MIG device that CUDA's device `ordinal` is, where the variables that choose the devices name it so:
/// the entry of that ordinal in `CUDA_VISIBLE_DEVICES` (or, where that is unset, `NVIDIA_VISIBLE_DEVICES`,
/// which a container runtime numbers the same way) beginning with `MIG-`. The driver API has no attribute
/// for it; NVML does, and this program does not load NVML.
pub fn mig_device_named(ordinal: i32) -> Option<String> {
    let list =
        std::env::var("CUDA_VISIBLE_DEVICES").or_else(|_| std::env::var("NVIDIA_VISIBLE_DEVICES")).ok()?;
    let entry = list.split(',').map(str::trim).nth(usize::try_from(ordinal).ok()?)?;
    entry.starts_with("MIG-").then(|| entry.to_owned())
}

/// Why this is WSL2, if it is: `/dev/dxg` (its GPU paravirtualisation) is present, or the kernel's release
/// names `microsoft`.
pub fn wsl_here() -> Option<String> {
    if std::path::Path::new("/dev/dxg").exists() {
        return Some("/dev/dxg is present".into());
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let release = release.trim();
    release.to_ascii_lowercase().contains("microsoft").then(|| format!("the kernel release is {release}"))
}

/// A UUID as `nvidia-smi -L` writes it: `GPU-6511edb2-0292-665c-1045-8b3209610429`.
pub fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The driver operations of simpleIPC. Every call acts on the device made current on the calling thread by
/// [`Driver::use_device`], like the CUDA runtime the original uses.
///
/// The common contract of the `unsafe fn`s: every handle passed in was made by this driver in this process
/// and has not been freed, closed or destroyed; device memory named by a pointer stays allocated (or mapped)
/// until the work that uses it has finished (a stream or event query says so, or a synchronisation returned).
pub trait Driver: Send + Sync {
    /// True for the host simulation, so that the layers above can say so and size buffers for it.
    fn simulated(&self) -> bool {
        false
    }

    /// The driver's CUDA version (`cuDriverGetVersion`: 13000 for 13.0).
    fn version(&self) -> Result<i32>;
    /// Devices the driver sees.
    fn device_count(&self) -> Result<i32>;
    /// Why this is WSL2 (see [`wsl_here`]), where legacy IPC is not supported; `None` elsewhere.
    fn wsl(&self) -> Option<String> {
        wsl_here()
    }
    fn device_info(&self, device: i32) -> Result<DeviceInfo>;
    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool>;
    /// Lets the current device's context access `peer`'s memory (`cudaDeviceEnablePeerAccess`).
    fn enable_peer_access(&self, peer: i32) -> Result<()>;
    /// Retains `device`'s primary context and makes it current on this thread (`cudaSetDevice`).
    fn use_device(&self, device: i32) -> Result<()>;

    /// Plain `cuMemAlloc`: memory from the stream-ordered pool cannot be exported by legacy IPC.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// # Safety
    /// `ptr` came from [`Driver::alloc`], is freed once, and no work that uses it is pending.
    unsafe fn free(&self, ptr: DevicePtr) -> Result<()>;
    /// # Safety
    /// `ptr` came from [`Driver::alloc`] and is not freed.
    unsafe fn ipc_get_mem_handle(&self, ptr: DevicePtr) -> Result<IpcHandleBytes>;
    /// Maps another process's buffer, with lazy peer access enabled. A forged handle is an error.
    fn ipc_open_mem_handle(&self, handle: &IpcHandleBytes) -> Result<DevicePtr>;
    /// # Safety
    /// `ptr` came from [`Driver::ipc_open_mem_handle`], is closed once, and no work that uses it is pending.
    unsafe fn ipc_close_mem_handle(&self, ptr: DevicePtr) -> Result<()>;

    /// An event with `DisableTiming | Interprocess`.
    fn create_interprocess_event(&self) -> Result<RawEvent>;
    /// # Safety
    /// The common contract.
    unsafe fn ipc_get_event_handle(&self, event: RawEvent) -> Result<IpcHandleBytes>;
    fn ipc_open_event_handle(&self, handle: &IpcHandleBytes) -> Result<RawEvent>;
    /// # Safety
    /// The common contract; the event is destroyed once.
    unsafe fn destroy_event(&self, event: RawEvent) -> Result<()>;
    /// # Safety
    /// The common contract.
    unsafe fn record_event(&self, event: RawEvent, stream: RawStream) -> Result<()>;
    /// True once the work the event last captured has run (`cuEventQuery`).
    /// # Safety
    /// The common contract.
    unsafe fn query_event(&self, event: RawEvent) -> Result<bool>;

    fn create_non_blocking_stream(&self) -> Result<RawStream>;
    /// # Safety
    /// The common contract; the stream is destroyed once.
    unsafe fn destroy_stream(&self, stream: RawStream) -> Result<()>;
    /// Later work on `stream` waits for the work `event` captured when it was last recorded.
    /// # Safety
    /// The common contract.
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()>;
    /// True once everything enqueued on `stream` has run (`cuStreamQuery`).
    /// # Safety
    /// The common contract.
    unsafe fn query_stream(&self, stream: RawStream) -> Result<bool>;

    /// Loads the kernel `name` from `image` (PTX, NUL-terminated, or a fatbin) on the current device; the
    /// module stays loaded for the driver's life.
    fn load_kernel(&self, image: &[u8], name: &CStr) -> Result<RawFunction>;
    /// # Safety
    /// `kernel` came from [`Driver::load_kernel`] of this driver.
    unsafe fn max_active_blocks_per_multiprocessor(&self, kernel: RawFunction, block: u32) -> Result<u32>;
    /// Enqueues `kernel(ptr, size, value)` (the signature of `simpleKernel`) on `stream`.
    /// # Safety
    /// The common contract; `kernel` takes `(char *, int, char)`, and `size` bytes at `ptr` stay allocated
    /// until the launch has run.
    unsafe fn launch_ptr_int_char(
        &self,
        kernel: RawFunction,
        grid: u32,
        block: u32,
        stream: RawStream,
        args: (DevicePtr, i32, u8),
    ) -> Result<()>;
    /// Copies `dst.len()` bytes from `src` into `dst` synchronously: when it returns, with `Ok` or `Err`,
    /// the device no longer writes into `dst`. It is not ordered after any stream: synchronise first.
    /// # Safety
    /// The common contract; `src` has at least `dst.len()` bytes.
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr) -> Result<()>;
    /// Enqueues a device-to-device copy of `bytes` bytes (either side may be an IPC mapping).
    /// # Safety
    /// The common contract; both ranges have `bytes` bytes.
    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// Enqueues setting `bytes` bytes at `dst` to `value`.
    /// # Safety
    /// The common contract; the range has `bytes` bytes.
    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize, stream: RawStream) -> Result<()>;
    /// Whether `device` offers `what`.
    fn supports(&self, device: i32, what: Capability) -> Result<bool>;

    // Stream memory operations on 32-bit flags in device memory (`cuStreamWriteValue32_v2`,
    // `cuStreamWaitValue32_v2`; the v1 entry points answer CUDA_ERROR_NOT_SUPPORTED on driver 580).
    /// Why stream memory operations cannot be used on `device`; `None` if they can.
    fn stream_memops_unsupported(&self, device: i32) -> Result<Option<String>>;
    /// Enqueues writing `value` to the 32-bit word at `ptr`, after the stream's earlier work (with a memory
    /// barrier, so that the work's writes are visible first).
    /// # Safety
    /// The common contract; `ptr` is a 4-aligned word of live device memory until the write has run.
    unsafe fn stream_write_u32(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()>;
    /// Enqueues a wait until the 32-bit word at `ptr` is at least `value`: later work on the stream waits.
    /// # Safety
    /// As for [`Driver::stream_write_u32`].
    unsafe fn stream_wait_u32_geq(&self, stream: RawStream, ptr: DevicePtr, value: u32) -> Result<()>;

    // Virtual memory management (`memMapIPCDrv`): physical allocations shared as file descriptors.
    /// The allocation granularity of `device` for shareable allocations.
    fn vmm_granularity(&self, device: i32) -> Result<usize>;
    /// `cuMemCreate` of `bytes` (a multiple of the granularity) on `device`, exportable as a descriptor.
    fn vmm_create(&self, device: i32, bytes: usize) -> Result<RawAllocation>;
    /// `cuMemExportToShareableHandle`: a new descriptor for the allocation, owned by the caller.
    /// # Safety
    /// `allocation` came from this driver and is not released.
    unsafe fn vmm_export(&self, allocation: RawAllocation) -> Result<OwnedFd>;
    /// `cuMemImportFromShareableHandle`; the descriptor stays the caller's to close.
    fn vmm_import(&self, fd: BorrowedFd) -> Result<RawAllocation>;
    /// Reserves an address range of `bytes`, maps `allocation` there and lets `device` read and write it.
    /// # Safety
    /// `allocation` came from this driver, is not released, and has `bytes` bytes.
    unsafe fn vmm_map(&self, allocation: RawAllocation, bytes: usize, device: i32) -> Result<DevicePtr>;
    /// Unmaps `bytes` at `ptr` and frees the address range.
    /// # Safety
    /// `ptr` and `bytes` came from one [`Driver::vmm_map`], unmapped once, with no work pending on it.
    unsafe fn vmm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// # Safety
    /// `allocation` came from this driver and is released once; its mappings may outlive it.
    unsafe fn vmm_release(&self, allocation: RawAllocation) -> Result<()>;
    /// The granularity of an allocation made or imported here, from its own properties
    /// (`cuMemGetAllocationPropertiesFromHandle`): what its exporter rounded its size up to.
    /// # Safety
    /// `allocation` came from this driver and is not released.
    unsafe fn vmm_granularity_of(&self, allocation: RawAllocation) -> Result<usize>;

    // Fabric handles: VMM allocations shared as 64 bytes (`CUmemFabricHandle`), no descriptor. Mapped,
    // unmapped and released with the `vmm_` calls above.
    /// The allocation granularity of `device` for fabric-shareable allocations.
    fn fabric_granularity(&self, device: i32) -> Result<usize>;
    /// `cuMemCreate` of `bytes` (a multiple of the granularity) on `device`, exportable as a fabric handle.
    /// Where the device has fabric handles but the process no IMEX channel, `CUDA_ERROR_NOT_PERMITTED`.
    fn fabric_create(&self, device: i32, bytes: usize) -> Result<RawAllocation>;
    /// `cuMemExportToShareableHandle` with `CU_MEM_HANDLE_TYPE_FABRIC`: the allocation's 64-byte handle.
    /// # Safety
    /// `allocation` came from [`Driver::fabric_create`] and is not released.
    unsafe fn fabric_export(&self, allocation: RawAllocation) -> Result<IpcHandleBytes>;
    /// `cuMemImportFromShareableHandle` of a fabric handle. A forged handle is an error.
    fn fabric_import(&self, handle: &IpcHandleBytes) -> Result<RawAllocation>;

    // Memory pools (`streamOrderedAllocationIPC`): a pool shared as a descriptor, pointers as export data.
    /// `cuMemPoolCreate` on `device`, exportable as a POSIX file descriptor.
    fn pool_create(&self, device: i32) -> Result<RawPool>;
    /// `cuMemPoolExportToShareableHandle`: a new descriptor for the pool, owned by the caller.
    /// # Safety
    /// `pool` was created by this driver and is not destroyed.
    unsafe fn pool_export(&self, pool: RawPool) -> Result<OwnedFd>;
    /// `cuMemPoolImportFromShareableHandle`, then read-write access for `device`; the descriptor stays the
    /// caller's to close.
    fn pool_import(&self, fd: BorrowedFd, device: i32) -> Result<RawPool>;
    /// Allocates `bytes` from `pool`, and waits for the allocation.
    /// # Safety
    /// `pool` was created by this driver and is not destroyed.
    unsafe fn pool_alloc(&self, pool: RawPool, bytes: usize) -> Result<DevicePtr>;
    /// `cuMemPoolExportPointer`: the export data of an allocation of `pool`.
    /// # Safety
    /// `ptr` came from [`Driver::pool_alloc`] and is not freed.
    unsafe fn pool_export_pointer(&self, ptr: DevicePtr) -> Result<IpcHandleBytes>;
    /// `cuMemPoolImportPointer` from an imported pool.
    /// # Safety
    /// `pool` came from [`Driver::pool_import`].
    unsafe fn pool_import_pointer(&self, pool: RawPool, data: &IpcHandleBytes) -> Result<DevicePtr>;
    /// Frees an allocation or an imported pointer, and waits for it (an importer frees before the exporter).
    /// # Safety
    /// `ptr` came from [`Driver::pool_alloc`] or [`Driver::pool_import_pointer`], freed once, no work pending.
    unsafe fn pool_free(&self, ptr: DevicePtr) -> Result<()>;
    /// Destroys a pool this process created, or releases one it imported.
    /// # Safety
    /// `pool` was created or imported by this driver, every allocation from it (or pointer imported from
    /// it) is freed, and it is destroyed once.
    unsafe fn pool_destroy(&self, pool: RawPool) -> Result<()>;

    /// Pins `host` memory for fast copies; returns false where the driver cannot (copies stay pageable).
    /// # Safety
    /// `host` stays mapped until [`Driver::unpin_host_memory`] was called for it.
    unsafe fn pin_host_memory(&self, host: &mut [u8]) -> Result<bool>;
    /// # Safety
    /// `host` was pinned by [`Driver::pin_host_memory`] and no copy into or out of it is pending.
    unsafe fn unpin_host_memory(&self, host: &mut [u8]) -> Result<()>;
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

/// Why `/proc` is not this process's own, if it is not: the CUDA driver's `cuInit` then answers
/// `CUDA_ERROR_OPERATING_SYSTEM` (measured on the H200 host: a PID namespace without a /proc of its own).
pub fn foreign_proc() -> Option<String> {
    let seen: u32 = std::fs::read_link("/proc/self").ok()?.to_str()?.parse().ok()?;
    let me = std::process::id();
    (seen != me).then(|| {
        format!(
            "this process is pid {me} in its PID namespace, but /proc is another namespace's (it says {seen}): \
             the CUDA driver needs the namespace's own /proc; what fixes it: mount one (unshare --pid --fork \
             --mount-proc; container runtimes do)"
        )
    })
}
