//! A served run keeps where its processes stand however it ends: one that fails before its last joiner
//! joined still prints, and documents, the place and forecast of those that did, beside what happened.

mod common;

use std::process::Stdio;

use common::{FAULT, SIMULATE};

/// Two simulated GPUs, so two joiners; the first, with a /dev/shm of its own, fails at its first event
/// (CUDA_ERROR_MAP_FAILED) before the second joins: the forecast of the one that joined is in the output
/// and the document, and it said so (the failing path was forecast to fail).
#[test]
fn a_served_run_that_fails_before_its_last_joiner_keeps_the_forecast_of_those_that_joined() {
    let Some(shm) = common::OwnDevShm::new("a_served_run_that_fails_before_its_last_joiner") else { return };
    let dir = common::scratch("early-placement");
    let socket = dir.path().join("run.sock").display().to_string();
    let json = dir.path().join("run.json");
    let server = common::simulated("ok,ok")
        .args(["--serve", &socket, "--timeout", "20", "--json"])
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The server listens before it exports; a joiner started early waits for it.
    let joiner = shm
        .enter(&common::bin())
        .args(["--join", &socket])
        .env(SIMULATE, "ok,ok")
        .env_remove(FAULT)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(joiner.status.code(), Some(1), "{}", common::text(&joiner));
    let out = server.wait_with_output().unwrap();
    let said = common::text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("Only 1 of the 2 processes joined before the run ended"), "{said}");
    assert!(said.contains("Where the processes stand (the server is pid "), "{said}");
    assert!(said.contains("legacy event: fails (CUDA_ERROR_MAP_FAILED)"), "{said}");
    assert!(
        said.contains("legacy event: forecast fails (CUDA_ERROR_MAP_FAILED), the driver refused it"),
        "{said}"
    );
    let document = common::document(&json);
    let processes = document["placement"]["processes"].as_array().cloned().unwrap_or_default();
    assert_eq!(processes.len(), 1, "the one that joined: {document}");
    let event =
        processes[0]["forecast"].as_array().unwrap().iter().find(|f| f["path"] == "legacy event").cloned();
    assert_eq!(
        event.map(|e| e["detail"].clone()),
        Some(serde_json::json!("CUDA_ERROR_MAP_FAILED")),
        "{document}"
    );
    let against = document["placement"]["against"].as_array().cloned().unwrap_or_default();
    assert!(against.iter().any(|a| a["path"] == "legacy event" && a["agrees"] == true), "{document}");
}
