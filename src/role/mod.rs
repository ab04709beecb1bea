//! What this process is, decided once from its arguments (`cli`): one [`Role`] with its typed parameters,
//! which everything below the entry reads (nothing there sees the command line). [`Role::to_args`] is the
//! one writer of the arguments that start this program in an internal role; `cli`'s internal parser is
//! their one reader.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use crate::ipc::{Fds, Mechanism, Sync};
use crate::meeting::Address;
use crate::os::namespace_kinds::Isolation;
use crate::phases::timings::Timeout;
use crate::report::document::{Mode, Options};
use crate::wire::Round;

/// The first argument of a process this program starts in an internal role: no option and no value the
/// user's parser takes, so that a user's command line can never be read as one.
pub(crate) const INTERNAL: &str = "@internal";

/// What this process is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Role {
    /// The sample's run of one mechanism: children, or processes that join (`--serve`, `--isolate`).
    Sample(Run, Mechanism),
    /// `--bench`: the consumer.
    Bench(Bench),
    /// `--topology`.
    Topology,
    /// `--ipc all`: a run of each mechanism, then a table.
    EveryMechanism(EveryMechanism),
    /// `--ipc all --isolate KINDS`: the container matrix of the boundaries of KINDS.
    Matrix(Run, Isolation),
    /// A process of the sample (or the benchmark's producer), started by its parent.
    Child(Child),
    /// `--join SOCKET`.
    Joiner(Joiner),
    /// The guardian of a run's driver files, started by its parent.
    Guardian { fd: RawFd },
    /// A run of one mechanism that `--ipc all` or the matrix started, whose document goes to a pipe.
    MechanismRun(MechanismRun),
    /// A process an `--isolate` run started in namespaces of its own, which joins that run.
    Isolated(Isolated),
    /// `--between EXPORTER IMPORTER`: the forecast between two running processes, read from outside.
    Between(Between),
}

/// `--between`'s two processes, by pid as this process sees them, and its output.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Between {
    pub exporter: i32,
    pub importer: i32,
    pub json: Option<PathBuf>,
    pub quiet: bool,
}

/// The options of a run of the sample (or of several: `--ipc all`, the matrix).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Run {
    pub sync: Sync,
    pub fds: Fds,
    pub procs_per_device: u32,
    pub sequential: bool,
    pub bind_numa: bool,
    pub timings: bool,
    pub timeout: Timeout,
    pub quiet: bool,
    /// `--serve SOCKET`.
    pub serve: Option<Address>,
    /// `--isolate KINDS` (of one mechanism's run; the matrix's is its own).
    pub isolate: Option<Isolation>,
    /// `--json FILE`.
    pub json: Option<PathBuf>,
    /// `--metrics FILE`.
    pub metrics: Option<PathBuf>,
    /// Not the user's: where the run inside an isolation makes its socket's private directory, a path the
    /// process outside chose, so that it can remove what the run leaves there (the run's guardian dies with
    /// its PID namespace's init).
    pub socket_dir: Option<PathBuf>,
}

impl Default for Run {
    /// The options of a run whose user gave none.
    fn default() -> Self {
        Run {
            sync: Sync::default(),
            fds: Fds::default(),
            procs_per_device: 1,
            sequential: false,
            bind_numa: false,
            timings: false,
            timeout: Timeout::default(),
            quiet: false,
            serve: None,
            isolate: None,
            json: None,
            metrics: None,
            socket_dir: None,
        }
    }
}

/// `--ipc all`: the options of each mechanism's run, and the mechanisms those options cannot run whatever
/// the devices, each with why (memops cannot order pool memory): found by the parse, waived without a run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EveryMechanism {
    pub run: Run,
    pub not_run: Vec<(Mechanism, String)>,
}

impl EveryMechanism {
    /// Why the options cannot run `mechanism`, if they cannot.
    pub(crate) fn why_not_run(&self, mechanism: Mechanism) -> Option<&str> {
        self.not_run.iter().find(|(m, _)| *m == mechanism).map(|(_, why)| why.as_str())
    }
}

/// The options of `--bench`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Bench {
    pub mechanism: Mechanism,
    pub max_bytes: u64,
    pub timeout: Timeout,
    pub quiet: bool,
    pub serve: Option<Address>,
    pub json: Option<PathBuf>,
    pub metrics: Option<PathBuf>,
}

/// What a child is given: its index, the segment's descriptor and its end of its descriptor socket.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Child {
    pub index: u32,
    pub segment_fd: Option<RawFd>,
    pub socket_fd: Option<RawFd>,
    /// The benchmark's producer.
    pub bench: bool,
    pub quiet: bool,
}

/// What a process that joins a served run is given.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Joiner {
    pub address: Address,
    pub timeout: Timeout,
    pub quiet: bool,
    /// The user said `--bench`: the run must be the benchmark.
    pub bench: bool,
}

/// A run of one mechanism: `run`'s options with its own mechanism, its document to the pipe `report_fd`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MechanismRun {
    pub mechanism: Mechanism,
    pub run: Run,
    pub report_fd: RawFd,
    /// Its place in a served sequence (`--serve SOCKET --ipc all`).
    pub served: Option<Served>,
    /// Where it is the run inside an isolation (`--isolate`): its socket to the process outside, which
    /// started it (see `relaunch::Relaunch::outside_socket`). It enters its namespaces first thing.
    pub outside_fd: Option<RawFd>,
    /// It is a row of the container matrix (`matrix::row`): it exports every kind of handle once, and its
    /// one isolated process opens each, instead of the sample.
    pub matrix_row: bool,
}

/// A run's place in a served sequence, and what it inherits from the sequence's top parent: the listener,
/// the socket the connections go back over, then the connections it holds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Served {
    pub round: Round,
    pub fds: Vec<RawFd>,
}

/// A process started in namespaces of its own, which enters them and joins the run that started it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Isolated {
    pub isolation: Isolation,
    pub report_fd: RawFd,
    /// Its socket to the run that started it (see `relaunch::Relaunch::outside_socket`).
    pub outside_fd: RawFd,
    /// Its address, `--timeout` and `--quiet` (never the benchmark: `--isolate` is refused with it).
    pub joiner: Joiner,
    /// It is the importer of a row of the container matrix (`matrix::row`), not a process of the sample.
    pub matrix_row: bool,
}

impl Role {
    /// The arguments that start this program in this role (after the program's name): [`INTERNAL`], then
    /// the internal role and its parameters. The user's roles are started by users: they have none.
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<String> = vec![INTERNAL.into()];
        match self {
            Role::Child(child) => {
                args.extend(["child".into(), child.index.to_string()]);
                valued(&mut args, "--segment-fd", child.segment_fd);
                valued(&mut args, "--socket-fd", child.socket_fd);
                flag(&mut args, "--bench", child.bench);
                flag(&mut args, "--quiet", child.quiet);
            }
            Role::Guardian { fd } => args.extend(["guardian".into(), "--fd".into(), fd.to_string()]),
            Role::Isolated(Isolated { isolation, report_fd, outside_fd, joiner, matrix_row }) => {
                args.extend(["join".into(), joiner.address.to_string()]);
                valued(&mut args, "--isolated", Some(isolation));
                valued(&mut args, "--report-fd", Some(report_fd));
                valued(&mut args, "--outside-fd", Some(outside_fd));
                valued(&mut args, "--timeout", Some(joiner.timeout));
                flag(&mut args, "--quiet", joiner.quiet);
                flag(&mut args, "--matrix-row", *matrix_row);
            }
            Role::MechanismRun(MechanismRun {
                mechanism,
                run,
                report_fd,
                served,
                outside_fd,
                matrix_row,
            }) => {
                args.push("run".into());
                valued(&mut args, "--report-fd", Some(report_fd));
                valued(&mut args, "--outside-fd", outside_fd.as_ref());
                flag(&mut args, "--matrix-row", *matrix_row);
                valued(&mut args, "--socket-dir", run.socket_dir.as_ref().map(|d| d.display()));
                if let Some(Served { round, fds }) = served {
                    valued(&mut args, "--serve-round", Some(round));
                    let fds: Vec<String> = fds.iter().map(ToString::to_string).collect();
                    valued(&mut args, "--served-fds", Some(fds.join(",")));
                }
                run_args(&mut args, run, *mechanism);
            }
            Role::Sample(..)
            | Role::Bench(_)
            | Role::Topology
            | Role::Between(_)
            | Role::EveryMechanism(_)
            | Role::Matrix(..)
            | Role::Joiner(_) => return Vec::new(),
        }
        args.into_iter().map(OsString::from).collect()
    }

    /// Whether a user started this process (which then ends with a verdict line), not this program.
    pub(crate) fn started_by_a_user(&self) -> bool {
        !matches!(self, Role::Child(_) | Role::Guardian { .. } | Role::MechanismRun(_) | Role::Isolated(_))
    }

    /// Whether this process is the run inside an isolation, started by the process outside it.
    pub(crate) fn inside_an_isolation(&self) -> bool {
        matches!(self, Role::MechanismRun(MechanismRun { outside_fd: Some(_), .. }))
    }

    /// The pipe this process's document goes to, where the process that started it reads it back.
    pub(crate) fn report_fd(&self) -> Option<RawFd> {
        match self {
            Role::MechanismRun(MechanismRun { report_fd, .. })
            | Role::Isolated(Isolated { report_fd, .. }) => Some(*report_fd),
            _ => None,
        }
    }

    /// `--json FILE`.
    pub(crate) fn json(&self) -> Option<&Path> {
        match self {
            Role::Sample(run, _)
            | Role::EveryMechanism(EveryMechanism { run, .. })
            | Role::Matrix(run, _) => run.json.as_deref(),
            Role::Bench(bench) => bench.json.as_deref(),
            _ => None,
        }
    }

    /// `--metrics FILE`.
    pub(crate) fn metrics(&self) -> Option<&Path> {
        match self {
            Role::Sample(run, _)
            | Role::EveryMechanism(EveryMechanism { run, .. })
            | Role::Matrix(run, _) => run.metrics.as_deref(),
            Role::Bench(bench) => bench.metrics.as_deref(),
            _ => None,
        }
    }

    /// Whether this process prints nothing on standard output but the verdict line (`--quiet`).
    pub(crate) fn quiet(&self) -> bool {
        match self {
            Role::Sample(run, _)
            | Role::EveryMechanism(EveryMechanism { run, .. })
            | Role::Matrix(run, _) => run.quiet,
            Role::MechanismRun(sub) => sub.run.quiet,
            Role::Bench(bench) => bench.quiet,
            Role::Child(child) => child.quiet,
            Role::Joiner(joiner) | Role::Isolated(Isolated { joiner, .. }) => joiner.quiet,
            Role::Between(between) => between.quiet,
            Role::Topology | Role::Guardian { .. } => false,
        }
    }

    /// What a run of one mechanism hands between its processes, which says the paths the forecast holds
    /// against the outcome: the mechanism, its `--sync` and its `--fds`; `None` where this role runs no one
    /// mechanism (`--ipc all`, the matrix, a joiner...).
    pub(crate) fn handles(&self) -> Option<(Mechanism, Sync, Fds)> {
        match self {
            Role::Sample(run, mechanism) => Some((*mechanism, run.sync, run.fds)),
            Role::MechanismRun(sub) => Some((sub.mechanism, sub.run.sync, sub.run.fds)),
            // Its memory's path, and the event's (the benchmark hands over by events and by memops alike).
            Role::Bench(bench) => Some((bench.mechanism, Sync::default(), Fds::default())),
            _ => None,
        }
    }

    /// What the `--json` document says the run was asked to do: its mode and its options (their defaults
    /// where this role takes none).
    pub(crate) fn asked(&self) -> (Mode, Options) {
        let defaults = Options {
            ipc: Mechanism::Legacy.name().to_owned(),
            sync: Sync::default().name().to_owned(),
            procs_per_device: 1,
            sequential: false,
            timings: false,
            timeout_s: Timeout::default().seconds(),
            bind_numa: false,
            quiet: self.quiet(),
            bench_max_bytes: None,
            serve: None,
            isolate: None,
        };
        let of_run = |run: &Run, ipc: &str| Options {
            ipc: ipc.to_owned(),
            sync: run.sync.name().to_owned(),
            procs_per_device: run.procs_per_device,
            sequential: run.sequential,
            timings: run.timings,
            timeout_s: run.timeout.seconds(),
            bind_numa: run.bind_numa,
            serve: run.serve.as_ref().map(ToString::to_string),
            isolate: run.isolate.as_ref().map(ToString::to_string),
            ..defaults.clone()
        };
        match self {
            Role::Sample(run, mechanism) => (Mode::Run, of_run(run, mechanism.name())),
            Role::MechanismRun(sub) => (Mode::Run, of_run(&sub.run, sub.mechanism.name())),
            Role::EveryMechanism(EveryMechanism { run, .. }) => (Mode::IpcAll, of_run(run, "all")),
            Role::Matrix(run, asked) => {
                // The matrix sets each cell's ordering itself (the cells say theirs): no one --sync.
                let options = Options { isolate: Some(asked.to_string()), ..of_run(run, "all") };
                (Mode::ContainerMatrix, Options { sync: "per_cell".to_owned(), ..options })
            }
            Role::Bench(bench) => (
                Mode::Bench,
                Options {
                    ipc: bench.mechanism.name().to_owned(),
                    timeout_s: bench.timeout.seconds(),
                    bench_max_bytes: Some(bench.max_bytes),
                    serve: bench.serve.as_ref().map(ToString::to_string),
                    ..defaults
                },
            ),
            Role::Joiner(joiner) | Role::Isolated(Isolated { joiner, .. }) => {
                (Mode::Run, Options { timeout_s: joiner.timeout.seconds(), ..defaults })
            }
            Role::Topology | Role::Child(_) | Role::Guardian { .. } | Role::Between(_) => {
                (Mode::Run, defaults)
            }
        }
    }
}

/// `name` where `set`.
fn flag(args: &mut Vec<String>, name: &str, set: bool) {
    if set {
        args.push(name.into());
    }
}

/// `name` and its value, where it has one.
fn valued(args: &mut Vec<String>, name: &str, value: Option<impl ToString>) {
    if let Some(value) = value {
        args.extend([name.into(), value.to_string()]);
    }
}

/// `run`'s options as the user's parser takes them (those at their defaults left out), with `--ipc`.
fn run_args(args: &mut Vec<String>, run: &Run, mechanism: Mechanism) {
    valued(args, "--ipc", Some(mechanism.name()));
    valued(args, "--sync", Some(run.sync.name()).filter(|_| run.sync != Sync::default()));
    valued(args, "--fds", Some("pidfd").filter(|_| run.fds == Fds::Pidfd));
    valued(args, "--procs-per-device", Some(run.procs_per_device).filter(|&n| n != 1));
    valued(args, "--timeout", Some(run.timeout).filter(|&timeout| timeout != Timeout::default()));
    valued(args, "--serve", run.serve.as_ref());
    valued(args, "--isolate", run.isolate.as_ref());
    flag(args, "--sequential", run.sequential);
    flag(args, "--bind-numa", run.bind_numa);
    flag(args, "--timings", run.timings);
    flag(args, "--quiet", run.quiet);
}

#[cfg(test)]
mod tests;
