//! Public documents: RFC 9728 protected resource metadata and the dev issuer's JWKS. They need no credentials and
//! carry no per-caller data, so CORS is open for GET (browser-based clients discover the authorization server
//! from them). With `--auth dev` the metadata is named after the (allowed) `Host` the client used. Also the OAuth
//! style refusal (`{"error": "invalid_request", ...}`) these documents and the dev sign-in send before their
//! protocol is reached.

use crate::AppState;
use crate::origin::allowed_host;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// `{"error": ..., "error_description": ...}` with `status`, for refusals before the protocol is reached.
pub(crate) fn refusal(status: StatusCode, description: &str) -> Response {
    Refusal(status, description).into_response()
}

/// A refusal before the protocol is reached: the DNS-rebinding checks, the body's size and deadline.
pub(crate) struct Refusal<'a>(pub(crate) StatusCode, pub(crate) &'a str);

impl IntoResponse for Refusal<'_> {
    fn into_response(self) -> Response {
        (self.0, axum::Json(json!({ "error": "invalid_request", "error_description": self.1 }))).into_response()
    }
}

fn cors(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, OPTIONS"));
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("mcp-protocol-version"));
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("86400"));
    resp
}

pub(crate) fn public_json(value: serde_json::Value) -> Response {
    let mut resp = axum::Json(value).into_response();
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    cors(resp)
}

pub(crate) async fn resource_metadata(State(app): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(dev) = &app.config.dev_oauth {
        return match allowed_host(&headers, &app.config.allowed_hosts) {
            Some(host) => public_json(with_dpop(&app, dev.protected_resource(&host).document())),
            None => refusal(StatusCode::FORBIDDEN, "host not allowed"),
        };
    }
    match &app.config.protected_resource {
        Some(pr) => public_json(with_dpop(&app, pr.document())),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The metadata with what `--dpop` adds: the proof algorithms accepted (RFC 9449 §5.1) and, under `require`,
/// that only DPoP-bound tokens are (RFC 9728 §2).
fn with_dpop(app: &AppState, mut doc: serde_json::Value) -> serde_json::Value {
    use mcpfleet_auth::dpop::{ALGS, DpopMode};
    if app.config.dpop != DpopMode::Off {
        doc["dpop_signing_alg_values_supported"] = serde_json::json!(ALGS);
        doc["dpop_bound_access_tokens_required"] = serde_json::json!(app.config.dpop == DpopMode::Require);
    }
    doc
}

pub(crate) async fn dev_jwks(State(app): State<AppState>) -> Response {
    match &app.config.dev_jwks {
        Some(jwks) => public_json(jwks.clone()),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

pub(crate) async fn preflight() -> Response {
    cors(StatusCode::NO_CONTENT.into_response())
}
