//! mcpfleet-testkit: what every test suite stands on, and nothing of the server. An ephemeral `redis-server` per
//! suite, ephemeral Redis topologies for the HA tests (a 6-node Redis Cluster, a master and a replica under 3
//! sentinels), an ephemeral PostgreSQL server (a fresh cluster, plain or TLS-only, that tests can stop, kill and start
//! again), a JWKS issuer with committed test keys and a token builder, raw MCP clients of both generations, and a
//! round-robin proxy that sends each HTTP request, SSE GETs included, to the next replica in turn. The Redis
//! topologies take [`RedisOptions`]: TLS only, an ACL user, and a [`NetLab`] of network namespaces to run in, whose
//! links a test cuts to partition replicas from Redis for real.
//!
//! It is a leaf: it must not depend on any mcpfleet crate, so the state contract suite builds without the server.
//! Fleets of replicas are `mcpfleet-fleetkit`'s. A dev-dependency only: it must never be linked into the server.
#![expect(clippy::expect_used, reason = "test support: failing loudly with a reason is its job")]

mod client;
pub mod issuer;
mod netns;
pub mod oauth;
mod postgres;
mod proxy;
mod redis;
mod redis_cluster;
mod redis_node;
mod redis_options;
mod redis_sentinel;
mod tls;

pub use client::{McpClient, SseEvent, SseStream, StatelessClient, data_messages, progress_values, response_of};
pub use issuer::{Issuer, TestKey, TokenBuilder};
pub use netns::{LabSite, NetLab};
pub use oauth::{AuthServer, AuthServerSetup, DownstreamApi};
pub use postgres::PostgresServer;
pub use proxy::RoundRobinProxy;
pub use redis::RedisServer;
pub use redis_cluster::RedisCluster;
pub use redis_node::{RedisNode, Role};
pub use redis_options::RedisOptions;
pub use redis_sentinel::RedisSentinel;

/// The header through which in-process tests name their principal (tests of real tokens use [`Issuer`]).
pub const TEST_USER_HEADER: &str = "x-test-user";

/// Installs rustls' ring provider for the process (the auth crate's JWKS client links reqwest with
/// `rustls-no-provider`, and cargo unifies that feature into every test's reqwest). Every testkit entry point calls
/// it; a test that builds a reqwest or rmcp client before touching the testkit must call it first.
pub fn init_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A replica's `/metrics` (at `admin`, `http://host:port`) as a map from `name{sorted labels}` to value, e.g.
/// `mcp_tool_calls_total{outcome="ok",tool="x"}`.
///
/// # Panics
/// If the endpoint cannot be read or parsed.
pub async fn scrape(admin: &str) -> std::collections::BTreeMap<String, f64> {
    init_tls();
    let text = reqwest::get(format!("{admin}/metrics")).await.expect("GET /metrics").text().await.expect("body");
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let key = match series.split_once('{') {
            Some((name, labels)) => {
                let mut ls: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                ls.sort_unstable();
                format!("{name}{{{}}}", ls.join(","))
            }
            None => series.to_owned(),
        };
        out.insert(key, value.parse().expect("a number"));
    }
    out
}

/// Waits until `f` returns true, polling every 20 ms, or panics after `secs` seconds.
///
/// # Panics
/// When the deadline passes.
pub async fn eventually<F: FnMut() -> Fut, Fut: std::future::Future<Output = bool>>(secs: u64, what: &str, mut f: F) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out after {secs}s waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The blocking [`eventually`]: polls `done` every 50 ms until it holds, and returns how long that took.
///
/// # Panics
/// After `secs` seconds, naming `what`.
pub fn wait_until(secs: u64, what: &str, mut done: impl FnMut() -> bool) -> std::time::Duration {
    let started = std::time::Instant::now();
    while !done() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(secs),
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    started.elapsed()
}
