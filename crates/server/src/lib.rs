//! mcpfleet, the server: config → telemetry → state → [`AppState`] → [`serve`]. The binary is a thin wrapper
//! around [`run`]. This crate wires the others together and owns nothing else.

pub mod config;
mod database;
pub mod lint;
mod log;

pub use mcpfleet_transport::{AppState, serve};

use config::{AuthConfig, Config, EXIT_CONFIG, EXIT_SCHEMA, EXIT_UNAVAILABLE, Fixtures, KeysFrom, Parsed};
use mcpfleet_auth::dev::DevIssuer;
use mcpfleet_auth::dev_oauth::DevAuthServer;
use mcpfleet_auth::{AuthError, AuthMetrics, Authenticator, JwtAuthenticator, KeySource, NoAuth, RemoteJwks};
use mcpfleet_db::Database;
use mcpfleet_fixtures::{ConformanceCatalog, OpenCatalog};
use mcpfleet_limits::{LimitMetrics, Limiter};
use mcpfleet_state::{MemoryStore, RedisConfig, RedisStore, Router as _, StateError, Store, StoreMetrics};
use mcpfleet_tools::{Catalog, EmptyCatalog};
use mcpfleet_transport::{AdminState, Shared, TransportMetrics, admin_router};
use opentelemetry_sdk::trace::SdkTracerProvider;
use prometheus::Registry;
use std::ffi::OsString;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Why the server cannot start. Each kind has its exit code.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A bad flag or environment variable, or an unusable key file: exit 64.
    #[error("{0}")]
    Config(String),
    /// Redis unreachable at start: exit 69.
    #[error("cannot reach Redis: {0}")]
    Store(#[source] StateError),
    /// PostgreSQL unreachable at start: exit 69.
    #[error("{0}")]
    Database(#[source] mcpfleet_db::DbError),
    /// The database schema is behind this binary (or was edited): exit 78.
    #[error("{0}")]
    Schema(String),
}

impl ServerError {
    /// The process exit code (sysexits).
    #[must_use]
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) => EXIT_CONFIG,
            Self::Store(_) | Self::Database(_) => EXIT_UNAVAILABLE,
            Self::Schema(_) => EXIT_SCHEMA,
        }
    }
}

impl From<AuthError> for ServerError {
    fn from(e: AuthError) -> Self {
        Self::Config(e.to_string())
    }
}

/// The authenticator a config asks for. A JWKS URL that cannot be fetched at start is not fatal: requests get 503
/// until the first load succeeds (the issuer may start after us); a key file must be usable at once.
async fn build_auth(
    auth: &AuthConfig,
    dev: Option<&DevIssuer>,
    metrics: AuthMetrics,
) -> Result<Arc<dyn Authenticator>, ServerError> {
    Ok(match (auth, dev) {
        (AuthConfig::Dev { required_scopes, .. }, Some(issuer)) => {
            let keys = KeySource::Static(Arc::new(issuer.key_set()));
            Arc::new(JwtAuthenticator::new(DevIssuer::settings(required_scopes.clone()), keys).with_metrics(metrics))
        }
        (AuthConfig::Jwt { settings, keys, refresh_interval }, _) => {
            let remote = match keys {
                KeysFrom::Url { url, timeout } => RemoteJwks::url(url.clone(), *timeout, *refresh_interval)?,
                KeysFrom::File(path) => RemoteJwks::file(path.clone(), *refresh_interval),
            }
            .with_metrics(metrics.clone());
            match (remote.load().await, keys) {
                (Ok(_), _) => {}
                (Err(e), KeysFrom::File(path)) => {
                    return Err(ServerError::Config(format!("--jwks-file {}: {e}", path.display())));
                }
                (Err(e), KeysFrom::Url { .. }) => {
                    tracing::error!(error = %e, "cannot load the issuer's keys yet; requests get 503 until they load");
                }
            }
            Arc::new(JwtAuthenticator::new(settings.clone(), KeySource::Remote(Arc::new(remote))).with_metrics(metrics))
        }
        (AuthConfig::None, _) => Arc::new(NoAuth::default()),
        // Never serve a dev configuration unauthenticated.
        (AuthConfig::Dev { .. }, None) => return Err(ServerError::Config("--auth dev: no dev issuer key".to_owned())),
    })
}

/// What [`build_state`] builds: the state the listener serves, the registry the admin listener exposes, and the
/// dev issuer when `--auth dev` asked for one (its key file is read once).
#[derive(Debug)]
pub struct Built {
    pub state: AppState,
    pub registry: Registry,
    pub dev: Option<DevIssuer>,
    /// The audit trail's writer, when there is one: the drain closes it.
    pub audit: Option<Arc<mcpfleet_db::audit::Writer>>,
}

/// The catalog `--fixtures` selects, after the start-up checks: its tools' input schemas pass the lint, and every
/// `--quota` names one of its tools. Built once, before logging starts, so that a refusal is one line.
#[derive(Debug)]
pub struct CheckedCatalog {
    catalog: Arc<dyn Catalog>,
    /// Its `tools/list` entries.
    tools: Vec<serde_json::Value>,
    /// Lint warnings, for the log.
    warnings: Vec<String>,
}

impl CheckedCatalog {
    /// Builds and checks the catalog of `cfg`; the reference tools work on `db` when there is one.
    ///
    /// # Errors
    /// [`ServerError::Config`]: a tool schema fails the lint (every offence as `tool pointer: message (rule)`), or a
    /// `--quota` names a tool this server does not have.
    pub fn new(cfg: &Config, db: Option<&Database>) -> Result<Self, ServerError> {
        let catalog: Arc<dyn Catalog> = match cfg.fixtures {
            Some(Fixtures::Conformance) => Arc::new(ConformanceCatalog),
            Some(Fixtures::Open) => Arc::new(OpenCatalog),
            Some(Fixtures::Reference) => {
                let repo: Arc<dyn mcpfleet_reference::Repository> = match db {
                    Some(db) => Arc::new(mcpfleet_reference::PgRepo::new(
                        db.pool().clone(),
                        mcpfleet_reference::PgOptions {
                            timeout: db.timeout(),
                            // Dev sign-in: a principal without data of its own works on one of the demo tenants.
                            assign_demo_tenant: matches!(cfg.auth, AuthConfig::Dev { .. } | AuthConfig::None),
                        },
                    )),
                    None => Arc::new(mcpfleet_reference::MemoryRepo::new()),
                };
                Arc::new(mcpfleet_reference::catalog(repo).map_err(ServerError::Config)?)
            }
            None => Arc::new(EmptyCatalog),
        };
        let tools = catalog.tools();
        let name = |t: &serde_json::Value| t.get("name").and_then(serde_json::Value::as_str).unwrap_or("?").to_owned();
        let (mut errors, mut warnings) = (Vec::new(), Vec::new());
        for tool in &tools {
            for f in mcpfleet_tools::lint::lint_tool(tool) {
                let line = format!("{} {f}", name(tool));
                match f.severity {
                    mcpfleet_tools::lint::Severity::Error => errors.push(line),
                    mcpfleet_tools::lint::Severity::Warning => warnings.push(line),
                }
            }
        }
        if !errors.is_empty() {
            return Err(ServerError::Config(format!("tool input schemas fail the lint: {}", errors.join("; "))));
        }
        // A quota for a tool that does not exist is a typo that would silently limit nothing.
        let known: Vec<String> = tools.iter().map(name).collect();
        if let Some(unknown) = cfg.limits.quotas.keys().find(|t| !known.contains(t)) {
            return Err(ServerError::Config(format!("--quota names {unknown:?}, which is not a tool of this server")));
        }
        Ok(Self { catalog, tools, warnings })
    }
}

/// Builds the shared state from a parsed config: the metrics registry (with process metrics), the store
/// (connecting to Redis when configured), the catalog, and the authenticator (loading its keys).
///
/// # Errors
/// A catalog that fails its checks ([`CheckedCatalog::new`]); Redis or the database unreachable at start, or its
/// schema behind; an unusable key file.
pub async fn build_state(cfg: &Config) -> Result<Built, ServerError> {
    let db = database::open(cfg)?;
    let checked = CheckedCatalog::new(cfg, db.as_ref())?;
    build_state_with(cfg, checked, db).await
}

/// [`build_state`] with a catalog already built and checked, and the database it uses.
///
/// # Errors
/// Redis or the database unreachable at start, or its schema behind; an unusable key file.
pub async fn build_state_with(
    cfg: &Config,
    checked: CheckedCatalog,
    db: Option<Database>,
) -> Result<Built, ServerError> {
    let registry = Registry::new();
    let metrics_error = |e: prometheus::Error| ServerError::Config(format!("metrics: {e}"));
    #[cfg(target_os = "linux")]
    registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self())).map_err(metrics_error)?;
    let store_metrics = StoreMetrics::register(&registry).map_err(metrics_error)?;
    let transport_metrics = TransportMetrics::register(&registry).map_err(metrics_error)?;
    let task_metrics = mcpfleet_transport::TaskMetrics::register(&registry).map_err(metrics_error)?;
    let auth_metrics = AuthMetrics::register(&registry).map_err(metrics_error)?;
    let limit_metrics = LimitMetrics::register(&registry).map_err(metrics_error)?;
    let store: Arc<dyn Store> = match &cfg.redis {
        Some(r) => {
            let rc = RedisConfig { max_events: cfg.max_events, metrics: Some(store_metrics), ..r.clone() };
            let store = RedisStore::connect(rc).await.map_err(ServerError::Store)?;
            store.ping().await.map_err(ServerError::Store)?;
            let topology = r.topology.redacted();
            tracing::info!(prefix = %r.prefix, %topology, "using the Redis store: replicas share sessions");
            Arc::new(store)
        }
        None => {
            tracing::warn!("no --redis-url: using the in-memory store, which is single-replica only");
            Arc::new(MemoryStore::with_max_events(cfg.max_events))
        }
    };
    let CheckedCatalog { catalog, tools, warnings } = checked;
    transport_metrics.seed_tools(tools.iter().filter_map(|t| t.get("name").and_then(serde_json::Value::as_str)));
    for w in warnings {
        tracing::warn!(finding = %w, "tool schema lint");
    }
    let validator = Arc::new(mcpfleet_tools::validate::Validator::new(&tools).map_err(ServerError::Config)?);
    let limits = Arc::new(Limiter::new(store.clone(), cfg.limits.clone(), limit_metrics));
    let shutdown = CancellationToken::new();
    let audit = match (&db, &cfg.database) {
        (Some(db), Some(dc)) => database::start(db, dc, &registry, &shutdown).await?,
        _ => None,
    };
    let mut transport = cfg.transport.clone();
    if let Some(pr) = &mut transport.protected_resource {
        // scopes_supported: the endpoint's, every tool's and the operator's, sorted and deduplicated.
        for tool in &tools {
            if let Some(name) = tool.get("name").and_then(serde_json::Value::as_str) {
                pr.scopes_supported.extend(catalog.tool_scopes(name));
            }
        }
        pr.scopes_supported.extend(transport.tool_scopes.values().flatten().cloned());
        pr.scopes_supported.sort();
        pr.scopes_supported.dedup();
    }
    let dev = match &cfg.auth {
        AuthConfig::Dev { key_file, .. } => Some(DevIssuer::load_or_create(key_file)?),
        _ => None,
    };
    transport.dev_jwks = dev.as_ref().map(DevIssuer::jwks);
    // The sign-in of real OAuth clients, over the same key and the scopes completed above.
    transport.dev_oauth =
        dev.as_ref().zip(transport.protected_resource.as_ref()).map(|(d, pr)| Arc::new(DevAuthServer::new(d, pr)));
    let state = AppState::new(Shared {
        store,
        catalog,
        auth: build_auth(&cfg.auth, dev.as_ref(), auth_metrics).await?,
        config: Arc::new(transport),
        shutdown,
        calls: tokio_util::task::TaskTracker::new(),
        metrics: transport_metrics,
        limits,
        validator,
        audit: audit.clone().map(|w| w as Arc<dyn mcpfleet_core::AuditSink>),
        tasks: Arc::new(mcpfleet_transport::Tasks::new(cfg.transport.tasks.clone(), task_metrics)),
    });
    Ok(Built { state, registry, dev, audit })
}

/// Installs the global tracer provider. With an OTLP endpoint, sampled spans (parent-based, always on) go out
/// in batches over OTLP/HTTP; without one nothing is recorded, but every span still gets real W3C ids, which the
/// logs and tool errors carry.
///
/// # Errors
/// The exporter cannot be built.
pub fn init_telemetry(cfg: &Config) -> Result<SdkTracerProvider, ServerError> {
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::Sampler;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name("mcpfleet").build();
    let builder = SdkTracerProvider::builder().with_resource(resource);
    let provider = match &cfg.otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{endpoint}/v1/traces"))
                .build()
                .map_err(|e| ServerError::Config(format!("OTLP exporter: {e}")))?;
            builder
                .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
                .with_batch_exporter(exporter)
                .build()
        }
        None => builder.with_sampler(Sampler::AlwaysOff).build(),
    };
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(provider)
}

/// Logs go to stderr through a buffer that a writer thread empties (see [`log`]): a request's log line costs a
/// copy under a lock, not a `write(2)` nor a wake-up on the request path. It is not lossy: when the writer falls
/// behind, callers wait rather than drop lines (the audit events must all be there). The guard writes the rest on
/// drop, at exit.
fn init_tracing(cfg: &Config) -> log::LogGuard {
    let filter =
        tracing_subscriber::EnvFilter::try_new(&cfg.log).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = log::buffered(Box::new(std::io::stderr()));
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    if cfg.log_format.is_text(terminal) {
        builder.with_ansi(false).init();
    } else {
        builder.json().event_format(log::Json::new()).init();
    }
    guard
}

/// `--auth dev`: one ready-to-use token, with every scope the server knows, on the third line of stdout.
fn print_dev_token(issuer: &DevIssuer, state: &AppState) {
    let scope = state.config.protected_resource.as_ref().map(|p| p.scopes_supported.join(" ")).unwrap_or_default();
    match issuer.mint("dev", &scope, None, std::time::Duration::from_secs(24 * 3600)) {
        Ok(token) => println!("dev token (sub=dev, scope=\"{scope}\", 24 h; mint more with `mcpfleet token`): {token}"),
        Err(e) => tracing::error!(error = %e, "cannot mint the dev token"),
    }
}

/// The first SIGTERM or SIGINT starts a graceful shutdown; a second one exits at once.
async fn shutdown_signal(token: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut next = async || match term.as_mut() {
        Some(t) => tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = t.recv() => {}
        },
        None => {
            let _ = tokio::signal::ctrl_c().await;
        }
    };
    next().await;
    tracing::info!("shutdown signal received: draining");
    token.cancel();
    next().await;
    tracing::warn!("second shutdown signal: exiting now");
    log::flush();
    std::process::exit(1);
}

/// Runs the command line; returns the process exit code.
pub fn run<I: IntoIterator<Item = OsString>>(args: I) -> i32 {
    let cfg = match config::parse(args) {
        Ok(Parsed::Serve(c)) => c,
        Ok(Parsed::Token(t)) => {
            for w in &t.warnings {
                eprintln!("mcpfleet: warning: {w}");
            }
            return match DevIssuer::load_or_create(&t.key_file)
                .and_then(|i| i.mint(&t.sub, &t.scope, t.client_id.as_deref(), t.ttl))
            {
                Ok(token) => {
                    println!("{token}");
                    0
                }
                Err(e) => {
                    eprintln!("mcpfleet: {e}");
                    EXIT_CONFIG
                }
            };
        }
        Ok(Parsed::Lint(req)) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            return match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt.block_on(lint::run(&req)),
                Err(e) => {
                    eprintln!("mcpfleet: cannot start the runtime: {e}");
                    1
                }
            };
        }
        Ok(Parsed::Db(req)) => {
            return match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt.block_on(database::command(req)),
                Err(e) => {
                    eprintln!("mcpfleet: cannot start the runtime: {e}");
                    1
                }
            };
        }
        Ok(Parsed::Info(text)) => {
            print!("{text}");
            return 0;
        }
        Err(e) => {
            eprintln!("mcpfleet: {e}");
            return e.exit_code();
        }
    };
    // The catalog is checked before logging starts, so that a refusal is one line; the reference tools need the pool.
    let (checked, db) = match database::open(&cfg).and_then(|db| Ok((CheckedCatalog::new(&cfg, db.as_ref())?, db))) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("mcpfleet: {e}");
            return e.exit_code();
        }
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cfg.worker_threads {
        builder.worker_threads(n);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcpfleet: cannot start the runtime: {e}");
            return 1;
        }
    };
    // reqwest (JWKS, OTLP) is built with rustls and no default crypto provider: name ring, once.
    let _ = rustls::crypto::ring::default_provider().install_default();
    rt.block_on(async move {
        let _log_guard = init_tracing(&cfg);
        for w in &cfg.warnings {
            tracing::warn!("{w}");
        }
        let telemetry = match init_telemetry(&cfg) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("mcpfleet: {e}");
                return e.exit_code();
            }
        };
        let Built { state, registry, dev, audit } = match build_state_with(&cfg, checked, db).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot start");
                eprintln!("mcpfleet: {e}");
                return e.exit_code();
            }
        };
        let listener = match tokio::net::TcpListener::bind(cfg.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("mcpfleet: cannot listen on {}: {e}", cfg.listen);
                return EXIT_CONFIG;
            }
        };
        let admin = match tokio::net::TcpListener::bind(cfg.admin_listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("mcpfleet: cannot listen on --admin-listen {}: {e}", cfg.admin_listen);
                return EXIT_CONFIG;
            }
        };
        let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let admin_addr = admin.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        tracing::info!(listen = %addr, admin = %admin_addr, workers, "serving MCP on /mcp");
        // Tests and supervisors read the bound addresses from these two lines.
        println!("listening on {addr}");
        println!("admin listening on {admin_addr}");
        if let Some(issuer) = &dev {
            print_dev_token(issuer, &state);
        }
        // The drain: the first signal fires `draining` (/readyz turns 503 at once); the server keeps serving for
        // --drain-delay, then fires `shutdown` (stop accepting, end every SSE stream with a retry hint).
        let draining = CancellationToken::new();
        let shutdown = CancellationToken::new();
        tokio::spawn(shutdown_signal(draining.clone()));
        let admin_state = AdminState {
            registry,
            store: state.store.clone(),
            draining: draining.clone(),
            ready_timeout: std::time::Duration::from_secs(1),
            ready: state.metrics.ready_gauge(),
        };
        tokio::spawn(async move {
            if let Err(e) = axum::serve(admin, admin_router(admin_state)).await {
                tracing::error!(error = %e, "admin listener failed");
            }
        });
        let delay = cfg.drain_delay;
        let (d, s) = (draining.clone(), shutdown.clone());
        let tasks = state.tasks.clone();
        let ready = state.metrics.ready_gauge();
        tokio::spawn(async move {
            d.cancelled().await;
            ready.set(0);
            // Take no more queued work; hand the re-runnable runs back to the queue at once.
            tasks.stop();
            tracing::info!(delay_secs = delay.as_secs(), "draining: /readyz is 503; serving until the delay is over");
            tokio::time::sleep(delay).await;
            tracing::info!("drain delay over: no longer accepting connections");
            s.cancel();
        });
        let calls = state.calls.clone();
        // One deadline for the whole drain, from the first signal: the open connections close (every stream ends
        // with a retry hint), then calls still running get what is left of the grace. They keep committing to the
        // store, where clients resuming on other replicas follow them.
        let grace = cfg.shutdown_grace;
        let signalled = shutdown.clone();
        let grace_over = async move {
            signalled.cancelled().await;
            tokio::time::sleep(grace).await;
        };
        tokio::pin!(grace_over);
        let mut grace_spent = false;
        let code = tokio::select! {
            r = serve(listener, state, shutdown.clone()) => match r {
                Ok(()) => 0,
                Err(e) => {
                    tracing::error!(error = %e, "server failed");
                    shutdown.cancel();
                    1
                }
            },
            () = &mut grace_over => {
                tracing::warn!("shutdown grace over with connections still open");
                grace_spent = true;
                0
            }
        };
        calls.close();
        if !calls.is_empty() && !grace_spent {
            tracing::info!(calls = calls.len(), "waiting for running calls");
            tokio::select! {
                () = calls.wait() => {}
                () = &mut grace_over => tracing::warn!(calls = calls.len(), "shutdown grace over; abandoning running calls"),
            }
        }
        // The audit trail: its chain's end row and what is still queued, within what is left of the grace.
        if let Some(w) = audit {
            let closed = w.close(std::time::Duration::from_secs(5)).await;
            tracing::info!(dropped = closed.dropped, "audit trail closed");
        }
        // Flush the spans still in the batch (the exporter's HTTP client blocks: off the runtime's threads).
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        code
    })
}
