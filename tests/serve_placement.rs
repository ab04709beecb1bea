//! `--serve`/`--join` across namespaces made by `unshare`, on simulated GPUs: joiners in namespaces of their
//! own take part where the mechanism crosses and name their failures with cause and fix; descriptors by
//! pidfd_getfd, and a kernel without it; the server says where each joiner stands, forecasts each path
//! (docs/placement.md) and sets the forecast beside the outcome. Where this host gives no namespaces, each
//! test that needs them says it was skipped.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::serve::{LIMIT, Running, join, serve, socket_path};
use common::{FAULT, SIMULATE, bin, text};

/// Joiners in PID namespaces of their own (both pid 1, as two containers' first processes are), with the
/// mechanism that crosses them (vmm: descriptors over the socket) and with memops: the run passes. Needs root
/// and unshare(1); elsewhere it says it was skipped.
#[test]
fn joiners_in_pid_namespaces_of_their_own_take_part() {
    let works = Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "true"]).status();
    if !works.is_ok_and(|s| s.success()) {
        common::skipped(
            "namespaces",
            "joiners_in_pid_namespaces_of_their_own_take_part: no PID namespaces here",
        );
        return;
    }
    for sync in ["events", "memops"] {
        let (_dir, socket) = socket_path(&format!("ns-{sync}"));
        let server = serve("ok", &socket, &["--procs-per-device", "2", "--ipc", "vmm", "--sync", sync]);
        let joiners: Vec<Child> = (0..2)
            .map(|_| {
                Command::new("unshare")
                    .args(["--pid", "--fork", "--mount-proc"])
                    .arg(bin())
                    .args(["--join", &socket])
                    .env(SIMULATE, "ok")
                    .env_remove(FAULT)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let (code, out, _) = server.end(LIMIT);
        assert_eq!(code, Some(0), "{sync}: {out}");
        for joiner in joiners {
            let out = joiner.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(0), "{sync}: {}", text(&out));
            assert!(text(&out).contains("complete!"), "{}", text(&out));
        }
    }
}

/// `prefix` (a command that makes namespaces) then `simple-ipc ARGS`, with its output.
fn in_namespaces(prefix: &[&str], args: &[&str]) -> Child {
    Command::new(prefix[0])
        .args(&prefix[1..])
        .arg(bin())
        .args(args)
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The failures across containers are named from evidence, with the sharing that fixes them: a server
/// and a joiner that are both pid 1 (legacy handles: the same pid number), and a joiner with a /dev/shm of
/// its own (legacy events: the driver's file is not there); with --sync memops the latter passes.
#[test]
fn failures_across_namespaces_name_their_cause_and_fix() {
    let pid_ns = ["unshare", "--pid", "--fork", "--mount-proc"];
    if !Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--mount", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        common::skipped(
            "namespaces",
            "failures_across_namespaces_name_their_cause_and_fix: no namespaces here",
        );
        return;
    }
    // Both pid 1: the driver takes the handle for one of its own.
    let (_dir, socket) = socket_path("same-pid");
    let server = in_namespaces(&pid_ns, &["--serve", &socket, "--ipc", "legacy", "--timeout", "10"]);
    let start = Instant::now();
    while !std::path::Path::new(&socket).exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let joiner = in_namespaces(&pid_ns, &["--join", &socket]).wait_with_output().unwrap();
    let all = text(&joiner);
    assert_eq!(joiner.status.code(), Some(1), "{all}");
    assert!(all.contains("both pid 1") && all.contains("--pid=container"), "{all}");
    assert!(!all.contains("--ipc=host"), "no blanket advice: {all}");
    let server = server.wait_with_output().unwrap();
    assert_eq!(server.status.code(), Some(1), "{}", text(&server));

    // A /dev/shm of the joiner's own: the events' files are not there; memops needs none.
    let own_shm = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t tmpfs none /dev/shm && exec \"$0\" \"$@\"",
    ];
    for (sync, passes) in [("events", false), ("memops", true)] {
        let (_dir, socket) = socket_path(&format!("own-shm-{sync}"));
        let server = serve("ok", &socket, &["--ipc", "vmm", "--sync", sync, "--timeout", "10"]);
        let joiner = in_namespaces(&own_shm, &["--join", &socket]).wait_with_output().unwrap();
        let all = text(&joiner);
        let (code, out, _) = server.end(LIMIT);
        if passes {
            assert_eq!(joiner.status.code(), Some(0), "{all}");
            assert_eq!(code, Some(0), "{out}");
        } else {
            assert_eq!(joiner.status.code(), Some(1), "{all}");
            assert!(
                all.contains("CUDA_ERROR_MAP_FAILED") && all.contains("this process has another"),
                "{all}"
            );
            assert!(all.contains("--ipc=container") && all.contains("--sync memops"), "{all}");
            assert_eq!(code, Some(1), "{out}");
        }
    }
}

/// Before anything runs, the server says where each joiner stands against it, made of namespaces by
/// `unshare` (not by `--isolate`): a joiner in the server's namespaces shares everything; one with a PID,
/// UTS and mount namespace of its own is said to differ in each (with its hostname), and the forecast says
/// what follows (NCCL's P2P falls back, PyTorch's expandable segments cannot fetch the descriptor), with
/// the least change; the `--json` document carries the same as data.
#[test]
fn the_server_says_what_each_joiner_shares_with_it_and_forecasts_each_path() {
    let prefix = ["unshare", "--pid", "--fork", "--mount-proc", "--uts"];
    if !Command::new("unshare").args(&prefix[1..]).arg("true").status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "the_server_says_what_each_joiner_shares_with_it: no namespaces here");
        return;
    }
    let (dir, socket) = socket_path("placement");
    let json = dir.path().join("run.json");
    let json_arg = json.display().to_string();
    let args = ["--procs-per-device", "2", "--ipc", "vmm", "--sync", "memops", "--json", &json_arg];
    let server = serve("ok", &socket, &args);
    let server_pid = server.child.id();
    let near = join("ok", &socket, None);
    assert!(server.wait_for("Process 0 joined", LIMIT), "{}", server.text());
    let script = format!("hostname far-away && exec {} --join {socket}", bin().display());
    let far = Command::new("unshare")
        .args(&prefix[1..])
        .args(["sh", "-c", &script])
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, _) = server.end(LIMIT);
    assert_eq!(near.end(LIMIT).0, Some(0));
    assert_eq!(far.wait_with_output().unwrap().status.code(), Some(0));
    assert_eq!(code, Some(0), "{out}");
    let table: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("Where the processes stand")).collect();
    assert!(table.len() > 12, "the table comes before the run: {out}");
    let row = |name: &str| table.iter().find(|l| l.starts_with(name)).copied().unwrap_or_default();
    assert!(row("PID namespace").contains("same") && row("PID namespace").contains("differs: pid "), "{out}");
    assert!(row("hostname (UTS)").ends_with("and far-away"), "{out}");
    assert!(
        row("mount namespace").contains("differs") && row("/dev/shm").matches("same").count() == 2,
        "{out}"
    );
    assert!(
        out.contains("Forecast for process 0 (docs/placement.md says why; the libraries as of NCCL 2.30.7, UCX 1.22.0 (and master 9466d104a3), PyTorch 2.11):\n  legacy memory: works;"),
        "{out}"
    );
    assert!(out.contains("NCCL P2P: falls back to NCCL's NET transport"), "{out}");
    assert!(
        out.contains("PyTorch expandable_segments: fails (its VMM fd by pidfd_getfd: ESRCH, forecast)"),
        "{out}"
    );
    assert!(out.contains("what fixes it: Docker --uts=container:NAME"), "{out}");
    let doc = common::document(&json);
    let processes = doc["placement"]["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 2, "{doc}");
    let far = processes.iter().find(|p| p["place"]["hostname"] == "far-away").unwrap();
    assert_eq!(far["shares"][0]["fact"], "pid_namespace");
    assert_eq!(far["shares"][0]["same"], "differs");
    assert_eq!(far["place"]["pid"], 1, "{far}");
    let nccl = far["libraries"].as_array().unwrap().iter().find(|f| f["path"] == "NCCL P2P").unwrap();
    assert_eq!(nccl["verdict"], "falls_back", "{nccl}");
    assert_eq!(doc["placement"]["server"]["pid"].as_u64(), Some(u64::from(server_pid)));
}

/// After the run, the server sets the forecast of each path beside what happened: a server and a joiner
/// that are both pid 1 in PID namespaces of their own (made by `unshare`), with legacy memory and memops:
/// the forecast said the driver refuses the handle (`CUDA_ERROR_INVALID_CONTEXT`), the joiner says (over
/// the socket, as typed facts) that it did, and the two agree, in the output and the document.
#[test]
fn the_forecast_stands_beside_the_outcome() {
    let pid_ns = ["unshare", "--pid", "--fork", "--mount-proc"];
    if !Command::new("unshare").args(&pid_ns[1..]).arg("true").status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "the_forecast_stands_beside_the_outcome: no PID namespaces here");
        return;
    }
    let (dir, socket) = socket_path("against");
    let json = dir.path().join("run.json");
    let json_arg = json.display().to_string();
    let server = in_namespaces(&pid_ns, &["--serve", &socket, "--sync", "memops", "--json", &json_arg]);
    let start = Instant::now();
    while !std::path::Path::new(&socket).exists() && start.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let joiner = in_namespaces(&pid_ns, &["--join", &socket]);
    let (server, joiner) = (server.wait_with_output().unwrap(), joiner.wait_with_output().unwrap());
    let said = text(&server);
    assert_eq!((server.status.code(), joiner.status.code()), (Some(1), Some(1)), "{said}");
    let invalid = "legacy memory: forecast fails (CUDA_ERROR_INVALID_CONTEXT), the driver refused it \
                   (CUDA_ERROR_INVALID_CONTEXT)\n";
    assert!(said.contains(&format!("Forecast against outcome:\n  {invalid}")), "{said}");
    assert!(!said.contains("THE FORECAST WAS WRONG"), "{said}");
    let doc = common::document(&json);
    let against = &doc["placement"]["against"][0];
    assert_eq!((against["path"].as_str(), against["agrees"].as_bool()), (Some("legacy memory"), Some(true)));
    assert_eq!(doc["refused"]["error"], "CUDA_ERROR_INVALID_CONTEXT", "the joiner's refusal, typed: {doc}");
}

/// `--fds pidfd` in a served run: a joiner in the server's namespaces fetches every descriptor with
/// pidfd_getfd and passes; one in a PID namespace of its own cannot see the server's pid (ESRCH, named with
/// the fix); one that is root without CAP_SYS_PTRACE (setpriv) is refused ptrace (EPERM, named with what it
/// lacks). Needs root, unshare and setpriv.
#[test]
fn descriptors_by_pidfd_getfd_pass_where_visible_and_name_each_refusal() {
    let pid_ns = ["unshare", "--pid", "--fork", "--mount-proc"];
    if !Command::new("unshare").args(&pid_ns[1..]).arg("true").status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "descriptors_by_pidfd_getfd: no PID namespaces here");
        return;
    }
    let no_ptrace = ["setpriv", "--inh-caps", "-all", "--bounding-set", "-sys_ptrace"];
    let cases: [(&str, &[&str], &[&str]); 3] = [
        ("same", &["env"], &[]),
        (
            "pid-ns",
            &pid_ns,
            &[
                "ESRCH",
                "not visible from here",
                "--pid=container:NAME",
                "shareProcessNamespace: true",
                "--fds socket",
            ],
        ),
        (
            "no-ptrace",
            &no_ptrace,
            &[
                "pidfd_getfd: Operation not permitted (EPERM)",
                "lacks CAP_SYS_PTRACE",
                "holds capabilities this process lacks",
                "--cap-add SYS_PTRACE",
                "capabilities.add: [SYS_PTRACE]",
                "--fds socket",
            ],
        ),
    ];
    for (name, prefix, words) in cases {
        let (dir, socket) = socket_path(&format!("pidfd-{name}"));
        let json = dir.path().join("run.json").display().to_string();
        let server =
            serve("ok", &socket, &["--ipc", "vmm", "--fds", "pidfd", "--timeout", "10", "--json", &json]);
        let joiner = in_namespaces(prefix, &["--join", &socket]).wait_with_output().unwrap();
        let all = text(&joiner);
        let (code, out, _) = server.end(LIMIT);
        let doc = common::document(std::path::Path::new(&json));
        if words.is_empty() {
            assert_eq!((joiner.status.code(), code), (Some(0), Some(0)), "{name}: {all}\n{out}");
            assert!(out.contains("vmm IPC (descriptors by pidfd_getfd)"), "{out}");
            assert!(doc["refused"].is_null(), "{doc}");
            assert!(out.contains("VMM fd by pidfd_getfd: forecast works, it worked"), "{out}");
            continue;
        }
        assert_eq!((joiner.status.code(), code), (Some(1), Some(1)), "{name}: {all}\n{out}");
        for word in words {
            assert!(all.contains(word) && out.contains(word), "{name}: {word}: {all}\n{out}");
        }
        // The joiner's refusal crossed the wire typed: the server's document names the kernel's errno and why.
        let (errno, why) = if name == "pid-ns" { ("ESRCH", "not_visible") } else { ("EPERM", "ptrace") };
        let refused = &doc["refused"];
        assert_eq!(
            (refused["error"].as_str(), refused["pidfd"]["why"].as_str()),
            (Some(errno), Some(why)),
            "{doc}"
        );
        if name == "no-ptrace" {
            let obstacles = refused["pidfd"]["obstacles"].as_array().expect("which of ptrace's conditions");
            let said: Vec<&str> = obstacles.iter().filter_map(|o| o["obstacle"].as_str()).collect();
            assert!(said.contains(&"more_capabilities") && said.contains(&"no_cap_sys_ptrace"), "{doc}");
        }
        assert!(refused["fix"].as_str().is_some_and(|f| f.contains("--fds socket")), "{doc}");
        // The server forecast it from where the joiner stands, and holds the forecast against it.
        let held =
            format!("VMM fd by pidfd_getfd: forecast fails ({errno}), the kernel refused it ({errno})");
        assert!(out.contains(&held), "{name}: {out}");
        let against = &doc["placement"]["against"][0];
        assert_eq!(
            (against["outcome"].as_str(), against["agrees"].as_bool()),
            (Some("kernel_refused"), Some(true))
        );
    }
}

/// A kernel without pidfd_getfd (the simulation's `no-pidfd`, as Linux 5.3 to 5.5): `--fds pidfd` is asked
/// by trial and waived (exit 2) with the reason and what needs no such call, in the verdict and the
/// document; `--fds socket` runs there. A served run waives so as its server; a served sequence waives vmm
/// and pool with that reason, tells its joiner, and passes legacy.
#[test]
fn a_kernel_without_pidfd_getfd_waives_fds_pidfd_with_the_reason() {
    let reason = "cannot run here with --fds pidfd: this kernel has no pidfd_getfd (simulated: no-pidfd) \
                  (ENOSYS: pidfd_getfd needs Linux 5.6 or later); --fds socket needs no such call";
    let dir = common::scratch("serve-no-pidfd");
    let json = dir.path().join("run.json");
    let out = common::run(
        common::simulated("ok,ok+no-pidfd").args(["--ipc", "vmm", "--fds", "pidfd", "--json"]).arg(&json),
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!("WAIVED (exit 2, not a failure: nothing here to test): --ipc vmm {reason}")),
        "{said}"
    );
    let doc = common::document(&json);
    assert_eq!(doc["status"], "waived", "{doc}");
    assert!(doc["reason"].as_str().is_some_and(|r| r.contains(reason)), "{doc}");
    let socket = common::run(common::simulated("ok,ok+no-pidfd").args(["--ipc", "pool", "--fds", "socket"]));
    assert_eq!(socket.status.code(), Some(0), "--fds socket needs no such call: {}", text(&socket));

    let (_dir, one) = socket_path("no-pidfd-one");
    let args = ["--serve", one.as_str(), "--ipc", "pool", "--fds", "pidfd"];
    let (code, out, _) = Running::start("ok+no-pidfd", &args, None).end(LIMIT);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains(&format!("--ipc pool {reason}")), "{out}");

    let (_dir, all) = socket_path("no-pidfd-all");
    let server = serve("ok+no-pidfd", &all, &["--ipc", "all", "--fds", "pidfd"]);
    let (joined, heard, _) = join("ok+no-pidfd", &all, None).end(LIMIT);
    let (code, out, _) = server.end(LIMIT);
    assert_eq!((code, joined), (Some(0), Some(0)), "{out}\n{heard}");
    for (run, ipc) in [("2/4", "vmm"), ("3/4", "pool")] {
        let told = format!("The server's run {run} was waived: --ipc {ipc} {reason}");
        assert!(heard.contains(&told), "the joiner is told: {told}: {heard}");
        assert!(out.contains(&format!("waived: --ipc {ipc} {reason}")), "{out}");
    }
    assert!(out.contains("legacy passed, vmm waived, pool waived"), "{out}");
}

/// `--serve --ipc all` runs every mechanism after the forecast, and its table says beside each result
/// whether it went as forecast (each run's document carries its forecast against its outcome).
#[test]
fn a_served_sequence_shows_forecast_beside_outcome() {
    let (dir, socket) = socket_path("seq-forecast");
    let json = dir.path().join("all.json");
    let server = serve("ok", &socket, &["--ipc", "all", "--json", &json.display().to_string()]);
    let joiner = join("ok", &socket, None);
    let (code, out, _) = server.end(LIMIT);
    assert_eq!((code, joiner.end(LIMIT).0), (Some(0), Some(0)), "{out}");
    for mechanism in ["legacy", "vmm", "pool"] {
        let row = out.lines().find(|l| l.starts_with(mechanism) && l.contains("passed")).unwrap_or_default();
        assert!(row.ends_with("passed (as forecast)"), "{mechanism}: {out}");
    }
    let doc = common::document(&json);
    let legacy = &doc["mechanisms"][0]["document"]["placement"]["against"];
    assert_eq!(legacy[0]["path"], "legacy memory", "{doc}");
    assert_eq!(legacy[0]["agrees"], true, "{doc}");
}

/// Fabric handles where the simulated processes have an IMEX channel (`imex`): the place each reads says
/// so too, so that the forecast and the simulated driver rest on one fact: "not known" (nobody measured
/// fabric handles with a channel), and the run passes; never "THE FORECAST WAS WRONG".
#[test]
fn a_served_fabric_run_with_an_imex_channel_agrees_with_its_forecast() {
    let (_dir, socket) = socket_path("fabric");
    let server = serve("ok+imex", &socket, &["--ipc", "fabric"]);
    let joiner = join("ok+imex", &socket, None);
    let (code, out, _) = server.end(LIMIT);
    let (joined, said, _) = joiner.end(LIMIT);
    assert_eq!((code, joined), (Some(0), Some(0)), "{out}\n{said}");
    assert!(out.contains("IMEX channel            same"), "{out}");
    assert!(out.contains("  fabric: forecast not known, it worked\n"), "{out}");
    assert!(!out.contains("THE FORECAST WAS WRONG"), "{out}");
}

/// The facts a joiner reads in its own place reach the forecast: a joiner in a network namespace of its own
/// cannot reach NCCL's abstract socket (cuMem P2P fails), unless its environment says NCCL_CUMEM_ENABLE=0,
/// which makes NCCL's P2P legacy IPC; and each process tried pidfd_getfd on itself.
#[test]
fn a_joiners_settings_and_network_namespace_reach_the_library_forecast() {
    if !Command::new("unshare").args(["--net", "true"]).status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "a_joiners_settings_reach_the_library_forecast: no network namespaces");
        return;
    }
    for (setting, p2p) in [(None, "fails"), (Some("0"), "works")] {
        let (dir, socket) = socket_path("settings");
        let json = dir.path().join("run.json");
        let server = serve("ok", &socket, &["--json", json.to_str().unwrap()]);
        let mut joiner = Command::new("unshare");
        joiner.args(["--net"]).arg(bin()).args(["--join", &socket]).env(SIMULATE, "ok").env_remove(FAULT);
        match setting {
            Some(value) => joiner.env("NCCL_CUMEM_ENABLE", value),
            None => joiner.env_remove("NCCL_CUMEM_ENABLE"),
        };
        let joined = joiner.stdin(Stdio::null()).output().unwrap();
        let (code, out, _) = server.end(LIMIT);
        assert_eq!((code, joined.status.code()), (Some(0), Some(0)), "{out}\n{}", text(&joined));
        let doc = common::document(&json);
        let process = &doc["placement"]["processes"][0];
        let nccl = process["libraries"].as_array().unwrap().iter().find(|r| r["path"] == "NCCL P2P").unwrap();
        assert_eq!(nccl["verdict"], p2p, "NCCL_CUMEM_ENABLE={setting:?}: {nccl}");
        let settings = process["place"]["settings"].as_array().unwrap();
        assert_eq!(
            settings.contains(&serde_json::json!(["NCCL_CUMEM_ENABLE", "0"])),
            setting.is_some(),
            "{doc}"
        );
        assert_eq!(process["place"]["pidfd_getfd_itself"], "allowed", "{doc}");
    }
}

/// The NCCL a joiner would load is read in its own place, from its file and never by loading it (here a
/// stand-in library made with the C compiler, named by SIMPLE_IPC_NCCL_LIBRARY, with NCCL's banner in its
/// read-only data and a constructor that ends the process: a joiner that ran it would exit 42), and the
/// forecast speaks of that version: NCCL 2.18 uses legacy IPC for P2P, which needs no shared network
/// namespace.
#[test]
fn the_nccl_a_joiner_would_load_is_read_and_its_version_forecast() {
    let dir = common::scratch("nccl");
    let source = dir.path().join("nccl.c");
    let code = "#include <unistd.h>\n\
                __attribute__((used)) const char banner[] = \"NCCL version 2.18.6+cuda12.2\";\n\
                __attribute__((constructor)) static void planted(void) { _exit(42); }\n\
                int ncclGetVersion(int *version) { *version = 21806; return 0; }\n";
    std::fs::write(&source, code).unwrap();
    let library = dir.path().join("libnccl.so.2");
    let built = Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&library).arg(&source).status();
    if !built.is_ok_and(|s| s.success()) {
        common::skipped(
            "cc",
            "the_nccl_a_joiner_would_load_is_read: no C compiler to make a stand-in libnccl",
        );
        return;
    }
    if !Command::new("unshare").args(["--net", "true"]).status().is_ok_and(|s| s.success()) {
        common::skipped("namespaces", "the_nccl_a_joiner_would_load_is_read: no network namespaces");
        return;
    }
    let (sockets, socket) = socket_path("nccl-version");
    let json = sockets.path().join("run.json");
    let server = serve("ok", &socket, &["--json", json.to_str().unwrap()]);
    let joined = Command::new("unshare")
        .args(["--net"])
        .arg(bin())
        .args(["--join", &socket])
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .env("SIMPLE_IPC_NCCL_LIBRARY", &library)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (code, out, _) = server.end(LIMIT);
    assert_eq!((code, joined.status.code()), (Some(0), Some(0)), "{out}\n{}", text(&joined));
    let doc = common::document(&json);
    let process = &doc["placement"]["processes"][0];
    assert_eq!(process["place"]["nccl_version"], serde_json::json!([2, 18, 6]), "{doc}");
    let p2p = process["libraries"].as_array().unwrap().iter().find(|r| r["path"] == "NCCL P2P").unwrap();
    assert_eq!(p2p["verdict"], "works", "legacy IPC crosses network namespaces: {p2p}");
    assert!(p2p["rule"].as_str().unwrap().contains("NCCL 2.18.6, as read here"), "{p2p}");
}
