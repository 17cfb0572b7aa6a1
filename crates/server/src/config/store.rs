//! Where the state lives: Redis (standalone, a cluster or behind Sentinel; its credentials, TLS, key prefix and
//! deadline) or, without Redis, the in-memory store; and how many events a session keeps in either.

use super::cli::{config_error, duration};
use super::secret::Secret;
use crate::ServerError;
use mcpfleet_state::{RedisConfig, RedisTopology};
use std::time::Duration;

/// Which kind of Redis the replicas share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum RedisMode {
    /// One server at --redis-url (or a managed endpoint that hides its failover).
    Standalone,
    /// A Redis Cluster, found from the --redis-nodes seeds.
    Cluster,
    /// The master that the --redis-nodes sentinels name --redis-sentinel-master.
    Sentinel,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Store")]
pub(super) struct StoreArgs {
    /// standalone (--redis-url), cluster (--redis-nodes: seed nodes) or sentinel (--redis-nodes: the sentinels,
    /// and --redis-sentinel-master). Without --redis-url or --redis-nodes the server uses the in-memory store,
    /// which is single-replica only.
    #[arg(long, env = "MCPFLEET_REDIS_MODE", value_enum, default_value = "standalone")]
    redis_mode: RedisMode,
    /// Redis URL (redis://[user:password@]host:port/db, or rediss:// for TLS), for --redis-mode standalone.
    #[arg(long, env = "MCPFLEET_REDIS_URL", hide_env_values = true)]
    redis_url: Option<Secret>,
    /// host:port,... : the cluster's seed nodes (any few; the rest are discovered) or the sentinels.
    #[arg(long, env = "MCPFLEET_REDIS_NODES", value_delimiter = ',')]
    redis_nodes: Vec<String>,
    /// The master name the sentinels know (--redis-mode sentinel).
    #[arg(long, env = "MCPFLEET_REDIS_SENTINEL_MASTER")]
    redis_sentinel_master: Option<String>,
    /// The ACL user of the data nodes (overrides a user in --redis-url). Sentinels are asked without it.
    #[arg(long, env = "MCPFLEET_REDIS_USERNAME")]
    redis_username: Option<String>,
    /// The password of the data nodes (overrides one in --redis-url). Prefer the environment variable.
    #[arg(long, env = "MCPFLEET_REDIS_PASSWORD", hide_env_values = true)]
    redis_password: Option<Secret>,
    /// Speak TLS to every node, sentinels included (standalone: the same as a rediss:// URL).
    #[arg(long, env = "MCPFLEET_REDIS_TLS")]
    redis_tls: bool,
    /// Prefix of every Redis key and channel.
    #[arg(long, env = "MCPFLEET_REDIS_PREFIX", default_value = "mcp:")]
    redis_prefix: String,
    /// Deadline of every Redis call (also connecting, and waiting for a pooled connection), like 2s or 250ms;
    /// 10ms to 60s. A missed deadline is a 503 with Retry-After.
    #[arg(long, env = "MCPFLEET_REDIS_TIMEOUT", default_value = "2s", value_parser = duration("10ms", "60s"))]
    redis_timeout: Duration,
    /// With TLS: a PEM file of the certificate authority that signed the nodes' certificates, trusted instead of
    /// the system's roots (a private CA, as managed Redis services and tests use).
    #[arg(long, env = "MCPFLEET_REDIS_CA_FILE")]
    redis_ca_file: Option<std::path::PathBuf>,
    /// How many Redis replicas must hold the writes that make a promise (a task's creation, queue entry, run lease
    /// and end; an idempotent call's result) before the promise is made (WAIT, for at most half the Redis deadline;
    /// fewer is counted in mcp_redis_unreplicated_writes_total, not refused). Default: 1 for cluster and sentinel,
    /// 0 for standalone.
    #[arg(long, env = "MCPFLEET_REDIS_DURABLE_REPLICAS", value_parser = clap::value_parser!(u32).range(0..=16))]
    redis_durable_replicas: Option<u32>,
    /// Approximate number of events kept per session for resumption.
    #[arg(
        long,
        env = "MCPFLEET_MAX_EVENTS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(16..=1_000_000)
    )]
    max_events: u64,
}

/// The store part of a [`super::Config`].
#[derive(Debug)]
pub(super) struct Store {
    /// The store's Redis settings (its `Debug` prints neither the URL nor the password); the server adds what is
    /// not Redis's (events, metrics).
    pub redis: Option<RedisConfig>,
    pub max_events: usize,
}

/// A `host:port` (a name or an address; IPv6 in brackets) with a port that is a number above 0.
fn node(s: &str) -> Result<String, ServerError> {
    let bad = || config_error(format!("--redis-nodes: {s:?} is not host:port"));
    let (host, port) = s.trim().rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() || port == 0 || host.contains('/') || host.contains('@') {
        return Err(bad());
    }
    Ok(format!("{host}:{port}"))
}

impl StoreArgs {
    /// # Errors
    /// A URL of another scheme than `redis://`, `rediss://` or `unix://`; the flags of one mode given for another
    /// (a URL with cluster or sentinel, nodes with standalone, a master name without sentinel); a cluster or
    /// sentinel without nodes, or a node that is not `host:port`; a `--redis-ca-file` without TLS, or one that
    /// cannot be read or holds no PEM certificate.
    pub(super) fn into_config(self) -> Result<Store, ServerError> {
        let url_tls = self.redis_url.as_ref().is_some_and(|u| u.expose().starts_with("rediss://"));
        let tls = self.redis_tls || url_tls;
        let topology = match self.redis_mode {
            RedisMode::Standalone => {
                if !self.redis_nodes.is_empty() {
                    return Err(config_error("--redis-nodes needs --redis-mode cluster or sentinel"));
                }
                if self.redis_sentinel_master.is_some() {
                    return Err(config_error("--redis-sentinel-master needs --redis-mode sentinel"));
                }
                match &self.redis_url {
                    Some(url) if ["redis://", "rediss://", "unix://"].iter().any(|s| url.expose().starts_with(s)) => {
                        if self.redis_tls && !url_tls {
                            return Err(config_error("--redis-tls needs a rediss:// --redis-url"));
                        }
                        Some(RedisTopology::Standalone { url: url.expose().to_owned() })
                    }
                    Some(_) => return Err(config_error("--redis-url must start with redis://, rediss:// or unix://")),
                    None => None,
                }
            }
            mode => {
                if self.redis_url.is_some() {
                    return Err(config_error("--redis-url is for --redis-mode standalone; give --redis-nodes"));
                }
                let nodes = self.redis_nodes.iter().map(|n| node(n)).collect::<Result<Vec<_>, _>>()?;
                if nodes.is_empty() {
                    return Err(config_error("--redis-mode cluster and sentinel need --redis-nodes host:port,..."));
                }
                match (mode, self.redis_sentinel_master) {
                    (RedisMode::Cluster, None) => Some(RedisTopology::Cluster { nodes }),
                    (RedisMode::Cluster, Some(_)) => {
                        return Err(config_error("--redis-sentinel-master needs --redis-mode sentinel"));
                    }
                    (_, Some(master)) if !master.trim().is_empty() => {
                        Some(RedisTopology::Sentinel { sentinels: nodes, master })
                    }
                    (_, _) => return Err(config_error("--redis-mode sentinel needs --redis-sentinel-master NAME")),
                }
            }
        };
        let tls_ca = match &self.redis_ca_file {
            None => None,
            Some(_) if !tls => return Err(config_error("--redis-ca-file needs TLS (--redis-tls or a rediss:// URL)")),
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| config_error(format!("--redis-ca-file {}: {e}", path.display())))?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err(config_error(format!("--redis-ca-file {}: no PEM certificate in it", path.display())));
                }
                Some(pem)
            }
        };
        let durable_replicas = self.redis_durable_replicas.unwrap_or(match self.redis_mode {
            RedisMode::Standalone => 0,
            RedisMode::Cluster | RedisMode::Sentinel => 1,
        });
        let redis = topology.map(|topology| RedisConfig {
            username: self.redis_username,
            password: self.redis_password.map(|p| p.expose().to_owned()),
            tls,
            prefix: self.redis_prefix,
            timeout: self.redis_timeout,
            tls_ca,
            durable_replicas,
            ..RedisConfig::with_topology(topology)
        });
        Ok(Store { redis, max_events: usize::try_from(self.max_events).unwrap_or(usize::MAX) })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::serve;
    use mcpfleet_state::RedisTopology;
    use std::time::Duration;

    #[test]
    fn cluster_and_sentinel_settings() {
        let c =
            serve(&["--redis-mode", "cluster", "--redis-nodes", "10.0.0.1:7000, r2:7001", "--request-state-key", KEY])
                .unwrap();
        let r = c.redis.as_ref().unwrap();
        assert_eq!(r.topology, RedisTopology::Cluster { nodes: vec!["10.0.0.1:7000".into(), "r2:7001".into()] });
        assert_eq!((r.durable_replicas, r.tls), (1, false));
        let c = serve(&[
            "--redis-mode",
            "sentinel",
            "--redis-nodes",
            "s1:26379,s2:26379",
            "--redis-sentinel-master",
            "main",
            "--redis-username",
            "fleet",
            "--redis-password",
            "hunter2",
            "--redis-tls",
            "--redis-durable-replicas",
            "0",
            "--request-state-key",
            KEY,
        ])
        .unwrap();
        let r = c.redis.as_ref().unwrap();
        assert_eq!(
            r.topology,
            RedisTopology::Sentinel { sentinels: vec!["s1:26379".into(), "s2:26379".into()], master: "main".into() }
        );
        assert_eq!((r.username.as_deref(), r.tls, r.durable_replicas), (Some("fleet"), true, 0));
        assert!(!format!("{r:?}").contains("hunter2"));
    }

    #[test]
    fn topology_flags_that_do_not_fit_are_refused() {
        let err = |args: &[&str]| serve(&[args, &["--request-state-key", KEY]].concat()).unwrap_err().to_string();
        assert_eq!(err(&["--redis-nodes", "a:1"]), "--redis-nodes needs --redis-mode cluster or sentinel");
        assert_eq!(
            err(&["--redis-mode", "cluster"]),
            "--redis-mode cluster and sentinel need --redis-nodes host:port,..."
        );
        assert_eq!(
            err(&["--redis-mode", "cluster", "--redis-url", "redis://a:1/"]),
            "--redis-url is for --redis-mode standalone; give --redis-nodes"
        );
        assert_eq!(err(&["--redis-mode", "cluster", "--redis-nodes", "a"]), "--redis-nodes: \"a\" is not host:port");
        assert_eq!(
            err(&["--redis-mode", "cluster", "--redis-nodes", "a:0"]),
            "--redis-nodes: \"a:0\" is not host:port"
        );
        assert_eq!(
            err(&["--redis-mode", "sentinel", "--redis-nodes", "a:1"]),
            "--redis-mode sentinel needs --redis-sentinel-master NAME"
        );
        assert_eq!(
            err(&["--redis-mode", "cluster", "--redis-nodes", "a:1", "--redis-sentinel-master", "m"]),
            "--redis-sentinel-master needs --redis-mode sentinel"
        );
        assert_eq!(err(&["--redis-url", "redis://a:1/", "--redis-tls"]), "--redis-tls needs a rediss:// --redis-url");
        assert!(serve(&["--redis-mode", "mesh"]).is_err());
    }

    #[test]
    fn redis_settings_keep_the_url_out_of_debug() {
        let c = serve(&["--redis-url", "redis://user:hunter2@127.0.0.1:1/", "--request-state-key", KEY]).unwrap();
        let r = c.redis.as_ref().unwrap();
        assert_eq!(r.topology, RedisTopology::Standalone { url: "redis://user:hunter2@127.0.0.1:1/".into() });
        assert_eq!((r.prefix.as_str(), r.timeout), ("mcp:", Duration::from_secs(2)));
        assert!(!format!("{r:?}").contains("hunter2"));
        assert_eq!(c.max_events, 1000);
    }

    #[test]
    fn bad_store_settings_are_refused() {
        let err = |args: &[&str]| serve(args).unwrap_err().to_string();
        assert_eq!(
            err(&["--redis-url", "http://example"]),
            "--redis-url must start with redis://, rediss:// or unix://"
        );
        assert!(err(&["--redis-timeout", "2"]).contains("needs a number and a unit"));
        assert!(err(&["--redis-timeout", "2m"]).contains("must be between 10ms and 60s"));
        assert!(serve(&["--max-events", "15"]).is_err());
        assert_eq!(
            err(&[
                "--redis-url",
                "redis://127.0.0.1:1/",
                "--redis-ca-file",
                "/etc/hostname",
                "--request-state-key",
                KEY
            ]),
            "--redis-ca-file needs TLS (--redis-tls or a rediss:// URL)"
        );
        let tls = ["--redis-url", "rediss://127.0.0.1:1/", "--request-state-key", KEY, "--redis-ca-file"];
        assert!(
            err(&[&tls[..], &["/nonexistent/ca.pem"]].concat()).starts_with("--redis-ca-file /nonexistent/ca.pem: ")
        );
        assert!(err(&[&tls[..], &["/etc/hostname"]].concat()).ends_with("no PEM certificate in it"));
    }

    const KEY: &str = "k:dGVzdC1mbGVldC1yZXF1ZXN0LXN0YXRlLWtleS0wMTIzNDU2Nzg5YWI=";
}
