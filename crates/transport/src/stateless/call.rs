//! `tools/call` in the stateless generation: the front end's part in the call's checks, the call in flight (one
//! response: plain JSON, or an SSE stream of its own once it notifies or runs long; per-request log levels; input
//! requests round by round; cancellation by closing the stream), the task it may become after its tool's delay,
//! and the call of a tool that always runs as a task, queued at once.

use super::headers::check_param_headers;
use super::meta::Meta;
use super::reply::{complete, send_bounded};
use super::rounds::{Asking, Inputs};
use crate::call::{CallEnd, CallSink, Cleared, Early, Finished, Front, Identity, Interrupt, STATELESS_GENERATION};
use crate::error::TransportError;
use crate::extract::McpHeaders;
use crate::idempotency::{self, Ran};
use crate::mcp;
use crate::request::{Post, Result, admit};
use crate::sse::{self, Frame};
use crate::{AppState, Principal, code};
use async_trait::async_trait;
use axum::response::{IntoResponse, Response};
use mcpfleet_limits as limits;
use mcpfleet_state::SlotSet;
use mcpfleet_tools::downstream::{DownstreamRequest, DownstreamResponse, DownstreamToken};
use mcpfleet_tools::{JsonObject, TaskMode, ToolContext, ToolError};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, oneshot};
use tokio_util::sync::CancellationToken;

/// The stateless generation's part in a call's checks: the `Mcp-Param-*` headers, then the input answers of a
/// retry (its `requestState` must verify); admission with the bucket (there is no session); early answers carry
/// the stateless code allocation and the result's `_meta`.
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
    pub(super) async fn stateless_call(
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
                let r = r.map(|v| complete(app, v, false)).map_err(|(c, m)| (code::stateless(c), m));
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
            subject: self.asker.subject.clone(),
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
                &self.asker.caller.user,
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
            Ran::Here(Err(Done::Rpc((c, msg)))) => Err((code::stateless(c), msg)),
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
}

/// How the HTTP handler answers a call.
enum Answer {
    Json(Value),
    Sse(sse::Feed),
    /// A protocol refusal with its HTTP status (a capability the client did not declare).
    Refused(TransportError),
}

enum Out {
    Pending(Option<oneshot::Sender<Answer>>),
    Streaming(sse::Live),
    Done,
}

/// One stateless `tools/call` in flight. It answers with plain JSON unless it sends a notification (progress, a log
/// message) or runs longer than `sse_after`; then it switches to an SSE stream of its own. Nothing is committed
/// anywhere: a broken stream loses the call, and the client re-issues it (with its idempotency key, if it must
/// not run twice).
struct Call {
    app: AppState,
    principal: Principal,
    /// The caller's token, for the tool's downstream exchanges (only with downstreams configured).
    subject: Option<mcpfleet_downstream::SubjectToken>,
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

impl Call {
    /// Whose downstream tokens this call's tool asks for.
    fn downstream_who(&self) -> crate::downstream::Who<'_> {
        crate::downstream::Who {
            app: &self.app,
            principal: &self.principal,
            subject: self.subject.as_ref(),
            trace_id: &self.trace_id,
            session: None,
            generation: crate::downstream::Generation::Rounds,
        }
    }

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
    fn streaming(&self, out: &mut Out) -> Option<sse::Live> {
        match out {
            Out::Streaming(tx) => Some(tx.clone()),
            Out::Pending(tx) => {
                let (live, rx) = sse::channel();
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
        tx.try_send(Frame::Unsequenced { data: msg });
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
/// long), with the stateless code allocation and cache-free `_meta`; a refused `requestState` refuses the request; a
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
                let r = r.map(|v| complete(&self.app, v, false)).map_err(|(c, m)| (code::stateless(c), m));
                self.send_final(crate::jsonrpc::response(&self.request_id, r)).await;
            }
            Finished::Refused(e) => self.refuse(e).await,
        }
    }

    async fn go_streaming(&self) {
        // Long and silent: switch to SSE so that the connection gets keep-alives, opening with an empty event.
        let mut out = self.out.lock().await;
        if matches!(*out, Out::Pending(_))
            && let Some(tx) = self.streaming(&mut out)
        {
            tx.try_send(Frame::Opening);
        }
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
        let max_open = app.policy.plan_of(&self.principal).limits.max_tasks;
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
            max_open,
        };
        let created = match app.store.create_task(&new).await {
            Ok(Some(c)) => c,
            Ok(None) => {
                let _ = app.store.release_task_lease(shard, &key, 1).await;
                let _ = app.limits.tasks_refused(max_open);
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

    async fn downstream_token(&self, name: &str) -> std::result::Result<DownstreamToken, ToolError> {
        self.downstream_who().token(self, name).await
    }

    async fn downstream_send(
        &self,
        name: &str,
        request: DownstreamRequest,
    ) -> std::result::Result<DownstreamResponse, ToolError> {
        self.downstream_who().send(self, name, request).await
    }
}
