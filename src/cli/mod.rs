//! The command line, read once into what this process is (a [`Role`]): a user's options (`user`), held to
//! every rule between them (`rules`: nothing after the parse compares options), or, after the reserved
//! first argument [`INTERNAL`], the internal role this program started itself in (`internal`), which no
//! user's `--help` or usage error knows of. A usage error exits 1, not clap's 2, which a test harness would
//! read as "waived".

use std::cell::Cell;
use std::ffi::OsString;

use crate::outcome::{EXIT_FAILURE, EXIT_SUCCESS};
use crate::output::{READER_GONE_STATUS, ReaderGone, printable};
use crate::role::{INTERNAL, Role};

mod generate;
mod internal;
mod rules;
#[cfg(test)]
mod tests;
mod user;
mod values;

/// A command line that asks for no run: the process prints what the command line has to say instead of a
/// role, a usage error, `--help` or `--version` (clap's), or `--generate`'s text ([`EarlyExit::print`]), and
/// exits ([`EarlyExit::exit_code`]).
#[derive(Debug)]
pub(crate) struct EarlyExit {
    kind: Kind,
    /// `--generate`'s exit status, which depends on whether its text could be written: set by
    /// [`EarlyExit::print`], and a failure until then (nothing was written).
    generated: Cell<u8>,
}

/// What an [`EarlyExit`] prints.
#[derive(Debug)]
enum Kind {
    /// clap's error (or `--help`, `--version`); a usage error has the usage line of the parser that made it.
    Clap { error: clap::Error },
    /// `--generate`: completions or the man page, for standard output.
    Generate(generate::What),
}

/// Parses this process's arguments; on `Err`, call [`EarlyExit::print`], then exit with
/// [`EarlyExit::exit_code`].
pub(crate) fn parse() -> Result<Role, EarlyExit> {
    parse_from(std::env::args_os().collect())
}

/// Parses `args` (the program's name first).
fn parse_from(args: Vec<OsString>) -> Result<Role, EarlyExit> {
    match args.get(1) {
        Some(first) if first == INTERNAL => {
            internal::parse_from(args.into_iter().skip(2)).map_err(|e| EarlyExit::clap(e, internal::usage))
        }
        _ => match rules::parse_from(args) {
            Ok(rules::Asked::Role(role)) => Ok(*role),
            Ok(rules::Asked::Generate(what)) => {
                Err(EarlyExit { kind: Kind::Generate(what), generated: Cell::new(EXIT_FAILURE) })
            }
            Err(e) => Err(EarlyExit::clap(e, user::usage)),
        },
    }
}

impl EarlyExit {
    fn clap(mut error: clap::Error, usage: fn() -> String) -> EarlyExit {
        if error.use_stderr() {
            as_usage_error(&mut error, &usage());
        }
        EarlyExit { kind: Kind::Clap { error }, generated: Cell::new(EXIT_FAILURE) }
    }

    /// A usage error's text, as [`print`](Self::print) writes it; `None` for anything else.
    fn usage_error(&self) -> Option<String> {
        match &self.kind {
            Kind::Clap { error } if error.use_stderr() => {
                Some(error.render().to_string().trim_end().to_owned())
            }
            _ => None,
        }
    }

    /// Prints what clap has to say (a usage error always comes with the usage line, in clap's order: see
    /// [`as_usage_error`]), or `--generate`'s text.
    pub(crate) fn print(&self) {
        let error = match &self.kind {
            Kind::Clap { error } => error,
            Kind::Generate(what) => {
                self.generated.set(write_generated(*what));
                return;
            }
        };
        match self.usage_error() {
            Some(text) => eprint_line!("{text}"),
            None => drop(error.print()), // --help, --version
        }
    }

    /// 0 for `--help` and `--version`, 1 for a usage error (never clap's 2, which means "waived" here);
    /// `--generate`'s status once [`EarlyExit::print`] has written it (0, 141 where the reader went away, 1
    /// where it could not be written).
    pub(crate) fn exit_code(&self) -> u8 {
        match &self.kind {
            Kind::Clap { error } => u8::from(error.use_stderr()),
            Kind::Generate(_) => self.generated.get(),
        }
    }
}

/// Makes clap's usage error `error` say the same things in the same order as every other: `error: ...`
/// (and its tips), the usage line `usage`, then the hint to try `--help`. Where clap left the usage line out
/// (an invalid value, a missing value) it is given to clap, which puts it where it puts its own; clap's
/// text is never searched for it, since the value the user gave, which clap quotes, may hold any of its
/// words. What the user typed, as clap quotes it, is made fit to print ([`printable`]): a newline or an
/// escape sequence in a value would otherwise add lines to the error or rewrite the terminal's.
fn as_usage_error(error: &mut clap::Error, usage: &str) {
    use clap::error::{ContextKind, ContextValue};
    let quoted: Vec<(ContextKind, ContextValue)> = error
        .context()
        .filter_map(|(kind, value)| match value {
            ContextValue::String(text) => Some((kind, ContextValue::String(printable(text)))),
            ContextValue::Strings(texts) => {
                Some((kind, ContextValue::Strings(texts.iter().map(|t| printable(t)).collect())))
            }
            _ => None,
        })
        .collect();
    for (kind, value) in quoted {
        error.insert(kind, value);
    }
    // An error clap wrote out itself (the program's own rules, which clap gives the usage line, and the
    // help it shows for a missing subcommand) is printed as written: the context is not read for it.
    if error.get(ContextKind::Usage).is_none() {
        error.insert(ContextKind::Usage, ContextValue::StyledStr(usage.to_owned().into()));
    }
}

/// Writes `--generate`'s text on standard output: the exit status, as for any other output of the program
/// (a reader gone is 141 and says nothing more; another error is said, and fails).
fn write_generated(what: generate::What) -> u8 {
    let written = generate::render(what, user::command()).and_then(|text| crate::output::text(&text));
    match written {
        Ok(()) => EXIT_SUCCESS,
        Err(e) if e.is::<ReaderGone>() => READER_GONE_STATUS,
        Err(e) => {
            eprint_line!("simple-ipc: --generate: {e:#}");
            EXIT_FAILURE
        }
    }
}
