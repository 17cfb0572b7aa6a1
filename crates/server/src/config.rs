//! The operator contract: every flag of `mcpfleet serve`, with its `MCPFLEET_*` environment equivalent. This is
//! the only module that reads the environment (through clap). Parsed once; a bad value exits with code 64 and a
//! one-line reason.

use clap::{Parser, Subcommand, ValueEnum};
use mcpfleet_transport::HostPattern;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::time::Duration;

/// Exit code for bad configuration (sysexits `EX_USAGE`).
pub const EXIT_CONFIG: i32 = 64;
/// Exit code when a dependency (Redis) is unreachable at start (sysexits `EX_UNAVAILABLE`).
pub const EXIT_UNAVAILABLE: i32 = 69;

#[derive(Debug, Parser)]
#[command(name = "mcpfleet", version, about = "A fleet-ready MCP server: any replica serves any message of a session")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve MCP (Streamable HTTP) on /mcp.
    Serve(ServeArgs),
}

/// How callers are identified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// No authentication: every caller is one anonymous principal. Refuses a non-loopback listen address.
    None,
}

/// Optional fixture sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fixtures {
    /// The tools, resources, prompts and completion the MCP conformance suite expects.
    Conformance,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address to listen on. The endpoint is /mcp.
    #[arg(long, env = "MCPFLEET_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Redis URL (redis://[user:password@]host:port/db). Without it the server uses the in-memory store, which is
    /// single-replica only.
    #[arg(long, env = "MCPFLEET_REDIS_URL", hide_env_values = true)]
    redis_url: Option<String>,
    /// Prefix of every Redis key and channel.
    #[arg(long, env = "MCPFLEET_REDIS_PREFIX", default_value = "mcp:")]
    redis_prefix: String,
    /// Deadline of every Redis call, in milliseconds.
    #[arg(long, env = "MCPFLEET_REDIS_TIMEOUT_MS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    redis_timeout_ms: u64,
    /// Approximate number of events kept per session for resumption.
    #[arg(long, env = "MCPFLEET_MAX_EVENTS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(16..=1_000_000))]
    max_events: u64,
    /// How callers are identified.
    #[arg(long, env = "MCPFLEET_AUTH", value_enum, default_value = "none")]
    auth: AuthMode,
    /// Allowed Origin values, comma-separated (scheme://host[:port], or scheme://host:* for any port). A request
    /// without Origin is allowed; any other Origin gets 403.
    #[arg(
        long,
        env = "MCPFLEET_ALLOWED_ORIGINS",
        value_delimiter = ',',
        default_value = "http://localhost:*,http://127.0.0.1:*,http://[::1]:*"
    )]
    allowed_origins: Vec<String>,
    /// Allowed Host header values, comma-separated (host[:port], or host:*). Others get 403.
    #[arg(
        long,
        env = "MCPFLEET_ALLOWED_HOSTS",
        value_delimiter = ',',
        default_value = "localhost:*,127.0.0.1:*,[::1]:*"
    )]
    allowed_hosts: Vec<String>,
    /// Register a fixture set. Never on by default.
    #[arg(long, env = "MCPFLEET_FIXTURES", value_enum)]
    fixtures: Option<Fixtures>,
    /// Largest accepted POST body, in bytes.
    #[arg(long, env = "MCPFLEET_MAX_BODY_BYTES", default_value_t = 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=64 * 1024 * 1024))]
    max_body_bytes: u64,
    /// Idle time after which a session expires, in seconds.
    #[arg(long, env = "MCPFLEET_SESSION_IDLE_TTL_SECS", default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..=7 * 24 * 3600))]
    session_idle_ttl_secs: u64,
    /// Lease on a running call's stream, in milliseconds: a resumer reports the call as lost this long after its
    /// replica died.
    #[arg(long, env = "MCPFLEET_LEASE_TTL_MS", default_value_t = 6000, value_parser = clap::value_parser!(u64).range(300..=600_000))]
    lease_ttl_ms: u64,
    /// Keep-alive comment interval on idle SSE streams, in milliseconds.
    #[arg(long, env = "MCPFLEET_KEEP_ALIVE_MS", default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    keep_alive_ms: u64,
    /// `retry:` hint sent before the server closes a stream's connection, in milliseconds.
    #[arg(long, env = "MCPFLEET_RETRY_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    retry_ms: u64,
    /// A call silent for this long switches to SSE (keep-alives, resumable), in milliseconds.
    #[arg(long, env = "MCPFLEET_SSE_AFTER_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    sse_after_ms: u64,
    /// How long a server→client request waits for the client's answer, in seconds.
    #[arg(long, env = "MCPFLEET_CLIENT_REQUEST_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    client_request_timeout_secs: u64,
    /// A call running longer than this subscribes to its session's doorbell to hear cancellations, in
    /// milliseconds. Shorter calls cost one Redis round trip and cannot be cancelled (they are already done).
    #[arg(long, env = "MCPFLEET_CANCEL_WATCH_AFTER_MS", default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    cancel_watch_after_ms: u64,
    /// On SIGTERM, how long running tool calls may take to finish after the listener closes, in seconds. Their
    /// clients resume them on other replicas meanwhile.
    #[arg(long, env = "MCPFLEET_SHUTDOWN_GRACE_SECS", default_value_t = 25, value_parser = clap::value_parser!(u64).range(0..=3600))]
    shutdown_grace_secs: u64,
    /// Human-readable logs instead of JSON.
    #[arg(long, env = "MCPFLEET_DEV")]
    dev: bool,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "MCPFLEET_LOG", default_value = "info")]
    log: String,
}

/// Redis settings. The URL may hold a password, so Debug never prints it.
#[derive(Clone)]
pub struct RedisSettings {
    pub url: String,
    pub prefix: String,
    pub timeout: Duration,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &"<redacted>")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The parsed, validated configuration of `mcpfleet serve`.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub redis: Option<RedisSettings>,
    /// Approximate number of events kept per session, in either store.
    pub max_events: usize,
    pub auth: AuthMode,
    pub fixtures: Option<Fixtures>,
    pub transport: mcpfleet_transport::TransportConfig,
    pub dev: bool,
    pub log: String,
    /// How long running calls may take to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    Serve(Box<Config>),
    /// `--help` or `--version`: print and exit 0.
    Info(String),
}

/// A configuration error: one line, exit code 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn patterns(what: &str, raw: &[String]) -> Result<Vec<HostPattern>, ConfigError> {
    raw.iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            HostPattern::parse(s)
                .ok_or_else(|| ConfigError(format!("invalid {what} entry {s:?}: expected value or value:*")))
        })
        .collect()
}

/// Parses arguments (and `MCPFLEET_*` variables).
///
/// # Errors
/// A one-line [`ConfigError`].
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Parsed, ConfigError> {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp
                    | clap::error::ErrorKind::DisplayVersion
                    | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            return Ok(Parsed::Info(e.to_string()));
        }
        Err(e) => {
            let first =
                e.to_string().lines().next().unwrap_or("invalid arguments").trim_start_matches("error: ").to_owned();
            return Err(ConfigError(first));
        }
    };
    let Command::Serve(a) = cli.command;
    if a.auth == AuthMode::None && !a.listen.ip().is_loopback() {
        return Err(ConfigError(format!("--auth none refuses to listen on non-loopback address {}", a.listen)));
    }
    let redis = match a.redis_url {
        Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") || url.starts_with("unix://") => {
            Some(RedisSettings { url, prefix: a.redis_prefix, timeout: Duration::from_millis(a.redis_timeout_ms) })
        }
        Some(_) => return Err(ConfigError("--redis-url must start with redis://, rediss:// or unix://".to_owned())),
        None => None,
    };
    let lease_ttl = Duration::from_millis(a.lease_ttl_ms);
    if a.session_idle_ttl_secs * 1000 < a.lease_ttl_ms {
        // Live streams keep their session alive by renewing every third of a lease; that must beat the idle TTL.
        return Err(ConfigError(format!(
            "--session-idle-ttl-secs ({}) must be at least --lease-ttl-ms ({}) long",
            a.session_idle_ttl_secs, a.lease_ttl_ms
        )));
    }
    if redis.is_some() && a.lease_ttl_ms < 3 * a.redis_timeout_ms {
        // A lease is renewed every third of its life; a renewal that may take a whole Redis timeout must fit.
        return Err(ConfigError(format!(
            "--lease-ttl-ms ({}) must be at least 3 × --redis-timeout-ms ({})",
            a.lease_ttl_ms, a.redis_timeout_ms
        )));
    }
    let transport = mcpfleet_transport::TransportConfig {
        allowed_origins: patterns("--allowed-origins", &a.allowed_origins)?,
        allowed_hosts: patterns("--allowed-hosts", &a.allowed_hosts)?,
        max_body_bytes: usize::try_from(a.max_body_bytes).unwrap_or(usize::MAX),
        session_idle_ttl: Duration::from_secs(a.session_idle_ttl_secs),
        lease_ttl,
        keep_alive: Duration::from_millis(a.keep_alive_ms),
        retry: Duration::from_millis(a.retry_ms),
        sse_after: Duration::from_millis(a.sse_after_ms),
        client_request_timeout: Duration::from_secs(a.client_request_timeout_secs),
        cancel_watch_after: Duration::from_millis(a.cancel_watch_after_ms),
        ..mcpfleet_transport::TransportConfig::default()
    };
    if transport.allowed_hosts.is_empty() {
        return Err(ConfigError("--allowed-hosts is empty: no request could ever be served".to_owned()));
    }
    let max_events = usize::try_from(a.max_events).unwrap_or(usize::MAX);
    Ok(Parsed::Serve(Box::new(Config {
        listen: a.listen,
        redis,
        max_events,
        auth: a.auth,
        fixtures: a.fixtures,
        transport,
        dev: a.dev,
        log: a.log,
        shutdown_grace: Duration::from_secs(a.shutdown_grace_secs),
    })))
}
