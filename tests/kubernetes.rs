//! The Kubernetes examples (`examples/*.yaml`, shown by docs/kubernetes.md) are manifests that run the program
//! as it takes it: each parses as Kubernetes objects; each file of pods holds one served run (a server and the
//! joiners it waits for: its GPUs × `--procs-per-device`, at a socket both sides mount), which passes on
//! simulated GPUs with the containers' own arguments; every pod-spec field that a fix of the program names is
//! in an example; and the document and the examples name each other. No cluster runs here: what a cluster
//! would do with them is not tested.

mod common;

use std::collections::BTreeSet;
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

/// The kinds the examples may hold, with the API group version of each.
const KINDS: [(&str, &str); 6] = [
    ("Pod", "v1"),
    ("ConfigMap", "v1"),
    ("Deployment", "apps/v1"),
    ("Job", "batch/v1"),
    ("ResourceClaim", "resource.k8s.io/v1"),
    ("ResourceClaimTemplate", "resource.k8s.io/v1"),
];

fn str_at<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// The pod spec of a Pod, or of a Deployment's or Job's template.
fn pod_spec(document: &Value) -> Option<&Value> {
    match str_at(document, "kind")? {
        "Pod" => document.get("spec"),
        "Deployment" | "Job" => document.get("spec")?.get("template")?.get("spec"),
        _ => None,
    }
}

/// What a container runs of the program: the arguments of one `simple-ipc` invocation and how many
/// processes run it.
#[derive(Debug, Clone)]
struct Invocation {
    args: Vec<String>,
    processes: u32,
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
        _ if command.is_empty() => vec![Invocation { args, processes: 1 }],
        Some("simple-ipc" | "/usr/local/bin/simple-ipc") => {
            vec![Invocation { args: words[1..].to_vec(), processes: 1 }]
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
                    Invocation { args: rest.split_whitespace().map(str::to_owned).collect(), processes }
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

/// Checks what every object of an example must be, and returns the served run its pods hold, if it has pods.
fn served_run(example: &Example, entry_point: &[String]) -> Option<ServedRun> {
    let name = &example.name;
    assert!(!example.documents.is_empty(), "{name}: no manifest");
    let mut server: Option<(Vec<String>, u32, String)> = None;
    let mut joiners: Vec<(Invocation, Option<String>)> = Vec::new();
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
                } else {
                    let socket = value_of(&args, "--join")
                        .unwrap_or_else(|| panic!("{at}: neither --serve nor --join"));
                    let volume = mounted_at(index, spec, container, socket);
                    joiners.push((Invocation { args, processes: invocation.processes }, volume));
                }
            }
        }
    }
    if pods == 0 {
        return None;
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
    Some(ServedRun { server, gpus, joiners: joiners.into_iter().map(|(j, _)| j).collect() })
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

/// Every example parses as Kubernetes objects, and each one's pods hold a served run of the program that
/// passes on simulated GPUs with the containers' own arguments and as many joiners as the server waits for.
#[test]
fn each_example_is_a_served_run_the_program_takes() {
    let entry = entry_point();
    let examples = examples();
    assert!(examples.len() >= 6, "examples/: {} files", examples.len());
    let mut runs = 0;
    for example in &examples {
        if let Some(run) = served_run(example, &entry) {
            run_served(&example.name, &run);
            runs += 1;
        }
    }
    assert!(runs >= 5, "{runs} examples with a served run");
}

/// The texts of the fixes in Kubernetes' words: each `kubernetes:` string of the forecasts' fixes
/// (src/placement/), what a failed open says of Kubernetes (src/ipc/diagnose.rs), what a joiner that lacks
/// its GPU is told (src/attach.rs), and the Kubernetes column of docs/placement.md's table of least changes.
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
    for source in ["src/placement/forecast.rs", "src/placement/libraries.rs"] {
        let code = read(source);
        for (at, _) in code.match_indices("kubernetes:") {
            // A fix's field, set to a string literal (not the struct's declaration).
            let value = code[at + "kubernetes:".len()..].trim_start();
            if value.starts_with('"') {
                fixes.push((source.to_owned(), literal(value)));
            }
        }
    }
    for source in ["src/ipc/diagnose.rs", "src/attach.rs"] {
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
