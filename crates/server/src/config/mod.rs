//! The operator contract: every flag of `mcpfleet serve`, with its `MCPFLEET_*` environment equivalent, and the
//! other subcommands. This is the only module that reads the environment (through clap). Parsed once; a bad value
//! exits with code 64 and a one-line reason.
//!
//! One module per area, each with its flags (a `clap::Args` flattened into `serve`) and the step that turns them
//! into its part of [`Config`]: `store`, `auth` (identity and the Host/Origin allow lists), `limits`,
//! `transport` (timings, sizes, keys, the drain). `cli` holds the one duration syntax (`250ms`, `30s`, `5m`, `1h`),
//! the deprecated `*-ms`/`*-secs` aliases, which still work and leave a warning in [`Config::warnings`], and the
//! one-line configuration error every area returns; `secret` the type that keeps secrets out of `Debug`.

mod auth;
mod cli;
mod database;
mod downstream;
mod dpop;
mod limits;
mod policy;
mod secret;
mod skills;
mod store;
mod tasks;
mod transport;

pub use auth::{AuthConfig, AuthMode, JwtTyp, KeysFrom};
pub use database::{AuditConfig, AuditTrail, DatabaseConfig, DbCommand, DbRequest};
pub use downstream::{DownstreamsConfig, KeyRing};
pub use policy::{Apply, Explain, PolicyFollow, PolicyRequest, Revoke, RevokeAction, Rollback};
pub use secret::Secret;
pub use skills::SkillsConfig;

use cli::config_error;

use crate::ServerError;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};
use mcpfleet_limits::LimitsConfig;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Exit code for bad configuration (sysexits `EX_USAGE`).
pub const EXIT_CONFIG: i32 = 64;
/// Exit code when a dependency (Redis, PostgreSQL) is unreachable at start (sysexits `EX_UNAVAILABLE`).
pub const EXIT_UNAVAILABLE: i32 = 69;
/// Exit code when the database schema is behind this binary: run `mcpfleet migrate` (sysexits `EX_CONFIG`).
pub const EXIT_SCHEMA: i32 = 78;

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
    /// Apply the database migrations this binary carries (under an advisory lock; a no-op when current).
    Migrate(database::MigrateArgs),
    /// Load deterministic demo data for the reference tools (replaces earlier demo data).
    #[cfg(feature = "reference")]
    DemoData(database::DemoArgs),
    /// The audit trail: verify its hash chains, export it, apply retention.
    #[command(subcommand)]
    Audit(database::AuditCommand),
    /// Policy as data (docs/POLICY.md): plans, the rules that assign them, tenant quotas.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Refuse a principal (or one of its tokens) on every replica within a second, and close its streams;
    /// --lift ends it, --list shows those in force (docs/POLICY.md).
    Revoke(Box<policy::RevokeArgs>),
}

#[derive(Debug, clap::Args)]
struct LintArgs {
    /// The server's MCP endpoint, e.g. https://mcp.example.com/mcp.
    url: String,
    /// A bearer token to send.
    #[arg(long, env = "MCPFLEET_LINT_TOKEN", hide_env_values = true)]
    token: Option<Secret>,
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
    /// Lifetime, like 1h or 30m; 1s to 30d.
    #[arg(long, default_value = "1h", value_parser = cli::duration("1s", "30d"), conflicts_with = "ttl_secs")]
    ttl: Duration,
    /// Deprecated: --ttl, in seconds.
    #[arg(long, hide = true, value_parser = clap::value_parser!(u64).range(1..=30 * 24 * 3600))]
    ttl_secs: Option<u64>,
    /// The dev issuer's key file (created if missing), shared with `serve --auth dev`.
    #[arg(long, env = "MCPFLEET_DEV_KEY_FILE")]
    dev_key_file: Option<PathBuf>,
    /// Bind the token to this DPoP key (its RFC 7638 thumbprint, `cnf.jkt`): it is then usable only with proofs
    /// signed by that key (`serve --dpop allow|require`).
    #[arg(long)]
    dpop_jkt: Option<String>,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address to listen on. The endpoint is /mcp.
    #[arg(long, env = "MCPFLEET_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Register a fixture set. Never on by default. Only in a build with the fixture sets (the `mcpfleet`
    /// binary), and only for a server without tools of its own.
    #[cfg(any(feature = "fixtures", feature = "reference"))]
    #[arg(long, env = "MCPFLEET_FIXTURES", value_enum)]
    fixtures: Option<Fixtures>,
    /// Address of the admin listener: /metrics, /healthz, /readyz. Keep it private.
    #[arg(long, env = "MCPFLEET_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    admin_listen: SocketAddr,
    /// OTLP/HTTP endpoint for traces (e.g. http://otel-collector:4318); spans go to `<endpoint>/v1/traces`. Unset:
    /// no spans are exported (trace ids still appear in logs and tool errors).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// The share of new traces sampled (0 to 1; parent-based: a request whose caller sampled, or did not, follows
    /// its caller). 1 samples every trace.
    #[arg(long, env = "MCPFLEET_TRACE_SAMPLE_RATIO", default_value_t = 1.0, value_parser = sample_ratio)]
    trace_sample_ratio: f64,
    /// Development defaults: --auth dev, and text logs unless --log-format says otherwise.
    #[arg(long, env = "MCPFLEET_DEV")]
    dev: bool,
    /// Log line format: auto (text when stderr is a terminal, JSON otherwise), json or text.
    #[arg(long, env = "MCPFLEET_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "MCPFLEET_LOG", default_value = "info")]
    log: String,
    /// Threads that serve requests (1 to 256). Unset: one per CPU the process may use. A replica on one thread
    /// spends less CPU per call (fewer cross-thread wake-ups); more threads let one replica use more cores.
    #[arg(long, env = "MCPFLEET_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=256))]
    worker_threads: Option<u16>,
    #[command(flatten)]
    store: store::StoreArgs,
    #[command(flatten)]
    auth: auth::AuthArgs,
    #[command(flatten)]
    limits: limits::LimitsArgs,
    #[command(flatten)]
    transport: transport::TransportArgs,
    #[command(flatten)]
    tasks: tasks::TaskArgs,
    #[command(flatten)]
    database: database::ServeDbArgs,
    #[command(flatten)]
    policy: policy::ServePolicyArgs,
    #[command(flatten)]
    downstreams: downstream::DownstreamArgs,
    #[command(flatten)]
    skills: skills::SkillArgs,
    #[command(flatten)]
    dpop: dpop::DpopArgs,
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

/// Optional fixture sets (cargo features `fixtures` and `reference`, on by default).
#[cfg(any(feature = "fixtures", feature = "reference"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Fixtures {
    /// The tools, resources, prompts and completion the MCP conformance suite expects.
    #[cfg(feature = "fixtures")]
    Conformance,
    /// The conformance set, and the tools of scenarios the conformance repository is still adding whose definitions
    /// today's SDKs refuse (SEP-2106's array and number output schemas): for those scenarios only.
    #[cfg(feature = "fixtures")]
    ConformanceDraft,
    /// The reference tools (search_docs, get_customer_summary, create_refund_draft, confirm_refund_draft,
    /// export_report, get_ticket): on PostgreSQL with --database-url (any number of replicas), else over in-process
    /// demo data (one replica only).
    #[cfg(feature = "reference")]
    Reference,
    /// Tools with open input schemas, one per kind of lint offence: the server refuses to start with them (a test
    /// of the startup lint).
    #[cfg(feature = "fixtures")]
    Open,
}

/// The parsed, validated configuration of `mcpfleet serve`.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub redis: Option<mcpfleet_state::RedisConfig>,
    /// Approximate number of events kept per session, in either store.
    pub max_events: usize,
    pub auth: AuthConfig,
    #[cfg(any(feature = "fixtures", feature = "reference"))]
    pub fixtures: Option<Fixtures>,
    pub transport: mcpfleet_transport::TransportConfig,
    pub dev: bool,
    pub log: String,
    /// `--worker-threads`: the runtime's worker threads; `None`, one per CPU the process may use.
    pub worker_threads: Option<usize>,
    /// `--log-format`; `--dev` alone means text.
    pub log_format: LogFormat,
    /// How long running calls may take to finish after shutdown begins.
    pub shutdown_grace: Duration,
    pub admin_listen: SocketAddr,
    /// Where spans are exported (OTLP/HTTP), if anywhere.
    pub otlp_endpoint: Option<String>,
    /// `--trace-sample-ratio`: the share of new root traces sampled, in [0, 1].
    pub trace_sample_ratio: f64,
    /// How long the server keeps serving after SIGTERM, with /readyz at 503, before it stops accepting.
    pub drain_delay: Duration,
    pub limits: LimitsConfig,
    /// PostgreSQL, when `--database-url` is given: the reference tools' data and the audit trail.
    pub database: Option<DatabaseConfig>,
    /// Where the policy document comes from: the store, or `--policy FILE` (docs/POLICY.md).
    pub policy: PolicyFollow,
    /// `--downstreams FILE`, its secrets read (docs/DOWNSTREAM.md); `None`: tools reach no downstream.
    pub downstreams: Option<DownstreamsConfig>,
    /// `--skills DIR` and its settings (docs/SKILLS.md).
    pub skills: SkillsConfig,
    /// `--dpop` and its settings (docs/IDENTITY.md#dpop); `resource` is the configured resource URL (none with
    /// `--auth dev`, where it is the request's host).
    pub dpop: mcpfleet_auth::dpop::DpopSettings,
    /// Deprecated settings that were used (a `*-ms`/`*-secs` alias, a bare number), one line each: parsing happens
    /// before logging starts, so `run` logs them once it has.
    pub warnings: Vec<String>,
}

/// `mcpfleet token`.
#[derive(Debug)]
pub struct TokenRequest {
    pub sub: String,
    pub scope: String,
    pub client_id: Option<String>,
    pub ttl: Duration,
    pub key_file: PathBuf,
    /// The DPoP key to bind the token to (`cnf.jkt`).
    pub dpop_jkt: Option<String>,
    /// Deprecated flags that were used, for stderr.
    pub warnings: Vec<String>,
}

/// What `mcpfleet lint` was asked.
#[derive(Debug)]
pub struct LintRequest {
    pub url: String,
    pub token: Option<Secret>,
    pub json: bool,
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    Serve(Box<Config>),
    Token(TokenRequest),
    Lint(LintRequest),
    /// `migrate`, `demo-data`, `audit …`.
    Db(DbRequest),
    /// `policy …`.
    Policy(Box<PolicyRequest>),
    /// `--help` or `--version`: print and exit 0.
    Info(String),
}

/// Parses the arguments of the `mcpfleet` binary (and `MCPFLEET_*` variables).
///
/// # Errors
/// A one-line [`ServerError::Config`].
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Parsed, ServerError> {
    parse_as(args, "mcpfleet", env!("CARGO_PKG_VERSION"))
}

/// Parses the arguments of a server named `name` at `version`: the same command line as `mcpfleet`'s, with that
/// name in `--help` and `--version`; the configuration carries them as the `serverInfo`.
///
/// # Errors
/// A one-line [`ServerError::Config`].
pub fn parse_as<I: IntoIterator<Item = OsString>>(args: I, name: &str, version: &str) -> Result<Parsed, ServerError> {
    let command = Cli::command().name(name.to_owned()).bin_name(name.to_owned()).version(version.to_owned());
    let parsed = command.try_get_matches_from(args).and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
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
    match cli.command {
        Command::Serve(a) => {
            let mut config = a.into_config()?;
            config.transport.server_name = name.to_owned();
            if let Some(pr) = &mut config.transport.protected_resource {
                pr.resource_name = name.to_owned();
            }
            config.transport.server_version = version.to_owned();
            Ok(Parsed::Serve(Box::new(config)))
        }
        Command::Token(t) => Ok(Parsed::Token(t.into_request()?)),
        Command::Lint(l) => Ok(Parsed::Lint(l.into_request()?)),
        Command::Migrate(m) => Ok(Parsed::Db(DbRequest { settings: m.db.required()?, command: DbCommand::Migrate })),
        #[cfg(feature = "reference")]
        Command::DemoData(d) => {
            Ok(Parsed::Db(DbRequest { settings: d.db.required()?, command: DbCommand::DemoData { scale: d.scale } }))
        }
        Command::Audit(a) => Ok(Parsed::Db(a.into_request()?)),
        Command::Policy(p) => Ok(Parsed::Policy(Box::new(p.into_request()?))),
        Command::Revoke(r) => Ok(Parsed::Policy(Box::new(r.into_request()?))),
    }
}

impl ServeArgs {
    /// Each area's part, in the order their checks run: identity, store, transport (which needs both), limits
    /// (which lease their slots for as long as the transport leases streams).
    fn into_config(self) -> Result<Config, ServerError> {
        let mut warnings = Vec::new();
        let identity = self.auth.into_config(self.listen, self.dev, &mut warnings)?;
        let store = self.store.into_config()?;
        let policy = self.policy.into_config(store.redis.is_some())?;
        let downstreams = self
            .downstreams
            .into_config(matches!(identity.auth, AuthConfig::None), matches!(identity.auth, AuthConfig::Dev { .. }))?;
        let redis_timeout = store.redis.as_ref().map(|r| r.timeout);
        let mut transport = self.transport.into_config(identity.access, redis_timeout, &mut warnings)?;
        transport.config.tasks = self.tasks.into_config(transport.config.tool_timeout, redis_timeout)?;
        let limits = self.limits.into_config(transport.config.lease_ttl)?;
        let database = self.database.into_config()?;
        let skills = self.skills.into_config()?;
        let mut dpop = self.dpop.into_config(matches!(identity.auth, AuthConfig::None))?;
        if matches!(identity.auth, AuthConfig::Jwt { .. }) {
            dpop.resource = transport.config.protected_resource.as_ref().map(|pr| pr.resource.clone());
        }
        transport.config.dpop = dpop.mode;
        let otlp_endpoint = match self.otlp_endpoint.filter(|e| !e.is_empty()) {
            Some(e) if e.starts_with("http://") || e.starts_with("https://") => {
                Some(e.trim_end_matches('/').to_owned())
            }
            Some(e) => {
                return Err(config_error(format!("OTEL_EXPORTER_OTLP_ENDPOINT {e:?} must be an http(s):// URL")));
            }
            None => None,
        };
        Ok(Config {
            listen: self.listen,
            redis: store.redis,
            max_events: store.max_events,
            auth: identity.auth,
            #[cfg(any(feature = "fixtures", feature = "reference"))]
            fixtures: self.fixtures,
            transport: transport.config,
            dev: self.dev,
            log: self.log,
            worker_threads: self.worker_threads.map(usize::from),
            log_format: self.log_format.unwrap_or(if self.dev { LogFormat::Text } else { LogFormat::Auto }),
            shutdown_grace: transport.shutdown_grace,
            admin_listen: self.admin_listen,
            otlp_endpoint,
            trace_sample_ratio: self.trace_sample_ratio,
            drain_delay: transport.drain_delay,
            limits,
            database,
            policy,
            downstreams,
            skills,
            dpop,
            warnings,
        })
    }
}

impl TokenArgs {
    fn into_request(self) -> Result<TokenRequest, ServerError> {
        if !auth::valid_scope(&self.sub.replace(' ', "_"))
            || self.scope.split_whitespace().any(|s| !auth::valid_scope(s))
        {
            return Err(config_error("--sub and --scope must be visible ASCII without quotes or backslashes"));
        }
        let (ttl, warnings) = match self.ttl_secs {
            Some(secs) => {
                let ttl = Duration::from_secs(secs);
                (ttl, vec![format!("--ttl-secs is deprecated: use --ttl with a unit, like {}", cli::human(ttl))])
            }
            None => (self.ttl, Vec::new()),
        };
        Ok(TokenRequest {
            sub: self.sub,
            scope: self.scope,
            client_id: self.client_id,
            ttl,
            key_file: self.dev_key_file.unwrap_or_else(auth::default_dev_key_file),
            dpop_jkt: self.dpop_jkt,
            warnings,
        })
    }
}

impl LintArgs {
    fn into_request(self) -> Result<LintRequest, ServerError> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(config_error("lint: the URL must be http:// or https://"));
        }
        Ok(LintRequest { url: self.url, token: self.token, json: self.json })
    }
}

/// A share in [0, 1].
fn sample_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err("must be a number between 0 and 1".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `mcpfleet serve ARGS`, parsed.
    pub(in crate::config) fn serve(args: &[&str]) -> Result<Box<Config>, ServerError> {
        let all = ["mcpfleet", "serve"].iter().chain(args).map(OsString::from);
        match parse(all)? {
            Parsed::Serve(c) => Ok(c),
            other => panic!("not serve: {other:?}"),
        }
    }

    fn parsed(args: &[&str]) -> Result<Parsed, ServerError> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn no_secret_reaches_debug() {
        let (password, state_secret, token) =
            ("hunter2-password", "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTAxMjM0NTY3ODk=", "eyJ-lint-token");
        let url = format!("redis://user:{password}@127.0.0.1:1/");
        let key = format!("kid1:{state_secret}");
        let c = serve(&["--redis-url", &url, "--request-state-key", &key, "--lease-ttl", "6s"]).unwrap();
        assert_eq!(c.redis.as_ref().unwrap().topology, mcpfleet_state::RedisTopology::Standalone { url: url.clone() });
        let debug = format!("{c:?}");
        for secret in [password, state_secret, &key] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
        }
        assert!(debug.contains("[redacted]") && debug.contains("kid1"), "{debug}");

        let lint = parsed(&["mcpfleet", "lint", "https://mcp.example.com/mcp", "--token", token]).unwrap();
        let Parsed::Lint(req) = &lint else { panic!("{lint:?}") };
        assert_eq!(req.token.as_ref().map(Secret::expose), Some(token));
        assert!(!format!("{lint:?}").contains(token), "{lint:?}");
    }

    #[test]
    fn the_subcommands() {
        assert!(matches!(parsed(&["mcpfleet", "--help"]), Ok(Parsed::Info(_))));
        assert!(matches!(parsed(&["mcpfleet", "serve", "--help"]), Ok(Parsed::Info(_))));
        let e = parsed(&["mcpfleet", "lint", "ftp://x"]).unwrap_err().to_string();
        assert_eq!(e, "lint: the URL must be http:// or https://");
        let token = |args: &[&str]| match parsed(&[&["mcpfleet", "token"][..], args].concat()) {
            Ok(Parsed::Token(t)) => Ok(t),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        };
        let t = token(&[]).unwrap();
        assert_eq!((t.sub.as_str(), t.scope.as_str(), t.ttl), ("dev", "mcp:access", Duration::from_secs(3600)));
        assert!(t.warnings.is_empty());
        assert_eq!(token(&["--ttl", "30m"]).unwrap().ttl, Duration::from_secs(1800));
        let old = token(&["--ttl-secs", "90"]).unwrap();
        assert_eq!(
            (old.ttl, old.warnings.as_slice()),
            (Duration::from_secs(90), &["--ttl-secs is deprecated: use --ttl with a unit, like 90s".to_owned()][..])
        );
        assert!(token(&["--ttl", "1h", "--ttl-secs", "60"]).unwrap_err().contains("cannot be used with"));
        assert!(token(&["--ttl", "31d"]).unwrap_err().contains("between 1ms and 30d"));
        assert!(token(&["--ttl", "3600"]).unwrap_err().contains("needs a number and a unit"));
        assert_eq!(
            token(&["--scope", "a\"b"]).unwrap_err(),
            "--sub and --scope must be visible ASCII without quotes or backslashes"
        );
    }

    #[test]
    fn a_server_of_its_own_is_named_in_help_version_server_info_and_metadata() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let Ok(Parsed::Serve(c)) = parse_as(args(&["greet", "serve", "--auth", "dev"]), "greet", "1.2.3") else {
            panic!("serve")
        };
        assert_eq!((c.transport.server_name.as_str(), c.transport.server_version.as_str()), ("greet", "1.2.3"));
        assert_eq!(c.transport.protected_resource.map(|p| p.resource_name).as_deref(), Some("greet"));
        let Ok(Parsed::Info(version)) = parse_as(args(&["greet", "--version"]), "greet", "1.2.3") else { panic!() };
        assert_eq!(version.trim(), "greet 1.2.3");
        let Ok(Parsed::Info(help)) = parse_as(args(&["greet", "--help"]), "greet", "1.2.3") else { panic!() };
        assert!(help.contains("Usage: greet <COMMAND>"), "{help}");
        let Ok(Parsed::Serve(c)) = parse(args(&["mcpfleet", "serve"])) else { panic!("serve") };
        assert_eq!(c.transport.server_name, "mcpfleet");
    }

    #[test]
    fn worker_threads_are_bounded() {
        assert_eq!(serve(&[]).unwrap().worker_threads, None, "unset: one per CPU");
        assert_eq!(serve(&["--worker-threads", "1"]).unwrap().worker_threads, Some(1));
        assert_eq!(serve(&["--worker-threads", "256"]).unwrap().worker_threads, Some(256));
        for bad in ["0", "257", "two"] {
            let e = serve(&["--worker-threads", bad]).unwrap_err();
            assert_eq!(e.exit_code(), 64, "{bad}");
            assert!(e.to_string().contains("--worker-threads"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_sample_ratio_is_a_share() {
        assert!((serve(&[]).unwrap().trace_sample_ratio - 1.0).abs() < f64::EPSILON, "every trace by default");
        assert!((serve(&["--trace-sample-ratio", "0.25"]).unwrap().trace_sample_ratio - 0.25).abs() < f64::EPSILON);
        for bad in ["-0.1", "1.5", "NaN", "x"] {
            let e = serve(&[&format!("--trace-sample-ratio={bad}")]).unwrap_err().to_string();
            assert!(e.contains("--trace-sample-ratio"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_otlp_endpoint_is_an_http_url() {
        let c = serve(&["--otlp-endpoint", "http://collector:4318/"]).unwrap();
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://collector:4318"));
        assert_eq!(serve(&["--otlp-endpoint", ""]).unwrap().otlp_endpoint, None);
        let e = serve(&["--otlp-endpoint", "collector:4318"]).unwrap_err().to_string();
        assert_eq!(e, "OTEL_EXPORTER_OTLP_ENDPOINT \"collector:4318\" must be an http(s):// URL");
    }
}
