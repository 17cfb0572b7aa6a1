//! The end-to-end suites, in one test binary (the server's test build links once, not ten times). Each module is
//! one suite, against real replica processes and real Redis; run one with `cargo test -p mcpfleet --test e2e
//! <module>::`. `tests/traces.rs` stays a binary of its own: it installs the process's global tracer provider.

#[path = "auth.rs"]
mod auth;
#[path = "browser.rs"]
mod browser;
#[path = "conformance.rs"]
mod conformance;
#[path = "database.rs"]
mod database;
#[path = "deploy.rs"]
mod deploy;
#[path = "dev_oauth.rs"]
mod dev_oauth;
#[path = "downstream.rs"]
mod downstream;
#[path = "dpop.rs"]
mod dpop;
#[path = "fleet.rs"]
mod fleet;
#[path = "greet.rs"]
mod greet;
#[path = "ha.rs"]
mod ha;
#[path = "interop.rs"]
mod interop;
#[path = "limits.rs"]
mod limits;
#[path = "memory.rs"]
mod memory;
#[path = "operability.rs"]
mod operability;
#[path = "policy.rs"]
mod policy;
#[path = "policy_fleet.rs"]
mod policy_fleet;
#[path = "realistic.rs"]
mod realistic;
#[path = "revoke.rs"]
mod revoke;
#[path = "rmcp_client.rs"]
mod rmcp_client;
#[path = "skills.rs"]
mod skills;
#[path = "stateless.rs"]
mod stateless;
#[path = "tasks.rs"]
mod tasks;
#[path = "tools.rs"]
mod tools;
#[path = "upgrade.rs"]
mod upgrade;
