//! Every rule between the user's options that clap's own cannot hold, and the role they make (ripgrep's
//! `HiArgs::from_low_args`): nothing after the parse compares options. An option that would do nothing in
//! the mode chosen (`--bench-max-bytes` without `--bench`) is a usage error, so that nobody believes it took
//! effect; so are options whose values refuse each other (`--bench --ipc all`, `--sync memops --ipc
//! pool`), said before anything runs. What the devices support is no rule of the options: a run asks them.

use clap::error::ErrorKind;

use super::generate;
use super::user::{self, IpcArg, Options};
use crate::ipc::{Mechanism, Sync, memops_refusal};
use crate::role::{Bench, Between, EveryMechanism, Joiner, Role, Run};

/// What a user's command line asks for.
#[derive(Debug)]
pub(super) enum Asked {
    /// A process of this program: the sample, the benchmark, the topology, a joiner...
    Role(Box<Role>),
    /// `--generate`: completions or the man page, made from the user's parser (see `generate`).
    Generate(generate::What),
}

/// Parses `args` (the program's name first) as a user's command line, by clap's rules and these.
pub(super) fn parse_from(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString> + Clone>,
) -> Result<Asked, clap::Error> {
    let read = user::read(args)?;
    if let Some(what) = read.generate {
        return Ok(Asked::Generate(what));
    }
    idle_options(&read.options, |id| read.given(id))
        .and_then(|()| read.options.role())
        .map(|role| Asked::Role(Box::new(role)))
        .map_err(|refused| refused.said_by(user::command()))
}

impl Options {
    /// What a process given these options is, by the rules between their values, which the user's parser
    /// and the internal one (a run of one mechanism) hold alike. Which options were given at all is the
    /// user's parser's rule ([`idle_options`]).
    pub(super) fn role(self) -> Result<Role, Refused> {
        let timeout = self.timeout;
        let mechanism = self.ipc.mechanism();
        if let Some(address) = self.join {
            return Ok(Role::Joiner(Joiner { address, timeout, quiet: self.quiet, bench: self.bench }));
        }
        if self.topology {
            return Ok(Role::Topology);
        }
        if let Some([exporter, importer]) = self.between.as_deref() {
            let (json, quiet) = (self.json, self.quiet);
            return Ok(Role::Between(Between { exporter: *exporter, importer: *importer, json, quiet }));
        }
        if self.bench {
            let Some(mechanism) = mechanism else {
                let give = either(|_| true);
                return Err(Refused::conflict(format!(
                    "--bench measures one mechanism at a time: give --ipc {give}"
                )));
            };
            let (max_bytes, quiet, serve, json) = (self.bench_max_bytes, self.quiet, self.serve, self.json);
            let metrics = self.metrics;
            return Ok(Role::Bench(Bench { mechanism, max_bytes, timeout, quiet, serve, json, metrics }));
        }
        let mut run = Run {
            sync: self.sync,
            fds: self.fds,
            procs_per_device: self.procs_per_device,
            sequential: self.sequential,
            bind_numa: self.bind_numa,
            timings: self.timings,
            timeout,
            quiet: self.quiet,
            serve: self.serve,
            isolate: self.isolate,
            json: self.json,
            metrics: self.metrics,
            socket_dir: None,
        };
        let unorderable = |mechanism| cannot_order(run.sync, mechanism);
        Ok(match (mechanism, run.isolate.take()) {
            (Some(mechanism), isolate) => {
                if let Some(why) = unorderable(mechanism) {
                    let orderable = either(|m| unorderable(m).is_none());
                    return Err(Refused::conflict(format!("{why}; use --ipc {orderable}")));
                }
                Role::Sample(Run { isolate, ..run }, mechanism)
            }
            // The matrix sets each of its runs' ordering itself.
            (None, Some(isolation)) => Role::Matrix(run, isolation),
            (None, None) => {
                let not_run = Mechanism::ALL.into_iter().filter_map(|m| Some((m, unorderable(m)?))).collect();
                Role::EveryMechanism(EveryMechanism { run, not_run })
            }
        })
    }
}

/// An option given that would do nothing with the others given (`given`: the user typed it; a default never
/// counts): a rule of the user's command line, which the internal one does not hold (`--ipc all --fds pidfd`
/// gives legacy's run `--fds pidfd` too).
fn idle_options(options: &Options, given: impl Fn(&str) -> bool) -> Result<(), Refused> {
    // `requires = "bench"` would not do: clap lets a requirement go unmet where the required argument
    // conflicts with one given (`--sequential --bench-max-bytes 8K`), and every mode but --bench does.
    if given("bench_max_bytes") && !options.bench {
        let message = "--bench-max-bytes sets the largest buffer of --bench, and --bench is not given";
        return Err(Refused { kind: ErrorKind::MissingRequiredArgument, message: message.to_owned() });
    }
    // Legacy and fabric handles have no descriptors.
    if given("fds") && matches!(options.ipc, IpcArg::Legacy | IpcArg::Fabric) {
        return Err(Refused::conflict(format!(
            "--fds sets how vmm and pool descriptors travel, and --ipc {} has none (use --ipc vmm, pool or all)",
            options.ipc.name()
        )));
    }
    // The container matrix sets each of its runs' ordering itself (see `matrix`).
    if given("sync") && options.isolate.is_some() && options.ipc == IpcArg::All {
        let message = "the argument '--sync' cannot be used with '--ipc all --isolate': the container matrix \
                       sets the ordering of each of its runs itself";
        return Err(Refused::conflict(message.to_owned()));
    }
    Ok(())
}

/// Why `sync` cannot order `mechanism`'s memory whatever the devices, if it cannot (memops and pool): a
/// run of that mechanism is a usage error, and `--ipc all` waives it without a run.
fn cannot_order(sync: Sync, mechanism: Mechanism) -> Option<String> {
    (sync == Sync::Memops && mechanism.spec().refuses_memops.is_some()).then(|| memops_refusal(mechanism))
}

/// The mechanisms that `keep` keeps, for a message: `legacy, vmm or fabric`.
fn either(keep: impl Fn(Mechanism) -> bool) -> String {
    let names: Vec<&str> = Mechanism::ALL.into_iter().filter(|&m| keep(m)).map(Mechanism::name).collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// Options that refuse each other: the kind and words of a usage error, which each parser says with its
/// own usage line.
#[derive(Debug)]
pub(super) struct Refused {
    kind: ErrorKind,
    message: String,
}

impl Refused {
    fn conflict(message: String) -> Self {
        Refused { kind: ErrorKind::ArgumentConflict, message }
    }

    /// The usage error, as `command` says it.
    pub(super) fn said_by(self, mut command: clap::Command) -> clap::Error {
        command.error(self.kind, self.message)
    }
}
