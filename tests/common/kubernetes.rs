//! Helpers of the Kubernetes examples' tests (`tests/kubernetes_*.rs`): the files of examples/ parsed into
//! their YAML documents, and what a pod spec holds (its containers, their environment) or any value at a
//! path of keys.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml::Value;

pub fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One file of examples/: its name and its YAML documents.
pub struct Example {
    pub name: String,
    pub documents: Vec<Value>,
}

/// Every `examples/*.yaml`, by name, each parsed into its documents.
pub fn examples() -> Vec<Example> {
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
pub const TEXTFILE_DIRECTORY: &str = "/var/lib/node_exporter/textfile_collector";

pub fn str_at<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// The pod spec of a Pod, or of a Deployment's, DaemonSet's or Job's template.
pub fn pod_spec(document: &Value) -> Option<&Value> {
    match str_at(document, "kind")? {
        "Pod" => document.get("spec"),
        "Deployment" | "DaemonSet" | "Job" => document.get("spec")?.get("template")?.get("spec"),
        _ => None,
    }
}

/// Every container of a pod spec, its init containers included, with its name.
pub fn containers_of(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .filter_map(|key| spec.get(key).and_then(Value::as_sequence))
        .flatten()
        .collect()
}

pub fn env_of(container: &Value, name: &str) -> Option<String> {
    container.get("env")?.as_sequence()?.iter().find_map(|variable| {
        (str_at(variable, "name") == Some(name)).then(|| str_at(variable, "value").unwrap_or("").to_owned())
    })
}

/// Every value in `value`, itself included, depth first.
pub fn every_value(value: &Value) -> Vec<&Value> {
    let mut all = vec![value];
    match value {
        Value::Mapping(map) => all.extend(map.values().flat_map(every_value)),
        Value::Sequence(items) => all.extend(items.iter().flat_map(every_value)),
        _ => {}
    }
    all
}

/// The value at a dotted path of keys from `value`.
pub fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, key| v.get(key))
}
