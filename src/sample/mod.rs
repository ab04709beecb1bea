//! simpleIPC's story (moved here whole; reshaped in the commits that follow).

pub(crate) mod attach;
pub(crate) mod barrier;
pub(crate) mod child;
pub(crate) mod children;
#[path = "parent.rs"]
pub(crate) mod parent;
pub mod segment;
pub(crate) mod verify;
