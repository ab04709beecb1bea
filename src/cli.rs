//! The command line. Users run the parent with options; the parent starts each child with its index.
//! A usage error exits 1, not clap's 2, which a test harness would read as "waived".

use std::path::PathBuf;

use clap::{CommandFactory, Parser, ValueEnum};

use crate::segment::MAX_PROCESSES;

#[derive(Parser, Debug, Clone, PartialEq, Eq)]
#[command(
    name = "simple-ipc",
    version,
    about = "CUDA inter-process communication: every process writes every other's GPU buffer through IPC \
             handles, in a round-robin synchronised by IPC events and a barrier in shared memory.",
    after_help = "Exit status: 0 passed, 1 failed, 2 waived (nothing can run here: no CUDA driver, no GPU, \
                  no GPU fit for IPC, or the mechanism missing), 128+N stopped by signal N."
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

    /// How the buffers are shared: legacy CUDA IPC handles (the original's), virtual memory management
    /// allocations or memory pool allocations shared as file descriptors, fabric handles; or all four, one run each.
    #[arg(long, value_enum, value_name = "MECHANISM", default_value_t = IpcArg::Legacy)]
    pub ipc: IpcArg,

    /// How the round-robin orders the writes of a buffer: interprocess events (the original's), or stream
    /// memory operations on a flag after each buffer, in IPC-mapped device memory.
    #[arg(long, value_enum, value_name = "HOW", default_value_t = Sync::Events)]
    pub sync: Sync,

    /// Processes per chosen GPU, each with its own buffer and event, all in one round-robin.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=MAX_PROCESSES as i64))]
    pub procs_per_device: u32,

    /// Print the time of every phase of every process, after the normal output.
    #[arg(long)]
    pub timings: bool,

    /// Write the phase timings as one JSON document to FILE (a regular file; an existing one is replaced).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Start the children only after the buffers are exported, as the original does (slower; for comparison).
    #[arg(long)]
    pub sequential: bool,

    /// Stop the run, name each process that had not finished and where it was, and exit 1 after this many
    /// seconds; 0: never.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub timeout: u64,

    /// Run the IPC benchmark instead: a producer and a consumer hand buffers of 4 KiB up to
    /// --bench-max-bytes over, and a table compares the copy through IPC with the local and staged ones.
    #[arg(long, conflicts_with_all = ["topology", "sequential", "timings", "procs_per_device", "bind_numa", "sync"])]
    pub bench: bool,

    /// Largest buffer of the benchmark.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30,
          value_parser = clap::value_parser!(u64).range(4096..=i32::MAX as u64))]
    pub bench_max_bytes: u64,

    /// Print the peer-access matrix of the GPUs and the NUMA node and CPUs of each, then exit.
    #[arg(long, conflicts_with_all = ["sequential", "timings", "json", "procs_per_device", "bind_numa"])]
    pub topology: bool,

    /// Pin each child to the CPUs of its GPU's NUMA node.
    #[arg(long)]
    pub bind_numa: bool,

    /// Print nothing on standard output but the verdict line (errors still go to standard error).
    #[arg(long, short)]
    pub quiet: bool,

    /// Serve the run at SOCKET (a path, or @NAME for an abstract socket) to the processes that join it with
    /// --join, from other containers say, instead of starting children.
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["bench", "topology", "join", "sequential"])]
    pub serve: Option<String>,

    /// Run the processes in namespaces of their own, as in containers, meeting over the protocol of --serve
    /// and --join: pid (each its own PID namespace, all with the same pid number), shm (its own /dev/shm),
    /// ipc, net, uts, cgroup, user (root in a user namespace: no root needed), container (Docker's default:
    /// pid, shm, ipc, net, uts, cgroup), comma-separated; `joiners:KINDS` leaves the parent where it is.
    /// With --ipc all: the table of every boundary of KINDS by every kind of handle.
    #[arg(long, value_name = "KINDS", value_parser = crate::isolation::parse_arg,
          conflicts_with_all = ["bench", "topology", "serve", "join", "sequential", "child"])]
    pub isolate: Option<crate::isolation::Isolation>,

    /// The namespaces this process enters before anything else (a process an --isolate run starts; not
    /// for users).
    #[arg(long, hide = true, value_name = "KINDS", value_parser = crate::isolation::parse_arg,
          requires = "join")]
    pub isolated: Option<crate::isolation::Isolation>,

    /// This served run's place in a sequence (`--serve SOCKET --ipc all` gives each mechanism's run its own:
    /// K/M), which it tells its joiners (not for users).
    #[arg(long, hide = true, value_name = "K/M", value_parser = crate::meeting::Round::parse, requires = "serve")]
    pub serve_round: Option<crate::meeting::Round>,

    /// Join the run served at SOCKET as one of its processes: the index, the segment and the descriptors
    /// come from the server, and everything else is a child's.
    #[arg(long, value_name = "SOCKET", conflicts_with_all = ["bench", "topology", "serve", "sequential",
          "timings", "json", "procs_per_device", "bind_numa", "sync", "ipc", "child"])]
    pub join: Option<String>,
}

/// `--sync`: how the round-robin hands a buffer from one writer to the next.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// `cudaStreamWaitEvent` on the buffer's interprocess event, `cudaEventRecord` after the kernel.
    Events,
    /// `cuStreamWaitValue32` on the buffer's flag before the kernel, `cuStreamWriteValue32` after it.
    Memops,
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
    Cli::try_parse()
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
        match Cli::try_parse_from(std::iter::once("simple-ipc").chain(args.iter().copied())) {
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
}
