//! The Kubernetes examples (`examples/*.yaml`, shown by docs/kubernetes.md) are manifests that run the program
//! as it takes it: each parses as Kubernetes objects; each file of pods holds one served run (a server and the
//! joiners it waits for: its GPUs × `--procs-per-device`, at a socket both sides mount), which passes on
//! simulated GPUs with the containers' own arguments, or checks that run alone (the fleet's DaemonSet), which
//! pass there with their `--json -` document alone on standard output; every container uses the node's copy
//! of the image; all the files can be applied at once (names, hostPaths and the joiners' affinity are each
//! example's own); the joiners' scripts give up waiting for the socket; every pod-spec field that a fix of the
//! program names is in an example; and the document and the examples name each other. No cluster runs here:
//! what a cluster would do with them is not tested (scripts/validate-kubernetes.sh checks them against the
//! API's schemas).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{FAULT, SIMULATE, bin, text};
use common::{at_socket, value_of};
use serde::Deserialize;
use serde_yaml::Value;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One file of examples/: its name and its YAML documents.
struct Example {
    name: String,
    documents: Vec<Value>,
}

/// Every `examples/*.yaml`, by name, each parsed into its documents.
fn examples() -> Vec<Example> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
            let yaml = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{name}: {e}"));
            let documents = serde_yaml::Deserializer::from_str(&yaml)
                .map(|document| {
                    Value::deserialize(document).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"))
                })
                .filter(|document| !document.is_null())
                .collect();
            Example { name, documents }
        })
        .collect()
}

/// The node's directory that node_exporter's textfile collector reads (`--collector.textfile.directory`),
/// which the fleet's check writes its `--metrics` into: the one hostPath examples may share (a file each).
const TEXTFILE_DIRECTORY: &str = "/var/lib/node_exporter/textfile_collector";

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

fn str_at<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// The pod spec of a Pod, or of a Deployment's, DaemonSet's or Job's template.
fn pod_spec(document: &Value) -> Option<&Value> {
    match str_at(document, "kind")? {
        "Pod" => document.get("spec"),
        "Deployment" | "DaemonSet" | "Job" => document.get("spec")?.get("template")?.get("spec"),
        _ => None,
    }
}

/// The labels of a Pod, or of a Deployment's, DaemonSet's or Job's pods.
fn pod_labels(document: &Value) -> Option<&Value> {
    match str_at(document, "kind")? {
        "Pod" => document.get("metadata")?.get("labels"),
        "Deployment" | "DaemonSet" | "Job" => {
            document.get("spec")?.get("template")?.get("metadata")?.get("labels")
        }
        _ => None,
    }
}

/// Every container of a pod spec, its init containers included, with its name.
fn containers_of(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|key| spec.get(key).and_then(Value::as_sequence))
        .flatten()
        .collect()
}

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

fn env_of(container: &Value, name: &str) -> Option<String> {
    container.get("env")?.as_sequence()?.iter().find_map(|variable| {
        (str_at(variable, "name") == Some(name)).then(|| str_at(variable, "value").unwrap_or("").to_owned())
    })
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

/// The texts of the fixes in Kubernetes' words: each `kubernetes:` string of the forecasts' fixes
/// (src/placement/), what a failed open says of Kubernetes (src/ipc/diagnose.rs), what a joiner that lacks
/// its GPU is told (src/sample/attach.rs), and the Kubernetes column of docs/placement.md's table of least changes.
fn kubernetes_fixes() -> Vec<(String, String)> {
    let mut fixes = Vec::new();
    // A Rust string literal's text from its opening quote on, its lines continued by `\` joined.
    let literal = |from: &str| -> String {
        let body = from.split_once('"').map_or("", |(_, rest)| rest);
        let mut text = String::new();
        let mut chars = body.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('\n') => {
                        while chars.as_str().starts_with(char::is_whitespace) {
                            chars.next();
                        }
                    }
                    Some(other) => text.push(other),
                    None => break,
                },
                c => text.push(c),
            }
        }
        text
    };
    // Every file of the forecast and the recipes, wherever a rule's fix lives.
    let mut sources: Vec<String> = Vec::new();
    let mut folders = vec![std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/placement")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap();
                sources.push(relative.display().to_string());
            }
        }
    }
    sources.sort();
    assert!(sources.iter().any(|s| s.ends_with("libraries/nccl.rs")), "{sources:?}");
    for source in &sources {
        let code = read(source);
        for (at, _) in code.match_indices("kubernetes:") {
            // A fix's field, set to a string literal (not the struct's declaration).
            let value = code[at + "kubernetes:".len()..].trim_start();
            if value.starts_with('"') {
                fixes.push((source.clone(), literal(value)));
            }
        }
    }
    for source in ["src/ipc/diagnose.rs", "src/sample/attach.rs"] {
        let code = read(source);
        for (at, _) in code.match_indices("Kubernetes") {
            let line = code[..at].rsplit('\n').next().unwrap_or("");
            if line.trim_start().starts_with("//") {
                continue; // a comment, not what the program says
            }
            let said: String = code[at..].chars().take_while(|c| *c != '"').collect();
            fixes.push((source.to_owned(), said));
        }
    }
    let placement = read("docs/placement.md");
    let header = "| what differs | Docker | Kubernetes |";
    let table =
        placement.lines().skip_while(|l| !l.starts_with(header)).skip(2).take_while(|l| l.starts_with('|'));
    for row in table {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        fixes.push(("docs/placement.md".to_owned(), cells.get(2).unwrap_or(&"").replace('`', "")));
    }
    assert!(fixes.len() >= 10, "the fixes in Kubernetes' words: {fixes:?}");
    fixes
}

/// What a fix asks of a pod spec, as the examples must show it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Field {
    /// `a.b.c: VALUE`: the path of keys with that value (a list: holding its items).
    Set(String, String),
    /// An emptyDir of medium: Memory mounted at /dev/shm.
    MemoryAtDevShm,
    /// An environment variable of that name, with one value in two pods.
    SameEnv(String),
    /// A ResourceClaim that two pods use by name.
    SharedClaim,
    /// The device plugin's time-slicing (or MPS) configuration.
    DevicePluginSharing,
}

/// The fields a fix's text names: every `key: value` whose key is a pod-spec field (a lowerCamelCase name,
/// dotted for a path), an `emptyDir` at /dev/shm, an `NCCL_...` environment variable, a shared claim, the
/// device plugin's sharing.
fn fields_named(fix: &str) -> BTreeSet<Field> {
    let mut fields = BTreeSet::new();
    let words: Vec<&str> = fix.split_whitespace().collect();
    for (i, word) in words.iter().enumerate() {
        if let Some(key) = word.strip_suffix(':')
            && key.starts_with(|c: char| c.is_ascii_lowercase())
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
            && let Some(value) = words.get(i + 1)
        {
            let value = value.trim_end_matches([',', ';', ')']);
            fields.insert(Field::Set(key.to_owned(), value.to_owned()));
        }
        if word.starts_with("NCCL_") && words.get(i + 1).is_some_and(|w| w.starts_with("env")) {
            fields.insert(Field::SameEnv((*word).to_owned()));
        }
    }
    if fix.contains("emptyDir") && fix.contains("/dev/shm") {
        fields.insert(Field::MemoryAtDevShm);
    }
    if fix.contains("ResourceClaim") {
        fields.insert(Field::SharedClaim);
    }
    if fix.contains("time-slicing") {
        fields.insert(Field::DevicePluginSharing);
    }
    fields
}

/// Every value in `value`, itself included, depth first.
fn every_value(value: &Value) -> Vec<&Value> {
    let mut all = vec![value];
    match value {
        Value::Mapping(map) => all.extend(map.values().flat_map(every_value)),
        Value::Sequence(items) => all.extend(items.iter().flat_map(every_value)),
        _ => {}
    }
    all
}

/// The value at a dotted path of keys from `value`.
fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, key| v.get(key))
}

/// Whether the examples show `field`.
fn shown(field: &Field, examples: &[Example]) -> bool {
    let documents = || examples.iter().flat_map(|e| &e.documents);
    match field {
        Field::Set(path, wanted) => {
            let wanted: Value = serde_yaml::from_str(wanted).unwrap_or(Value::String(wanted.clone()));
            documents().flat_map(every_value).filter_map(|v| at_path(v, path)).any(|found| {
                match (&wanted, found) {
                    (Value::Sequence(items), Value::Sequence(have)) => items.iter().all(|i| have.contains(i)),
                    (wanted, found) => wanted == found,
                }
            })
        }
        Field::MemoryAtDevShm => documents().filter_map(pod_spec).any(|spec| {
            let memory: Vec<&str> = spec
                .get("volumes")
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .filter(|v| v.get("emptyDir").and_then(|e| str_at(e, "medium")) == Some("Memory"))
                .filter_map(|v| str_at(v, "name"))
                .collect();
            every_value(spec).iter().any(|m| {
                str_at(m, "mountPath") == Some("/dev/shm")
                    && str_at(m, "name").is_some_and(|n| memory.contains(&n))
            })
        }),
        Field::SameEnv(name) => examples.iter().any(|example| {
            let values: Vec<String> = example
                .documents
                .iter()
                .filter_map(pod_spec)
                .filter_map(|spec| {
                    let containers = spec.get("containers")?.as_sequence()?;
                    containers.iter().find_map(|c| env_of(c, name))
                })
                .collect();
            values.len() >= 2 && values.iter().all(|v| *v == values[0])
        }),
        Field::SharedClaim => examples.iter().any(|example| {
            let claims: Vec<&str> = example
                .documents
                .iter()
                .filter(|d| str_at(d, "kind") == Some("ResourceClaim"))
                .filter_map(|d| str_at(d.get("metadata")?, "name"))
                .collect();
            claims.iter().any(|claim| {
                let users = example.documents.iter().filter_map(pod_spec).filter(|spec| {
                    every_value(spec).iter().any(|v| str_at(v, "resourceClaimName") == Some(claim))
                });
                users.count() >= 2
            })
        }),
        Field::DevicePluginSharing => documents()
            .filter(|d| str_at(d, "kind") == Some("ConfigMap"))
            .flat_map(|d| d.get("data").and_then(Value::as_mapping).into_iter().flat_map(|m| m.values()))
            .filter_map(Value::as_str)
            .filter_map(|config| serde_yaml::from_str::<Value>(config).ok())
            .any(|config| at_path(&config, "sharing.timeSlicing.resources").is_some()),
    }
}

/// What the examples lack of what the fixes name: each field with the fix that names it.
fn missing(fixes: &[(String, String)], examples: &[Example]) -> Vec<String> {
    let mut missing = Vec::new();
    for (source, fix) in fixes {
        for field in fields_named(fix) {
            if !shown(&field, examples) {
                missing.push(format!("{field:?}, which {source} names: {fix:?}"));
            }
        }
    }
    missing
}

/// Every pod-spec field that a fix names, in Kubernetes' words, is in an example: the fixes of the
/// forecasts, of the failure diagnoses, of a joiner that lacks its GPU, and of docs/placement.md.
#[test]
fn every_field_a_fix_names_is_in_an_example() {
    let fixes = kubernetes_fixes();
    let named: BTreeSet<Field> = fixes.iter().flat_map(|(_, fix)| fields_named(fix)).collect();
    for field in ["shareProcessNamespace", "hostPID", "hostIPC", "medium", "securityContext.capabilities.add"]
    {
        assert!(
            named.iter().any(|f| matches!(f, Field::Set(key, _) if key == field)),
            "no fix names {field}: {named:?}"
        );
    }
    assert!(named.contains(&Field::MemoryAtDevShm) && named.contains(&Field::SharedClaim), "{named:?}");
    let missing = missing(&fixes, &examples());
    assert!(missing.is_empty(), "fields the fixes name that no example has:\n{}", missing.join("\n"));
}

/// The check itself notices a field gone: with any one of them taken out of every example, it reports it.
#[test]
fn a_field_taken_out_of_the_examples_is_missed() {
    let fixes = kubernetes_fixes();
    fn without(value: &Value, key: &str) -> Value {
        match value {
            Value::Mapping(map) => Value::Mapping(
                map.iter()
                    .filter(|(k, _)| k.as_str() != Some(key))
                    .map(|(k, v)| (k.clone(), without(v, key)))
                    .collect(),
            ),
            Value::Sequence(items) => Value::Sequence(items.iter().map(|v| without(v, key)).collect()),
            other => other.clone(),
        }
    }
    for key in
        ["shareProcessNamespace", "hostPID", "hostIPC", "medium", "capabilities", "resourceClaimName", "env"]
    {
        let examples: Vec<Example> = examples()
            .into_iter()
            .map(|e| Example { documents: e.documents.iter().map(|d| without(d, key)).collect(), ..e })
            .collect();
        assert!(
            !missing(&fixes, &examples).is_empty(),
            "{key} taken out of every example, and nothing missed"
        );
    }
}

/// docs/kubernetes.md and the examples name each other: every `examples/NAME.yaml` it names exists, and it
/// names every one; it says they were not applied to a cluster here; README's "In containers" and
/// docs/placement.md link to it.
#[test]
fn the_document_and_the_examples_name_each_other() {
    let doc = read("docs/kubernetes.md");
    let named: BTreeSet<String> = doc
        .match_indices("examples/")
        .filter_map(|(at, _)| {
            let name: String = doc[at + "examples/".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            let name = name.trim_end_matches('.');
            name.ends_with(".yaml").then(|| name.to_owned())
        })
        .collect();
    let files: BTreeSet<String> = examples().into_iter().map(|e| e.name).collect();
    let absent: Vec<&String> = named.difference(&files).collect();
    assert!(absent.is_empty(), "docs/kubernetes.md names examples that do not exist: {absent:?}");
    let unnamed: Vec<&String> = files.difference(&named).collect();
    assert!(unnamed.is_empty(), "examples docs/kubernetes.md does not name: {unnamed:?}");
    assert!(doc.contains("not applied to a cluster"), "docs/kubernetes.md says they were not applied");
    let readme = read("README.md");
    let containers = readme.split("## In containers").nth(1).and_then(|s| s.split("\n## ").next());
    assert!(
        containers.expect("README has \"In containers\"").contains("(docs/kubernetes.md)"),
        "README's \"In containers\" links docs/kubernetes.md"
    );
    assert!(read("docs/placement.md").contains("(kubernetes.md)"), "docs/placement.md links kubernetes.md");
}

/// An example's name: its file's, without `.yaml`.
fn stem(file: &str) -> &str {
    file.trim_end_matches(".yaml").trim_end_matches(".yml")
}

/// Every container, init containers too, says how the node gets its image, and uses the node's copy where
/// the image is tagged `:latest`: with no policy, Kubernetes gives such an image `Always`, and the kubelet
/// pulls it from its registry (Docker Hub, for `simple-ipc:latest`) even where it was loaded on the node.
/// docs/kubernetes.md says how to load the image on a node, or push it, and which policy goes with each.
#[test]
fn every_container_uses_the_nodes_copy_of_the_image() {
    let mut containers = 0;
    for example in examples() {
        for spec in example.documents.iter().filter_map(pod_spec) {
            for container in containers_of(spec) {
                containers += 1;
                let at = format!("{}: container {}", example.name, str_at(container, "name").unwrap_or("?"));
                let image = str_at(container, "image").unwrap_or_else(|| panic!("{at}: no image"));
                let policy = str_at(container, "imagePullPolicy").unwrap_or_else(|| {
                    panic!("{at}: no imagePullPolicy, so {image} gets Always where it is tagged :latest")
                });
                assert!(
                    ["Always", "IfNotPresent", "Never"].contains(&policy),
                    "{at}: imagePullPolicy {policy}"
                );
                // The last path component's tag: `registry:5000/simple-ipc` has none (latest); a digest is not it.
                let last = image.rsplit('/').next().unwrap_or(image);
                let latest =
                    !last.contains('@') && last.split_once(':').is_none_or(|(_, tag)| tag == "latest");
                assert!(
                    !(latest && policy == "Always"),
                    "{at}: {image} with imagePullPolicy Always is pulled even where the node has it"
                );
            }
        }
    }
    assert!(containers >= 14, "{containers} containers in the examples");
    let doc = read("docs/kubernetes.md");
    for says in [
        "imagePullPolicy: IfNotPresent",
        "imagePullPolicy: Never",
        "imagePullPolicy: Always",
        "kind load docker-image",
        "minikube image load",
        "k3s ctr images import",
        "docker push",
    ] {
        assert!(doc.contains(says), "docs/kubernetes.md does not say how the image reaches a node: {says}");
    }
}

/// All the examples can be applied at once: no two objects of one kind share a name in one namespace, each
/// file's pods carry its name as `app.kubernetes.io/instance`, a `hostPath` is `/run/simple-ipc/` and its
/// file's name (so no two examples meet at one socket), and a pod's affinity to other pods selects pods of its
/// own file only: else a joiner could be put beside another example's server, on a node where its own
/// `hostPath` holds no socket.
#[test]
fn the_examples_can_be_applied_together() {
    let examples = examples();
    let mut objects: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
    let mut host_paths: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut pods: Vec<(&str, &Value)> = Vec::new();
    for example in &examples {
        let file = example.name.as_str();
        for document in &example.documents {
            let kind = str_at(document, "kind").unwrap_or("").to_owned();
            let metadata = document.get("metadata");
            let namespace = metadata.and_then(|m| str_at(m, "namespace")).unwrap_or("default").to_owned();
            let name = metadata.and_then(|m| str_at(m, "name")).unwrap_or("").to_owned();
            objects.entry((kind.clone(), namespace, name)).or_default().push(file.to_owned());
            let Some(spec) = pod_spec(document) else { continue };
            let labels =
                pod_labels(document).unwrap_or_else(|| panic!("{file}: a {kind} whose pods have no labels"));
            let instance = str_at(labels, "app.kubernetes.io/instance");
            assert_eq!(instance, Some(stem(file)), "{file}: its pods' label app.kubernetes.io/instance");
            pods.push((file, labels));
            if kind == "DaemonSet" {
                let selector = at_path(document, "spec.selector.matchLabels").and_then(Value::as_mapping);
                let selector = selector.unwrap_or_else(|| panic!("{file}: a DaemonSet without matchLabels"));
                assert!(
                    selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
                    "{file}: its selector, its pods"
                );
            }
            for volume in spec.get("volumes").and_then(Value::as_sequence).into_iter().flatten() {
                let path = volume.get("hostPath").and_then(|h| str_at(h, "path"));
                if let Some(path) = path.filter(|path| *path != TEXTFILE_DIRECTORY) {
                    assert_eq!(
                        path,
                        format!("/run/simple-ipc/{}", stem(file)),
                        "{file}: a hostPath of its own"
                    );
                    host_paths.entry(path.to_owned()).or_default().insert(file.to_owned());
                }
            }
        }
    }
    let twice: Vec<String> = objects
        .iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|((kind, namespace, name), files)| format!("{kind} {namespace}/{name}: {files:?}"))
        .collect();
    assert!(twice.is_empty(), "objects of one name in several places:\n{}", twice.join("\n"));
    let shared: Vec<_> = host_paths.iter().filter(|(_, files)| files.len() > 1).collect();
    assert!(shared.is_empty(), "hostPaths of several examples: {shared:?}");
    assert!(host_paths.len() >= 3, "the examples of two pods, each with its hostPath: {host_paths:?}");
    let mut selectors = 0;
    for example in &examples {
        for spec in example.documents.iter().filter_map(pod_spec) {
            let Some(affinity) = spec.get("affinity") else { continue };
            for selector in every_value(affinity).into_iter().filter_map(|v| v.get("labelSelector")) {
                selectors += 1;
                let at = format!("{}: the pod affinity {selector:?}", example.name);
                assert!(
                    selector.get("matchExpressions").is_none(),
                    "{at}: matchExpressions are not checked here"
                );
                let wanted = selector.get("matchLabels").and_then(Value::as_mapping);
                let wanted = wanted.unwrap_or_else(|| panic!("{at}: no matchLabels"));
                let selects =
                    |labels: &Value| wanted.iter().all(|(key, value)| labels.get(key) == Some(value));
                let files: BTreeSet<&str> =
                    pods.iter().filter(|(_, labels)| selects(labels)).map(|(file, _)| *file).collect();
                assert_eq!(files, BTreeSet::from([example.name.as_str()]), "{at}: the pods it selects");
            }
        }
    }
    assert!(selectors >= 2, "{selectors} pod affinities in the examples");
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
