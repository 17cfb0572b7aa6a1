//! The admin listener: `/metrics` (Prometheus text), `/healthz` (liveness: the process answers; no auth, no store)
//! and `/readyz` (readiness: the store answers within a deadline and the server is not draining). None of them
//! says anything about sessions. It is meant for a private port (`--admin-listen`, default loopback).

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
    if s.draining.is_cancelled() {
        return text(StatusCode::SERVICE_UNAVAILABLE, "draining\n");
    }
    match tokio::time::timeout(s.ready_timeout, s.store.ping()).await {
        Ok(Ok(())) => text(StatusCode::OK, "ready\n"),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "not ready: the store failed");
            text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n")
        }
        Err(_) => text(StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n"),
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
