//! The admin listener: `/metrics` (Prometheus text), `/healthz` (liveness: the process answers; no auth, no store)
//! and `/readyz` (readiness: the store answers within a deadline and the server is not draining). None of them
//! says anything about sessions. It is meant for a private port (`--admin-listen`, default loopback). Every
//! `/readyz` answer also sets `mcp_ready`, so that the fleet's readiness is a metric too: `sum(mcp_ready)`.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use mcpfleet_state::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What the admin endpoints read.
#[derive(Clone, Debug)]
pub struct AdminState {
    pub registry: prometheus::Registry,
    pub store: Arc<dyn Store>,
    /// Fires when the drain begins: `/readyz` turns 503 at once.
    pub draining: CancellationToken,
    /// How long `/readyz` waits for the store.
    pub ready_timeout: Duration,
    /// `mcp_ready` ([`TransportMetrics::ready_gauge`](crate::TransportMetrics::ready_gauge)): 0 until the first
    /// `/readyz` that passes, then the verdict of the last one. Whoever fires `draining` sets it to 0 as well.
    pub ready: prometheus::IntGauge,
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
    let verdict = readiness(&s).await;
    s.ready.set(i64::from(verdict.is_ok()));
    // A drain that began after the last check above: the gauge does not stay at 1 (the drain's own 0 may have come
    // before this answer's 1).
    if s.draining.is_cancelled() {
        s.ready.set(0);
    }
    match verdict {
        Ok(()) => text(StatusCode::OK, "ready\n"),
        Err(body) => text(StatusCode::SERVICE_UNAVAILABLE, body),
    }
}

/// Not draining, and the store answers within the deadline; otherwise the body of the 503.
async fn readiness(s: &AdminState) -> Result<(), &'static str> {
    if s.draining.is_cancelled() {
        return Err("draining\n");
    }
    match tokio::time::timeout(s.ready_timeout, s.store.ping()).await {
        Ok(Ok(())) if s.draining.is_cancelled() => Err("draining\n"),
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "not ready: the store failed");
            Err("store unavailable\n")
        }
        Err(_) => Err("store unavailable\n"),
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

    #[tokio::test]
    async fn mcp_ready_follows_every_readyz_answer_and_the_drain() {
        let registry = prometheus::Registry::new();
        let metrics = crate::TransportMetrics::register(&registry).expect("register");
        let s = AdminState {
            registry,
            store: Arc::new(mcpfleet_state::MemoryStore::new()),
            draining: CancellationToken::new(),
            ready_timeout: Duration::from_secs(1),
            ready: metrics.ready_gauge(),
        };
        assert_eq!(s.ready.get(), 0, "not ready before the first /readyz");
        assert_eq!(readyz(State(s.clone())).await.status(), StatusCode::OK);
        assert_eq!(s.ready.get(), 1);
        s.draining.cancel();
        assert_eq!(readyz(State(s.clone())).await.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(s.ready.get(), 0, "draining");
    }
}
