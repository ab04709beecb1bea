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
use crate::sample::verify::{Mismatches, expected_byte, find_mismatches};

/// The byte a checking parent fills every buffer with before the run: no process writes it (there are at
/// most 32), so a buffer nobody wrote cannot pass, whatever the allocation held before.
pub const UNWRITTEN: u8 = 0xEE;

/// Bytes copied back and compared at a time: the check's host buffer is this big, not a whole buffer, so
/// that it faults in and pins 8 MiB once rather than 64 MiB (about 25 of the check's 35 ms on the H100 host).
const PART: usize = 8 << 20;

/// The parent's own check: copies back every buffer it exported (`buffers[i]` on `devices[i]`, `bytes`
/// long), a part at a time, and compares each with the byte the round-robin must leave in it.
pub fn every_buffer(
    driver: &dyn Driver,
    buffers: &[&dyn DeviceMemory],
    devices: &[i32],
    bytes: usize,
    stop: &dyn StopCheck,
) -> Result<()> {
    let corrupt =
        |data: &mut [u8], at, expected| fault::corrupt_if_asked(Who::Parent, data, at, bytes, expected);
    every_buffer_with(driver, buffers, devices, bytes, stop, &corrupt)
}

/// [`every_buffer`], with what the `corrupt` fault does to each part copied back (the part, its offset in
/// the buffer, the byte expected) as a parameter, so that a test can corrupt a buffer as the fault does
/// without the variable, which every test in the process would see.
fn every_buffer_with(
    driver: &dyn Driver,
    buffers: &[&dyn DeviceMemory],
    devices: &[i32],
    bytes: usize,
    stop: &dyn StopCheck,
    corrupt: &dyn Fn(&mut [u8], usize, u8),
) -> Result<()> {
    let n = buffers.len();
    let part = bytes.clamp(1, PART);
    let mut wrong = Vec::new();
    let mut host: Option<(i32, HostBuffer, Stream)> = None;
    for (index, (&buffer, &device)) in buffers.iter().zip(devices).enumerate() {
        // One host buffer and stream per device, made as the device comes (the buffers are in device order).
        if host.as_ref().is_none_or(|(d, ..)| *d != device) {
            drop(host.take()); // unpinned before the next is pinned
            let memory = host_buffer::fault_in(part)?;
            host = Some((
                device,
                HostBuffer::pin(driver, device, memory)?,
                Stream::non_blocking(driver, device)?,
            ));
        }
        let Some((_, host, stream)) = host.as_mut() else { continue };
        let expected = expected_byte(index, n);
        let mut found = Mismatches { count: 0, first: None };
        for offset in (0..bytes).step_by(part) {
            let data = host
                .copy_part_from(buffer, offset, part.min(bytes - offset), stream, stop)
                .with_context(|| format!("copying back the buffer of process {index} to check it"))?;
            corrupt(data, offset, expected);
            let here = find_mismatches(data, expected)?;
            found.count += here.count;
            found.first = found.first.or(here.first.map(|(at, value)| (offset + at, value)));
        }
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

    /// A buffer longer than a part is checked whole: a wrong byte in its second part is found, named at its
    /// offset in the buffer, and counted once.
    #[test]
    fn every_part_of_a_buffer_is_checked() {
        use crate::gpu::{DeviceBuffer, Slice};
        let driver = crate::driver::host::HostDriver::for_tests("ok").unwrap();
        let bytes = 2 * PART + 5;
        let (first, second) = (expected_byte(0, 2), expected_byte(1, 2));
        let buffers = [
            DeviceBuffer::allocate(&driver, 0, bytes).unwrap(),
            DeviceBuffer::allocate(&driver, 0, bytes).unwrap(),
        ];
        let stream = Stream::non_blocking(&driver, 0).unwrap();
        stream.fill(&buffers[0], first, bytes).unwrap();
        stream.fill(&buffers[1], second, bytes).unwrap();
        let check = |buffers: &[DeviceBuffer]| {
            let memory: Vec<&dyn DeviceMemory> = buffers.iter().map(|b| b as &dyn DeviceMemory).collect();
            every_buffer(&driver, &memory, &[0, 0], bytes, &|| Ok(()))
        };
        stream.synchronize(&|| Ok(())).unwrap();
        check(&buffers).unwrap();
        let wrong_at = PART + 3;
        stream.fill(&Slice::of(&buffers[1], wrong_at, 1).unwrap(), UNWRITTEN, 1).unwrap();
        stream.fill(&Slice::of(&buffers[1], bytes - 1, 1).unwrap(), first, 1).unwrap();
        stream.synchronize(&|| Ok(())).unwrap();
        let said = check(&buffers).unwrap_err().to_string();
        assert_eq!(
            said,
            format!(
                "the parent's own check of every buffer failed: the buffer of process 1 has 2 of {bytes} bytes \
                 that are not {second}; the first, at offset {wrong_at}, is {UNWRITTEN} (the byte it held before \
                 the run: unwritten)"
            )
        );
    }

    /// The `corrupt` fault changes the same two bytes of a buffer copied back a part at a time as of one
    /// copied back whole: the one a third of the way in and the last, which is in the last part.
    #[test]
    fn the_corrupt_fault_reaches_the_last_part() {
        use crate::gpu::DeviceBuffer;
        let driver = crate::driver::host::HostDriver::for_tests("ok").unwrap();
        let bytes = 2 * PART + 5;
        let expected = expected_byte(0, 1);
        let buffer = DeviceBuffer::allocate(&driver, 0, bytes).unwrap();
        let stream = Stream::non_blocking(&driver, 0).unwrap();
        stream.fill(&buffer, expected, bytes).unwrap();
        stream.synchronize(&|| Ok(())).unwrap();
        let corrupt = |data: &mut [u8], at, expected| fault::corrupt(data, at, bytes, expected);
        let said = every_buffer_with(&driver, &[&buffer], &[0], bytes, &|| Ok(()), &corrupt).unwrap_err();
        let mut whole = vec![expected; bytes];
        fault::corrupt(&mut whole, 0, bytes, expected);
        let changed: Vec<usize> = (0..bytes).filter(|&i| whole[i] != expected).collect();
        assert_eq!(changed, [(bytes - 1) / 3, bytes - 1]);
        assert_eq!(
            said.to_string(),
            format!(
                "the parent's own check of every buffer failed: the buffer of process 0 has 2 of {bytes} bytes \
                 that are not {expected}; the first, at offset {}, is {}",
                changed[0], whole[changed[0]]
            )
        );
    }

    #[test]
    fn no_process_writes_the_unwritten_byte() {
        assert!((0..32).all(|i| (1..=32).all(|n| expected_byte(i % n, n) != UNWRITTEN)));
    }
}
