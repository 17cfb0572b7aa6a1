//! Extractors: every header and the body of a `/mcp` request are parsed here, once, into types. Handlers decide
//! which of them a method needs; they never read a header themselves. Argument order is check order: the caller
//! (Origin, Host, identity) first, then the body checks (Accept, Content-Type, size, JSON-RPC envelope).

use crate::Principal;
use crate::error::{TransportError, auth_rejection};
use crate::mcp::truncate;
use crate::{AppState, ProtocolVersion, origin};
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use mcpfleet_state::{EventId, SessionId, SessionKey};
use mcpfleet_tools::JsonObject;
use serde_json::Value;

pub(crate) const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";

type Result<T, E = TransportError> = std::result::Result<T, E>;

/// The caller, after the DNS-rebinding checks (Origin, Host) and authentication.
pub(crate) struct Caller(pub Principal);

impl FromRequestParts<AppState> for Caller {
    type Rejection = TransportError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self> {
        origin::check(&parts.headers, &app.config.allowed_origins, &app.config.allowed_hosts)?;
        match app.auth.authenticate(parts).await {
            Ok(p) => Ok(Self(p)),
            Err(e) => {
                let used_dpop = parts
                    .headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.split_once(' '))
                    .is_some_and(|(s, _)| s.eq_ignore_ascii_case("dpop"));
                Err(auth_rejection(app, e, used_dpop))
            }
        }
    }
}

/// The caller's own bearer token, carried to a tool's context only when downstreams are configured (it is the
/// `subject_token` of a token exchange, docs/DOWNSTREAM.md); `None` otherwise. Extracted after [`Caller`], so the
/// token has been verified.
pub(crate) struct Subject(pub Option<mcpfleet_downstream::SubjectToken>);

impl FromRequestParts<AppState> for Subject {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Self::Rejection> {
        if app.downstreams.is_none() {
            return Ok(Self(None));
        }
        let raw = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            // A DPoP-bound token is the caller's token too: the exchange's authorization server decides whether it
            // takes it as a subject token.
            (scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("dpop")).then(|| token.trim())
        });
        Ok(Self(raw.filter(|t| !t.is_empty()).map(mcpfleet_downstream::SubjectToken::new)))
    }
}

/// One header that must appear at most once and be visible ASCII.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>> {
    let mut all = headers.get_all(name).iter();
    match (all.next(), all.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => {
            v.to_str().map(Some).map_err(|_| TransportError::InvalidRequest("header is not visible ASCII"))
        }
        _ => Err(TransportError::InvalidRequest("header given more than once")),
    }
}

/// The MCP headers, each parsed once; a malformed one becomes an error only when a handler asks for it.
pub(crate) struct McpHeaders {
    version: Result<Option<String>>,
    /// The session-generation version the header named, once [`McpHeaders::version`] has checked it.
    pub(crate) sent_version: Option<ProtocolVersion>,
    session: Result<Option<String>>,
    last_event_id: Result<Option<EventId>>,
    /// 2026-07-28: `Mcp-Method` and `Mcp-Name`, as sent, and the `Mcp-Param-*` headers (the name after the
    /// prefix, lowercased; the value as sent, or why it is unreadable).
    pub(crate) mcp_method: Result<Option<String>>,
    pub(crate) mcp_name: Result<Option<String>>,
    pub(crate) mcp_params: Vec<(String, Result<String>)>,
}

impl McpHeaders {
    /// `MCP-Protocol-Version` as sent, if it is well-formed.
    pub(crate) fn raw_version(&self) -> Result<Option<&str>, &TransportError> {
        self.version.as_ref().map(Option::as_deref)
    }

    /// `MCP-Protocol-Version` for the session generation: absent means 2025-03-26; anything unsupported is 400.
    pub(crate) fn version(&mut self) -> Result<ProtocolVersion> {
        match std::mem::replace(&mut self.version, Ok(None))? {
            None => Ok(self.sent_version.unwrap_or(ProtocolVersion::DEFAULT)),
            Some(v) => {
                let known = ProtocolVersion::parse(&v).filter(|v| !v.is_stateless());
                self.sent_version = known;
                known.ok_or_else(|| TransportError::ProtocolVersion(truncate(&v, 32)))
            }
        }
    }

    /// A session answers only in the version it negotiated: a header naming another one is 400. No header is the
    /// client's choice not to say, as 2025-03-26 clients do; and `2025-03-26` itself is the value the spec gives
    /// an absent header (that revision had no header), so it counts as absent. (The official conformance suite
    /// sends it on a 2025-11-25 session.)
    pub(crate) fn check_session_version(&self, negotiated: &str) -> Result<()> {
        match self.sent_version {
            Some(sent) if sent.as_str() != negotiated && sent != ProtocolVersion::DEFAULT => {
                Err(TransportError::VersionMismatch { sent: sent.as_str(), negotiated: truncate(negotiated, 32) })
            }
            _ => Ok(()),
        }
    }

    /// The session the request names, for this caller: a missing header is 400; an id that cannot be ours names
    /// nothing (404) and costs no store call.
    pub(crate) fn session_key(&mut self, caller: &Principal) -> Result<SessionKey> {
        let raw = std::mem::replace(&mut self.session, Ok(None))?.ok_or(TransportError::MissingSession)?;
        let id = SessionId::parse(&raw).ok_or(TransportError::SessionNotFound)?;
        Ok(SessionKey { user: caller.user.clone(), id })
    }

    /// A short hash of the `MCP-Session-Id` sent, for logs (never the id itself).
    pub(crate) fn session_tag(&self) -> Option<String> {
        self.session.as_ref().ok().and_then(Option::as_deref).map(crate::observe::short_hash)
    }

    /// `Last-Event-ID`, if any; a value we never issue is 400.
    pub(crate) fn last_event_id(&mut self) -> Result<Option<EventId>> {
        std::mem::replace(&mut self.last_event_id, Ok(None))
    }
}

impl FromRequestParts<AppState> for McpHeaders {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _app: &AppState) -> Result<Self, Self::Rejection> {
        Ok(Self::parse(&parts.headers))
    }
}

impl McpHeaders {
    /// Parses the MCP headers of a request, each once.
    pub(crate) fn parse(h: &HeaderMap) -> Self {
        let owned = |name: &str| single(h, name).map(|s| s.map(str::to_owned));
        let version = owned(VERSION_HEADER);
        let session = owned(SESSION_HEADER);
        let last_event_id = single(h, LAST_EVENT_ID)
            .and_then(|v| v.map(|raw| raw.parse::<EventId>().map_err(|()| TransportError::BadCursor)).transpose());
        let mcp_method = owned("mcp-method");
        let mcp_name = owned("mcp-name");
        let mcp_params = h
            .keys()
            .filter_map(|n| n.as_str().strip_prefix("mcp-param-").map(|p| (p.to_owned(), n.as_str())))
            .map(|(p, n)| (p, single(h, n).map(Option::unwrap_or_default).map(str::to_owned)))
            .collect();
        Self { version, sent_version: None, session, last_event_id, mcp_method, mcp_name, mcp_params }
    }

    /// The headers of a request made of `pairs` (name, value), for unit tests.
    #[cfg(test)]
    pub(crate) fn of(pairs: &[(&str, &str)]) -> Self {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            let name = axum::http::HeaderName::from_bytes(k.as_bytes()).expect("header name");
            h.append(name, axum::http::HeaderValue::from_str(v).expect("header value"));
        }
        Self::parse(&h)
    }
}

fn accepts(headers: &HeaderMap, wanted: &[&str]) -> bool {
    let types: Vec<String> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
        .collect();
    wanted.iter().all(|w| types.iter().any(|t| t == w || t == "*/*"))
}

/// A GET that accepts `text/event-stream`.
pub(crate) struct AcceptsEventStream;

impl FromRequestParts<AppState> for AcceptsEventStream {
    type Rejection = TransportError;

    async fn from_request_parts(parts: &mut Parts, _app: &AppState) -> Result<Self> {
        if accepts(&parts.headers, &["text/event-stream"]) {
            Ok(Self)
        } else {
            Err(TransportError::NotAcceptable("Accept must list text/event-stream"))
        }
    }
}

/// One JSON-RPC message, classified.
pub(crate) enum Message {
    Request { id: Value, method: String, params: JsonObject },
    Notification { method: String, params: JsonObject },
    Response { id: Value, raw: Bytes },
}

/// The body of a POST: exactly one JSON-RPC message, after the Accept, Content-Type and size checks, and the JSON
/// pointer of its first duplicate key, if it has one (a `tools/call` refuses it; the parsed message cannot show it).
pub(crate) struct Rpc(pub Message, pub Option<String>);

impl FromRequest<AppState> for Rpc {
    type Rejection = TransportError;

    async fn from_request(req: Request, app: &AppState) -> Result<Self> {
        let (parts, body) = req.into_parts();
        let headers = &parts.headers;
        if !accepts(headers, &["application/json", "text/event-stream"]) {
            return Err(TransportError::NotAcceptable("Accept must list application/json and text/event-stream"));
        }
        let json = single(headers, header::CONTENT_TYPE.as_str())
            .ok()
            .flatten()
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(TransportError::UnsupportedMediaType);
        }
        let max = app.config.max_body_bytes;
        let declared = single(headers, header::CONTENT_LENGTH.as_str())?.and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > max) {
            return Err(TransportError::PayloadTooLarge(max));
        }
        let t = app.config.body_timeout;
        let body = tokio::time::timeout(t, axum::body::to_bytes(body, max))
            .await
            .map_err(|_| TransportError::BodyTimeout(t))?
            .map_err(|_| TransportError::PayloadTooLarge(max))?;
        classify(&body).map(|(m, duplicate)| Self(m, duplicate))
    }
}

/// The members a JSON-RPC message may have: a request or notification, and a response.
const REQUEST_MEMBERS: [&str; 4] = ["jsonrpc", "id", "method", "params"];
const RESPONSE_MEMBERS: [&str; 4] = ["jsonrpc", "id", "result", "error"];

/// The message, and the pointer of a duplicate key inside a `tools/call`'s arguments (a tool argument error,
/// which the model reads). Everything else about the envelope is strict, for every method: a duplicate key
/// anywhere else, a member JSON-RPC does not define, a request (any method outside `notifications/`) without an
/// id, a notification with one, or a response with both or neither of `result` and `error` is 400 -32600.
pub(crate) fn classify(body: &Bytes) -> Result<(Message, Option<String>)> {
    let (v, duplicate) = mcpfleet_tools::validate::parse_strict(body).map_err(|_| TransportError::Parse)?;
    let mut obj = match v {
        Value::Object(o) => o,
        Value::Array(_) => return Err(TransportError::Batch),
        _ => return Err(TransportError::InvalidRequest("a JSON-RPC message must be an object")),
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(TransportError::InvalidRequest("jsonrpc must be \"2.0\""));
    }
    let is_call = obj.get("method").and_then(Value::as_str) == Some("tools/call");
    let duplicate = match duplicate {
        Some(at) if is_call && at.starts_with("/params/arguments/") => Some(at),
        Some(at) => return Err(TransportError::Envelope(format!("the key at {} is given twice", truncate(&at, 128)))),
        None => None,
    };
    let members: &[&str] = if obj.contains_key("method") { &REQUEST_MEMBERS } else { &RESPONSE_MEMBERS };
    if let Some(unknown) = obj.keys().find(|k| !members.contains(&k.as_str())) {
        let what = if obj.contains_key("method") { "a request or notification" } else { "a response" };
        return Err(TransportError::Envelope(format!(
            "{} is not a member of {what} (members: {})",
            Value::String(truncate(unknown, 64)),
            members.join(", ")
        )));
    }
    let id = obj.remove("id");
    if let Some(id) = &id
        && !(id.is_string() || id.is_i64() || id.is_u64())
    {
        return Err(TransportError::InvalidRequest("id must be a string or an integer"));
    }
    let params = match obj.remove("params") {
        None => JsonObject::new(),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(TransportError::InvalidRequest("params must be an object")),
    };
    let message = match (obj.remove("method"), id) {
        (Some(Value::String(method)), Some(_)) if method.starts_with("notifications/") => {
            return Err(TransportError::Envelope(format!(
                "{} is a notification and carries no id",
                Value::String(truncate(&method, 64))
            )));
        }
        (Some(Value::String(method)), Some(id)) => Message::Request { id, method, params },
        (Some(Value::String(method)), None) if method.starts_with("notifications/") => {
            Message::Notification { method, params }
        }
        (Some(Value::String(method)), None) => {
            return Err(TransportError::Envelope(format!(
                "{} is a request and needs an id (only notifications/* methods go without one)",
                Value::String(truncate(&method, 64))
            )));
        }
        (Some(_), _) => return Err(TransportError::InvalidRequest("method must be a string")),
        (None, Some(id)) if obj.contains_key("result") != obj.contains_key("error") => {
            Message::Response { id, raw: body.clone() }
        }
        (None, Some(_)) if obj.contains_key("result") => {
            return Err(TransportError::InvalidRequest("a response has either result or error, not both"));
        }
        (None, _) => return Err(TransportError::InvalidRequest("not a request, notification or response")),
    };
    Ok((message, duplicate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_header_defaults_parses_and_must_match_the_session() {
        assert_eq!(McpHeaders::of(&[]).version().ok(), Some(ProtocolVersion::V2025_03_26), "absent means 2025-03-26");
        let mut h = McpHeaders::of(&[("mcp-protocol-version", "2025-06-18")]);
        assert_eq!(h.version().ok(), Some(ProtocolVersion::V2025_06_18));
        assert!(h.check_session_version("2025-06-18").is_ok());
        assert!(matches!(h.check_session_version("2025-11-25"), Err(TransportError::VersionMismatch { .. })));
        let mut h = McpHeaders::of(&[("mcp-protocol-version", "2025-03-26")]);
        h.version().ok();
        assert!(h.check_session_version("2025-11-25").is_ok(), "2025-03-26 counts as no header");
        assert!(McpHeaders::of(&[]).check_session_version("2025-11-25").is_ok());
        let mut bad = McpHeaders::of(&[("mcp-protocol-version", "2024-01-01")]);
        assert!(matches!(bad.version(), Err(TransportError::ProtocolVersion(v)) if v == "2024-01-01"));
        let mut twice =
            McpHeaders::of(&[("mcp-protocol-version", "2025-06-18"), ("mcp-protocol-version", "2025-06-18")]);
        assert!(matches!(twice.version(), Err(TransportError::InvalidRequest(_))));
        let mut cursor = McpHeaders::of(&[("last-event-id", "nope")]);
        assert!(matches!(cursor.last_event_id(), Err(TransportError::BadCursor)));
    }

    #[test]
    fn classify_sorts_messages_and_refuses_batches() {
        let m = |s: &str| classify(&Bytes::from(s.to_owned())).map(|(m, _)| m);
        assert!(matches!(m(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#), Ok(Message::Request { .. })));
        assert!(matches!(
            m(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Message::Notification { .. })
        ));
        assert!(matches!(m(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#), Ok(Message::Response { .. })));
        assert!(matches!(m(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#), Err(TransportError::Batch)));
        assert!(matches!(m(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#), Err(TransportError::InvalidRequest(_))));
        assert!(matches!(m("{nope"), Err(TransportError::Parse)));
        assert!(matches!(m(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#), Err(TransportError::InvalidRequest(_))));
        let dup = |s: &'static str| classify(&Bytes::from_static(s.as_bytes())).map(|(_, d)| d);
        assert_eq!(
            dup(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"a":1,"a":2}}}"#)
                .ok()
                .flatten()
                .as_deref(),
            Some("/params/arguments/a"),
            "a duplicate tool argument is the tool's argument error"
        );
        let envelope = |s: &'static str| match classify(&Bytes::from_static(s.as_bytes())) {
            Err(TransportError::Envelope(what)) => what,
            _ => panic!("not an envelope error: {s}"),
        };
        assert!(envelope(r#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"a":2}}"#).contains("/params/a"));
        assert!(envelope(r#"{"jsonrpc":"2.0","method":"tools/call","method":"ping","id":1}"#).contains("/method"));
        assert!(envelope(r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#).contains("/id"));
        assert!(envelope(r#"{"jsonrpc":"2.0","id":1,"method":"ping","Params":{}}"#).contains("\"Params\""));
        assert!(envelope(r#"{"jsonrpc":"2.0","id":1,"method":"ping","params\u0000":{}}"#).contains("\\u0000"));
        assert!(envelope(r#"{"jsonrpc":"2.0","id":"a","result":{},"method2":1}"#).contains("a response"));
        assert!(envelope(r#"{"jsonrpc":"2.0","method":"tools/call","params":{}}"#).contains("needs an id"));
        assert!(envelope(r#"{"jsonrpc":"2.0","id":3,"method":"notifications/initialized"}"#).contains("no id"));
        assert!(matches!(
            m(r#"{"jsonrpc":"2.0","id":"a","result":{},"error":{}}"#),
            Err(TransportError::InvalidRequest(_))
        ));
    }
}
