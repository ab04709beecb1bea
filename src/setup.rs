//! The set-up the parent's roles share (the sample's parent, the benchmark's consumer): the segment, the
//! guardian, the driver or the waiver where there is none, and the chosen devices or the waiver where none
//! fits (both noted for the `--json` document). What each role does next is its own.

use anyhow::Result;

use crate::devices;
use crate::driver::Driver;
use crate::outcome::Waiver;
use crate::report::Findings;
use crate::segment::{self, Segment};
use crate::supervise::guardian::Guardian;

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

/// Creates the segment and starts the guardian, then loads the driver and chooses the devices; the waiver
/// where there is no driver or no device fits. `before_selection` runs between the
/// two (the parent enters its device-selection phase there).
/// The driver and the devices are noted in `findings`, for the document.
pub fn start(
    before_selection: impl FnOnce() -> Result<()>,
    findings: &mut Findings,
) -> Result<Result<Setup, Waiver>> {
    let (segment, guardian) = segment_and_guardian()?;
    Ok(cuda_and_devices(before_selection, findings)?.map(|(cuda, chosen)| Setup {
        cuda,
        guardian,
        segment,
        chosen,
    }))
}

/// The segment `simpleIPCshm<our pid>`, its header written, and the guardian, started.
pub fn segment_and_guardian() -> Result<(Segment, Guardian)> {
    let segment = Segment::create(&segment::name_for(std::process::id()))?;
    Ok((segment, Guardian::start()?))
}

/// Whether a CUDA driver library is here to load (no GPU is asked: that is `cuInit`'s, in
/// [`cuda_and_devices`]). The library stays loaded.
pub fn cuda_library_here() -> bool {
    crate::driver::library_here()
}

/// The driver, and the devices that fit (never none).
pub type CudaAndDevices = (Box<dyn Driver>, Vec<i32>);

/// The driver (`cuInit`) and the devices that fit (`devices::select`, never none), or the waiver where there
/// is no driver or no device fits; `before_selection` runs between the two. Both are noted in `findings`.
pub fn cuda_and_devices(
    before_selection: impl FnOnce() -> Result<()>,
    findings: &mut Findings,
) -> Result<Result<CudaAndDevices, Waiver>> {
    let cuda = match devices::load_or_waive()? {
        Ok(cuda) => cuda,
        Err(waiver) => return Ok(Err(waiver)),
    };
    findings.note_driver(&*cuda);
    before_selection()?;
    let chosen = devices::select(&*cuda)?;
    findings.note_devices(&*cuda, &chosen);
    if chosen.is_empty() {
        return Ok(Err(Waiver("No CUDA devices support IPC".into())));
    }
    Ok(Ok((cuda, chosen)))
}
