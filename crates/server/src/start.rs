//! Start-up that survives outages: the metrics registered once (before anything can fail), the store reached with
//! retries while the process already listens, and the "starting" answers given meanwhile.
//!
//! A store that is away (connection refused or timed out, a name that does not resolve yet, a node loading its
//! data) is waited for: the replica binds its listeners, is not ready, answers `/mcp` with 503 and `Retry-After`,
//! and retries with backoff until the store answers, without a restart. What waiting never fixes (a wrong password,
//! a TLS or certificate failure, a master name no sentinel knows) still stops the start with exit 69.

use crate::ServerError;
use crate::config::Config;
use mcpfleet_auth::AuthMetrics;
use mcpfleet_limits::LimitMetrics;
use mcpfleet_state::layout::{self, Layout};
use mcpfleet_state::{MemoryStore, RedisConfig, RedisStore, Router as _, Store, StoreMetrics};
use mcpfleet_transport::policy::PolicyMetrics;
use mcpfleet_transport::{TaskMetrics, TransportMetrics};
use prometheus::Registry;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Every metric of one replica, registered once in the registry the admin listener serves (with the process's
/// own metrics on Linux).
#[derive(Debug)]
pub(crate) struct Instruments {
    pub(crate) registry: Registry,
    pub(crate) store: StoreMetrics,
    pub(crate) transport: TransportMetrics,
    pub(crate) tasks: TaskMetrics,
    pub(crate) auth: AuthMetrics,
    pub(crate) limits: LimitMetrics,
    pub(crate) policy: PolicyMetrics,
}

impl Instruments {
    /// # Errors
    /// A metric registered twice (a bug): exit 64.
    pub(crate) fn register() -> Result<Self, ServerError> {
        let registry = Registry::new();
        let error = |e: prometheus::Error| ServerError::Config(format!("metrics: {e}"));
        #[cfg(target_os = "linux")]
        registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self())).map_err(error)?;
        Ok(Self {
            store: StoreMetrics::register(&registry).map_err(error)?,
            transport: TransportMetrics::register(&registry).map_err(error)?,
            tasks: TaskMetrics::register(&registry).map_err(error)?,
            auth: AuthMetrics::register(&registry).map_err(error)?,
            limits: LimitMetrics::register(&registry).map_err(error)?,
            policy: PolicyMetrics::register(&registry).map_err(error)?,
            registry,
        })
    }
}

/// The first wait between two attempts to reach the store, and the longest.
const FIRST_RETRY: Duration = Duration::from_millis(250);
const LAST_RETRY: Duration = Duration::from_secs(5);

/// The store of `cfg`: Redis (connected, and answering a `PING`) or the in-memory store. With `waiting`, a store
/// that is away is retried with backoff (250 ms, doubling to 5 s) until it answers, and `waiting` is told once,
/// at the first failure; without it the first failure is returned.
///
/// # Errors
/// [`ServerError::Store`]: Redis failed in a way waiting cannot fix, or (without `waiting`) at all.
pub(crate) async fn connect_store(
    cfg: &Config,
    metrics: StoreMetrics,
    mut waiting: Option<&mut Starting>,
) -> Result<Arc<dyn Store>, ServerError> {
    let Some(r) = &cfg.redis else {
        tracing::warn!("no --redis-url: using the in-memory store, which is single-replica only");
        return Ok(Arc::new(MemoryStore::with_max_events(cfg.max_events)));
    };
    let rc = RedisConfig { max_events: cfg.max_events, metrics: Some(metrics), ..r.clone() };
    let topology = r.topology.redacted();
    let mut wait = FIRST_RETRY;
    let mut attempts = 1u32;
    loop {
        let reached = async {
            let store = RedisStore::connect(rc.clone()).await?;
            store.ping().await?;
            // Before it serves: the live replicas' layouts, which this build must be able to share.
            let fleet = store.fleet_layouts().await?;
            Ok::<_, mcpfleet_state::StateError>((store, fleet))
        };
        match reached.await {
            Ok((store, fleet)) => {
                let mine = Layout::current();
                layout::check(&mine, &fleet).map_err(|c| ServerError::Layout(c.to_string()))?;
                tracing::info!(replicas = fleet.len(), layout = %mine.encode(), "the fleet's Redis layouts agree with this build's");
                if attempts > 1 {
                    tracing::info!(attempts, "Redis answers: starting to serve");
                }
                tracing::info!(prefix = %r.prefix, %topology, "using the Redis store: replicas share sessions");
                return Ok(Arc::new(store));
            }
            Err(e) => match waiting.as_deref_mut() {
                Some(starting) if e.is_transient() => {
                    starting.begin();
                    tracing::warn!(
                        error = %e,
                        attempts,
                        retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        "cannot reach Redis yet: not ready, /mcp answers 503, retrying"
                    );
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(LAST_RETRY);
                    attempts += 1;
                }
                _ => return Err(ServerError::Store(e)),
            },
        }
    }
}

/// The answers of a replica still starting: once [`begin`](Self::begin) is called, a second handle on the MCP
/// listener serves [`mcpfleet_transport::starting_router`] (503, `Retry-After`) until [`end`](Self::end). Until
/// then, connections wait in the listener's backlog (a start with Redis up never answers 503), and the lines that
/// say where the replica listens are not printed yet: a supervisor that reads them finds a replica that serves.
#[derive(Debug)]
pub(crate) struct Starting {
    /// The lines that say where the replica listens, until printed.
    announce: Option<String>,
    listener: Option<std::net::TcpListener>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Starting {
    /// Holds a second handle on `listener` (the same socket), and `announce`, the lines that say where the replica
    /// listens: printed on stdout when it begins to wait, or when it ends.
    pub(crate) fn new(listener: &tokio::net::TcpListener, announce: String) -> Self {
        use std::os::fd::AsFd as _;
        let dup = listener.as_fd().try_clone_to_owned().map(std::net::TcpListener::from);
        if let Err(e) = &dup {
            tracing::warn!(error = %e, "cannot share the listener: /mcp will not answer until Redis does");
        }
        Self { announce: Some(announce), listener: dup.ok(), stop: CancellationToken::new(), task: None }
    }

    fn announce(&mut self) {
        if let Some(lines) = self.announce.take() {
            crate::announce(&lines);
        }
    }

    /// Starts answering 503 (once).
    fn begin(&mut self) {
        self.announce();
        let Some(std) = self.listener.take() else { return };
        let listener = match tokio::net::TcpListener::from_std(std) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot serve the starting answers");
                return;
            }
        };
        let stop = self.stop.clone();
        self.task = Some(tokio::spawn(async move {
            let served = axum::serve(listener, mcpfleet_transport::starting_router())
                .with_graceful_shutdown(async move { stop.cancelled().await });
            if let Err(e) = served.await {
                tracing::warn!(error = %e, "the starting answers failed");
            }
        }));
    }

    /// Stops answering 503: the connections it holds finish their request and close.
    pub(crate) async fn end(mut self) {
        self.announce();
        self.stop.cancel();
        if let Some(task) = self.task {
            let _ = task.await;
        }
    }
}
