//! mcpfleet, the crate tool writers depend on: [`Server`] serves your tools on a fleet of replicas with the
//! `mcpfleet` command line (config → telemetry → state → [`AppState`] → [`serve`]), and this crate re-exports
//! everything a tool needs ([`Tool`], [`ToolInfo`], [`ToolContext`], [`ToolError`], [`ToolOutput`],
//! [`async_trait`], [`schemars`] and [`JsonSchema`]), so that a tool's crate depends on `mcpfleet` alone and never
//! pins a second version of ours. The `mcpfleet` binary is a user of this API like any other, plus the fixture sets
//! behind the default-on cargo features `fixtures` and `reference` (`--fixtures`). The test harness for tools is
//! [`testing`]. This crate wires the others together and owns nothing else.

mod app;
mod catalog;
pub mod config;
mod database;
#[cfg(any(feature = "fixtures", feature = "reference"))]
mod fixtures;
pub mod lint;
mod log;
mod policy;
mod revoke;
mod skill_fleet;
mod start;
pub mod testing;

pub use app::{App, Server};
/// Skills (the `io.modelcontextprotocol/skills` extension, docs/SKILLS.md): [`skills::Skill`] for
/// [`Server::skill`].
pub use mcpfleet_skills as skills;
pub use mcpfleet_tools::schemars::{self, JsonSchema};
pub use mcpfleet_tools::{
    Annotations, Catalog, JsonObject, Principal, Quota, Registry, Scopes, TaskMode, TaskSupport, Tool, ToolContext,
    ToolError, ToolInfo, ToolOutput, async_trait, downstream, envelope,
};
pub use mcpfleet_transport::{AppState, serve};
/// The allocator the `mcpfleet` binary uses; a tool writer's binary takes it in two lines (`#[global_allocator]`).
pub use mimalloc;
/// JSON values, as tools and the harness take them.
pub use serde_json;
/// The logging facade the server's subscriber listens to: a tool's `tracing::info!` lines join the server's log.
pub use tracing;

use catalog::CheckedCatalog;
use config::{AuthConfig, Config, EXIT_CONFIG, EXIT_SCHEMA, EXIT_UNAVAILABLE, KeysFrom, Parsed};
use mcpfleet_auth::dev::DevIssuer;
use mcpfleet_auth::dev_oauth::DevAuthServer;
use mcpfleet_auth::{AuthError, AuthMetrics, Authenticator, JwtAuthenticator, KeySource, NoAuth, RemoteJwks};
use mcpfleet_db::Database;
use mcpfleet_limits::Limiter;
use mcpfleet_state::{StateError, Store};
use mcpfleet_transport::policy::Policies;
use mcpfleet_transport::{AdminState, Readiness, Shared, admin_router};
use opentelemetry_sdk::trace::SdkTracerProvider;
use prometheus::Registry as Metrics;
use start::{Instruments, Starting};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Why the server cannot start. Each kind has its exit code ([`ServerError::exit_code`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A bad flag or environment variable, or an unusable key file: exit 64.
    #[error("{0}")]
    Config(String),
    /// Redis failed at start in a way waiting cannot fix (a wrong password, TLS; from [`Server::build`], any
    /// failure): exit 69. A process started by [`Server::run`] waits for a Redis that is away.
    #[error("cannot reach Redis: {0}")]
    Store(#[source] StateError),
    /// PostgreSQL refusing the connection at start for good (a wrong password or role, TLS; one merely away is
    /// waited for in the background): exit 69.
    #[error("{0}")]
    Database(#[source] mcpfleet_db::DbError),
    /// The database schema is behind this binary (or was edited): exit 78.
    #[error("{0}")]
    Schema(String),
    /// A live replica of the fleet uses a Redis layout this build cannot share (docs/UPGRADING.md): exit 78.
    #[error("{0}")]
    Layout(String),
}

impl ServerError {
    /// The process exit code (sysexits).
    #[must_use]
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Config(_) => EXIT_CONFIG,
            Self::Store(_) | Self::Database(_) => EXIT_UNAVAILABLE,
            Self::Schema(_) | Self::Layout(_) => EXIT_SCHEMA,
        }
    }
}

impl From<AuthError> for ServerError {
    fn from(e: AuthError) -> Self {
        Self::Config(e.to_string())
    }
}

/// The authenticator a config asks for. A JWKS URL that cannot be fetched at start is not fatal: the replica is not
/// ready, and requests get 503, until a load succeeds (the issuer may start after us; loads retry with backoff);
/// a key file must be usable at once.
async fn build_auth(
    auth: &AuthConfig,
    dpop: &mcpfleet_auth::dpop::DpopSettings,
    dev: Option<&DevIssuer>,
    metrics: AuthMetrics,
    policies: &Arc<Policies>,
) -> Result<Arc<dyn Authenticator>, ServerError> {
    let assigner: Arc<dyn mcpfleet_core::Assigner> = policies.clone();
    Ok(match (auth, dev) {
        (AuthConfig::Dev { required_scopes, .. }, Some(issuer)) => {
            let keys = KeySource::Static(Arc::new(issuer.key_set()));
            Arc::new(
                JwtAuthenticator::new(DevIssuer::settings(required_scopes.clone()), keys)
                    .with_metrics(metrics)
                    .with_assigner(assigner)
                    .with_dpop(dpop.clone()),
            )
        }
        (AuthConfig::Jwt { settings, keys, refresh_interval }, _) => {
            let remote = match keys {
                KeysFrom::Url { url, timeout } => RemoteJwks::url(url.clone(), *timeout, *refresh_interval)?,
                KeysFrom::File(path) => RemoteJwks::file(path.clone(), *refresh_interval),
            }
            .with_metrics(metrics.clone());
            let remote = Arc::new(remote);
            match (remote.load().await, keys) {
                (Ok(_), _) => {}
                (Err(e), KeysFrom::File(path)) => {
                    return Err(ServerError::Config(format!("--jwks-file {}: {e}", path.display())));
                }
                (Err(e), KeysFrom::Url { .. }) => {
                    tracing::error!(
                        error = %e,
                        "cannot load the issuer's keys yet; not ready, and requests get 503, until they load"
                    );
                    tokio::spawn(remote.clone().load_until_loaded());
                }
            }
            Arc::new(
                JwtAuthenticator::new(settings.clone(), KeySource::Remote(remote))
                    .with_metrics(metrics)
                    .with_assigner(assigner)
                    .with_dpop(dpop.clone()),
            )
        }
        (AuthConfig::None, _) => Arc::new(NoAuth::default()),
        // Never serve a dev configuration unauthenticated.
        (AuthConfig::Dev { .. }, None) => return Err(ServerError::Config("--auth dev: no dev issuer key".to_owned())),
    })
}

/// What [`build_state_with`] builds: the state the listener serves, the registry the admin listener exposes, and the
/// dev issuer when `--auth dev` asked for one (its key file is read once).
#[derive(Debug)]
pub(crate) struct Built {
    pub(crate) state: AppState,
    pub(crate) registry: Metrics,
    pub(crate) dev: Option<DevIssuer>,
    /// The audit trail's writer, when there is one: the drain closes it.
    pub(crate) audit: Option<Arc<mcpfleet_db::audit::Writer>>,
    /// Fires when a check after the start finds the database unusable (its schema behind): the replica stops.
    pub(crate) fatal: database::Fatal,
    /// This replica's skill set declaration, on a fleet (Redis): the drain withdraws it.
    pub(crate) skill_fleet: Option<Arc<skill_fleet::SkillFleet>>,
}

/// Builds the shared state from a parsed config, a checked catalog, the database it uses, the replica's metrics
/// and its store (reached by [`start::connect_store`]): the audit trail, and the authenticator (loading its keys).
///
/// # Errors
/// The database unreachable at start, or its schema behind; an unusable key file.
pub(crate) async fn build_state_with(
    cfg: &Config,
    checked: CheckedCatalog,
    db: Option<Database>,
    instruments: Instruments,
    store: Arc<dyn Store>,
) -> Result<Built, ServerError> {
    let Instruments {
        registry,
        store: store_metrics,
        transport: transport_metrics,
        tasks: task_metrics,
        auth: auth_metrics,
        limits: limit_metrics,
        policy: policy_metrics,
    } = instruments;
    if cfg.redis.is_some() {
        // Off the request path: at start and every minute, an evicting Redis is logged, measured and alerted on.
        let every = mcpfleet_state::eviction::CHECK_EVERY;
        tokio::spawn(mcpfleet_state::eviction::watch(store.clone(), store_metrics, every));
    }
    let CheckedCatalog { catalog, tools, warnings, validator, skills } = checked;
    if !skills.is_empty() {
        tracing::info!(skills = skills.len(), digest = %skills.digest(), "serving skills");
    }
    let skill_metrics =
        skill_fleet::SkillMetrics::register(&registry).map_err(|e| ServerError::Config(e.to_string()))?;
    transport_metrics.seed_tools(tools.iter().map(catalog::tool_name));
    for w in warnings {
        tracing::warn!(finding = %w, "tool schema lint");
    }
    let limits = Arc::new(Limiter::new(store.clone(), cfg.limits.clone(), limit_metrics));
    let shutdown = CancellationToken::new();
    let skill_fleet = if cfg.redis.is_some() {
        Some(skill_fleet::SkillFleet::start(store.clone(), skills.clone(), skill_metrics))
    } else {
        skill_metrics.served_only(&skills);
        None
    };
    let policies = Arc::new(Policies::new(cfg.limits.plan.clone(), &tools, policy_metrics));
    let streams = Arc::new(mcpfleet_transport::OpenStreams::default());
    policy::follow(cfg, &store, &policies, &limits, &streams, &shutdown)?;
    let fatal = database::Fatal::default();
    let audit = match (&db, &cfg.database) {
        (Some(db), Some(dc)) => {
            database::start(&cfg.transport.server_name, db, dc, &registry, &shutdown, &fatal).await?
        }
        _ => None,
    };
    let audit_sink = audit.clone().map(|w| w as Arc<dyn mcpfleet_core::AuditSink>);
    let downstreams = match &cfg.downstreams {
        Some(d) => Some(Arc::new(downstreams(cfg, d, &store, &registry, audit_sink.clone())?)),
        None => None,
    };
    let mut transport = cfg.transport.clone();
    if let Some(pr) = &mut transport.protected_resource {
        // scopes_supported: the endpoint's, every tool's and the operator's, sorted and deduplicated.
        for tool in &tools {
            pr.scopes_supported.extend(catalog.tool_scopes(catalog::tool_name(tool)));
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
        auth: build_auth(&cfg.auth, &cfg.dpop, dev.as_ref(), auth_metrics, &policies).await?,
        config: Arc::new(transport),
        shutdown,
        calls: tokio_util::task::TaskTracker::new(),
        metrics: transport_metrics,
        limits,
        validator,
        audit: audit_sink,
        tasks: Arc::new(mcpfleet_transport::Tasks::new(cfg.transport.tasks.clone(), task_metrics)),
        policy: policies,
        streams,
        downstreams,
        skills,
    });
    Ok(Built { state, registry, dev, audit, fatal, skill_fleet })
}

/// The downstreams tools may call (`--downstreams`), with, for URL-mode ones, the store their grants are kept in,
/// the key ring that seals them, and the fleet's public origin where their start and callback pages are served.
///
/// # Errors
/// A downstream the crate refuses, a key ring it refuses, or URL-mode downstreams without `--resource-url`.
fn downstreams(
    cfg: &Config,
    d: &crate::config::DownstreamsConfig,
    store: &Arc<dyn Store>,
    registry: &prometheus::Registry,
    audit: Option<Arc<dyn mcpfleet_core::AuditSink>>,
) -> Result<mcpfleet_downstream::Downstreams, ServerError> {
    let error = |e: mcpfleet_downstream::OAuthError| ServerError::Config(format!("--downstreams: {e}"));
    let url = if d.keys.0.is_empty() {
        None
    } else {
        let resource = cfg.transport.protected_resource.as_ref().map(|pr| pr.resource.as_str());
        let origin =
            resource.and_then(mcpfleet_auth::split_url).map(|(origin, _)| origin.to_owned()).ok_or_else(|| {
                ServerError::Config(
                    "URL-mode downstreams need --resource-url: their pages are served under its origin".into(),
                )
            })?;
        let vault = mcpfleet_downstream::Vault::new(d.keys.0.clone()).map_err(error)?;
        let grants: Arc<dyn mcpfleet_state::GrantStore> = store.clone();
        Some(mcpfleet_downstream::UrlMode { store: grants, vault, origin, signin: d.signin.clone() })
    };
    let names = d.resolved.iter().map(|r| r.name.as_str());
    let metrics = mcpfleet_downstream::DownstreamMetrics::register(registry, names)
        .map_err(|e| ServerError::Config(format!("metrics: {e}")))?;
    mcpfleet_downstream::Downstreams::new(d.resolved.clone(), url, metrics, audit).map_err(error)
}

/// Installs the global tracer provider, whose `service.name` is the server's name. With an OTLP endpoint, sampled
/// spans (parent-based; a new root trace sampled at `--trace-sample-ratio`) go out in batches over OTLP/HTTP;
/// without one nothing is recorded, but every span still gets real W3C ids, which the logs and tool errors carry.
///
/// # Errors
/// The exporter cannot be built.
fn init_telemetry(cfg: &Config) -> Result<SdkTracerProvider, ServerError> {
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::Sampler;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(cfg.transport.server_name.clone()).build();
    let builder = SdkTracerProvider::builder().with_resource(resource);
    let provider = match &cfg.otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{endpoint}/v1/traces"))
                .build()
                .map_err(|e| ServerError::Config(format!("OTLP exporter: {e}")))?;
            builder
                .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(cfg.trace_sample_ratio))))
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

/// Writes `lines` and a newline on stdout in one write, for a supervisor (or a test) that reads where the replica
/// listens. A reader that has gone (a closed pipe) is no reason to stop serving: the error is logged, not raised,
/// where `println!` would panic (and a two-line `println!` is two writes, the second after the reader may have left).
pub(crate) fn announce(lines: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let text = format!("{lines}\n");
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        tracing::warn!(error = %e, "cannot write to stdout (has its reader gone?): serving on");
    }
}

/// `--auth dev`: one ready-to-use token, with every scope the server knows, on the third line of stdout.
fn print_dev_token(issuer: &DevIssuer, state: &AppState) {
    let scope = state.config.protected_resource.as_ref().map(|p| p.scopes_supported.join(" ")).unwrap_or_default();
    let name = &state.config.server_name;
    match issuer.mint("dev", &scope, None, std::time::Duration::from_secs(24 * 3600)) {
        Ok(token) => {
            announce(&format!("dev token (sub=dev, scope=\"{scope}\", 24 h; mint more with `{name} token`): {token}"))
        }
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

/// Runs a command other than `serve`; its exit code.
fn run_command(name: &str, parsed: Parsed) -> i32 {
    match parsed {
        Parsed::Token(t) => {
            for w in &t.warnings {
                eprintln!("{name}: warning: {w}");
            }
            match DevIssuer::load_or_create(&t.key_file)
                .and_then(|i| i.mint_bound(&t.sub, &t.scope, t.client_id.as_deref(), t.ttl, t.dpop_jkt.as_deref()))
            {
                Ok(token) => {
                    println!("{token}");
                    0
                }
                Err(e) => {
                    eprintln!("{name}: {e}");
                    EXIT_CONFIG
                }
            }
        }
        Parsed::Lint(req) => {
            let _ = rustls::crypto::ring::default_provider().install_default();
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt.block_on(lint::run(name, &req)),
                Err(e) => {
                    eprintln!("{name}: cannot start the runtime: {e}");
                    1
                }
            }
        }
        Parsed::Db(req) => match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(database::command(name, req)),
            Err(e) => {
                eprintln!("{name}: cannot start the runtime: {e}");
                1
            }
        },
        Parsed::Policy(req) => policy::command(name, &req),
        Parsed::Info(text) => {
            print!("{text}");
            0
        }
        // `Server::run_with` serves; nothing else calls this with a serve command line.
        Parsed::Serve(_) => EXIT_CONFIG,
    }
}

/// `serve` as a process: the runtime, logging, telemetry, the state, both listeners, the drain on SIGTERM; the exit
/// code.
fn serve_process(name: &str, cfg: Config, checked: CheckedCatalog, db: Option<mcpfleet_db::Database>) -> i32 {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cfg.worker_threads {
        builder.worker_threads(n);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
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
                eprintln!("{name}: {e}");
                return e.exit_code();
            }
        };
        let fail = |e: ServerError| {
            tracing::error!(error = %e, "cannot start");
            eprintln!("{name}: {e}");
            e.exit_code()
        };
        let instruments = match Instruments::register() {
            Ok(i) => i,
            Err(e) => return fail(e),
        };
        // Listen first: a replica that waits for Redis is there, not ready, and says why.
        let listener = match tokio::net::TcpListener::bind(cfg.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{name}: cannot listen on {}: {e}", cfg.listen);
                return EXIT_CONFIG;
            }
        };
        let admin = match tokio::net::TcpListener::bind(cfg.admin_listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{name}: cannot listen on --admin-listen {}: {e}", cfg.admin_listen);
                return EXIT_CONFIG;
            }
        };
        let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let admin_addr = admin.local_addr().map(|a| a.to_string()).unwrap_or_default();
        // The drain: the first signal fires `draining` (/readyz turns 503 at once); the server keeps serving for
        // --drain-delay, then fires `shutdown` (stop accepting, end every SSE stream with a retry hint).
        let draining = CancellationToken::new();
        let shutdown = CancellationToken::new();
        tokio::spawn(shutdown_signal(draining.clone()));
        let readiness = Readiness::new(draining.clone(), instruments.transport.ready_gauge());
        let admin_state = AdminState { registry: instruments.registry.clone(), readiness: readiness.clone() };
        tokio::spawn(async move {
            if let Err(e) = axum::serve(admin, admin_router(admin_state)).await {
                tracing::error!(error = %e, "admin listener failed");
            }
        });
        // Tests and supervisors read the bound addresses from two lines on stdout, printed once the replica serves,
        // or as soon as it waits for Redis.
        let mut starting = Starting::new(&listener, format!("listening on {addr}\nadmin listening on {admin_addr}"));
        let store = tokio::select! {
            r = start::connect_store(&cfg, instruments.store.clone(), Some(&mut starting)) => match r {
                Ok(store) => store,
                Err(e) => return fail(e),
            },
            () = draining.cancelled() => {
                tracing::info!("stopped before Redis answered");
                return 0;
            }
        };
        let Built { state, dev, audit, fatal, skill_fleet, .. } =
            match build_state_with(&cfg, checked, db, instruments, store).await {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
        readiness.serving(state.store.clone(), state.auth.clone(), state.policy.clone());
        starting.end().await;
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        tracing::info!(listen = %addr, admin = %admin_addr, workers, "serving MCP on /mcp");
        if let Some(issuer) = &dev {
            print_dev_token(issuer, &state);
        }
        // A database found unusable after the start ends the process as it would have at start, through the drain.
        fatal.cancels(draining.clone());
        let delay = cfg.drain_delay;
        let (d, s) = (draining.clone(), shutdown.clone());
        let tasks = state.tasks.clone();
        let limits = state.limits.clone();
        tokio::spawn(async move {
            d.cancelled().await;
            // Take no more queued work; hand the re-runnable runs back to the queue at once.
            tasks.stop();
            // The other replicas stop counting this one at their next beat, and its skill set at their next
            // comparison.
            limits.leave().await;
            if let Some(f) = skill_fleet {
                f.leave().await;
            }
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
        match fatal.take() {
            Some(e) => {
                eprintln!("{name}: {e}");
                e.exit_code()
            }
            None => code,
        }
    })
}
