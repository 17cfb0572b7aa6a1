//! The admin listener: `/metrics` (Prometheus text), `/healthz` (liveness: the process answers; no auth, no store)
//! and `/readyz` (readiness). None of them says anything about sessions. It is meant for a private port
//! (`--admin-listen`, default loopback).
//!
//! `/readyz` answers from local state, at once, never with a round trip: a [`Readiness`] that background work keeps
//! current (the store probed every second, the authenticator's keys, the start-up, the drain). Every verdict also
//! sets `mcp_ready`, so that the fleet's readiness is a metric too: `sum(mcp_ready)`.

use crate::Authenticator;
use crate::policy::Policies;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use mcpfleet_state::Store;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What the admin endpoints read.
#[derive(Clone, Debug)]
pub struct AdminState {
    pub registry: prometheus::Registry,
    pub readiness: Arc<Readiness>,
}

/// Whether this replica should get traffic, from local state only. Not ready while it starts (until its store
/// answered once and its serving state is built), while its store does not answer the probe, while its
/// authenticator cannot verify a token (the JWT keys never loaded), and from the moment its drain begins.
#[derive(Debug)]
pub struct Readiness {
    draining: CancellationToken,
    /// `mcp_ready` ([`TransportMetrics::ready_gauge`](crate::TransportMetrics::ready_gauge)).
    gauge: prometheus::IntGauge,
    /// The serving state is built, with this store, authenticator and policy.
    serving: OnceLock<Serving>,
    /// The last probe of the store answered within its deadline.
    store_ok: AtomicBool,
    probing: AtomicBool,
}

/// What readiness follows once the replica serves: its store, its authenticator and its policy.
type Serving = (Arc<dyn Store>, Arc<dyn Authenticator>, Arc<Policies>);

/// How often the store is probed, and how long a probe may take.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

impl Readiness {
    /// Not ready until [`serving`](Self::serving); not ready once `draining` fires.
    #[must_use]
    pub fn new(draining: CancellationToken, gauge: prometheus::IntGauge) -> Arc<Self> {
        gauge.set(0);
        Arc::new(Self {
            draining,
            gauge,
            serving: OnceLock::new(),
            store_ok: AtomicBool::new(false),
            probing: AtomicBool::new(false),
        })
    }

    /// The serving state is built, on a store that has just answered: from now on readiness follows `store`
    /// (probed every second, off the request path, until the drain), `auth`, and whether `policy` has read the
    /// version in force. Only the first call counts.
    pub fn serving(self: &Arc<Self>, store: Arc<dyn Store>, auth: Arc<dyn Authenticator>, policy: Arc<Policies>) {
        if self.serving.set((store, auth, policy)).is_err() {
            return;
        }
        self.store_ok.store(true, Ordering::Release);
        if !self.probing.swap(true, Ordering::AcqRel) {
            tokio::spawn(self.clone().probe());
        }
        let _ = self.publish();
    }

    /// Ready, or the one-line reason why not (the body of the 503).
    ///
    /// # Errors
    /// Draining, starting, the store unavailable, or no verification keys.
    pub fn verdict(&self) -> Result<(), &'static str> {
        if self.draining.is_cancelled() {
            return Err("draining\n");
        }
        let Some((_, auth, policy)) = self.serving.get() else {
            return Err("starting: the state store has not answered yet\n");
        };
        if !self.store_ok.load(Ordering::Acquire) {
            return Err("store unavailable\n");
        }
        if !auth.is_ready() {
            return Err("token verification keys not loaded\n");
        }
        if !policy.is_loaded() {
            return Err("the policy in force has not been read yet\n");
        }
        Ok(())
    }

    /// Sets `mcp_ready` from the verdict.
    fn publish(&self) -> Result<(), &'static str> {
        let v = self.verdict();
        self.gauge.set(i64::from(v.is_ok()));
        v
    }

    async fn probe(self: Arc<Self>) {
        let Some((store, _, _)) = self.serving.get().cloned() else { return };
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.draining.cancelled() => {
                    self.gauge.set(0);
                    return;
                }
            }
            let ok = match tokio::time::timeout(PROBE_INTERVAL, store.ping()).await {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    if self.store_ok.load(Ordering::Acquire) {
                        tracing::warn!(error = %e, "not ready: the store failed its probe");
                    }
                    false
                }
                Err(_) => {
                    if self.store_ok.load(Ordering::Acquire) {
                        tracing::warn!(
                            timeout_ms = PROBE_INTERVAL.as_millis(),
                            "not ready: the store did not answer its probe"
                        );
                    }
                    false
                }
            };
            if ok && !self.store_ok.load(Ordering::Acquire) {
                tracing::info!("the store answers its probe again");
            }
            self.store_ok.store(ok, Ordering::Release);
            let _ = self.publish();
        }
    }
}

/// The admin router.
pub fn admin_router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

fn text(status: StatusCode, body: &'static str) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn healthz() -> Response {
    text(StatusCode::OK, "ok\n")
}

async fn readyz(State(s): State<AdminState>) -> Response {
    match s.readiness.publish() {
        Ok(()) => text(StatusCode::OK, "ready\n"),
        Err(body) => text(StatusCode::SERVICE_UNAVAILABLE, body),
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let families = s.registry.gather();
    match prometheus::TextEncoder::new().encode_to_string(&families) {
        Ok(body) => {
            let mut r = body.into_response();
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
            r
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot encode metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Keys(AtomicBool);

    #[async_trait::async_trait]
    impl Authenticator for Keys {
        async fn authenticate(&self, _: &http::request::Parts) -> Result<crate::Principal, crate::AuthError> {
            Err(crate::AuthError::KeysUnavailable)
        }

        fn is_ready(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
    }

    #[tokio::test]
    async fn mcp_ready_follows_the_start_the_keys_and_the_drain() {
        let registry = prometheus::Registry::new();
        let metrics = crate::TransportMetrics::register(&registry).expect("register");
        let draining = CancellationToken::new();
        let r = Readiness::new(draining.clone(), metrics.ready_gauge());
        let s = AdminState { registry, readiness: r.clone() };
        let status = async || readyz(State(s.clone())).await.status();
        assert_eq!(status().await, StatusCode::SERVICE_UNAVAILABLE, "starting");
        assert_eq!(metrics.ready_gauge().get(), 0);
        let keys = Arc::new(Keys(AtomicBool::new(false)));
        let policy = Arc::new(Policies::new(
            mcpfleet_limits::LimitsConfig::default().plan,
            &[],
            crate::policy::PolicyMetrics::unregistered().expect("metrics"),
        ));
        r.serving(Arc::new(mcpfleet_state::MemoryStore::new()), keys.clone(), policy.clone());
        assert_eq!(r.verdict(), Err("token verification keys not loaded\n"));
        assert_eq!(status().await, StatusCode::SERVICE_UNAVAILABLE);
        keys.0.store(true, Ordering::Release);
        assert_eq!(r.verdict(), Err("the policy in force has not been read yet\n"));
        policy.loaded_without();
        assert_eq!(status().await, StatusCode::OK);
        assert_eq!(metrics.ready_gauge().get(), 1);
        draining.cancel();
        assert_eq!(status().await, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(metrics.ready_gauge().get(), 0, "draining");
    }
}
