//! One `tools/call` in flight. The call runs in a task of its own, detached from the HTTP connection, so a client
//! that disconnects does not stop it. It answers with plain JSON when it produces nothing before its result; its
//! first intermediate message (or `sse_after` of silence) switches it to SSE. From then on every message is
//! committed to the session's event log before it is written to the connection, the replica renews a lease on
//! the stream, and any replica can resume it.

use crate::Principal;
use crate::backoff::Backoff;
use crate::call::{CallEnd, CallSink, Finished, Identity, Interrupt, outcome_of};
use crate::idempotency::Ran;
use crate::sse::{self, Frame};
use crate::{AppState, random_token};
use async_trait::async_trait;
use mcpfleet_state::{
    AppendOptions, EventId, LeaseToken, OpenStream, Ring, SessionInfo, SessionKey, StateError, Subscription,
};
use mcpfleet_tools::downstream::{DownstreamRequest, DownstreamResponse, DownstreamToken};
use mcpfleet_tools::{JsonObject, LOG_LEVELS, ToolContext, ToolError};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, oneshot};
use tokio_util::sync::CancellationToken;

/// Most server→client requests (sampling, elicitation, roots) one call may have waiting for the client at once;
/// each holds a doorbell subscription and a place in the session's record until it is answered or times out. One
/// more fails the tool's `request` at once (docs/OPERATING.md#memory).
pub(crate) const MAX_PENDING_REQUESTS: usize = 16;
/// How long a call keeps trying to commit its response through a store outage.
const FINAL_RETRY_FOR: Duration = Duration::from_secs(60);
/// How long an intermediate event (progress, a log message, a server→client request) is retried before it is
/// dropped; the tool waits meanwhile.
const EVENT_RETRY_FOR: Duration = Duration::from_secs(10);

/// How the HTTP handler answers.
pub(crate) enum Outcome {
    Json(Value),
    Sse(sse::Feed),
}

enum Mode {
    Pending(Option<oneshot::Sender<Outcome>>),
    /// `sent`: the place (`AppendOptions::seq`) of the last event committed, or given up on; `last`: the id of
    /// the last event committed (the priming event's at first).
    Streaming {
        stream: u64,
        /// The connection's queue; dropped when the client is gone or is a whole queue behind (see
        /// [`sse::Live`]): it then resumes from the log.
        live: Option<sse::Live>,
        sent: u64,
        last: EventId,
    },
    Done,
}

pub(crate) struct Exchange {
    app: AppState,
    key: SessionKey,
    principal: Principal,
    subject: Option<mcpfleet_downstream::SubjectToken>,
    /// The request's trace id, in the audit event and in `isError` results.
    trace_id: String,
    /// The call's MCP span, ended by the call's audit record.
    span: opentelemetry::Context,
    request_id: Value,
    progress_token: Option<Value>,
    /// The client's capabilities as stored, parsed only if a tool asks for them.
    client_capabilities_raw: String,
    client_capabilities: std::sync::OnceLock<Value>,
    min_log_level: usize,
    /// Clients older than 2025-11-25 get a priming event without `data:`.
    priming_data: bool,
    cancel: CancellationToken,
    /// Fired by the lease renewer when the stream is no longer ours (session deleted or expired).
    lost: CancellationToken,
    /// Fired when the exchange ends, to stop its renewer.
    done: CancellationToken,
    mode: Mutex<Mode>,
    next_request: AtomicU64,
    /// Server→client requests still waiting for the client: forgotten (and cancelled towards the client) if the
    /// call is aborted while it waits.
    outstanding: std::sync::Mutex<Vec<String>>,
    /// The URL-mode elicitation the call ended for (a downstream's authorization), the data of its `-32042` error.
    elicitation: std::sync::OnceLock<Value>,
}

/// One `tools/call`, as the handler parsed it.
pub(crate) struct CallRequest<'a> {
    pub(crate) id: Value,
    pub(crate) params: &'a JsonObject,
    pub(crate) name: String,
    pub(crate) args: JsonObject,
    pub(crate) trace_id: String,
    /// The call's MCP span; the exchange ends it when the call ends.
    pub(crate) span: opentelemetry::Context,
    /// The caller's token, for the tool's downstream exchanges (only with downstreams configured).
    pub(crate) subject: Option<mcpfleet_downstream::SubjectToken>,
    /// The caller's in-flight slot, freed when the call ends.
    pub(crate) slot: Option<mcpfleet_limits::SlotGuard>,
    /// The call used one unit of its tool's quota (given back if the tool refuses the arguments).
    pub(crate) quota_charged: bool,
    /// The call's idempotency key, if it has one.
    pub(crate) idem: Option<crate::idempotency::Idempotent>,
}

impl Exchange {
    /// Starts `call` and returns how the HTTP handler should answer.
    pub(crate) fn start(
        app: AppState,
        key: SessionKey,
        principal: Principal,
        session: &SessionInfo,
        call: CallRequest<'_>,
    ) -> oneshot::Receiver<Outcome> {
        let CallRequest { id: request_id, params, name, args, trace_id, span, subject, slot, quota_charged, idem } =
            call;
        let (tx, rx) = oneshot::channel();
        let progress_token = params.get("_meta").and_then(|m| m.get("progressToken")).cloned();
        let min_log_level =
            session.log_level.as_deref().and_then(|l| LOG_LEVELS.iter().position(|x| *x == l)).unwrap_or(0);
        let ex = Arc::new(Self {
            app,
            key,
            principal,
            subject,
            trace_id,
            span,
            request_id,
            progress_token,
            client_capabilities_raw: session.client_capabilities.clone(),
            client_capabilities: std::sync::OnceLock::new(),
            min_log_level,
            priming_data: crate::ProtocolVersion::parse(&session.protocol_version)
                .is_some_and(crate::ProtocolVersion::primes_with_data),
            cancel: CancellationToken::new(),
            lost: CancellationToken::new(),
            done: CancellationToken::new(),
            mode: Mutex::new(Mode::Pending(Some(tx))),
            next_request: AtomicU64::new(1),
            outstanding: std::sync::Mutex::new(Vec::new()),
            elicitation: std::sync::OnceLock::new(),
        });
        let calls = ex.app.calls.clone();
        calls.spawn(crate::call::drive(ex, crate::call::Admitted { name, args, slot, quota_charged, idem }));
        rx
    }

    /// Keeps the elicitation a downstream's authorization needs, for the `-32042` error the call ends with.
    fn note_elicitation<T>(&self, r: Result<T, ToolError>) -> Result<T, ToolError> {
        if let Err(ToolError::UrlElicitationRequired(e)) = &r {
            let _ = self.elicitation.set(e.clone());
        }
        r
    }

    /// Whose downstream tokens this call's tool asks for.
    fn downstream_who(&self) -> crate::downstream::Who<'_> {
        crate::downstream::Who {
            app: &self.app,
            principal: &self.principal,
            subject: self.subject.as_ref(),
            trace_id: &self.trace_id,
            session: Some(self.key.id.as_str()),
            generation: crate::downstream::Generation::Session,
        }
    }

    fn response(&self, result: Result<Value, (i64, String)>) -> Value {
        crate::jsonrpc::response(&self.request_id, result)
    }

    /// The stream this call writes to, once it streams.
    async fn stream(&self) -> Option<u64> {
        match &*self.mode.lock().await {
            Mode::Streaming { stream, .. } => Some(*stream),
            _ => None,
        }
    }

    /// The session ended (DELETE on any replica, or expiry): the call is already stopped; write nothing, and close
    /// the client's connection.
    async fn session_gone(&self) {
        *self.mode.lock().await = Mode::Done;
    }

    /// Renews the stream's lease until the exchange ends; fires `lost` if the stream is no longer ours.
    fn spawn_renewer(&self, stream: u64, token: LeaseToken) {
        let (store, key, ttl) = (self.app.store.clone(), self.key.clone(), self.app.config.lease_ttl);
        let (lost, done) = (self.lost.clone(), self.done.clone());
        tokio::spawn(async move {
            // Every third of a lease; after a failure, every 100 ms, so that once the store is back the lease is
            // renewed before any resumer can give up on this call.
            let mut next = ttl / 3;
            loop {
                tokio::select! {
                    () = done.cancelled() => return,
                    () = tokio::time::sleep(next) => match store.renew_lease(&key, stream, &token, ttl).await {
                        Ok(true) => next = ttl / 3,
                        Ok(false) => {
                            lost.cancel();
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "lease renewal failed");
                            next = Duration::from_millis(100);
                        }
                    },
                }
            }
        });
    }

    /// Switches to SSE if still pending: opens the stream (committing its priming event) and hands the
    /// connection's receiver to the HTTP handler.
    async fn ensure_streaming(&self) -> Result<(), ToolError> {
        let mut m = self.mode.lock().await;
        self.ensure_streaming_locked(&mut m).await
    }

    async fn ensure_streaming_locked(&self, m: &mut Mode) -> Result<(), ToolError> {
        let Mode::Pending(tx) = m else {
            return match m {
                Mode::Done => Err(ToolError::SessionGone),
                _ => Ok(()),
            };
        };
        let token = LeaseToken(random_token());
        let open = OpenStream::Post {
            request_id: self.request_id.to_string(),
            token: token.clone(),
            lease: self.app.config.lease_ttl,
        };
        let (stream, priming) = self.app.store.open_stream(&self.key, &open).await.map_err(context_error)?;
        let (live_tx, live_rx) = sse::channel();
        live_tx.try_send(Frame::Priming { id: priming, retry: self.app.config.retry, data: self.priming_data });
        let live = match tx.take().map(|tx| tx.send(Outcome::Sse(live_rx))) {
            Some(Ok(())) => Some(live_tx),
            _ => None,
        };
        self.spawn_renewer(stream, token);
        *m = Mode::Streaming { stream, live, sent: 0, last: priming };
        Ok(())
    }

    /// Commits one message to the stream (switching to SSE first if needed) and writes it to the connection.
    async fn emit(&self, msg: &Value, opts: AppendOptions) -> Result<(), ToolError> {
        let mut m = self.mode.lock().await;
        self.ensure_streaming_locked(&mut m).await?;
        let Mode::Streaming { stream, live, sent, last } = &mut *m else { return Err(ToolError::SessionGone) };
        let data = msg.to_string();
        // An event reaches the client only with the id of its commit, so a resume can never replay a copy of one
        // it already has. Its place in the stream makes the retries (and a write that lands after a timeout) add
        // no second copy. The tool waits meanwhile.
        *sent += 1;
        let opts = AppendOptions { seq: Some(*sent), ..opts };
        let mut retry = Backoff::for_up_to(EVENT_RETRY_FOR);
        let id = loop {
            match self.app.store.append(&self.key, *stream, &data, &opts).await {
                Ok(id) => break id,
                Err(StateError::SessionNotFound | StateError::StreamFinished) => return Err(ToolError::SessionGone),
                Err(e) if !matches!(e, StateError::Superseded) && retry.wait("event", &e).await => {}
                Err(e) => {
                    // Given up: never sent. Should the write still land, a resume delivers it (once); the next
                    // event takes the next place, so the write cannot land after it.
                    self.app.metrics.events_dropped.inc();
                    tracing::error!(error = %e, "event not committed; dropped");
                    if let Some(id) = &opts.pending_request {
                        // A server→client request that is not recorded as pending could never be answered.
                        let _ = self.app.store.forget_pending(&self.key, id).await;
                    }
                    return Err(ToolError::Unavailable);
                }
            }
        };
        *last = id;
        if let Some(tx) = live
            && !tx.try_send(Frame::Event { id, data })
        {
            // Gone or too slow: the client resumes from the log.
            *live = None;
        }
        Ok(())
    }

    /// A notification on this call's stream.
    async fn notify(&self, method: &str, params: Value) -> Result<(), ToolError> {
        let msg = crate::jsonrpc::notification(method, params);
        self.emit(&msg, AppendOptions::default()).await
    }

    async fn finish(&self, msg: Value) {
        // Requests the tool stopped waiting for (it dropped the future, or panicked) are void before the response.
        self.abandon_outstanding(true).await;
        let mut m = self.mode.lock().await;
        match std::mem::replace(&mut *m, Mode::Done) {
            Mode::Pending(tx) => {
                if let Some(tx) = tx {
                    let _ = tx.send(Outcome::Json(msg));
                }
            }
            Mode::Streaming { stream, live, last, .. } => {
                let frame = self.commit_final(stream, last, msg.to_string()).await;
                // Never wait on a stalled client: if the frame does not fit, it resumes from the log.
                if let (Some(tx), Some(f)) = (live, frame) {
                    tx.try_send(f);
                }
            }
            Mode::Done => {}
        }
    }

    /// Commits the response as the stream's final event. A store failure is retried while the lease (renewed
    /// until the exchange ends) keeps resumers waiting, so a finished call's result is not reported as lost.
    ///
    /// The final event needs no place of its own: once one write of it lands, the stream is finished and every
    /// other write of it is refused. A retry refused that way after an earlier attempt failed finds the write that
    /// landed in the log, after `last`, and sends that.
    async fn commit_final(&self, stream: u64, last: EventId, data: String) -> Option<Frame> {
        let opts = AppendOptions { is_final: true, ..AppendOptions::default() };
        let mut retry = Backoff::for_up_to(FINAL_RETRY_FOR);
        let mut failed = false;
        loop {
            match self.app.store.append(&self.key, stream, &data, &opts).await {
                Ok(id) => return Some(Frame::Event { id, data }),
                Err(StateError::StreamFinished) if failed => {
                    let landed = self.app.store.read_after(&self.key, stream, &last, true, 64).await.ok()?;
                    let e = landed.0.into_iter().find(|e| e.is_final && e.data == data)?;
                    return Some(Frame::Event { id: e.id, data });
                }
                Err(StateError::SessionNotFound | StateError::StreamFinished) => return None,
                Err(e) if retry.wait("final response", &e).await => failed = true,
                Err(e) => {
                    tracing::error!(error = %e, "final response not committed; sending it without an id");
                    return Some(Frame::Unsequenced { data });
                }
            }
        }
    }

    /// Emits a server→client request and waits for the client's answer, through whichever replica it arrives.
    async fn await_answer(
        &self,
        id: &str,
        msg: &Value,
        sub: &mut Box<dyn Subscription>,
        timeout: Duration,
    ) -> Result<Value, ToolError> {
        let opts = AppendOptions {
            pending_request: Some(id.to_owned()),
            pending_trace: crate::trace::traceparent_of(&self.span),
            ..AppendOptions::default()
        };
        self.emit(msg, opts).await?;
        // The operator's --client-request-timeout caps whatever the tool asked for.
        let timeout = timeout.min(self.app.config.client_request_timeout);
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut poll = tokio::time::interval(Duration::from_secs(2));
        poll.tick().await;
        let failure = loop {
            let check = tokio::select! {
                ring = sub.recv() => match ring {
                    Some(Ring::Response(r)) => r == id,
                    Some(Ring::Lagged) => true,
                    Some(Ring::Closed) | None => break ToolError::SessionGone,
                    Some(_) => false,
                },
                _ = poll.tick() => true,
                () = &mut deadline => break ToolError::ClientTimeout(timeout),
                () = self.cancel.cancelled() => break ToolError::Cancelled,
            };
            if check {
                // A store error is not the client's answer: keep waiting, the deadline bounds it.
                match self.app.store.take_response(&self.key, id).await {
                    Ok(Some(answer)) => return parse_answer(&answer),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(error = %e, "could not read the client's answer yet"),
                }
            }
        };
        match failure {
            // The end of the call voids it (see `request`).
            ToolError::Cancelled => {}
            ToolError::SessionGone => {}
            _ => {
                let _ = self.app.store.forget_pending(&self.key, id).await;
                let _ = self.notify("notifications/cancelled", json!({ "requestId": id, "reason": "timed out" })).await;
            }
        }
        Err(failure)
    }

    /// Forgets the server→client requests the aborted tool was waiting on and tells the client they are void.
    async fn abandon_outstanding(&self, notify: bool) {
        let ids = std::mem::take(&mut *self.outstanding.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for id in ids {
            let _ = self.app.store.forget_pending(&self.key, &id).await;
            if notify {
                let _ = self.notify("notifications/cancelled", json!({ "requestId": id, "reason": "cancelled" })).await;
            }
        }
    }

    /// The client cancelled: stop, and send no response. A JSON call answers with an error its client ignores;
    /// an SSE stream ends with an empty final event, so resumers stop too.
    async fn finish_cancelled(&self) {
        self.abandon_outstanding(true).await;
        let mut m = self.mode.lock().await;
        match std::mem::replace(&mut *m, Mode::Done) {
            Mode::Pending(Some(tx)) => {
                let _ = tx.send(Outcome::Json(
                    self.response(Err((crate::code::SERVER_ERROR, "request cancelled".to_owned()))),
                ));
            }
            Mode::Streaming { stream, last, .. } => {
                // Retried like a response, so that resumers end instead of reporting the call as lost.
                let _ = self.commit_final(stream, last, String::new()).await;
            }
            _ => {}
        }
    }
}

async fn recv(sub: &mut Option<Box<dyn Subscription>>) -> Option<Ring> {
    match sub {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

fn context_error(e: StateError) -> ToolError {
    match e {
        StateError::SessionNotFound | StateError::StreamFinished => ToolError::SessionGone,
        _ => ToolError::Unavailable,
    }
}

#[async_trait]
impl ToolContext for Exchange {
    async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) -> Result<(), ToolError> {
        let Some(token) = &self.progress_token else { return Ok(()) };
        self.notify("notifications/progress", crate::mcp::progress_params(token, progress, total, message)).await
    }

    async fn log(&self, level: &str, logger: Option<&str>, data: Value) -> Result<(), ToolError> {
        match crate::mcp::log_params(self.min_log_level, level, logger, data) {
            Some(params) => self.notify("notifications/message", params).await,
            None => Ok(()),
        }
    }

    async fn request(&self, method: &str, params: Value, timeout: Duration) -> Result<Value, ToolError> {
        self.ensure_streaming().await?;
        let Some(stream) = self.stream().await else { return Err(ToolError::SessionGone) };
        let id = format!("mcpfleet-{stream}-{}", self.next_request.fetch_add(1, Ordering::Relaxed));
        // Subscribe before the request can reach the client, so its answer cannot slip past.
        let mut sub = self.app.store.subscribe(&self.key).await.map_err(context_error)?;
        // Tracked until answered, timed out or refused. If the tool drops this future, panics or is cancelled, the
        // id stays here and the end of the call voids it (forgets it, and tells the client), exactly once.
        {
            let mut outstanding = self.outstanding.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if outstanding.len() >= MAX_PENDING_REQUESTS {
                return Err(ToolError::Internal(format!(
                    "more than {MAX_PENDING_REQUESTS} requests to the client waiting at once in one call"
                )));
            }
            outstanding.push(id.clone());
        }
        let msg = crate::jsonrpc::request(&Value::from(id.as_str()), method, params);
        let result = self.await_answer(&id, &msg, &mut sub, timeout).await;
        if !matches!(result, Err(ToolError::Cancelled)) {
            self.outstanding.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|o| *o != id);
        }
        result
    }

    async fn notify_session(&self, method: &str, params: Value) -> Result<(), ToolError> {
        let msg = crate::jsonrpc::notification(method, params).to_string();
        self.app
            .store
            .append(&self.key, mcpfleet_state::STANDALONE_STREAM, &msg, &AppendOptions::default())
            .await
            .map(|_| ())
            .map_err(context_error)
    }

    async fn close_connection(&self, retry: Duration) -> Result<(), ToolError> {
        let mut m = self.mode.lock().await;
        self.ensure_streaming_locked(&mut m).await?;
        if let Mode::Streaming { live, .. } = &mut *m
            && let Some(tx) = live.take()
        {
            tx.try_send(Frame::Retry(retry));
        }
        Ok(())
    }

    fn principal(&self) -> &Principal {
        &self.principal
    }

    fn client_capabilities(&self) -> &Value {
        self.client_capabilities
            .get_or_init(|| serde_json::from_str(&self.client_capabilities_raw).unwrap_or(Value::Null))
    }

    fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }

    async fn downstream_token(&self, name: &str) -> Result<DownstreamToken, ToolError> {
        let r = self.downstream_who().token(self, name).await;
        self.note_elicitation(r)
    }

    async fn downstream_send(&self, name: &str, request: DownstreamRequest) -> Result<DownstreamResponse, ToolError> {
        let r = self.downstream_who().send(self, name, request).await;
        self.note_elicitation(r)
    }
}

fn parse_answer(answer: &str) -> Result<Value, ToolError> {
    let v: Value = serde_json::from_str(answer)
        .map_err(|_| ToolError::ClientError { code: -32700, message: "unparsable response".into() })?;
    if let Some(r) = v.get("result") {
        return Ok(r.clone());
    }
    let e = v.get("error");
    Err(ToolError::ClientError {
        code: e.and_then(|e| e.get("code")).and_then(Value::as_i64).unwrap_or(-32603),
        message: e
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .unwrap_or("error")
            .chars()
            .take(200)
            .collect(),
    })
}

/// What the session sink watches while its call runs (see [`CallSink::watch`]).
pub(crate) struct SessionWatch {
    /// Stops the lease renewer when the call ends (the watch is dropped with the drive loop).
    _done: tokio_util::sync::DropGuard,
    /// After `--cancel-watch-after`, the call subscribes to its session's doorbell to hear cancellations.
    watch_after: std::pin::Pin<Box<tokio::time::Sleep>>,
    sub: Option<Box<dyn Subscription>>,
    /// Look for a cancellation marker this many more times (after a lag, rings may have been lost).
    lag_checks: u8,
    recheck: tokio::time::Interval,
    /// A fallback for rings lost in a long store outage: a subscribed call looks for a marker once a lease.
    cancel_poll: tokio::time::Interval,
    my_id: String,
}

/// The session generation's sink: the answer is a JSON response or, once the call streams, its stream's final
/// event in the session's log; a cancellation (on any replica), a deleted session or a lost lease stops the call.
#[async_trait]
impl CallSink for Exchange {
    const GENERATION: &'static str = crate::call::SESSION_GENERATION;
    type Error = (i64, String);
    type Watch = SessionWatch;

    fn identity(&self) -> Identity<'_> {
        Identity { app: &self.app, principal: &self.principal, trace_id: &self.trace_id, span: &self.span }
    }

    async fn run(self: Arc<Self>, tool: String, args: JsonObject) -> (Result<Value, (i64, String)>, bool) {
        crate::mcp::call_tool(&self.app, &tool, args, &*self, &self.trace_id).await
    }

    fn settle(&self, ran: Ran<(i64, String)>) -> (Finished, CallEnd) {
        match ran {
            Ran::Here(r) => {
                let end = outcome_of(&r);
                (Finished::Answer(r), end)
            }
            Ran::Replayed(v) => (Finished::Answer(Ok(v)), CallEnd::Replayed),
        }
    }

    async fn deliver(&self, finished: Finished) {
        let msg = match finished {
            Finished::Answer(Err((code, message))) if code == crate::code::URL_ELICITATION_REQUIRED => {
                let data = self.elicitation.get().map(crate::downstream::elicitation_data);
                let e = crate::jsonrpc::error_object(code, &message, data);
                crate::jsonrpc::error(Some(&self.request_id), e)
            }
            Finished::Answer(r) => self.response(r),
            Finished::Refused(e) => crate::jsonrpc::error(Some(&self.request_id), e.rpc_error(false)),
        };
        self.finish(msg).await;
    }

    async fn go_streaming(&self) {
        if let Err(e) = self.ensure_streaming().await {
            tracing::debug!(error = %e, "could not switch a slow call to SSE");
        }
    }

    fn watcher(&self) -> SessionWatch {
        let cfg = &self.app.config;
        let mut recheck = tokio::time::interval(Duration::from_secs(1));
        // Spread the checks after a lag out in time (the subscriber may still be resubscribing), never in a burst.
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        SessionWatch {
            _done: self.done.clone().drop_guard(),
            watch_after: Box::pin(tokio::time::sleep(cfg.cancel_watch_after)),
            sub: None,
            lag_checks: 0,
            recheck,
            cancel_poll: tokio::time::interval_at(tokio::time::Instant::now() + cfg.lease_ttl, cfg.lease_ttl),
            my_id: self.request_id.to_string(),
        }
    }

    async fn watch(&self, w: &mut SessionWatch) -> Interrupt {
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => return Interrupt::Stop(CallEnd::Cancelled),
                () = self.lost.cancelled() => return Interrupt::Stop(CallEnd::SessionGone),
                () = &mut w.watch_after, if w.sub.is_none() => match self.app.store.subscribe(&self.key).await {
                    Ok(sub) => {
                        w.sub = Some(sub);
                        // A cancellation that arrived before the subscription left a marker.
                        w.lag_checks = 1;
                        w.recheck.reset_immediately();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch for cancellation");
                        w.watch_after.as_mut().reset(tokio::time::Instant::now() + self.app.config.lease_ttl);
                    }
                },
                ring = recv(&mut w.sub) => match ring {
                    Some(Ring::Cancel(id)) if id == w.my_id => self.cancel.cancel(),
                    Some(Ring::Closed) | None => return Interrupt::Stop(CallEnd::SessionGone),
                    // Rings may have been lost while the subscriber reconnected, and it may not be resubscribed
                    // yet: look for a cancellation marker now and twice more.
                    Some(Ring::Lagged) => {
                        w.lag_checks = 3;
                        w.recheck.reset();
                    }
                    Some(_) => {}
                },
                _ = w.cancel_poll.tick(), if w.sub.is_some() => w.lag_checks = w.lag_checks.max(1),
                _ = w.recheck.tick(), if w.lag_checks > 0 => {
                    w.lag_checks -= 1;
                    if self.app.store.is_cancelled(&self.key, &w.my_id).await.unwrap_or(false) {
                        self.cancel.cancel();
                    }
                }
            }
        }
    }

    async fn stopped(&self, end: CallEnd) {
        if end == CallEnd::Cancelled {
            self.finish_cancelled().await;
        } else {
            self.session_gone().await;
        }
    }
}
