//! simple-ipc: see the library's `entry` for the program, and README.md for what it does.

fn main() -> std::process::ExitCode {
    simple_ipc::main()
}
