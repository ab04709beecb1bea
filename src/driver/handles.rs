//! The raw handles the driver hands out and takes back: device addresses, events, streams, kernels, VMM
//! allocations and memory pools, and the 64 bytes of an IPC handle. They are made only in `driver` and its
//! children (their numbers are theirs); everyone else passes them back as they came.

/// Size of an IPC memory or event handle (`CU_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_SIZE: usize = 64;

/// The bytes of a `cudaIpcMemHandle_t` or `cudaIpcEventHandle_t`: what travels through the segment.
pub type IpcHandleBytes = [u8; IPC_HANDLE_SIZE];

/// A device address (`CUdeviceptr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePtr(pub(super) u64);

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
pub struct RawEvent(pub(super) u64);

/// A raw stream (`CUstream`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawStream(pub(super) u64);

/// A loaded kernel function (`CUfunction`); its module stays loaded as long as the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawFunction(pub(super) u64);

/// A physical allocation of the virtual memory management API (`CUmemGenericAllocationHandle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawAllocation(pub(super) u64);

/// A memory pool, created here or imported (`CUmemoryPool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawPool(pub(super) u64);
