//! Step 8, verify: the byte the round-robin must leave in every byte of each buffer, and the comparison of
//! a buffer's copy with it (the original's loop over `verification_buffer`), in parallel. The parent's own
//! check of every buffer (`--serve`, `--isolate`) uses them too (`tool::own_check`).

use anyhow::{Result, anyhow};

/// The byte that buffer `index` of `n` holds everywhere after the round-robin: at the last step, process
/// `(index + 1) % n` writes its index into it.
pub fn expected_byte(index: usize, n: usize) -> u8 {
    ((index + 1) % n) as u8
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
