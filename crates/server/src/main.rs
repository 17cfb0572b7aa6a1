//! The `mcpfleet` binary: the library's [`mcpfleet::Server`] with no tools of its own, so that `--fixtures` picks
//! one of the fixture sets (cargo features `fixtures` and `reference`).

/// mimalloc, not glibc's malloc: per-thread free lists instead of arenas that the runtime's worker threads contend
/// on (glibc's malloc and free were 16 % of a replica's CPU under load; docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    mcpfleet::Server::new("mcpfleet", env!("CARGO_PKG_VERSION")).run()
}
