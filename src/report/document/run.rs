//! A plain run's part of the `--json` document: what each process spent in each phase, and who checked the
//! buffers.

use std::fmt;
use std::sync::atomic::Ordering;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::phases::timings::Phases;
use crate::segment::SharedState;

/// A plain run's results: what each process spent in each phase, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResults {
    /// `ms`, the unit of every phase.
    pub unit: String,
    /// How many processes took part (children, or processes that joined).
    pub processes: usize,
    /// The size of each process's buffer, every byte of which was verified.
    pub buffer_bytes: u64,
    /// Who checked the buffers: each process its own, always; and the parent every buffer itself, where
    /// processes it did not start from its own program took part (`--serve`) or ran where it cannot see
    /// them (`--isolate`), so that no word of theirs can pass the run.
    #[serde(default)]
    pub parent_checked_every_buffer: bool,
    pub parent: ParentResult,
    pub children: Vec<ChildResult>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParentResult {
    pub phases: PhaseTimes,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildResult {
    pub index: usize,
    /// The device it ran on.
    pub device: i32,
    pub phases: PhaseTimes,
    /// Its open descriptors before it opened the handles, and after it closed them: a descriptor received
    /// and not closed shows as a difference.
    pub descriptors_before_open: u32,
    pub descriptors_after_close: u32,
}

impl RunResults {
    /// From the parent's phases and what each child left in the segment.
    pub fn of(state: &SharedState, parent: &Phases, parent_checked_every_buffer: bool) -> Self {
        let children = (0..state.process_count())
            .map(|index| ChildResult {
                index,
                device: state.devices[index].load(Ordering::Relaxed),
                phases: PhaseTimes::of(&Phases::read(state, index)),
                descriptors_before_open: state.descriptors[index][0].load(Ordering::Relaxed),
                descriptors_after_close: state.descriptors[index][1].load(Ordering::Relaxed),
            })
            .collect();
        Self {
            unit: "ms".into(),
            processes: state.process_count(),
            buffer_bytes: state.data_size() as u64,
            parent_checked_every_buffer,
            parent: ParentResult { phases: PhaseTimes::of(parent) },
            children,
        }
    }
}

/// Milliseconds per phase, in the order a run goes through them, then `total`; a phase the process did not
/// go through is left out. An object in the document (`{"cuda_start": 41.2, ..., "total": 230.9}`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseTimes(pub Vec<(String, f64)>);

impl PhaseTimes {
    pub fn of(phases: &Phases) -> Self {
        Self(phases.in_ms().into_iter().map(|(name, ms)| (name.to_owned(), ms)).collect())
    }

    pub fn get(&self, phase: &str) -> Option<f64> {
        self.0.iter().find(|(name, _)| name == phase).map(|(_, ms)| *ms)
    }
}

impl Serialize for PhaseTimes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, ms) in &self.0 {
            map.serialize_entry(name, ms)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for PhaseTimes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = PhaseTimes;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of phase names and milliseconds")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PhaseTimes, A::Error> {
                let mut times = Vec::new();
                while let Some(entry) = map.next_entry::<String, f64>()? {
                    times.push(entry);
                }
                Ok(PhaseTimes(times))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}
