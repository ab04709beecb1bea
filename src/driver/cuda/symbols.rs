//! The driver's entry points that the program can call, looked up before any of them is called, so that a
//! driver without one is a waiver that names it, never a panic.
//!
//! What cudarc (0.19.10, feature `dynamic-loading`) does with a symbol the installed driver lacks: each
//! `sys` function resolves its own symbol at its first call, `culib().get(name)` kept in a `OnceLock`, and
//! where the lookup fails it panics (`sys::load` is `culib().get::<F>(name).unwrap_or_else(|e|
//! panic!("Missing symbol {name}: {e}"))`). The `result` layer calls those same functions, so it panics
//! the same way; it returns `DriverError` only for a `CUresult` the driver answered. (`culib()` panics too
//! where no library loads at all, which `sys::is_culib_present` rules out first.) Hence this guard:
//! [`require_all`] makes cudarc's own lookup, `culib().get`, for every name in [`CALLED`] before `cuInit`;
//! a test keeps [`CALLED`] complete against the calls in this module's sources. The `_v2` stream memory
//! operations and the fabric attribute are found through `cuGetProcAddress`, which answers with an error,
//! not a panic, where the driver lacks them.

use anyhow::Result;
use cudarc::driver::sys;

use crate::outcome::Waiver;

/// Every symbol cudarc looks up for a call of this module, direct (`sys::cuX`) or through the `result`
/// layer, by the name cudarc looks up (`_v2` where the 11.4 bindings call that version).
const CALLED: &[&str] = &[
    // Through `result`.
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceGetUuid",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamWaitEvent",
    "cuStreamSynchronize",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventDestroy_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuLaunchKernel",
    "cuMemPoolCreate",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuMemPoolDestroy",
    // Through `sys`, which alone has them.
    "cuDriverGetVersion",
    "cuDeviceGetPCIBusId",
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
    "cuGetProcAddress",
    "cuStreamQuery",
    "cuEventCreate",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuIpcGetEventHandle",
    "cuIpcOpenEventHandle",
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemAddressReserve",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuMemAddressFree",
    "cuMemRelease",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemPoolExportToShareableHandle",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolGetAccess",
    "cuMemPoolSetAccess",
    "cuMemPoolExportPointer",
    "cuMemPoolImportPointer",
];

/// Whether the loaded driver library exports `name`.
fn present(name: &str) -> bool {
    // SAFETY: `culib()` opens the library `is_culib_present` (called first) found; `get` only looks the
    // name up (dlsym), and the symbol it returns is dropped without being called.
    unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
}

/// The names of [`CALLED`] that `present` does not find.
fn missing(present: impl Fn(&str) -> bool) -> Vec<&'static str> {
    CALLED.iter().copied().filter(|name| !present(name)).collect()
}

/// The waiver's reason for a driver that lacks `missing`; `version` is `cuDriverGetVersion`'s answer where
/// the driver has it.
fn lacking(missing: &[&str], version: Option<i32>) -> String {
    let version =
        version.map_or("version unknown".to_owned(), |v| format!("CUDA {}.{}", v / 1000, v % 1000 / 10));
    const SHOWN: usize = 6;
    let mut names = missing.iter().take(SHOWN).copied().collect::<Vec<_>>().join(", ");
    if missing.len() > SHOWN {
        names += &format!(" and {} more", missing.len() - SHOWN);
    }
    format!(
        "the CUDA driver ({version}) lacks {names}, which simple-ipc calls: it needs a driver of CUDA 11.4 or newer"
    )
}

/// `Err(Waiver)` (the run is waived) naming each entry point the driver lacks, so that no call can reach
/// cudarc's panic for a missing symbol.
pub(super) fn require_all() -> Result<()> {
    let missing = missing(present);
    if missing.is_empty() {
        return Ok(());
    }
    let version =
        (!missing.contains(&"cuDriverGetVersion")).then(super::devices::driver_version).and_then(Result::ok);
    Err(Waiver(lacking(&missing, version)).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver symbol each `result` function this module calls looks up (cudarc 0.19, 11.4 bindings).
    const RESULT_CALLS: &[(&str, &str)] = &[
        ("init", "cuInit"),
        ("device::get_count", "cuDeviceGetCount"),
        ("device::get_attribute", "cuDeviceGetAttribute"),
        ("device::get_name", "cuDeviceGetName"),
        ("device::get_uuid", "cuDeviceGetUuid"),
        ("primary_ctx::retain", "cuDevicePrimaryCtxRetain"),
        ("primary_ctx::release", "cuDevicePrimaryCtxRelease_v2"),
        ("ctx::set_current", "cuCtxSetCurrent"),
        ("ctx::get_current", "cuCtxGetCurrent"),
        ("malloc_sync", "cuMemAlloc_v2"),
        ("free_sync", "cuMemFree_v2"),
        ("memcpy_dtoh_sync", "cuMemcpyDtoH_v2"),
        ("memcpy_dtod_async", "cuMemcpyDtoDAsync_v2"),
        ("memset_d8_async", "cuMemsetD8Async"),
        ("stream::create", "cuStreamCreate"),
        ("stream::destroy", "cuStreamDestroy_v2"),
        ("stream::wait_event", "cuStreamWaitEvent"),
        ("stream::synchronize", "cuStreamSynchronize"),
        ("event::record", "cuEventRecord"),
        ("event::query", "cuEventQuery"),
        ("event::destroy", "cuEventDestroy_v2"),
        ("module::load_data", "cuModuleLoadData"),
        ("module::get_function", "cuModuleGetFunction"),
        ("module::unload", "cuModuleUnload"),
        ("occupancy::max_active_block_per_multiprocessor", "cuOccupancyMaxActiveBlocksPerMultiprocessor"),
        ("launch_kernel", "cuLaunchKernel"),
        ("mem_pool::create", "cuMemPoolCreate"),
        ("mem_pool::alloc_async", "cuMemAllocFromPoolAsync"),
        ("free_async", "cuMemFreeAsync"),
        ("mem_pool::destroy", "cuMemPoolDestroy"),
    ];

    /// The sources that call the driver (this file, which only names symbols, is left out).
    const SOURCES: &[&str] = &[
        include_str!("mod.rs"),
        include_str!("devices.rs"),
        include_str!("events.rs"),
        include_str!("fabric.rs"),
        include_str!("ipc.rs"),
        include_str!("kernels.rs"),
        include_str!("memory.rs"),
        include_str!("pool.rs"),
        include_str!("streams.rs"),
        include_str!("vmm.rs"),
    ];

    /// The paths called after each `prefix` in `source`: `sys::cuMemMap(` gives `cuMemMap`.
    fn called_after<'a>(source: &'a str, prefix: &str) -> Vec<&'a str> {
        source
            .match_indices(prefix)
            .filter_map(|(at, _)| {
                let rest = &source[at + prefix.len()..];
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))?;
                (end > 0 && rest[end..].starts_with('(')).then(|| &rest[..end])
            })
            .collect()
    }

    #[test]
    fn every_symbol_the_sources_call_is_looked_up_first() {
        let mut seen = 0;
        for source in SOURCES {
            for name in called_after(source, "sys::cu") {
                let symbol = format!("cu{name}");
                assert!(CALLED.contains(&symbol.as_str()), "sys::{symbol} is called but not in CALLED");
                seen += 1;
            }
            for path in called_after(source, "result::") {
                let symbol = RESULT_CALLS.iter().find(|(p, _)| *p == path).map(|(_, s)| *s);
                let symbol =
                    symbol.unwrap_or_else(|| panic!("result::{path} is called but not in RESULT_CALLS"));
                assert!(CALLED.contains(&symbol), "result::{path} looks up {symbol}, not in CALLED");
                seen += 1;
            }
        }
        // The scan finds the calls at all (a broken scan would pass vacuously).
        assert!(seen > 50, "only {seen} calls found");
    }

    #[test]
    fn a_missing_symbol_is_a_waiver_that_names_it() {
        assert!(missing(|_| true).is_empty());
        let lacks = missing(|name| name != "cuGetProcAddress" && name != "cuMemPoolCreate");
        assert_eq!(lacks, ["cuMemPoolCreate", "cuGetProcAddress"]);
        let reason = lacking(&lacks, Some(11020));
        assert_eq!(
            reason,
            "the CUDA driver (CUDA 11.2) lacks cuMemPoolCreate, cuGetProcAddress, which simple-ipc calls: it \
             needs a driver of CUDA 11.4 or newer"
        );
        assert!(lacking(&["cuInit"], None).starts_with("the CUDA driver (version unknown) lacks cuInit,"));
        let all = lacking(CALLED, Some(11000));
        assert!(all.contains(&format!("cuDeviceGetName and {} more,", CALLED.len() - 6)), "{all}");
    }
}
