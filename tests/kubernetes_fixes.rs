//! The Kubernetes examples show what the program advises: every pod-spec field that a fix names in
//! Kubernetes' words (the forecasts', the failure diagnoses', a joiner's that lacks its GPU,
//! docs/placement.md's table of least changes) is in an example, and the check misses one taken out.

mod common;

use std::collections::BTreeSet;

use common::kubernetes::{Example, at_path, env_of, every_value, examples, pod_spec, read, str_at};
use serde_yaml::Value;

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
