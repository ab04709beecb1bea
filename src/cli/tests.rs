//! The user's parser: the roles and options it gives, and the usage errors it makes.

use super::rules::{Asked, parse_from};
use super::user::*;
use crate::ipc::{Fds, Mechanism, Sync};
use crate::meeting::Address;
use crate::phases::timings::Timeout;
use crate::role::{Role, Run};

fn run(args: &[&str]) -> Option<Role> {
    match parse_from(std::iter::once("simple-ipc").chain(args.iter().copied())) {
        Ok(Asked::Role(role)) => Some(*role),
        Ok(Asked::Generate(what)) => panic!("{args:?} is --generate {what:?}"),
        Err(e) => {
            assert!(e.use_stderr(), "usage errors exit 1 (see EarlyExit::exit_code): {e}");
            None
        }
    }
}

/// The options of the run of `args`, which must be the sample's.
fn sample(args: &[&str]) -> Run {
    match run(args) {
        Some(Role::Sample(run, _)) => run,
        other => panic!("{args:?} is {other:?}"),
    }
}

/// What the document would say `args` asked for.
fn asked(args: &[&str]) -> crate::report::document::Options {
    run(args).unwrap_or_else(|| panic!("{args:?} is a usage error")).asked().1
}

#[test]
fn roles_and_options() {
    let parent = sample(&[]);
    assert_eq!((parent.procs_per_device, parent.sequential), (1, false));
    assert_eq!(run(&[]), Some(Role::Sample(parent.clone(), Mechanism::Legacy)), "the original's mechanism");
    assert_eq!(sample(&["--procs-per-device", "4"]).procs_per_device, 4);
    assert_eq!(asked(&["--ipc", "pool"]).ipc, "pool");
    assert!(matches!(run(&["--ipc", "all"]), Some(Role::EveryMechanism(_))));
    assert!(matches!(run(&["--ipc", "all", "--isolate", "pid"]), Some(Role::Matrix(..))));
    assert!(matches!(run(&["--topology"]), Some(Role::Topology)));
    assert_eq!(parent.sync, Sync::Events, "the original's ordering by default");
    assert_eq!(sample(&["--sync", "memops"]).sync, Sync::Memops);
    assert_eq!(parent.fds, Fds::Socket, "descriptors over the socket by default");
    assert_eq!(sample(&["--ipc", "pool", "--fds", "pidfd"]).fds, Fds::Pidfd);
    assert_eq!(parent.timeout.limit(), Some(std::time::Duration::from_secs(60)), "a generous default");
    assert_eq!(sample(&["--timeout", "0"]).timeout.limit(), None, "0 turns the watchdog off");
    let serve = sample(&["--serve", "@there"]).serve;
    assert_eq!(serve, Some(Address::Abstract("there".into())), "the address is parsed once, here");
    for bad in [
        &["32"][..],
        &["7"],
        &["-1"],
        &["x"],
        &["99999999999"],
        &["--procs-per-device", "0"],
        &["--nope"],
        &["1", "2"],
        &["--bench", "--topology"],
        &["--bench", "--sequential"],
        &["--topology", "--procs-per-device", "2"],
        &["--segment-fd", "3"],
        &["--segment-fd", "5", "3"],
        &["--ipc", "vmm", "--report-fd", "5"],
        &["--timeout", "-1"],
        &["--ipc", "cuda"],
        &["--ipc"],
        &["--sync", "spin"],
        &["--report-fd", "5", "--json", "x.json"],
        &["--serve", ""],
        &["--join", "@"],
    ] {
        assert!(run(bad).is_none(), "{bad:?} must be a usage error");
    }
}

/// An option that would do nothing in the mode chosen is refused, not ignored; defaults never count.
#[test]
fn options_that_do_nothing_in_a_mode_are_refused() {
    for idle in [
        &["--bench-max-bytes", "8KiB"][..],
        &["--topology", "--ipc", "vmm"],
        &["--topology", "--sync", "memops"],
        &["--topology", "--timeout", "5"],
        &["--topology", "--quiet"],
        &["--timings", "--quiet"],
        &["--bench", "--sync", "events"],
        &["--bench", "--procs-per-device", "2"],
        &["--join", "s", "--ipc", "vmm"],
        &["--join", "s", "--procs-per-device", "2"],
        &["--join", "s", "--json", "x.json"],
        &["--join", "s", "--bench-max-bytes", "8KiB"],
        &["--sequential", "--bench-max-bytes", "8KiB"],
        &["--topology", "--bench-max-bytes", "8KiB"],
        &["--ipc", "all", "--bench-max-bytes", "8KiB"],
        &["--serve", "s", "--sequential"],
        &["--ipc", "all", "--isolate", "pid", "--sync", "memops"],
        &["--fds", "pidfd"],
        &["--ipc", "fabric", "--fds", "socket"],
        &["--join", "s", "--fds", "pidfd"],
    ] {
        assert!(run(idle).is_none(), "{idle:?} must be a usage error");
    }
    assert_eq!(
        run(&["--topology"]),
        Some(Role::Topology),
        "the defaults of --ipc, --sync, --timeout do not count"
    );
    let Some(Role::Joiner(join)) = run(&["--join", "s", "--timeout", "5", "--quiet"]) else {
        panic!("--join is a joiner")
    };
    assert_eq!(
        (join.timeout, join.quiet),
        (Timeout::from_secs(5), true),
        "a joiner takes --timeout and --quiet"
    );
    assert!(
        run(&["--ipc", "vmm", "--isolate", "pid", "--sync", "memops"]).is_some(),
        "one mechanism: --sync counts"
    );
}

/// Options whose values refuse each other are refused by the parse, in the words a run said them in before,
/// and `--ipc all` is told which mechanisms its options cannot run.
#[test]
fn values_that_refuse_each_other_are_refused_by_the_parse() {
    let said = refusal(&["--bench", "--ipc", "all"]);
    assert!(
        said.contains("--bench measures one mechanism at a time: give --ipc legacy, vmm, pool or fabric"),
        "{said}"
    );
    let said = refusal(&["--sync", "memops", "--ipc", "pool"]);
    assert!(said.contains("--sync memops cannot order pool memory: "), "{said}");
    assert!(said.contains("; use --ipc legacy, vmm or fabric"), "{said}");
    assert!(
        matches!(run(&["--bench", "--ipc", "pool"]), Some(Role::Bench(b)) if b.mechanism == Mechanism::Pool)
    );
    assert_eq!(sample(&["--sync", "events", "--ipc", "pool"]).sync, Sync::Events, "events order pool memory");
    let Some(Role::EveryMechanism(every)) = run(&["--ipc", "all", "--sync", "memops"]) else {
        panic!("--ipc all is every mechanism")
    };
    let not_run: Vec<Mechanism> = every.not_run.iter().map(|(m, _)| *m).collect();
    assert_eq!(not_run, [Mechanism::Pool], "memops cannot order pool memory alone");
    let why = every.why_not_run(Mechanism::Pool).unwrap_or_default();
    assert!(why.starts_with("--sync memops cannot order pool memory: "), "{why}");
    assert_eq!(every.why_not_run(Mechanism::Vmm), None);
    let Some(Role::EveryMechanism(every)) = run(&["--ipc", "all"]) else { panic!("--ipc all") };
    assert!(every.not_run.is_empty(), "events order every mechanism: {every:?}");
}

#[test]
fn bench_sizes_take_units() {
    let max = |args: &[&str]| match run(&[&["--bench"], args].concat()) {
        Some(Role::Bench(bench)) => Some(bench.max_bytes),
        _ => None,
    };
    assert_eq!(max(&[]), Some(1 << 30), "1 GiB by default");
    assert_eq!(max(&["--bench-max-bytes", "4096"]), Some(4096));
    assert_eq!(max(&["--bench-max-bytes", "256MiB"]), Some(256 << 20));
    assert_eq!(max(&["--bench-max-bytes=64K"]), Some(64 << 10));
    assert_eq!(max(&["--bench-max-bytes", "8kib"]), Some(8 << 10));
    assert_eq!(max(&["--bench-max-bytes", "1G"]), Some(1 << 30));
    assert_eq!(max(&["--bench-max-bytes", "1 GiB"]), Some(1 << 30));
    assert_eq!(max(&["--bench-max-bytes", "2047M"]), Some(2047 << 20));
    for bad in ["4095", "2GiB", "3K", "256MB", "MiB", "1.5GiB", "-1", "99999999999999999999", "9999999999G"] {
        assert_eq!(max(&["--bench-max-bytes", bad]), None, "{bad} must be refused");
    }
}

/// `--ipc`'s values are the mechanisms, by their own names, and `all`.
#[test]
fn every_ipc_value_but_all_names_a_mechanism() {
    use clap::ValueEnum;
    let named: Vec<Option<Mechanism>> = IpcArg::value_variants().iter().map(|v| v.mechanism()).collect();
    let mechanisms = Mechanism::ALL.map(Some);
    assert_eq!(named, [&mechanisms[..], &[None]].concat());
    for value in IpcArg::value_variants() {
        assert_eq!(value.mechanism().map_or("all", Mechanism::name), value.name(), "{value:?}");
    }
    for mechanism in Mechanism::ALL {
        assert_eq!(Mechanism::from_code(mechanism.code()), Some(mechanism));
    }
}

/// The last of a repeated option wins, as with rg, fd and cargo: a wrapper's option can be given again.
#[test]
fn a_repeated_option_is_the_last_one() {
    assert_eq!(asked(&["--ipc", "vmm", "--ipc", "pool"]).ipc, "pool");
    assert!(matches!(run(&["--ipc", "all", "--ipc", "vmm"]), Some(Role::Sample(_, Mechanism::Vmm))));
    assert_eq!(sample(&["--timeout", "5", "--timeout", "7"]).timeout, Timeout::from_secs(7));
    assert!(sample(&["-q", "-q"]).quiet, "a flag given twice");
    assert!(sample(&["--quiet", "-q", "--quiet"]).quiet);
    assert_eq!(sample(&["--procs-per-device=2", "--procs-per-device", "3"]).procs_per_device, 3);
    // The rules between options see the last value: --fds with vmm, then legacy, has no descriptors.
    assert!(run(&["--ipc", "vmm", "--ipc", "legacy", "--fds", "pidfd"]).is_none());
}

/// The rendered usage error of `args`.
fn refusal(args: &[&str]) -> String {
    match parse_from(std::iter::once("simple-ipc").chain(args.iter().copied())) {
        Err(e) => {
            assert!(e.use_stderr(), "{args:?}: a usage error, which exits 1");
            e.render().to_string()
        }
        Ok(asked) => panic!("{args:?} is {asked:?}"),
    }
}

/// A negative number is a value that is wrong, said so, not an unexpected argument.
#[test]
fn a_negative_number_is_an_invalid_value() {
    let said = refusal(&["--timeout", "-1"]);
    assert!(
        said.contains("invalid value '-1' for '--timeout <SECONDS>': a number of seconds, 0 for none"),
        "{said}"
    );
    let said = refusal(&["--timeout", "99999999999999999999"]);
    assert!(said.contains("more seconds than this program can count"), "{said}");
    let said = refusal(&["--procs-per-device", "-1"]);
    assert!(said.contains("invalid value '-1' for '--procs-per-device <N>'"), "{said}");
    let said = refusal(&["--bench", "--bench-max-bytes", "-1"]);
    assert!(said.contains("invalid value '-1' for '--bench-max-bytes <SIZE>'"), "{said}");
    // A flag after the option is still a flag, not its value.
    assert!(refusal(&["--timeout", "-q"]).contains("a value is required for '--timeout <SECONDS>'"));
}

/// `simple-ipc 0`, the original's child, says what it is and that the parent starts its children.
#[test]
fn the_originals_child_argument_says_what_it_is() {
    for args in [&["0"][..], &["3"], &["1", "2"], &["-q", "0"]] {
        let said = refusal(args);
        let index = args.iter().find(|a| a.bytes().all(|b| b.is_ascii_digit())).copied().unwrap_or("?");
        assert!(
            said.contains(&format!("`{index}` is how NVIDIA's simpleIPC started its children")),
            "{said}"
        );
        assert!(said.contains("this program starts its own children itself"), "{said}");
    }
    // Any other stray argument is clap's.
    let said = refusal(&["abc"]);
    assert!(said.contains("unexpected argument 'abc'") && !said.contains("simpleIPC"), "{said}");
}

/// `--generate` asks for a text, alone; `-h` lists it beside the options of a run (README says how to use
/// it, and a user who reads `-h` first should find it there).
#[test]
fn generate_is_asked_alone() {
    use super::generate::What;
    let short = match parse_from(["simple-ipc", "-h"]) {
        Err(e) => e.render().to_string(),
        Ok(asked) => panic!("-h is {asked:?}"),
    };
    assert!(short.contains("--generate <WHAT>"), "{short}");
    let generated =
        |args: &[&str]| match parse_from(std::iter::once("simple-ipc").chain(args.iter().copied())) {
            Ok(Asked::Generate(what)) => Some(what),
            _ => None,
        };
    assert_eq!(generated(&["--generate", "man"]), Some(What::Man));
    assert_eq!(generated(&["--generate", "completions-bash"]), Some(What::CompletionsBash));
    assert_eq!(generated(&["--generate=completions-zsh"]), Some(What::CompletionsZsh));
    assert_eq!(generated(&["--generate", "completions-fish"]), Some(What::CompletionsFish));
    for bad in
        [&["--generate", "man", "--quiet"][..], &["--ipc", "vmm", "--generate", "man"], &["--generate", "ps"]]
    {
        assert!(refusal(bad).contains("--generate"), "{bad:?}");
    }
}

/// Each text `--generate` makes, made: the man page and every shell's completions name the options.
#[test]
fn every_generated_text_names_the_options() {
    use super::generate::{What, render};
    use clap::ValueEnum;
    for what in What::value_variants() {
        let text = render(*what, command()).unwrap_or_else(|e| panic!("{what:?}: {e:#}"));
        let option = match what {
            What::Man => "\\-\\-procs\\-per\\-device",
            What::CompletionsFish => "-l procs-per-device",
            _ => "--procs-per-device",
        };
        assert!(text.contains(option), "{what:?}: {text}");
    }
    let man = render(What::Man, command()).unwrap_or_default();
    assert!(man.contains("\n.SH \"EXIT STATUS\"\n") && !man.contains(".SH EXTRA"), "{man}");
    assert!(
        man.contains(&format!(".TH simple-ipc 1  \"simple-ipc {}\"", env!("CARGO_PKG_VERSION"))),
        "{man}"
    );
}

/// The usage error `args` make, as printed.
fn usage_error(args: &[&str]) -> String {
    let args = std::iter::once("simple-ipc").chain(args.iter().copied()).map(Into::into).collect();
    match super::parse_from(args) {
        Err(early) => early.usage_error().unwrap_or_else(|| panic!("not a usage error: {early:?}")),
        Ok(role) => panic!("{role:?}"),
    }
}

/// The usage line goes where clap puts it when it gives one, before the hint to try `--help`: added to
/// clap's errors without it, and never twice. A value that quotes the usage line's or the hint's words,
/// or holds a newline or an escape, is the user's: it is quoted fit to print, and moves nothing.
#[test]
fn the_usage_line_comes_before_the_help_hint() {
    let usage = "Usage: simple-ipc [OPTIONS]";
    let hint = "For more information, try '--help'.";
    let values = [
        ("0", "0"),
        ("Usage: x", "Usage: x"),
        ("a\n\nUsage: b", "a\\n\\nUsage: b"),
        ("\n\nFor more information, try x", "\\n\\nFor more information, try x"),
        ("\u{1b}[2J\r\u{202e}", "\\u{1b}[2J\\r\\u{202e}"),
    ];
    for (value, quoted) in values {
        let said = usage_error(&["--procs-per-device", value]);
        let error = format!("error: invalid value '{quoted}' for '--procs-per-device <N>': ");
        assert!(said.starts_with(&error), "{value:?}: {said}");
        assert!(said.ends_with(&format!("\n\n{usage}\n\n{hint}")), "{value:?}: {said}");
        assert_eq!(said.matches("Usage:").count(), 1 + value.matches("Usage:").count(), "{value:?}: {said}");
        let said = usage_error(&["--ipc", value]);
        let error = format!("error: invalid value '{quoted}' for '--ipc <MECHANISM>'\n  [possible values: ");
        assert!(said.starts_with(&error) && said.ends_with(&format!("\n\n{usage}\n\n{hint}")), "{said}");
        let said = usage_error(&[&format!("--{value}")]);
        assert!(said.starts_with(&format!("error: unexpected argument '--{quoted}' found")), "{said}");
        assert!(said.ends_with(&format!("\n\n{usage}\n\n{hint}")), "{value:?}: {said}");
    }
    // The program's own rules, which clap writes out with the usage line: said once.
    let said = usage_error(&["--bench", "--ipc", "all"]);
    assert!(
        said.ends_with(&format!("\n\n{usage}\n\n{hint}")) && said.matches("Usage:").count() == 1,
        "{said}"
    );
    // The internal parser's help for a missing subcommand holds its usage line already.
    let said = usage_error(&[crate::role::INTERNAL]);
    assert_eq!(said.matches("Usage: simple-ipc @internal").count(), 1, "{said}");
}
