//! The Kubernetes examples as manifests: every container uses the node's copy of the image; all the files
//! can be applied at once (names, hostPaths and the joiners' affinity are each example's own); and
//! docs/kubernetes.md and the examples name each other.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::kubernetes::{
    TEXTFILE_DIRECTORY, at_path, containers_of, every_value, examples, pod_spec, read, str_at,
};
use serde_yaml::Value;

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
