//! The one drive loop of a `tools/call`, whatever carries its answer. Its checks before it runs are `preflight.rs`;
//! the call's audit record (how it ended, the generations' names, its metrics and audit event) is `audit.rs`.
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

mod audit;
mod preflight;

use audit::{Audit, Ending, args_digest, record_call};
pub(crate) use audit::{CallEnd, SESSION_GENERATION, STATELESS_GENERATION, outcome_of};
pub(crate) use preflight::{Cleared, Early, Front};

use crate::idempotency::{self, Idempotent, Ran};
use crate::{AppState, Principal, TransportError};
use async_trait::async_trait;
use mcpfleet_tools::JsonObject;
use serde_json::Value;
use std::sync::Arc;

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
    let record = |outcome: CallEnd, result: Option<&Value>, rpc_code: Option<i64>| {
        record_call(&app, who.principal, Some(who.span), trace_id, &audit, Ending { outcome, result, rpc_code });
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
                let (result, rpc_code) = match &finished {
                    Finished::Answer(Ok(v)) => (Some(v), None),
                    Finished::Answer(Err((c, _))) => (None, Some(*c)),
                    Finished::Refused(e) => (None, Some(e.rpc_code())),
                };
                record(end, result, rpc_code);
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
                record(CallEnd::TimedOut, Some(&stopped), None);
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
                    record(end, None, None);
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
