//! A call's audit record: how a call ended ([`CallEnd`]), the generations' names in the audit trail, and the one
//! place a call's end is accounted for ([`record_call`]: its metrics, its span, its audit event), for calls that
//! ran and for calls refused before they started ([`RefusedCall`]).

use crate::{AppState, Principal};
use mcpfleet_tools::JsonObject;
use serde_json::Value;

/// The session generation's name in the audit trail (the `GENERATION` of its front end and its sink).
pub(crate) const SESSION_GENERATION: &str = "2025";
/// The stateless generation's name in the audit trail (the `GENERATION` of its front end, its sink, and the sink
/// of a queued task's run).
pub(crate) const STATELESS_GENERATION: &str = "2026";

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
    ending: Ending<'_>,
) {
    let Ending { outcome, result, rpc_code } = ending;
    let took = audit.started.elapsed();
    let tool = if outcome == CallEnd::UnknownTool { crate::metrics::UNKNOWN_TOOL } else { audit.tool.as_str() };
    if let Some(span) = span {
        // The span's error type: a JSON-RPC error's code, `tool_error` for an `isError` result, else how it ended.
        let code = rpc_code.map(|c| c.to_string());
        let error_type = match outcome {
            CallEnd::Ok => None,
            CallEnd::IsError => Some("tool_error"),
            other => Some(code.as_deref().unwrap_or(other.label())),
        };
        crate::trace::end(span, error_type, &[]);
        if let Some(op) = crate::trace::operation(span) {
            app.metrics.observe_operation(&op, tool, error_type);
        }
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

/// How a call ended, for [`record_call`]: its outcome, its result (when it has one) and, for a JSON-RPC error, its
/// code.
pub(crate) struct Ending<'a> {
    pub(crate) outcome: CallEnd,
    pub(crate) result: Option<&'a Value>,
    pub(crate) rpc_code: Option<i64>,
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
        let ending = Ending { outcome: self.end, result: None, rpc_code: None };
        record_call(self.app, self.principal, None, self.trace_id, &audit, ending);
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
    /// The caller's plan refused it (docs/POLICY.md): the tool is not in the plan (403), or a condition on the
    /// call refused it after validation (`isError`).
    RefusedByPolicy,
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
            Self::RefusedByPolicy => "refused_by_policy",
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
            Self::UnknownTool
                | Self::Refused
                | Self::RefusedByLimit
                | Self::RefusedByPolicy
                | Self::InvalidArguments
                | Self::Replayed
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
