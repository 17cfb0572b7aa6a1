//! The `mcpfleet` binary: everything lives in the library.

/// mimalloc, not glibc's malloc: per-thread free lists instead of arenas that the runtime's worker threads contend
/// on (glibc's malloc and free were 16 % of a replica's CPU under load; docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(mcpfleet::run(std::env::args_os()));
}
