//! The unit tests of `role`.

use super::*;

fn run() -> Run {
    Run {
        sync: Sync::Memops,
        fds: Fds::Pidfd,
        procs_per_device: 3,
        sequential: true,
        bind_numa: true,
        timings: true,
        timeout: Timeout::from_secs(5),
        quiet: true,
        serve: Some(Address::Abstract("s".into())),
        isolate: Some(Isolation::parse("pid").unwrap()),
        json: Some("run.json".into()),
        metrics: Some("run.prom".into()),
        socket_dir: None,
    }
}

fn joiner(quiet: bool) -> Joiner {
    Joiner { address: Address::Abstract("s".into()), timeout: Timeout::from_secs(7), quiet, bench: false }
}

fn bench(mechanism: Mechanism) -> Bench {
    Bench {
        mechanism,
        max_bytes: 1 << 20,
        timeout: Timeout::from_secs(9),
        quiet: true,
        serve: Some(Address::Abstract("b".into())),
        json: Some("bench.json".into()),
        metrics: None,
    }
}

fn every(run: Run) -> Role {
    Role::EveryMechanism(EveryMechanism { run, not_run: Vec::new() })
}

fn child(quiet: bool) -> Child {
    Child { index: 1, segment_fd: None, socket_fd: None, bench: false, quiet }
}

fn sub(run: Run) -> MechanismRun {
    MechanismRun {
        mechanism: Mechanism::Vmm,
        run,
        report_fd: 9,
        served: None,
        outside_fd: None,
        matrix_row: false,
    }
}

fn isolated(quiet: bool) -> Isolated {
    Isolated {
        isolation: Isolation::parse("pid").unwrap(),
        report_fd: 7,
        outside_fd: 8,
        joiner: joiner(quiet),
        matrix_row: false,
    }
}

/// Each role's facts, as the entry reads them: who started it, where its document goes, `--json`,
/// `--quiet` and the handles of its one mechanism.
#[test]
fn each_role_says_who_started_it_and_what_it_was_given() {
    let matrix = Role::Matrix(run(), Isolation::parse("pid,net").unwrap());
    let users = [
        Role::Sample(run(), Mechanism::Vmm),
        Role::Bench(bench(Mechanism::Vmm)),
        Role::Topology,
        every(run()),
        matrix.clone(),
        Role::Joiner(joiner(true)),
    ];
    let ours = [
        Role::Child(child(true)),
        Role::Guardian { fd: 3 },
        Role::MechanismRun(sub(run())),
        Role::Isolated(isolated(true)),
    ];
    for role in &users {
        assert!(role.started_by_a_user(), "{role:?}");
        assert_eq!(role.report_fd(), None, "{role:?}");
        assert!(role.to_args().is_empty(), "{role:?}");
    }
    for role in &ours {
        assert!(!role.started_by_a_user(), "{role:?}");
        assert_eq!(role.json(), None, "{role:?}");
    }
    assert_eq!(Role::MechanismRun(sub(run())).report_fd(), Some(9));
    assert_eq!(Role::Isolated(isolated(false)).report_fd(), Some(7));
    assert_eq!(Role::Guardian { fd: 3 }.report_fd(), None);
    for role in [&users[0], &users[3], &users[4]] {
        assert_eq!(role.json(), Some(Path::new("run.json")), "{role:?}");
    }
    assert_eq!(users[1].json(), Some(Path::new("bench.json")));
    assert_eq!(Role::Topology.json(), None);
    for role in [&users[0], &users[3], &users[4]] {
        assert_eq!(role.metrics(), Some(Path::new("run.prom")), "{role:?}");
    }
    for role in users[1..3].iter().chain(&users[5..]).chain(&ours) {
        assert_eq!(role.metrics(), None, "{role:?}");
    }

    let quiet = |quiet: bool| {
        let run = Run { quiet, ..Run::default() };
        [
            Role::Sample(run.clone(), Mechanism::Legacy),
            every(run.clone()),
            Role::Matrix(run.clone(), Isolation::parse("pid").unwrap()),
            Role::MechanismRun(sub(run)),
            Role::Bench(Bench { quiet, ..bench(Mechanism::Pool) }),
            Role::Child(child(quiet)),
            Role::Joiner(joiner(quiet)),
            Role::Isolated(isolated(quiet)),
        ]
    };
    for role in quiet(true) {
        assert!(role.quiet(), "{role:?}");
    }
    for role in quiet(false) {
        assert!(!role.quiet(), "{role:?}");
    }
    assert!(!Role::Topology.quiet() && !Role::Guardian { fd: 3 }.quiet());

    // What a run of one mechanism hands over, typed as given: the paths its forecast speaks of.
    let given = Some((Mechanism::Vmm, Sync::Memops, Fds::Pidfd));
    assert_eq!(Role::Sample(run(), Mechanism::Vmm).handles(), given);
    assert_eq!(Role::MechanismRun(sub(run())).handles(), given);
    let defaults = Some((Mechanism::Pool, Sync::Events, Fds::Socket));
    assert_eq!(Role::Sample(Run::default(), Mechanism::Pool).handles(), defaults);
    assert_eq!(Role::Bench(bench(Mechanism::Pool)).handles(), defaults, "the benchmark's memory, and events");
    for role in [every(run()), matrix, Role::Joiner(joiner(true)), Role::Child(child(false)), Role::Topology]
    {
        assert_eq!(role.handles(), None, "no one mechanism: {role:?}");
    }
}

/// What the document says was asked: every option of the run, the mode, and each role's defaults.
#[test]
fn the_document_says_what_each_role_was_asked() {
    let given = Options {
        ipc: "vmm".into(),
        sync: "memops".into(),
        procs_per_device: 3,
        sequential: true,
        timings: true,
        timeout_s: 5,
        bind_numa: true,
        quiet: true,
        bench_max_bytes: None,
        serve: Some(Address::Abstract("s".into()).to_string()),
        isolate: Some("pid".into()),
    };
    assert_eq!(Role::Sample(run(), Mechanism::Vmm).asked(), (Mode::Run, given.clone()));
    assert_eq!(Role::MechanismRun(sub(run())).asked(), (Mode::Run, given.clone()));
    let all = Options { ipc: "all".into(), ..given.clone() };
    assert_eq!(every(run()).asked(), (Mode::IpcAll, all.clone()));
    let matrix = Role::Matrix(run(), Isolation::parse("net").unwrap());
    let isolate = Some(Isolation::parse("net").unwrap().to_string());
    // The matrix sets each cell's ordering: its document says so, not the --sync it was never given.
    let per_cell = "per_cell".to_owned();
    assert_eq!(matrix.asked(), (Mode::ContainerMatrix, Options { isolate, sync: per_cell, ..all }));

    let defaults = Options {
        ipc: "legacy".into(),
        sync: "events".into(),
        procs_per_device: 1,
        sequential: false,
        timings: false,
        timeout_s: 60,
        bind_numa: false,
        quiet: false,
        bench_max_bytes: None,
        serve: None,
        isolate: None,
    };
    assert_eq!(Role::Sample(Run::default(), Mechanism::Legacy).asked(), (Mode::Run, defaults.clone()));
    let benched = Options {
        ipc: "vmm".into(),
        timeout_s: 9,
        quiet: true,
        bench_max_bytes: Some(1 << 20),
        serve: Some(Address::Abstract("b".into()).to_string()),
        ..defaults.clone()
    };
    assert_eq!(Role::Bench(bench(Mechanism::Vmm)).asked(), (Mode::Bench, benched.clone()));
    assert_eq!(
        Role::Bench(bench(Mechanism::Pool)).asked(),
        (Mode::Bench, Options { ipc: "pool".into(), ..benched })
    );
    let joined = Options { timeout_s: 7, ..defaults.clone() };
    assert_eq!(Role::Joiner(joiner(false)).asked(), (Mode::Run, joined.clone()));
    assert_eq!(Role::Isolated(isolated(false)).asked(), (Mode::Run, joined));
    assert_eq!(Role::Topology.asked(), (Mode::Run, defaults.clone()));
    assert_eq!(Role::Child(child(true)).asked(), (Mode::Run, Options { quiet: true, ..defaults }));
}
