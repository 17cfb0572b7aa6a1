//! What every `/mcp` request leaves behind, in one middleware: a request id (taken from `x-request-id` when it is
//! sane, echoed back), a trace id (from a W3C `traceparent`, or new), the request metrics, one access log line,
//! and the hardening headers. Handlers tell it what they saw (method, tool, principal, session) through a
//! [`RpcInfo`] response extension; a request refused by an extractor has none, and is labelled by its HTTP method.

use crate::AppState;
use crate::error::{TransportError, error_body};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};
use std::time::Instant;

/// The ids of one request, for handlers (request extension).
#[derive(Clone, Debug)]
pub(crate) struct RequestIds {
    /// 32 lowercase hex digits: the W3C trace id of the request.
    pub(crate) trace_id: String,
    /// The HTTP server span of the request.
    pub(crate) http: opentelemetry::Context,
}

/// What a handler saw, for the access log and the metrics (response extension).
#[derive(Clone, Debug, Default)]
pub(crate) struct RpcInfo {
    pub(crate) method: Option<&'static str>,
    pub(crate) tool: Option<String>,
    pub(crate) principal: Option<String>,
    pub(crate) session: Option<String>,
    /// The trace of the MCP span, when `params._meta` put it in another trace than the HTTP request.
    pub(crate) trace_id: Option<String>,
    /// The caller's bucket after this request's admission, for the `RateLimit` header.
    pub(crate) rate: Option<mcpfleet_limits::RateStatus>,
    /// The request was admitted (or refused) by the limiter: it took its token.
    pub(crate) charged: bool,
    /// Answered in the 2026-07-28 generation: errors carry the request id and the stateless codes.
    pub(crate) stateless: bool,
    /// The JSON-RPC id of the request, once known (2026-07-28 errors carry it).
    pub(crate) request_id: Option<serde_json::Value>,
}

/// A short, stable, non-reversible tag for a session id in logs.
pub(crate) fn short_hash(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    mcpfleet_core::hex(&d[..6])
}

fn hex_id<const N: usize>() -> String {
    mcpfleet_core::hex(&rand::random::<[u8; N]>())
}

fn sane_request_id(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    (!s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)))
        .then(|| s.to_owned())
}

pub(crate) async fn observe(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    // A browser's CORS preflight from an allowed origin is answered first: no span, no metric, no log line, no token.
    if let Some(answer) = crate::origin::preflight_answer(&app, &req, crate::origin::CorsFor::Mcp) {
        return answer;
    }
    let reader = crate::origin::reader(&app, req.headers());
    let started = Instant::now();
    let http_method = req.method().clone();
    let header_bytes: usize = req.headers().iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    let request_id = req.headers().get("x-request-id").and_then(sane_request_id).unwrap_or_else(hex_id::<12>);
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::trace::remote_parent)
        .unwrap_or_default();
    let http = crate::trace::http_span(http_method.as_str(), &parent);
    let trace_id = crate::trace::trace_id_of(&http).unwrap_or_else(hex_id::<16>);
    let ids = RequestIds { trace_id: trace_id.clone(), http: http.clone() };
    req.extensions_mut().insert(ids);
    let mut resp = if header_bytes > app.config.max_header_bytes {
        let msg = format!("request headers larger than {} bytes", app.config.max_header_bytes);
        let mut r =
            (StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, axum::Json(error_body(crate::code::SERVER_ERROR, &msg)))
                .into_response();
        r.extensions_mut().insert(RpcInfo::default());
        r
    } else {
        next.run(req).await
    };
    let info = resp.extensions_mut().remove::<RpcInfo>().unwrap_or_default();
    let status = resp.status();
    let method = info.method.unwrap_or(match http_method.as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "DELETE" => "DELETE",
        _ => "OTHER",
    });
    let took = started.elapsed();
    let code = opentelemetry::KeyValue::new("http.response.status_code", i64::from(status.as_u16()));
    crate::trace::end(&http, status.is_server_error().then(|| status.as_str()), &[code]);
    let trace_id = info.trace_id.clone().unwrap_or(trace_id);
    let m = &app.metrics;
    m.requests.with_label_values(&[method, status.as_str()]).inc();
    m.request_duration.with_label_values(&[method]).observe(took.as_secs_f64());
    crate::origin::expose(&mut resp, reader);
    let h = resp.headers_mut();
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        h.insert("x-request-id", v);
    }
    // IETF draft RateLimit headers: the policy on every response, the caller's state once it was admitted.
    let policy = info.rate.map(|r| r.policy_header()).or_else(|| app.limits.policy_header());
    if let Some(v) = policy.and_then(|p| HeaderValue::from_str(&p).ok()) {
        h.insert("ratelimit-policy", v);
    }
    if let Some(v) = info.rate.and_then(|r| HeaderValue::from_str(&r.header()).ok()) {
        h.insert("ratelimit", v);
    }
    tracing::info!(
        target: "mcpfleet::access",
        request_id = request_id.as_str(),
        trace_id = trace_id.as_str(),
        http.method = http_method.as_str(),
        rpc.method = method,
        tool.name = info.tool.as_deref(),
        principal = info.principal.as_deref(),
        session = info.session.as_deref(),
        status = status.as_u16(),
        outcome = if status.is_server_error() { "error" } else if status.is_client_error() { "refused" } else { "ok" },
        latency_ms = took.as_secs_f64() * 1e3,
        "request"
    );
    resp
}

/// `TransportError` responses carry the info too.
pub(crate) fn with_info(r: Result<Response, TransportError>, info: RpcInfo) -> Response {
    let mut resp = match r {
        Ok(resp) => resp,
        Err(e) => e.response(info.request_id.as_ref(), info.stateless),
    };
    resp.extensions_mut().insert(info);
    resp
}
