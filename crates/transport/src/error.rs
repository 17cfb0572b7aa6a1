//! The one place where errors become HTTP statuses and JSON-RPC error codes. 5xx bodies stay generic; the detail
//! goes to the log.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mcpfleet_state::StateError;
use serde_json::{Value, json};

/// JSON-RPC error codes used by this transport.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Transport-level refusals (origin, session, version, cursor).
    pub const SERVER_ERROR: i64 = -32000;
    /// The session named by `MCP-Session-Id` does not exist for this caller.
    pub const SESSION_NOT_FOUND: i64 = -32001;
    /// `resources/read` of an unknown URI.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// The replica running a request stopped before it answered; the client should retry the request.
    pub const REQUEST_LOST: i64 = -32003;
    /// The events after `Last-Event-ID` are no longer retained.
    pub const CURSOR_GONE: i64 = -32004;
    /// The state store is unavailable.
    pub const UNAVAILABLE: i64 = -32005;
}

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
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    #[error("batch requests are not supported: send one JSON-RPC message per POST")]
    Batch,
    #[error("bad request: MCP-Session-Id header is required")]
    MissingSession,
    #[error("session not found")]
    SessionNotFound,
    #[error("bad request: unsupported MCP-Protocol-Version: {0}")]
    ProtocolVersion(String),
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
    #[error("unauthorized")]
    Unauthorized { status: StatusCode, challenge: Option<HeaderValue>, message: &'static str },
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

impl TransportError {
    fn status_and_code(&self) -> (StatusCode, i64) {
        match self {
            Self::ForbiddenOrigin | Self::ForbiddenHost => (StatusCode::FORBIDDEN, code::SERVER_ERROR),
            Self::NotAcceptable(_) => (StatusCode::NOT_ACCEPTABLE, code::SERVER_ERROR),
            Self::UnsupportedMediaType => (StatusCode::UNSUPPORTED_MEDIA_TYPE, code::SERVER_ERROR),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, code::SERVER_ERROR),
            Self::Parse => (StatusCode::BAD_REQUEST, code::PARSE_ERROR),
            Self::InvalidRequest(_) | Self::Batch => (StatusCode::BAD_REQUEST, code::INVALID_REQUEST),
            Self::MissingSession | Self::ProtocolVersion(_) | Self::UnknownResponse | Self::BadCursor => {
                (StatusCode::BAD_REQUEST, code::SERVER_ERROR)
            }
            Self::SessionNotFound => (StatusCode::NOT_FOUND, code::SESSION_NOT_FOUND),
            Self::CursorGone => (StatusCode::GONE, code::CURSOR_GONE),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, code::SERVER_ERROR),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, code::UNAVAILABLE),
            Self::Unauthorized { status, .. } => (*status, code::SERVER_ERROR),
        }
    }
}

/// A JSON-RPC error object with a `null` id, as the body of an HTTP error.
#[must_use]
pub fn error_body(code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": null, "error": { "code": code, "message": message } })
}

impl IntoResponse for TransportError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = match &self {
            Self::Parse => "Parse error".to_owned(),
            Self::Unavailable(e) => {
                let cause = std::error::Error::source(e).map(ToString::to_string).unwrap_or_default();
                tracing::warn!(error = %e, cause = %cause, "state store unavailable");
                "service temporarily unavailable".to_owned()
            }
            Self::Unauthorized { message, .. } => (*message).to_owned(),
            other => other.to_string(),
        };
        let mut resp = (status, axum::Json(error_body(code, &message))).into_response();
        match self {
            Self::Unavailable(_) => {
                resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::MethodNotAllowed => {
                resp.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            }
            Self::Unauthorized { challenge: Some(c), .. } => {
                resp.headers_mut().insert(header::WWW_AUTHENTICATE, c);
            }
            _ => {}
        }
        resp
    }
}
