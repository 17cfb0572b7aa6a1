//! The session generation (2025-03-26, 2025-06-18, 2025-11-25): `initialize` and its session, every other
//! message on the session it names, a `tools/call` as an [`exchange::Exchange`] (the call pipeline's session sink:
//! the event log, resumable streams, server→client requests), the standalone GET stream and resumption
//! ([`tail`]), and DELETE. It imports the call pipeline and the shared request context, never `stateless`.

pub(crate) mod exchange;
pub(crate) mod tail;

use crate::call::{Cleared, Early, Front, SESSION_GENERATION};
use crate::error::TransportError;
use crate::extract::{AcceptsEventStream, Caller, McpHeaders, Message, SESSION_HEADER};
use crate::mcp;
use crate::observe::{RpcInfo, with_info};
use crate::request::{Asker, Post, Result, accepted, admit, charge_unadmitted, rpc_info, rpc_json, stateless_header};
use crate::{AppState, PeerAddr, ProtocolVersion, code, new_session_id, sse, trace};
use async_trait::async_trait;
use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use exchange::{CallRequest, Exchange, Outcome};
use mcpfleet_limits::{self as limits, Granted};
use mcpfleet_state::Delivery;
use mcpfleet_state::{NewSession, SessionId, SessionKey};
use mcpfleet_state::{SessionOp, SlotSet};
use mcpfleet_tools::JsonObject;
use serde_json::{Value, json};

/// Largest `capabilities` or `clientInfo` an initialize may carry, as JSON. The capabilities are stored with the
/// session; `clientInfo` is bounded the same way but not stored (nothing reads it back).
const MAX_CLIENT_METADATA: usize = 16 * 1024;

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

/// The session generation's part in a call's checks: admission with the session the request names (and its
/// version); early answers are JSON-RPC bodies with the request's id.
struct SessionFront<'h> {
    h: &'h mut McpHeaders,
}

#[async_trait]
impl Front for SessionFront<'_> {
    const GENERATION: &'static str = SESSION_GENERATION;
    type Ticket = SessionKey;

    fn bad_target(&self, e: (i64, String)) -> Early {
        Early::Answer(Err(e))
    }

    fn bad_key(&self, e: TransportError) -> Early {
        Early::Answer(Err((code::INVALID_PARAMS, e.to_string())))
    }

    fn check(&self, _: &Post<'_>, _: &str, _: &JsonObject) -> Result<()> {
        Ok(())
    }

    fn ready(&mut self, _: &mut Post<'_>, _: &str, _: &JsonObject, _: &JsonObject) -> Result<()> {
        Ok(())
    }

    async fn admit(
        &mut self,
        post: &mut Post<'_>,
        slot: Option<SlotSet>,
        quota: Option<(&str, limits::Quota)>,
    ) -> Result<(SessionKey, Granted)> {
        admit_session(post.app, post.info, post.asker, self.h, slot, quota).await
    }
}

impl Post<'_> {
    /// Answers a message of the session generation.
    pub(crate) async fn session(
        &mut self,
        mut h: McpHeaders,
        message: Message,
        duplicate: Option<&str>,
    ) -> Result<Response> {
        let app = self.app;
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
        let Cleared { name, args, idem, ticket: key, granted } =
            match self.preflight(&mut SessionFront { h }, params, duplicate).await {
                Ok(c) => c,
                Err(Early::Answer(r)) => return Ok(rpc_json(&id, r)),
                Err(Early::Refuse(e)) => return Err(e),
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
            subject: self.asker.subject.clone(),
            slot,
            quota_charged: granted.quota.is_some(),
            idem,
        };
        let outcome = Exchange::start(app.clone(), key, self.asker.caller.clone(), &session, call);
        match outcome.await {
            Ok(Outcome::Json(v)) => Ok(axum::Json(v).into_response()),
            Ok(Outcome::Sse(rx)) => Ok(sse::response(app, rx, "call", sse::Held::default(), &self.asker.caller.user)),
            Err(_) => Err(TransportError::SessionNotFound),
        }
    }

    async fn initialize(&mut self, id: &Value, params: &JsonObject) -> Result<Response> {
        let app = self.app;
        let requested = params.get("protocolVersion").and_then(Value::as_str);
        let Some(requested) = requested else {
            return Ok(rpc_json(id, Err((code::INVALID_PARAMS, "params.protocolVersion must be a string".into()))));
        };
        // The version asked for when this server speaks it, else the newest of the session generation.
        let version = ProtocolVersion::parse(requested)
            .filter(|v| !v.is_stateless())
            .unwrap_or(ProtocolVersion::V2025_11_25)
            .as_str();
        let caps = params.get("capabilities").cloned().unwrap_or_else(|| json!({})).to_string();
        let info_len = params.get("clientInfo").map_or(0, |v| v.to_string().len());
        if caps.len() > MAX_CLIENT_METADATA || info_len > MAX_CLIENT_METADATA {
            let msg =
                format!("params.capabilities and params.clientInfo must each be at most {MAX_CLIENT_METADATA} bytes");
            return Ok(rpc_json(id, Err((code::INVALID_PARAMS, msg))));
        }
        let sid = SessionId::parse(&new_session_id())
            .ok_or(TransportError::InvalidRequest("session id generation failed"))?;
        let new = NewSession {
            protocol_version: version.to_owned(),
            client_capabilities: caps,
            idle_ttl: app.config.session_idle_ttl,
        };
        // The session cap (and the bucket) are checked in the same call that creates the session.
        let create = SessionOp::Create { id: &sid, session: &new, max_sessions: 0 };
        admit(app, self.info, &limits::Request { session: create, ..self.asker.request() }).await?;
        app.metrics.sessions_created.inc();
        let mut result = json!({
            "protocolVersion": version,
            "capabilities": crate::mcp::capabilities(app),
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
        if stateless_header(&h) {
            info.stateless = true;
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
        let list = Some(crate::policy::listed::ListWatch::new(&app.policy, &caller));
        Ok(sse::response(&app, rx, "listen", sse::Held { slot, list, ..sse::Held::default() }, &caller.user))
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
        if stateless_header(&h) {
            info.stateless = true;
            return Err(TransportError::MethodNotAllowed);
        }
        h.version()?;
        let key = admit_control(&app, &mut info, &asker, &mut h).await?;
        match app.store.delete_session(&key).await? {
            Some(ended) => {
                app.metrics.sessions_deleted.inc();
                // The id says when the session began (one of a build before it does not).
                if let Some(lasted) = crate::session_age(key.id.as_str()) {
                    app.metrics.observe_session(&ended, lasted);
                }
                Ok(StatusCode::OK.into_response())
            }
            None => Err(TransportError::SessionNotFound),
        }
    }
    .await;
    let r = charge_unadmitted(&app, &mut info, &asker, r).await;
    with_info(r, info)
}
