//! Progress on long work (the benchmark's pairs and sizes, `--ipc all`'s mechanisms): one bar on standard
//! error, drawn by indicatif, only while standard error is a terminal and the run is not `--quiet`. Anywhere
//! else a [`Bar`] is a no-op, so that logs, pipes and the `--json` document never see a byte of it. It uses
//! nothing of the crate: `output` calls [`suspend`] for every write.
//!
//! While a bar is drawn, every line the program writes goes through [`suspend`], which takes the bar off the
//! terminal for the write and draws it again below: the bar never splits a line.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::sync::{Mutex, MutexGuard};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bar drawn now, if any: the one that [`suspend`] takes off the terminal.
static DRAWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn drawn() -> MutexGuard<'static, Option<ProgressBar>> {
    // A panic elsewhere ends the process (see `entry`), so a poisoned lock still holds a consistent value.
    DRAWN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A bar of `len` steps; dropped, it is taken off the terminal.
pub struct Bar(Option<ProgressBar>);

impl Bar {
    /// A bar for `len` steps of the work `what` (`--bench`, `--ipc all`), drawn where standard error is a
    /// terminal and the run is not `quiet`; a no-op anywhere else.
    pub fn start(len: u64, what: &str, quiet: bool) -> Self {
        if quiet || !std::io::stderr().is_terminal() {
            return Self(None);
        }
        let style = ProgressStyle::with_template("{prefix} [{bar:24}] {pos}/{len} {elapsed} {wide_msg}")
            .map(|style| style.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
            .with_style(style)
            .with_prefix(what.to_owned());
        bar.tick();
        *drawn() = Some(bar.clone());
        Self(Some(bar))
    }

    /// Says what the work is doing now.
    pub fn doing(&self, what: impl Into<Cow<'static, str>>) {
        if let Some(bar) = &self.0 {
            bar.set_message(what);
        }
    }

    /// One step done.
    pub fn step_done(&self) {
        if let Some(bar) = &self.0 {
            bar.inc(1);
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(bar) = self.0.take() {
            drawn().take();
            bar.finish_and_clear();
        }
    }
}

/// Whether a bar is drawn now: where it is, output is passed on by whole lines (see `every_mechanism`).
pub fn drawing() -> bool {
    drawn().is_some()
}

/// Runs `write` (a write to standard output or error) with the bar, if one is drawn, off the terminal, and
/// draws the bar again after it.
pub fn suspend<R>(write: impl FnOnce() -> R) -> R {
    // The lock is not held while writing: the bar has its own.
    let bar = drawn().clone();
    match bar {
        Some(bar) => bar.suspend(write),
        None => write(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test harness's standard error is not a terminal here (captured or piped): the bar is a no-op, and
    /// `suspend` still runs what it is given.
    #[test]
    fn without_a_terminal_a_bar_is_a_no_op() {
        if std::io::stderr().is_terminal() {
            eprintln!("SKIPPED without_a_terminal_a_bar_is_a_no_op: standard error is a terminal");
            return;
        }
        let bar = Bar::start(3, "test", false);
        bar.doing("something");
        bar.step_done();
        assert!(bar.0.is_none() && !drawing());
        assert_eq!(suspend(|| 7), 7);
    }
}
