use super::pair_seen::PairSeen;
use super::*;
use crate::placement::share::{EXPORTERS_NUMBER_THERE, Fact, IMPORTER_IS_ANCESTOR, Sameness, compare};

/// Process `pid`'s place, read from outside.
fn observe(pid: i32) -> Result<Observed> {
    observe_in(&ProcDir::open(pid)?)
}

#[test]
fn a_uid_is_mapped_as_its_user_namespace_sees_it() {
    assert_eq!(uid_as_it_sees_itself(1000, "0 0 4294967295"), 1000);
    assert_eq!(uid_as_it_sees_itself(1000, "0 1000 1"), 0);
    assert_eq!(uid_as_it_sees_itself(100005, "0 1000 1\n1 100000 65536"), 6);
    assert_eq!(uid_as_it_sees_itself(0, ""), 65534, "no map: the overflow uid");
}

#[test]
fn the_environment_it_started_with_is_read_by_name() {
    let env = Environment::parse(b"A=1\0CUDA_VISIBLE_DEVICES=\0B=x=y\0junk\0A=2\0");
    assert_eq!(env.get("A"), Some("1"), "the first, as the process's getenv (NCCL's, PyTorch's) answers");
    assert_eq!(env.get("CUDA_VISIBLE_DEVICES"), Some(""));
    assert_eq!(env.get("B"), Some("x=y"));
    assert_eq!(env.get("junk"), None);
}

#[test]
fn the_libraries_of_the_rows_are_found_in_its_maps() {
    let maps = "7f00-7f01 r-xp 0 08:01 1 /opt/venv/nvidia/nccl/lib/libnccl.so.2.28.9\n\
                7f01-7f02 r--p 0 08:01 2 /usr/lib/libucp.so.0.0.0\n\
                7f02-7f03 r--p 0 08:01 3 /opt/venv/torch/lib/libtorch_cuda.so\n\
                7f03-7f04 rw-p 0 00:00 0 [heap]\n";
    let empty = tempfile::tempdir().unwrap();
    let found = loaded(maps, &Root::at(empty.path()).unwrap(), &|_| None);
    let nccl = found.nccl.unwrap();
    assert_eq!(
        (nccl.path.as_str(), nccl.version.as_deref()),
        ("/opt/venv/nvidia/nccl/lib/libnccl.so.2.28.9", Some("2.28.9"))
    );
    assert_eq!(found.ucx.map(|u| u.path), Some("/usr/lib/libucp.so.0.0.0".to_owned()));
    assert_eq!(found.torch.map(|t| t.version), Some(None), "no version.py under that root");
}

/// This test's own process, read from outside, is the place it reads of itself: every fact a served
/// run's process hands over.
#[test]
fn a_process_read_from_outside_stands_where_it_says_it_stands() {
    let here = Place::here();
    let seen = observe(std::process::id() as i32).unwrap();
    let there = seen.place;
    assert_eq!(there.pid, here.pid);
    assert_eq!(there.namespaces, here.namespaces);
    assert_eq!(there.dev_shm.as_ref().map(|s| s.device), here.dev_shm.as_ref().map(|s| s.device));
    assert_eq!((&there.hostname, &there.boot_id), (&here.hostname, &here.boot_id));
    assert_eq!((there.uid, there.in_user_namespace), (here.uid, here.in_user_namespace));
    assert_eq!((there.capabilities, there.seccomp), (here.capabilities, here.seccomp));
    assert_eq!(there.platform, here.platform);
    assert!(seen.name.starts_with("simple_ipc") || !seen.name.is_empty(), "{}", seen.name);
}

#[test]
fn a_process_that_is_gone_is_said_so() {
    let error = observe(i32::MAX).unwrap_err().to_string();
    assert!(error.contains(&format!("process {} cannot be read", i32::MAX)), "{error}");
    assert!(observe(0).is_err() && observe(-4).is_err());
}

fn the_fact(facts: &[Fact], name: &str) -> Fact {
    facts.iter().find(|f| f.fact == name).cloned().unwrap()
}

/// What an outside view read stands in for what the places alone could tell: whether the importer is
/// the exporter's ancestor, always; who holds the exporter's pid number in the importer's PID namespace,
/// only where the two namespaces differ; the table's facts stay as they were.
#[test]
fn an_outside_view_tells_the_pairs_facts_beyond_the_table() {
    let seen = |ancestor: bool, at: Option<&str>| PairSeen {
        importer_is_ancestor: ancestor,
        at_exporters_number: at.map(str::to_owned),
    };
    let mut other_net = crate::placement::share::tests::place(2);
    other_net.namespaces.net = Some(2);
    let alone = compare(&crate::placement::share::tests::place(5), &other_net);
    let facts = with_outside(alone.clone(), &seen(true, Some("bash")));
    assert_eq!(
        facts[..super::super::share::FACTS.len()],
        alone[..super::super::share::FACTS.len()],
        "the table's facts are unchanged"
    );
    assert_eq!(the_fact(&facts, IMPORTER_IS_ANCESTOR).same, Sameness::Same);
    let taken = the_fact(&facts, EXPORTERS_NUMBER_THERE);
    assert_eq!((taken.same, taken.detail), (Sameness::Unknown, None), "one PID namespace: no other number");
    let mut elsewhere = crate::placement::share::tests::place(2);
    elsewhere.namespaces.pid = Some(2);
    let alone = compare(&crate::placement::share::tests::place(5), &elsewhere);
    let facts = with_outside(alone.clone(), &seen(false, Some("sh")));
    assert_eq!(
        facts[..super::super::share::FACTS.len()],
        alone[..super::super::share::FACTS.len()],
        "the table's facts are unchanged"
    );
    assert_eq!(the_fact(&facts, IMPORTER_IS_ANCESTOR).same, Sameness::Differs);
    let taken = the_fact(&facts, EXPORTERS_NUMBER_THERE);
    assert_eq!((taken.same, taken.detail.as_deref()), (Sameness::Same, Some("sh")));
    let facts =
        with_outside(compare(&crate::placement::share::tests::place(1), &elsewhere), &seen(false, None));
    let taken = the_fact(&facts, EXPORTERS_NUMBER_THERE);
    assert_eq!((taken.same, taken.detail), (Sameness::Differs, None), "seen: nobody, not its own init");
}

/// A process held by its `/proc` directory is read whole or not at all: one that ends after it was opened
/// and whose pid number another process takes (`ns_last_pid`, root only) is said to have ended, where read
/// by number it lent that other process's facts (here, its environment) to the answer.
#[test]
fn a_pid_number_taken_by_another_process_lends_it_nothing() {
    use std::os::unix::process::CommandExt as _;
    let last_pid = "/proc/sys/kernel/ns_last_pid";
    if !nix::unistd::geteuid().is_root() || std::fs::metadata(last_pid).is_err() {
        eprintln!("SKIPPED a_pid_number_taken_by_another_process_lends_it_nothing: needs root");
        return;
    }
    // Another process may take the number first: tried again, up to 50 times.
    for _ in 0..50 {
        let mut first = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = first.id() as i32;
        let held = ProcDir::open(pid).unwrap();
        let _ = first.kill();
        let _ = first.wait();
        let _ = std::fs::write(last_pid, (pid - 1).to_string());
        let mut second = std::process::Command::new("sleep")
            .arg("30")
            .env("NCCL_P2P_DISABLE", "1")
            .process_group(0)
            .spawn()
            .unwrap();
        let took = second.id() as i32 == pid;
        let read = observe_in(&held);
        let _ = second.kill();
        let _ = second.wait();
        if !took {
            continue;
        }
        let error = read.map(|o| o.place.settings).unwrap_err();
        assert!(format!("{error:#}").contains(&format!("process {pid}")), "{error:#}");
        return;
    }
    eprintln!("SKIPPED a_pid_number_taken_by_another_process_lends_it_nothing: the number was always taken");
}

/// Each file of a process is read up to a bound: past it, an error that says so, not a read without end.
#[test]
fn a_file_past_its_bound_is_an_error() {
    let held = ProcDir::open(std::process::id() as i32).unwrap();
    assert!(held.read("environ", 1 << 30).is_ok());
    let error = held.read("environ", 1).unwrap_err();
    assert_eq!(error.to_string(), "more than 1 bytes");
}

/// A path in `maps` is all that follows its fifth field, blanks and all: a library in a folder whose name
/// has a blank was once taken for a file named by the path's first word, and so not loaded; one removed
/// since it was mapped is shown so, and its version is not read from the file its path names now.
#[test]
fn a_path_in_maps_is_read_whole() {
    let maps = "7f00-7f01 r-xp 00000000 08:01 1                          /opt/my env/lib/libnccl.so.2\n\
                7f01-7f02 r--p 00000000 08:01 2                          /usr/lib/libucp.so.0 (deleted)\n\
                7f02-7f03 r--p 00000000 08:01 3                          /opt/t/lib/libtorch_cuda.so (deleted)\n\
                7f03-7f04 rw-p 00000000 00:00 0 \n\
                7f04-7f05 rw-p 00000000 00:00 0\n";
    assert_eq!(range_and_path("7f03-7f04 rw-p 00000000 00:00 0 "), Some(("7f03-7f04", "")));
    assert_eq!(range_and_path("7f04-7f05 rw-p 00000000 00:00 0"), None, "no path");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("opt/my env/lib")).unwrap();
    std::fs::write(dir.path().join("opt/my env/lib/libnccl.so.2"), b"x NCCL version 2.27.3+cuda12 x")
        .unwrap();
    std::fs::create_dir_all(dir.path().join("opt/t/lib")).unwrap();
    std::fs::write(dir.path().join("opt/t/version.py"), "__version__ = '2.11.0'\n").unwrap();
    let found = loaded(maps, &Root::at(dir.path()).unwrap(), &|_| None);
    let nccl = found.nccl.unwrap();
    assert_eq!(
        (nccl.path.as_str(), nccl.version.as_deref()),
        ("/opt/my env/lib/libnccl.so.2", Some("2.27.3"))
    );
    assert_eq!(found.ucx.map(|u| u.path).as_deref(), Some("/usr/lib/libucp.so.0 (deleted)"));
    let torch = found.torch.unwrap();
    assert_eq!((torch.path.as_str(), torch.version), ("/opt/t/lib/libtorch_cuda.so (deleted)", None));
}
