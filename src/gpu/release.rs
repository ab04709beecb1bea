//! How every owner gives back, on drop, what it holds of the driver: with its device made current, by the
//! call that matches how it came; a failure is said, as there is no caller left to return it to.

use anyhow::Result;

use crate::driver::Driver;

/// Makes `device` current and calls `give_back` with the driver; says a failure as `warning: {what}: ...`.
pub(crate) fn release(
    driver: &dyn Driver,
    device: i32,
    what: &str,
    give_back: impl FnOnce(&dyn Driver) -> Result<()>,
) {
    if let Err(e) = driver.use_device(device).and_then(|()| give_back(driver)) {
        eprint_line!("warning: {what}: {e:#}");
    }
}
