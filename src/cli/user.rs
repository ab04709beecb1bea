//! The user's command line as clap reads it: its options, with the rules between them that clap holds
//! itself (`--timeout` with `--topology` is refused); `rules` holds the others, and makes the role. A usage
//! error exits 1, not clap's 2, which a test harness would read as "waived".

use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, CommandFactory, FromArgMatches, Parser, ValueEnum, ValueHint};

use super::generate;
use super::values::{SyncParser, parse_bench_size, parse_timeout};

use crate::ipc::{Fds, Mechanism, Sync};
use crate::meeting::Address;
use crate::phases::timings::Timeout;
use crate::segment::MAX_PROCESSES;

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
    // The last of a repeated option wins (`--ipc vmm --ipc pool` is pool, `-q -q` is quiet), as with rg, fd
    // and cargo: a shell alias or a wrapper script that gives an option leaves its user free to give it
    // again. (The internal parser stays strict: see `internal`.)
    args_override_self = true,
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
struct Cli {
    #[command(flatten)]
    options: Options,

    /// Print shell completions or the man page, made from this parser, then exit.
    ///
    /// Alone: no run. Each value says where its text goes, as in `simple-ipc --generate man >
    /// ~/.local/share/man/man1/simple-ipc.1`.
    #[arg(long, value_enum, value_name = "WHAT", exclusive = true)]
    generate: Option<generate::What>,
}

/// The user's options, which a run of one mechanism that this program starts takes too (see `internal`).
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub(super) struct Options {
    // The run.
    /// Processes per chosen GPU (at most 32 in all).
    ///
    /// Each has a buffer of its own, and all take part in one round-robin.
    // Negative numbers are values, so that `-1` reaches the value parser, which says what is wrong with it
    // (clap would call it an unexpected argument); so for --timeout and --bench-max-bytes.
    #[arg(long, value_name = "N", default_value_t = 1, help_heading = RUN, allow_negative_numbers = true,
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
    #[arg(long, value_name = "SECONDS", default_value_t = Timeout::default(), help_heading = RUN,
          allow_negative_numbers = true, value_parser = parse_timeout)]
    pub timeout: Timeout,

    /// Pin each child (or joiner) to the CPUs of its GPU's NUMA node.
    ///
    /// Where that node is known.
    #[arg(long, help_heading = RUN)]
    pub bind_numa: bool,

    /// Print the peer-access matrix and each GPU's PCI address, NUMA node and CPUs, then exit.
    ///
    /// Another mode: no run.
    #[arg(long, help_heading = RUN, conflicts_with_all = ["sequential", "timings", "json", "procs_per_device",
          "bind_numa", "ipc", "sync", "timeout", "quiet", "fds", "metrics"])]
    pub topology: bool,

    // The mechanism.
    /// How the buffers are shared; all: each mechanism in a run of its own, then a table.
    ///
    /// legacy: CUDA IPC handles, the original's (its cudaIpcGetMemHandle and cudaIpcOpenMemHandle, here
    /// cuIpcGetMemHandle and cuIpcOpenMemHandle); vmm: virtual memory management allocations (cuMemCreate)
    /// exported as file descriptors (cuMemExportToShareableHandle); pool: allocations from a memory pool
    /// (cuMemAllocFromPoolAsync), the pool exported as a file descriptor (cuMemPoolExportToShareableHandle)
    /// and each allocation with cuMemPoolExportPointer; vmm's and pool's descriptors travel as --fds says;
    /// fabric: fabric handles (cuMemCreate, then cuMemExportToShareableHandle of a fabric handle), which need
    /// an IMEX channel.
    #[arg(long, value_enum, value_name = "MECHANISM", default_value_t = IpcArg::Legacy, help_heading = MECHANISM)]
    pub ipc: IpcArg,

    /// How the round-robin orders the writes: interprocess events, or stream memory operations.
    ///
    /// events: interprocess events (the original's); memops: stream memory operations on a flag after each
    /// buffer, in IPC-mapped device memory. Pool memory refuses memops: --ipc pool is refused with them,
    /// and --ipc all waives pool.
    #[arg(long, value_enum, value_name = "HOW", default_value_t = Sync::Events, help_heading = MECHANISM,
          value_parser = SyncParser)]
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
    #[arg(long, value_name = "SOCKET", value_parser = parse_address, help_heading = CONTAINERS,
          value_hint = ValueHint::FilePath, conflicts_with_all = ["topology", "join", "sequential"])]
    pub serve: Option<Address>,

    /// Join the run served at SOCKET as one of its processes.
    ///
    /// The index, the segment and the descriptors come from the server, and everything else is a child's
    /// (or, where the server runs --bench, the producer's); of the other options it takes --timeout,
    /// --quiet and --bench (then the run must be the benchmark).
    #[arg(long, value_name = "SOCKET", value_parser = parse_address, help_heading = CONTAINERS,
          value_hint = ValueHint::FilePath, conflicts_with_all = ["topology", "serve",
          "sequential", "timings", "json", "procs_per_device", "bind_numa", "sync", "ipc", "fds", "metrics"])]
    pub join: Option<Address>,

    /// Run the processes in namespaces of their own, as in containers (with --ipc all: the matrix).
    ///
    /// They meet over the protocol of --serve and --join. KINDS, comma-separated: pid (each its own PID
    /// namespace, all with the same pid number), shm (its own /dev/shm), ipc, net, uts, cgroup, user (root
    /// in a user namespace: no root needed), container (Docker's default: pid, shm, ipc, net, uts, cgroup);
    /// `joiners:KINDS` leaves the parent where it is. With --ipc all: the table of every boundary of KINDS
    /// by every kind of handle (each cell a run whose --ipc and --sync the table sets).
    #[arg(long, value_name = "KINDS", value_parser = crate::os::namespace_kinds::parse_arg, help_heading = CONTAINERS,
          conflicts_with_all = ["bench", "topology", "serve", "join", "sequential"])]
    pub isolate: Option<crate::os::namespace_kinds::Isolation>,

    /// Forecast CUDA IPC between two running processes, read from outside them; no run, no GPU needed.
    ///
    /// EXPORTER and IMPORTER are pids as this process sees them (root on the node, or a pod with hostPID:
    /// `docker inspect -f '{{.State.Pid}}' NAME`, `crictl inspect`). Each one's place is read from
    /// /proc/PID (namespaces, uid and user namespace, capabilities, seccomp, the environment it started
    /// with, its /dev/shm, GPUs and hostname, the libraries it has loaded) without entering, signalling or
    /// stopping it, and every kind of handle and library path is forecast both ways, with the least change
    /// for Docker and Kubernetes. A process that is gone or cannot be read is an error naming the fact.
    #[arg(long, num_args = 2, value_names = ["EXPORTER", "IMPORTER"], help_heading = CONTAINERS,
          allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(1..),
          conflicts_with_all = ["topology", "serve", "join", "isolate", "bench", "sequential", "timings",
          "procs_per_device", "bind_numa", "ipc", "sync", "fds", "metrics", "timeout"])]
    pub between: Option<Vec<i32>>,

    // Output.
    /// Write one JSON document to FILE however the run ends.
    ///
    /// Its status (passed, failed, waived or interrupted), the reason and the exit status, and the mode's
    /// results (the phase timings of a run, the figures of --bench, the table of --ipc all). FILE is a
    /// regular file or a new one, replaced whole as the run begins (status running: what a run killed with
    /// SIGKILL leaves) and once it has ended. `-`: the document alone on standard output, and every other line
    /// on standard error.
    #[arg(long, value_name = "FILE", help_heading = OUTPUT, value_hint = ValueHint::FilePath)]
    pub json: Option<PathBuf>,

    /// Write the run's metrics to FILE in Prometheus' text format, however the run ends.
    ///
    /// How it ended (status, exit status), each phase's time per process, each mechanism's result (--ipc
    /// all), the matrix's cells, the benchmark's figures, MPS, what the processes of a served run share, and
    /// the Xid errors the kernel logged for the run's GPUs: for node_exporter's textfile collector (a FILE
    /// ending in .prom in its directory) or a Pushgateway. FILE is replaced whole as the run begins (status
    /// running) and once it has ended (a temporary file beside it, renamed over it). `-`: on standard output,
    /// every other line on standard error.
    #[arg(long, value_name = "FILE", help_heading = OUTPUT, value_hint = ValueHint::FilePath)]
    pub metrics: Option<PathBuf>,

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
          help_heading = BENCHMARK, allow_negative_numbers = true)]
    pub bench_max_bytes: u64,
}

/// `--ipc`: one mechanism, or all of them.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IpcArg {
    Legacy,
    Vmm,
    Pool,
    Fabric,
    All,
}

impl IpcArg {
    /// The name as typed (`legacy`, `vmm`, `pool`, `all`): the mechanisms' own names (see `ipc::Spec`).
    pub(crate) fn name(self) -> String {
        self.to_possible_value().map(|value| value.get_name().to_owned()).unwrap_or_default()
    }

    /// The mechanism named; `None` for `all`.
    pub(crate) fn mechanism(self) -> Option<Mechanism> {
        match self {
            IpcArg::Legacy => Some(Mechanism::Legacy),
            IpcArg::Vmm => Some(Mechanism::Vmm),
            IpcArg::Pool => Some(Mechanism::Pool),
            IpcArg::Fabric => Some(Mechanism::Fabric),
            IpcArg::All => None,
        }
    }
}

/// clap's parser for `--serve` and `--join`.
pub(super) fn parse_address(text: &str) -> Result<Address, String> {
    Address::parse(text).map_err(|e| e.to_string())
}

/// A user's command line as clap reads it, before the rules between options that clap's own cannot hold
/// (`rules`).
pub(super) struct Read {
    /// `--generate`, which comes alone: the options are then their defaults.
    pub generate: Option<generate::What>,
    pub options: Options,
    matches: clap::ArgMatches,
}

impl Read {
    /// Whether the user gave the option `id` (a default never counts).
    pub(super) fn given(&self, id: &str) -> bool {
        self.matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    }
}

/// Reads `args` (the program's name first) as a user's command line.
pub(super) fn read(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString> + Clone>,
) -> Result<Read, clap::Error> {
    let matches = Cli::command().try_get_matches_from(args).map_err(a_child_index_is_no_argument)?;
    let Cli { options, generate } = Cli::from_arg_matches(&matches)?;
    Ok(Read { generate, options, matches })
}

/// clap's "unexpected argument '0'", where the argument is a number, says what it was: NVIDIA's simpleIPC
/// starts each child as itself again with the child's index (`simpleIPC 0`), and someone who knows the
/// original may type that; here the parent starts its children itself, with arguments of its own.
fn a_child_index_is_no_argument(e: clap::Error) -> clap::Error {
    let index = match (e.kind(), e.get(ContextKind::InvalidArg)) {
        (ErrorKind::UnknownArgument, Some(ContextValue::String(arg)))
            if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_digit()) =>
        {
            arg.clone()
        }
        _ => return e,
    };
    let message = format!(
        "unexpected argument '{index}': `{index}` is how NVIDIA's simpleIPC started its children (the parent \
         ran itself again with a child's index); this program starts its own children itself: run it \
         without arguments, or with the options of --help"
    );
    Cli::command().error(ErrorKind::UnknownArgument, message)
}

/// The usage line of the user's parser.
pub(super) fn usage() -> String {
    Cli::command().render_usage().to_string()
}

/// The user's parser, which `--generate` makes its completions and man page of.
pub(super) fn command() -> clap::Command {
    Cli::command()
}

/// The user's options that `--help` shows (their long names), for tests.
#[cfg(test)]
pub(super) fn long_options() -> Vec<String> {
    Cli::command().get_arguments().filter_map(|arg| arg.get_long().map(str::to_owned)).collect()
}
