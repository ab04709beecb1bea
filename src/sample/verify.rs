//! The checks at the end of a run: a child's of its own buffer, and the check a server (or the parent of an
//! isolated run) makes of every buffer itself, so that its verdict rests on what it saw, never on what the
//! processes that joined it say. Each copies the buffer back and compares it with the byte the round-robin
//! must leave in it everywhere, in parallel.

use anyhow::{Context, Result, anyhow, bail};

use crate::driver::Driver;
use crate::fault;
use crate::gpu::host_buffer::{self, HostBuffer};
use crate::gpu::{DeviceMemory, Stream};
use crate::phase::Who;
use crate::stop::StopCheck;

/// The byte that buffer `index` of `n` holds everywhere after the round-robin: at the last step, process
/// `(index + 1) % n` writes its index into it.
pub fn expected_byte(index: usize, n: usize) -> u8 {
    ((index + 1) % n) as u8
}

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

/// What the comparison found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatches {
    pub count: usize,
    /// Offset and value of the first wrong byte.
    pub first: Option<(usize, u8)>,
}

/// Bytes compared at a time against a block of the expected value (`memcmp`, vectorised by libc).
const BLOCK: usize = 64 * 1024;
/// Threads for the comparison: it is bound by memory bandwidth, which a few cores saturate.
const MAX_THREADS: usize = 8;

/// Counts the bytes of `data` that differ from `expected`. The common case (nothing wrong) is a parallel
/// block-by-block `memcmp`; only when a block differs are its bytes counted one by one. A worker that cannot
/// start or that fails makes it an error: a comparison that did not happen never passes.
pub fn find_mismatches(data: &[u8], expected: u8) -> Result<Mismatches> {
    find_mismatches_with(data, expected, count_in)
}

/// [`find_mismatches`] with the per-part counter as a parameter, so that a test can make a worker fail.
fn find_mismatches_with(
    data: &[u8],
    expected: u8,
    count: fn(&[u8], usize, u8, &[u8]) -> Mismatches,
) -> Result<Mismatches> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
    let share = data.len().div_ceil(threads).next_multiple_of(BLOCK).max(BLOCK);
    let reference = vec![expected; BLOCK];
    let parts: Result<Vec<Mismatches>> = std::thread::scope(|scope| {
        let mut workers = Vec::new();
        for (i, part) in data.chunks(share).enumerate() {
            let reference = &reference;
            let worker = std::thread::Builder::new()
                .spawn_scoped(scope, move || count(part, i * share, expected, reference))
                .map_err(|e| anyhow!("starting a comparison thread: {e}"))?;
            workers.push(worker);
        }
        workers.into_iter().map(|w| w.join().map_err(|_| anyhow!("a comparison thread failed"))).collect()
    });
    Ok(parts?.into_iter().fold(Mismatches { count: 0, first: None }, |total, part| Mismatches {
        count: total.count + part.count,
        first: total.first.or(part.first),
    }))
}

fn count_in(part: &[u8], base: usize, expected: u8, reference: &[u8]) -> Mismatches {
    let mut found = Mismatches { count: 0, first: None };
    for (i, block) in part.chunks(BLOCK).enumerate() {
        if block == &reference[..block.len()] {
            continue;
        }
        for (j, &byte) in block.iter().enumerate().filter(|(_, b)| **b != expected) {
            found.count += 1;
            found.first = found.first.or(Some((base + i * BLOCK + j, byte)));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_count_and_first_wrong_byte_anywhere() {
        let mut data = vec![3u8; 1003];
        assert_eq!(find_mismatches(&data, 3).unwrap(), Mismatches { count: 0, first: None });
        data[1002] = 9; // in the tail that is not a whole word
        assert_eq!(find_mismatches(&data, 3).unwrap(), Mismatches { count: 1, first: Some((1002, 9)) });
        data[17] = 0;
        data[18] = 0;
        assert_eq!(find_mismatches(&data, 3).unwrap(), Mismatches { count: 3, first: Some((17, 0)) });
        assert_eq!(find_mismatches(&data, 4).unwrap().count, 1003);

        // Several blocks and threads: the first offender is the lowest offset, counts add up.
        let mut big = vec![5u8; 3 * BLOCK * MAX_THREADS + 77];
        let last = big.len() - 1;
        big[last] = 1;
        big[2 * BLOCK + 3] = 2;
        assert_eq!(
            find_mismatches(&big, 5).unwrap(),
            Mismatches { count: 2, first: Some((2 * BLOCK + 3, 2)) }
        );
    }

    #[test]
    fn the_last_writer_of_each_buffer_is_the_next_process() {
        assert_eq!((0..4).map(|i| expected_byte(i, 4)).collect::<Vec<_>>(), [1, 2, 3, 0]);
        assert_eq!(expected_byte(0, 1), 0);
        assert!((0..32).all(|i| (1..=32).all(|n| expected_byte(i % n, n) != UNWRITTEN)));
    }

    #[test]
    fn a_failed_comparison_worker_fails_the_comparison() {
        fn failing(_: &[u8], base: usize, _: u8, _: &[u8]) -> Mismatches {
            if base > 0 {
                panic!("worker failed");
            }
            Mismatches { count: 0, first: None }
        }
        let data = vec![1u8; 4 * BLOCK * MAX_THREADS];
        let result = find_mismatches_with(&data, 1, failing);
        assert!(result.is_err(), "a comparison with a failed worker passed: {result:?}");
        assert_eq!(find_mismatches_with(&data, 1, count_in).unwrap().count, 0);
    }
}
