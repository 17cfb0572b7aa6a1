//! The operator contract: every flag of `mcpfleet serve`, with its `MCPFLEET_*` environment equivalent. This is
//! the only module that reads the environment (through clap). Parsed once; a bad value exits with code 64 and a
//! one-line reason.

use crate::ServerError;
use clap::{Parser, Subcommand, ValueEnum};
use mcpfleet_auth::{JwtSettings, ProtectedResource, TypPolicy, dev, split_url};
use mcpfleet_limits::{FailMode, LimitsConfig, Quota, RateLimit};
use mcpfleet_transport::HostPattern;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
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
    Serve(Box<ServeArgs>),
    /// Mint an access token from the dev issuer (`serve --auth dev`), for local use.
    Token(TokenArgs),
    /// Lint the tool input schemas of any MCP server (Streamable HTTP): exit 1 on errors, 69 if unreachable.
    Lint(LintArgs),
}

#[derive(Debug, clap::Args)]
struct LintArgs {
    /// The server's MCP endpoint, e.g. https://mcp.example.com/mcp.
    url: String,
    /// A bearer token to send.
    #[arg(long, env = "MCPFLEET_LINT_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// One JSON document instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct TokenArgs {
    /// The token's subject (`sub`).
    #[arg(long, default_value = "dev")]
    sub: String,
    /// Space-separated scopes.
    #[arg(long, default_value = "mcp:access")]
    scope: String,
    /// The token's `client_id`.
    #[arg(long)]
    client_id: Option<String>,
    /// Lifetime, in seconds.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=30 * 24 * 3600))]
    ttl_secs: u64,
    /// The dev issuer's key file (created if missing), shared with `serve --auth dev`.
    #[arg(long, env = "MCPFLEET_DEV_KEY_FILE")]
    dev_key_file: Option<PathBuf>,
}

/// The format of log lines on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Text when stderr is a terminal, JSON lines otherwise (a container's log collector, a file, a pipe).
    Auto,
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

impl LogFormat {
    /// Whether the logs are text, given whether stderr is a terminal.
    #[must_use]
    pub fn is_text(self, stderr_is_terminal: bool) -> bool {
        match self {
            Self::Auto => stderr_is_terminal,
            Self::Json => false,
            Self::Text => true,
        }
    }
}

/// How callers are identified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// No authentication: every caller is one anonymous principal with every scope. Loopback only.
    None,
    /// OAuth 2.1 resource server: JWT access tokens from --jwt-issuer, verified with --jwks-url or --jwks-file.
    Jwt,
    /// An embedded issuer (key in --dev-key-file) that prints a token at start; `mcpfleet token` mints more.
    /// Loopback only.
    Dev,
}

/// Which `typ` header JWT access tokens may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum JwtTyp {
    /// `at+jwt` only (RFC 9068).
    #[value(name = "at+jwt")]
    AtJwt,
    /// `at+jwt` or `JWT` (issuers that do not label access tokens).
    #[value(name = "at+jwt-or-jwt")]
    AtJwtOrJwt,
}

/// Where JWT verification keys come from.
#[derive(Clone, Debug)]
pub enum KeysFrom {
    /// A JWKS URL, fetched with this timeout.
    Url { url: String, timeout: Duration },
    /// A JWKS or PEM file.
    File(PathBuf),
}

/// The identity configuration.
#[derive(Clone, Debug)]
pub enum AuthConfig {
    None,
    Jwt { settings: JwtSettings, keys: KeysFrom, refresh_interval: Duration },
    Dev { key_file: PathBuf, required_scopes: Vec<String> },
}

/// Optional fixture sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fixtures {
    /// The tools, resources, prompts and completion the MCP conformance suite expects.
    Conformance,
    /// The reference tools (search_docs, get_customer_summary, create_refund_draft, confirm_refund_draft,
    /// export_report, get_ticket) over in-memory demo data per principal: one replica only.
    Reference,
    /// Tools with open input schemas, one per kind of lint offence: the server refuses to start with them (a test
    /// of the startup lint).
    Open,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RateFailMode {
    Closed,
    Open,
}

fn redis_timeout(s: &str) -> Result<Duration, String> {
    let d = mcpfleet_limits::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(60) {
        return Err("must be between 10ms and 60s".to_owned());
    }
    Ok(d)
}

/// A duration between 1 s and 30 days.
fn bounded_duration(s: &str) -> Result<Duration, String> {
    let d = mcpfleet_limits::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(30 * 24 * 3600) {
        return Err("must be between 1s and 30d".to_owned());
    }
    Ok(d)
}

/// A duration of at most 30 days, or 0s.
fn duration_or_zero(s: &str) -> Result<Duration, String> {
    if s == "0" || s == "0s" {
        return Ok(Duration::ZERO);
    }
    bounded_duration(s)
}

/// The `requestState` key ring from `KID:BASE64SECRET` values; a random key for a single process without Redis.
fn request_state_keys(
    raw: &[String],
    ttl: Duration,
    redis: bool,
) -> Result<mcpfleet_transport::RequestStateKeys, ServerError> {
    use base64::Engine as _;
    if raw.is_empty() {
        if redis {
            return Err(config_error(
                "--request-state-key is required with --redis-url: every replica must verify the requestState the others sign",
            ));
        }
        return Ok(mcpfleet_transport::RequestStateKeys::random(ttl));
    }
    let mut keys = Vec::new();
    for r in raw {
        let Some((kid, secret)) = r.split_once(':') else {
            return Err(config_error("--request-state-key must be KID:BASE64SECRET"));
        };
        let secret = base64::engine::general_purpose::STANDARD
            .decode(secret)
            .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(secret))
            .map_err(|_| config_error(format!("--request-state-key {kid:?}: the secret is not base64")))?;
        keys.push((kid.to_owned(), secret));
    }
    mcpfleet_transport::RequestStateKeys::new(keys, ttl).map_err(|e| config_error(format!("--request-state-key: {e}")))
}

fn rate_per_second(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && (0.001..=1_000_000.0).contains(&r) => Ok(r),
        _ => Err("must be a number between 0.001 and 1000000".to_owned()),
    }
}

/// `TOOL=LIMIT/WINDOW` or `TOOL=off`, repeatable; a tool named twice is an error.
fn quotas(raw: &[String]) -> Result<BTreeMap<String, Option<Quota>>, ServerError> {
    let mut map = BTreeMap::new();
    for entry in raw.iter().filter(|e| !e.trim().is_empty()) {
        let (tool, q) =
            entry.split_once('=').map(|(t, q)| (t.trim(), q.trim())).filter(|(t, _)| valid_tool_name(t)).ok_or_else(
                || config_error(format!("invalid --quota {entry:?}: expected TOOL=LIMIT/WINDOW or TOOL=off")),
            )?;
        let q = if q == "off" {
            None
        } else {
            Some(q.parse::<Quota>().map_err(|e| config_error(format!("--quota {tool}: {e}")))?)
        };
        if map.insert(tool.to_owned(), q).is_some() {
            return Err(config_error(format!("--quota {tool} is given twice")));
        }
    }
    Ok(map)
}

/// An MCP tool name: `[A-Za-z0-9_.-]{1,128}`.
fn valid_tool_name(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
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
    /// Deadline of every Redis call (also connecting, and waiting for a pooled connection), like 2s or 250ms;
    /// 10ms to 60s. A missed deadline is a 503 with Retry-After.
    #[arg(long, env = "MCPFLEET_REDIS_TIMEOUT", default_value = "2s", value_parser = redis_timeout)]
    redis_timeout: Duration,
    /// Requests a principal may make at once: the capacity of its token bucket, shared by every replica. 0 turns
    /// the rate limit off.
    #[arg(long, env = "MCPFLEET_RATE_BURST", default_value_t = 300, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    rate_burst: u32,
    /// Requests per second a principal's bucket refills.
    #[arg(long, env = "MCPFLEET_RATE_PER_SECOND", default_value_t = 20.0, value_parser = rate_per_second)]
    rate_per_second: f64,
    /// A per-principal quota on a tool, TOOL=LIMIT/WINDOW (like search=10/1h; WINDOW in ms, s, m, h or d), over
    /// the tool's own; TOOL=off lifts the tool's own. Repeatable.
    #[arg(long, env = "MCPFLEET_QUOTAS", value_delimiter = ',')]
    quota: Vec<String>,
    /// Open sessions per principal across the fleet; 0 means no cap.
    #[arg(long, env = "MCPFLEET_MAX_SESSIONS_PER_USER", default_value_t = 64)]
    max_sessions_per_user: u64,
    /// Open SSE (GET) streams per principal across the fleet; 0 means no cap.
    #[arg(long, env = "MCPFLEET_MAX_STREAMS_PER_USER", default_value_t = 16)]
    max_streams_per_user: u64,
    /// Tool calls in flight per principal across the fleet; 0 means no cap.
    #[arg(long, env = "MCPFLEET_MAX_INFLIGHT_PER_USER", default_value_t = 16)]
    max_inflight_per_user: u64,
    /// When Redis cannot answer: closed refuses with 503 (default); open decides the rate limit on a local
    /// bucket of burst ÷ --replicas per replica (session checks, caps and quotas still fail closed), and counts
    /// every such decision in mcp_limit_fail_open_total.
    #[arg(long, env = "MCPFLEET_RATE_FAIL_MODE", value_enum, default_value = "closed")]
    rate_fail_mode: RateFailMode,
    /// How many replicas run: sizes the fail-open bucket (--rate-fail-mode open).
    #[arg(long, env = "MCPFLEET_REPLICAS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    replicas: u32,
    /// Approximate number of events kept per session for resumption.
    #[arg(long, env = "MCPFLEET_MAX_EVENTS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(16..=1_000_000))]
    max_events: u64,
    /// How callers are identified [default: none; dev with --dev]
    #[arg(long, env = "MCPFLEET_AUTH", value_enum)]
    auth: Option<AuthMode>,
    /// The only trusted token issuer (`iss`, compared exactly). Required with --auth jwt.
    #[arg(long, env = "MCPFLEET_JWT_ISSUER")]
    jwt_issuer: Option<String>,
    /// Our audience: a token's `aud` must be this, or an array containing it. Required with --auth jwt.
    #[arg(long, env = "MCPFLEET_JWT_AUDIENCE")]
    jwt_audience: Option<String>,
    /// The issuer's JWKS URL (https, or http on loopback). One of --jwks-url and --jwks-file is required with
    /// --auth jwt.
    #[arg(long, env = "MCPFLEET_JWKS_URL", conflicts_with = "jwks_file")]
    jwks_url: Option<String>,
    /// A JWKS document or a PEM public key, re-read like a URL is re-fetched.
    #[arg(long, env = "MCPFLEET_JWKS_FILE")]
    jwks_file: Option<PathBuf>,
    /// Deadline of one JWKS fetch, in milliseconds.
    #[arg(long, env = "MCPFLEET_JWKS_TIMEOUT_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    jwks_timeout_ms: u64,
    /// A token naming an unknown `kid` refetches the keys at most once per this many seconds (it is also the
    /// shortest cache lifetime).
    #[arg(long, env = "MCPFLEET_JWKS_REFRESH_INTERVAL_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    jwks_refresh_interval_secs: u64,
    /// Clock skew allowed on exp, nbf and iat, in seconds (at most 30).
    #[arg(long, env = "MCPFLEET_JWT_LEEWAY", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=30))]
    jwt_leeway: u64,
    /// Accepted `typ` of access tokens.
    #[arg(long, env = "MCPFLEET_JWT_TYP", value_enum, default_value = "at+jwt")]
    jwt_typ: JwtTyp,
    /// Scope every request needs; repeat for several. An empty value requires none.
    #[arg(long, env = "MCPFLEET_REQUIRED_SCOPE", value_delimiter = ' ', default_value = "mcp:access")]
    required_scope: Vec<String>,
    /// The public URL of /mcp (e.g. https://mcp.example.com/mcp): the resource in the metadata and challenges.
    /// Required with --auth jwt.
    #[arg(long, env = "MCPFLEET_RESOURCE_URL")]
    resource_url: Option<String>,
    /// An authorization server clients should use (issuer URL), repeatable [default: --jwt-issuer]
    #[arg(long, env = "MCPFLEET_AUTHORIZATION_SERVERS", value_delimiter = ',')]
    authorization_server: Vec<String>,
    /// Scopes a tool needs, on top of those it declares: TOOL=SCOPE[ SCOPE...], repeatable.
    #[arg(long, env = "MCPFLEET_TOOL_SCOPES", value_delimiter = ',')]
    tool_scope: Vec<String>,
    /// The dev issuer's key file, created if missing [default: <tmp>/mcpfleet-dev-key.pem]
    #[arg(long, env = "MCPFLEET_DEV_KEY_FILE")]
    dev_key_file: Option<PathBuf>,
    /// Allowed Origin values, comma-separated (scheme://host[:port], or scheme://host:* for any port). A request
    /// without Origin is allowed; any other Origin gets 403 [default: loopback origins on a loopback listener,
    /// otherwise the origin of --resource-url]
    #[arg(long, env = "MCPFLEET_ALLOWED_ORIGINS", value_delimiter = ',')]
    allowed_origins: Option<Vec<String>>,
    /// Allowed Host header values, comma-separated (host[:port], or host:*). Others get 403 [default: loopback
    /// hosts on a loopback listener, otherwise the host of --resource-url]
    #[arg(long, env = "MCPFLEET_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Option<Vec<String>>,
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
    /// How long a tool may run before it is stopped and answered with an isError result, in seconds, unless the
    /// tool declares its own timeout.
    #[arg(long, env = "MCPFLEET_TOOL_TIMEOUT_SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=3600))]
    tool_timeout_secs: u64,
    /// A key that signs and verifies the requestState of 2026-07-28 multi round-trip requests, as
    /// `KID:BASE64SECRET` (the secret at least 32 bytes). Repeat it to rotate: the first signs, every one listed
    /// verifies. Every replica of a fleet needs the same keys; required with --redis-url. Without Redis, a random
    /// key is made at start.
    #[arg(
        long = "request-state-key",
        env = "MCPFLEET_REQUEST_STATE_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    request_state_keys: Vec<String>,
    /// How long a requestState stays valid (e.g. 10m).
    #[arg(long, env = "MCPFLEET_REQUEST_STATE_TTL", default_value = "10m", value_parser = bounded_duration)]
    request_state_ttl: Duration,
    /// The ttlMs of cacheable 2026-07-28 results: server/discover, the lists and resources/read (e.g. 5m; 0s: always
    /// stale).
    #[arg(long, env = "MCPFLEET_CACHE_TTL", default_value = "5m", value_parser = duration_or_zero)]
    cache_ttl: Duration,
    /// How long the result of a tools/call with an idempotency key (io.mcpfleet/idempotencyKey in _meta) is kept for
    /// repeats (e.g. 24h).
    #[arg(long, env = "MCPFLEET_IDEMPOTENCY_TTL", default_value = "24h", value_parser = bounded_duration)]
    idempotency_ttl: Duration,
    /// A call running longer than this subscribes to its session's doorbell to hear cancellations, in
    /// milliseconds. Shorter calls cost one Redis round trip and cannot be cancelled (they are already done).
    #[arg(long, env = "MCPFLEET_CANCEL_WATCH_AFTER_MS", default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    cancel_watch_after_ms: u64,
    /// On SIGTERM, how long running tool calls may take to finish after the listener closes, in seconds. Their
    /// clients resume them on other replicas meanwhile.
    #[arg(long, env = "MCPFLEET_SHUTDOWN_GRACE_SECS", default_value_t = 25, value_parser = clap::value_parser!(u64).range(0..=3600))]
    shutdown_grace_secs: u64,
    /// Address of the admin listener: /metrics, /healthz, /readyz. Keep it private.
    #[arg(long, env = "MCPFLEET_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    admin_listen: SocketAddr,
    /// On SIGTERM, /readyz turns 503 at once; the server keeps serving for this many seconds (so that load
    /// balancers stop sending new connections) before it stops accepting.
    #[arg(long, env = "MCPFLEET_DRAIN_DELAY_SECS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=600))]
    drain_delay_secs: u64,
    /// Largest total size of a request's headers, in bytes; more gets 431.
    #[arg(long, env = "MCPFLEET_MAX_HEADER_BYTES", default_value_t = 16 * 1024, value_parser = clap::value_parser!(u64).range(1024..=1024 * 1024))]
    max_header_bytes: u64,
    /// How long a client may take to send a request head, in seconds; slower connections are closed.
    #[arg(long, env = "MCPFLEET_HEADER_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    header_read_timeout_secs: u64,
    /// How long a client may take to send a request body, in seconds; slower gets 408.
    #[arg(long, env = "MCPFLEET_BODY_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=600))]
    body_timeout_secs: u64,
    /// OTLP/HTTP endpoint for traces (e.g. http://otel-collector:4318); spans go to `<endpoint>/v1/traces`. Unset:
    /// no spans are exported (trace ids still appear in logs and tool errors).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Development defaults: --auth dev, and text logs unless --log-format says otherwise.
    #[arg(long, env = "MCPFLEET_DEV")]
    dev: bool,
    /// Log line format: auto (text when stderr is a terminal, JSON otherwise), json or text.
    #[arg(long, env = "MCPFLEET_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
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
    pub auth: AuthConfig,
    pub fixtures: Option<Fixtures>,
    pub transport: mcpfleet_transport::TransportConfig,
    pub dev: bool,
    pub log: String,
    /// `--log-format`; `--dev` alone means text.
    pub log_format: LogFormat,
    /// How long running calls may take to finish after shutdown begins.
    pub shutdown_grace: Duration,
    pub admin_listen: SocketAddr,
    /// Where spans are exported (OTLP/HTTP), if anywhere.
    pub otlp_endpoint: Option<String>,
    /// How long the server keeps serving after SIGTERM, with /readyz at 503, before it stops accepting.
    pub drain_delay: Duration,
    pub limits: LimitsConfig,
}

/// `mcpfleet token`.
#[derive(Debug)]
pub struct TokenRequest {
    pub sub: String,
    pub scope: String,
    pub client_id: Option<String>,
    pub ttl: Duration,
    pub key_file: PathBuf,
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    Serve(Box<Config>),
    Token(TokenRequest),
    Lint(crate::lint::LintRequest),
    /// `--help` or `--version`: print and exit 0.
    Info(String),
}

fn config_error(msg: impl Into<String>) -> ServerError {
    ServerError::Config(msg.into())
}

fn patterns(what: &str, raw: &[String]) -> Result<Vec<HostPattern>, ServerError> {
    raw.iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            HostPattern::parse(s)
                .ok_or_else(|| config_error(format!("invalid {what} entry {s:?}: expected value or value:*")))
        })
        .collect()
}

fn default_dev_key_file() -> PathBuf {
    std::env::temp_dir().join("mcpfleet-dev-key.pem")
}

/// The scheme and the host (without port; an IPv6 host keeps its brackets) of an `http(s)://` URL.
fn scheme_and_host(url: &str) -> Option<(&str, &str)> {
    let (origin, _) = split_url(url)?;
    let (scheme, authority) = origin.split_once("://")?;
    let host =
        if authority.starts_with('[') { &authority[..=authority.find(']')?] } else { authority.split(':').next()? };
    Some((scheme, host))
}

/// A URL whose host is loopback (`localhost`, `127.0.0.0/8`, `[::1]`).
fn loopback_url(url: &str) -> bool {
    scheme_and_host(url).is_some_and(|(_, host)| {
        host == "localhost" || host == "[::1]" || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
    })
}

fn tool_scopes(raw: &[String]) -> Result<BTreeMap<String, Vec<String>>, ServerError> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in raw.iter().filter(|e| !e.trim().is_empty()) {
        let (tool, scopes) = entry
            .split_once('=')
            .filter(|(t, s)| !t.trim().is_empty() && !s.trim().is_empty())
            .ok_or_else(|| config_error(format!("invalid --tool-scope {entry:?}: expected TOOL=SCOPE[ SCOPE...]")))?;
        map.entry(tool.trim().to_owned()).or_default().extend(scopes.split_whitespace().map(str::to_owned));
    }
    Ok(map)
}

/// A scope token (RFC 6749 §3.3): visible ASCII except `"` and `\`.
fn valid_scope(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
}

/// Parses arguments (and `MCPFLEET_*` variables).
///
/// # Errors
/// A one-line [`ServerError::Config`].
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Parsed, ServerError> {
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
            return Err(config_error(first));
        }
    };
    let a = match cli.command {
        Command::Serve(a) => a,
        Command::Lint(l) => {
            if !(l.url.starts_with("http://") || l.url.starts_with("https://")) {
                return Err(config_error("lint: the URL must be http:// or https://"));
            }
            return Ok(Parsed::Lint(crate::lint::LintRequest { url: l.url, token: l.token, json: l.json }));
        }
        Command::Token(t) => {
            if !valid_scope(&t.sub.replace(' ', "_")) || t.scope.split_whitespace().any(|s| !valid_scope(s)) {
                return Err(config_error("--sub and --scope must be visible ASCII without quotes or backslashes"));
            }
            return Ok(Parsed::Token(TokenRequest {
                sub: t.sub,
                scope: t.scope,
                client_id: t.client_id,
                ttl: Duration::from_secs(t.ttl_secs),
                key_file: t.dev_key_file.unwrap_or_else(default_dev_key_file),
            }));
        }
    };
    let mode = a.auth.unwrap_or(if a.dev { AuthMode::Dev } else { AuthMode::None });
    if mode != AuthMode::Jwt && !a.listen.ip().is_loopback() {
        let name = if mode == AuthMode::None { "none" } else { "dev" };
        return Err(config_error(format!("--auth {name} refuses to listen on non-loopback address {}", a.listen)));
    }
    let required_scopes: Vec<String> =
        a.required_scope.iter().flat_map(|s| s.split_whitespace()).map(str::to_owned).collect();
    let tool_scopes = tool_scopes(&a.tool_scope)?;
    if let Some(bad) = required_scopes.iter().chain(tool_scopes.values().flatten()).find(|s| !valid_scope(s)) {
        return Err(config_error(format!(
            "invalid scope {bad:?}: scopes are visible ASCII without quotes or backslashes"
        )));
    }
    let (auth, resource_url, authorization_servers) = match mode {
        AuthMode::None => (AuthConfig::None, None, Vec::new()),
        AuthMode::Dev => {
            let resource = a.resource_url.clone().unwrap_or_else(|| format!("http://{}/mcp", a.listen));
            let key_file = a.dev_key_file.clone().unwrap_or_else(default_dev_key_file);
            let auth = AuthConfig::Dev { key_file, required_scopes: required_scopes.clone() };
            (auth, Some(resource), vec![dev::DEV_ISSUER.to_owned()])
        }
        AuthMode::Jwt => {
            let missing = |flag: &str| config_error(format!("--auth jwt needs {flag}"));
            let issuer = a.jwt_issuer.clone().filter(|s| !s.is_empty()).ok_or_else(|| missing("--jwt-issuer"))?;
            let audience = a.jwt_audience.clone().filter(|s| !s.is_empty()).ok_or_else(|| missing("--jwt-audience"))?;
            let resource = a.resource_url.clone().ok_or_else(|| missing("--resource-url"))?;
            let keys = match (&a.jwks_url, &a.jwks_file) {
                (Some(url), None) => {
                    if !(url.starts_with("https://") || (url.starts_with("http://") && loopback_url(url)))
                        || split_url(url).is_none()
                    {
                        return Err(config_error("--jwks-url must be an https:// URL (http:// only on loopback)"));
                    }
                    KeysFrom::Url { url: url.clone(), timeout: Duration::from_millis(a.jwks_timeout_ms) }
                }
                (None, Some(file)) => KeysFrom::File(file.clone()),
                _ => return Err(missing("--jwks-url or --jwks-file")),
            };
            let settings = JwtSettings {
                issuer: issuer.clone(),
                audience,
                leeway: Duration::from_secs(a.jwt_leeway),
                typ: match a.jwt_typ {
                    JwtTyp::AtJwt => TypPolicy::AtJwt,
                    JwtTyp::AtJwtOrJwt => TypPolicy::AtJwtOrJwt,
                },
                required_scopes: required_scopes.clone(),
            };
            let servers = if a.authorization_server.is_empty() { vec![issuer] } else { a.authorization_server.clone() };
            let refresh_interval = Duration::from_secs(a.jwks_refresh_interval_secs);
            (AuthConfig::Jwt { settings, keys, refresh_interval }, Some(resource), servers)
        }
    };
    if let Some(r) = &resource_url {
        let ok = split_url(r).is_some() && (r.starts_with("https://") || loopback_url(r) || mode == AuthMode::Dev);
        if !ok {
            return Err(config_error(format!(
                "--resource-url {r:?} must be an absolute https:// URL without query or fragment (http:// only on loopback)"
            )));
        }
    }
    // DNS-rebinding protection: a loopback listener answers loopback names only; a public one, by default, only
    // the name in its resource URL.
    let public = resource_url.as_deref().filter(|_| !a.listen.ip().is_loopback()).and_then(scheme_and_host);
    let (default_origins, default_hosts) = match public {
        Some((scheme, host)) => (vec![format!("{scheme}://{host}:*")], vec![format!("{host}:*")]),
        None => (
            vec!["http://localhost:*".into(), "http://127.0.0.1:*".into(), "http://[::1]:*".into()],
            vec!["localhost:*".into(), "127.0.0.1:*".into(), "[::1]:*".into()],
        ),
    };
    let protected_resource = resource_url.map(|resource| ProtectedResource {
        resource,
        authorization_servers,
        // The tools' scopes are added once the catalog is known (build_state).
        scopes_supported: required_scopes.clone(),
        required_scopes: required_scopes.clone(),
    });
    let redis = match a.redis_url {
        Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") || url.starts_with("unix://") => {
            Some(RedisSettings { url, prefix: a.redis_prefix, timeout: a.redis_timeout })
        }
        Some(_) => return Err(config_error("--redis-url must start with redis://, rediss:// or unix://")),
        None => None,
    };
    let lease_ttl = Duration::from_millis(a.lease_ttl_ms);
    if a.session_idle_ttl_secs * 1000 < a.lease_ttl_ms {
        // Live streams keep their session alive by renewing every third of a lease; that must beat the idle TTL.
        return Err(config_error(format!(
            "--session-idle-ttl-secs ({}) must be at least --lease-ttl-ms ({}) long",
            a.session_idle_ttl_secs, a.lease_ttl_ms
        )));
    }
    if redis.is_some() && lease_ttl < 3 * a.redis_timeout {
        // A lease is renewed every third of its life; a renewal that may take a whole Redis timeout must fit.
        return Err(config_error(format!(
            "--lease-ttl-ms ({}) must be at least 3 × --redis-timeout ({} ms)",
            a.lease_ttl_ms,
            a.redis_timeout.as_millis()
        )));
    }
    let limits = LimitsConfig {
        rate: (a.rate_burst > 0).then_some(RateLimit { burst: a.rate_burst, per_second: a.rate_per_second }),
        quotas: quotas(&a.quota)?,
        max_sessions: a.max_sessions_per_user,
        max_streams: a.max_streams_per_user,
        max_inflight: a.max_inflight_per_user,
        fail_mode: match a.rate_fail_mode {
            RateFailMode::Closed => FailMode::Closed,
            RateFailMode::Open => FailMode::Open,
        },
        replicas: a.replicas,
        // A dead replica's slots are free as soon as its stream leases run out.
        slot_ttl: lease_ttl,
        ..LimitsConfig::default()
    };
    let transport = mcpfleet_transport::TransportConfig {
        allowed_origins: patterns("--allowed-origins", a.allowed_origins.as_deref().unwrap_or(&default_origins))?,
        allowed_hosts: patterns("--allowed-hosts", a.allowed_hosts.as_deref().unwrap_or(&default_hosts))?,
        max_body_bytes: usize::try_from(a.max_body_bytes).unwrap_or(usize::MAX),
        session_idle_ttl: Duration::from_secs(a.session_idle_ttl_secs),
        lease_ttl,
        keep_alive: Duration::from_millis(a.keep_alive_ms),
        retry: Duration::from_millis(a.retry_ms),
        sse_after: Duration::from_millis(a.sse_after_ms),
        client_request_timeout: Duration::from_secs(a.client_request_timeout_secs),
        tool_timeout: Duration::from_secs(a.tool_timeout_secs),
        cancel_watch_after: Duration::from_millis(a.cancel_watch_after_ms),
        protected_resource,
        tool_scopes,
        max_header_bytes: usize::try_from(a.max_header_bytes).unwrap_or(usize::MAX),
        header_read_timeout: Duration::from_secs(a.header_read_timeout_secs),
        body_timeout: Duration::from_secs(a.body_timeout_secs),
        rate_key_by_peer: mode == AuthMode::None,
        request_state: request_state_keys(&a.request_state_keys, a.request_state_ttl, redis.is_some())?,
        cache_ttl: a.cache_ttl,
        idempotency_ttl: a.idempotency_ttl,
        ..mcpfleet_transport::TransportConfig::default()
    };
    if transport.allowed_hosts.is_empty() {
        return Err(config_error("--allowed-hosts is empty: no request could ever be served"));
    }
    let max_events = usize::try_from(a.max_events).unwrap_or(usize::MAX);
    Ok(Parsed::Serve(Box::new(Config {
        listen: a.listen,
        redis,
        max_events,
        auth,
        fixtures: a.fixtures,
        transport,
        dev: a.dev,
        log: a.log,
        log_format: a.log_format.unwrap_or(if a.dev { LogFormat::Text } else { LogFormat::Auto }),
        shutdown_grace: Duration::from_secs(a.shutdown_grace_secs),
        admin_listen: a.admin_listen,
        otlp_endpoint: match a.otlp_endpoint.filter(|e| !e.is_empty()) {
            Some(e) if e.starts_with("http://") || e.starts_with("https://") => {
                Some(e.trim_end_matches('/').to_owned())
            }
            Some(e) => {
                return Err(config_error(format!("OTEL_EXPORTER_OTLP_ENDPOINT {e:?} must be an http(s):// URL")));
            }
            None => None,
        },
        drain_delay: Duration::from_secs(a.drain_delay_secs),
        limits,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> Result<Box<Config>, ServerError> {
        let all = ["mcpfleet", "serve"].iter().chain(args).map(OsString::from);
        match parse(all)? {
            Parsed::Serve(c) => Ok(c),
            other => panic!("not serve: {other:?}"),
        }
    }

    const JWT: [&str; 10] = [
        "--auth",
        "jwt",
        "--jwt-issuer",
        "https://idp.example",
        "--jwt-audience",
        "https://mcp.example.com/mcp",
        "--jwks-url",
        "https://idp.example/jwks",
        "--resource-url",
        "https://mcp.example.com/mcp",
    ];

    #[test]
    fn a_public_listener_allows_only_the_resource_host_by_default() {
        let mut args = vec!["--listen", "0.0.0.0:8080"];
        args.extend(JWT);
        let c = serve(&args).unwrap();
        let hosts = &c.transport.allowed_hosts;
        assert!(
            hosts.iter().any(|h| h.matches("mcp.example.com"))
                && hosts.iter().any(|h| h.matches("mcp.example.com:443"))
        );
        assert!(!hosts.iter().any(|h| h.matches("localhost:8080") || h.matches("evil.example")));
        let origins = &c.transport.allowed_origins;
        assert!(origins.iter().any(|o| o.matches("https://mcp.example.com")));
        assert!(!origins.iter().any(|o| o.matches("http://localhost:3000") || o.matches("https://evil.example")));
        let pr = c.transport.protected_resource.as_ref().unwrap();
        assert_eq!(pr.authorization_servers, vec!["https://idp.example".to_owned()]);
        assert_eq!(pr.metadata_url(), "https://mcp.example.com/.well-known/oauth-protected-resource/mcp");
    }

    #[test]
    fn a_loopback_listener_allows_loopback_names_only() {
        let mut args = vec!["--listen", "127.0.0.1:8080"];
        args.extend(JWT);
        let c = serve(&args).unwrap();
        assert!(c.transport.allowed_hosts.iter().any(|h| h.matches("localhost:8080")));
        assert!(!c.transport.allowed_hosts.iter().any(|h| h.matches("mcp.example.com")));
    }

    #[test]
    fn explicit_allowlists_and_tool_scopes_are_kept() {
        let mut args = vec!["--allowed-hosts", "a.example:*", "--tool-scope", "t1=s1 s2", "--tool-scope", "t2=s3"];
        args.extend(JWT);
        let c = serve(&args).unwrap();
        assert!(c.transport.allowed_hosts.iter().any(|h| h.matches("a.example:1")));
        assert_eq!(c.transport.tool_scopes["t1"], vec!["s1".to_owned(), "s2".to_owned()]);
        assert!(serve(&["--tool-scope", "no-equals"]).is_err());
        assert!(serve(&["--required-scope", "bad\"scope"]).is_err());
    }

    #[test]
    fn jwt_mode_checks_its_urls() {
        let with = |flag: &str, value: &str| {
            let mut args: Vec<&str> = JWT.to_vec();
            let i = args.iter().position(|a| *a == flag).unwrap();
            args[i + 1] = value;
            serve(&args).map(|_| ())
        };
        assert!(with("--jwks-url", "http://idp.example/jwks").is_err(), "plain http to a remote issuer");
        assert!(with("--jwks-url", "http://127.0.0.1:9000/jwks").is_ok());
        assert!(with("--resource-url", "http://mcp.example.com/mcp").is_err());
        assert!(with("--resource-url", "https://mcp.example.com/mcp?x=1").is_err());
        assert!(serve(&["--auth", "jwt", "--jwt-leeway", "31"]).is_err());
        // --dev alone means --auth dev, and text logs unless --log-format says otherwise.
        assert!(matches!(serve(&["--dev"]).unwrap().auth, AuthConfig::Dev { .. }));
        assert_eq!(serve(&["--dev"]).unwrap().log_format, LogFormat::Text);
        assert_eq!(serve(&["--dev", "--log-format", "json"]).unwrap().log_format, LogFormat::Json);
        assert_eq!(serve(&[]).unwrap().log_format, LogFormat::Auto);
        assert!(LogFormat::Auto.is_text(true) && !LogFormat::Auto.is_text(false));
        assert!(serve(&["--log-format", "yaml"]).is_err());
    }
}
