//! The testkit's own suites, in one test binary: the Redis topologies against the installed Redis (`topologies`),
//! and the network lab (`netns`). Run one with `cargo test -p mcpfleet-testkit --test testkit netns::`.

mod netns;
mod topologies;
