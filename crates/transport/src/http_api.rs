//! The handlers of `/mcp`. Their extractors (`extract.rs`) have checked the caller, the headers and the body; a
//! handler decides what the method needs, in an order that refuses a request before it touches the store.

use crate::Principal;
use crate::error::{TransportError, auth_rejection};
use crate::exchange::{CallRequest, Exchange, Outcome};
use crate::extract::{AcceptsEventStream, Caller, McpHeaders, Message, Rpc, SESSION_HEADER};
use crate::mcp;
use crate::metrics::method_label;
use crate::observe::{RequestIds, RpcInfo, with_info};
use crate::{AppState, SUPPORTED_VERSIONS, code, random_token, sse, tail, trace};
use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mcpfleet_state::Delivery;
use mcpfleet_state::{NewSession, SessionId, SessionInfo, SessionKey};
use mcpfleet_tools::JsonObject;
use serde_json::{Value, json};

/// Largest `capabilities` or `clientInfo` an initialize may store with its session.
const MAX_CLIENT_METADATA: usize = 16 * 1024;

type Result<T, E = TransportError> = std::result::Result<T, E>;

/// The session a request names, checked against the caller with one store call (which also extends its idle TTL):
/// unknown, ended and foreign sessions all look alike.
async fn session(app: &AppState, h: &mut McpHeaders, caller: &Principal) -> Result<(SessionKey, SessionInfo)> {
    let key = h.session_key(caller)?;
    let info = app.store.touch_session(&key).await?.ok_or(TransportError::SessionNotFound)?;
    Ok((key, info))
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

pub(crate) async fn post(
    State(app): State<AppState>,
    Extension(ids): Extension<RequestIds>,
    Caller(caller): Caller,
    h: McpHeaders,
    Rpc(message): Rpc,
) -> Response {
    let label = match &message {
        Message::Request { method, .. } | Message::Notification { method, .. } => method_label(method),
        Message::Response { .. } => "response",
    };
    let mut info = rpc_info(label, &caller, &h);
    // The MCP span: parented to `params._meta.traceparent` when the request carries one, else to the HTTP span.
    let span = match &message {
        Message::Request { id, method, params } => {
            let parent = trace::meta_parent(params).unwrap_or_else(|| ids.http.clone());
            let target = match method.as_str() {
                "tools/call" | "prompts/get" => {
                    params.get("name").and_then(Value::as_str).map(|n| mcp::truncate(n, 64))
                }
                _ => None,
            };
            let span = trace::mcp_span(&parent, method, target.as_deref(), Some(id), info.session.as_deref());
            if method == "tools/call" {
                info.tool = target;
            }
            Some(span)
        }
        Message::Notification { method, params } => {
            let parent = trace::meta_parent(params).unwrap_or_else(|| ids.http.clone());
            Some(trace::mcp_span(&parent, method, None, None, info.session.as_deref()))
        }
        Message::Response { .. } => None,
    };
    let mut span = trace::SpanGuard::new(span);
    let trace_id = span.context().and_then(trace::trace_id_of).unwrap_or_else(|| ids.trace_id.clone());
    if trace_id != ids.trace_id {
        info.trace_id = Some(trace_id.clone());
    }
    let r = post_message(&app, &ids, &trace_id, &mut span, caller, h, message).await;
    match &r {
        Err(e) if span.error.is_none() => span.error = Some(e.status_code().as_str().to_owned()),
        _ => {}
    }
    drop(span);
    with_info(r, info)
}

async fn post_message(
    app: &AppState,
    ids: &RequestIds,
    trace_id: &str,
    span: &mut trace::SpanGuard,
    caller: Principal,
    mut h: McpHeaders,
    message: Message,
) -> Result<Response> {
    if let Message::Request { id, method, params } = &message
        && method == "initialize"
    {
        return initialize(app, &caller, id, params).await;
    }
    h.version()?;
    if let Message::Response { id, raw } = message {
        // Checked and delivered in one script, so a refused response writes nothing.
        let key = h.session_key(&caller)?;
        let Some(id) = id.as_str().filter(|s| s.len() <= 128) else { return Err(TransportError::UnknownResponse) };
        let raw = std::str::from_utf8(&raw).map_err(|_| TransportError::Parse)?;
        return match app.store.deliver_response(&key, id, raw).await? {
            Delivery::Delivered { waiter_trace } => {
                // The answer joins the trace of the call that waits for it, wherever that call runs.
                if let Some(cx) = waiter_trace.as_deref().and_then(|w| trace::answer_span(w, &ids.http)) {
                    trace::end(&cx, None, &[]);
                }
                Ok(accepted())
            }
            Delivery::NotPending => Err(TransportError::UnknownResponse),
        };
    }
    let (key, info) = session(app, &mut h, &caller).await?;
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
                Err(e) => {
                    span.error = Some(e.0.to_string());
                    return Ok(rpc_json(&id, Err(e)));
                }
            };
            let args = match params.get("arguments") {
                None => JsonObject::new(),
                Some(Value::Object(a)) => a.clone(),
                Some(_) => {
                    span.error = Some(code::INVALID_PARAMS.to_string());
                    return Ok(rpc_json(&id, Err((code::INVALID_PARAMS, "params.arguments must be an object".into()))));
                }
            };
            // Step-up (MCP authorization): a caller without the tool's scopes gets 403 insufficient_scope naming
            // them, before anything runs.
            let required = app.tool_scopes(&name);
            if !caller.scopes.allow(&required) {
                app.metrics.tool_calls.with_label_values(&[&mcp::truncate(&name, 64), "refused"]).inc();
                let e = mcpfleet_auth::AuthError::InsufficientScope(required);
                span.error = Some("insufficient_scope".to_owned());
                return Err(auth_rejection(app, e));
            }
            let call = CallRequest {
                id,
                params: &params,
                name,
                args,
                trace_id: trace_id.to_owned(),
                span: span.take().unwrap_or_default(),
            };
            let outcome = Exchange::start(app.clone(), key, caller, &info, call);
            match outcome.await {
                Ok(Outcome::Json(v)) => Ok(axum::Json(v).into_response()),
                Ok(Outcome::Sse(rx)) => Ok(sse::response(app, rx, "call")),
                Err(_) => Err(TransportError::SessionNotFound),
            }
        }
        Message::Request { id, method, params } => {
            let r = mcp::plain(app, &key, &caller, &method, &params).await;
            if let Err((code, _)) = &r {
                span.error = Some(code.to_string());
            }
            Ok(rpc_json(&id, r))
        }
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
    app.metrics.sessions_created.inc();
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

/// What the access log and the metrics learn of a request: its method label, the caller's hash and the session's.
fn rpc_info(method: &'static str, caller: &Principal, h: &McpHeaders) -> RpcInfo {
    RpcInfo {
        method: Some(method),
        principal: Some(caller.user.as_str().to_owned()),
        session: h.session_tag(),
        tool: None,
        trace_id: None,
    }
}

pub(crate) async fn get(
    State(app): State<AppState>,
    Caller(caller): Caller,
    _accepts: AcceptsEventStream,
    mut h: McpHeaders,
) -> Response {
    let info = rpc_info("GET", &caller, &h);
    let r = async {
        h.version()?;
        let cursor = h.last_event_id()?;
        let (key, info) = session(&app, &mut h, &caller).await?;
        let rx = tail::open(&app, key, cursor, info.protocol_version.as_str() >= "2025-11-25").await?;
        Ok(sse::response(&app, rx, "listen"))
    };
    with_info(r.await, info)
}

pub(crate) async fn delete(State(app): State<AppState>, Caller(caller): Caller, mut h: McpHeaders) -> Response {
    let info = rpc_info("DELETE", &caller, &h);
    let r = async {
        h.version()?;
        let key = h.session_key(&caller)?;
        if app.store.delete_session(&key).await? {
            app.metrics.sessions_deleted.inc();
            Ok(StatusCode::OK.into_response())
        } else {
            Err(TransportError::SessionNotFound)
        }
    };
    with_info(r.await, info)
}

/// Any other method on `/mcp`: 405, after the caller checks.
pub(crate) async fn other(_caller: Caller) -> TransportError {
    TransportError::MethodNotAllowed
}
