//! The one drive loop of a `tools/call`, whatever carries its answer, and the call's audit record.
//!
//! Both front ends run a call the same way: the tool in a task of its own (a panic becomes an `isError` result
//! with the trace id, an abort stops it), under its idempotency key if it has one, against its timeout, switching
//! a silent call to SSE after `--sse-after`, and watching for what stops it early. What differs is where the
//! answer goes and what can stop it: that is a [`CallSink`]. The session generation's sink is `Exchange`
//! (`session/exchange.rs`: the event log, resumption, the doorbell), the stateless generation's is `Call`
//! (`stateless/call.rs`: one response, input requests, a client that closes its stream, and the task it may become
//! after a delay), and a queued task's run on a worker is `tasks::run::TaskRun` (its answer goes into the durable
//! task record; a cancellation asked on any replica or a hand-off stops it).
//!
//! It must not know HTTP: a sink turns the call's end into whatever its generation sends.

mod preflight;

pub(crate) use preflight::{Cleared, Early, Front};

use crate::idempotency::{self, Idempotent, Ran};
use crate::{AppState, Principal, TransportError};
use async_trait::async_trait;
use mcpfleet_tools::JsonObject;
use serde_json::Value;
use std::sync::Arc;

/// The session generation's name in the audit trail (the `GENERATION` of its front end and its sink).
pub(crate) const SESSION_GENERATION: &str = "2025";
/// The stateless generation's name in the audit trail (the `GENERATION` of its front end, its sink, and the sink
/// of a queued task's run).
pub(crate) const STATELESS_GENERATION: &str = "2026";

/// What a call delivers when it ends on its own (or at its timeout).
pub(crate) enum Finished {
    /// The answer to the request: a result (an `isError` one included) or a JSON-RPC error.
    Answer(Result<Value, (i64, String)>),
    /// The request as a whole is refused (a protocol error of the front end, e.g. a refused `requestState`).
    Refused(TransportError),
}

/// What a sink's watch saw.
pub(crate) enum Interrupt {
    /// Stop the tool: the call ends this way.
    Stop(CallEnd),
    /// Nobody is left to answer, but the call runs to its end (a keyed call whose result its re-issue will get).
    Detach,
}

/// Where a call's answer goes, and what can stop it early.
#[async_trait]
pub(crate) trait CallSink: Send + Sync + Sized + 'static {
    /// The protocol generation of its calls, in their audit rows: [`SESSION_GENERATION`] or [`STATELESS_GENERATION`].
    const GENERATION: &'static str;
    /// What a run of the tool may end with besides a result.
    type Error: From<(i64, String)> + Send + 'static;
    /// The watch's state, kept across the loop's turns (timers, a subscription).
    type Watch: Send;

    /// Whose call it is, and where it is traced.
    fn identity(&self) -> Identity<'_>;
    /// Runs the tool (inside the call's task): its outcome, and whether that outcome is the tool's own (kept under
    /// an idempotency key) rather than a transient failure (released).
    async fn run(self: Arc<Self>, tool: String, args: JsonObject) -> (Result<Value, Self::Error>, bool);
    /// What the task ended with, as delivered, and how the call ended.
    fn settle(&self, ran: Ran<Self::Error>) -> (Finished, CallEnd);
    /// Sends the call's answer.
    async fn deliver(&self, finished: Finished);
    /// A silent call, still running after `--sse-after`, switches to SSE (keep-alives; resumable where the
    /// generation allows).
    async fn go_streaming(&self);
    fn watcher(&self) -> Self::Watch;
    /// Waits for what stops the call early. Cancel-safe: the loop drops it whenever another arm wins.
    async fn watch(&self, w: &mut Self::Watch) -> Interrupt;
    /// The tool was stopped by [`Interrupt::Stop`]: tell whoever is left.
    async fn stopped(&self, end: CallEnd);
    /// A call still running after this long becomes a durable task (tasks extension), if the sink can make one.
    fn task_after(&self) -> Option<std::time::Duration> {
        None
    }
    /// Makes the still-running call a task: its handle answers the request, and the call's end goes into the
    /// task from now on.
    async fn become_task(&self) {}
}

/// Whose call a sink carries, and where it is traced.
pub(crate) struct Identity<'a> {
    pub(crate) app: &'a AppState,
    pub(crate) principal: &'a Principal,
    /// The request's trace id, in the audit event and in `isError` results.
    pub(crate) trace_id: &'a str,
    /// The call's MCP span, ended by the audit record.
    pub(crate) span: &'a opentelemetry::Context,
}

/// An admitted call, ready to run.
pub(crate) struct Admitted {
    pub(crate) name: String,
    pub(crate) args: JsonObject,
    /// The in-flight slot: held until the call ends.
    pub(crate) slot: Option<mcpfleet_limits::SlotGuard>,
    /// Whether admission took a unit of the tool's quota (given back when the tool does not run to its end).
    pub(crate) quota_charged: bool,
    pub(crate) idem: Option<Idempotent>,
}

/// The drive loop: runs `call` to its end and hands the end to `sink`.
pub(crate) async fn drive<S: CallSink>(sink: Arc<S>, call: Admitted) {
    let Admitted { name, args, slot: _slot, quota_charged, idem } = call;
    let who = sink.identity();
    let (app, trace_id) = (who.app.clone(), who.trace_id);
    let _in_flight = app.metrics.call_guard();
    let cfg = app.config.clone();
    let audit = Audit {
        tool: name.clone(),
        args_sha256: args_digest(&args),
        started: std::time::Instant::now(),
        generation: S::GENERATION,
    };
    let record = |end: CallEnd, result: Option<&Value>| {
        record_call(&app, who.principal, Some(who.span), trace_id, &audit, end, result);
    };
    // The tool's own timeout, else the operator's (--tool-timeout).
    let timeout = app.catalog.tool_timeout(&name).unwrap_or(cfg.tool_timeout);
    // The tool runs in a task of its own: the arms below may wait on the store (and on a lock the tool holds while
    // it commits an event) without starving it, a panic becomes an answer instead of a hung request, and
    // stopping it is an abort.
    let (me, held, tool) = (sink.clone(), idem.clone(), name.clone());
    let mut task = tokio::spawn(async move {
        let app = me.identity().app.clone();
        idempotency::run(&app, held.as_ref(), timeout, me.run(tool, args)).await
    });
    let sse_after = tokio::time::sleep(cfg.sse_after);
    tokio::pin!(sse_after);
    let task_after = sink.task_after();
    let to_task = tokio::time::sleep(task_after.unwrap_or(timeout));
    tokio::pin!(to_task);
    let mut converted = task_after.is_none();
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let (mut upgraded, mut detached) = (false, false);
    let mut watch = sink.watcher();
    loop {
        tokio::select! {
            r = &mut task => {
                let (finished, end) = match r {
                    Ok(ran) => sink.settle(ran),
                    Err(e) => {
                        // A panic (or an abort we did not ask for): the model learns only that it failed.
                        tracing::error!(error = %e, trace_id = %trace_id, "tool task panicked");
                        (Finished::Answer(Ok(crate::mcp::tool_failure(trace_id))), CallEnd::Panicked)
                    }
                };
                record(end, match &finished {
                    Finished::Answer(Ok(v)) => Some(v),
                    _ => None,
                });
                let refused = matches!(&finished, Finished::Answer(Err((c, _))) if *c == crate::code::INVALID_PARAMS);
                if quota_charged && (refused || matches!(end, CallEnd::Replayed | CallEnd::InputRequired)) {
                    // The tool did not run to its end (arguments it refused, a replayed result, a round that asks
                    // for input): the unit goes back, before the client hears of it (and can call again).
                    app.limits.refund(&who.principal.user, &name).await;
                }
                if !detached {
                    sink.deliver(finished).await;
                }
                return;
            }
            () = &mut deadline => {
                let stopped = crate::mcp::timed_out(timeout, trace_id);
                // A keyed call keeps "did not finish" for its re-issues (its side effect may be half done).
                idempotency::settle_stopped(&app, idem.as_ref(), &stopped).await;
                task.abort();
                tracing::warn!(tool.name = %name, trace_id = %trace_id, timeout_ms = timeout.as_millis(), "tool timed out");
                record(CallEnd::TimedOut, Some(&stopped));
                if !detached {
                    sink.deliver(Finished::Answer(Ok(stopped))).await;
                }
                return;
            }
            interrupt = sink.watch(&mut watch), if !detached => match interrupt {
                Interrupt::Detach => {
                    detached = true;
                    tracing::info!(tool.name = %name, trace_id = %trace_id, "client gone; the keyed call finishes for its re-issue");
                }
                Interrupt::Stop(end) => {
                    task.abort();
                    record(end, None);
                    sink.stopped(end).await;
                    return;
                }
            },
            () = &mut sse_after, if !upgraded => {
                upgraded = true;
                sink.go_streaming().await;
            }
            () = &mut to_task, if !converted => {
                converted = true;
                if !task.is_finished() {
                    sink.become_task().await;
                }
            }
        }
    }
}

/// Counts a call in `mcp_tool_calls_total` and (if it ran) `mcp_tool_call_duration_seconds`, ends its span (when the
/// call owns it), and
/// writes its audit event: tool, principal hash, outcome, duration, trace id, and a hash of the arguments (never
/// the arguments), to the log and, when there is one, to the audit trail (with the result's size).
pub(crate) fn record_call(
    app: &AppState,
    principal: &Principal,
    span: Option<&opentelemetry::Context>,
    trace_id: &str,
    audit: &Audit,
    outcome: CallEnd,
    result: Option<&Value>,
) {
    let took = audit.started.elapsed();
    let tool = if outcome == CallEnd::UnknownTool { crate::metrics::UNKNOWN_TOOL } else { audit.tool.as_str() };
    let error_type = match outcome {
        CallEnd::Ok => None,
        CallEnd::IsError => Some("tool_error"),
        other => Some(other.label()),
    };
    if let Some(span) = span {
        crate::trace::end(span, error_type, &[]);
    }
    let m = &app.metrics;
    m.tool_calls.with_label_values(&[tool, outcome.label()]).inc();
    if outcome.ran() {
        m.tool_duration.with_label_values(&[tool]).observe(took.as_secs_f64());
    }
    tracing::info!(
        target: "mcpfleet::audit",
        outcome = outcome.label(),
        tool.name = crate::mcp::prefix(&audit.tool, 64),
        principal = principal.user.as_str(),
        duration_ms = took.as_secs_f64() * 1e3,
        trace_id = trace_id,
        args.sha256 = audit.args_sha256.as_str(),
        "tools/call"
    );
    if let Some(sink) = &app.audit {
        sink.record(mcpfleet_core::AuditRecord {
            at: std::time::SystemTime::now(),
            tool: crate::mcp::truncate(tool, 64),
            outcome: outcome.label(),
            principal: principal.user.as_str().to_owned(),
            client_id: principal.client_id.as_deref().map(|c| crate::mcp::truncate(c, 200)),
            duration: took,
            trace_id: trace_id.to_owned(),
            args_sha256: audit.args_sha256.clone(),
            result_bytes: result.map(json_len),
            generation: audit.generation,
        });
    }
}

/// The size of `v` as serialized, without building the string.
fn json_len(v: &Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// A call refused before it started (by its scopes or a limit): counted and audited like one that ran.
pub(crate) struct RefusedCall<'a> {
    pub(crate) app: &'a AppState,
    pub(crate) principal: &'a Principal,
    pub(crate) tool: &'a str,
    pub(crate) args: &'a JsonObject,
    pub(crate) trace_id: &'a str,
    pub(crate) end: CallEnd,
    pub(crate) generation: &'static str,
}

impl RefusedCall<'_> {
    pub(crate) fn record(self) {
        let audit = Audit {
            tool: crate::mcp::truncate(self.tool, 64),
            args_sha256: args_digest(self.args),
            started: std::time::Instant::now(),
            generation: self.generation,
        };
        // The request's span guard ends the span, with the refusal's status.
        record_call(self.app, self.principal, None, self.trace_id, &audit, self.end, None);
    }
}

/// What the audit event of a call needs from its start.
pub(crate) struct Audit {
    pub(crate) tool: String,
    pub(crate) args_sha256: String,
    pub(crate) started: std::time::Instant,
    pub(crate) generation: &'static str,
}

/// SHA-256 of the arguments as received (serialized), hex: equal arguments give equal hashes, and nothing of the
/// arguments can be read back.
pub(crate) fn args_digest(args: &JsonObject) -> String {
    use sha2::Digest as _;
    let bytes = serde_json::to_vec(args).unwrap_or_default();
    mcpfleet_core::hex(&sha2::Sha256::digest(&bytes))
}

/// How a call ended, for the metrics and the audit event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallEnd {
    Ok,
    IsError,
    ProtocolError,
    UnknownTool,
    Cancelled,
    SessionGone,
    /// The caller lacks the tool's scopes (403).
    Refused,
    /// A limit refused it: the rate limit or the in-flight cap (429), or the tool's quota (`isError`).
    RefusedByLimit,
    /// Its arguments do not match the tool's input schema (`isError`): the tool did not run.
    InvalidArguments,
    /// The tool panicked (`isError`, nothing of the panic).
    Panicked,
    /// The tool ran past its timeout and was stopped (`isError`).
    TimedOut,
    /// The tool ran and asked the client for input (2026-07-28 `InputRequiredResult`); a retry continues it.
    InputRequired,
    /// An earlier call with the same idempotency key had run: its result was returned, the tool did not run.
    Replayed,
    /// A task's run stopped here because the task moved on: handed back to the queue on shutdown, or taken over
    /// after this replica lost its lease.
    HandedOver,
}

impl CallEnd {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::IsError => "is_error",
            Self::ProtocolError | Self::UnknownTool => "protocol_error",
            Self::Cancelled => "cancelled",
            Self::SessionGone => "session_gone",
            Self::Refused => "refused",
            Self::RefusedByLimit => "refused_by_limit",
            Self::InvalidArguments => "invalid_arguments",
            Self::Panicked => "panicked",
            Self::TimedOut => "timeout",
            Self::InputRequired => "input_required",
            Self::Replayed => "replayed",
            Self::HandedOver => "handed_over",
        }
    }

    /// The tool ran (its duration is observed).
    fn ran(self) -> bool {
        !matches!(
            self,
            Self::UnknownTool | Self::Refused | Self::RefusedByLimit | Self::InvalidArguments | Self::Replayed
        )
    }
}

pub(crate) fn outcome_of(result: &Result<Value, (i64, String)>) -> CallEnd {
    match result {
        Ok(v) if v.get("isError").and_then(Value::as_bool) == Some(true) => CallEnd::IsError,
        Ok(_) => CallEnd::Ok,
        Err((code, msg)) if *code == crate::code::INVALID_PARAMS && msg.starts_with("unknown tool") => {
            CallEnd::UnknownTool
        }
        Err(_) => CallEnd::ProtocolError,
    }
}
