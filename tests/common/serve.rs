//! Helpers of the served-run tests (`tests/serve_*.rs`): a process of the run with its output collected as
//! it comes, a socket path of the test's own, and a server and its joiners on simulated GPUs.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{FAULT, SIMULATE, bin};

/// A process of the run, its output collected on threads as it comes.
pub struct Running {
    pub child: Child,
    out: Arc<Mutex<String>>,
}

impl Running {
    pub fn start(gpus: &str, args: &[&str], fault: Option<&str>) -> Self {
        let mut command = Command::new(bin());
        command.args(args).env(SIMULATE, gpus).env_remove(FAULT).stdin(Stdio::null());
        if let Some(fault) = fault {
            command.env(FAULT, fault);
        }
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let out = Arc::new(Mutex::new(String::new()));
        for mut stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let out = Arc::clone(&out);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = stream.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    out.lock().unwrap().push_str(&String::from_utf8_lossy(&chunk[..n]));
                }
            });
        }
        Self { child, out }
    }

    pub fn text(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    pub fn wait_for(&self, needle: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.text().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    /// Waits for the end (up to `limit`); the exit status and everything it printed.
    pub fn end(mut self, limit: Duration) -> (Option<i32>, String, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(20)); // the output threads drain
                return (status.code(), self.text(), start.elapsed());
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return (None, format!("(did not end within {limit:?}) {}", self.text()), start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A fresh socket path of this test's own, `run.sock` in a directory (mode 0700) that is removed with all
/// it holds when the returned guard drops.
pub fn socket_path(name: &str) -> (tempfile::TempDir, String) {
    let dir = super::scratch(&format!("serve-{name}"));
    let socket = dir.path().join("run.sock").display().to_string();
    (dir, socket)
}

pub fn serve(gpus: &str, socket: &str, args: &[&str]) -> Running {
    let mut all = vec!["--serve", socket];
    all.extend_from_slice(args);
    let server = Running::start(gpus, &all, None);
    assert!(server.wait_for("waiting for", Duration::from_secs(10)), "the server serves: {}", server.text());
    server
}

pub fn join(gpus: &str, socket: &str, fault: Option<&str>) -> Running {
    Running::start(gpus, &["--join", socket], fault)
}

pub const LIMIT: Duration = Duration::from_secs(20);
