//! How to reach Redis ([`RedisTopology`]: one server, a cluster or sentinels) and how to use it ([`RedisConfig`]:
//! credentials, TLS, key prefix, deadline, log length, durability). Secrets never reach `Debug`.

use std::time::Duration;

/// Which Redis: one server, a cluster, or the master a group of sentinels names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server (or a managed endpoint that hides its failover): `redis://`, `rediss://` or `unix://`.
    Standalone { url: String },
    /// A Redis Cluster, found from these seed nodes (`host:port`).
    Cluster { nodes: Vec<String> },
    /// The master that these sentinels (`host:port`) name `master`.
    Sentinel { sentinels: Vec<String>, master: String },
}

impl RedisTopology {
    /// The topology for logs and `Debug`: the nodes, but never a standalone URL (it may hold a password).
    #[must_use]
    pub fn redacted(&self) -> String {
        match self {
            Self::Standalone { .. } => "standalone, url [redacted]".to_owned(),
            Self::Cluster { nodes } => format!("cluster {nodes:?}"),
            Self::Sentinel { sentinels, master } => format!("sentinel {master:?} {sentinels:?}"),
        }
    }
}

/// How to reach Redis and how to use it.
#[derive(Clone)]
pub struct RedisConfig {
    pub topology: RedisTopology,
    /// The ACL user and password of the data nodes (they override those of a standalone URL). Sentinels are
    /// asked without them.
    pub username: Option<String>,
    pub password: Option<String>,
    /// TLS to every node, sentinels included (a standalone URL says it with `rediss://`).
    pub tls: bool,
    /// Prepended to every key and channel, so that several deployments (or test suites) can share one Redis.
    pub prefix: String,
    /// The deadline of every Redis call.
    pub timeout: Duration,
    /// Approximate cap on each session's event log (`XADD MAXLEN ~`).
    pub max_events: usize,
    /// How long a cancellation marker lasts.
    pub cancel_ttl: Duration,
    /// Size of the pool used for replays and admin calls.
    pub pool_size: usize,
    /// Where command latency and errors are recorded.
    pub metrics: Option<crate::StoreMetrics>,
    /// With TLS: the certificate authority to trust (PEM), instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
    /// How many replicas must acknowledge the writes that make a promise (a task's creation, queue entry, run lease
    /// and end; an idempotent call's result) before the promise is made: `WAIT <n>`, for at most half the
    /// deadline. 0 waits for none.
    pub durable_replicas: u32,
}

impl std::fmt::Debug for RedisConfig {
    // The URL and the password are secrets: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("topology", &self.topology.redacted())
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca.as_ref().map(|c| format!("{} bytes of PEM", c.len())))
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("durable_replicas", &self.durable_replicas)
            .finish_non_exhaustive()
    }
}

impl RedisConfig {
    /// A standalone Redis at `url`, with the defaults.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_topology(RedisTopology::Standalone { url: url.into() })
    }

    /// `topology`, with the defaults.
    #[must_use]
    pub fn with_topology(topology: RedisTopology) -> Self {
        Self {
            topology,
            username: None,
            password: None,
            tls: false,
            durable_replicas: 0,
            prefix: "mcp:".to_owned(),
            timeout: Duration::from_secs(2),
            max_events: 1000,
            cancel_ttl: Duration::from_secs(60),
            pool_size: 16,
            metrics: None,
            tls_ca: None,
        }
    }
}
