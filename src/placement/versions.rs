//! The library versions a process can read in its own container, where the forecast's answer depends on
//! them: NCCL's, by `ncclGetVersion` of the `libnccl.so.2` the dynamic loader finds (as NCCL's users load
//! it). UCX is not loaded for it: its constructors start threads, which the forks of an isolated run must not
//! meet; PyTorch is a Python package, not a library to load. Where a version cannot be read, the forecast
//! takes the newest release and names the range where the answer differs.

use serde::{Deserialize, Serialize};

/// A library's version, as `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Version(pub u32, pub u32, pub u32);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// NCCL's `NCCL_VERSION_CODE` as `ncclGetVersion` gives it: `major * 10000 + minor * 100 + patch` from
/// 2.9, `major * 1000 + minor * 100 + patch` before (src/nccl.h.in, `NCCL_VERSION`).
pub fn nccl_from_code(code: i32) -> Option<Version> {
    let code = u32::try_from(code).ok()?;
    let (major, minor, patch) = if code >= 20900 {
        (code / 10000, code % 10000 / 100, code % 100)
    } else {
        (code / 1000, code % 1000 / 100, code % 100)
    };
    (major > 0).then_some(Version(major, minor, patch))
}

/// The version of the NCCL this process would load (`libnccl.so.2`, as the dynamic loader finds it, or
/// `SIMPLE_IPC_NCCL_LIBRARY` where set: the path of one in a Python package, say), if one is there.
pub fn nccl() -> Option<Version> {
    let name = std::env::var_os("SIMPLE_IPC_NCCL_LIBRARY").unwrap_or_else(|| "libnccl.so.2".into());
    // SAFETY: loading a library runs its initialisers: NCCL's read its settings and start nothing (its
    // threads start with a communicator); the library stays loaded for the process's life (no unload while
    // a function of it could run).
    let library = unsafe { libloading::Library::new(&name) }.ok()?;
    // SAFETY: `ncclResult_t ncclGetVersion(int *version)` (src/nccl.h.in), which writes one int.
    let get = unsafe {
        library.get::<unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int>(b"ncclGetVersion")
    }
    .ok()?;
    let mut code: std::ffi::c_int = 0;
    // SAFETY: writes one int into `code`; ncclSuccess is 0.
    let ok = unsafe { get(&mut code) } == 0;
    std::mem::forget(library);
    ok.then(|| nccl_from_code(code)).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccls_version_code_is_read_as_its_header_makes_it() {
        assert_eq!(nccl_from_code(23007), Some(Version(2, 30, 7)));
        assert_eq!(nccl_from_code(21905), Some(Version(2, 19, 5)));
        assert_eq!(nccl_from_code(2708), Some(Version(2, 7, 8)), "before 2.9");
        assert_eq!(nccl_from_code(0), None);
        assert_eq!(nccl_from_code(-1), None);
        assert!(Version(2, 24, 3) > Version(2, 19, 0) && Version(2, 9, 0) < Version(2, 10, 3));
        assert_eq!(Version(2, 30, 7).to_string(), "2.30.7");
    }
}
