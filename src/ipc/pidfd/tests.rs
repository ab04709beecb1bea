//! The unit tests of `pidfd`.

use super::*;

/// A descriptor of this process's own is fetched for real; a pid that is no process is ESRCH, named.
#[test]
fn a_descriptor_is_fetched_and_a_missing_pid_named() {
    let file = tempfile::tempfile().unwrap();
    let fetched = fetch(std::process::id(), file.as_raw_fd(), 0).unwrap();
    use std::os::unix::fs::MetadataExt;
    let (a, b) = (file.metadata().unwrap(), std::fs::File::from(fetched).metadata().unwrap());
    assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "the same file");
    assert_eq!(unsupported(), None, "this kernel has the calls");
    let error = fetch(0, 3, 1).unwrap_err();
    let diagnosis = error.downcast_ref::<Diagnosis>().expect("a diagnosis");
    assert!(diagnosis.cause.contains("not visible from here"), "{diagnosis:?}");
    assert!(diagnosis.fix.contains("--pid=container:NAME") && diagnosis.fix.contains("--fds socket"));
    let closed = format!("{:#}", fetch(std::process::id(), i32::MAX - 1, 0).unwrap_err());
    assert!(closed.contains("pidfd_getfd") && closed.contains("EBADF"), "no such descriptor: {closed}");
    let far = format!("{:#}", fetch(i32::MAX as u32 - 1, 3, 1).unwrap_err());
    assert!(far.contains("ESRCH") && far.contains("shareProcessNamespace: true"), "{far}");
}

#[test]
fn a_refusal_names_what_this_process_lacks() {
    let mut here = Access::here();
    here.sys_ptrace = false;
    here.ptrace_scope = Some(1);
    here.seccomp = Some(2);
    let found = obstacles(std::process::id(), &here);
    for obstacle in [Obstacle::YamaScope { scope: 1 }, Obstacle::Seccomp, Obstacle::NoCapSysPtrace] {
        assert!(found.contains(&obstacle), "{obstacle:?}: {found:?}");
    }
    let said = ptrace_refused(&found).to_string();
    for words in [
        "ptrace_scope is 1",
        "seccomp filter",
        "lacks CAP_SYS_PTRACE",
        "--cap-add SYS_PTRACE",
        "capabilities.add: [SYS_PTRACE]",
        "--fds socket",
    ] {
        assert!(said.contains(words), "{words}: {said}");
    }
    // With the capability, in a user namespace of its own: the capability is that namespace's.
    here.sys_ptrace = true;
    here.in_user_namespace = true;
    let found = obstacles(std::process::id(), &here);
    assert_eq!(found, [Obstacle::OwnUserNamespace]);
    let fix = ptrace_refused(&found).fix;
    assert!(fix.contains("--userns=host") && fix.contains("hostUsers: true"), "{fix}");
}

/// Exactly what this process fails, each condition by itself: an exporter of the same uid and
/// capabilities (this process) leaves only the missing capability; another uid, Yama's scope 2 or 3, a
/// filter and an exporter whose status cannot be read each add theirs, and the capability overrides all
/// but scope 3.
#[test]
fn each_obstacle_is_named_only_where_it_stands() {
    let me = std::process::id();
    let mut here = Access::here();
    (here.ptrace_scope, here.seccomp, here.in_user_namespace) = (None, None, false);
    here.sys_ptrace = false;
    assert_eq!(obstacles(me, &here), [Obstacle::NoCapSysPtrace], "{here:?}");
    let uid = here.uid;
    let other = Access { uid: uid + 1, ptrace_scope: Some(2), seccomp: Some(0), ..here };
    let expected = [
        Obstacle::OtherUid { exporter: uid, importer: uid + 1 },
        Obstacle::YamaScope { scope: 2 },
        Obstacle::NoCapSysPtrace,
    ];
    assert_eq!(obstacles(me, &other), expected);
    let nobody = obstacles(i32::MAX as u32 - 1, &here);
    assert_eq!(nobody, [Obstacle::NoCapSysPtrace, Obstacle::ExporterUnreadable]);
    here.sys_ptrace = true;
    assert_eq!(obstacles(me, &here), [], "the capability overrides the rest");
    let closed = Access { ptrace_scope: Some(3), uid: uid + 1, seccomp: Some(2), ..here };
    assert_eq!(obstacles(me, &closed), [Obstacle::YamaScope { scope: 3 }], "scope 3 whatever the capability");
    let said = Obstacle::YamaScope { scope: 3 }.to_string();
    assert!(said.contains("ptrace_scope is 3: no process may"), "{said}");
    let said = Obstacle::YamaScope { scope: 2 }.to_string();
    assert!(said.contains("ptrace_scope is 2: only with CAP_SYS_PTRACE"), "{said}");
}

/// An exporter two generations below the peer is found too (a served sequence's run, started by a
/// process the top parent started).
#[test]
fn the_exporter_is_found_generations_below_the_peer() {
    let me = std::process::id();
    let parent = std::os::unix::process::parent_id();
    let grandparent = crate::os::proc_stat::read(parent as i32).expect("the parent's stat").parent as u32;
    if grandparent > 1 {
        assert_eq!(exporter_seen_from(grandparent, me).unwrap(), me);
    }
}

/// The exporter is the connection's peer, or a process below it whose pid is the one it published.
#[test]
fn the_exporter_is_found_below_the_peer_or_not_taken_on_its_word() {
    let me = std::process::id();
    let parent = std::os::unix::process::parent_id();
    assert_eq!(exporter_seen_from(me, me).unwrap(), me, "the peer itself");
    assert_eq!(exporter_seen_from(0, me).unwrap(), 0, "not visible stays so");
    assert_eq!(exporter_seen_from(parent, me).unwrap(), me, "a process below the peer");
    let far = exporter_seen_from(me, parent).unwrap_err().to_string();
    assert!(far.contains("no process below the server's") && far.contains("--fds socket"), "{far}");
}

/// A refusal is typed for the document and the wire, whatever context wraps it: its call, errno and why.
#[test]
fn a_refusal_is_the_kernels_typed_fact() {
    let error = fetch(0, 3, 1).unwrap_err().context("opening the vmm buffer of process 1");
    let refused = crate::ipc::refused::Refused::of(&error).expect("typed");
    assert_eq!((refused.call.as_str(), refused.error.as_str(), refused.code), ("pidfd_open", "ESRCH", 3));
    assert_eq!(refused.pidfd, Some(PidfdRefusal::NotVisible { pid: 0 }));
    assert!(refused.fix.as_deref().is_some_and(|f| f.contains("shareProcessNamespace: true")), "{refused:?}");
    let json = serde_json::to_value(&refused).unwrap();
    assert_eq!(json["pidfd"]["why"], "not_visible", "{json}");
    let obstacles = vec![Obstacle::OtherUid { exporter: 0, importer: 65534 }];
    let json = serde_json::to_value(PidfdRefusal::Ptrace { obstacles }).unwrap();
    assert_eq!(json["obstacles"][0]["obstacle"], "other_uid", "{json}");
    let no_refusal = anyhow::anyhow!("a socket closed");
    assert_eq!(crate::ipc::refused::Refused::of(&no_refusal), None);
}
