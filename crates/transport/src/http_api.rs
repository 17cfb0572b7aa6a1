//! The HTTP face of `/mcp`: header checks, the JSON-RPC envelope and session lookup, in that order, so that a
//! refused request is refused before it touches the store.

use crate::auth::Principal;
use crate::error::TransportError;
use crate::exchange::{Exchange, Outcome, random_token};
use crate::mcp::{self, truncate};
use crate::{AppState, SUPPORTED_VERSIONS, code, origin, sse, tail};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use mcpfleet_state::{EventId, NewSession, SessionId, SessionInfo, SessionKey};
use mcpfleet_tools::JsonObject;
use serde_json::{Value, json};

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";
/// Largest `capabilities` or `clientInfo` an initialize may store with its session.
const MAX_CLIENT_METADATA: usize = 16 * 1024;

type Result<T, E = TransportError> = std::result::Result<T, E>;

/// Origin, Host and identity: the checks every method shares.
async fn admit(app: &AppState, req: Request) -> Result<(http::request::Parts, Body, Principal)> {
    let (parts, body) = req.into_parts();
    origin::check(&parts.headers, &app.config.allowed_origins, &app.config.allowed_hosts)?;
    let principal = app.auth.authenticate(&parts).await?;
    Ok((parts, body, principal))
}

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

/// `MCP-Protocol-Version`: absent means 2025-03-26; anything unsupported is 400.
fn protocol_version(headers: &HeaderMap) -> Result<&'static str> {
    match single(headers, VERSION_HEADER)? {
        None => Ok(SUPPORTED_VERSIONS[0]),
        Some(v) => SUPPORTED_VERSIONS
            .iter()
            .find(|s| **s == v)
            .copied()
            .ok_or_else(|| TransportError::ProtocolVersion(truncate(v, 32))),
    }
}

/// The session this request names, checked against the caller: unknown, ended and foreign sessions all look alike.
async fn session(app: &AppState, headers: &HeaderMap, principal: &Principal) -> Result<(SessionKey, SessionInfo)> {
    let key = session_key(headers, principal)?;
    let info = app.store.touch_session(&key).await?.ok_or(TransportError::SessionNotFound)?;
    Ok((key, info))
}

/// The key the request names, without a store call (a malformed id names nothing: 404).
fn session_key(headers: &HeaderMap, principal: &Principal) -> Result<SessionKey> {
    let raw = single(headers, SESSION_HEADER)?.ok_or(TransportError::MissingSession)?;
    let id = SessionId::parse(raw).ok_or(TransportError::SessionNotFound)?;
    Ok(SessionKey { user: principal.user.clone(), id })
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

fn is_json(headers: &HeaderMap) -> bool {
    single(headers, header::CONTENT_TYPE.as_str())
        .ok()
        .flatten()
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

async fn read_body(headers: &HeaderMap, body: Body, max: usize) -> Result<Bytes> {
    let declared = single(headers, header::CONTENT_LENGTH.as_str())?.and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(TransportError::PayloadTooLarge(max));
    }
    axum::body::to_bytes(body, max).await.map_err(|_| TransportError::PayloadTooLarge(max))
}

/// One JSON-RPC message, classified.
enum Message {
    Request { id: Value, method: String, params: JsonObject },
    Notification { method: String, params: JsonObject },
    Response { id: Value, raw: Bytes },
}

fn classify(body: &Bytes) -> Result<Message> {
    let v: Value = serde_json::from_slice(body).map_err(|_| TransportError::Parse)?;
    let mut obj = match v {
        Value::Object(o) => o,
        Value::Array(_) => return Err(TransportError::Batch),
        _ => return Err(TransportError::InvalidRequest("a JSON-RPC message must be an object")),
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(TransportError::InvalidRequest("jsonrpc must be \"2.0\""));
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
    match (obj.remove("method"), id) {
        (Some(Value::String(method)), Some(id)) => Ok(Message::Request { id, method, params }),
        (Some(Value::String(method)), None) => Ok(Message::Notification { method, params }),
        (Some(_), _) => Err(TransportError::InvalidRequest("method must be a string")),
        (None, Some(id)) if obj.contains_key("result") || obj.contains_key("error") => {
            Ok(Message::Response { id, raw: body.clone() })
        }
        (None, _) => Err(TransportError::InvalidRequest("not a request, notification or response")),
    }
}

fn rpc_json(id: &Value, r: mcp::RpcResult) -> Response {
    let body = match r {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err((code, message)) => json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } }),
    };
    axum::Json(body).into_response()
}

fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}

pub(crate) async fn post(State(app): State<AppState>, req: Request) -> Response {
    post_inner(app, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn post_inner(app: AppState, req: Request) -> Result<Response> {
    let (parts, body, principal) = admit(&app, req).await?;
    let headers = &parts.headers;
    if !accepts(headers, &["application/json", "text/event-stream"]) {
        return Err(TransportError::NotAcceptable("Accept must list application/json and text/event-stream"));
    }
    if !is_json(headers) {
        return Err(TransportError::UnsupportedMediaType);
    }
    let body = read_body(headers, body, app.config.max_body_bytes).await?;
    let message = classify(&body)?;
    if let Message::Request { id, method, params } = &message
        && method == "initialize"
    {
        return initialize(&app, &principal, id, params).await;
    }
    protocol_version(headers)?;
    if let Message::Response { id, raw } = message {
        // Checked and delivered in one script, so a refused response writes nothing.
        let key = session_key(headers, &principal)?;
        let Some(id) = id.as_str().filter(|s| s.len() <= 128) else { return Err(TransportError::UnknownResponse) };
        let raw = std::str::from_utf8(&raw).map_err(|_| TransportError::Parse)?;
        return if app.store.deliver_response(&key, id, raw).await? {
            Ok(accepted())
        } else {
            Err(TransportError::UnknownResponse)
        };
    }
    let (key, info) = session(&app, headers, &principal).await?;
    match message {
        Message::Notification { method, params } => {
            if method == "notifications/cancelled"
                && let Some(id) = params.get("requestId")
                && (id.is_string() || id.is_i64() || id.is_u64())
                && id.to_string().len() <= 256
            {
                app.store.cancel_request(&key, &id.to_string()).await?;
            }
            Ok(accepted())
        }
        Message::Response { .. } => Err(TransportError::UnknownResponse),
        Message::Request { id, method, params } if method == "tools/call" => {
            let name = match mcp::str_param(&params, "name") {
                Ok(n) => n.to_owned(),
                Err(e) => return Ok(rpc_json(&id, Err(e))),
            };
            let args = match params.get("arguments") {
                None => JsonObject::new(),
                Some(Value::Object(a)) => a.clone(),
                Some(_) => {
                    return Ok(rpc_json(&id, Err((code::INVALID_PARAMS, "params.arguments must be an object".into()))));
                }
            };
            let outcome = Exchange::start(app.clone(), key, &info, id, &params, name, args);
            match outcome.await {
                Ok(Outcome::Json(v)) => Ok(axum::Json(v).into_response()),
                Ok(Outcome::Sse(rx)) => {
                    Ok(sse::response(rx, app.config.keep_alive, app.config.retry, app.shutdown.clone()))
                }
                Err(_) => Err(TransportError::SessionNotFound),
            }
        }
        Message::Request { id, method, params } => Ok(rpc_json(&id, mcp::plain(&app, &key, &method, &params).await)),
    }
}

async fn initialize(app: &AppState, principal: &Principal, id: &Value, params: &JsonObject) -> Result<Response> {
    let requested = params.get("protocolVersion").and_then(Value::as_str);
    let Some(requested) = requested else {
        return Ok(rpc_json(id, Err((code::INVALID_PARAMS, "params.protocolVersion must be a string".into()))));
    };
    let version = SUPPORTED_VERSIONS.iter().find(|v| **v == requested).copied().unwrap_or(SUPPORTED_VERSIONS[2]);
    let caps = params.get("capabilities").cloned().unwrap_or_else(|| json!({})).to_string();
    let info = params.get("clientInfo").cloned().unwrap_or(Value::Null).to_string();
    if caps.len() > MAX_CLIENT_METADATA || info.len() > MAX_CLIENT_METADATA {
        let msg = format!("params.capabilities and params.clientInfo must each be at most {MAX_CLIENT_METADATA} bytes");
        return Ok(rpc_json(id, Err((code::INVALID_PARAMS, msg))));
    }
    let sid =
        SessionId::parse(&random_token()).ok_or(TransportError::InvalidRequest("session id generation failed"))?;
    let key = SessionKey { user: principal.user.clone(), id: sid };
    let new = NewSession {
        protocol_version: version.to_owned(),
        client_capabilities: caps,
        client_info: info,
        idle_ttl: app.config.session_idle_ttl,
    };
    app.store.create_session(&key, &new).await?;
    let mut result = json!({
        "protocolVersion": version,
        "capabilities": app.catalog.capabilities(),
        "serverInfo": { "name": app.config.server_name, "version": app.config.server_version },
    });
    if let Some(i) = app.catalog.instructions() {
        result["instructions"] = json!(i);
    }
    let mut resp = rpc_json(id, Ok(result));
    let hv =
        HeaderValue::from_str(key.id.as_str()).map_err(|_| TransportError::InvalidRequest("session id not ASCII"))?;
    resp.headers_mut().insert(SESSION_HEADER, hv);
    Ok(resp)
}

pub(crate) async fn get(State(app): State<AppState>, req: Request) -> Response {
    get_inner(app, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn get_inner(app: AppState, req: Request) -> Result<Response> {
    let (parts, _body, principal) = admit(&app, req).await?;
    let headers = &parts.headers;
    if !accepts(headers, &["text/event-stream"]) {
        return Err(TransportError::NotAcceptable("Accept must list text/event-stream"));
    }
    protocol_version(headers)?;
    let cursor = match single(headers, LAST_EVENT_ID)? {
        None => None,
        Some(raw) => Some(raw.parse::<EventId>().map_err(|()| TransportError::BadCursor)?),
    };
    let (key, info) = session(&app, headers, &principal).await?;
    let rx = tail::open(&app, key, cursor, info.protocol_version.as_str() >= "2025-11-25").await?;
    Ok(sse::response(rx, app.config.keep_alive, app.config.retry, app.shutdown.clone()))
}

pub(crate) async fn delete(State(app): State<AppState>, req: Request) -> Response {
    delete_inner(app, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn delete_inner(app: AppState, req: Request) -> Result<Response> {
    let (parts, _body, principal) = admit(&app, req).await?;
    let headers = &parts.headers;
    protocol_version(headers)?;
    let raw = single(headers, SESSION_HEADER)?.ok_or(TransportError::MissingSession)?;
    let id = SessionId::parse(raw).ok_or(TransportError::SessionNotFound)?;
    let key = SessionKey { user: principal.user, id };
    if app.store.delete_session(&key).await? {
        Ok(StatusCode::OK.into_response())
    } else {
        Err(TransportError::SessionNotFound)
    }
}

pub(crate) async fn other(State(app): State<AppState>, req: Request) -> Response {
    match admit(&app, req).await {
        Ok(_) => TransportError::MethodNotAllowed.into_response(),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_sorts_messages_and_refuses_batches() {
        let m = |s: &str| classify(&Bytes::from(s.to_owned()));
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
    }
}
