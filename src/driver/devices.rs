//! The devices: how many, what each is and offers, peer access, and which one is current on the calling
//! thread ([`Devices`]); with the facts of the machine the driver's answers depend on (WSL2, MIG devices
//! named by the environment, a `/proc` that is not this process's own).

use anyhow::Result;

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

/// The devices. Every other driver call acts on the device made current on the calling thread by
/// [`Devices::use_device`], like the CUDA runtime the original uses.
pub trait Devices {
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
    /// Whether `device` offers `what`.
    fn supports(&self, device: i32, what: Capability) -> Result<bool>;
    /// Ends this driver with the process, which exits now and uses it no more: as the original's child,
    /// which exits without releasing its context. The simulation drops itself here (what a process still
    /// holds is counted at its drop).
    fn end_with_the_process(self: Box<Self>) {
        drop(self)
    }
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
