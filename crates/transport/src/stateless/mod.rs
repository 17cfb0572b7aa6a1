//! The 2026-07-28 generation: every request is self-describing and answered on its own, by any replica, with no
//! session. A POST is answered this way when its `MCP-Protocol-Version` header or its
//! `params._meta["io.modelcontextprotocol/protocolVersion"]` names a modern version; anything else takes the
//! session path (`session/`). Here: the request metadata and header checks (`-32020`, `-32022`, `-32602`),
//! `server/discover`, the catalog methods with `resultType`, `serverInfo` and caching hints, `tools/call` with
//! per-request log levels, cancellation by closing the stream, multi round-trip requests (see [`mrtr`]) and
//! idempotency keys, and `subscriptions/listen` streams fed by the principal's notice channel.

pub(crate) mod mrtr;

use crate::call::{CallEnd, CallSink, Finished, Interrupt, STATELESS_GENERATION};
use crate::call::{Cleared, Early, Front, Identity};
use crate::error::TransportError;
use crate::extract::McpHeaders;
use crate::extract::Message;
use crate::idempotency::{self, Ran};
use crate::input;
use crate::mcp;
use crate::request::{Post, accepted, admit};
use crate::sse::{self, Frame};
use crate::{AppState, Principal, ProtocolVersion, code};
use async_trait::async_trait;
use axum::response::{IntoResponse, Response};
use mcpfleet_limits as limits;
use mcpfleet_state::{Ring, SlotSet};
use mcpfleet_tools::{JsonObject, LOG_LEVELS, TaskMode, ToolContext, ToolError};
use mrtr::{RequestState, StateRefusal};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub(crate) const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
const CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
const LOG_LEVEL_KEY: &str = "io.modelcontextprotocol/logLevel";
const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";
const SUBSCRIPTION_KEY: &str = "io.modelcontextprotocol/subscriptionId";
/// Frames a slow client may fall behind on a call's stream before its messages are dropped.
const LIVE_BUFFER: usize = 256;
/// Most resource URIs one `subscriptions/listen` may name.
const MAX_SUBSCRIPTIONS: usize = 256;
/// Longest resource URI a subscription may name, in bytes.
const MAX_URI_BYTES: usize = 2048;

type Result<T, E = TransportError> = std::result::Result<T, E>;

/// Whether a POSTed message is answered in the 2026-07-28 generation: its version header says a modern version,
/// or its `_meta` names a protocol version that is not one of the session generation's (the session generation
/// has no such field; a `_meta` naming a session version is left to the session path, which asks for a session).
pub(crate) fn is_modern(h: &McpHeaders, params: Option<&JsonObject>) -> bool {
    let header = crate::request::stateless_header(h);
    let meta = params.and_then(|p| p.get("_meta")).and_then(|m| m.get(VERSION_KEY));
    header
        || meta.is_some_and(|v| v.as_str().and_then(ProtocolVersion::parse).is_none_or(ProtocolVersion::is_stateless))
}

/// What a modern request says of itself in `_meta`.
pub(crate) struct Meta {
    pub(crate) capabilities: Value,
    /// The lowest log level the client wants (`notifications/message` is sent only when set).
    pub(crate) log_level: Option<usize>,
}

/// Checks the version (header and `_meta` must agree, and be served here) and the required `_meta` fields.
pub(crate) fn meta(h: &McpHeaders, params: &JsonObject) -> Result<Meta> {
    let header =
        h.raw_version().map_err(|_| TransportError::HeaderMismatch("MCP-Protocol-Version is malformed".into()))?;
    let meta = match params.get("_meta") {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err(TransportError::InvalidMeta("params._meta must be an object".into())),
    };
    // Required fields first (-32602), then the header against the body (-32020), then the version (-32022).
    let body = match meta.and_then(|m| m.get(VERSION_KEY)) {
        None => {
            return Err(TransportError::InvalidMeta(format!("params._meta[\"{VERSION_KEY}\"] is required")));
        }
        Some(Value::String(v)) => v.as_str(),
        Some(_) => {
            return Err(TransportError::InvalidMeta(format!("params._meta[\"{VERSION_KEY}\"] must be a string")));
        }
    };
    let capabilities = match meta.and_then(|m| m.get(CAPABILITIES_KEY)) {
        Some(c @ Value::Object(_)) => c.clone(),
        Some(_) => {
            return Err(TransportError::InvalidMeta(format!("params._meta[\"{CAPABILITIES_KEY}\"] must be an object")));
        }
        None => return Err(TransportError::InvalidMeta(format!("params._meta[\"{CAPABILITIES_KEY}\"] is required"))),
    };
    match header {
        None => return Err(TransportError::HeaderMismatch("the MCP-Protocol-Version header is required".into())),
        Some(hv) if hv != body => {
            return Err(TransportError::HeaderMismatch(format!(
                "MCP-Protocol-Version header value '{}' does not match body value '{}'",
                mcp::truncate(hv, 32),
                mcp::truncate(body, 32)
            )));
        }
        Some(_) => {}
    }
    if !ProtocolVersion::parse(body).is_some_and(ProtocolVersion::is_stateless) {
        return Err(TransportError::ProtocolVersion(mcp::truncate(body, 32)));
    }
    let log_level = match meta.and_then(|m| m.get(LOG_LEVEL_KEY)) {
        None => None,
        Some(v) => Some(v.as_str().and_then(|l| LOG_LEVELS.iter().position(|x| *x == l)).ok_or_else(|| {
            TransportError::InvalidMeta(format!(
                "params._meta[\"{LOG_LEVEL_KEY}\"] must be one of {}",
                LOG_LEVELS.join(", ")
            ))
        })?),
    };
    Ok(Meta { capabilities, log_level })
}

/// Decodes a header value that may use the `=?base64?…?=` sentinel.
fn decode_header(v: &str) -> Option<String> {
    use base64::Engine as _;
    match v.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        Some(b) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(v.to_owned()),
    }
}

/// `Mcp-Method` and (for `tools/call`, `resources/read`, `prompts/get` and the tasks extension's `tasks/get`,
/// `tasks/update` and `tasks/cancel`, where it is the task id) `Mcp-Name` must be present and match the body.
pub(crate) fn check_headers(h: &McpHeaders, method: &str, params: &JsonObject) -> Result<()> {
    let bad = |m: String| Err(TransportError::HeaderMismatch(m));
    match &h.mcp_method {
        Err(_) => return bad("the Mcp-Method header is malformed".into()),
        Ok(None) => return bad("the Mcp-Method header is required".into()),
        Ok(Some(m)) if m != method => {
            return bad(format!(
                "Mcp-Method header value '{}' does not match body value '{}'",
                mcp::truncate(m, 64),
                mcp::truncate(method, 64)
            ));
        }
        Ok(Some(_)) => {}
    }
    let field = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        "tasks/get" | "tasks/update" | "tasks/cancel" => "taskId",
        _ => return Ok(()),
    };
    let header = match &h.mcp_name {
        Err(_) => return bad("the Mcp-Name header is malformed".into()),
        Ok(None) => return bad(format!("the Mcp-Name header is required for {method}")),
        Ok(Some(v)) => v,
    };
    let Some(decoded) = decode_header(header) else {
        return bad("the Mcp-Name header is not valid =?base64?…?= encoding".into());
    };
    // A body without the field is refused by the method itself (-32602).
    if let Some(body) = params.get(field).and_then(Value::as_str)
        && body != decoded
    {
        return bad(format!(
            "Mcp-Name header value '{}' does not match body value '{}'",
            mcp::truncate(&decoded, 64),
            mcp::truncate(body, 64)
        ));
    }
    Ok(())
}

/// The `Mcp-Param-*` headers of a `tools/call` against its arguments: every parameter the tool mirrors
/// (`x-mcp-header`) that has a value needs its header, equal to the value once decoded (integers compare as
/// numbers); a parameter without a value needs none.
pub(crate) fn check_param_headers(h: &McpHeaders, app: &AppState, tool: &str, args: &JsonObject) -> Result<()> {
    let declared = app.validator.param_headers(tool);
    if declared.is_empty() {
        return Ok(());
    }
    for p in declared {
        let wanted = p.name.to_ascii_lowercase();
        let name = format!("Mcp-Param-{}", p.name);
        let sent = h.mcp_params.iter().find(|(n, _)| *n == wanted).map(|(_, v)| v);
        let (body, sent) = match (mcpfleet_tools::headers::header_text(p, args), sent) {
            (_, Some(Err(_))) => {
                return Err(TransportError::HeaderMismatch(format!("the {name} header has invalid characters")));
            }
            (None, None) | (Some(Err(())), _) => continue, // (a value of the wrong type: the schema refuses it)
            (None, Some(Ok(_))) => {
                return Err(TransportError::HeaderMismatch(format!(
                    "the {name} header is sent but the body has no value for it"
                )));
            }
            (Some(Ok(_)), None) => {
                return Err(TransportError::HeaderMismatch(format!(
                    "the {name} header is required: the body has a value for it"
                )));
            }
            (Some(Ok(b)), Some(Ok(v))) => (b, v),
        };
        let Some(decoded) = decode_header(sent) else {
            return Err(TransportError::HeaderMismatch(format!(
                "the {name} header is not valid =?base64?…?= encoding"
            )));
        };
        let same = match p.kind {
            mcpfleet_tools::headers::ParamKind::Integer => same_integer(&decoded, &body),
            _ => decoded == body,
        };
        if !same {
            return Err(TransportError::HeaderMismatch(format!(
                "{name} header value '{}' does not match body value '{}'",
                mcp::truncate(&decoded, 64),
                mcp::truncate(&body, 64)
            )));
        }
    }
    Ok(())
}

/// Whether a header's integer text (`42`, or `42.0`) names the body's integer, exactly, within JavaScript's safe
/// range (±(2^53 − 1)), as the spec asks of `x-mcp-header` integers.
fn same_integer(header: &str, body: &str) -> bool {
    const SAFE: i128 = (1 << 53) - 1;
    let Ok(b) = body.parse::<i128>() else { return false };
    let h = match header.parse::<i128>() {
        Ok(h) => h,
        Err(_) => match header.split_once('.') {
            Some((int, frac)) if !frac.is_empty() && frac.bytes().all(|c| c == b'0') => match int.parse::<i128>() {
                Ok(h) => h,
                Err(_) => return false,
            },
            _ => return false,
        },
    };
    h == b && h.abs() <= SAFE
}

/// Marks a result complete and names the server in its `_meta`; `cache` adds the caching hints.
pub(crate) fn complete(app: &AppState, mut result: Value, cacheable: bool) -> Value {
    if let Value::Object(o) = &mut result {
        o.entry("resultType").or_insert_with(|| json!("complete"));
        if cacheable {
            let ttl = u64::try_from(app.config.cache_ttl.as_millis()).unwrap_or(u64::MAX);
            o.insert("ttlMs".into(), json!(ttl));
            // Lists filtered by the caller's scopes, and anything read under a token, are the caller's own.
            let scope = if app.config.protected_resource.is_some() { "private" } else { "public" };
            o.insert("cacheScope".into(), json!(scope));
        }
        let meta = o.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(m) = meta {
            m.insert(SERVER_INFO_KEY.into(), server_info(app));
        }
    }
    result
}

fn server_info(app: &AppState) -> Value {
    json!({ "name": app.config.server_name, "version": app.config.server_version })
}

fn ok(id: &Value, result: Value) -> Response {
    axum::Json(crate::jsonrpc::result(id, result)).into_response()
}

/// A JSON-RPC error answered with HTTP 200 (an error of the method itself, with the modern code allocation).
fn rpc_error(id: &Value, (c, message): (i64, String), data: Option<Value>) -> Response {
    let error = crate::jsonrpc::error_object(code::modern(c), &message, data);
    axum::Json(crate::jsonrpc::error(Some(id), error)).into_response()
}

/// The result of `server/discover`.
fn discover(app: &AppState) -> Value {
    let mut r = json!({
        "supportedVersions": ProtocolVersion::NEWEST_FIRST.map(ProtocolVersion::as_str),
        "capabilities": capabilities(app),
    });
    if let Some(i) = app.catalog.instructions() {
        r["instructions"] = json!(i);
    }
    complete(app, r, true)
}

/// The catalog's capabilities as 2026-07-28 states them: no `logging` (levels are per request), no
/// `resources.subscribe` (resource updates come through `subscriptions/listen`), and the tasks extension.
fn capabilities(app: &AppState) -> Value {
    let mut caps = app.catalog.capabilities();
    if let Some(r) = caps.get_mut("resources").and_then(Value::as_object_mut) {
        r.remove("subscribe");
    }
    if let Value::Object(c) = &mut caps {
        let ext = c.entry("extensions").or_insert_with(|| json!({}));
        if let Value::Object(e) = ext {
            e.insert(crate::tasks::EXTENSION.into(), json!({}));
        }
    }
    caps
}

/// The stateless generation's part in a call's checks: the `Mcp-Param-*` headers, then the input answers of a
/// retry (its `requestState` must verify); admission with the bucket (there is no session); early answers carry
/// the modern code allocation and the result's `_meta`.
struct StatelessFront<'h> {
    h: &'h McpHeaders,
    /// The request declares the tasks extension.
    tasks: bool,
    /// The digest of the tool and its arguments, for the request state.
    digest: String,
    /// The answers the request carries for its input requests.
    answers: JsonObject,
}

#[async_trait]
impl Front for StatelessFront<'_> {
    const GENERATION: &'static str = STATELESS_GENERATION;
    type Ticket = ();

    fn bad_target(&self, e: (i64, String)) -> Early {
        Early::Refuse(TransportError::InvalidMeta(e.1))
    }

    fn bad_key(&self, e: TransportError) -> Early {
        Early::Refuse(e)
    }

    fn check(&self, post: &Post<'_>, name: &str, args: &JsonObject) -> Result<()> {
        // A tool that only runs as a task needs a client that can take one.
        if post.app.catalog.tool_task(name).mode == TaskMode::Always && !self.tasks {
            return Err(TransportError::MissingCapability(vec![crate::tasks::EXTENSION.to_owned()]));
        }
        check_param_headers(self.h, post.app, name, args)
    }

    fn ready(&mut self, post: &mut Post<'_>, name: &str, args: &JsonObject, params: &JsonObject) -> Result<()> {
        self.digest = idempotency::digest(name, args);
        self.answers = post.input_answers("tools/call", &self.digest, params)?;
        Ok(())
    }

    async fn admit(
        &mut self,
        post: &mut Post<'_>,
        slot: Option<SlotSet>,
        quota: Option<(&str, limits::Quota)>,
    ) -> Result<((), mcpfleet_limits::Granted)> {
        // Every round is admitted against the tool's quota, and a round that ends asking for input gives its unit
        // back: a call costs one unit however many rounds it takes, and replaying a state cannot run it for free.
        let req = limits::Request { slot, quota, ..post.asker.request() };
        Ok(((), admit(post.app, post.info, &req).await?))
    }
}

impl Post<'_> {
    /// Answers a message of the stateless generation.
    pub(crate) async fn stateless(
        &mut self,
        h: McpHeaders,
        message: Message,
        duplicate: Option<&str>,
    ) -> Result<Response> {
        let app = self.app;
        self.info.modern = true;
        match message {
            Message::Request { id, method, params } => {
                self.info.request_id = Some(id.clone());
                self.modern(&h, &id, &method, &params, duplicate).await
            }
            // 2026-07-28 defines no client notification over HTTP: accepted, and ignored (a cancellation, as in the
            // session generation, without touching the bucket).
            Message::Notification { method, .. } => {
                let req = self.asker.request();
                let req = if method == "notifications/cancelled" { req.as_control() } else { req };
                admit(app, self.info, &req).await?;
                Ok(accepted())
            }
            Message::Response { .. } => Err(TransportError::InvalidRequest(
                "2026-07-28 clients send no responses: answer input requests with inputResponses on a retry",
            )),
        }
    }
}

impl Post<'_> {
    /// Answers one modern request. Every error carries the request's id and the modern code allocation.
    pub(crate) async fn modern(
        &mut self,
        h: &McpHeaders,
        id: &Value,
        method: &str,
        params: &JsonObject,
        duplicate: Option<&str>,
    ) -> Result<Response> {
        let m = meta(h, params)?;
        check_headers(h, method, params)?;
        let app = self.app;
        let cacheable = matches!(
            method,
            "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" | "resources/read"
        );
        match method {
            "tools/call" => self.modern_call(h, id, params, m, duplicate).await,
            "prompts/get" => self.modern_prompt(id, params, m).await,
            "subscriptions/listen" => self.listen(id, params, &m.capabilities).await,
            "tasks/get" | "tasks/update" | "tasks/cancel" => {
                Ok(match self.task_method(method, params, &m.capabilities).await? {
                    Ok(v) => ok(id, complete(app, v, false)),
                    Err(e) => {
                        self.span.error = Some(e.0.to_string());
                        rpc_error(id, e, None)
                    }
                })
            }
            "server/discover" => {
                admit(app, self.info, &self.asker.request()).await?;
                Ok(ok(id, discover(app)))
            }
            _ if !mcp::CATALOG_METHODS.contains(&method) => {
                Err(TransportError::MethodNotFound(mcp::truncate(method, 64)))
            }
            _ => {
                admit(app, self.info, &self.asker.request()).await?;
                let r = mcp::catalog_method(app, self.asker.caller, method, params).await;
                let r = r.unwrap_or_else(|| Err((code::METHOD_NOT_FOUND, "method not found".to_owned())));
                Ok(match r {
                    Ok(v) => ok(id, complete(app, v, cacheable)),
                    Err(e) => {
                        self.span.error = Some(e.0.to_string());
                        // A resource not found names the URI (SEP-2164), under -32602.
                        let data = (e.0 == code::RESOURCE_NOT_FOUND)
                            .then(|| params.get("uri").map(|u| json!({ "uri": u })))
                            .flatten();
                        rpc_error(id, e, data)
                    }
                })
            }
        }
    }

    async fn modern_call(
        &mut self,
        h: &McpHeaders,
        id: &Value,
        params: &JsonObject,
        m: Meta,
        duplicate: Option<&str>,
    ) -> Result<Response> {
        let app = self.app;
        let caller = self.asker.caller;
        let tasks = crate::tasks::declared(&m.capabilities);
        let mut front = StatelessFront { h, tasks, digest: String::new(), answers: JsonObject::new() };
        let Cleared { name, args, idem, granted, .. } = match self.preflight(&mut front, params, duplicate).await {
            Ok(c) => c,
            Err(Early::Answer(r)) => {
                let r = r.map(|v| complete(app, v, false)).map_err(|(c, m)| (code::modern(c), m));
                return Ok(axum::Json(crate::jsonrpc::response(id, r)).into_response());
            }
            Err(Early::Refuse(e)) => return Err(e),
        };
        let StatelessFront { digest, answers, .. } = front;
        let policy = app.catalog.tool_task(&name);
        if policy.mode == TaskMode::Always {
            let quota_charged = granted.quota.is_some();
            // The in-flight slot is not held: the task runs on a worker, bounded by --task-workers and the cap.
            if let Some(l) = granted.slot {
                drop(app.limits.hold(l));
            }
            let queued = Queued { name: &name, args: &args, answers: &answers, quota_charged };
            return self.queue_call(id, queued, &m.capabilities, idem.as_ref()).await;
        }
        let task_after = match policy.mode {
            TaskMode::After(d) if tasks => Some(d),
            _ => None,
        };
        let slot = granted.slot.map(|l| app.limits.hold(l));
        let progress_token = params.get("_meta").and_then(|m| m.get("progressToken")).cloned();
        let (tx, rx) = oneshot::channel();
        let call = Arc::new(Call {
            app: app.clone(),
            principal: caller.clone(),
            trace_id: self.trace_id.to_owned(),
            span: self.span.take().unwrap_or_default(),
            request_id: id.clone(),
            progress_token,
            cancel: CancellationToken::new(),
            closed: CancellationToken::new(),
            keyed: idem.is_some(),
            out: Mutex::new(Out::Pending(Some(tx))),
            to_task: task_after.map(|after| ToTask {
                after,
                tool: name.clone(),
                args: Value::Object(args.clone()).to_string(),
                answers: Value::Object(answers.clone()).to_string(),
                rerunnable: policy.rerunnable,
            }),
            inputs: Inputs::new(answers, m, "tools/call", digest),
            task: std::sync::OnceLock::new(),
            task_ready: tokio::sync::Notify::new(),
        });
        // Closing the response (the connection, or the SSE stream) cancels the call (see `drive`).
        let cancel_on_drop = call.closed.clone().drop_guard();
        let admitted = crate::call::Admitted { name, args, slot, quota_charged: granted.quota.is_some(), idem };
        app.calls.spawn(crate::call::drive(call.clone(), admitted));
        match rx.await {
            Ok(Answer::Json(v)) => {
                cancel_on_drop.disarm();
                Ok(axum::Json(v).into_response())
            }
            Ok(Answer::Refused(e)) => {
                cancel_on_drop.disarm();
                Err(e)
            }
            Ok(Answer::Sse(rx)) => Ok(sse::response(
                app,
                rx,
                "call",
                // No `retry:` on shutdown (2026-07-28 streams are not resumable): the call finishes within the
                // shutdown grace and its result ends the stream.
                sse::Held {
                    cancel_on_drop: Some(cancel_on_drop),
                    feeder_handles_shutdown: true,
                    ..sse::Held::default()
                },
            )),
            Err(_) => Err(TransportError::InvalidRequest("the call ended without an answer")),
        }
    }

    /// A call of a tool that always runs as a task: queued at once (the front refused a request without the
    /// extension), answered with the task's handle. Under an idempotency key a repeat gets the same task and gives
    /// its quota unit back; a refusal gives it back too, and one by a limit is counted and audited.
    async fn queue_call(
        &mut self,
        id: &Value,
        q: Queued<'_>,
        capabilities: &Value,
        idem: Option<&idempotency::Idempotent>,
    ) -> Result<Response> {
        let app = self.app;
        let caller = self.asker.caller;
        let trace_id = self.trace_id;
        let create = async {
            match crate::tasks::create_queued(app, caller, q.name, q.args, capabilities, q.answers, trace_id).await {
                Ok(v) => (Ok(v), true),
                Err(e) => (Err(Done::Refused(e)), false),
            }
        };
        let ran = idempotency::run(app, idem, app.config.tool_timeout, create).await;
        if q.quota_charged && !matches!(ran, Ran::Here(Ok(_))) {
            app.limits.refund(&caller.user, q.name).await;
        }
        let r = match ran {
            Ran::Here(Ok(v)) => Ok(v),
            Ran::Replayed(v) => {
                // The same task as the first call's.
                self.record_refused(q.name, q.args, CallEnd::Replayed, STATELESS_GENERATION);
                Ok(v)
            }
            Ran::Here(Err(Done::Rpc((c, msg)))) => Err((code::modern(c), msg)),
            Ran::Here(Err(Done::Refused(e))) => {
                if matches!(e, TransportError::Limit(_)) {
                    self.record_refused(q.name, q.args, CallEnd::RefusedByLimit, STATELESS_GENERATION);
                }
                return Err(e);
            }
        };
        let r = r.map(|v| complete(app, v, false));
        Ok(axum::Json(crate::jsonrpc::response(id, r)).into_response())
    }

    /// The answers a request carries for its input requests. A retry with a `requestState` must verify it for
    /// this caller, method and parameters; its earlier answers come from the state, and only the keys that state
    /// asked for are taken from `inputResponses`. A request without a state may carry answers too (they are the
    /// client's own words either way; the tool validates them).
    fn input_answers(&mut self, method: &str, digest: &str, params: &JsonObject) -> Result<JsonObject> {
        let app = self.app;
        let responses = match params.get("inputResponses") {
            None => None,
            Some(Value::Object(r)) => Some(r),
            Some(_) => return Err(TransportError::InvalidMeta("params.inputResponses must be an object".into())),
        };
        let token = match params.get("requestState") {
            None => return Ok(responses.cloned().unwrap_or_default()),
            Some(Value::String(t)) => t,
            Some(_) => return Err(TransportError::InvalidMeta(StateRefusal::Malformed.message().to_owned())),
        };
        let state = match app.config.request_state.open(token, self.asker.caller.user.as_str(), method, digest) {
            Ok(s) => s,
            Err(refusal) => {
                app.metrics.request_state_refusals.with_label_values(&[refusal.label()]).inc();
                self.span.error = Some("request_state".to_owned());
                return Err(TransportError::InvalidMeta(refusal.message().to_owned()));
            }
        };
        let mut answers = state.a;
        for k in &state.q {
            if let Some(v) = responses.and_then(|r| r.get(k)) {
                answers.insert(k.clone(), v.clone());
            }
        }
        Ok(answers)
    }

    /// `prompts/get`, which may ask the client for input (multi round-trip) like a tool.
    async fn modern_prompt(&mut self, id: &Value, params: &JsonObject, m: Meta) -> Result<Response> {
        let app = self.app;
        let (name, args) = mcp::target(params).map_err(|e| TransportError::InvalidMeta(e.1))?;
        let digest = idempotency::digest(&name, &args);
        let answers = self.input_answers("prompts/get", &digest, params)?;
        admit(app, self.info, &self.asker.request()).await?;
        let cx = PromptContext {
            principal: self.asker.caller.clone(),
            cancel: CancellationToken::new(),
            inputs: Inputs::new(answers, m, "prompts/get", digest),
        };
        let r = app.catalog.get_prompt_with(&name, &args, &cx).await;
        match cx.inputs.decide(app, &cx.principal, &r) {
            Some(Ok(v)) => Ok(ok(id, complete(app, v, false))),
            Some(Err(e)) => Err(e),
            None => match r {
                Ok(v) => Ok(ok(id, complete(app, v, false))),
                Err(e) => {
                    let e = mcp::tool_error(e);
                    self.span.error = Some(e.0.to_string());
                    Ok(rpc_error(id, e, None))
                }
            },
        }
    }

    /// `subscriptions/listen`: a long-lived SSE stream of the notifications the client opted into, from the
    /// principal's notice channel (fed by every replica), each tagged with the subscription's id.
    async fn listen(&mut self, id: &Value, params: &JsonObject, client: &Value) -> Result<Response> {
        let app = self.app;
        let filter = Filter::parse(params, &capabilities(app))?;
        if filter.asked_tasks && !crate::tasks::declared(client) {
            return Err(TransportError::MissingCapability(vec![crate::tasks::EXTENSION.to_owned()]));
        }
        let req = limits::Request { slot: Some(SlotSet::Streams), ..self.asker.request() };
        let granted = admit(app, self.info, &req).await?;
        let slot = granted.slot.map(|l| app.limits.hold(l));
        // Subscribed before the acknowledgment goes out: nothing published after it is missed.
        let mut sub = app.store.subscribe_user(&self.asker.caller.user).await?;
        let (tx, rx) = mpsc::channel(LIVE_BUFFER);
        let mut ack = json!({ "notifications": filter.acknowledged() });
        ack["_meta"] = json!({ SUBSCRIPTION_KEY: id });
        let ack = crate::jsonrpc::notification("notifications/subscriptions/acknowledged", ack);
        let _ = tx.try_send(Frame::Unsequenced { data: ack.to_string() });
        let (id, shutdown) = (id.clone(), app.shutdown.clone());
        let end = complete(app, json!({ "_meta": { SUBSCRIPTION_KEY: id } }), false);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tx.closed() => return,
                    () = shutdown.cancelled() => {
                        // A graceful end: the listen request's own response, then the stream closes.
                        let done = crate::jsonrpc::result(&id, end);
                        send_bounded(&tx, Frame::Unsequenced { data: done.to_string() }).await;
                        return;
                    }
                    ring = sub.recv() => match ring {
                        Some(Ring::Notice(msg)) => {
                            if let Some(n) = filter.pass(&msg, &id) {
                                // A client that stopped reading loses notifications, never the replica's memory.
                                let _ = tx.try_send(Frame::Unsequenced { data: n });
                            }
                        }
                        Some(_) => {}
                        None => return,
                    },
                }
            }
        });
        let held = sse::Held { slot, feeder_handles_shutdown: true, ..sse::Held::default() };
        Ok(sse::response(app, rx, "subscription", held))
    }
}

/// What a `subscriptions/listen` asked for, cut to what this server honours.
struct Filter {
    tools: bool,
    prompts: bool,
    resources: bool,
    uris: Vec<String>,
    /// Task ids whose `notifications/tasks` the stream carries (tasks extension). Any well-formed id is taken:
    /// another principal's task never notifies this principal's channel, so the acknowledgment tells nothing.
    tasks: Vec<String>,
    /// The request asked for task notifications (well-formed ids or not): it needs the extension.
    asked_tasks: bool,
}

impl Filter {
    fn parse(params: &JsonObject, caps: &Value) -> Result<Self> {
        let bad = |m: &str| TransportError::InvalidMeta(m.to_owned());
        let n = match params.get("notifications") {
            Some(Value::Object(n)) => n,
            None => return Err(bad("params.notifications is required")),
            Some(_) => return Err(bad("params.notifications must be an object")),
        };
        let flag = |k: &str, cap: &str| -> Result<bool> {
            let asked = match n.get(k) {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(TransportError::InvalidMeta(format!("params.notifications.{k} must be a boolean")));
                }
            };
            Ok(asked && caps.get(cap).and_then(|c| c.get("listChanged")).and_then(Value::as_bool) == Some(true))
        };
        let uris = match n.get("resourceSubscriptions") {
            None => Vec::new(),
            Some(Value::Array(a)) if a.len() <= MAX_SUBSCRIPTIONS => a
                .iter()
                .map(|u| u.as_str().filter(|u| !u.is_empty() && u.len() <= MAX_URI_BYTES).map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("params.notifications.resourceSubscriptions must hold URIs of 1 to 2048 bytes"))?,
            Some(_) => {
                return Err(bad("params.notifications.resourceSubscriptions must be an array of at most 256 URIs"));
            }
        };
        let asked_tasks = n.get("taskIds").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        let tasks = match n.get("taskIds") {
            None => Vec::new(),
            Some(Value::Array(a)) if a.len() <= MAX_SUBSCRIPTIONS => a
                .iter()
                .map(|t| t.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("params.notifications.taskIds must hold strings"))?
                .into_iter()
                .filter(|t| mcpfleet_state::TaskId::parse(t).is_some())
                .collect(),
            Some(_) => return Err(bad("params.notifications.taskIds must be an array of at most 256 task ids")),
        };
        let subscribe = caps.get("resources").is_some();
        Ok(Self {
            tools: flag("toolsListChanged", "tools")?,
            prompts: flag("promptsListChanged", "prompts")?,
            resources: flag("resourcesListChanged", "resources")?,
            uris: if subscribe { uris } else { Vec::new() },
            tasks,
            asked_tasks,
        })
    }

    fn acknowledged(&self) -> Value {
        let mut a = JsonObject::new();
        for (k, on) in [
            ("toolsListChanged", self.tools),
            ("promptsListChanged", self.prompts),
            ("resourcesListChanged", self.resources),
        ] {
            if on {
                a.insert(k.into(), json!(true));
            }
        }
        if !self.uris.is_empty() {
            a.insert("resourceSubscriptions".into(), json!(self.uris));
        }
        if !self.tasks.is_empty() {
            a.insert("taskIds".into(), json!(self.tasks));
        }
        Value::Object(a)
    }

    /// The notification to send for `msg`, tagged with the subscription, if the filter takes it.
    fn pass(&self, msg: &str, id: &Value) -> Option<String> {
        let mut n: Value = serde_json::from_str(msg).ok()?;
        let wanted = match n.get("method").and_then(Value::as_str)? {
            "notifications/tools/list_changed" => self.tools,
            "notifications/prompts/list_changed" => self.prompts,
            "notifications/resources/list_changed" => self.resources,
            "notifications/resources/updated" => {
                let uri = n.get("params").and_then(|p| p.get("uri")).and_then(Value::as_str)?;
                self.uris.iter().any(|u| u == uri)
            }
            "notifications/tasks" => {
                let task = n.get("params").and_then(|p| p.get("taskId")).and_then(Value::as_str)?;
                self.tasks.iter().any(|t| t == task)
            }
            _ => false,
        };
        if !wanted {
            return None;
        }
        let params = n.as_object_mut()?.entry("params").or_insert_with(|| json!({}));
        let meta = params.as_object_mut()?.entry("_meta").or_insert_with(|| json!({}));
        meta.as_object_mut()?.insert(SUBSCRIPTION_KEY.into(), id.clone());
        Some(n.to_string())
    }
}

/// How the HTTP handler answers a call.
enum Answer {
    Json(Value),
    Sse(mpsc::Receiver<Frame>),
    /// A protocol refusal with its HTTP status (a capability the client did not declare).
    Refused(TransportError),
}

enum Out {
    Pending(Option<oneshot::Sender<Answer>>),
    Streaming(mpsc::Sender<Frame>),
    Done,
}

/// The input requests of this round (MRTR), and the capabilities they needed that the client lacks.
#[derive(Default)]
struct Round {
    asked: Vec<(String, Value)>,
    missing: Vec<String>,
    /// The keys whose answers the handler read: only these ride in the next state.
    used: Vec<String>,
    /// How many input requests of each kind the tool made so far: the keys are `<kind>-<n>`, stable across rounds.
    counts: std::collections::HashMap<&'static str, u32>,
    /// The call is becoming a task (tasks extension): no more rounds; input is asked through the task.
    task: bool,
}

/// Where an input request goes.
enum Asking {
    /// Answered from the request (or refused) here.
    Done(std::result::Result<Value, ToolError>),
    /// Through the task the call became; the request's params, handed back.
    Task(Value),
}

/// One modern `tools/call` in flight. It answers with plain JSON unless it sends a notification (progress, a log
/// message) or runs longer than `sse_after`; then it switches to an SSE stream of its own. Nothing is committed
/// anywhere: a broken stream loses the call, and the client re-issues it (with its idempotency key, if it must
/// not run twice).
struct Call {
    app: AppState,
    principal: Principal,
    trace_id: String,
    span: opentelemetry::Context,
    request_id: Value,
    progress_token: Option<Value>,
    /// Stops the tool (`ToolContext::cancelled`).
    cancel: CancellationToken,
    /// Fired when the client closes the response.
    closed: CancellationToken,
    /// The call has an idempotency key: a client that goes away does not stop it (it finishes for the re-issue).
    keyed: bool,
    out: Mutex<Out>,
    inputs: Inputs,
    /// What the call needs to become a task (a tool with a delay, a client with the extension).
    to_task: Option<ToTask>,
    /// The task the call became (`Some(None)`: it tried and stays inline).
    task: std::sync::OnceLock<Option<crate::tasks::TaskLink>>,
    /// Rung when `task` is set.
    task_ready: tokio::sync::Notify,
}

/// A call of an always-a-task tool, on its way to the queue.
struct Queued<'a> {
    name: &'a str,
    args: &'a JsonObject,
    answers: &'a JsonObject,
    quota_charged: bool,
}

/// A call that becomes a task if still running after `after`: what its record keeps (to run it again elsewhere
/// if this replica dies and its tool allows it).
struct ToTask {
    after: Duration,
    tool: String,
    args: String,
    answers: String,
    rerunnable: bool,
}

/// The input requests (MRTR) of one request: the answers it carries, and what this round asks for.
struct Inputs {
    meta: Meta,
    /// Answers by input request key: the earlier rounds' (from the state) and this retry's.
    answers: JsonObject,
    round: std::sync::Mutex<Round>,
    /// The method and the digest of the salient parameters, which the state is bound to.
    method: &'static str,
    digest: String,
}

impl Inputs {
    fn new(answers: JsonObject, meta: Meta, method: &'static str, digest: String) -> Self {
        Self { meta, answers, round: std::sync::Mutex::default(), method, digest }
    }

    fn round(&self) -> std::sync::MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The answer under `key`, if the request carries it; else the request joins this round's `inputRequests`
    /// and the handler is told to stop (it runs again, from the start, on the retry).
    fn ask(&self, key: &str, method: &str, params: Value) -> Asking {
        let Some(kind) = input::kind(method) else {
            return Asking::Done(Err(ToolError::ClientUnsupported("requests")));
        };
        if let Some(answer) = self.answers.get(key) {
            self.round().used.push(key.to_owned());
            return Asking::Done(input::answer_value(key, answer));
        }
        let mut round = self.round();
        if round.task {
            // The call is becoming (or became) a task: input goes through it.
            return Asking::Task(params);
        }
        if self.meta.capabilities.get(kind).is_none() {
            round.missing.push(kind.to_owned());
            return Asking::Done(Err(ToolError::ClientUnsupported(kind)));
        }
        round.asked.push((key.to_owned(), json!({ "method": method, "params": params })));
        Asking::Done(Err(ToolError::Cancelled))
    }

    /// A key for an input request the handler did not name: `<kind>-<n>`, stable across rounds.
    fn auto_key(&self, method: &str) -> String {
        let kind = input::kind(method).unwrap_or("request");
        let mut round = self.round();
        let n = round.counts.entry(kind).or_insert(0);
        *n += 1;
        format!("{kind}-{n}")
    }

    /// How this round ends regardless of what the handler returned: an `InputRequiredResult` when it asked for
    /// input it does not have yet, a refusal when it needs a capability the client lacks; `None` when its own
    /// outcome stands.
    fn decide(
        &self,
        app: &AppState,
        principal: &Principal,
        r: &std::result::Result<Value, ToolError>,
    ) -> Option<std::result::Result<Value, TransportError>> {
        let round = std::mem::take(&mut *self.round());
        if let Err(ToolError::ClientUnsupported(cap)) = r
            && input::is_capability(cap)
        {
            return Some(Err(TransportError::MissingCapability(vec![(*cap).to_owned()])));
        }
        if !round.missing.is_empty() {
            return Some(Err(TransportError::MissingCapability(round.missing)));
        }
        if round.asked.is_empty() {
            return None;
        }
        let mut state = RequestState::new(principal.user.as_str(), self.method, &self.digest);
        // Only the answers the handler used: whatever else the client sent does not grow the state.
        state.a = round.used.iter().filter_map(|k| Some((k.clone(), self.answers.get(k)?.clone()))).collect();
        state.q = round.asked.iter().map(|(k, _)| k.clone()).collect();
        let requests: JsonObject = round.asked.into_iter().collect();
        Some(Ok(json!({
            "resultType": "input_required",
            "inputRequests": requests,
            "requestState": app.config.request_state.seal(state),
        })))
    }
}

/// The context of a `prompts/get`: it can ask for input, and nothing else.
struct PromptContext {
    principal: Principal,
    cancel: CancellationToken,
    inputs: Inputs,
}

#[async_trait]
impl ToolContext for PromptContext {
    async fn progress(&self, _: f64, _: Option<f64>, _: Option<&str>) -> std::result::Result<(), ToolError> {
        Ok(())
    }

    async fn log(&self, _: &str, _: Option<&str>, _: Value) -> std::result::Result<(), ToolError> {
        Ok(())
    }

    async fn request(&self, method: &str, params: Value, timeout: Duration) -> std::result::Result<Value, ToolError> {
        self.ask(&self.inputs.auto_key(method), method, params, timeout).await
    }

    async fn ask(&self, key: &str, method: &str, params: Value, _: Duration) -> std::result::Result<Value, ToolError> {
        match self.inputs.ask(key, method, params) {
            Asking::Done(r) => r,
            // A prompt never becomes a task.
            Asking::Task(_) => Err(ToolError::Cancelled),
        }
    }

    async fn notify_session(&self, _: &str, _: Value) -> std::result::Result<(), ToolError> {
        Err(ToolError::ClientUnsupported("notifications"))
    }

    async fn close_connection(&self, _: Duration) -> std::result::Result<(), ToolError> {
        Err(ToolError::ClientUnsupported("stream resumption"))
    }

    fn principal(&self) -> &Principal {
        &self.principal
    }

    fn client_capabilities(&self) -> &Value {
        &self.inputs.meta.capabilities
    }

    fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }
}

impl Call {
    /// The tool's outcome as this round's result (see [`Inputs::decide`]); tool failures become `isError`
    /// results as in the session generation.
    fn finish(&self, r: std::result::Result<Value, ToolError>, tool: &str) -> std::result::Result<Value, Done> {
        match self.inputs.decide(&self.app, &self.principal, &r) {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(Done::Refused(e)),
            None => mcp::tool_result(r, tool, &self.trace_id).map_err(Done::Rpc),
        }
    }

    /// Switches to SSE if still pending; returns the stream's sender.
    fn streaming(&self, out: &mut Out) -> Option<mpsc::Sender<Frame>> {
        match out {
            Out::Streaming(tx) => Some(tx.clone()),
            Out::Pending(tx) => {
                let (live, rx) = mpsc::channel(LIVE_BUFFER);
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Answer::Sse(rx));
                }
                *out = Out::Streaming(live.clone());
                Some(live)
            }
            Out::Done => None,
        }
    }

    async fn notify(&self, method: &str, params: Value) -> std::result::Result<(), ToolError> {
        let msg = crate::jsonrpc::notification(method, params).to_string();
        let mut out = self.out.lock().await;
        // The client went away (a keyed call finishing for its re-issue): the notification has nowhere to go.
        let Some(tx) = self.streaming(&mut out) else { return Ok(()) };
        drop(out);
        // A client that stopped reading loses notifications; it must never stall the tool.
        let _ = tx.try_send(Frame::Unsequenced { data: msg });
        Ok(())
    }

    async fn send_final(&self, msg: Value) {
        let mut out = self.out.lock().await;
        match std::mem::replace(&mut *out, Out::Done) {
            Out::Pending(Some(tx)) => {
                let _ = tx.send(Answer::Json(msg));
            }
            Out::Streaming(tx) => send_bounded(&tx, Frame::Unsequenced { data: msg.to_string() }).await,
            _ => {}
        }
    }

    async fn refuse(&self, e: TransportError) {
        let mut out = self.out.lock().await;
        match std::mem::replace(&mut *out, Out::Done) {
            Out::Pending(Some(tx)) => {
                let _ = tx.send(Answer::Refused(e));
            }
            Out::Streaming(tx) => {
                // The stream is open (200 went out): the refusal is its final JSON-RPC error.
                let msg = crate::jsonrpc::error(Some(&self.request_id), e.rpc_error(true));
                send_bounded(&tx, Frame::Unsequenced { data: msg.to_string() }).await;
            }
            _ => {}
        }
    }
}

/// The stateless generation's sink: one response (JSON, or an SSE stream of its own once the call notifies or runs
/// long), with the modern code allocation and cache-free `_meta`; a refused `requestState` refuses the request; a
/// client that closes its response stops the call, unless the call has an idempotency key.
#[async_trait]
impl CallSink for Call {
    const GENERATION: &'static str = STATELESS_GENERATION;
    type Error = Done;
    type Watch = crate::tasks::LinkWatch;

    fn identity(&self) -> Identity<'_> {
        Identity { app: &self.app, principal: &self.principal, trace_id: &self.trace_id, span: &self.span }
    }

    async fn run(self: Arc<Self>, tool: String, args: JsonObject) -> (std::result::Result<Value, Done>, bool) {
        let r = self.app.catalog.call_tool(&tool, args, &*self).await;
        let own = mcp::own_outcome(&r);
        (self.finish(r, &tool), own)
    }

    fn settle(&self, ran: Ran<Done>) -> (Finished, CallEnd) {
        match ran {
            Ran::Here(Err(Done::Refused(e))) => (Finished::Refused(e), CallEnd::ProtocolError),
            Ran::Here(Err(Done::Rpc(e))) => (Finished::Answer(Err(e)), CallEnd::ProtocolError),
            Ran::Here(Ok(v)) => {
                let end = if v.get("resultType").and_then(Value::as_str) == Some("input_required") {
                    CallEnd::InputRequired
                } else {
                    crate::call::outcome_of(&Ok(v.clone()))
                };
                (Finished::Answer(Ok(v)), end)
            }
            Ran::Replayed(v) => (Finished::Answer(Ok(v)), CallEnd::Replayed),
        }
    }

    async fn deliver(&self, finished: Finished) {
        if let Some(Some(link)) = self.task.get() {
            return link.end(finished).await;
        }
        match finished {
            Finished::Answer(r) => {
                let r = r.map(|v| complete(&self.app, v, false)).map_err(|(c, m)| (code::modern(c), m));
                self.send_final(crate::jsonrpc::response(&self.request_id, r)).await;
            }
            Finished::Refused(e) => self.refuse(e).await,
        }
    }

    async fn go_streaming(&self) {
        // Long and silent: switch to SSE so that the connection gets keep-alives.
        let mut out = self.out.lock().await;
        let _ = self.streaming(&mut out);
    }

    fn watcher(&self) -> crate::tasks::LinkWatch {
        crate::tasks::LinkWatch::default()
    }

    async fn watch(&self, w: &mut crate::tasks::LinkWatch) -> Interrupt {
        if let Some(Some(link)) = self.task.get() {
            // A task: the client left with its handle; what stops it now is tasks/cancel or a hand-off.
            return Interrupt::Stop(link.watch(w).await);
        }
        self.closed.cancelled().await;
        if let Some(Some(link)) = self.task.get() {
            return Interrupt::Stop(link.watch(w).await);
        }
        // The client closed the stream: send nothing more.
        *self.out.lock().await = Out::Done;
        if self.keyed { Interrupt::Detach } else { Interrupt::Stop(CallEnd::Cancelled) }
    }

    async fn stopped(&self, end: CallEnd) {
        self.cancel.cancel();
        if let Some(Some(link)) = self.task.get() {
            link.stopped(end).await;
        }
    }

    fn task_after(&self) -> Option<Duration> {
        self.to_task.as_ref().map(|t| t.after)
    }

    async fn become_task(&self) {
        let Some(spec) = &self.to_task else { return };
        {
            // Not while a round asks for input: the call is answering with an InputRequiredResult.
            let mut round = self.inputs.round();
            if !round.asked.is_empty() || !round.missing.is_empty() {
                return;
            }
            round.task = true;
        }
        let link = self.convert(spec).await;
        if link.is_none() {
            self.inputs.round().task = false;
        }
        let _ = self.task.set(link);
        self.task_ready.notify_waiters();
    }
}

impl Call {
    /// Makes this running call a task: its lease, then its record (running here, at the principal's cap), then its
    /// handle answers the request. `None` (it stays inline) at the cap or when the store fails.
    async fn convert(&self, spec: &ToTask) -> Option<crate::tasks::TaskLink> {
        let app = &self.app;
        let tasks = &app.tasks;
        let cfg = tasks.config();
        let key = mcpfleet_state::TaskKey { user: self.principal.user.clone(), id: mcpfleet_state::TaskId::random() };
        let shard = tasks.shard_of(&key.id);
        if let Err(e) = app.store.lease_task(shard, &key, 1, cfg.lease).await {
            tracing::warn!(error = %e, "call not made a task (store unavailable); it stays inline");
            return None;
        }
        let (caps, principal) =
            (self.inputs.meta.capabilities.to_string(), crate::tasks::principal_json(&self.principal));
        let new = mcpfleet_state::NewTask {
            key: &key,
            tool: &spec.tool,
            args: &spec.args,
            capabilities: &caps,
            principal: &principal,
            answers: &spec.answers,
            trace_id: &self.trace_id,
            ttl: cfg.ttl,
            poll_interval: cfg.poll_interval,
            rerunnable: spec.rerunnable,
            running_on: Some(tasks.replica()),
            max_open: app.limits.max_tasks(),
        };
        let created = match app.store.create_task(&new).await {
            Ok(Some(c)) => c,
            Ok(None) => {
                let _ = app.store.release_task_lease(shard, &key, 1).await;
                let _ = app.limits.tasks_refused();
                tracing::info!(tool.name = %spec.tool, "principal at its task cap: the call stays inline");
                return None;
            }
            Err(e) => {
                let _ = app.store.release_task_lease(shard, &key, 1).await;
                tracing::warn!(error = %e, "call not made a task (store unavailable); it stays inline");
                return None;
            }
        };
        let link = crate::tasks::TaskLink::hold(app, key.clone(), 1, spec.rerunnable, false);
        tasks.metrics().created.with_label_values(&["converted"]).inc();
        let handle = complete(app, crate::tasks::created_result(app, &key.id, created, true), false);
        self.send_final(crate::jsonrpc::result(&self.request_id, handle)).await;
        Some(link)
    }
}

/// Longest a final message waits for room on a stream whose client stopped reading; then it is dropped (the
/// client gave up on its answer), so that a stalled client never holds a call's task and slot.
const FINAL_SEND_WAIT: Duration = Duration::from_secs(30);

async fn send_bounded(tx: &mpsc::Sender<Frame>, frame: Frame) {
    let _ = tokio::time::timeout(FINAL_SEND_WAIT, tx.send(frame)).await;
}

/// What ends a round other than a result.
enum Done {
    Rpc((i64, String)),
    Refused(TransportError),
}

impl From<(i64, String)> for Done {
    fn from(e: (i64, String)) -> Self {
        Self::Rpc(e)
    }
}

#[async_trait]
impl ToolContext for Call {
    async fn progress(
        &self,
        progress: f64,
        total: Option<f64>,
        message: Option<&str>,
    ) -> std::result::Result<(), ToolError> {
        let Some(token) = &self.progress_token else { return Ok(()) };
        self.notify("notifications/progress", mcp::progress_params(token, progress, total, message)).await
    }

    async fn log(&self, level: &str, logger: Option<&str>, data: Value) -> std::result::Result<(), ToolError> {
        // No `notifications/message` unless the request asked for a level, and none below it.
        let Some(min) = self.inputs.meta.log_level else { return Ok(()) };
        match mcp::log_params(min, level, logger, data) {
            Some(params) => self.notify("notifications/message", params).await,
            None => Ok(()),
        }
    }

    /// MRTR (see [`Inputs::ask`]), or through the task the call became.
    async fn request(&self, method: &str, params: Value, timeout: Duration) -> std::result::Result<Value, ToolError> {
        self.ask(&self.inputs.auto_key(method), method, params, timeout).await
    }

    async fn ask(&self, key: &str, method: &str, params: Value, _: Duration) -> std::result::Result<Value, ToolError> {
        let mut params = params;
        loop {
            match self.inputs.ask(key, method, params) {
                Asking::Done(r) => return r,
                Asking::Task(p) => {
                    let ready = self.task_ready.notified();
                    tokio::pin!(ready);
                    ready.as_mut().enable();
                    match self.task.get() {
                        Some(Some(link)) => return link.ask(key, method, p, &self.inputs.meta.capabilities).await,
                        // The call could not become a task: it stays inline, with rounds.
                        Some(None) => params = p,
                        None => {
                            ready.await;
                            params = p;
                        }
                    }
                }
            }
        }
    }

    async fn notify_session(&self, method: &str, params: Value) -> std::result::Result<(), ToolError> {
        // No session: the principal's `subscriptions/listen` streams hear it, on every replica.
        let msg = crate::jsonrpc::notification(method, params).to_string();
        self.app.store.publish_user(&self.principal.user, &msg).await.map_err(|_| ToolError::Unavailable)
    }

    async fn close_connection(&self, _retry: Duration) -> std::result::Result<(), ToolError> {
        // 2026-07-28 streams are not resumable: there is nothing to resume from.
        Err(ToolError::ClientUnsupported("stream resumption"))
    }

    fn principal(&self) -> &Principal {
        &self.principal
    }

    fn client_capabilities(&self) -> &Value {
        &self.inputs.meta.capabilities
    }

    fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> JsonObject {
        v.as_object().cloned().unwrap_or_default()
    }

    fn modern_meta(extra: Value) -> JsonObject {
        let mut meta = json!({ VERSION_KEY: "2026-07-28", CAPABILITIES_KEY: {} });
        if let (Some(m), Some(e)) = (meta.as_object_mut(), extra.as_object()) {
            m.extend(e.clone());
        }
        params(json!({ "_meta": meta }))
    }

    #[test]
    fn the_generation_is_the_header_or_a_meta_version_outside_the_session_generation() {
        let none = McpHeaders::of(&[]);
        let header = McpHeaders::of(&[("mcp-protocol-version", "2026-07-28")]);
        assert!(is_modern(&header, None));
        assert!(!is_modern(&none, None));
        assert!(is_modern(&none, Some(&modern_meta(json!({})))));
        let session = params(json!({ "_meta": { VERSION_KEY: "2025-11-25" } }));
        assert!(!is_modern(&none, Some(&session)), "a session version in _meta takes the session path");
        let odd = params(json!({ "_meta": { VERSION_KEY: 7 } }));
        assert!(is_modern(&none, Some(&odd)), "a malformed _meta version is refused by the stateless checks");
    }

    #[test]
    fn meta_checks_run_in_the_conformance_order() {
        let h = McpHeaders::of(&[("mcp-protocol-version", "2026-07-28")]);
        let err = |h: &McpHeaders, p: &JsonObject| meta(h, p).err().map(|e| (e.status_code().as_u16(), e.to_string()));
        // Required fields first (-32602), whatever the header says.
        let (s, m) = err(&McpHeaders::of(&[]), &params(json!({}))).unwrap_or_default();
        assert_eq!(s, 400);
        assert!(m.contains("protocolVersion\"] is required"), "{m}");
        let no_caps = params(json!({ "_meta": { VERSION_KEY: "2026-07-28" } }));
        assert!(err(&h, &no_caps).is_some_and(|(_, m)| m.contains("clientCapabilities\"] is required")));
        let not_object = params(json!({ "_meta": 1 }));
        assert!(err(&h, &not_object).is_some_and(|(_, m)| m.contains("must be an object")));
        // Then the header against the body.
        let missing = err(&McpHeaders::of(&[]), &modern_meta(json!({}))).unwrap_or_default().1;
        assert!(missing.contains("header is required"), "{missing}");
        let other = McpHeaders::of(&[("mcp-protocol-version", "2025-11-25")]);
        let mismatch = err(&other, &modern_meta(json!({}))).unwrap_or_default().1;
        assert!(mismatch.contains("does not match body value '2026-07-28'"), "{mismatch}");
        // Then the version.
        let future = McpHeaders::of(&[("mcp-protocol-version", "2027-01-01")]);
        let p = params(json!({ "_meta": { VERSION_KEY: "2027-01-01", CAPABILITIES_KEY: {} } }));
        assert!(matches!(meta(&future, &p), Err(TransportError::ProtocolVersion(v)) if v == "2027-01-01"));
        // The log level, when given, must be a level.
        let bad_level = modern_meta(json!({ LOG_LEVEL_KEY: "loud" }));
        assert!(err(&h, &bad_level).is_some_and(|(_, m)| m.contains("must be one of debug")));
        let ok = meta(&h, &modern_meta(json!({ LOG_LEVEL_KEY: "warning" }))).ok();
        assert_eq!(ok.and_then(|m| m.log_level), LOG_LEVELS.iter().position(|l| *l == "warning"));
    }

    #[test]
    fn method_and_name_headers_match_the_body() {
        let call = params(json!({ "name": "tool é" }));
        let b64 = {
            use base64::Engine as _;
            format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode("tool é"))
        };
        let check =
            |pairs: &[(&str, &str)], method: &str, p: &JsonObject| check_headers(&McpHeaders::of(pairs), method, p);
        assert!(check(&[("mcp-method", "tools/call"), ("mcp-name", &b64)], "tools/call", &call).is_ok());
        assert!(check(&[("mcp-method", "tools/list")], "tools/list", &JsonObject::new()).is_ok(), "no name needed");
        let msg = |r: Result<()>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg(check(&[], "tools/list", &JsonObject::new())).contains("Mcp-Method header is required"));
        assert!(msg(check(&[("mcp-method", "tools/list")], "ping", &JsonObject::new())).contains("does not match"));
        assert!(
            msg(check(&[("mcp-method", "tools/call")], "tools/call", &call)).contains("Mcp-Name header is required")
        );
        let other = check(&[("mcp-method", "tools/call"), ("mcp-name", "other")], "tools/call", &call);
        assert!(msg(other).contains("Mcp-Name header value 'other' does not match body value 'tool é'"));
        let broken = check(&[("mcp-method", "tools/call"), ("mcp-name", "=?base64?***?=")], "tools/call", &call);
        assert!(msg(broken).contains("not valid =?base64?…?= encoding"));
        let uri = params(json!({ "uri": "test://x" }));
        assert!(check(&[("mcp-method", "resources/read"), ("mcp-name", "test://x")], "resources/read", &uri).is_ok());
    }

    #[test]
    fn integer_headers_compare_exactly_within_the_safe_range() {
        assert!(same_integer("42", "42"));
        assert!(same_integer("42.0", "42") && same_integer("-7.00", "-7"));
        assert!(!same_integer("42.5", "42") && !same_integer("4.2e1", "42") && !same_integer("42.", "42"));
        assert!(!same_integer("43", "42") && !same_integer("x", "42") && !same_integer("42", "x"));
        let max = ((1_i64 << 53) - 1).to_string();
        let over = (1_i64 << 53).to_string();
        assert!(same_integer(&max, &max));
        assert!(!same_integer(&over, &over), "outside JavaScript's safe range");
    }

    #[test]
    fn listen_filters_keep_what_was_asked_and_declared_and_tag_it() {
        let caps = json!({ "tools": { "listChanged": true }, "resources": {} });
        let asked = params(json!({ "notifications": {
            "toolsListChanged": true, "promptsListChanged": true, "resourceSubscriptions": ["test://a"] } }));
        let f = Filter::parse(&asked, &caps).ok().unwrap_or_else(|| panic!("a valid filter"));
        // Prompts were asked for but the client declared no prompts listChanged capability.
        assert_eq!(f.acknowledged(), json!({ "toolsListChanged": true, "resourceSubscriptions": ["test://a"] }));
        let id = json!("sub-1");
        let tagged = f.pass(r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#, &id);
        let tagged: Value = serde_json::from_str(&tagged.unwrap_or_default()).unwrap_or_default();
        assert_eq!(tagged["params"]["_meta"][SUBSCRIPTION_KEY], "sub-1");
        let updated = |uri: &str| {
            format!(r#"{{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{{"uri":"{uri}"}}}}"#)
        };
        assert!(f.pass(&updated("test://a"), &id).is_some());
        assert!(f.pass(&updated("test://b"), &id).is_none(), "not subscribed");
        assert!(f.pass(r#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#, &id).is_none());
        assert!(f.pass("not json", &id).is_none());
        // Without the resources capability, subscriptions are dropped; malformed filters are refused.
        let no_res = Filter::parse(&asked, &json!({})).ok().map(|f| f.acknowledged());
        assert_eq!(no_res, Some(json!({})));
        assert!(Filter::parse(&params(json!({})), &caps).is_err());
        assert!(Filter::parse(&params(json!({ "notifications": { "toolsListChanged": "yes" } })), &caps).is_err());
        let many: Vec<String> = (0..=MAX_SUBSCRIPTIONS).map(|i| format!("test://{i}")).collect();
        assert!(Filter::parse(&params(json!({ "notifications": { "resourceSubscriptions": many } })), &caps).is_err());
    }
}
