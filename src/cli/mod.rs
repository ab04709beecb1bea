//! The command line, read once into what this process is (a [`Role`]): a user's options (`user`), or,
//! after the reserved first argument [`INTERNAL`], the internal role this program started itself in
//! (`internal`), which no user's `--help` or usage error knows of. A usage error exits 1, not clap's 2,
//! which a test harness would read as "waived".

use std::ffi::OsString;

use crate::role::{INTERNAL, Role};

mod internal;
#[cfg(test)]
mod tests;
mod user;

/// A usage error (or `--help`, `--version`), with the usage line of the parser that made it.
#[derive(Debug)]
pub(crate) struct Usage {
    error: clap::Error,
    usage: fn() -> String,
}

/// Parses this process's arguments; on `Err`, print the error and exit with [`usage_exit_code`].
pub(crate) fn parse() -> Result<Role, Usage> {
    parse_from(std::env::args_os().collect())
}

/// Parses `args` (the program's name first).
fn parse_from(args: Vec<OsString>) -> Result<Role, Usage> {
    match args.get(1) {
        Some(first) if first == INTERNAL => internal::parse_from(args.into_iter().skip(2))
            .map_err(|error| Usage { error, usage: internal::usage }),
        _ => user::parse_from(args).map_err(|error| Usage { error, usage: user::usage }),
    }
}

/// 0 for `--help` and `--version`, 1 for a usage error (never clap's 2, which means "waived" here).
pub(crate) fn usage_exit_code(e: &Usage) -> u8 {
    u8::from(e.error.use_stderr())
}

/// Prints what clap has to say; a usage error always comes with the usage line.
pub(crate) fn print_usage_error(e: &Usage) {
    if !e.error.use_stderr() {
        let _ = e.error.print(); // --help, --version
        return;
    }
    let mut text = e.error.render().to_string().trim_end().to_owned();
    if !text.contains("Usage:") {
        text.push_str(&format!("\n\n{}", (e.usage)()));
    }
    warn!("{}", text.trim_end());
}
