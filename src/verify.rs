//! The check at the end of a child's run: its buffer copied back into a host buffer prepared in advance
//! (pre-faulted and, where the driver allows, pinned), then compared with the byte it must hold everywhere.

use anyhow::{Context, Result};
use memmap2::{MmapMut, MmapOptions};

use crate::driver::{DevicePtr, Driver, RawStream};

/// Host memory for the copy back: mapped and faulted in up front, pinned if possible, unpinned on drop.
pub struct HostBuffer<'d> {
    driver: &'d dyn Driver,
    memory: MmapMut,
    pinned: bool,
}

/// Maps `bytes` of anonymous memory and faults every page in. It needs no driver, so a child starts it on a
/// thread of its own while CUDA starts.
pub fn fault_in(bytes: usize) -> Result<MmapMut> {
    MmapOptions::new().len(bytes).populate().map_anon().context("mapping the host buffer for the copy back")
}

impl<'d> HostBuffer<'d> {
    pub fn prepare(driver: &'d dyn Driver, bytes: usize) -> Result<Self> {
        Self::pin(driver, fault_in(bytes)?)
    }

    /// Pins memory made by [`fault_in`] (on the current device's context).
    pub fn pin(driver: &'d dyn Driver, mut memory: MmapMut) -> Result<Self> {
        let pinned = driver.pin_host_memory(&mut memory)?;
        Ok(Self { driver, memory, pinned })
    }

    /// Copies `src` (a device buffer of at least this buffer's size) in stream order, and waits for it.
    pub fn copy_from(&mut self, src: DevicePtr, stream: RawStream) -> Result<&mut [u8]> {
        self.driver.copy_to_host(&mut self.memory, src, stream)?;
        Ok(&mut self.memory)
    }

    /// The first `len` bytes (at most the whole buffer), for staging copies.
    pub fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(self.memory.len());
        &mut self.memory[..len]
    }
}

impl Drop for HostBuffer<'_> {
    fn drop(&mut self) {
        if self.pinned
            && let Err(e) = self.driver.unpin_host_memory(&mut self.memory)
        {
            eprintln!("warning: unpinning the host buffer: {e:#}");
        }
    }
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
/// block-by-block `memcmp`; only when a block differs are its bytes counted one by one.
pub fn find_mismatches(data: &[u8], expected: u8) -> Mismatches {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
    let share = data.len().div_ceil(threads).next_multiple_of(BLOCK).max(BLOCK);
    let reference = vec![expected; BLOCK];
    let parts: Vec<Mismatches> = std::thread::scope(|scope| {
        let workers: Vec<_> = data
            .chunks(share)
            .enumerate()
            .map(|(i, part)| {
                let reference = &reference;
                scope.spawn(move || count_in(part, i * share, expected, reference))
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or(Mismatches { count: share, first: None })).collect()
    });
    parts.into_iter().fold(Mismatches { count: 0, first: None }, |total, part| Mismatches {
        count: total.count + part.count,
        first: total.first.or(part.first),
    })
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
        assert_eq!(find_mismatches(&data, 3), Mismatches { count: 0, first: None });
        data[1002] = 9; // in the tail that is not a whole word
        assert_eq!(find_mismatches(&data, 3), Mismatches { count: 1, first: Some((1002, 9)) });
        data[17] = 0;
        data[18] = 0;
        assert_eq!(find_mismatches(&data, 3), Mismatches { count: 3, first: Some((17, 0)) });
        assert_eq!(find_mismatches(&data, 4).count, 1003);

        // Several blocks and threads: the first offender is the lowest offset, counts add up.
        let mut big = vec![5u8; 3 * BLOCK * MAX_THREADS + 77];
        let last = big.len() - 1;
        big[last] = 1;
        big[2 * BLOCK + 3] = 2;
        assert_eq!(find_mismatches(&big, 5), Mismatches { count: 2, first: Some((2 * BLOCK + 3, 2)) });
    }
}
