//! The internal roles' command line: what this program gives a process of its own that it starts, after
//! the reserved first argument `@internal` (`Role::to_args` writes it; this is its one reader). A run of one
//! mechanism takes the user's options of the run (see `user`), so that none is lost on the way.

use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use super::user::{self, parse_address};
use super::values::parse_timeout;
use crate::meeting::Address;
use crate::os::namespace_kinds::Isolation;
use crate::phases::timings::Timeout;
use crate::role::{Child, Isolated, Joiner, MechanismRun, Role, Served};
use crate::segment::MAX_PROCESSES;
use crate::wire::Round;

#[derive(Parser, Debug)]
#[command(name = "simple-ipc @internal", about = "A process that simple-ipc starts itself (not for users).")]
struct Internal {
    #[command(subcommand)]
    role: Sub,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// A process of the sample (or the benchmark's producer), by its index.
    Child {
        #[arg(value_parser = clap::value_parser!(u32).range(0..MAX_PROCESSES as i64))]
        index: u32,
        /// The descriptor of the parent's segment.
        #[arg(long, value_name = "FD")]
        segment_fd: Option<i32>,
        /// The end of the socket its descriptors come over, for vmm and pool.
        #[arg(long, value_name = "FD")]
        socket_fd: Option<i32>,
        #[arg(long)]
        bench: bool,
        #[arg(long)]
        quiet: bool,
    },
    /// The guardian of a run's driver files, told them over the socket FD.
    Guardian {
        #[arg(long, value_name = "FD")]
        fd: i32,
    },
    /// A process in namespaces of its own that joins the run at SOCKET, its document to a pipe.
    Join {
        #[arg(value_name = "SOCKET", value_parser = parse_address)]
        address: Address,
        #[arg(long, value_name = "KINDS", value_parser = crate::os::namespace_kinds::parse_arg)]
        isolated: Isolation,
        #[arg(long, value_name = "FD")]
        report_fd: i32,
        /// Its socket to the run that started it.
        #[arg(long, value_name = "FD")]
        outside_fd: i32,
        #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
        timeout: Timeout,
        #[arg(long)]
        quiet: bool,
        /// The importer of a row of the container matrix.
        #[arg(long)]
        matrix_row: bool,
    },
    /// A run of one mechanism, its document to the pipe FD.
    Run {
        #[arg(long, value_name = "FD")]
        report_fd: i32,
        /// The run inside an isolation: its socket to the process outside.
        #[arg(long, value_name = "FD")]
        outside_fd: Option<i32>,
        /// A row of the container matrix: every kind of handle, one importer.
        #[arg(long)]
        matrix_row: bool,
        /// The run inside an isolation: where to make its socket's directory (see `role::Run::socket_dir`).
        #[arg(long, value_name = "PATH")]
        socket_dir: Option<std::path::PathBuf>,
        /// Its place in a served sequence.
        #[arg(long, value_name = "K/M", value_parser = Round::parse, requires = "served_fds")]
        serve_round: Option<Round>,
        /// What it inherits from the sequence's top parent (see `role::Served`).
        #[arg(long, value_name = "FD,...", value_delimiter = ',', requires = "serve_round")]
        served_fds: Option<Vec<i32>>,
        #[command(flatten)]
        options: user::Options,
    },
}

/// The usage line of the internal parser.
pub(super) fn usage() -> String {
    Internal::command().render_usage().to_string()
}

/// Parses the arguments after `@internal`.
pub(super) fn parse_from(args: impl Iterator<Item = OsString>) -> Result<Role, clap::Error> {
    let args = std::iter::once(OsString::from("simple-ipc @internal")).chain(args);
    let matches = Internal::command().try_get_matches_from(args)?;
    Ok(match Internal::from_arg_matches(&matches)?.role {
        Sub::Child { index, segment_fd, socket_fd, bench, quiet } => {
            Role::Child(Child { index, segment_fd, socket_fd, bench, quiet })
        }
        Sub::Guardian { fd } => Role::Guardian { fd },
        Sub::Join { address, isolated, report_fd, outside_fd, timeout, quiet, matrix_row } => {
            Role::Isolated(Isolated {
                isolation: isolated,
                report_fd,
                outside_fd,
                joiner: Joiner { address, timeout, quiet, bench: false },
                matrix_row,
            })
        }
        Sub::Run { report_fd, outside_fd, matrix_row, socket_dir, serve_round, served_fds, options } => {
            let served = serve_round.zip(served_fds).map(|(round, fds)| Served { round, fds });
            match options.role().map_err(|refused| refused.said_by(Internal::command()))? {
                Role::Sample(run, mechanism)
                    if run.json.is_none() && (served.is_none() || run.serve.is_some()) =>
                {
                    let run = crate::role::Run { socket_dir, ..run };
                    Role::MechanismRun(MechanismRun {
                        mechanism,
                        run,
                        report_fd,
                        served,
                        outside_fd,
                        matrix_row,
                    })
                }
                _ => {
                    let message = "run takes the options of a run of one mechanism (not --ipc all, --json, \
                                   --bench, --topology or --join; --serve-round with --serve)";
                    return Err(Internal::command().error(clap::error::ErrorKind::ArgumentConflict, message));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::rules;
    use super::*;
    use crate::ipc::{Fds, Mechanism, Sync};
    use crate::role::Run;

    fn parsed(role: &Role) -> Role {
        let args = role.to_args();
        assert_eq!(args.first().map(|a| a.to_str()), Some(Some(crate::role::INTERNAL)), "{args:?}");
        super::super::parse_from([&[OsString::from("simple-ipc")], &args[..]].concat())
            .unwrap_or_else(|e| panic!("{args:?}: {e:?}"))
    }

    /// The user's options of a run: `args` as a user gives them.
    fn run_of(args: &[&str]) -> Run {
        match rules::parse_from(std::iter::once("simple-ipc").chain(args.iter().copied())) {
            Ok(rules::Asked::Role(role)) => match *role {
                Role::Sample(run, _)
                | Role::EveryMechanism(crate::role::EveryMechanism { run, .. })
                | Role::Matrix(run, _) => run,
                other => panic!("{args:?}: {other:?}"),
            },
            other => panic!("{args:?}: {other:?}"),
        }
    }

    /// Every internal role comes back as it went: `to_args` writes what the internal parser reads.
    #[test]
    fn every_internal_role_round_trips() {
        let child =
            |segment_fd, socket_fd, bench, quiet| Child { index: 3, segment_fd, socket_fd, bench, quiet };
        let address = Address::Abstract("simple-ipc-1-f".into());
        let joiner =
            Joiner { address: address.clone(), timeout: Timeout::from_secs(0), quiet: true, bench: false };
        let isolated = |kinds| Isolated {
            isolation: Isolation::parse(kinds).unwrap(),
            report_fd: 7,
            outside_fd: 8,
            joiner: joiner.clone(),
            matrix_row: false,
        };
        let sub = |mechanism, run: Run, served| MechanismRun {
            mechanism,
            run,
            report_fd: 9,
            served,
            outside_fd: None,
            matrix_row: false,
        };
        let served = Served { round: Round { number: 2, of: 4 }, fds: vec![3, 4, 10] };
        let user = [
            &["--ipc", "all", "--sync", "memops", "--procs-per-device", "3", "--timings", "--timeout", "0"][..],
            &["--ipc=all", "--sequential", "--timeout=5", "--bind-numa", "--fds", "pidfd", "--quiet"],
            &["--ipc", "all", "--isolate", "joiners:pid,net"],
            &["--ipc", "vmm", "--isolate", "container", "--sync", "memops"],
        ];
        let mut roles = vec![
            Role::Child(child(Some(5), None, false, false)),
            Role::Child(child(Some(5), Some(6), true, true)),
            Role::Child(child(None, None, false, true)),
            Role::Guardian { fd: 3 },
            Role::Isolated(isolated("pid")),
            Role::Isolated(isolated("none")),
            Role::Isolated(Isolated { matrix_row: true, ..isolated("shm") }),
            Role::Isolated(Isolated {
                joiner: Joiner { quiet: false, timeout: Timeout::default(), ..joiner.clone() },
                ..isolated("joiners:container,user")
            }),
        ];
        for args in user {
            // --fds pidfd reaches legacy's run too, as the user gave it (its run has no descriptors).
            roles.push(Role::MechanismRun(sub(Mechanism::Legacy, run_of(args), None)));
            // (Never pool under memops: `--ipc all` waives it, and the parse refuses it.)
            roles.push(Role::MechanismRun(sub(Mechanism::Fabric, run_of(args), None)));
        }
        let serving = Run { serve: Some(Address::Path("/tmp/s".into())), ..run_of(&["--ipc", "all"]) };
        roles.push(Role::MechanismRun(sub(Mechanism::Vmm, serving, Some(served))));
        let row = run_of(&["--ipc", "legacy", "--isolate", "pid"]);
        roles
            .push(Role::MechanismRun(MechanismRun { matrix_row: true, ..sub(Mechanism::Legacy, row, None) }));
        // The run inside an isolation, told where to make its socket's directory.
        let inside = Run { socket_dir: Some("/tmp/simple-ipc-1-outside-f".into()), ..run_of(user[3]) };
        roles.push(Role::MechanismRun(sub(Mechanism::Vmm, inside, None)));
        for role in &roles {
            assert_eq!(&parsed(role), role);
        }
        assert!(roles.iter().any(|r| matches!(r, Role::MechanismRun(m) if m.run.fds == Fds::Pidfd)));
        assert!(roles.iter().any(|r| matches!(r, Role::MechanismRun(m) if m.run.sync == Sync::Memops)));
    }

    /// A usage error of the internal parser comes with its own usage line, not the user's.
    #[test]
    fn the_internal_usage_line_is_the_internal_parsers() {
        let usage = usage();
        assert!(usage.starts_with("Usage: ") && usage.contains("@internal"), "{usage}");
    }

    /// What no process of ours is ever given is refused, not half-read.
    #[test]
    fn an_internal_role_missing_its_parts_is_refused() {
        for bad in [
            &["run", "--report-fd", "5", "--ipc", "all"][..],
            &["run", "--report-fd", "5", "--json", "x.json"],
            &["run", "--report-fd", "5", "--serve-round", "1/2", "--served-fds", "3,4"],
            &["run", "--ipc", "vmm"],
            &["run", "--report-fd", "5", "--ipc", "pool", "--sync", "memops"],
            &["child", "32"],
            &["guardian"],
            &["join", "@s", "--report-fd", "5", "--timeout", "1"],
            &["nothing"],
            &[],
        ] {
            assert!(parse_from(bad.iter().map(OsString::from)).is_err(), "{bad:?} must be refused");
        }
    }

    /// The internal parser stays strict where the user's takes the last of a repeated option: only this
    /// program writes its arguments, once each (`Role::to_args`), so a repeat is a defect there, or an
    /// argument typed by hand, and a second descriptor number silently winning would leave the first one
    /// open and unowned.
    #[test]
    fn an_internal_option_given_twice_is_refused() {
        for twice in [
            &["child", "0", "--quiet", "--quiet"][..],
            &["child", "0", "--segment-fd", "5", "--segment-fd", "6"],
            &["guardian", "--fd", "3", "--fd", "4"],
            &["run", "--report-fd", "5", "--report-fd", "6"],
            &["run", "--report-fd", "5", "--ipc", "vmm", "--ipc", "pool"],
        ] {
            let e = parse_from(twice.iter().map(OsString::from)).expect_err("a usage error");
            assert!(e.to_string().contains("cannot be used multiple times"), "{twice:?}: {e}");
        }
        assert!(parse_from(["child", "0", "--quiet"].iter().map(OsString::from)).is_ok(), "once is fine");
    }

    /// Every user option of a run reaches a run of one mechanism: each is set in some case above, so a new
    /// option of the run fails here until `role::run_args` writes it.
    #[test]
    fn every_option_of_a_run_is_written() {
        let written: Vec<String> = [
            run_of(&["--sync", "memops", "--procs-per-device", "3", "--timings", "--timeout", "0"]),
            run_of(&["--sequential", "--bind-numa", "--ipc", "vmm", "--fds", "pidfd", "--quiet"]),
            run_of(&["--serve", "@s"]),
            run_of(&["--isolate", "pid"]),
        ]
        .into_iter()
        .flat_map(|run| {
            Role::MechanismRun(MechanismRun {
                mechanism: Mechanism::Vmm,
                run,
                report_fd: 1,
                served: None,
                outside_fd: None,
                matrix_row: false,
            })
            .to_args()
        })
        .filter_map(|arg| arg.to_str()?.strip_prefix("--").map(str::to_owned))
        .collect();
        for long in user::long_options() {
            // What a run of one mechanism is never given: its document goes to its pipe, and the other modes'
            // options are theirs.
            let not_a_run = [
                "help",
                "version",
                "generate",
                "json",
                "metrics",
                "join",
                "topology",
                "between",
                "bench",
                "bench-max-bytes",
            ];
            assert!(
                not_a_run.contains(&long.as_str()) || written.contains(&long),
                "--{long} is never written"
            );
        }
    }

    /// Nothing of the internal roles is in the user's `--help`, and an internal argument given to the
    /// user's parser is a usage error that does not name them.
    #[test]
    fn users_never_see_the_internal_roles() {
        let help = match rules::parse_from(["simple-ipc", "--help"]) {
            Err(e) => e.render().to_string(),
            Ok(role) => panic!("--help is {role:?}"),
        };
        let internal = [
            "--segment-fd",
            "--socket-fd",
            "--guardian-fd",
            "--report-fd",
            "--isolated",
            "--serve-round",
            "--served-fds",
            "@internal",
            "[CHILD]",
            "<CHILD>",
            "guardian --fd",
        ];
        for word in internal {
            assert!(!help.contains(word), "--help mentions {word}: {help}");
        }
        for args in [
            &["--segment-fd", "5", "0"][..],
            &["0"],
            &["--guardian-fd", "3"],
            &["--report-fd", "5"],
            &["--join", "@s", "--isolated", "pid"],
            &["--serve-round", "1/2"],
            &["--served-fds", "3,4"],
            &["child", "0"],
            &["--ipc", "vmm", "@internal"],
        ] {
            let e = rules::parse_from(std::iter::once("simple-ipc").chain(args.iter().copied()))
                .expect_err("a usage error");
            assert!(e.use_stderr(), "{args:?}: a usage error, which exits 1");
            let said = e.render().to_string();
            assert!(!said.contains("-- --"), "{args:?}: {said}");
            for word in internal.iter().filter(|w| !args.iter().any(|a| a.contains(*w))) {
                assert!(!said.contains(word), "{args:?} names {word}: {said}");
            }
        }
    }
}
