//! The command line. Users run the parent with options; the parent starts each child with its index.
//! A usage error exits 1, not clap's 2, which a test harness would read as "waived". An option that would do
//! nothing in the mode chosen (`--bench-max-bytes` without `--bench`, `--timeout` with `--topology`) is a
//! usage error too, so that nobody believes it took effect.

use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

use crate::segment::MAX_PROCESSES;

/// The smallest and largest `--bench-max-bytes`: the benchmark's first size, and the most one copy takes.
const BENCH_MIN_BYTES: u64 = 4096;
const BENCH_MAX_BYTES: u64 = i32::MAX as u64;

/// `--version`: this program's version, the git revision it was built from, and what its kernel needs.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (rev ",
    env!("SIMPLE_IPC_REVISION"),
    "; ",
    env!("SIMPLE_IPC_KERNEL_NEEDS"),
    ")"
);

/// The headings of `--help`, in the order shown.
const RUN: &str = "The run";
const MECHANISM: &str = "The mechanism";
const CONTAINERS: &str = "In containers";
const OUTPUT: &str = "Output";
const BENCHMARK: &str = "The benchmark";

#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(
    name = "simple-ipc",
    version = VERSION,
    about = "CUDA inter-process communication on one node, as NVIDIA's sample simpleIPC does it.",
    long_about = "CUDA inter-process communication on one node, as NVIDIA's sample simpleIPC does it: one \
                  process per chosen GPU (or more: --procs-per-device) shares a GPU buffer with the others \
                  through IPC handles; each writes every buffer in turn, in a round-robin ordered by \
                  interprocess events and a barrier in shared memory, then copies its own buffer back and \
                  verifies it.",
    after_help = "Exit status: 0 passed; 1 failed, or a usage error; 2 waived (not a failure: nothing here to \
                  test); 128+N stopped by signal N. --help says more.",
    after_long_help = "Exit status: 0 passed; 1 failed, or a usage error; 2 waived, which is not a failure: \
                  nothing here can run the test (no CUDA driver, no GPU, no GPU fit for IPC, or the mechanism \
                  of --ipc or the ordering of --sync missing on these GPUs). With --ipc all: 1 if any \
                  mechanism failed, 2 if every one was waived, else 0 (a mechanism waived beside others that \
                  passed is no failure); with --ipc all --isolate, 1 only if a run in the same namespaces \
                  failed (a boundary the driver refuses is a finding, not a failure). 128+N: stopped by signal \
                  N (141: the reader of the output went away).\n\
                  Without a GPU, SIMPLE_IPC_SIMULATE_GPUS=ok,ok runs the whole protocol on simulated GPUs in \
                  host memory."
)]
pub struct Cli {
    /// Child index, given by the parent when it starts its children (not for users).
    #[arg(hide = true, value_parser = clap::value_parser!(u32).range(0..MAX_PROCESSES as i64))]
    pub child: Option<u32>,

    /// The guardian's role: the socket its parent tells it the run's driver files over (not for users).
    #[arg(long, hide = true, conflicts_with = "child", value_name = "FD")]
    pub guardian_fd: Option<i32>,

    /// A child's end of the socket its descriptors come over, for vmm and pool (not for users).
    #[arg(long, hide = true, requires = "child", value_name = "FD")]
    pub socket_fd: Option<i32>,

    /// The descriptor of the parent's segment, which a child inherits (not for users).
    #[arg(long, hide = true, requires = "child", value_name = "FD")]
    pub segment_fd: Option<i32>,

    /// A run of one mechanism for `--ipc all`: the inherited pipe its `--json` document goes into (not for
    /// users).
    #[arg(long, hide = true, conflicts_with = "json", value_name = "FD")]
    pub report_fd: Option<i32>,

    // The run.
    /// Processes per chosen GPU (at most 32 in all).
    ///
    /// Each has a buffer of its own, and all take part in one round-robin.
    #[arg(long, value_name = "N", default_value_t = 1, help_heading = RUN,
          value_parser = clap::value_parser!(u32).range(1..=MAX_PROCESSES as i64))]
    pub procs_per_device: u32,

    /// Start the children only after the buffers are exported, as the original does.
    ///
    /// By default they start while the parent still allocates; this order is slower, for comparison.
    #[arg(long, help_heading = RUN)]
    pub sequential: bool,

    /// The watchdog: stop the run after this many seconds and exit 1; 0: never.
    ///
    /// Past it, the run stops and names each process that had not finished, and where it was.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, help_heading = RUN)]
    pub timeout: u64,

    /// Pin each child (or joiner) to the CPUs of its GPU's NUMA node.
    ///
    /// Where that node is known.
    #[arg(long, help_heading = RUN)]
    pub bind_numa: bool,

    /// Print the peer-access matrix and each GPU's PCI address, NUMA node and CPUs, then exit.
    ///
    /// Another mode: no run.
    #[arg(long, help_heading = RUN, conflicts_with_all = ["sequential", "timings", "json", "procs_per_device",
          "bind_numa", "ipc", "sync", "timeout", "quiet", "fds"])]
    pub topology: bool,

    // The mechanism.
    /// How the buffers are shared; all: each mechanism in a run of its own, then a table.
    ///
    /// legacy: CUDA IPC handles (the original's); vmm, pool: virtual memory management allocations or
    /// memory pool allocations, shared as file descriptors over a Unix socket; fabric: fabric handles (they
    /// need an IMEX channel).
    #[arg(long, value_enum, value_name = "MECHANISM", default_value_t = IpcArg::Legacy, help_heading = MECHANISM)]
    pub ipc: IpcArg,

    /// How the round-robin orders the writes: interprocess events, or stream memory operations.
    ///
    /// events: interprocess events (the original's); memops: stream memory operations on a flag after each
    /// buffer, in IPC-mapped device memory. Pool memory refuses memops: --ipc pool is refused with them,
    /// and --ipc all waives pool.
    #[arg(long, value_enum, value_name = "HOW", default_value_t = Sync::Events, help_heading = MECHANISM)]
    pub sync: Sync,

    /// How vmm and pool descriptors reach the other processes: over a Unix socket, or fetched with pidfd_getfd.
    ///
    /// socket: passed over a Unix socket (SCM_RIGHTS), which needs no shared PID namespace and no ptrace
    /// permission; pidfd: each importer fetches the exporter's descriptors with pidfd_open and pidfd_getfd,
    /// as PyTorch's expandable segments and UCX do: that needs the exporter's pid visible from the importer
    /// (one PID namespace) and ptrace permission (the same user and Yama's ptrace_scope, or CAP_SYS_PTRACE).
    #[arg(long, value_enum, value_name = "HOW", default_value_t = Fds::Socket, help_heading = MECHANISM)]
    pub fds: Fds,

    // In containers.
    /// Serve the run at SOCKET to the processes that --join it, instead of starting children.
    ///
    /// SOCKET is a path, or @NAME for an abstract socket; the joiners come from other containers, say. It
    /// waits for as many as the GPUs it chooses times --procs-per-device, and says how many as it starts.
    /// With --ipc all, one run per mechanism, which the joiners follow in turn; with --bench, the
    /// benchmark, whose producer joins.
    #[arg(long, value_name = "SOCKET", help_heading = CONTAINERS,
          conflicts_with_all = ["topology", "join", "sequential"])]
    pub serve: Option<String>,

    /// Join the run served at SOCKET as one of its processes.
    ///
    /// The index, the segment and the descriptors come from the server, and everything else is a child's
    /// (or, where the server runs --bench, the producer's); of the other options it takes --timeout,
    /// --quiet and --bench (then the run must be the benchmark).
    #[arg(long, value_name = "SOCKET", help_heading = CONTAINERS, conflicts_with_all = ["topology", "serve",
          "sequential", "timings", "json", "procs_per_device", "bind_numa", "sync", "ipc", "child", "fds"])]
    pub join: Option<String>,

    /// Run the processes in namespaces of their own, as in containers (with --ipc all: the matrix).
    ///
    /// They meet over the protocol of --serve and --join. KINDS, comma-separated: pid (each its own PID
    /// namespace, all with the same pid number), shm (its own /dev/shm), ipc, net, uts, cgroup, user (root
    /// in a user namespace: no root needed), container (Docker's default: pid, shm, ipc, net, uts, cgroup);
    /// `joiners:KINDS` leaves the parent where it is. With --ipc all: the table of every boundary of KINDS
    /// by every kind of handle (each cell a run whose --ipc and --sync the table sets).
    #[arg(long, value_name = "KINDS", value_parser = crate::isolation::parse_arg, help_heading = CONTAINERS,
          conflicts_with_all = ["bench", "topology", "serve", "join", "sequential", "child"])]
    pub isolate: Option<crate::isolation::Isolation>,

    /// The namespaces this process enters before anything else (a process an --isolate run starts; not
    /// for users).
    #[arg(long, hide = true, value_name = "KINDS", value_parser = crate::isolation::parse_arg,
          requires = "join", conflicts_with = "isolate")]
    pub isolated: Option<crate::isolation::Isolation>,

    /// This served run's place in a sequence (`--serve SOCKET --ipc all` gives each mechanism's run its own:
    /// K/M), which it tells its joiners (not for users).
    #[arg(long, hide = true, value_name = "K/M", value_parser = crate::wire::Round::parse,
          requires = "served_fds")]
    pub serve_round: Option<crate::wire::Round>,

    /// What a run of a served sequence inherits from its top parent: the sequence's listener, the socket the
    /// connections go back over, then the connections it holds (not for users).
    #[arg(long, hide = true, value_name = "FD,...", value_delimiter = ',', requires_all = ["serve", "serve_round"])]
    pub served_fds: Option<Vec<i32>>,

    // Output.
    /// Write one JSON document to FILE however the run ends.
    ///
    /// Its status (passed, failed or waived), the reason and the exit status, and the mode's results (the
    /// phase timings of a run, the figures of --bench, the table of --ipc all). FILE is a regular file or a
    /// new one; an existing one is replaced whole once the run has ended. `-`: the document alone on
    /// standard output, and every other line on standard error.
    #[arg(long, value_name = "FILE", help_heading = OUTPUT)]
    pub json: Option<PathBuf>,

    /// Print nothing on standard output but the verdict line.
    ///
    /// Errors still go to standard error.
    #[arg(long, short, help_heading = OUTPUT)]
    pub quiet: bool,

    /// Print the time of every phase of every process, after the normal output.
    #[arg(long, conflicts_with = "quiet", help_heading = OUTPUT)]
    pub timings: bool,

    // The benchmark.
    /// Run the IPC benchmark instead, of one mechanism (--ipc), for every pair of chosen GPUs.
    ///
    /// For every (producer GPU, consumer GPU) pair: the round trip of a hand-over by interprocess events
    /// and by stream memory operations, and the copy rate through the IPC mapping for sizes from 4 KiB,
    /// each 4 times the last, up to --bench-max-bytes, beside an in-process peer copy between the same GPUs
    /// (a local copy where the pair is one GPU).
    #[arg(long, help_heading = BENCHMARK,
          conflicts_with_all = ["topology", "sequential", "timings", "procs_per_device", "bind_numa", "sync",
          "fds"])]
    pub bench: bool,

    /// The benchmark's largest buffer (4KiB to 2GiB less one byte).
    ///
    /// Bytes, or with a unit, K or KiB, M or MiB, G or GiB (powers of 1024), as in 256MiB.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_bench_size,
          help_heading = BENCHMARK)]
    pub bench_max_bytes: u64,
}

/// `--bench-max-bytes`: a count of bytes, plain or with a unit (K, KiB, M, MiB, G, GiB: powers of 1024, in
/// any case, a space before the unit allowed), within the benchmark's range.
fn parse_bench_size(text: &str) -> Result<u64, String> {
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

/// `--sync`: how the round-robin hands a buffer from one writer to the next.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// `cudaStreamWaitEvent` on the buffer's interprocess event, `cudaEventRecord` after the kernel.
    Events,
    /// `cuStreamWaitValue32` on the buffer's flag before the kernel, `cuStreamWriteValue32` after it.
    Memops,
}

/// `--fds`: how the descriptors of vmm and pool buffers reach the importers.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fds {
    /// Over a Unix socket, with SCM_RIGHTS.
    Socket,
    /// Fetched by each importer with `pidfd_open` and `pidfd_getfd`.
    Pidfd,
}

/// `--ipc`: one mechanism, or all of them.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpcArg {
    Legacy,
    Vmm,
    Pool,
    Fabric,
    All,
}

impl IpcArg {
    /// The name as typed (`legacy`, `vmm`, `pool`, `all`): the mechanisms' own names (see `ipc::Spec`).
    pub fn name(self) -> String {
        self.to_possible_value().map(|value| value.get_name().to_owned()).unwrap_or_default()
    }
}

impl Cli {
    /// The watchdog's limit, `None` for `--timeout 0`.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        (self.timeout > 0).then(|| std::time::Duration::from_secs(self.timeout))
    }
}

/// Parses this process's arguments; on `Err`, print the error and exit with [`usage_exit_code`].
pub fn parse() -> Result<Cli, clap::Error> {
    parse_from(std::env::args_os())
}

/// Parses `args` (the program's name first), with the rules clap's own cannot hold.
fn parse_from(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString> + Clone>,
) -> Result<Cli, clap::Error> {
    let matches = Cli::command().try_get_matches_from(args)?;
    let cli = Cli::from_arg_matches(&matches)?;
    // `requires = "bench"` would not do: clap lets a requirement go unmet where the required argument
    // conflicts with one given (`--sequential --bench-max-bytes 8K`), and every mode but --bench does.
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if given("bench_max_bytes") && !cli.bench {
        let message = "--bench-max-bytes sets the largest buffer of --bench, and --bench is not given";
        return Err(Cli::command().error(clap::error::ErrorKind::MissingRequiredArgument, message));
    }
    // Legacy and fabric handles have no descriptors (a run of `--ipc all` is given the sequence's options).
    if given("fds") && matches!(cli.ipc, IpcArg::Legacy | IpcArg::Fabric) && cli.report_fd.is_none() {
        let message = format!(
            "--fds sets how vmm and pool descriptors travel, and --ipc {} has none (use --ipc vmm, pool or all)",
            cli.ipc.name()
        );
        return Err(Cli::command().error(clap::error::ErrorKind::ArgumentConflict, message));
    }
    // The container matrix sets each of its runs' ordering itself (see `isolation::matrix`).
    if given("sync") && cli.isolate.is_some() && cli.ipc == IpcArg::All {
        let message = "the argument '--sync' cannot be used with '--ipc all --isolate': the container matrix \
                       sets the ordering of each of its runs itself";
        return Err(Cli::command().error(clap::error::ErrorKind::ArgumentConflict, message));
    }
    Ok(cli)
}

/// 0 for `--help` and `--version`, 1 for a usage error (never clap's 2, which means "waived" here).
pub fn usage_exit_code(e: &clap::Error) -> u8 {
    u8::from(e.use_stderr())
}

/// Prints what clap has to say; a usage error always comes with the usage line.
pub fn print_usage_error(e: &clap::Error) {
    if !e.use_stderr() {
        let _ = e.print(); // --help, --version
        return;
    }
    // clap's tip to pass an option "as a value, use '-- --bogus'" is about the child's hidden index, which
    // users never type: an unknown option is an unknown option.
    let rendered = e.render().to_string();
    let kept: Vec<&str> = rendered.lines().filter(|l| !l.contains("as a value, use '--")).collect();
    let mut text = kept.join("\n").replace("\n\n\n", "\n\n");
    if !text.contains("Usage:") {
        text.push_str(&format!("\n\n{}", Cli::command().render_usage()));
    }
    warn!("{}", text.trim_end());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Option<Cli> {
        match parse_from(std::iter::once("simple-ipc").chain(args.iter().copied())) {
            Ok(cli) => Some(cli),
            Err(e) => {
                assert_eq!(usage_exit_code(&e), 1, "usage errors exit 1: {e}");
                None
            }
        }
    }

    #[test]
    fn roles_and_options() {
        let parent = run(&[]).unwrap();
        assert_eq!((parent.child, parent.procs_per_device, parent.sequential), (None, 1, false));
        assert_eq!(run(&["7"]).unwrap().child, Some(7));
        assert_eq!(run(&["--procs-per-device", "4"]).unwrap().procs_per_device, 4);
        assert_eq!(run(&["--segment-fd", "5", "3"]).unwrap().segment_fd, Some(5));
        assert_eq!(run(&["--ipc", "vmm", "--report-fd", "5"]).unwrap().report_fd, Some(5));
        assert_eq!(parent.ipc, IpcArg::Legacy, "the original's mechanism by default");
        assert_eq!(run(&["--ipc", "pool"]).unwrap().ipc.name(), "pool");
        assert_eq!(run(&["--ipc", "all"]).unwrap().ipc, IpcArg::All);
        assert_eq!(parent.sync, Sync::Events, "the original's ordering by default");
        assert_eq!(run(&["--sync", "memops"]).unwrap().sync, Sync::Memops);
        assert_eq!(parent.fds, Fds::Socket, "descriptors over the socket by default");
        assert_eq!(run(&["--ipc", "pool", "--fds", "pidfd"]).unwrap().fds, Fds::Pidfd);
        assert!(
            run(&["--ipc", "legacy", "--fds", "pidfd", "--report-fd", "5"]).is_some(),
            "a run of --ipc all"
        );
        assert_eq!(parent.timeout(), Some(std::time::Duration::from_secs(60)), "a generous default");
        assert_eq!(run(&["--timeout", "0"]).unwrap().timeout(), None, "0 turns the watchdog off");
        for bad in [
            &["32"][..],
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
            &["--timeout", "-1"],
            &["--ipc", "cuda"],
            &["--ipc"],
            &["--sync", "spin"],
            &["--report-fd", "5", "--json", "x.json"],
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
        assert!(
            run(&["--topology"]).unwrap().topology,
            "the defaults of --ipc, --sync, --timeout do not count"
        );
        let join = run(&["--join", "s", "--timeout", "5", "--quiet"]).unwrap();
        assert_eq!((join.timeout, join.quiet), (5, true), "a joiner takes --timeout and --quiet");
        assert!(
            run(&["--ipc", "vmm", "--isolate", "pid", "--sync", "memops"]).is_some(),
            "one mechanism: --sync counts"
        );
    }

    #[test]
    fn bench_sizes_take_units() {
        let max = |args: &[&str]| run(&[&["--bench"], args].concat()).map(|cli| cli.bench_max_bytes);
        assert_eq!(max(&[]), Some(1 << 30), "1 GiB by default");
        assert_eq!(max(&["--bench-max-bytes", "4096"]), Some(4096));
        assert_eq!(max(&["--bench-max-bytes", "256MiB"]), Some(256 << 20));
        assert_eq!(max(&["--bench-max-bytes=64K"]), Some(64 << 10));
        assert_eq!(max(&["--bench-max-bytes", "8kib"]), Some(8 << 10));
        assert_eq!(max(&["--bench-max-bytes", "1G"]), Some(1 << 30));
        assert_eq!(max(&["--bench-max-bytes", "1 GiB"]), Some(1 << 30));
        assert_eq!(max(&["--bench-max-bytes", "2047M"]), Some(2047 << 20));
        for bad in
            ["4095", "2GiB", "3K", "256MB", "MiB", "1.5GiB", "-1", "99999999999999999999", "9999999999G"]
        {
            assert_eq!(max(&["--bench-max-bytes", bad]), None, "{bad} must be refused");
        }
    }
}
