//! `--generate`: shell completions and the man page, made from the user's parser itself, so that they name
//! every option as `--help` does and cannot fall behind it. Printed on standard output through `output`,
//! as every other line of the program is: a reader that goes away (`simple-ipc --generate man | head -1`)
//! ends it with 141 and nothing more said, never with a panic.

use anyhow::{Context, Result};
use clap::ValueEnum;
use clap_complete::{Generator, Shell};

/// What `--generate` writes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    /// Bash's completions (for ~/.local/share/bash-completion/completions/simple-ipc).
    CompletionsBash,
    /// Zsh's completions (for a file `_simple-ipc` in a directory of $fpath).
    CompletionsZsh,
    /// Fish's completions (for ~/.config/fish/completions/simple-ipc.fish).
    CompletionsFish,
    /// The man page, in roff (for ~/.local/share/man/man1/simple-ipc.1).
    Man,
}

/// The text of `what`, for the parser `command` (the user's): rendered into memory first, since
/// clap_complete's and clap_mangen's writers would panic or stop half-way on a write error, which is
/// `output`'s to handle.
pub(crate) fn render(what: What, mut command: clap::Command) -> Result<String> {
    let name = command.get_name().to_owned();
    let mut text = Vec::new();
    let shell = match what {
        What::CompletionsBash => Shell::Bash,
        What::CompletionsZsh => Shell::Zsh,
        What::CompletionsFish => Shell::Fish,
        What::Man => return man_page(command),
    };
    // As clap_complete::generate does, with the error returned instead of a panic.
    command.set_bin_name(&name);
    command.build();
    shell.try_generate(&command, &mut text).with_context(|| format!("generating {shell}'s completions"))?;
    String::from_utf8(text).with_context(|| format!("{shell}'s completions are not UTF-8"))
}

/// The man page: clap_mangen's, its footer the version alone (the revision and the kernel's needs are in
/// its VERSION section), and its section of `after_long_help` titled for what it says.
fn man_page(command: clap::Command) -> Result<String> {
    let mut page = Vec::new();
    let source = format!("{} {}", command.get_name(), env!("CARGO_PKG_VERSION"));
    clap_mangen::Man::new(command).source(source).render(&mut page).context("rendering the man page")?;
    let page = String::from_utf8(page).context("the man page is not UTF-8")?;
    // clap_mangen calls it EXTRA; it is the exit statuses (and how to run without a GPU).
    Ok(page.replacen("\n.SH EXTRA\n", "\n.SH \"EXIT STATUS\"\n", 1))
}
