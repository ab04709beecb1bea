//! The command line and the exit statuses, through the real binary.

mod common;

use assert_cmd::Command;
use common::{FAULT, SIMULATE, bin, run, simulated, text};

#[test]
fn usage_errors_exit_1_with_usage_help() {
    for args in [
        &["--nope"][..],
        &["-1"],
        &["abc"],
        &["32"],
        &["4294967296"],
        &["1", "2"],
        &["--procs-per-device", "0"],
        &["--procs-per-device", "33"],
        &["--procs-per-device"],
    ] {
        let out = Command::new(bin()).args(args).env_remove(SIMULATE).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?} must exit 1 (clap's 2 would read as waived)");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Usage:"), "{args:?}: no usage help in {err:?}");
        // No tip to pass an option as a value: the user's parser takes no positional argument.
        assert!(!err.contains("-- --"), "{args:?}: {err:?}");
    }
}

/// Every usage error says its lines in one order, clap's: `error: ...`, the usage line, then the hint to try
/// `--help` last; alike for clap's own errors (an unknown option, an invalid value, which clap gives without
/// the usage line) and for the rules between options that this program holds after clap.
#[test]
fn usage_errors_say_the_error_then_the_usage_then_the_help_hint() {
    for args in [
        &["--nope"][..],
        &["--procs-per-device", "0"],
        &["--procs-per-device"],
        &["--ipc", "bogus"],
        &["--bench-max-bytes", "8KiB"],
        &["--bench", "--ipc", "all"],
        &["--topology", "--quiet"],
    ] {
        let out = Command::new(bin()).args(args).env_remove(SIMULATE).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        let usage = lines.iter().position(|line| line.starts_with("Usage: simple-ipc"));
        let hint = lines.iter().position(|line| line.starts_with("For more information, try '--help'"));
        assert!(lines[0].starts_with("error: "), "{args:?}: the error first: {err}");
        assert!(usage.is_some_and(|usage| hint == Some(usage + 2)), "{args:?}: usage, then the hint: {err}");
        assert_eq!(hint, Some(lines.len() - 1), "{args:?}: the hint last: {err}");
    }
}

/// What this program gives the processes it starts is no option of the user's: a usage error that names
/// none of the internal roles.
#[test]
fn internal_arguments_are_no_options_of_the_users() {
    for args in [
        &["--segment-fd", "5", "0"][..],
        &["--guardian-fd", "3"],
        &["--ipc", "vmm", "--report-fd", "5"],
        &["--join", "@s", "--isolated", "pid"],
        &["--serve", "@s", "--serve-round", "1/2", "--served-fds", "3,4"],
        &["child", "0"],
        &["--quiet", "@internal", "guardian", "--fd", "3"],
    ] {
        let out = Command::new(bin()).args(args).env_remove(SIMULATE).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("unexpected argument") && err.contains("Usage:"), "{args:?}: {err}");
        for word in ["internal", "guardian", "segment", "report-fd", "isolated", "served", "-- --"] {
            let typed = args.iter().any(|arg| arg.contains(word));
            assert!(typed || !err.contains(word), "{args:?}: the error names {word}: {err}");
        }
    }
}

#[test]
fn help_and_version_exit_0() {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--procs-per-device") && help.contains("2 waived"), "{help}");
    assert!(!help.contains("CHILD"), "the child index is not for users: {help}");
    for internal in
        ["--segment-fd", "--socket-fd", "--guardian-fd", "--report-fd", "--isolated", "--serve-round"]
    {
        assert!(!help.contains(internal), "{internal} is not for users: {help}");
    }
    let version = Command::new(bin()).arg("--version").output().unwrap();
    assert_eq!(version.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("simple-ipc "));
}

/// On a machine without an NVIDIA driver (CI's), the real run is waived with the original's line and a
/// reason, never failed. Where there is a driver this test says so and asserts nothing: scripts/gpu-check.sh
/// tests the real run on GPUs.
#[test]
fn without_a_gpu_driver_the_real_run_is_waived_and_says_why() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        common::skipped(
            "no-gpu-driver",
            "without_a_gpu_driver_the_real_run_is_waived_and_says_why: this machine has a driver",
        );
        return;
    }
    let out = Command::new(bin()).env_remove(SIMULATE).env_remove(FAULT).output().unwrap();
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(all.starts_with("PP: lshmName = simpleIPCshm"), "{all}");
    assert!(all.contains("No CUDA devices support IPC ("), "a waived run says why: {all}");
    assert_eq!(
        all.matches("No CUDA devices support IPC").count(),
        1,
        "and says it once, in the verdict: {all}"
    );
    // The hint names the program as it was started: `simple-ipc` need not be on PATH.
    let hint = format!(
        "To see the protocol run without a GPU: SIMPLE_IPC_SIMULATE_GPUS=ok,ok {}\n",
        bin().display()
    );
    assert!(all.ends_with(&hint), "{all}");
}

#[test]
fn no_device_fit_for_ipc_is_waived_with_the_original_messages() {
    let out = run(&mut simulated("no-uva,exclusive"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Device 0 does not support unified addressing, skipping...\n"), "{stdout}");
    assert!(stdout.contains("Device 1 is in an unsupported compute mode for this sample\n"), "{stdout}");
    // The original's last line is said once, in the verdict; a simulated run needs no hint to simulate.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(stdout.matches("No CUDA devices support IPC").count(), 1, "{stdout}");
    assert_eq!(
        lines[lines.len() - 1],
        "WAIVED (exit 2, not a failure: nothing here to test): No CUDA devices support IPC.",
        "{stdout}"
    );

    let out = run(&mut simulated(""));
    assert_eq!(out.status.code(), Some(2), "no device at all: {}", text(&out));
}

#[test]
fn too_many_processes_is_a_failure_not_a_waiver() {
    let out = run(simulated("ok,ok").args(["--procs-per-device", "17"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("makes 34 processes; at most 32"), "{}", text(&out));
}

#[test]
fn malformed_fault_variable_is_refused() {
    let out = run(simulated("ok").env(FAULT, "child1@nowhere:kill"));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("SIMPLE_IPC_TEST_FAULT"), "{}", text(&out));
}

/// An option that would do nothing in the mode chosen is a usage error (exit 1, with the usage line), not
/// silently ignored; the same options are taken where they do something.
#[test]
fn options_that_do_nothing_in_a_mode_are_usage_errors() {
    for (args, says) in [
        (&["--bench-max-bytes", "8KiB"][..], "--bench is not given"),
        (&["--sequential", "--bench-max-bytes", "8KiB"], "--bench is not given"),
        (&["--ipc", "all", "--bench-max-bytes", "8KiB"], "--bench is not given"),
        (&["--topology", "--ipc", "vmm"], "cannot be used with"),
        (&["--topology", "--sync", "memops"], "cannot be used with"),
        (&["--topology", "--timeout", "5"], "cannot be used with"),
        (&["--topology", "--quiet"], "cannot be used with"),
        (&["--timings", "--quiet"], "cannot be used with"),
        (&["--bench", "--sync", "memops"], "cannot be used with"),
        (&["--bench", "--procs-per-device", "2"], "cannot be used with"),
        (&["--join", "@nowhere", "--procs-per-device", "2"], "cannot be used with"),
        (&["--join", "@nowhere", "--bench-max-bytes", "8KiB"], "--bench is not given"),
        (&["--serve", "@nowhere", "--sequential"], "cannot be used with"),
        (&["--ipc", "all", "--isolate", "pid", "--sync", "memops"], "cannot be used with"),
    ] {
        let out = run(simulated("ok").args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?} must be a usage error: {}", text(&out));
        assert!(err.contains(says) && err.contains("Usage:"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing ran: {}", text(&out));
    }
    for args in [&["--topology"][..], &["--bench", "--bench-max-bytes", "4096", "--quiet"]] {
        let out = run(simulated("ok").args(args));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
    }
}

/// Options whose values refuse each other are usage errors, said before anything runs (no line on standard
/// output, not even the simulation's): the rules between options are the parse's, not a run's.
#[test]
fn options_that_refuse_each_other_are_usage_errors_before_anything_runs() {
    for (args, says) in [
        (
            &["--bench", "--ipc", "all"][..],
            "--bench measures one mechanism at a time: give --ipc legacy, vmm, pool",
        ),
        (&["--sync", "memops", "--ipc", "pool"], "--sync memops cannot order pool memory"),
        (&["--ipc", "pool", "--sync", "memops", "--serve", "@nowhere"], "; use --ipc legacy, vmm or fabric"),
    ] {
        let dir = common::scratch("refused");
        let json = dir.path().join("refused.json");
        let out = run(simulated("ok").args(args).arg("--json").arg(&json));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?} must be a usage error: {}", text(&out));
        assert!(err.contains(says) && err.contains("Usage:"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing ran: {}", text(&out));
        assert!(!json.exists(), "{args:?}: no run, so no document");
    }
}

/// `--bench-max-bytes` takes bytes or a size with a unit; the benchmark then measures up to that size.
#[test]
fn bench_max_bytes_takes_units() {
    for (size, last) in [("16KiB", "16 KiB"), ("64k", "64 KiB"), ("16384", "16 KiB")] {
        let out = run(simulated("ok").args(["--bench", "--bench-max-bytes", size]));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{size}: {}", text(&out));
        let sizes: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.trim_start().split_once(" KiB").map(|(n, _)| n))
            .filter(|n| n.parse::<u32>().is_ok())
            .collect();
        assert_eq!(sizes.last().map(|n| format!("{n} KiB")).as_deref(), Some(last), "{size}: {stdout}");
    }
    for bad in ["256MB", "2GiB", "4095", "lots"] {
        let out = run(simulated("ok").args(["--bench", "--bench-max-bytes", bad]));
        assert_eq!(out.status.code(), Some(1), "{bad}: {}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--bench-max-bytes"), "{bad}: {}", text(&out));
    }
}

/// `--help` is wrapped: with no terminal and no COLUMNS, no line is longer than 100 characters; with
/// COLUMNS it follows that width.
#[test]
fn help_is_wrapped() {
    let longest = |columns: Option<&str>| {
        let mut command = Command::new(bin());
        command.arg("--help");
        match columns {
            Some(columns) => command.env("COLUMNS", columns),
            None => command.env_remove("COLUMNS"),
        };
        let out = command.output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().map(|l| l.chars().count()).max().unwrap_or(0)
    };
    let plain = longest(None);
    assert!((60..=100).contains(&plain), "longest --help line: {plain}");
    assert!(longest(Some("72")) <= 72, "COLUMNS=72: {}", longest(Some("72")));
}

/// `--version` carries what a bug report needs: the git revision built from (or `unknown`, `-dirty` for a
/// tree with changes) and what the embedded kernel needs of the driver.
#[test]
fn version_says_the_revision_and_what_the_kernel_needs() {
    for flag in ["--version", "-V"] {
        let out = Command::new(bin()).arg(flag).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let version = String::from_utf8_lossy(&out.stdout).trim_end().to_owned();
        let prefix = format!("simple-ipc {} (rev ", env!("CARGO_PKG_VERSION"));
        let rest = version.strip_prefix(&prefix).unwrap_or_else(|| panic!("{version:?}"));
        let (rev, kernel) = rest.split_once("; ").unwrap_or_else(|| panic!("{version:?}"));
        let bare = rev.strip_suffix("-dirty").unwrap_or(rev);
        assert!(
            bare == "unknown" || (bare.len() >= 7 && bare.chars().all(|c| c.is_ascii_hexdigit())),
            "{version:?}"
        );
        assert!(kernel.starts_with("kernel ") && kernel.ends_with(')'), "{version:?}");
        if env!("SIMPLE_IPC_KERNEL_FORMAT") == "ptx" {
            assert!(kernel.contains("CUDA 13.0 / driver 580+"), "the committed PTX's needs: {version:?}");
        }
        // Where git knows this tree, the revision is its HEAD's (as it was when the binary was built).
        let head = std::process::Command::new("git")
            .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        if let Some(head) = head {
            assert!(bare == "unknown" || head.starts_with(bare), "{version:?} is not of HEAD {head}");
        }
    }
}

/// `--help` says when the files of `--json` and `--metrics` are written: as the run begins (running) too, not
/// only once it has ended (what it said after the running document came, which a user reading it to
/// learn what a killed run leaves would have believed: the last run's document).
#[test]
fn help_says_the_files_are_written_as_the_run_begins() {
    let out = Command::new(bin()).arg("--help").env("COLUMNS", "100").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    for (option, next) in [("--json <FILE>", "--metrics <FILE>"), ("--metrics <FILE>", "-q, --quiet")] {
        let at = |what: &str| help.find(what).unwrap_or_else(|| panic!("{what} in {help}"));
        let said = &help[at(option)..at(next)];
        assert!(said.contains("replaced whole as the run begins"), "{option}: {said}");
    }
}

/// `--help` groups the options under headings, and `-h` is the short form of it.
#[test]
fn help_groups_the_options_and_h_is_short() {
    let help = |flag: &str| {
        let out = Command::new(bin()).arg(flag).env("COLUMNS", "100").output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (short, long) = (help("-h"), help("--help"));
    assert!(short.lines().count() * 2 < long.lines().count(), "-h is short: {short}");
    let groups: [(&str, &[&str]); 5] = [
        ("The run:", &["--procs-per-device", "--sequential", "--timeout", "--bind-numa", "--topology"]),
        ("The mechanism:", &["--ipc", "--sync"]),
        ("In containers:", &["--serve", "--join", "--isolate"]),
        ("Output:", &["--json", "--quiet", "--timings"]),
        ("The benchmark:", &["--bench", "--bench-max-bytes"]),
    ];
    for text in [&short, &long] {
        let at = |needle: &str| text.find(needle).unwrap_or_else(|| panic!("no {needle:?} in {text}"));
        for (i, (heading, options)) in groups.iter().enumerate() {
            let start = at(&format!("\n{heading}\n"));
            let end = groups.get(i + 1).map_or(text.len(), |(next, _)| at(&format!("\n{next}\n")));
            assert!(start < end, "{heading} comes before the next: {text}");
            for option in *options {
                let line = text[start..end].lines().map(str::trim_start).any(|l| {
                    let l = l.strip_prefix("-q, ").unwrap_or(l);
                    l == *option || l.starts_with(&format!("{option} "))
                });
                assert!(line, "{option} under {heading}: {text}");
            }
        }
    }
}

/// An internal role typed by hand with one descriptor given for two things (`--served-fds 6,6`, or the
/// `--report-fd` again among them) is refused with exit 1: the second owner of one number would close it
/// twice, which Rust's IO safety answers with an abort (134).
#[test]
fn an_internal_role_given_one_descriptor_twice_refuses_it() {
    use std::os::fd::AsRawFd;
    let dir = common::scratch("twice");
    let report = std::fs::File::create(dir.path().join("report")).unwrap();
    let served = std::fs::File::open("/dev/null").unwrap();
    let socket = dir.path().join("run.sock");
    for fds in ["6,6", "5,6", "6,7,6"] {
        let (report, served) = (report.as_raw_fd(), served.as_raw_fd());
        let mut command = std::process::Command::new(bin());
        command
            .args(["@internal", "run", "--report-fd", "5", "--serve"])
            .arg(&socket)
            .args(["--serve-round", "1/1", "--served-fds", fds, "--timeout", "2", "-q"])
            .env(SIMULATE, "ok,ok")
            .env_remove(FAULT)
            .stdin(std::process::Stdio::null());
        common::with_fds(&mut command, &[(report, 5), (served, 6), (served, 7)]);
        let out = command.output().unwrap();
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "--served-fds {fds}: refused, not aborted: {said}");
        assert!(said.contains("given twice"), "--served-fds {fds}: {said}");
        assert!(!socket.exists(), "--served-fds {fds}: the socket's path was made");
    }
}

/// A `--timeout` too long for a deadline (`u64::MAX` seconds, as a user types for "never") is a watchdog that
/// does not fire, in every mode that derives a deadline from it: not a panic on adding it to the clock.
#[test]
fn a_timeout_too_long_for_the_clock_is_one_that_does_not_fire() {
    let never = u64::MAX.to_string();
    for args in [
        &["--timeout", &never][..],
        &["--ipc", "all", "--timeout", &never],
        &["--bench", "--bench-max-bytes", "16K", "--timeout", &never],
    ] {
        let out = run(simulated("ok,ok").args(args).arg("-q"));
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        assert!(!text(&out).contains("internal error"), "{args:?}: {}", text(&out));
    }
}

/// The last of a repeated option wins (issue 28): `--ipc vmm --ipc pool` runs pool, and a flag given twice
/// (`-q -q`) is the flag, as an alias that gives it and a user who gives it again expect.
#[test]
fn a_repeated_option_is_the_last_one_given() {
    let out = run(simulated("ok,ok").args(["--ipc", "vmm", "--ipc", "pool", "-q", "-q"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "-q -q: the verdict alone: {stdout}");
    assert!(stdout.starts_with("PASSED: 2 processes on 2 GPUs, pool IPC"), "{stdout}");
    let out = run(simulated("ok,ok").args(["--timeout", "0", "--timeout", "7", "--quiet", "--quiet"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// `simple-ipc 0`, how NVIDIA's simpleIPC started its children, is a usage error that says so, and that
/// this program starts its children itself.
#[test]
fn the_originals_child_invocation_says_what_it_is() {
    let out = Command::new(bin()).arg("0").env_remove(SIMULATE).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`0` is how NVIDIA's simpleIPC started its children"), "{err}");
    assert!(err.contains("this program starts its own children itself: run it without arguments"), "{err}");
    assert!(err.contains("Usage:") && out.stdout.is_empty(), "{}", text(&out));
}

/// `--timeout -1` is an invalid value, said with what a value is, not an unexpected argument `-1`.
#[test]
fn a_negative_timeout_is_an_invalid_value() {
    let out = Command::new(bin()).args(["--timeout", "-1"]).env_remove(SIMULATE).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value '-1' for '--timeout <SECONDS>': a number of seconds, 0 for none"),
        "{err}"
    );
    assert!(!err.contains("unexpected argument"), "{err}");
}

/// Every driver call `--help` names (`cuX`) is one the program makes (quoted in src/driver/cuda), and a
/// runtime call of the original's (`cudaX`) is named only beside its driver call here (`cuX`).
#[test]
fn help_names_the_driver_calls_made() {
    let out = Command::new(bin()).arg("--help").env("COLUMNS", "200").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let driver_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/driver/cuda");
    let driver: String = std::fs::read_dir(&driver_dir)
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    let words: Vec<&str> =
        help.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| w.starts_with("cu")).collect();
    let calls: Vec<&str> =
        words.iter().copied().filter(|w| w[2..].starts_with(|c: char| c.is_ascii_uppercase())).collect();
    for call in ["cuStreamWaitEvent", "cuEventRecord", "cuStreamWaitValue32", "cuIpcGetMemHandle"] {
        assert!(calls.contains(&call), "--help names {call}: {help}");
    }
    for call in &calls {
        // As src/driver/cuda quotes each symbol it looks up and each call its errors name (`_v2` where the
        // 11.4 bindings call that version).
        let quoted = [format!("\"{call}\""), format!("\"{call}_v2\"")];
        assert!(
            quoted.iter().any(|q| driver.contains(q.as_str())),
            "--help names {call}, which src/driver/cuda never calls"
        );
    }
    let runtime: Vec<&str> = words.iter().copied().filter(|w| w.starts_with("cuda") && w.len() > 4).collect();
    assert!(runtime.contains(&"cudaStreamWaitEvent"), "the original's call, for comparison: {help}");
    for call in runtime {
        let ours = format!("cu{}", &call[4..]);
        assert!(calls.contains(&ours.as_str()), "--help names the original's {call} without {ours}: {help}");
    }
}

/// The long options `--help` shows.
fn long_options() -> Vec<String> {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let options: Vec<String> = help
        .lines()
        // An option's own line, `      --name` or `  -q, --name`, not prose that mentions one.
        .filter_map(|line| {
            line.strip_prefix("      --").or_else(|| line.strip_prefix("  -")?.get(3..)?.strip_prefix("--"))
        })
        .filter_map(|rest| rest.split([' ', '<', '=']).next().map(str::to_owned))
        .collect();
    assert!(options.len() > 15 && options.iter().any(|o| o == "generate"), "{help}");
    options
}

/// `--generate man` is a man page in roff made from the parser (its `.TH` the first request after the
/// preamble that defines `\*(Aq`), naming every long option; groff, where installed, reads it without a
/// warning.
#[test]
fn generate_man_is_a_man_page_of_every_option() {
    let out = Command::new(bin()).args(["--generate", "man"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let man = String::from_utf8_lossy(&out.stdout);
    let first = man.lines().find(|l| !l.starts_with(".ie \\n(.g .ds Aq") && !l.starts_with(".el .ds Aq"));
    assert!(first.is_some_and(|l| l.starts_with(".TH simple-ipc 1 ")), "{man}");
    assert!(man.contains("\n.SH NAME\n") && man.contains("\n.SH OPTIONS\n"), "{man}");
    for option in long_options() {
        let roff = format!("\\-\\-{}", option.replace('-', "\\-"));
        assert!(man.contains(&roff), "the man page lacks --{option}: {man}");
    }
    match std::process::Command::new("groff")
        .args(["-man", "-ww", "-z"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut groff) => {
            use std::io::Write;
            groff.stdin.take().unwrap().write_all(&out.stdout).unwrap();
            let checked = groff.wait_with_output().unwrap();
            let said = String::from_utf8_lossy(&checked.stderr);
            assert!(checked.status.success() && said.is_empty(), "groff: {said}");
        }
        Err(e) => eprintln!("generate_man_is_a_man_page_of_every_option: no groff to check the roff ({e})"),
    }
}

/// Each shell's completions name every long option (bash's and zsh's as `--name`, fish's as `-l name`).
#[test]
fn generated_completions_name_every_option() {
    let options = long_options();
    for (what, form) in [("completions-bash", "--"), ("completions-zsh", "--"), ("completions-fish", "-l ")] {
        let out = Command::new(bin()).args(["--generate", what]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{what}: {}", text(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("simple-ipc"), "{what}: {script}");
        for option in &options {
            assert!(script.contains(&format!("{form}{option}")), "{what} lacks --{option}: {script}");
        }
    }
}

/// `--generate` to a reader that has gone ends as every output of the program does: 141, nothing said,
/// no panic (clap_complete's own writer would panic on the broken pipe).
#[test]
fn generate_to_a_closed_pipe_is_141_quietly() {
    for what in ["man", "completions-bash"] {
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        let out = std::process::Command::new(bin())
            .args(["--generate", what])
            .stdout(std::process::Stdio::from(write))
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(141), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stderr.is_empty(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// In a container (Docker's `/.dockerenv` here, as on CI's machine), a run without a GPU names the
/// engine's fix (`--gpus all`); as the container's own program (pid 1, `docker run IMAGE`) its hint to
/// simulate is the engine's `-e`, and `--ipc all`'s verdict names the cause that waived every mechanism.
#[test]
fn in_a_container_the_waived_verdict_says_the_engines_words() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        common::skipped("no-gpu-driver", "in_a_container_the_waived_verdict_says: this machine has a driver");
        return;
    }
    let docker = std::path::Path::new("/.dockerenv").exists()
        && !std::path::Path::new("/run/.containerenv").exists()
        && std::env::var_os("KUBERNETES_SERVICE_HOST").is_none();
    let as_pid_1 = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(bin())
        .args(["--ipc", "all"])
        .env_remove(SIMULATE)
        .env_remove(FAULT)
        .output();
    let out = match as_pid_1 {
        Ok(out) if !String::from_utf8_lossy(&out.stderr).starts_with("unshare:") => out,
        _ => {
            common::skipped("namespaces", "in_a_container_the_waived_verdict_says: unshare cannot make one");
            return;
        }
    };
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    let verdict = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned();
    let cause = "every mechanism waived: No CUDA devices support IPC (no CUDA driver library";
    assert!(verdict.contains(cause), "{all}");
    if docker {
        assert!(verdict.contains("in this container: start it with docker run --gpus all"), "{all}");
        assert!(verdict.ends_with("docker run -e SIMPLE_IPC_SIMULATE_GPUS=ok,ok IMAGE"), "{all}");
    } else {
        assert!(verdict.contains("on this machine") || verdict.contains("in this container"), "{all}");
    }
}

/// A value the user gives is echoed in its error, but no control character in it reaches the terminal: not
/// in the error line, not in the verdict (the pieces of a line come from many places; every line is made
/// fit for a terminal where it is written).
#[test]
fn a_value_with_escape_sequences_reaches_no_terminal_raw() {
    let path = "/nonexistent-dir\x1b[2J\x1b]0;pwned\x07\r/x";
    for args in [&["--json", path][..], &["--metrics", path], &["--serve", path]] {
        let out = run(simulated("ok").args(args));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let all = text(&out);
        assert!(
            all.contains("/nonexistent-dir\\u{1b}[2J\\u{1b}]0;pwned\\u{7}\\r/x"),
            "{args:?}: named, escaped: {all}"
        );
        assert!(!all.contains(['\x1b', '\x07', '\r']), "{args:?}: {all:?}");
    }
}
