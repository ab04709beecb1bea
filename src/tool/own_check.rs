//! The parent's own check of every buffer, where processes it did not start from its own program
//! (`--serve`), or that run where it cannot see them (`--isolate`), took part: its verdict rests on what it
//! saw, never on what the processes that joined it say. It copies each buffer back and compares it with the
//! byte the round-robin must leave in it (`sample::verify`).

use anyhow::{Context, Result, bail};

use crate::driver::Driver;
use crate::gpu::host_buffer::{self, HostBuffer};
use crate::gpu::{DeviceMemory, Stream};
use crate::os::stop::StopCheck;
use crate::phases::Who;
use crate::phases::fault;
use crate::sample::verify::{expected_byte, find_mismatches};

/// The byte a checking parent fills every buffer with before the run: no process writes it (there are at
/// most 32), so a buffer nobody wrote cannot pass, whatever the allocation held before.
pub const UNWRITTEN: u8 = 0xEE;

/// The parent's own check: copies back every buffer it exported (`buffers[i]` on `devices[i]`, `bytes`
/// long) and compares each with the byte the round-robin must leave in it.
pub fn every_buffer(
    driver: &dyn Driver,
    buffers: &[&dyn DeviceMemory],
    devices: &[i32],
    bytes: usize,
    stop: &dyn StopCheck,
) -> Result<()> {
    let n = buffers.len();
    let mut wrong = Vec::new();
    let mut host: Option<(i32, HostBuffer, Stream)> = None;
    for (index, (&buffer, &device)) in buffers.iter().zip(devices).enumerate() {
        // One host buffer and stream per device, made as the device comes (the buffers are in device order).
        if host.as_ref().is_none_or(|(d, ..)| *d != device) {
            drop(host.take()); // unpinned before the next is pinned
            let memory = host_buffer::fault_in(bytes)?;
            host = Some((
                device,
                HostBuffer::pin(driver, device, memory)?,
                Stream::non_blocking(driver, device)?,
            ));
        }
        let Some((_, host, stream)) = host.as_mut() else { continue };
        let data = host
            .copy_from(buffer, bytes, stream, stop)
            .with_context(|| format!("copying back the buffer of process {index} to check it"))?;
        let expected = expected_byte(index, n);
        fault::corrupt_if_asked(Who::Parent, data, expected);
        let found = find_mismatches(data, expected)?;
        if let Some((offset, value)) = found.first {
            let said = if value == UNWRITTEN { " (the byte it held before the run: unwritten)" } else { "" };
            wrong.push(format!(
                "the buffer of process {index} has {} of {bytes} bytes that are not {expected}; the first, at \
                 offset {offset}, is {value}{said}",
                found.count
            ));
        }
    }
    if !wrong.is_empty() {
        bail!("the parent's own check of every buffer failed: {}", wrong.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_process_writes_the_unwritten_byte() {
        assert!((0..32).all(|i| (1..=32).all(|n| expected_byte(i % n, n) != UNWRITTEN)));
    }
}
