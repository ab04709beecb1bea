//! `--sync memops`: the round-robin ordered by stream memory operations on a flag after each buffer's data,
//! which counts the writes done, instead of the original's interprocess events (which it then makes none of).

use anyhow::Result;

use crate::gpu::{DeviceMemory, Slice, Stream};
use crate::ipc::OpenedBuffer;
use crate::sample::extras::WriteOrder;
pub(super) use crate::segment::FLAG_BYTES;

/// Zeroes the flag after the `data` bytes of `buffer`, on `stream`: no write done yet.
pub(super) fn zero_flag(stream: &Stream, buffer: &impl DeviceMemory, data: usize) -> Result<()> {
    stream.fill(&Slice::of(buffer, data, FLAG_BYTES)?, 0, FLAG_BYTES)
}

/// The flag of every buffer a child opened: the stream waits until the buffer's flag says `step` writes are
/// done, and writes `step + 1` after the kernel.
pub(super) struct Flags<'a>(Vec<Slice<'a>>);

impl<'a> Flags<'a> {
    /// The flags after the `data` bytes of each of `buffers`.
    pub(super) fn of(buffers: &'a [OpenedBuffer], data: usize) -> Result<Self> {
        buffers.iter().map(|b| Slice::of(b, data, FLAG_BYTES)).collect::<Result<_>>().map(Flags)
    }
}

impl WriteOrder for Flags<'_> {
    fn wait_for_writes(&self, stream: &Stream, target: usize, step: usize) -> Result<()> {
        stream.wait_flag(&self.0[target], step as u32)
    }

    fn after_writing(&self, stream: &Stream, target: usize, step: usize) -> Result<()> {
        stream.write_flag(&self.0[target], step as u32 + 1)
    }
}
