//! The handlers of `/mcp`. Their extractors (`extract.rs`) have checked the caller, the headers and the body; a
//! handler decides what the method needs, in an order that refuses a request before it touches the store.

use crate::Principal;
use crate::call::{CallEnd, RefusedCall};
use crate::error::{TransportError, auth_rejection};
use crate::exchange::{CallRequest, Exchange, Outcome};
use crate::extract::{AcceptsEventStream, Caller, McpHeaders, Message, Rpc, SESSION_HEADER};
use crate::mcp;
use crate::metrics::method_label;
use crate::observe::{RequestIds, RpcInfo, with_info};
use crate::{AppState, PeerAddr, SUPPORTED_VERSIONS, code, random_token, sse, tail, trace};
use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mcpfleet_limits::{self as limits, Granted, LimitError, Refused};
use mcpfleet_state::Delivery;
use mcpfleet_state::{NewSession, SessionId, SessionKey};
use mcpfleet_state::{SessionOp, SlotSet};
use mcpfleet_tools::JsonObject;
use serde_json::{Value, json};
use std::net::IpAddr;

/// Largest `capabilities` or `clientInfo` an initialize may store with its session.
const MAX_CLIENT_METADATA: usize = 16 * 1024;

type Result<T, E = TransportError> = std::result::Result<T, E>;

/// Who is asking, for admission: the verified principal, and the peer address where the bucket is keyed by it.
pub(crate) struct Asker<'a> {
    pub(crate) caller: &'a Principal,
    peer: Option<IpAddr>,
}

impl<'a> Asker<'a> {
    fn new(app: &AppState, caller: &'a Principal, peer: Option<Extension<PeerAddr>>) -> Self {
        let peer = peer.filter(|_| app.config.rate_key_by_peer).map(|Extension(p)| p.0.ip());
        Self { caller, peer }
    }

    pub(crate) fn request(&self) -> limits::Request<'a> {
        limits::Request::new(&self.caller.user, self.peer)
    }
}

/// Admits a request (bucket, session, caps, quota: one store call), noting the caller's bucket for the
/// `RateLimit` headers.
pub(crate) async fn admit(
    app: &AppState,
    info: &mut RpcInfo,
    req: &limits::Request<'_>,
) -> Result<Granted, LimitError> {
    info.charged = true;
    match app.limits.admit(req).await {
        Ok(g) => {
            info.rate = g.rate;
            Ok(g)
        }
        Err(Refused { rate, error }) => {
            info.rate = rate;
            Err(error)
        }
    }
}

/// Admission for a request on the session it names: unknown, ended and foreign sessions all look alike (404). A
/// session id that cannot be ours is refused without a store call (and charged by [`charge_unadmitted`]).
async fn admit_session(
    app: &AppState,
    info: &mut RpcInfo,
    asker: &Asker<'_>,
    h: &mut McpHeaders,
    slot: Option<SlotSet>,
    quota: Option<(&str, limits::Quota)>,
) -> Result<(SessionKey, Granted)> {
    let key = h.session_key(asker.caller)?;
    let req = limits::Request { session: SessionOp::Touch(&key.id), slot, quota, ..asker.request() };
    let g = admit(app, info, &req).await?;
    if let Some(s) = &g.session {
        h.check_session_version(&s.protocol_version)?;
    }
    Ok((key, g))
}

/// Admission of a control message on the session it names (see [`limits::Request::control`]), with the same
/// session and version checks.
async fn admit_control(
    app: &AppState,
    info: &mut RpcInfo,
    asker: &Asker<'_>,
    h: &mut McpHeaders,
) -> Result<SessionKey> {
    let key = h.session_key(asker.caller)?;
    let req = limits::Request { session: SessionOp::Touch(&key.id), ..asker.request().as_control() };
    let g = admit(app, info, &req).await?;
    if let Some(s) = &g.session {
        h.check_session_version(&s.protocol_version)?;
    }
    Ok(key)
}

/// Every request from an identified caller takes a token from its bucket, exactly once. A request answered before
/// its admission (a malformed body, a missing header, a bad argument) takes it here; if the bucket is empty, the
/// caller gets the 429 instead.
async fn charge_unadmitted(
    app: &AppState,
    info: &mut RpcInfo,
    asker: &Asker<'_>,
    r: Result<Response>,
) -> Result<Response> {
    let from_store =
        matches!(&r, Err(TransportError::Limit(_) | TransportError::Unavailable(_) | TransportError::AuthUnavailable));
    if info.charged || from_store {
        return r;
    }
    match admit(app, info, &asker.request()).await {
        Err(e @ LimitError::RateLimited { .. }) => Err(e.into()),
        _ => r,
    }
}

fn rpc_json(id: &Value, r: mcp::RpcResult) -> Response {
    axum::Json(crate::jsonrpc::response(id, r)).into_response()
}

fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}

pub(crate) async fn post(
    State(app): State<AppState>,
    Extension(ids): Extension<RequestIds>,
    peer: Option<Extension<PeerAddr>>,
    Caller(caller): Caller,
    h: McpHeaders,
    rpc: Result<Rpc, TransportError>,
) -> Response {
    let asker = Asker::new(&app, &caller, peer);
    let (message, duplicate) = match rpc {
        Ok(Rpc(m, duplicate)) => (m, duplicate),
        Err(e) => {
            let mut info = rpc_info(None, &caller, &h);
            // A body that could not be read is answered in the generation its version header names.
            info.modern = modern_header(&h);
            let r = charge_unadmitted(&app, &mut info, &asker, Err(e)).await;
            return with_info(r, info);
        }
    };
    let label = match &message {
        Message::Request { method, .. } | Message::Notification { method, .. } => method_label(method),
        Message::Response { .. } => "response",
    };
    let mut info = rpc_info(Some(label), &caller, &h);
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
    let mut cx = Post { app: &app, ids: &ids, trace_id: &trace_id, span: &mut span, asker: &asker, info: &mut info };
    let r = cx.message(h, message, duplicate.as_deref()).await;
    let r = charge_unadmitted(&app, &mut info, &asker, r).await;
    match &r {
        Err(e) if span.error.is_none() => span.error = Some(e.status_code().as_str().to_owned()),
        _ => {}
    }
    drop(span);
    with_info(r, info)
}

/// One POSTed message being answered.
pub(crate) struct Post<'a> {
    pub(crate) app: &'a AppState,
    ids: &'a RequestIds,
    pub(crate) trace_id: &'a str,
    pub(crate) span: &'a mut trace::SpanGuard,
    pub(crate) asker: &'a Asker<'a>,
    pub(crate) info: &'a mut RpcInfo,
}

impl Post<'_> {
    async fn message(&mut self, mut h: McpHeaders, mut message: Message, duplicate: Option<&str>) -> Result<Response> {
        let app = self.app;
        // Before anything reads a call's arguments (validation, digests, parameter headers, the tool), in both
        // generations: integral numbers where the schema says integer are integers.
        if let Message::Request { method, params, .. } = &mut message
            && method == "tools/call"
        {
            app.validator.normalize_arguments(params);
        }
        let params = match &message {
            Message::Request { params, .. } | Message::Notification { params, .. } => Some(params),
            Message::Response { .. } => None,
        };
        if crate::modern::is_modern(&h, params) {
            self.info.modern = true;
            return match message {
                Message::Request { id, method, params } => {
                    self.info.request_id = Some(id.clone());
                    self.modern(&h, &id, &method, &params, duplicate).await
                }
                // 2026-07-28 defines no client notification over HTTP: accepted, and ignored (a cancellation, as in
                // the session generation, without touching the bucket).
                Message::Notification { method, .. } => {
                    let req = self.asker.request();
                    let req = if method == "notifications/cancelled" { req.as_control() } else { req };
                    admit(app, self.info, &req).await?;
                    Ok(accepted())
                }
                Message::Response { .. } => Err(TransportError::InvalidRequest(
                    "2026-07-28 clients send no responses: answer input requests with inputResponses on a retry",
                )),
            };
        }
        if let Message::Request { id, method, params } = &message
            && method == "initialize"
        {
            return self.initialize(id, params).await;
        }
        h.version()?;
        match message {
            Message::Response { id, raw } => self.response(&mut h, &id, &raw).await,
            Message::Notification { method, params } => {
                let cancel = method == "notifications/cancelled";
                let key = if cancel {
                    admit_control(app, self.info, self.asker, &mut h).await?
                } else {
                    admit_session(app, self.info, self.asker, &mut h, None, None).await?.0
                };
                if cancel
                    && let Some(id) = params.get("requestId")
                    && (id.is_string() || id.is_i64() || id.is_u64())
                    && id.to_string().len() <= 256
                {
                    app.store.cancel_request(&key, &id.to_string()).await?;
                }
                Ok(accepted())
            }
            Message::Request { id, method, params } if method == "tools/call" => {
                self.call_tool(&mut h, id, &params, duplicate).await
            }
            Message::Request { id, method, params } => {
                let (key, _) = admit_session(app, self.info, self.asker, &mut h, None, None).await?;
                let r = mcp::plain(app, &key, self.asker.caller, &method, &params).await;
                if let Err((code, _)) = &r {
                    self.span.error = Some(code.to_string());
                }
                Ok(rpc_json(&id, r))
            }
        }
    }

    /// A client's answer to a server→client request: checked and delivered in one script, so a refused response
    /// writes nothing.
    async fn response(&mut self, h: &mut McpHeaders, id: &Value, raw: &Bytes) -> Result<Response> {
        let app = self.app;
        let Some(id) = id.as_str().filter(|s| s.len() <= 128) else { return Err(TransportError::UnknownResponse) };
        let raw = std::str::from_utf8(raw).map_err(|_| TransportError::Parse)?;
        // Checked and delivered in one script (`deliver_response`), without touching the session: the answer's
        // version header is not compared with the session's, as that would cost a write.
        let key = h.session_key(self.asker.caller)?;
        admit(app, self.info, &self.asker.request().as_control()).await?;
        match app.store.deliver_response(&key, id, raw).await? {
            Delivery::Delivered { waiter_trace } => {
                // The answer joins the trace of the call that waits for it, wherever that call runs.
                if let Some(cx) = waiter_trace.as_deref().and_then(|w| trace::answer_span(w, &self.ids.http)) {
                    trace::end(&cx, None, &[]);
                }
                Ok(accepted())
            }
            Delivery::NotPending => Err(TransportError::UnknownResponse),
        }
    }

    async fn call_tool(
        &mut self,
        h: &mut McpHeaders,
        id: Value,
        params: &JsonObject,
        duplicate: Option<&str>,
    ) -> Result<Response> {
        let app = self.app;
        let caller = self.asker.caller;
        let (name, args) = match mcp::target(params) {
            Ok(t) => t,
            Err(e) => {
                self.span.error = Some(e.0.to_string());
                return Ok(rpc_json(&id, Err(e)));
            }
        };
        self.require_tool_scopes(&name, &args)?;
        // The arguments against the exact schema the tool publishes, before anything runs or is counted against a
        // quota. A refusal still checks the session (and takes the token) in one round trip.
        if let Some(invalid) = invalid_arguments(app, &name, params.get("arguments"), duplicate)? {
            admit_session(app, self.info, self.asker, h, None, None).await?;
            self.record_refused(&name, &args, CallEnd::InvalidArguments);
            self.span.error = Some("invalid_arguments".to_owned());
            return Ok(rpc_json(&id, Ok(invalid_result(&name, &invalid))));
        }
        let idem = match crate::idempotency::from_params(&caller.user, &name, params, &args) {
            Ok(i) => i,
            Err(e) => return Ok(rpc_json(&id, Err((code::INVALID_PARAMS, e.to_string())))),
        };
        let quota = app.limits.quota_for(&name, app.catalog.tool_quota(&name));
        let admitted =
            admit_session(app, self.info, self.asker, h, Some(SlotSet::Calls), quota.map(|q| (name.as_str(), q))).await;
        let (key, granted) = match admitted {
            Ok(a) => a,
            Err(TransportError::Limit(LimitError::QuotaExhausted { tool, quota, retry_after })) => {
                // Not a protocol error: the model reads it, and should ask its user instead of retrying.
                self.record_refused(&name, &args, CallEnd::RefusedByLimit);
                self.span.error = Some("quota_exhausted".to_owned());
                return Ok(rpc_json(&id, Ok(quota_result(&tool, quota, retry_after, self.trace_id))));
            }
            Err(e @ TransportError::Limit(LimitError::RateLimited { .. } | LimitError::CapReached { .. })) => {
                self.record_refused(&name, &args, CallEnd::RefusedByLimit);
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let session = granted.session.ok_or(TransportError::SessionNotFound)?;
        let slot = granted.slot.map(|l| app.limits.hold(l));
        let call = CallRequest {
            id,
            params,
            name,
            args,
            trace_id: self.trace_id.to_owned(),
            span: self.span.take().unwrap_or_default(),
            slot,
            quota_charged: granted.quota.is_some(),
            idem,
        };
        let outcome = Exchange::start(app.clone(), key, caller.clone(), &session, call);
        match outcome.await {
            Ok(Outcome::Json(v)) => Ok(axum::Json(v).into_response()),
            Ok(Outcome::Sse(rx)) => Ok(sse::response(app, rx, "call", sse::Held::default())),
            Err(_) => Err(TransportError::SessionNotFound),
        }
    }

    /// Step-up (MCP authorization): a caller without the tool's scopes gets 403 insufficient_scope naming them,
    /// before anything runs or is counted against a quota; the refusal is audited.
    pub(crate) fn require_tool_scopes(&mut self, name: &str, args: &JsonObject) -> Result<()> {
        let app = self.app;
        let required = app.tool_scopes(name);
        if self.asker.caller.scopes.allow(&required) {
            return Ok(());
        }
        self.record_refused(name, args, CallEnd::Refused);
        self.span.error = Some("insufficient_scope".to_owned());
        Err(auth_rejection(app, mcpfleet_auth::AuthError::InsufficientScope(required)))
    }

    /// Counts and audits a call refused before it started.
    pub(crate) fn record_refused(&self, tool: &str, args: &JsonObject, end: CallEnd) {
        let principal = self.asker.caller;
        RefusedCall { app: self.app, principal, tool, args, trace_id: self.trace_id, end }.record();
    }

    async fn initialize(&mut self, id: &Value, params: &JsonObject) -> Result<Response> {
        let app = self.app;
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        let Some(requested) = requested else {
            return Ok(rpc_json(id, Err((code::INVALID_PARAMS, "params.protocolVersion must be a string".into()))));
        };
        let version = SUPPORTED_VERSIONS.iter().find(|v| **v == requested).copied().unwrap_or(SUPPORTED_VERSIONS[2]);
        let caps = params.get("capabilities").cloned().unwrap_or_else(|| json!({})).to_string();
        let info = params.get("clientInfo").cloned().unwrap_or(Value::Null).to_string();
        if caps.len() > MAX_CLIENT_METADATA || info.len() > MAX_CLIENT_METADATA {
            let msg =
                format!("params.capabilities and params.clientInfo must each be at most {MAX_CLIENT_METADATA} bytes");
            return Ok(rpc_json(id, Err((code::INVALID_PARAMS, msg))));
        }
        let sid =
            SessionId::parse(&random_token()).ok_or(TransportError::InvalidRequest("session id generation failed"))?;
        let new = NewSession {
            protocol_version: version.to_owned(),
            client_capabilities: caps,
            client_info: info,
            idle_ttl: app.config.session_idle_ttl,
        };
        // The session cap (and the bucket) are checked in the same call that creates the session.
        let create = SessionOp::Create { id: &sid, session: &new, max_sessions: 0 };
        admit(app, self.info, &limits::Request { session: create, ..self.asker.request() }).await?;
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
            HeaderValue::from_str(sid.as_str()).map_err(|_| TransportError::InvalidRequest("session id not ASCII"))?;
        resp.headers_mut().insert(SESSION_HEADER, hv);
        Ok(resp)
    }
}

/// The duplicate keys and schema violations of a call's arguments, if any. A duplicate key elsewhere in the
/// message is a malformed request.
pub(crate) fn invalid_arguments(
    app: &AppState,
    tool: &str,
    args: Option<&Value>,
    duplicate: Option<&str>,
) -> Result<Option<Vec<mcpfleet_tools::validate::Invalid>>> {
    use mcpfleet_tools::validate::Invalid;
    if let Some(at) = duplicate {
        // `classify` lets through only duplicates inside the arguments; any other is a malformed request.
        return match at.strip_prefix("/params") {
            Some(rest) if rest.starts_with("/arguments/") => {
                Ok(Some(vec![Invalid { pointer: rest.to_owned(), expected: "each key once (a duplicate key)".into() }]))
            }
            _ => Err(TransportError::Envelope(format!("the key at {} is given twice", mcp::truncate(at, 128)))),
        };
    }
    // Absent arguments are an empty object (MCP makes them optional), checked like any other.
    let empty = Value::Object(JsonObject::new());
    Ok(app.validator.check(tool, args.unwrap_or(&empty)).err())
}

/// The `isError` result of a call whose arguments do not match the tool's schema: every finding with its
/// pointer, and what to do. The values sent are not echoed.
pub(crate) fn invalid_result(tool: &str, found: &[mcpfleet_tools::validate::Invalid]) -> Value {
    let list = found.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    let text = format!(
        "Invalid arguments for the tool {tool}: {list}. The tool did not run. Correct the arguments to match its \
         input schema and call it again."
    );
    json!({ "content": [{ "type": "text", "text": text }], "isError": true })
}

/// The `isError` result of a call refused by its tool's quota: it names the tool, the quota and when to come
/// back, and tells the model to ask its user rather than retry.
pub(crate) fn quota_result(tool: &str, quota: limits::Quota, retry_after: u64, trace_id: &str) -> Value {
    let text = format!(
        "Quota exhausted: the tool {tool} may be called {quota} by this user, and that is used up. It can be \
         called again in {retry_after} s. Do not retry it before then, and do not retry blindly: tell the user, \
         and ask whether to wait or to do something else. Trace id: {trace_id}."
    );
    json!({ "content": [{ "type": "text", "text": text }], "isError": true })
}

/// What the access log and the metrics learn of a request: its method label, the caller's hash and the session's.
fn rpc_info(method: Option<&'static str>, caller: &Principal, h: &McpHeaders) -> RpcInfo {
    RpcInfo { method, principal: Some(caller.user.as_str().to_owned()), session: h.session_tag(), ..RpcInfo::default() }
}

pub(crate) async fn get(
    State(app): State<AppState>,
    peer: Option<Extension<PeerAddr>>,
    Caller(caller): Caller,
    accepts: Result<AcceptsEventStream, TransportError>,
    mut h: McpHeaders,
) -> Response {
    let mut info = rpc_info(Some("GET"), &caller, &h);
    let asker = Asker::new(&app, &caller, peer);
    let r = async {
        if modern_header(&h) {
            info.modern = true;
            return Err(TransportError::MethodNotAllowed);
        }
        accepts?;
        h.version()?;
        let cursor = h.last_event_id()?;
        let (key, granted) = admit_session(&app, &mut info, &asker, &mut h, Some(SlotSet::Streams), None).await?;
        let session = granted.session.ok_or(TransportError::SessionNotFound)?;
        // Held before the stream opens, so that a failure to open frees it.
        let slot = granted.slot.map(|l| app.limits.hold(l));
        let data = crate::ProtocolVersion::parse(&session.protocol_version)
            .is_some_and(crate::ProtocolVersion::primes_with_data);
        let rx = tail::open(&app, key, cursor, data).await?;
        Ok(sse::response(&app, rx, "listen", sse::Held { slot, ..sse::Held::default() }))
    }
    .await;
    let r = charge_unadmitted(&app, &mut info, &asker, r).await;
    with_info(r, info)
}

pub(crate) async fn delete(
    State(app): State<AppState>,
    peer: Option<Extension<PeerAddr>>,
    Caller(caller): Caller,
    mut h: McpHeaders,
) -> Response {
    let mut info = rpc_info(Some("DELETE"), &caller, &h);
    let asker = Asker::new(&app, &caller, peer);
    let r = async {
        if modern_header(&h) {
            info.modern = true;
            return Err(TransportError::MethodNotAllowed);
        }
        h.version()?;
        let key = admit_control(&app, &mut info, &asker, &mut h).await?;
        if app.store.delete_session(&key).await? {
            app.metrics.sessions_deleted.inc();
            Ok(StatusCode::OK.into_response())
        } else {
            Err(TransportError::SessionNotFound)
        }
    }
    .await;
    let r = charge_unadmitted(&app, &mut info, &asker, r).await;
    with_info(r, info)
}

/// A GET or DELETE that says 2026-07-28: that generation has neither (405, `Allow: POST`).
fn modern_header(h: &McpHeaders) -> bool {
    matches!(h.raw_version(), Ok(Some(v)) if crate::MODERN_VERSIONS.contains(&v))
}

/// Any other method on `/mcp`: 405, after the caller checks.
pub(crate) async fn other(_caller: Caller) -> TransportError {
    TransportError::MethodNotAllowed
}
