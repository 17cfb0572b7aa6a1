//! End-to-end suites live in this directory; see the [[test]] targets in Cargo.toml.
