//! Progress on long work (`--bench`'s pairs and sizes, `--ipc all`'s mechanisms): a bar on standard error
//! where it is a terminal, and not a byte of it anywhere else or with `--quiet`.

mod common;

use std::process::{Command, Stdio};

use common::{SIMULATE, bin, run, simulated, text};

const LONG_WORK: [&[&str]; 2] = [&["--bench", "--bench-max-bytes", "16KiB"], &["--ipc", "all"]];

/// With standard output and error piped, as in CI's logs, no run writes a carriage return or an escape
/// sequence: nothing of a progress bar.
#[test]
fn no_progress_where_standard_error_is_not_a_terminal() {
    for args in LONG_WORK {
        let out = run(simulated("ok,ok").args(args));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        for (name, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            assert!(
                !bytes.iter().any(|&b| b == b'\r' || b == 0x1b),
                "{args:?}: progress bytes on {name}: {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}

/// What `script` (util-linux) captures of `args` run on a terminal of its own, or `None` where this machine
/// has no `script` or no pseudo-terminal to give it.
fn on_a_terminal(args: &str) -> Option<(Option<i32>, String)> {
    let command = format!("{} {args}", bin().display());
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env(SIMULATE, "ok,ok")
        .env_remove(common::FAULT)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let all = text(&out);
    if all.contains("pseudo-terminal") || all.contains("openpty") || all.contains("unrecognized option") {
        return None;
    }
    Some((out.status.code(), all))
}

/// On a terminal the bar is there, with its steps (36 for two GPUs' four pairs of the benchmark, four
/// mechanisms for `--ipc all`), and the lines of the run still come whole; `--quiet` draws none.
#[test]
fn progress_where_standard_error_is_a_terminal() {
    let Some((code, bench)) = on_a_terminal("--bench --bench-max-bytes 64KiB") else {
        common::skipped(
            "terminal",
            "progress_where_standard_error_is_a_terminal: no `script` or no pseudo-terminal",
        );
        return;
    };
    assert_eq!(code, Some(0), "{bench}");
    assert!(bench.contains("--bench [") && bench.contains("] 9/36 "), "no bar: {bench:?}");
    assert!(bench.contains("pair 4/4, GPU 1 to GPU 1"), "{bench:?}");
    let whole =
        "\x1b[2K== pair 3: producer on device 1 (Simulated GPU 1), consumer on device 1 (Simulated GPU 1)";
    assert!(bench.contains(whole), "the bar is not taken off for a line: {bench:?}");

    let (code, every) = on_a_terminal("--ipc all").unwrap_or_default();
    assert_eq!(code, Some(0), "{every}");
    assert!(
        every.contains("--ipc all [") && every.contains("] 3/4 ") && every.contains("--ipc pool"),
        "{every:?}"
    );
    assert!(every.contains("\x1b[2KProcess 1 complete!\r\n"), "a run's line was split: {every:?}");

    let (code, quiet) = on_a_terminal("--bench --bench-max-bytes 16KiB --quiet").unwrap_or_default();
    assert_eq!(code, Some(0), "{quiet}");
    assert!(!quiet.contains('\x1b') && !quiet.contains("--bench ["), "a bar with --quiet: {quiet:?}");
}
