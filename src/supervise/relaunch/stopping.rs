//! Stopping the processes this program started, together, as each one's [`OnDrop`] says: what a dropped
//! [`Process`] does, and what a caller that holds several does at once so that their graces overlap.

use std::time::Instant;

use nix::sys::signal::Signal;

use super::{LOOK, OnDrop, Process};

/// Stops these processes together, each as its [`OnDrop`] says, the graces running at once: its stop signal
/// to each, then each still there when its grace is over is killed and reaped (or left). Returns, in their
/// order, whether each had to be killed.
pub(crate) fn stop_all<'a>(processes: impl IntoIterator<Item = &'a mut Process>) -> Vec<bool> {
    let mut processes: Vec<&mut Process> = processes.into_iter().collect();
    for process in &mut processes {
        match process.on_drop {
            OnDrop::Stop { signal: Some(signal), .. } => process.signal(signal),
            // One stopped by hand (SIGSTOP) would stay stopped for good once left: it is continued first.
            OnDrop::Leave { .. } => process.signal(Signal::SIGCONT),
            OnDrop::Stop { signal: None, .. } => {}
        }
    }
    let start = Instant::now();
    let mut killed = vec![false; processes.len()];
    loop {
        let now = start.elapsed();
        let mut waiting = false;
        for (process, killed) in processes.iter_mut().zip(&mut killed) {
            if process.try_wait().is_some() {
                continue;
            }
            match process.on_drop {
                OnDrop::Stop { grace, .. } if now >= grace => {
                    process.kill_all();
                    *killed = true;
                }
                OnDrop::Leave { within } if now >= within => {}
                _ => waiting = true,
            }
        }
        // Reaped once every one due has its SIGKILL: they tear down at once (a GPU context takes a while).
        for (process, _) in processes.iter_mut().zip(&killed).filter(|(_, killed)| **killed) {
            process.wait();
        }
        if !waiting {
            return killed;
        }
        std::thread::sleep(LOOK);
    }
}
