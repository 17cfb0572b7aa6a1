//! The `mcpfleet` binary: everything lives in the library.

fn main() {
    std::process::exit(mcpfleet::run(std::env::args_os()));
}
