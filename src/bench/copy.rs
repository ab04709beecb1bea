//! The copy measurements: the sizes measured, and for each the copy rate through the IPC mapping beside the
//! limit of that path (the [`Reference`]: an in-process peer copy between the same two GPUs, or a local copy
//! where the pair is one GPU).

use std::time::Instant;

use anyhow::Result;

use crate::driver::Driver;
use crate::gpu::Stream;
use crate::ipc::{DeviceBuffer, OpenedBuffer};
use crate::os::stop::StopCheck;

const SMALLEST: usize = 4 * 1024;

/// 4 KiB, 16 KiB, ... up to `max` (each size four times the last).
pub fn sizes(max: usize) -> Vec<usize> {
    std::iter::successors(Some(SMALLEST), |s| s.checked_mul(4)).take_while(|s| *s <= max).collect()
}

/// Copies per bandwidth measurement: about 4 GiB moved, at least 3 copies.
fn copies(size: usize) -> u32 {
    ((4usize << 30) / size).clamp(3, 1000) as u32
}

/// What the IPC copy of a pair is compared with: the limit of its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    /// The pair is one GPU: a copy between two buffers of this process on it.
    LocalCopy,
    /// Two GPUs: a peer copy from a buffer of this process on the producer's GPU.
    PeerCopy,
}

impl Reference {
    /// The reference of the pair (producer GPU, consumer GPU).
    pub fn of(producer: i32, consumer: i32) -> Self {
        if producer == consumer { Reference::LocalCopy } else { Reference::PeerCopy }
    }

    /// Its name in the JSON (`reference_name`).
    pub fn name(self) -> &'static str {
        match self {
            Reference::LocalCopy => "local copy",
            Reference::PeerCopy => "in-process peer copy",
        }
    }

    /// The heading of its column in the table of rates.
    pub fn column(self) -> &'static str {
        match self {
            Reference::LocalCopy => "local copy GB/s",
            Reference::PeerCopy => "in-process peer GB/s",
        }
    }
}

/// The rates of one size, in GB/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub bytes: usize,
    /// Through the IPC mapping.
    pub ipc: f64,
    /// Of the pair's [`Reference`].
    pub reference: f64,
    pub compared_with: Reference,
    /// The size fits in the consumer's L2 cache: the rates are the cache's, not memory's.
    pub in_l2: bool,
}

impl Rates {
    /// The IPC rate as a percentage of the reference.
    pub fn ipc_percent(&self) -> f64 {
        100.0 * self.ipc / self.reference
    }
}

/// The copy rate through the IPC mapping `shared`, and that of the pair's reference (copied from a buffer
/// of this process on the producer's GPU, which is the consumer's where the pair is one GPU).
#[allow(clippy::too_many_arguments)]
pub fn copy_rates(
    driver: &dyn Driver,
    stream: &Stream,
    shared: &OpenedBuffer,
    (producer, consumer): (i32, i32),
    reference: Reference,
    size: usize,
    l2: u64,
    stop: &dyn StopCheck,
) -> Result<Rates> {
    let source = DeviceBuffer::allocate(driver, producer, size)?;
    let into = DeviceBuffer::allocate(driver, consumer, size)?;
    stream.fill(&into, 0, size)?;
    // Bytes per second of `copy`, repeated after one warm-up, in GB/s.
    let rate = |copy: &dyn Fn() -> Result<()>| -> Result<f64> {
        copy()?;
        stream.synchronize(stop)?;
        let n = copies(size);
        let start = Instant::now();
        for _ in 0..n {
            copy()?;
        }
        stream.synchronize(stop)?;
        Ok(size as f64 * f64::from(n) / start.elapsed().as_secs_f64() / 1e9)
    };
    let ipc = rate(&|| stream.copy(&into, shared, size))?;
    let reference_rate = rate(&|| stream.copy(&into, &source, size))?;
    Ok(Rates {
        bytes: size,
        ipc,
        reference: reference_rate,
        compared_with: reference,
        in_l2: size as u64 <= l2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ipc_rate_is_a_percentage_of_the_reference() {
        let rates = Rates {
            bytes: 4096,
            ipc: 50.0,
            reference: 200.0,
            compared_with: Reference::LocalCopy,
            in_l2: true,
        };
        assert_eq!(rates.ipc_percent(), 25.0);
    }

    #[test]
    fn sizes_go_from_4_kib_to_the_maximum_by_fours() {
        assert_eq!(sizes(64 * 1024), vec![4096, 16384, 65536]);
        assert_eq!(sizes(1 << 30).len(), 10);
        assert_eq!(sizes(1 << 30).last(), Some(&(1 << 30)));
        assert!(sizes(1000).is_empty());
        assert!(copies(4096) > copies(1 << 30) && copies(1 << 30) >= 3);
    }

    #[test]
    fn one_gpu_is_compared_with_a_local_copy_two_with_a_peer_copy() {
        assert_eq!(Reference::of(1, 1), Reference::LocalCopy);
        assert_eq!(Reference::of(0, 1).name(), "in-process peer copy");
        assert_eq!(Reference::of(0, 0).column(), "local copy GB/s");
    }
}
