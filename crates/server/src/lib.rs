//! mcpfleet, the server: config → telemetry → state → [`AppState`] → [`serve`]. The binary is a thin wrapper
//! around [`run`]. This crate wires the others together and owns nothing else.

pub mod config;

pub use mcpfleet_transport::{AppState, serve};

use config::{Config, EXIT_CONFIG, EXIT_UNAVAILABLE, Fixtures, Parsed};
use mcpfleet_state::{MemoryStore, RedisConfig, RedisStore, Router as _, Store};
use mcpfleet_tools::{Catalog, EmptyCatalog, conformance::ConformanceCatalog};
use mcpfleet_transport::NoAuth;
use std::ffi::OsString;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Builds the shared state from a parsed config: connects to Redis when configured.
///
/// # Errors
/// Redis unreachable at start.
pub async fn build_state(cfg: &Config) -> Result<AppState, mcpfleet_state::StateError> {
    let store: Arc<dyn Store> = match &cfg.redis {
        Some(r) => {
            let rc = RedisConfig {
                prefix: r.prefix.clone(),
                timeout: r.timeout,
                max_events: cfg.max_events,
                ..RedisConfig::new(r.url.clone())
            };
            let store = RedisStore::connect(rc).await?;
            store.ping().await?;
            tracing::info!(prefix = %r.prefix, "using the Redis store: replicas share sessions");
            Arc::new(store)
        }
        None => {
            tracing::warn!("no --redis-url: using the in-memory store, which is single-replica only");
            Arc::new(MemoryStore::with_max_events(cfg.max_events))
        }
    };
    let catalog: Arc<dyn Catalog> = match cfg.fixtures {
        Some(Fixtures::Conformance) => Arc::new(ConformanceCatalog),
        None => Arc::new(EmptyCatalog),
    };
    Ok(AppState {
        store,
        catalog,
        auth: Arc::new(NoAuth::default()),
        config: Arc::new(cfg.transport.clone()),
        shutdown: CancellationToken::new(),
        calls: tokio_util::task::TaskTracker::new(),
    })
}

fn init_tracing(cfg: &Config) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(&cfg.log).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if cfg.dev {
        builder.pretty().init();
    } else {
        builder.json().flatten_event(true).init();
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
    std::process::exit(1);
}

/// Runs the command line; returns the process exit code.
pub fn run<I: IntoIterator<Item = OsString>>(args: I) -> i32 {
    let cfg = match config::parse(args) {
        Ok(Parsed::Serve(c)) => c,
        Ok(Parsed::Info(text)) => {
            print!("{text}");
            return 0;
        }
        Err(e) => {
            eprintln!("mcpfleet: {e}");
            return EXIT_CONFIG;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcpfleet: cannot start the runtime: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        init_tracing(&cfg);
        let state = match build_state(&cfg).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot reach the state store");
                eprintln!("mcpfleet: cannot reach Redis: {e}");
                return EXIT_UNAVAILABLE;
            }
        };
        let listener = match tokio::net::TcpListener::bind(cfg.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("mcpfleet: cannot listen on {}: {e}", cfg.listen);
                return EXIT_CONFIG;
            }
        };
        let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(listen = %addr, "serving MCP on /mcp");
        // Tests and supervisors read the bound address from this line.
        println!("listening on {addr}");
        let shutdown = CancellationToken::new();
        tokio::spawn(shutdown_signal(shutdown.clone()));
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
        code
    })
}
