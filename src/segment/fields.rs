//! The segment's own field types, beside its layout (`SharedState`): where the run stands ([`RunState`], a
//! futex word), one handle's bytes as atomics ([`HandleSlot`]), and the IPC benchmark's words
//! ([`BenchFlags`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::{HANDLE_SIZE, HandleBytes};

/// Where the run stands; children wait on it (it is also a futex word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum RunState {
    /// Only the header is written: the parent is still choosing the devices (the first device's children
    /// start CUDA meanwhile), so the number of processes and who runs where are not known yet.
    Planning = 0,
    /// The plan is written (`nprocesses`, `devices`, the mechanism); buffers and events not yet exported.
    Starting = 1,
    /// Every handle is in the segment: children may open them.
    Ready = 2,
    /// A process failed or the run was interrupted: everybody stops.
    Aborted = 3,
    /// The parent waived the run once children had started (no device, or the mechanism missing):
    /// everybody stops, quietly (nothing failed).
    Waived = 4,
}

/// One IPC handle's 64 bytes, as atomics.
#[repr(C)]
pub struct HandleSlot([AtomicU64; HANDLE_SIZE / 8]);

impl HandleSlot {
    pub fn store(&self, handle: &HandleBytes) {
        for (word, bytes) in self.0.iter().zip(handle.chunks_exact(8)) {
            let mut le = [0u8; 8];
            le.copy_from_slice(bytes);
            word.store(u64::from_le_bytes(le), Ordering::Relaxed);
        }
    }

    pub fn load(&self) -> HandleBytes {
        let mut handle = [0u8; HANDLE_SIZE];
        for (word, bytes) in self.0.iter().zip(handle.chunks_exact_mut(8)) {
            bytes.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        handle
    }
}

/// The IPC benchmark's shared words: the consumer raises `ping`, the producer answers with `pong`.
#[repr(C)]
pub struct BenchFlags {
    /// How many (producer, consumer) pairs of devices the benchmark goes through.
    pub pairs: AtomicU32,
    /// The producer's device in the current pair.
    pub producer_device: AtomicU32,
    pub ping: AtomicU32,
    pub pong: AtomicU32,
    /// The step each side (consumer, producer) is at in its rendezvous (see `bench::rendezvous`), by the
    /// parity of its meetings: a side writes the other slot before it meets next, so the slot of this meeting
    /// holds until both have read it.
    pub steps: [[AtomicU32; 2]; 2],
}
