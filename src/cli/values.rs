//! The value parsers of the user's options whose values clap's own parsers would take or refuse without
//! saying what a value should be: `--timeout` and `--bench-max-bytes` say it, and `--sync` names the driver
//! calls of each value.

use std::num::IntErrorKind;

use clap::ValueEnum;
use clap::builder::{EnumValueParser, PossibleValue, TypedValueParser};

use crate::ipc::Sync;
use crate::phases::timings::Timeout;

/// The smallest and largest `--bench-max-bytes`: the benchmark's first size, and the most one copy takes.
const BENCH_MIN_BYTES: u64 = 4096;
const BENCH_MAX_BYTES: u64 = i32::MAX as u64;

/// `--timeout`: a whole number of seconds, 0 for none; a value that is not says what one is.
pub(super) fn parse_timeout(text: &str) -> Result<Timeout, String> {
    text.parse::<u64>().map(Timeout::from_secs).map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow => {
            format!("more seconds than this program can count (at most {}); 0 for none", u64::MAX)
        }
        _ => "a number of seconds, 0 for none".to_owned(),
    })
}

/// `--sync`'s parser: [`Sync`]'s values, with help of this parser's own that names the driver calls this
/// program makes (`help_names_the_driver_calls_made`, in tests/cli.rs, finds each in src/driver/cuda), where
/// clap's derive would show the enum's doc comments.
#[derive(Clone)]
pub(super) struct SyncParser;

impl SyncParser {
    /// What `--help` says of each value: a `match`, so that a new ordering cannot go without one.
    fn help(sync: Sync) -> &'static str {
        match sync {
            Sync::Events => {
                "cuStreamWaitEvent on the buffer's interprocess event before the kernel, cuEventRecord after \
                 it (the original's cudaStreamWaitEvent and cudaEventRecord)"
            }
            Sync::Memops => {
                "cuStreamWaitValue32 on the buffer's flag before the kernel, cuStreamWriteValue32 after it"
            }
        }
    }
}

impl TypedValueParser for SyncParser {
    type Value = Sync;

    fn parse_ref(
        &self,
        command: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Sync, clap::Error> {
        EnumValueParser::<Sync>::new().parse_ref(command, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        let values = Sync::value_variants().iter().filter_map(|sync| {
            let value = sync.to_possible_value()?;
            Some(value.help(SyncParser::help(*sync)))
        });
        Some(Box::new(values))
    }
}

/// `--bench-max-bytes`: a count of bytes, plain or with a unit (K, KiB, M, MiB, G, GiB: powers of 1024, in
/// any case, a space before the unit allowed), within the benchmark's range.
pub(super) fn parse_bench_size(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text)?;
    if !(BENCH_MIN_BYTES..=BENCH_MAX_BYTES).contains(&bytes) {
        return Err(format!(
            "{bytes} bytes is not from 4KiB (4096) to 2GiB less one byte ({BENCH_MAX_BYTES})"
        ));
    }
    Ok(bytes)
}

/// A count of bytes: digits, then optionally a unit K, KiB, M, MiB, G or GiB (powers of 1024, in any case).
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let how = "give bytes, or a number with K, KiB, M, MiB, G or GiB (powers of 1024), as in 256MiB";
    if number.is_empty() {
        return Err(format!("no number: {how}"));
    }
    let shift = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        other => return Err(format!("unknown unit '{other}': {how}")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{text} is more bytes than this program can count"))
}
