//! simple-ipc's entry point: parse the command line, run the parent or a child, turn the result into the
//! exit status (0 passed, 1 failed, 2 waived, 128+N stopped by signal N).

use std::io::Write;

use nix::sys::signal::{SigHandler, Signal, signal};
use std::process::ExitCode;

use simple_ipc::cli;
use simple_ipc::signals::Interrupted;
use simple_ipc::{
    EXIT_FAILURE, EXIT_SUCCESS, EXIT_WAIVED, Outcome, bench, child, fault, parent, signals, topology,
};

fn main() -> ExitCode {
    // Like a C program, end quietly when the reader of our output goes away (`simple-ipc | head`).
    // SAFETY: restoring the default disposition installs no handler; nothing else runs yet.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    simple_ipc::driver::cuda::prefer_fast_context_creation();
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(usage) => {
            cli::print_usage_error(&usage);
            return ExitCode::from(cli::usage_exit_code(&usage));
        }
    };
    if cfg!(any(target_arch = "aarch64", target_arch = "arm")) {
        println!("Not supported on ARM");
        return ExitCode::from(EXIT_WAIVED);
    }
    let who = match cli.child {
        Some(index) => format!("Process {index}"),
        None => "simple-ipc".to_owned(),
    };
    let result = signals::install().and_then(|()| fault::validate_env()).and_then(|()| match cli.child {
        Some(index) if cli.bench => bench::run_consumer(index as usize).map(|()| Outcome::Passed),
        Some(index) => child::run(index as usize).map(|()| Outcome::Passed),
        None if cli.bench => bench::run_producer(&cli),
        None if cli.topology => topology::run(),
        None => parent::run(&cli),
    });
    match result {
        Ok(Outcome::Passed) => ExitCode::from(EXIT_SUCCESS),
        Ok(Outcome::Waived) => ExitCode::from(EXIT_WAIVED),
        Err(e) => {
            // One write, so that the lines of several processes sharing stderr do not interleave.
            let _ = std::io::stderr().write_all(format!("{who}: {e:#}\n").as_bytes());
            match e.chain().find_map(|cause| cause.downcast_ref::<Interrupted>()) {
                Some(Interrupted(signal)) => ExitCode::from(128 + *signal as u8),
                None => ExitCode::from(EXIT_FAILURE),
            }
        }
    }
}
