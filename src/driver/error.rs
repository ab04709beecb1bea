//! How a driver call fails: a typed error that carries the call and its `CUresult` ([`CallFailed`]), the
//! `CUresult` numbers the program reasons about with the driver's names for them ([`code`]).

/// A driver call that failed: which call, and the `CUresult` it answered, as a number (the oldest bindings
/// lack some names, and the simulation answers the same numbers), so that callers match on the code.
#[derive(Debug)]
pub struct CallFailed {
    pub call: String,
    pub code: u32,
    /// The driver's own name and words for the code (`CUDA_ERROR_MAP_FAILED (205): mapping failed`).
    pub text: String,
    /// The simulation answered so because what it was asked is beyond what it models (see
    /// [`super::host::BEYOND_THE_SIMULATION`]): not how the CUDA driver answers. Always false for the driver.
    pub beyond_the_simulation: bool,
}

impl std::fmt::Display for CallFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.call, self.text)
    }
}

impl std::error::Error for CallFailed {}

/// The `CUresult` numbers the program reasons about, and those the simulation answers.
pub mod code {
    pub const INVALID_VALUE: u32 = 1;
    pub const INVALID_DEVICE: u32 = 101;
    pub const INVALID_CONTEXT: u32 = 201;
    pub const MAP_FAILED: u32 = 205;
    pub const INVALID_HANDLE: u32 = 400;
    pub const NOT_FOUND: u32 = 500;
    pub const HOST_MEMORY_ALREADY_REGISTERED: u32 = 712;
    pub const HOST_MEMORY_NOT_REGISTERED: u32 = 713;
    /// What `cuMemCreate` of a fabric-shareable allocation answers where the process has no IMEX channel.
    pub const NOT_PERMITTED: u32 = 800;
    pub const NOT_SUPPORTED: u32 = 801;
    pub const OPERATING_SYSTEM: u32 = 304;

    /// The CUDA driver's name and words for `code` (what `cuGetErrorName` and `cuGetErrorString` say), for
    /// the codes above: the simulation's failures read like the driver's.
    pub fn name_and_words(code: u32) -> (&'static str, &'static str) {
        match code {
            INVALID_VALUE => ("CUDA_ERROR_INVALID_VALUE", "invalid argument"),
            INVALID_DEVICE => ("CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
            INVALID_CONTEXT => ("CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
            MAP_FAILED => ("CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"),
            INVALID_HANDLE => ("CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
            NOT_FOUND => ("CUDA_ERROR_NOT_FOUND", "named symbol not found"),
            HOST_MEMORY_ALREADY_REGISTERED => (
                "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
                "part or all of the requested memory range is already mapped",
            ),
            HOST_MEMORY_NOT_REGISTERED => (
                "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
                "pointer does not correspond to a registered memory region",
            ),
            NOT_PERMITTED => ("CUDA_ERROR_NOT_PERMITTED", "operation not permitted"),
            NOT_SUPPORTED => ("CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
            OPERATING_SYSTEM => {
                ("CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS")
            }
            _ => ("CUDA_ERROR_UNKNOWN", "unknown error"),
        }
    }
}

/// The `CUresult` of the driver call that made `error`, if a driver call did.
pub fn failed_code(error: &anyhow::Error) -> Option<u32> {
    error.chain().find_map(|cause| cause.downcast_ref::<CallFailed>()).map(|failed| failed.code)
}
