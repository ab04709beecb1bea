//! The set-up the parent's roles share (the sample's parent, the benchmark's consumer): the segment, the
//! guardian, the driver or the waived line where there is none, and the chosen devices or the waived line
//! where none fits (both noted for the `--json` document). What each role does next is its own.

use anyhow::Result;

use crate::devices;
use crate::driver::Driver;
use crate::guardian::Guardian;
use crate::segment::{self, Segment};

/// What a parent's role starts from. Its fields drop in this order: CUDA is released (the exports that
/// borrow it dropped before), then the guardian, then the segment.
pub struct Setup {
    pub cuda: Box<dyn Driver>,
    /// Removes the driver's files for this process's events if it is killed; it outlives the exports.
    pub guardian: Guardian,
    /// `simpleIPCshm<our pid>`, with its header written.
    pub segment: Segment,
    /// The devices that fit (`devices::select`), never none.
    pub chosen: Vec<i32>,
}

/// Creates the segment and starts the guardian, then loads the driver and chooses the devices; `None`
/// after the waived line where there is no driver or no device fits. `before_selection` runs between the
/// two (the parent enters its device-selection phase there).
pub fn start(before_selection: impl FnOnce() -> Result<()>) -> Result<Option<Setup>> {
    let segment = Segment::create(&segment::name_for(std::process::id()))?;
    let guardian = Guardian::start()?;
    let Some(cuda) = devices::load_or_waive()? else { return Ok(None) };
    crate::report::note_driver(&*cuda);
    before_selection()?;
    let chosen = devices::select(&*cuda)?;
    crate::report::note_devices(&*cuda, &chosen);
    if chosen.is_empty() {
        waive!("No CUDA devices support IPC")?;
        return Ok(None);
    }
    Ok(Some(Setup { cuda, guardian, segment, chosen }))
}
