//! Where the state lives: Redis (its URL, key prefix and deadline) or, without a URL, the in-memory store; and how
//! many events a session keeps in either.

use super::cli::duration;
use super::{Secret, config_error};
use crate::ServerError;
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Store")]
pub(super) struct StoreArgs {
    /// Redis URL (redis://[user:password@]host:port/db, or rediss:// for TLS). Without it the server uses the
    /// in-memory store, which is single-replica only.
    #[arg(long, env = "MCPFLEET_REDIS_URL", hide_env_values = true)]
    redis_url: Option<Secret>,
    /// Prefix of every Redis key and channel.
    #[arg(long, env = "MCPFLEET_REDIS_PREFIX", default_value = "mcp:")]
    redis_prefix: String,
    /// Deadline of every Redis call (also connecting, and waiting for a pooled connection), like 2s or 250ms;
    /// 10ms to 60s. A missed deadline is a 503 with Retry-After.
    #[arg(long, env = "MCPFLEET_REDIS_TIMEOUT", default_value = "2s", value_parser = duration("10ms", "60s"))]
    redis_timeout: Duration,
    /// With a rediss:// URL: a PEM file of the certificate authority that signed Redis's certificate, trusted
    /// instead of the system's roots (a private CA, as managed Redis services and tests use).
    #[arg(long, env = "MCPFLEET_REDIS_CA_FILE")]
    redis_ca_file: Option<std::path::PathBuf>,
    /// Approximate number of events kept per session for resumption.
    #[arg(
        long,
        env = "MCPFLEET_MAX_EVENTS",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u64).range(16..=1_000_000)
    )]
    max_events: u64,
}

/// Redis settings. The URL may hold a password: it is a [`Secret`].
#[derive(Clone)]
pub struct RedisSettings {
    pub url: Secret,
    pub prefix: String,
    pub timeout: Duration,
    /// The CA to trust for `rediss://` (PEM), read from `--redis-ca-file` at start-up.
    pub tls_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("tls_ca", &self.tls_ca.as_ref().map(|c| format!("{} bytes of PEM", c.len())))
            .finish()
    }
}

/// The store part of a [`super::Config`].
#[derive(Debug)]
pub(super) struct Store {
    pub redis: Option<RedisSettings>,
    pub max_events: usize,
}

impl StoreArgs {
    /// # Errors
    /// A URL of another scheme than `redis://`, `rediss://` or `unix://`; a `--redis-ca-file` without a `rediss://`
    /// URL, or one that cannot be read or holds no PEM certificate.
    pub(super) fn into_config(self) -> Result<Store, ServerError> {
        let tls = self.redis_url.as_ref().is_some_and(|u| u.expose().starts_with("rediss://"));
        let tls_ca = match &self.redis_ca_file {
            None => None,
            Some(_) if !tls => return Err(config_error("--redis-ca-file needs a rediss:// --redis-url")),
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| config_error(format!("--redis-ca-file {}: {e}", path.display())))?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err(config_error(format!("--redis-ca-file {}: no PEM certificate in it", path.display())));
                }
                Some(pem)
            }
        };
        let redis = match self.redis_url {
            Some(url) if ["redis://", "rediss://", "unix://"].iter().any(|s| url.expose().starts_with(s)) => {
                Some(RedisSettings { url, prefix: self.redis_prefix, timeout: self.redis_timeout, tls_ca })
            }
            Some(_) => return Err(config_error("--redis-url must start with redis://, rediss:// or unix://")),
            None => None,
        };
        Ok(Store { redis, max_events: usize::try_from(self.max_events).unwrap_or(usize::MAX) })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::serve;
    use std::time::Duration;

    #[test]
    fn redis_settings_keep_the_url_out_of_debug() {
        let c = serve(&["--redis-url", "redis://user:hunter2@127.0.0.1:1/", "--request-state-key", KEY]).unwrap();
        let r = c.redis.as_ref().unwrap();
        assert_eq!(r.url.expose(), "redis://user:hunter2@127.0.0.1:1/");
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
            "--redis-ca-file needs a rediss:// --redis-url"
        );
        let tls = ["--redis-url", "rediss://127.0.0.1:1/", "--request-state-key", KEY, "--redis-ca-file"];
        assert!(
            err(&[&tls[..], &["/nonexistent/ca.pem"]].concat()).starts_with("--redis-ca-file /nonexistent/ca.pem: ")
        );
        assert!(err(&[&tls[..], &["/etc/hostname"]].concat()).ends_with("no PEM certificate in it"));
    }

    const KEY: &str = "k:dGVzdC1mbGVldC1yZXF1ZXN0LXN0YXRlLWtleS0wMTIzNDU2Nzg5YWI=";
}
