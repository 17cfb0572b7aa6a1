//! How the HTTP transport behaves: body and header limits and deadlines, session and lease lifetimes, SSE timing,
//! call timeouts, the `requestState` keys, cache and idempotency lifetimes, and the drain on SIGTERM.

use super::auth::Access;
use super::cli::{Unit, config_error, duration, duration_or_zero, human, renamed};
use super::secret::Secret;
use crate::ServerError;
use mcpfleet_transport::{RequestStateKeys, TransportConfig};
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Transport")]
pub(super) struct TransportArgs {
    /// Largest accepted POST body, in bytes.
    #[arg(
        long,
        env = "MCPFLEET_MAX_BODY_BYTES",
        default_value_t = 1024 * 1024,
        value_parser = clap::value_parser!(u64).range(1024..=64 * 1024 * 1024)
    )]
    max_body_bytes: u64,
    /// Idle time after which a session expires, like 30m; 1s to 7d.
    #[arg(
        long,
        env = "MCPFLEET_SESSION_IDLE_TTL",
        default_value = "30m",
        value_parser = duration("1s", "7d"),
        conflicts_with = "session_idle_ttl_secs"
    )]
    session_idle_ttl: Duration,
    /// Deprecated: --session-idle-ttl, in seconds.
    #[arg(
        long,
        env = "MCPFLEET_SESSION_IDLE_TTL_SECS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(1..=7 * 24 * 3600)
    )]
    session_idle_ttl_secs: Option<u64>,
    /// Lease on a running call's stream, like 6s (300ms to 10m): a resumer reports the call as lost this long after
    /// its replica died.
    #[arg(
        long,
        env = "MCPFLEET_LEASE_TTL",
        default_value = "6s",
        value_parser = duration("300ms", "10m"),
        conflicts_with = "lease_ttl_ms"
    )]
    lease_ttl: Duration,
    /// Deprecated: --lease-ttl, in milliseconds.
    #[arg(
        long,
        env = "MCPFLEET_LEASE_TTL_MS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(300..=600_000)
    )]
    lease_ttl_ms: Option<u64>,
    /// Keep-alive comment interval on idle SSE streams, like 15s; 100ms to 10m.
    #[arg(
        long,
        env = "MCPFLEET_KEEP_ALIVE",
        default_value = "15s",
        value_parser = duration("100ms", "10m"),
        conflicts_with = "keep_alive_ms"
    )]
    keep_alive: Duration,
    /// Deprecated: --keep-alive, in milliseconds.
    #[arg(
        long,
        env = "MCPFLEET_KEEP_ALIVE_MS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(100..=600_000)
    )]
    keep_alive_ms: Option<u64>,
    /// `retry:` hint sent before the server closes a stream's connection, like 1s; 0s to 10m.
    #[arg(
        long,
        env = "MCPFLEET_RETRY",
        default_value = "1s",
        value_parser = duration("0s", "10m"),
        conflicts_with = "retry_ms"
    )]
    retry: Duration,
    /// Deprecated: --retry, in milliseconds.
    #[arg(long, env = "MCPFLEET_RETRY_MS", hide = true, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    retry_ms: Option<u64>,
    /// A call silent for this long switches to SSE (keep-alives, resumable), like 5s; 0s to 10m.
    #[arg(
        long,
        env = "MCPFLEET_SSE_AFTER",
        default_value = "5s",
        value_parser = duration("0s", "10m"),
        conflicts_with = "sse_after_ms"
    )]
    sse_after: Duration,
    /// Deprecated: --sse-after, in milliseconds.
    #[arg(long, env = "MCPFLEET_SSE_AFTER_MS", hide = true, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    sse_after_ms: Option<u64>,
    /// How long a server→client request waits for the client's answer, like 60s; 1s to 1h.
    #[arg(
        long,
        env = "MCPFLEET_CLIENT_REQUEST_TIMEOUT",
        default_value = "60s",
        value_parser = duration("1s", "1h"),
        conflicts_with = "client_request_timeout_secs"
    )]
    client_request_timeout: Duration,
    /// Deprecated: --client-request-timeout, in seconds.
    #[arg(
        long,
        env = "MCPFLEET_CLIENT_REQUEST_TIMEOUT_SECS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    client_request_timeout_secs: Option<u64>,
    /// How long a tool may run before it is stopped and answered with an isError result, unless the tool declares
    /// its own timeout; like 2m, 1s to 1h.
    #[arg(
        long,
        env = "MCPFLEET_TOOL_TIMEOUT",
        default_value = "120s",
        value_parser = duration("1s", "1h"),
        conflicts_with = "tool_timeout_secs"
    )]
    tool_timeout: Duration,
    /// Deprecated: --tool-timeout, in seconds.
    #[arg(
        long,
        env = "MCPFLEET_TOOL_TIMEOUT_SECS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    tool_timeout_secs: Option<u64>,
    /// A key that signs and verifies the requestState of 2026-07-28 multi round-trip requests, as
    /// `KID:BASE64SECRET` (the secret at least 32 bytes). Repeat it to rotate: the first signs, every one listed
    /// verifies. Every replica of a fleet needs the same keys; required with Redis. Without Redis, a random
    /// key is made at start.
    #[arg(
        long = "request-state-key",
        env = "MCPFLEET_REQUEST_STATE_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    request_state_keys: Vec<Secret>,
    /// How long a requestState stays valid (e.g. 10m).
    #[arg(long, env = "MCPFLEET_REQUEST_STATE_TTL", default_value = "10m", value_parser = duration("1s", "30d"))]
    request_state_ttl: Duration,
    /// The ttlMs of cacheable 2026-07-28 results: server/discover, the lists and resources/read (e.g. 5m; 0s: always
    /// stale).
    #[arg(long, env = "MCPFLEET_CACHE_TTL", default_value = "5m", value_parser = duration_or_zero("1s", "30d"))]
    cache_ttl: Duration,
    /// How long the result of a tools/call with an idempotency key (io.mcpfleet/idempotencyKey in _meta) is kept for
    /// repeats (e.g. 24h).
    #[arg(long, env = "MCPFLEET_IDEMPOTENCY_TTL", default_value = "24h", value_parser = duration("1s", "30d"))]
    idempotency_ttl: Duration,
    /// A call running longer than this subscribes to its session's doorbell to hear cancellations, like 50ms; 0s to
    /// 60s. Shorter calls cost one Redis round trip and cannot be cancelled (they are already done).
    #[arg(
        long,
        env = "MCPFLEET_CANCEL_WATCH_AFTER",
        default_value = "50ms",
        value_parser = duration("0s", "60s"),
        conflicts_with = "cancel_watch_after_ms"
    )]
    cancel_watch_after: Duration,
    /// Deprecated: --cancel-watch-after, in milliseconds.
    #[arg(
        long,
        env = "MCPFLEET_CANCEL_WATCH_AFTER_MS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(0..=60_000)
    )]
    cancel_watch_after_ms: Option<u64>,
    /// On SIGTERM, how long running tool calls may take to finish after the listener closes, like 25s; 0s to 1h.
    /// Their clients resume them on other replicas meanwhile.
    #[arg(
        long,
        env = "MCPFLEET_SHUTDOWN_GRACE",
        default_value = "25s",
        value_parser = duration("0s", "1h"),
        conflicts_with = "shutdown_grace_secs"
    )]
    shutdown_grace: Duration,
    /// Deprecated: --shutdown-grace, in seconds.
    #[arg(
        long,
        env = "MCPFLEET_SHUTDOWN_GRACE_SECS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(0..=3600)
    )]
    shutdown_grace_secs: Option<u64>,
    /// On SIGTERM, /readyz turns 503 at once; the server keeps serving for this long (so that load balancers stop
    /// sending new connections) before it stops accepting; like 5s, 0s to 10m.
    #[arg(
        long,
        env = "MCPFLEET_DRAIN_DELAY",
        default_value = "5s",
        value_parser = duration("0s", "10m"),
        conflicts_with = "drain_delay_secs"
    )]
    drain_delay: Duration,
    /// Deprecated: --drain-delay, in seconds.
    #[arg(long, env = "MCPFLEET_DRAIN_DELAY_SECS", hide = true, value_parser = clap::value_parser!(u64).range(0..=600))]
    drain_delay_secs: Option<u64>,
    /// Largest total size of a request's headers, in bytes; more gets 431.
    #[arg(
        long,
        env = "MCPFLEET_MAX_HEADER_BYTES",
        default_value_t = 16 * 1024,
        value_parser = clap::value_parser!(u64).range(1024..=1024 * 1024)
    )]
    max_header_bytes: u64,
    /// How long a client may take to send a request head, like 10s (1s to 10m); slower connections are closed.
    #[arg(
        long,
        env = "MCPFLEET_HEADER_READ_TIMEOUT",
        default_value = "10s",
        value_parser = duration("1s", "10m"),
        conflicts_with = "header_read_timeout_secs"
    )]
    header_read_timeout: Duration,
    /// Deprecated: --header-read-timeout, in seconds.
    #[arg(
        long,
        env = "MCPFLEET_HEADER_READ_TIMEOUT_SECS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(1..=600)
    )]
    header_read_timeout_secs: Option<u64>,
    /// How long a client may take to send a request body, like 30s (1s to 10m); slower gets 408.
    #[arg(
        long,
        env = "MCPFLEET_BODY_TIMEOUT",
        default_value = "30s",
        value_parser = duration("1s", "10m"),
        conflicts_with = "body_timeout_secs"
    )]
    body_timeout: Duration,
    /// Deprecated: --body-timeout, in seconds.
    #[arg(
        long,
        env = "MCPFLEET_BODY_TIMEOUT_SECS",
        hide = true,
        value_parser = clap::value_parser!(u64).range(1..=600)
    )]
    body_timeout_secs: Option<u64>,
}

/// The transport part of a [`super::Config`]: the transport's own configuration, and the drain of the process.
#[derive(Debug)]
pub(super) struct Transport {
    pub config: TransportConfig,
    /// `--shutdown-grace`.
    pub shutdown_grace: Duration,
    /// `--drain-delay`.
    pub drain_delay: Duration,
}

impl TransportArgs {
    /// The transport's configuration, over what identity enforces (`access`); `redis_timeout` is the Redis
    /// deadline when there is Redis. Deprecated aliases add a warning to `deprecated`.
    ///
    /// # Errors
    /// A session idle TTL shorter than the lease, a lease too short for the Redis deadline, or unusable
    /// `requestState` keys (none with Redis).
    pub(super) fn into_config(
        self,
        access: Access,
        redis_timeout: Option<Duration>,
        deprecated: &mut Vec<String>,
    ) -> Result<Transport, ServerError> {
        let mut d = |name, value, alias, unit| renamed(name, value, alias, unit, deprecated);
        let session_idle_ttl = d("session-idle-ttl", self.session_idle_ttl, self.session_idle_ttl_secs, Unit::Secs);
        let lease_ttl = d("lease-ttl", self.lease_ttl, self.lease_ttl_ms, Unit::Ms);
        let keep_alive = d("keep-alive", self.keep_alive, self.keep_alive_ms, Unit::Ms);
        let retry = d("retry", self.retry, self.retry_ms, Unit::Ms);
        let sse_after = d("sse-after", self.sse_after, self.sse_after_ms, Unit::Ms);
        let client_request_timeout =
            d("client-request-timeout", self.client_request_timeout, self.client_request_timeout_secs, Unit::Secs);
        let tool_timeout = d("tool-timeout", self.tool_timeout, self.tool_timeout_secs, Unit::Secs);
        let cancel_watch_after = d("cancel-watch-after", self.cancel_watch_after, self.cancel_watch_after_ms, Unit::Ms);
        let shutdown_grace = d("shutdown-grace", self.shutdown_grace, self.shutdown_grace_secs, Unit::Secs);
        let drain_delay = d("drain-delay", self.drain_delay, self.drain_delay_secs, Unit::Secs);
        let header_read_timeout =
            d("header-read-timeout", self.header_read_timeout, self.header_read_timeout_secs, Unit::Secs);
        let body_timeout = d("body-timeout", self.body_timeout, self.body_timeout_secs, Unit::Secs);
        if session_idle_ttl < lease_ttl {
            // Live streams keep their session alive by renewing every third of a lease; that must beat the idle TTL.
            return Err(config_error(format!(
                "--session-idle-ttl ({}) must be at least --lease-ttl ({}) long",
                human(session_idle_ttl),
                human(lease_ttl)
            )));
        }
        if let Some(timeout) = redis_timeout.filter(|t| lease_ttl < 3 * *t) {
            // A lease is renewed every third of its life; a renewal that may take a whole Redis timeout must fit.
            return Err(config_error(format!(
                "--lease-ttl ({}) must be at least 3 × --redis-timeout ({})",
                human(lease_ttl),
                human(timeout)
            )));
        }
        let config = TransportConfig {
            allowed_origins: access.allowed_origins,
            allowed_hosts: access.allowed_hosts,
            max_body_bytes: usize::try_from(self.max_body_bytes).unwrap_or(usize::MAX),
            session_idle_ttl,
            lease_ttl,
            keep_alive,
            retry,
            sse_after,
            client_request_timeout,
            tool_timeout,
            cancel_watch_after,
            protected_resource: access.protected_resource,
            tool_scopes: access.tool_scopes,
            max_header_bytes: usize::try_from(self.max_header_bytes).unwrap_or(usize::MAX),
            header_read_timeout,
            body_timeout,
            rate_key_by_peer: access.rate_key_by_peer,
            request_state: request_state_keys(
                &self.request_state_keys,
                self.request_state_ttl,
                redis_timeout.is_some(),
            )?,
            cache_ttl: self.cache_ttl,
            idempotency_ttl: self.idempotency_ttl,
            ..TransportConfig::default()
        };
        Ok(Transport { config, shutdown_grace, drain_delay })
    }
}

/// The `requestState` key ring from `KID:BASE64SECRET` values; a random key for a single process without Redis.
fn request_state_keys(raw: &[Secret], ttl: Duration, redis: bool) -> Result<RequestStateKeys, ServerError> {
    if raw.is_empty() {
        if redis {
            return Err(config_error(
                "--request-state-key is required with Redis: every replica must verify the requestState the others sign",
            ));
        }
        return Ok(RequestStateKeys::random(ttl));
    }
    let keys = super::secret::key_ring(raw, "--request-state-key")?;
    RequestStateKeys::new(keys, ttl).map_err(|e| config_error(format!("--request-state-key: {e}")))
}

#[cfg(test)]
mod tests {
    use super::super::tests::serve;
    use super::*;

    const KEY: &str = "k:dGVzdC1mbGVldC1yZXF1ZXN0LXN0YXRlLWtleS0wMTIzNDU2Nzg5YWI=";

    /// Every renamed duration flag: its new name, its deprecated alias, its default, and a value in the one syntax.
    const RENAMED: [(&str, &str, Duration, &str, Duration); 12] = [
        ("--session-idle-ttl", "--session-idle-ttl-secs", Duration::from_secs(1800), "90m", Duration::from_secs(5400)),
        ("--lease-ttl", "--lease-ttl-ms", Duration::from_secs(6), "1500ms", Duration::from_millis(1500)),
        ("--keep-alive", "--keep-alive-ms", Duration::from_secs(15), "100ms", Duration::from_millis(100)),
        ("--retry", "--retry-ms", Duration::from_secs(1), "0s", Duration::ZERO),
        ("--sse-after", "--sse-after-ms", Duration::from_secs(5), "200ms", Duration::from_millis(200)),
        (
            "--client-request-timeout",
            "--client-request-timeout-secs",
            Duration::from_secs(60),
            "1s",
            Duration::from_secs(1),
        ),
        ("--tool-timeout", "--tool-timeout-secs", Duration::from_secs(120), "1h", Duration::from_secs(3600)),
        ("--cancel-watch-after", "--cancel-watch-after-ms", Duration::from_millis(50), "60s", Duration::from_secs(60)),
        ("--shutdown-grace", "--shutdown-grace-secs", Duration::from_secs(25), "0s", Duration::ZERO),
        ("--drain-delay", "--drain-delay-secs", Duration::from_secs(5), "10m", Duration::from_secs(600)),
        ("--header-read-timeout", "--header-read-timeout-secs", Duration::from_secs(10), "2s", Duration::from_secs(2)),
        ("--body-timeout", "--body-timeout-secs", Duration::from_secs(30), "1m", Duration::from_secs(60)),
    ];

    /// The value of each renamed flag in a config.
    fn durations(c: &super::super::Config) -> [Duration; 12] {
        let t = &c.transport;
        [
            t.session_idle_ttl,
            t.lease_ttl,
            t.keep_alive,
            t.retry,
            t.sse_after,
            t.client_request_timeout,
            t.tool_timeout,
            t.cancel_watch_after,
            c.shutdown_grace,
            c.drain_delay,
            t.header_read_timeout,
            t.body_timeout,
        ]
    }

    #[test]
    fn the_defaults_are_the_old_ones() {
        let c = serve(&[]).unwrap();
        let defaults: Vec<Duration> = RENAMED.iter().map(|r| r.2).collect();
        assert_eq!(durations(&c).to_vec(), defaults);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let t = &c.transport;
        assert_eq!((t.cache_ttl, t.idempotency_ttl), (Duration::from_secs(300), Duration::from_secs(86_400)));
        assert_eq!((t.max_body_bytes, t.max_header_bytes), (1024 * 1024, 16 * 1024));
    }

    #[test]
    fn every_renamed_flag_takes_a_duration_and_its_alias_a_bare_number_with_a_warning() {
        for (i, (new, old, _, value, expected)) in RENAMED.iter().enumerate() {
            let c = serve(&[*new, *value]).unwrap_or_else(|e| panic!("{new} {value}: {e}"));
            assert_eq!(durations(&c)[i], *expected, "{new} {value}");
            assert!(c.warnings.is_empty(), "{new}: {:?}", c.warnings);

            let bare = if old.ends_with("-ms") { expected.as_millis() } else { u128::from(expected.as_secs()) };
            let c = serve(&[*old, &bare.to_string()]).unwrap_or_else(|e| panic!("{old} {bare}: {e}"));
            assert_eq!(durations(&c)[i], *expected, "{old} {bare}");
            assert_eq!(c.warnings.len(), 1, "{old}: {:?}", c.warnings);
            let env = old.trim_start_matches("--").replace('-', "_").to_uppercase();
            assert!(
                c.warnings[0].starts_with(&format!("{old} (MCPFLEET_{env}) is deprecated: use {new} ")),
                "{:?}",
                c.warnings
            );

            let both = serve(&[*new, *value, *old, &bare.to_string()]).unwrap_err().to_string();
            assert!(both.contains("cannot be used with") && both.contains(new) && both.contains(old), "{both}");
            assert!(serve(&[*new, &bare.to_string()]).is_err() || bare == 0, "{new} needs a unit");
        }
    }

    #[test]
    fn ranges_and_the_rules_between_durations() {
        let err = |args: &[&str]| serve(args).unwrap_err().to_string();
        assert!(err(&["--lease-ttl", "299ms"]).contains("must be between 300ms and 10m"));
        assert!(err(&["--lease-ttl-ms", "1"]).contains("1 is not in 300..=600000"));
        assert_eq!(
            err(&["--session-idle-ttl", "1s"]),
            "--session-idle-ttl (1s) must be at least --lease-ttl (6s) long"
        );
        assert_eq!(
            err(&["--session-idle-ttl-secs", "1", "--lease-ttl-ms", "6000"]),
            "--session-idle-ttl (1s) must be at least --lease-ttl (6s) long"
        );
        let redis = ["--redis-url", "redis://127.0.0.1:1/", "--request-state-key", KEY, "--redis-timeout", "500ms"];
        assert_eq!(
            err(&[&redis[..], &["--lease-ttl", "1s"]].concat()),
            "--lease-ttl (1s) must be at least 3 × --redis-timeout (500ms)"
        );
        assert!(serve(&[&redis[..], &["--lease-ttl", "1500ms"]].concat()).is_ok());
        assert!(err(&["--cache-ttl=-1s"]).contains("needs a number and a unit"));
        assert_eq!(serve(&["--cache-ttl", "0"]).unwrap().transport.cache_ttl, Duration::ZERO);
    }

    #[test]
    fn request_state_keys_are_checked() {
        let err = |args: &[&str]| serve(args).unwrap_err().to_string();
        for redis in
            [&["--redis-url", "redis://127.0.0.1:1/"][..], &["--redis-mode", "cluster", "--redis-nodes", "a:1"]]
        {
            assert!(err(redis).starts_with("--request-state-key is required with Redis"), "{redis:?}");
        }
        assert_eq!(err(&["--request-state-key", "nocolon"]), "--request-state-key must be KID:BASE64SECRET");
        assert_eq!(err(&["--request-state-key", "k:!!"]), "--request-state-key \"k\": the secret is not base64");
        assert!(err(&["--request-state-key", "k:c2hvcnQ="]).starts_with("--request-state-key: "));
        assert!(serve(&["--request-state-key", KEY]).is_ok());
    }
}
