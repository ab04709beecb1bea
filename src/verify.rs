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

impl<'d> HostBuffer<'d> {
    pub fn prepare(driver: &'d dyn Driver, bytes: usize) -> Result<Self> {
        let mut memory = MmapOptions::new()
            .len(bytes)
            .populate()
            .map_anon()
            .context("mapping the host buffer for the copy back")?;
        let pinned = driver.pin_host_memory(&mut memory)?;
        Ok(Self {
            driver,
            memory,
            pinned,
        })
    }

    /// Copies `src` (a device buffer of at least this buffer's size) in stream order, and waits for it.
    pub fn copy_from(&mut self, src: DevicePtr, stream: RawStream) -> Result<&mut [u8]> {
        self.driver.copy_to_host(&mut self.memory, src, stream)?;
        Ok(&mut self.memory)
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

/// Counts the bytes of `data` that differ from `expected`, eight at a time (the compiler vectorises it).
pub fn find_mismatches(data: &[u8], expected: u8) -> Mismatches {
    let pattern = u64::from_ne_bytes([expected; 8]);
    let (words, tail) = data.split_at(data.len() - data.len() % 8);
    let wrong_words = words
        .chunks_exact(8)
        .filter(|w| u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]) != pattern)
        .count();
    if wrong_words == 0 && tail.iter().all(|&b| b == expected) {
        return Mismatches {
            count: 0,
            first: None,
        };
    }
    // Slow path, only when something is wrong: exact count and the first offender.
    let count = data.iter().filter(|&&b| b != expected).count();
    let first = data
        .iter()
        .position(|&b| b != expected)
        .map(|at| (at, data[at]));
    Mismatches { count, first }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_count_and_first_wrong_byte_anywhere() {
        let mut data = vec![3u8; 1003];
        assert_eq!(
            find_mismatches(&data, 3),
            Mismatches {
                count: 0,
                first: None
            }
        );
        data[1002] = 9; // in the tail that is not a whole word
        assert_eq!(
            find_mismatches(&data, 3),
            Mismatches {
                count: 1,
                first: Some((1002, 9))
            }
        );
        data[17] = 0;
        data[18] = 0;
        assert_eq!(
            find_mismatches(&data, 3),
            Mismatches {
                count: 3,
                first: Some((17, 0))
            }
        );
        assert_eq!(find_mismatches(&data, 4).count, 1003);
    }
}
