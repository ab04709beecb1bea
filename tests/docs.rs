//! What the docs show is what the program does: each example of docs/json.md is compared, key by key and
//! in order, with the document the command of its heading writes on simulated GPUs.

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{FAULT, SIMULATE, bin, text};
use common::{at_socket, value_of};

fn read_doc(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A JSON value that keeps its objects' keys in the order written (serde_json's `Value` sorts them).
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Integer(i128),
    Float(f64),
    Text(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl<'de> serde::Deserialize<'de> for Json {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> serde::de::Visitor<'de> for InOrder {
            type Value = Json;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_none<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
                Ok(Json::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
                Ok(Json::Integer(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
                Ok(Json::Integer(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
                Ok(Json::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Json, E> {
                Ok(Json::Text(v.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Json::Array(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Json::Object(entries))
            }
        }
        deserializer.deserialize_any(InOrder)
    }
}

impl Json {
    fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "boolean",
            Json::Integer(_) => "integer",
            Json::Float(_) => "number with a fraction",
            Json::Text(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }
}

/// The example's way of leaving something out: `"..."` as a value (or as an array's only element) stands
/// for anything, and a key `"..."` for any other keys of that object.
const ELIDED: &str = "...";

/// Values that differ from run to run and host to host, so that only their type is compared: every number
/// with a fraction (times and rates), and these.
const MEASURED: [&str; 3] = ["descriptors_before_open", "descriptors_after_close", "mps"];

/// Compares an example with the program's document: the same keys in the same order (all of them, unless
/// the example has a key `"..."`), the same types, and the same values except measurements.
fn compare(at: &str, example: &Json, actual: &Json, key: &str, problems: &mut Vec<String>) {
    match (example, actual) {
        (Json::Text(t), _) if t == ELIDED => {}
        (Json::Array(items), Json::Array(_)) if matches!(&items[..], [Json::Text(t)] if t == ELIDED) => {}
        (Json::Object(shown), Json::Object(written)) => {
            let elided = shown.iter().any(|(k, _)| k == ELIDED);
            let shown: Vec<&(String, Json)> = shown.iter().filter(|(k, _)| k != ELIDED).collect();
            let written_keys: Vec<&str> = written.iter().map(|(k, _)| k.as_str()).collect();
            let shown_keys: Vec<&str> = shown.iter().map(|(k, _)| k.as_str()).collect();
            // In order: each key shown comes after the one before it in the document.
            let mut from = 0;
            for (k, value) in &shown {
                match written_keys[from..].iter().position(|w| w == k) {
                    Some(i) => {
                        from += i + 1;
                        let (_, written_value) = &written[from - 1];
                        compare(&format!("{at}.{k}"), value, written_value, k, problems);
                    }
                    None if written_keys.contains(&k.as_str()) => problems
                        .push(format!("{at}: key {k:?} out of order: the program writes {written_keys:?}")),
                    None => problems.push(format!("{at}: key {k:?} is not in the program's document")),
                }
            }
            if !elided {
                for w in &written_keys {
                    if !shown_keys.contains(w) {
                        problems.push(format!("{at}: the program writes key {w:?}, which the example lacks"));
                    }
                }
            }
        }
        (Json::Array(shown), Json::Array(written)) => {
            if shown.len() != written.len() {
                problems.push(format!(
                    "{at}: {} elements in the example, {} in the program's document",
                    shown.len(),
                    written.len()
                ));
            }
            for (i, (s, w)) in shown.iter().zip(written).enumerate() {
                compare(&format!("{at}[{i}]"), s, w, key, problems);
            }
        }
        (s, w) if s.kind() != w.kind() => problems.push(format!(
            "{at}: a {} in the example ({s:?}), a {} in the document ({w:?})",
            s.kind(),
            w.kind()
        )),
        (Json::Float(_), Json::Float(_)) => {}
        (_, _) if MEASURED.contains(&key) => {}
        (s, w) => {
            if s != w {
                problems.push(format!("{at}: {s:?} in the example, {w:?} in the program's document"));
            }
        }
    }
}

/// What a heading says to run: the environment's assignments, the arguments, and the exit status.
struct Invocation {
    env: Vec<(String, String)>,
    args: Vec<String>,
    code: i32,
}

/// One example: the heading it is under, and its JSON.
struct Example {
    heading: String,
    json: String,
}

/// Every ```json block of `markdown`, with the `###` heading above it.
fn json_blocks(markdown: &str) -> Vec<Example> {
    let mut examples = Vec::new();
    let mut heading = String::new();
    let mut block: Option<String> = None;
    for line in markdown.lines() {
        match &mut block {
            Some(json) if line.trim_start().starts_with("```") => {
                examples.push(Example { heading: heading.clone(), json: std::mem::take(json) });
                block = None;
            }
            Some(json) => {
                json.push_str(line);
                json.push('\n');
            }
            None if line.trim_start().starts_with("```json") => block = Some(String::new()),
            None if line.starts_with('#') => heading = line.to_owned(),
            None => {}
        }
    }
    examples
}

/// The command a heading names: the code span that runs `simple-ipc`, as environment assignments and
/// arguments; and the exit status after `exit`.
fn command_of(heading: &str) -> Option<Invocation> {
    let span = heading.split('`').skip(1).step_by(2).find(|span| span.contains("simple-ipc "))?;
    let words: Vec<&str> = span.split_whitespace().collect();
    let program = words.iter().position(|w| *w == "simple-ipc")?;
    let env = words[..program]
        .iter()
        .map(|w| w.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect::<Option<Vec<_>>>()?;
    let args = words[program + 1..].iter().map(|w| (*w).to_owned()).collect();
    let code = heading.rsplit_once("exit ")?.1.trim().trim_end_matches(|c: char| !c.is_ascii_digit());
    Some(Invocation { env, args, code: code.parse().ok()? })
}

/// Runs the example's command on simulated GPUs with `--json` into `dir`; a heading that says SIGTERM gets
/// one once every process has started. `None` where an `--isolate` example cannot run here (skipped).
fn document_of(example: &Example, dir: &Path) -> Option<Json> {
    let Invocation { env, mut args, code } = command_of(&example.heading)
        .unwrap_or_else(|| panic!("no command in the heading {:?}", example.heading));
    let json: PathBuf = dir.join("example.json");
    let at = args
        .iter()
        .position(|a| a == "--json")
        .unwrap_or_else(|| panic!("no --json in {:?}", example.heading));
    args[at + 1] = json.display().to_string();
    let mut command = Command::new(bin());
    command.env_remove(SIMULATE).env_remove(FAULT).args(&args).stdin(Stdio::null());
    for (k, v) in &env {
        command.env(k, v);
    }
    let out = if example.heading.contains("SIGTERM") {
        let mut child =
            command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("the binary starts");
        let stderr = child.stderr.take();
        let started = common::wait_for_lines(&mut child, "Starting on device", 1, Duration::from_secs(10));
        assert_eq!(started, 1, "{}: the run did not start", example.heading);
        std::thread::sleep(Duration::from_millis(300));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM to the run");
        let status = child.wait().expect("the run ends");
        let mut err = Vec::new();
        if let Some(mut stderr) = stderr {
            let _ = std::io::Read::read_to_end(&mut stderr, &mut err);
        }
        Output { status, stdout: Vec::new(), stderr: err }
    } else {
        command.output().expect("the binary starts")
    };
    if example.heading.contains("--isolate") && code != 2 && out.status.code() == Some(2) {
        common::skipped(
            "namespaces",
            format!("{}: this host gives no namespaces: {}", example.heading, text(&out)),
        );
        return None;
    }
    assert_eq!(out.status.code(), Some(code), "{}: {}", example.heading, text(&out));
    let written = std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("{}: {e}", example.heading));
    let document =
        serde_json::from_str(&written).unwrap_or_else(|e| panic!("{}: {e}: {written}", example.heading));
    Some(document)
}

/// Every example of docs/json.md is what its heading's command writes: each key of the example in the
/// program's document, in the same order, and each key of the document in the example (where the example
/// does not say `"..."`), with the same types and, but for measurements, the same values.
#[test]
fn json_examples_are_what_the_program_writes() {
    let examples = json_blocks(&read_doc("docs/json.md"));
    assert!(examples.len() >= 6, "docs/json.md has {} examples", examples.len());
    let mut report = String::new();
    for example in &examples {
        let shown: Json = serde_json::from_str(&example.json).unwrap_or_else(|e| {
            panic!("{}: the example is not JSON: {e}\n{}", example.heading, example.json)
        });
        let dir = common::scratch("docs-json");
        let Some(written) = document_of(example, dir.path()) else { continue };
        let mut problems = Vec::new();
        compare("", &shown, &written, "", &mut problems);
        if !problems.is_empty() {
            let _ = writeln!(report, "{}:\n  {}", example.heading, problems.join("\n  "));
        }
    }
    assert!(report.is_empty(), "docs/json.md's examples are not what the program writes:\n{report}");
}

/// The comparison itself finds what it must: a key missing, a key too many, keys out of order, a value
/// that differs; and lets measurements and what an example leaves out be.
#[test]
fn the_comparison_notices_each_difference() {
    let json = |text: &str| -> Json { serde_json::from_str(text).unwrap() };
    let differences = |shown: &str, written: &str| {
        let mut problems = Vec::new();
        compare("", &json(shown), &json(written), "", &mut problems);
        problems.len()
    };
    let written = r#"{"status": "passed", "a": 1, "b": {"t": 0.5, "u": [1, 2]}, "mps": "x"}"#;
    assert_eq!(
        differences(r#"{"status": "passed", "a": 1, "b": {"t": 9.25, "u": [1, 2]}, "mps": "y"}"#, written),
        0
    );
    assert_eq!(differences(r#"{"status": "passed", "a": 1, "...": "..."}"#, written), 0);
    assert_eq!(differences(r#"{"status": "passed", "b": {"...": "..."}, "...": "..."}"#, written), 0);
    assert_eq!(differences(r#"{"status": "passed", "b": "...", "a": 1, "...": "..."}"#, written), 1, "order");
    assert_eq!(differences(r#"{"status": "passed", "a": 1, "b": "..."}"#, written), 1, "mps missing");
    assert_eq!(differences(r#"{"status": "failed", "...": "..."}"#, written), 1, "a fixed value");
    assert_eq!(differences(r#"{"a": 1.5, "...": "..."}"#, written), 1, "a type");
    assert_eq!(differences(r#"{"a": 1, "c": null, "...": "..."}"#, written), 1, "a key too many");
    assert_eq!(differences(r#"{"b": {"u": [1], "...": "..."}, "...": "..."}"#, written), 1, "an element");
}

/// The arguments of the program in each `docker run` of the ```sh blocks of `markdown`: the words after the
/// first `simple-ipc` (the image's entry point, or the program named after the image), a command continued
/// over lines with `\` taken whole, a comment or a trailing `&` or `;` left out.
fn docker_runs(markdown: &str) -> Vec<Vec<String>> {
    let mut runs = Vec::new();
    let mut in_sh = false;
    let mut command = String::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_sh = !in_sh && line.trim_start().starts_with("```sh");
            continue;
        }
        if !in_sh {
            continue;
        }
        let line = line.split(" #").next().unwrap_or("").trim();
        match line.strip_suffix('\\') {
            Some(continued) if !command.is_empty() || continued.contains("docker run") => {
                command.push_str(continued);
                command.push(' ');
                continue;
            }
            _ => command.push_str(line),
        }
        let whole = std::mem::take(&mut command);
        let Some((_, after)) = whole.split_once("docker run ") else { continue };
        let words: Vec<&str> = after.split_whitespace().map(|w| w.trim_end_matches([';', '&'])).collect();
        if let Some(program) = words.iter().position(|w| *w == "simple-ipc") {
            let args = words[program + 1..].iter().take_while(|w| !w.is_empty()).map(|w| (*w).to_owned());
            runs.push(args.collect());
        }
    }
    runs
}

/// README's served run in containers, on 1, 2 and 3 simulated GPUs: the server says how many processes it
/// waits for, README's formula (the GPUs it chose × `--procs-per-device`), and that many of README's joiners
/// make the run pass.
#[test]
fn readmes_served_recipe_holds_on_any_number_of_gpus() {
    let readme = read_doc("README.md");
    let section = readme.split("## In containers").nth(1).expect("README has \"In containers\"");
    let runs = docker_runs(section);
    let serve = runs.iter().find(|a| a.iter().any(|w| w == "--serve")).expect("README serves a run");
    let join = runs.iter().find(|a| a.iter().any(|w| w == "--join")).expect("README joins it");
    assert!(
        section.contains("the number of GPUs it chose × `--procs-per-device`"),
        "README says how many joiners the server waits for"
    );
    let per_device: u32 = value_of(serve, "--procs-per-device").map_or(1, |n| n.parse().expect("a number"));
    for gpus in 1..=3u32 {
        let dir = common::scratch("docs-recipe");
        let socket = dir.path().join("run.sock");
        let simulated = vec!["ok"; gpus as usize].join(",");
        let mut server = Command::new(bin())
            .args(at_socket(serve, &socket))
            .env(SIMULATE, &simulated)
            .env_remove(FAULT)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the server starts");
        let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stdout = server.stdout.take().expect("piped");
        let reader = {
            let said = std::sync::Arc::clone(&said);
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                    let mut said = said.lock().unwrap_or_else(|p| p.into_inner());
                    said.push_str(&line);
                    said.push('\n');
                }
            })
        };
        let start = std::time::Instant::now();
        let waits_for = loop {
            let text = said.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let count =
                text.split_once("waiting for ").and_then(|(_, rest)| rest.split(' ').next()?.parse().ok());
            if let Some(count) = count {
                break count;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{gpus} GPUs: the server never served: {text}"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(
            waits_for,
            gpus * per_device,
            "{gpus} GPUs: the server waits for GPUs × --procs-per-device"
        );
        let joiners: Vec<_> = (0..waits_for)
            .map(|_| {
                let mut joiner = Command::new(bin());
                joiner.args(at_socket(join, &socket)).env(SIMULATE, &simulated).env_remove(FAULT);
                std::thread::spawn(move || common::run(&mut joiner))
            })
            .collect();
        for joiner in joiners {
            let out = joiner.join().expect("the joiner's thread");
            assert_eq!(out.status.code(), Some(0), "{gpus} GPUs: a joiner: {}", text(&out));
        }
        let status = server.wait().expect("the server ends");
        let _ = reader.join();
        let said = said.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(status.code(), Some(0), "{gpus} GPUs: the server: {said}");
    }
}

/// The rows of the first markdown table in `text` whose header starts with `header`: each row's cells.
fn table(text: &str, header: &str) -> Vec<Vec<String>> {
    let cells = |line: &str| -> Vec<String> {
        line.trim().trim_matches('|').split('|').map(|cell| cell.trim().to_owned()).collect()
    };
    text.lines()
        .skip_while(|line| !line.starts_with(&format!("| {header}")))
        .take_while(|line| line.starts_with('|'))
        .filter(|line| !line.starts_with("| ---"))
        .map(cells)
        .collect()
}

/// The rows that scripts/gpu-check.sh wants of the container matrix on a GPU host: `title=cell|cell|...`
/// in its here-document, with its variables as it sets them without simulation.
fn gpu_check_rows() -> Vec<Vec<String>> {
    let script = read_doc("scripts/gpu-check.sh");
    let variable = |name: &str| -> String {
        let line = script
            .lines()
            .find_map(|line| line.trim().strip_prefix(&format!("{name}=\"")))
            .unwrap_or_else(|| panic!("gpu-check.sh sets {name}"));
        line.split('"').next().unwrap_or("").to_owned()
    };
    let expected = script.split("<<EOT\n").nth(1).and_then(|rest| rest.split("\nEOT").next());
    expected
        .expect("gpu-check.sh has the matrix's rows")
        .lines()
        .map(|line| {
            let (title, cells) = line.split_once('=').expect("title=cells");
            let cells = match cells.strip_prefix('$') {
                Some(name) => variable(name),
                None => cells.to_owned(),
            };
            std::iter::once(title.to_owned()).chain(cells.split('|').map(str::to_owned)).collect()
        })
        .collect()
}

/// The container matrix is one table, in docs/measurements.md, in the program's words: its rows and
/// cells are those the GPU check wants on the H200 host, its row and column titles and its cells those of
/// the program's own matrix (on the simulation, which models that host; but for what it says it does not
/// simulate); README links to it and has no copy.
#[test]
fn the_container_matrix_is_one_table_in_the_programs_words() {
    let header = "importer vs exporter";
    let readme = read_doc("README.md");
    assert!(
        table(&readme, header).is_empty(),
        "README has a copy of the matrix: one table, in measurements.md"
    );
    assert!(readme.contains("(docs/measurements.md#in-containers---serve-and---join)"), "README links to it");
    let measured = table(&read_doc("docs/measurements.md"), header);
    let (titles, rows) = measured.split_first().expect("docs/measurements.md has the matrix");
    assert_eq!(rows, gpu_check_rows(), "docs/measurements.md's matrix is what scripts/gpu-check.sh wants");

    let dir = common::scratch("docs-matrix");
    let json = dir.path().join("matrix.json");
    // Its cells' runs are pid 2 in their namespaces: a /dev/shm of their own, where one can be made.
    let shm = common::OwnDevShm::where_possible();
    let out = common::run(
        common::simulated_in(shm.as_ref(), "ok")
            .args(["--ipc", "all", "--isolate", "container,user", "--quiet", "--json"])
            .arg(&json),
    );
    if out.status.code() == Some(2) {
        common::skipped("namespaces", format!("the_container_matrix_is_one_table: {}", text(&out)));
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc = common::document(&json);
    let cells = doc["matrix"].as_array().expect("the matrix");
    let at = |boundary: &str, handle: &str| {
        cells
            .iter()
            .find(|c| c["boundary"] == boundary && c["handle"] == handle)
            .unwrap_or_else(|| panic!("the program's matrix has no cell {boundary:?} / {handle:?}: {doc}"))
    };
    for row in rows {
        for (handle, shown) in titles[1..].iter().zip(&row[1..]) {
            let cell = at(&row[0], handle);
            let said = match cell["result"].as_str() {
                Some("failed") => {
                    let error = cell["error"].as_str().unwrap_or("?").trim_start_matches("CUDA_ERROR_");
                    let event = if cell["event_refused"] == true { " (event)" } else { "" };
                    format!("{error}{event}")
                }
                Some("not_simulated") => continue,
                other => other.unwrap_or("?").to_owned(),
            };
            assert_eq!(&said, shown, "{} / {handle}: the simulation says {said}, the table {shown}", row[0]);
        }
    }
}

/// README's commands call the program `simple-ipc`, which is on PATH only once installed: README says how
/// before its first such command.
#[test]
fn readme_installs_simple_ipc_before_it_calls_it() {
    let readme = read_doc("README.md");
    let install = readme.find("cargo install --path .").expect("README says how to install simple-ipc");
    let first_call = readme.find("`simple-ipc -").or(readme.find("\nsimple-ipc ")).unwrap_or(usize::MAX);
    assert!(install < first_call, "README calls simple-ipc before it says how to install it");
}

/// The highest `GLIBC_2.N` version an ELF binary needs, from its version needs (`.gnu.version_r`, whose
/// names are in the string table it links to): what `objdump -T` shows, read without objdump.
fn highest_glibc_needed(elf: &[u8]) -> Option<(u32, u32)> {
    let u16_at =
        |at: usize| -> Option<u64> { Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?).into()) };
    let u32_at =
        |at: usize| -> Option<u64> { Some(u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?).into()) };
    let u64_at =
        |at: usize| -> Option<u64> { Some(u64::from_le_bytes(elf.get(at..at + 8)?.try_into().ok()?)) };
    // ELF64, little-endian (x86-64 and aarch64 Linux).
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (sections, size, count) = (u64_at(0x28)? as usize, u16_at(0x3a)? as usize, u16_at(0x3c)? as usize);
    let header = |i: usize| sections + i * size;
    const SHT_GNU_VERNEED: u64 = 0x6fff_fffe;
    let verneed = (0..count).find(|&i| u32_at(header(i) + 4) == Some(SHT_GNU_VERNEED))?;
    let (offset, link) = (u64_at(header(verneed) + 0x18)? as usize, u32_at(header(verneed) + 0x28)? as usize);
    let strings = u64_at(header(link) + 0x18)? as usize;
    let name = |at: usize| -> Option<&str> {
        let bytes = elf.get(strings + at..)?;
        std::str::from_utf8(&bytes[..bytes.iter().position(|&b| b == 0)?]).ok()
    };
    let mut highest = None;
    let mut entry = offset;
    loop {
        // Elf64_Verneed: vn_version, vn_cnt (u16), vn_file, vn_aux, vn_next (u32).
        let (needs, mut aux) = (u16_at(entry + 2)?, entry + u32_at(entry + 8)? as usize);
        for _ in 0..needs {
            // Elf64_Vernaux: vna_hash (u32), vna_flags, vna_other (u16), vna_name, vna_next (u32).
            if let Some(version) = name(u32_at(aux + 8)? as usize).and_then(|n| n.strip_prefix("GLIBC_")) {
                let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
                if let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) {
                    highest = highest.max(Some((major, minor)));
                }
            }
            aux += u32_at(aux + 12)? as usize;
        }
        match u32_at(entry + 12)? {
            0 => return highest,
            next => entry += next as usize,
        }
    }
}

/// `2.39` as (2, 39).
fn glibc_version(text: &str) -> (u32, u32) {
    let (major, minor) = text.trim().split_once('.').unwrap_or_else(|| panic!("a glibc version: {text:?}"));
    (major.parse().expect("a number"), minor.parse().expect("a number"))
}

/// The Dockerfile's stages: each `FROM` line's image, and the `# glibc: X.Y` said under it.
fn docker_stages(dockerfile: &str) -> Vec<(String, Option<(u32, u32)>)> {
    let mut stages: Vec<(String, Option<(u32, u32)>)> = Vec::new();
    for line in dockerfile.lines() {
        if let Some(from) = line.strip_prefix("FROM ") {
            stages.push((from.split_whitespace().next().unwrap_or("").to_owned(), None));
        } else if let (Some(glibc), Some(stage)) = (line.strip_prefix("# glibc: "), stages.last_mut()) {
            stage.1 = Some(glibc_version(glibc));
        }
    }
    stages
}

/// The image's binary runs on its base image: the binary built here needs no newer glibc than the base
/// image has (as the Dockerfile says it, in a comment and a label, which must agree), nor does any binary
/// built in the build stage (whose glibc is older); the build stage's Rust is Cargo.toml's rust-version.
#[test]
fn the_images_base_has_the_glibc_the_binary_needs() {
    let dockerfile = read_doc("Dockerfile");
    let stages = docker_stages(&dockerfile);
    let [(build, Some(built_with)), (base, Some(has))] = &stages[..] else {
        panic!("the Dockerfile has a build stage and a runtime stage, each with its glibc: {stages:?}")
    };
    assert!(base.starts_with("nvidia/cuda:"), "an NVIDIA CUDA base image: {base}");
    let label = dockerfile.split("simple-ipc.base-glibc=\"").nth(1).and_then(|l| l.split('"').next());
    assert_eq!(label.map(glibc_version), Some(*has), "the label says the base image's glibc too");
    assert!(built_with <= has, "the build stage's glibc {built_with:?} is newer than the base's {has:?}");
    let manifest = read_doc("Cargo.toml");
    let rust =
        manifest.lines().find_map(|l| l.strip_prefix("rust-version = \"")).and_then(|v| v.split('"').next());
    assert_eq!(build.strip_prefix("rust:").and_then(|t| t.split('-').next()), rust, "{build}: rust-version");

    let binary = std::fs::read(bin()).expect("the binary");
    let needed = highest_glibc_needed(&binary).expect("the binary's glibc version needs");
    assert!(
        needed >= (2, 2) && needed <= *has,
        "the binary needs GLIBC_{needed:?}, the base image has {has:?}"
    );
    // objdump, where there is one, reads the same.
    if let Ok(out) = Command::new("objdump").arg("-T").arg(bin()).output()
        && out.status.success()
    {
        let dump = String::from_utf8_lossy(&out.stdout);
        let highest = dump
            .split("GLIBC_")
            .skip(1)
            .filter_map(|rest| {
                let version: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
                let (major, minor) = version.split_once('.')?;
                Some((major.parse::<u32>().ok()?, minor.split('.').next()?.parse::<u32>().ok()?))
            })
            .max();
        assert_eq!(highest, Some(needed), "objdump -T and the version needs agree");
    }
}

/// Runs the program with `args` (a socket or `--json` file moved into `dir`) on a simulated GPU, and says
/// whether the program took them: it did not end with a usage error (a run that goes on, a server waiting
/// for joiners, is stopped after a while).
fn takes(args: &[String], dir: &Path) -> Result<(), String> {
    let mut args = at_socket(args, &dir.join("run.sock"));
    if let Some(i) = args.iter().position(|a| a == "--json") {
        args[i + 1] = dir.join("run.json").display().to_string();
    }
    let mut child = Command::new(bin())
        .args(&args)
        .env(SIMULATE, "ok")
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        if start.elapsed() > Duration::from_secs(3) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if status.is_none() {
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = child.wait();
    }
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
    }
    match status {
        Some(status) if status.code() == Some(1) && err.contains("Usage:") => Err(err),
        _ => Ok(()),
    }
}

/// The image runs the program (its entry point) with the Dockerfile's `CMD`, or with the arguments of
/// README's `docker run` commands: every one of them is an invocation the program takes.
#[test]
fn the_images_commands_are_the_programs_own() {
    let dockerfile = read_doc("Dockerfile");
    let json_array = |directive: &str| -> Vec<String> {
        let line = dockerfile.lines().find_map(|l| l.strip_prefix(&format!("{directive} "))).unwrap_or("[]");
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{directive} {line}: {e}"))
    };
    assert_eq!(json_array("ENTRYPOINT"), ["simple-ipc"], "the image's entry point is the program");
    assert!(dockerfile.contains("/usr/local/bin/simple-ipc"), "on the base image's PATH");
    let readme = read_doc("README.md");
    let runs = docker_runs(&readme);
    assert!(runs.len() >= 6, "README's docker runs: {runs:?}");
    for args in std::iter::once(json_array("CMD")).chain(runs) {
        let dir = common::scratch("docs-image");
        if let Err(usage) = takes(&args, dir.path()) {
            panic!("docker run ... simple-ipc {}: not the program's invocation: {usage}", args.join(" "));
        }
    }
}
