//! The one place where errors become HTTP statuses and JSON-RPC error codes. 5xx bodies stay generic; the detail
//! goes to the log.

use crate::origin::Forbidden;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mcpfleet_auth::dpop::DpopMode;
use mcpfleet_auth::{AuthError, ProtectedResource};
use mcpfleet_limits::{Cap, LimitError};
use mcpfleet_state::StateError;
use serde_json::{Value, json};

pub use mcpfleet_core::code;

/// Why the transport refused a request.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("origin not allowed")]
    ForbiddenOrigin,
    #[error("host not allowed")]
    ForbiddenHost,
    #[error("not acceptable: {0}")]
    NotAcceptable(&'static str),
    #[error("unsupported media type: Content-Type must be application/json")]
    UnsupportedMediaType,
    #[error("request body larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("parse error")]
    Parse,
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// The JSON-RPC envelope is not strict: a duplicate key, an unknown member, a request without an id or a
    /// notification with one. The text names which (and where).
    #[error("invalid request: {0}")]
    Envelope(String),
    /// A session request whose `MCP-Protocol-Version` is not the version the session negotiated.
    #[error("bad request: MCP-Protocol-Version {sent} is not the version this session negotiated ({negotiated})")]
    VersionMismatch { sent: &'static str, negotiated: String },
    #[error("batch requests are not supported: send one JSON-RPC message per POST")]
    Batch,
    #[error("bad request: MCP-Session-Id header is required")]
    MissingSession,
    #[error("session not found")]
    SessionNotFound,
    #[error("unsupported protocol version: {0}")]
    ProtocolVersion(String),
    /// 2026-07-28: a standard header is missing, malformed, or does not match the body.
    #[error("header mismatch: {0}")]
    HeaderMismatch(String),
    /// 2026-07-28: the request's `_meta` lacks a required field, or a field is malformed.
    #[error("invalid params: {0}")]
    InvalidMeta(String),
    /// 2026-07-28: the request needs client capabilities it did not declare (`requiredCapabilities`).
    #[error("the request needs client capabilities it did not declare: {}", .0.iter().map(String::as_str).collect::<Vec<_>>().join(", "))]
    MissingCapability(Vec<String>),
    /// 2026-07-28: the method is not served (404).
    #[error("method not found: {0}")]
    MethodNotFound(String),
    #[error("bad request: no pending server request with this id")]
    UnknownResponse,
    #[error("bad request: Last-Event-ID is not an event id issued by this server")]
    BadCursor,
    #[error("the events after Last-Event-ID are no longer retained; re-issue the request or open a new stream")]
    CursorGone,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("state store unavailable")]
    Unavailable(#[source] StateError),
    /// A refusal by the authenticator or a scope check, with its `WWW-Authenticate` challenge.
    #[error("{message}")]
    Unauthorized { status: StatusCode, challenge: HeaderValue, message: String, nonce: Option<HeaderValue> },
    /// The request's DPoP proof was used before, through this replica or another: 401 with a DPoP
    /// `invalid_dpop_proof` challenge.
    #[error("the DPoP proof was used before: send a fresh proof with every request")]
    ProofReplayed,
    /// The caller's plan does not allow the tool (docs/POLICY.md): 403 like a missing scope, but without a
    /// challenge, since no token the caller can get changes it.
    #[error("the plan of this principal does not allow the tool {0}; signing in again does not change that")]
    NotInPlan(String),
    /// The principal, or its token, is revoked (`mcpfleet revoke`): 401 with an `invalid_token` challenge.
    #[error("the token has been revoked")]
    Revoked,
    /// No token verification key has been loaded yet.
    #[error("token verification is temporarily unavailable")]
    AuthUnavailable,
    /// A limit refused the request, or could not be checked.
    #[error(transparent)]
    Limit(LimitError),
    /// A transport setting is invalid (raised while the server is configured, never on a request).
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl From<Forbidden> for TransportError {
    fn from(f: Forbidden) -> Self {
        match f {
            Forbidden::Origin => Self::ForbiddenOrigin,
            Forbidden::Host => Self::ForbiddenHost,
        }
    }
}

impl From<LimitError> for TransportError {
    fn from(e: LimitError) -> Self {
        match e {
            LimitError::SessionNotFound => Self::SessionNotFound,
            LimitError::Revoked => Self::Revoked,
            LimitError::ProofReplayed => Self::ProofReplayed,
            LimitError::SessionConflict => Self::Unavailable(StateError::Conflict),
            other => Self::Limit(other),
        }
    }
}

/// Turns the auth crate's verdict into the RFC 6750 / MCP challenge: 401 without `error` when no credentials were
/// sent, 401 `invalid_token`, 400 `invalid_request`, 403 `insufficient_scope` naming the scopes. Every challenge
/// points to the resource metadata.
#[must_use]
pub(crate) fn auth_rejection(app: &crate::AppState, e: AuthError, used_dpop: bool) -> TransportError {
    let reason = match &e {
        AuthError::MissingCredentials => "missing_token",
        AuthError::InvalidRequest(_) => "invalid_request",
        AuthError::InvalidToken(_) => "invalid_token",
        AuthError::InvalidProof(_) | AuthError::UseDpopNonce(_) => "invalid_dpop_proof",
        AuthError::InsufficientScope(_) => "insufficient_scope",
        AuthError::KeysUnavailable | AuthError::KeySource(_) => "keys_unavailable",
    };
    app.metrics.auth_refusals.with_label_values(&[reason]).inc();
    // `--auth dev`: the metadata under the host the client used; otherwise the configured resource's.
    let dev = crate::origin::request_resource(app);
    let schemes = Schemes { dpop: app.config.dpop, used_dpop };
    challenge(e, dev.as_ref().or(app.config.protected_resource.as_ref()), schemes)
}

/// Which challenges a refusal carries: `Bearer` (RFC 6750), `DPoP` (RFC 9449, with the algorithms accepted), or
/// both, after the server's `--dpop` and the scheme the request used.
#[derive(Clone, Copy)]
struct Schemes {
    dpop: DpopMode,
    used_dpop: bool,
}

/// `DPoP` and its `algs`.
fn dpop_challenge() -> String {
    format!("DPoP algs=\"{}\"", mcpfleet_auth::dpop::ALGS.join(" "))
}

fn challenge(e: AuthError, resource: Option<&ProtectedResource>, schemes: Schemes) -> TransportError {
    let mut params: Vec<String> = Vec::new();
    let mut nonce = None;
    let description = |params: &mut Vec<String>, d: &str| params.push(format!("error_description=\"{d}\""));
    let proof_error = matches!(e, AuthError::InvalidProof(_) | AuthError::UseDpopNonce(_));
    let status = match &e {
        AuthError::InvalidProof(d) => {
            params.push("error=\"invalid_dpop_proof\"".to_owned());
            description(&mut params, d);
            StatusCode::UNAUTHORIZED
        }
        AuthError::UseDpopNonce(n) => {
            params.push("error=\"use_dpop_nonce\"".to_owned());
            description(&mut params, "send the nonce of the DPoP-Nonce header in the proof");
            nonce = HeaderValue::from_str(n).ok();
            StatusCode::UNAUTHORIZED
        }
        AuthError::MissingCredentials => StatusCode::UNAUTHORIZED,
        AuthError::InvalidRequest(d) => {
            params.push("error=\"invalid_request\"".to_owned());
            description(&mut params, d);
            StatusCode::BAD_REQUEST
        }
        AuthError::InvalidToken(d) => {
            params.push("error=\"invalid_token\"".to_owned());
            description(&mut params, d);
            StatusCode::UNAUTHORIZED
        }
        AuthError::InsufficientScope(scopes) => {
            // Every scope the request needs, not only the missing one: the 1.x SDKs replace their requested
            // scopes with the challenge's, and a challenge that left out the endpoint's scopes made them loop.
            let mut all: Vec<&str> =
                resource.map(|r| r.required_scopes.iter().map(String::as_str).collect()).unwrap_or_default();
            for s in scopes {
                if !all.contains(&s.as_str()) {
                    all.push(s);
                }
            }
            params.push("error=\"insufficient_scope\"".to_owned());
            params.push(format!("scope=\"{}\"", all.join(" ")));
            StatusCode::FORBIDDEN
        }
        AuthError::KeysUnavailable | AuthError::KeySource(_) => {
            tracing::debug!(error = %e, "no token verification key available");
            return TransportError::AuthUnavailable;
        }
    };
    if let Some(r) = resource {
        params.push(format!("resource_metadata=\"{}\"", r.metadata_url()));
        if matches!(e, AuthError::MissingCredentials) && !r.required_scopes.is_empty() {
            params.push(format!("scope=\"{}\"", r.required_scopes.join(" ")));
        }
    }
    let with = |scheme: &str, params: &[String]| {
        if params.is_empty() { scheme.to_owned() } else { format!("{scheme} {}", params.join(", ")) }
    };
    let metadata: Vec<String> =
        resource.map(|r| format!("resource_metadata=\"{}\"", r.metadata_url())).into_iter().collect();
    let challenge = match schemes.dpop {
        DpopMode::Off => with("Bearer", &params),
        // The refusal of a DPoP request, or any under `require`: one DPoP challenge, with the error.
        DpopMode::Require => with(&dpop_challenge(), &params),
        DpopMode::Allow if proof_error || schemes.used_dpop => with(&dpop_challenge(), &params),
        // A Bearer request, or none: the Bearer challenge with the error, and DPoP offered beside it.
        DpopMode::Allow => format!("{}, {}", with("Bearer", &params), with(&dpop_challenge(), &metadata)),
    };
    let challenge = HeaderValue::from_str(&challenge).unwrap_or_else(|_| HeaderValue::from_static("Bearer"));
    TransportError::Unauthorized { status, challenge, message: e.to_string(), nonce }
}

impl From<StateError> for TransportError {
    fn from(e: StateError) -> Self {
        match e {
            StateError::SessionNotFound => Self::SessionNotFound,
            StateError::CursorGone => Self::CursorGone,
            other => Self::Unavailable(other),
        }
    }
}

/// What a caller reads in a limit refusal: a message that names the limit and what to do, and `error.data` with
/// the limit's kind and numbers.
fn limit_message(e: &LimitError) -> (String, Value) {
    match e {
        LimitError::RateLimited { retry_after } => (
            format!("rate limit exceeded for this principal: retry after {retry_after} s"),
            json!({ "limit": "rate", "retryAfter": retry_after }),
        ),
        LimitError::CapReached { cap, limit } => {
            let what = match cap {
                Cap::Sessions => "end one with DELETE, or let it expire",
                Cap::Streams => "close one of your open streams (a GET stream, or a subscriptions/listen) first",
                Cap::Inflight => "wait for one of your running calls to finish",
                Cap::Tasks => "wait for one of your tasks to end, or cancel one with tasks/cancel",
            };
            let kind = match cap {
                Cap::Sessions => "sessions",
                Cap::Streams => "streams",
                Cap::Inflight => "inflight",
                Cap::Tasks => "tasks",
            };
            (format!("too many {cap} for this principal (cap {limit}): {what}"), json!({ "limit": kind, "cap": limit }))
        }
        LimitError::QuotaExhausted { tool, quota, retry_after } => (
            format!("quota for tool {tool} used up ({quota}): retry after {retry_after} s"),
            json!({ "limit": "quota", "tool": tool, "retryAfter": retry_after }),
        ),
        LimitError::Unavailable { source, .. } => {
            let cause = source.as_ref().map(ToString::to_string).unwrap_or_else(|| "circuit breaker open".to_owned());
            tracing::warn!(cause = %cause, "limits store unavailable");
            ("service temporarily unavailable".to_owned(), Value::Null)
        }
        other => (other.to_string(), Value::Null),
    }
}

impl TransportError {
    /// `Retry-After`, in whole seconds, for refusals that can name a time.
    fn retry_after(&self) -> Option<u64> {
        match self {
            Self::Unavailable(_) | Self::AuthUnavailable => Some(1),
            Self::Limit(
                LimitError::RateLimited { retry_after }
                | LimitError::QuotaExhausted { retry_after, .. }
                | LimitError::TenantQuotaExhausted { retry_after, .. }
                | LimitError::Unavailable { retry_after, .. },
            ) => Some(*retry_after),
            Self::Limit(LimitError::CapReached { cap: Cap::Streams | Cap::Inflight | Cap::Tasks, .. }) => Some(1),
            _ => None,
        }
    }

    /// The JSON-RPC error object of this error (for an answer whose HTTP status has gone out already).
    pub(crate) fn rpc_error(&self, stateless: bool) -> Value {
        let (_, c) = self.status_and_code();
        let data = match self {
            Self::MissingCapability(caps) => Some(capabilities_data(caps)),
            _ => None,
        };
        crate::jsonrpc::error_object(if stateless { code::stateless(c) } else { c }, &self.to_string(), data)
    }

    /// The JSON-RPC code this error is answered with (in the session generation's allocation).
    pub(crate) fn rpc_code(&self) -> i64 {
        self.status_and_code().1
    }

    /// The HTTP status this error is answered with.
    #[must_use]
    pub fn status_code(&self) -> StatusCode {
        self.status_and_code().0
    }

    fn status_and_code(&self) -> (StatusCode, i64) {
        match self {
            Self::ForbiddenOrigin | Self::ForbiddenHost => (StatusCode::FORBIDDEN, code::SERVER_ERROR),
            Self::NotAcceptable(_) => (StatusCode::NOT_ACCEPTABLE, code::SERVER_ERROR),
            Self::UnsupportedMediaType => (StatusCode::UNSUPPORTED_MEDIA_TYPE, code::SERVER_ERROR),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, code::SERVER_ERROR),
            Self::Parse => (StatusCode::BAD_REQUEST, code::PARSE_ERROR),
            Self::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, code::SERVER_ERROR),
            Self::InvalidRequest(_) | Self::Envelope(_) | Self::Batch => {
                (StatusCode::BAD_REQUEST, code::INVALID_REQUEST)
            }
            Self::MissingSession | Self::UnknownResponse | Self::BadCursor | Self::VersionMismatch { .. } => {
                (StatusCode::BAD_REQUEST, code::SERVER_ERROR)
            }
            Self::ProtocolVersion(_) => (StatusCode::BAD_REQUEST, code::UNSUPPORTED_PROTOCOL_VERSION),
            Self::HeaderMismatch(_) => (StatusCode::BAD_REQUEST, code::HEADER_MISMATCH),
            Self::InvalidMeta(_) => (StatusCode::BAD_REQUEST, code::INVALID_PARAMS),
            Self::MissingCapability(_) => (StatusCode::BAD_REQUEST, code::MISSING_CLIENT_CAPABILITY),
            Self::MethodNotFound(_) => (StatusCode::NOT_FOUND, code::METHOD_NOT_FOUND),
            Self::SessionNotFound => (StatusCode::NOT_FOUND, code::SESSION_NOT_FOUND),
            Self::CursorGone => (StatusCode::GONE, code::CURSOR_GONE),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, code::SERVER_ERROR),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, code::UNAVAILABLE),
            Self::Unauthorized { status, .. } => (*status, code::SERVER_ERROR),
            Self::NotInPlan(_) => (StatusCode::FORBIDDEN, code::SERVER_ERROR),
            Self::Revoked | Self::ProofReplayed => (StatusCode::UNAUTHORIZED, code::SERVER_ERROR),
            Self::AuthUnavailable => (StatusCode::SERVICE_UNAVAILABLE, code::UNAVAILABLE),
            Self::Limit(LimitError::Unavailable { .. } | LimitError::Config(_)) => {
                (StatusCode::SERVICE_UNAVAILABLE, code::UNAVAILABLE)
            }
            Self::Limit(_) => (StatusCode::TOO_MANY_REQUESTS, code::LIMITED),
            Self::Config(_) => (StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL_ERROR),
        }
    }
}

/// `error.data` of a -32021: `{"requiredCapabilities": {"sampling": {}}}`.
/// `requiredCapabilities`: a capability by name, an extension (its id has a `/`) under `extensions`.
fn capabilities_data(caps: &[String]) -> Value {
    let mut required = serde_json::Map::new();
    for c in caps {
        if c.contains('/') {
            let ext = required.entry("extensions").or_insert_with(|| json!({}));
            if let Value::Object(e) = ext {
                e.insert(c.clone(), json!({}));
            }
        } else {
            required.insert(c.clone(), json!({}));
        }
    }
    json!({ "requiredCapabilities": required })
}

/// A JSON-RPC error object with a `null` id, as the body of an HTTP error.
#[must_use]
pub fn error_body(code: i64, message: &str) -> Value {
    crate::jsonrpc::error(None, crate::jsonrpc::error_object(code, message, None))
}

impl IntoResponse for TransportError {
    fn into_response(self) -> Response {
        self.response(None, false)
    }
}

impl TransportError {
    /// The HTTP answer to this error: a JSON-RPC error with `id` (null when unknown). A 2026-07-28 answer
    /// (`stateless`) carries the code of the spec's allocation policy (see [`code::stateless`]).
    pub(crate) fn response(self, id: Option<&Value>, stateless: bool) -> Response {
        let (status, code) = self.status_and_code();
        let code = if stateless { code::stateless(code) } else { code };
        let mut data = Value::Null;
        let message = match &self {
            Self::Parse => "Parse error".to_owned(),
            Self::Limit(e) => {
                let (message, d) = limit_message(e);
                data = d;
                message
            }
            Self::ProtocolVersion(requested) => {
                let supported = crate::ProtocolVersion::NEWEST_FIRST.map(crate::ProtocolVersion::as_str);
                data = json!({ "supported": supported, "requested": requested });
                format!("Unsupported protocol version: {requested}")
            }
            Self::MissingCapability(caps) => {
                data = capabilities_data(caps);
                self.to_string()
            }
            Self::Unavailable(e) => {
                let cause = std::error::Error::source(e).map(ToString::to_string).unwrap_or_default();
                tracing::warn!(error = %e, cause = %cause, "state store unavailable");
                "service temporarily unavailable".to_owned()
            }
            other => other.to_string(),
        };
        let body = crate::jsonrpc::error(id, crate::jsonrpc::error_object(code, &message, Some(data)));
        let mut resp = (status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after() {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        match self {
            Self::MethodNotAllowed if stateless => {
                resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
            }
            Self::MethodNotAllowed => {
                resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            }
            Self::Unauthorized { challenge: c, nonce, .. } => {
                resp.headers_mut().insert(header::WWW_AUTHENTICATE, c);
                if let Some(n) = nonce {
                    resp.headers_mut().insert("dpop-nonce", n);
                }
            }
            Self::ProofReplayed => {
                let c = format!(
                    "{}, error=\"invalid_dpop_proof\", error_description=\"the DPoP proof was used before\"",
                    dpop_challenge()
                );
                if let Ok(c) = HeaderValue::from_str(&c) {
                    resp.headers_mut().insert(header::WWW_AUTHENTICATE, c);
                }
            }
            Self::Revoked => {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(
                        "Bearer error=\"invalid_token\", error_description=\"the token has been revoked\"",
                    ),
                );
            }
            _ => {}
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcpfleet_limits::Quota;
    use std::time::Duration;

    /// The table docs/ERRORS.md gives: every refusal's HTTP status and JSON-RPC code, in both generations.
    #[test]
    fn every_refusal_has_its_documented_status_and_code() {
        let limit = |e| TransportError::Limit(e);
        let cases: Vec<(TransportError, u16, i64, i64)> = vec![
            (TransportError::ForbiddenOrigin, 403, -32000, -32600),
            (TransportError::ForbiddenHost, 403, -32000, -32600),
            (TransportError::NotAcceptable("x"), 406, -32000, -32600),
            (TransportError::UnsupportedMediaType, 415, -32000, -32600),
            (TransportError::PayloadTooLarge(10), 413, -32000, -32600),
            (TransportError::Parse, 400, -32700, -32700),
            (TransportError::BodyTimeout(Duration::from_secs(1)), 408, -32000, -32600),
            (TransportError::InvalidRequest("x"), 400, -32600, -32600),
            (TransportError::Envelope("x".into()), 400, -32600, -32600),
            (TransportError::Batch, 400, -32600, -32600),
            (TransportError::MissingSession, 400, -32000, -32600),
            (
                TransportError::VersionMismatch { sent: "2025-06-18", negotiated: "2025-11-25".into() },
                400,
                -32000,
                -32600,
            ),
            (TransportError::SessionNotFound, 404, -32001, -32600),
            (TransportError::ProtocolVersion("x".into()), 400, -32022, -32022),
            (TransportError::HeaderMismatch("x".into()), 400, -32020, -32020),
            (TransportError::InvalidMeta("x".into()), 400, -32602, -32602),
            (TransportError::MissingCapability(vec!["sampling".into()]), 400, -32021, -32021),
            (TransportError::MethodNotFound("x".into()), 404, -32601, -32601),
            (TransportError::UnknownResponse, 400, -32000, -32600),
            (TransportError::BadCursor, 400, -32000, -32600),
            (TransportError::CursorGone, 410, -32004, -32600),
            (TransportError::MethodNotAllowed, 405, -32000, -32600),
            (TransportError::AuthUnavailable, 503, -32005, -31503),
            (limit(LimitError::RateLimited { retry_after: 2 }), 429, -32006, -31429),
            (limit(LimitError::CapReached { cap: Cap::Inflight, limit: 3 }), 429, -32006, -31429),
            (
                limit(LimitError::QuotaExhausted {
                    tool: "t".into(),
                    quota: Quota::new(1, Duration::from_secs(60)),
                    retry_after: 5,
                }),
                429,
                -32006,
                -31429,
            ),
            (limit(LimitError::Unavailable { retry_after: 1, source: None }), 503, -32005, -31503),
        ];
        for (e, status, session, stateless) in cases {
            let what = format!("{e:?}");
            let (s, c) = e.status_and_code();
            assert_eq!((s.as_u16(), c, code::stateless(c)), (status, session, stateless), "{what}");
        }
    }

    #[test]
    fn a_refusal_body_is_one_json_rpc_error_and_5xx_bodies_stay_generic() {
        let e = TransportError::Limit(LimitError::RateLimited { retry_after: 4 });
        assert_eq!(e.retry_after(), Some(4));
        let body = error_body(-32000, "origin not allowed");
        assert_eq!(
            body,
            json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32000, "message": "origin not allowed" } })
        );
        let caps = TransportError::MissingCapability(vec!["elicitation".into()]).rpc_error(true);
        assert_eq!(caps["data"], json!({ "requiredCapabilities": { "elicitation": {} } }));
        assert_eq!(TransportError::SessionNotFound.rpc_error(true)["code"], -32600);
    }
}
