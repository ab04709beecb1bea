//! The Kubernetes examples (`examples/*.yaml`, shown by docs/kubernetes.md) run the program as it takes it:
//! each parses as Kubernetes objects; each file of pods holds one served run (a server and the joiners it
//! waits for: its GPUs × `--procs-per-device`, at a socket both sides mount), which passes on simulated GPUs
//! with the containers' own arguments, or checks that run alone (the fleet's DaemonSet), which pass there
//! with their `--json -` document alone on standard output; and the joiners' scripts give up waiting for
//! the socket. No cluster runs here: what a cluster would do with them is not tested
//! (scripts/validate-kubernetes.sh checks them against the API's schemas).

mod common;

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::kubernetes::{
    Example, TEXTFILE_DIRECTORY, containers_of, env_of, examples, pod_spec, read, str_at,
};
use common::{FAULT, SIMULATE, bin, text};
use common::{at_socket, value_of};
use serde_yaml::Value;

/// The kinds the examples may hold, with the API group version of each.
const KINDS: [(&str, &str); 7] = [
    ("Pod", "v1"),
    ("ConfigMap", "v1"),
    ("Deployment", "apps/v1"),
    ("DaemonSet", "apps/v1"),
    ("Job", "batch/v1"),
    ("ResourceClaim", "resource.k8s.io/v1"),
    ("ResourceClaimTemplate", "resource.k8s.io/v1"),
];

/// What a container runs of the program: the arguments of one `simple-ipc` invocation, how many
/// processes run it, and the shell's redirections of its output (`2>FILE`).
#[derive(Debug, Clone)]
struct Invocation {
    args: Vec<String>,
    processes: u32,
    redirections: Vec<String>,
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_sequence)
        .map(|items| items.iter().map(|item| item.as_str().expect("a string").to_owned()).collect())
        .unwrap_or_default()
}

/// The program's invocations in a container: its `args` where the image's entry point (the program) runs,
/// `command: [simple-ipc, ...]`, or each `simple-ipc ...` line of a `sh -c` script, which runs it once
/// (`exec simple-ipc`, or a line of its own) or `$JOINERS` times (`for i in $(seq "$JOINERS")`).
fn invocations(name: &str, container: &Value) -> Vec<Invocation> {
    let (command, args) = (strings(container.get("command")), strings(container.get("args")));
    let words: Vec<String> = command.iter().chain(&args).cloned().collect();
    match words.first().map(String::as_str) {
        None => panic!("{name}: a container that runs nothing"),
        _ if command.is_empty() => vec![Invocation { args, processes: 1, redirections: Vec::new() }],
        Some("simple-ipc" | "/usr/local/bin/simple-ipc") => {
            vec![Invocation { args: words[1..].to_vec(), processes: 1, redirections: Vec::new() }]
        }
        Some("sh" | "/bin/sh" | "bash") => {
            assert_eq!(words.get(1).map(String::as_str), Some("-c"), "{name}: sh -c SCRIPT: {words:?}");
            let script = words.get(2).unwrap_or_else(|| panic!("{name}: sh -c without a script"));
            let looped = script.contains("$(seq \"$JOINERS\")");
            let processes = if looped {
                let joiners = env_of(container, "JOINERS").unwrap_or_else(|| panic!("{name}: no JOINERS"));
                joiners.parse().unwrap_or_else(|e| panic!("{name}: JOINERS={joiners:?}: {e}"))
            } else {
                1
            };
            let found: Vec<Invocation> = script
                .lines()
                .map(|line| line.trim().trim_start_matches("exec "))
                .filter_map(|line| line.strip_prefix("simple-ipc "))
                .map(|rest| {
                    let rest = rest.split(['&', ';', '#']).next().unwrap_or("");
                    // `2>/tmp/log`, `>FILE`: the shell's, not the program's.
                    let (redirections, args): (Vec<String>, Vec<String>) =
                        rest.split_whitespace().map(str::to_owned).partition(|word| {
                            word.trim_start_matches(|c: char| c.is_ascii_digit()).starts_with(['>', '<'])
                        });
                    Invocation { args, processes, redirections }
                })
                .collect();
            assert_eq!(found.len(), 1, "{name}: one simple-ipc line in the script:\n{script}");
            found
        }
        Some(other) => panic!("{name}: runs {other}, not simple-ipc"),
    }
}

/// What a volume of a pod is, for telling whether two mounts are one: the pod and the volume's name for
/// an emptyDir, the node's path for a hostPath.
fn volume_identity(pod: usize, spec: &Value, name: &str) -> String {
    let volume = spec
        .get("volumes")
        .and_then(Value::as_sequence)
        .and_then(|volumes| volumes.iter().find(|v| str_at(v, "name") == Some(name)))
        .unwrap_or_else(|| panic!("no volume {name}"));
    if let Some(host) = volume.get("hostPath") {
        format!("hostPath {}", str_at(host, "path").expect("a hostPath's path"))
    } else if volume.get("emptyDir").is_some() {
        format!("pod {pod}'s emptyDir {name}")
    } else {
        panic!("volume {name}: neither emptyDir nor hostPath")
    }
}

/// The volume a container has mounted where `path` is: the mount whose mountPath is its directory.
fn mounted_at(pod: usize, spec: &Value, container: &Value, path: &str) -> Option<String> {
    let dir = Path::new(path).parent()?.to_str()?;
    let mounts = container.get("volumeMounts")?.as_sequence()?;
    let mount = mounts.iter().find(|m| str_at(m, "mountPath") == Some(dir))?;
    Some(volume_identity(pod, spec, str_at(mount, "name")?))
}

/// The GPUs a container is given: its `nvidia.com/gpu` limit, or one for each claim it uses (each example's
/// claim requests one device).
fn gpus_of(name: &str, container: &Value) -> u32 {
    let resources = container.get("resources");
    let limit = resources.and_then(|r| r.get("limits")).and_then(|l| l.get("nvidia.com/gpu"));
    match limit {
        Some(Value::Number(n)) => n.as_u64().expect("a count") as u32,
        Some(Value::String(s)) => s.parse().unwrap_or_else(|e| panic!("{name}: nvidia.com/gpu {s:?}: {e}")),
        Some(other) => panic!("{name}: nvidia.com/gpu {other:?}"),
        None => {
            let claims = strings_of_names(resources.and_then(|r| r.get("claims")));
            assert!(!claims.is_empty(), "{name}: a container given no GPU (nvidia.com/gpu or a claim)");
            claims.len() as u32
        }
    }
}

fn strings_of_names(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_sequence)
        .map(|items| items.iter().filter_map(|i| str_at(i, "name")).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// A served run of an example: the server's arguments and GPUs, and each joiner's arguments and count.
struct ServedRun {
    server: Vec<String>,
    gpus: u32,
    joiners: Vec<Invocation>,
}

/// A run of the program on its own, neither served nor joining (the fleet's check on each node): its
/// arguments, its GPUs, and its container's.
struct AloneRun {
    at: String,
    invocation: Invocation,
    gpus: u32,
}

/// What an example's pods run: one served run, or runs that each stand alone.
enum Run {
    Served(ServedRun),
    Alone(Vec<AloneRun>),
}

/// Checks what every object of an example must be, and returns what its pods run, if it has pods.
fn run_of(example: &Example, entry_point: &[String]) -> Option<Run> {
    let name = &example.name;
    assert!(!example.documents.is_empty(), "{name}: no manifest");
    let mut server: Option<(Vec<String>, u32, String)> = None;
    let mut joiners: Vec<(Invocation, Option<String>)> = Vec::new();
    let mut alone: Vec<AloneRun> = Vec::new();
    let mut pods = 0;
    for (index, document) in example.documents.iter().enumerate() {
        let kind = str_at(document, "kind").unwrap_or_else(|| panic!("{name}: a document without kind"));
        let version = str_at(document, "apiVersion").unwrap_or_else(|| panic!("{name}: no apiVersion"));
        let expected = KINDS.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v);
        assert_eq!(Some(version), expected, "{name}: {kind} of apiVersion {version}");
        let metadata = document.get("metadata").unwrap_or_else(|| panic!("{name}: {kind} without metadata"));
        assert!(str_at(metadata, "name").is_some_and(|n| !n.is_empty()), "{name}: {kind} without a name");
        match kind {
            "ConfigMap" => assert!(document.get("data").is_some(), "{name}: a ConfigMap without data"),
            "ResourceClaim" | "ResourceClaimTemplate" => {
                assert!(document.get("spec").is_some(), "{name}: {kind}")
            }
            _ => {}
        }
        let Some(spec) = pod_spec(document) else { continue };
        pods += 1;
        if kind == "DaemonSet" {
            // Its pods restart whatever ends: Always is the only policy the API takes for them.
            let policy = str_at(spec, "restartPolicy").unwrap_or("Always");
            assert_eq!(policy, "Always", "{name}: a DaemonSet's pods restart their containers");
        }
        let containers = spec.get("containers").and_then(Value::as_sequence);
        let containers = containers.unwrap_or_else(|| panic!("{name}: a pod without containers"));
        assert!(!containers.is_empty(), "{name}: a pod without containers");
        for container in containers {
            let at = format!("{name}: container {}", str_at(container, "name").expect("a container's name"));
            let image = str_at(container, "image").unwrap_or_else(|| panic!("{at}: no image"));
            assert!(image == "simple-ipc:latest" || image == "IMAGE", "{at}: image {image}");
            let gpus = gpus_of(&at, container);
            for invocation in invocations(&at, container) {
                let args = if container.get("command").is_none() {
                    entry_point[1..].iter().chain(&invocation.args).cloned().collect()
                } else {
                    invocation.args.clone()
                };
                if let Some(socket) = value_of(&args, "--serve") {
                    assert!(server.is_none(), "{name}: two servers");
                    let volume = mounted_at(index, spec, container, socket)
                        .unwrap_or_else(|| panic!("{at}: the socket {socket} is on no volume"));
                    server = Some((args.clone(), gpus, volume));
                } else if let Some(socket) = value_of(&args, "--join") {
                    let volume = mounted_at(index, spec, container, socket);
                    joiners.push((Invocation { args, ..invocation }, volume));
                } else {
                    if let Some(metrics) = value_of(&args, "--metrics").filter(|m| *m != "-") {
                        let volume = mounted_at(index, spec, container, metrics);
                        let textfile = format!("hostPath {TEXTFILE_DIRECTORY}");
                        assert_eq!(
                            volume,
                            Some(textfile),
                            "{at}: --metrics {metrics} in the textfile directory"
                        );
                        assert!(metrics.ends_with(".prom"), "{at}: the collector reads *.prom: {metrics}");
                    }
                    alone.push(AloneRun {
                        at: at.clone(),
                        invocation: Invocation { args, ..invocation },
                        gpus,
                    });
                }
            }
        }
    }
    if pods == 0 {
        return None;
    }
    if !alone.is_empty() {
        assert!(server.is_none() && joiners.is_empty(), "{name}: a served run and runs alone in one file");
        return Some(Run::Alone(alone));
    }
    let (server, gpus, volume) = server.unwrap_or_else(|| panic!("{name}: pods but no server"));
    assert!(!joiners.is_empty(), "{name}: a server but no joiner");
    let socket = value_of(&server, "--serve").expect("served").to_owned();
    for (joiner, mounted) in &joiners {
        assert_eq!(value_of(&joiner.args, "--join"), Some(socket.as_str()), "{name}: the joiners' socket");
        assert_eq!(
            mounted.as_ref(),
            Some(&volume),
            "{name}: the joiners see the server's socket on its volume"
        );
    }
    Some(Run::Served(ServedRun { server, gpus, joiners: joiners.into_iter().map(|(j, _)| j).collect() }))
}

/// Waits for `child` to end, for at most `limit`; stops it with SIGKILL past that.
fn ended_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("the process") {
            return Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs an example's served run on simulated GPUs (as many as its server's container is given), the
/// socket moved into a directory of the test's own: the server says it waits for as many processes as the
/// example starts, and with that many the run passes, the server and every joiner.
fn run_served(name: &str, run: &ServedRun) {
    let dir = common::scratch("kubernetes");
    let socket = dir.path().join("run.sock");
    let simulated = vec!["ok"; run.gpus as usize].join(",");
    let mut server = Command::new(bin())
        .args(at_socket(&run.server, &socket))
        .env(SIMULATE, &simulated)
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the server starts");
    let said = Arc::new(Mutex::new(String::new()));
    let readers: Vec<_> = [
        Box::new(server.stdout.take().expect("piped")) as Box<dyn std::io::Read + Send>,
        Box::new(server.stderr.take().expect("piped")),
    ]
    .into_iter()
    .map(|stream| {
        let said = Arc::clone(&said);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stream).lines().map_while(Result::ok) {
                let mut said = said.lock().unwrap_or_else(|p| p.into_inner());
                said.push_str(&line);
                said.push('\n');
            }
        })
    })
    .collect();
    let start = Instant::now();
    let waits_for: u32 = loop {
        let text = said.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let count =
            text.split_once("waiting for ").and_then(|(_, rest)| rest.split(' ').next()?.parse().ok());
        if let Some(count) = count {
            break count;
        }
        if start.elapsed() > Duration::from_secs(10) || server.try_wait().ok().flatten().is_some() {
            let _ = server.kill();
            let _ = server.wait();
            panic!("{name}: the server never served: {text}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let started: u32 = run.joiners.iter().map(|j| j.processes).sum();
    let per_device: u32 =
        value_of(&run.server, "--procs-per-device").map_or(1, |n| n.parse().expect("a number"));
    assert_eq!(
        waits_for,
        run.gpus * per_device,
        "{name}: the server waits for its GPUs × --procs-per-device"
    );
    if started != waits_for {
        let _ = server.kill();
        let _ = server.wait();
        panic!("{name}: the example starts {started} joiners; the server waits for {waits_for}");
    }
    let joiners: Vec<_> = run
        .joiners
        .iter()
        .flat_map(|j| std::iter::repeat_n(j.args.clone(), j.processes as usize))
        .map(|args| {
            let mut joiner = Command::new(bin());
            joiner.args(at_socket(&args, &socket)).env(SIMULATE, &simulated).env_remove(FAULT);
            std::thread::spawn(move || common::run(&mut joiner))
        })
        .collect();
    for joiner in joiners {
        let out = joiner.join().expect("the joiner's thread");
        assert_eq!(out.status.code(), Some(0), "{name}: a joiner: {}", text(&out));
    }
    let status = ended_within(&mut server, Duration::from_secs(60));
    for reader in readers {
        let _ = reader.join();
    }
    let said = said.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{name}: the server: {said}");
}

/// The image's entry point, from the Dockerfile: what runs a container that names no `command`.
fn entry_point() -> Vec<String> {
    let dockerfile = read("Dockerfile");
    let line = dockerfile.lines().find_map(|l| l.strip_prefix("ENTRYPOINT ")).expect("an ENTRYPOINT");
    let entry: Vec<String> = serde_json::from_str(line).expect("ENTRYPOINT as a JSON array");
    assert_eq!(entry, ["simple-ipc"], "the image's entry point is the program");
    entry
}

/// Runs a run that stands alone on simulated GPUs (as many as its container is given): it passes, and where
/// it writes its `--json -` document, as the fleet's check does for `kubectl logs | jq`, its standard output
/// is that document alone, and its container's script sends its other lines (standard error) elsewhere, or
/// the log would mix them into the document.
fn run_alone(name: &str, run: &AloneRun) {
    let at = &run.at;
    let simulated = vec!["ok"; run.gpus as usize].join(",");
    // `--metrics` into the node's textfile directory: here, into one of the test's own.
    let dir = common::scratch("kubernetes-metrics");
    let metrics = dir.path().join("simple-ipc.prom");
    let mut args = run.invocation.args.clone();
    if let Some(at) = args.iter().position(|a| a == "--metrics") {
        args[at + 1] = metrics.display().to_string();
    }
    let mut check = Command::new(bin());
    check.args(&args).env(SIMULATE, &simulated).env_remove(FAULT);
    let out = common::run(&mut check);
    assert_eq!(out.status.code(), Some(0), "{name}: {at}: {}", text(&out));
    if args.iter().any(|a| a == "--metrics") {
        let written = std::fs::read_to_string(&metrics).unwrap_or_else(|e| panic!("{at}: --metrics: {e}"));
        assert!(written.contains("simple_ipc_status{status=\"passed\"} 1\n"), "{at}: {written}");
    }
    if value_of(&run.invocation.args, "--json") == Some("-") {
        let document: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{at}: standard output is not the document alone: {e}: {}", text(&out))
        });
        assert_eq!(document["status"], "passed", "{at}: {document}");
        let elsewhere = run.invocation.redirections.iter().any(|r| r.starts_with("2>") && r != "2>&1");
        assert!(elsewhere, "{at}: --json - with standard error in the log too: {:?}", run.invocation);
    }
}

/// Every example parses as Kubernetes objects, and each one's pods hold a served run of the program that
/// passes on simulated GPUs with the containers' own arguments and as many joiners as the server waits for,
/// or runs that stand alone and pass there (the fleet's check).
#[test]
fn each_example_is_a_served_run_the_program_takes() {
    let entry = entry_point();
    let examples = examples();
    assert!(examples.len() >= 6, "examples/: {} files", examples.len());
    let (mut served, mut alone) = (0, 0);
    for example in &examples {
        match run_of(example, &entry) {
            Some(Run::Served(run)) => {
                run_served(&example.name, &run);
                served += 1;
            }
            Some(Run::Alone(runs)) => {
                for run in &runs {
                    run_alone(&example.name, run);
                }
                alone += 1;
            }
            None => {}
        }
    }
    assert!(served >= 5, "{served} examples with a served run");
    assert!(alone >= 1, "{alone} examples with a run alone (the fleet's)");
}

/// Writes an executable file of the test's own.
fn executable(path: &Path, contents: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// Each joiners' script (`sh -c`) waits for the server's socket, but not for ever: run with stand-ins for the
/// program and for `sleep` (which notes each second and returns at once), where no socket comes it gives up
/// within 300 s (no longer than the examples' servers wait for their joiners, `--timeout 300`) with exit
/// status 1, naming the socket, and starts no joiner; where the socket is there, it starts its joiners at once,
/// and exits 0 if they all pass and 1 if one fails.
#[test]
fn every_joiners_wait_for_the_socket_is_bounded() {
    let dir = common::scratch("kubernetes-wait");
    let stand_ins = dir.path().join("bin");
    std::fs::create_dir(&stand_ins).expect("a directory of the test's own");
    executable(&stand_ins.join("sleep"), "#!/bin/sh\necho \"$*\" >>\"$RECORD/slept\"\n");
    executable(
        &stand_ins.join("simple-ipc"),
        "#!/bin/sh\necho \"$*\" >>\"$RECORD/joined\"\nexit \"$JOINER_STATUS\"\n",
    );
    let path = format!("{}:{}", stand_ins.display(), std::env::var("PATH").unwrap_or_default());
    let mut scripts = 0;
    for example in examples() {
        for spec in example.documents.iter().filter_map(pod_spec) {
            for container in containers_of(spec) {
                let container_name = str_at(container, "name").unwrap_or("?");
                let at = format!("{}: container {container_name}", example.name);
                let words: Vec<String> = strings(container.get("command"))
                    .into_iter()
                    .chain(strings(container.get("args")))
                    .collect();
                if words.first().map(String::as_str) != Some("sh") {
                    continue; // the image's entry point with its args: a server
                }
                let script = &words[2];
                let invocation = invocations(&at, container).remove(0);
                let Some(socket) = value_of(&invocation.args, "--join") else { continue };
                scripts += 1;
                // The script, run with the socket moved to `record`: its status, its standard error, the seconds
                // it slept and the joiners it started. (A short name: a socket's path has at most 107 bytes.)
                let run = |case: &str, listening: bool, joiner_status: u8| {
                    let record = dir.path().join(format!("{scripts}-{case}"));
                    std::fs::create_dir(&record).expect("a directory of the test's own");
                    let here = record.join("run.sock");
                    let _listener =
                        listening.then(|| std::os::unix::net::UnixListener::bind(&here).expect("bind"));
                    let mut sh = Command::new("sh");
                    sh.arg("-c")
                        .arg(script.replace(socket, &here.display().to_string()))
                        .env("PATH", &path)
                        .env("RECORD", &record)
                        .env("JOINER_STATUS", joiner_status.to_string())
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::piped());
                    if let Some(joiners) = env_of(container, "JOINERS") {
                        sh.env("JOINERS", joiners);
                    }
                    let mut child = sh.spawn().expect("sh starts");
                    let status = ended_within(&mut child, Duration::from_secs(30));
                    let mut said = String::new();
                    if let Some(mut stderr) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut stderr, &mut said);
                    }
                    let lines = |file: &str| -> Vec<String> {
                        let text = std::fs::read_to_string(record.join(file)).unwrap_or_default();
                        text.lines().map(str::to_owned).collect()
                    };
                    let status =
                        status.unwrap_or_else(|| panic!("{at}: {case}: the script did not end in 30 s"));
                    (status.code(), said, lines("slept").len(), lines("joined"), here)
                };
                let (status, said, slept, joined, here) = run("none", false, 0);
                assert_eq!(status, Some(1), "{at}: no server: {said}");
                assert!((1..=300).contains(&slept), "{at}: it waited {slept} s for the socket");
                assert!(said.contains(&here.display().to_string()), "{at}: the socket is named: {said:?}");
                assert!(joined.is_empty(), "{at}: joiners started without a socket: {joined:?}");
                let (status, said, slept, joined, here) = run("ok", true, 0);
                assert_eq!(status, Some(0), "{at}: {said}");
                assert_eq!(slept, 0, "{at}: it slept with the socket there");
                let expected = vec![format!("--join {}", here.display()); invocation.processes as usize];
                assert_eq!(joined, expected, "{at}: the joiners it starts");
                let (status, said, _, _, _) = run("fail", true, 1);
                assert_eq!(status, Some(1), "{at}: a joiner failed: {said}");
            }
        }
    }
    assert!(scripts >= 8, "{scripts} joiners' scripts in the examples");
}
