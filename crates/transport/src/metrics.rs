//! The transport's metrics, in the `mcp_` namespace. Every label value comes from a fixed set (methods this server
//! knows, tools the catalog has, outcomes, statuses): never a session id, a principal or a raw client string.
//! Documented in docs/METRICS.md.

use mcpfleet_core::ProtocolVersion;
use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use std::ops::Deref;
use std::sync::Arc;

/// Buckets for tool calls, after the OTel MCP semantic conventions' advice for `mcp.server.operation.duration`
/// (seconds): fine below 100 ms for p50, up to 300 s for long tools' p99.
pub const TOOL_BUCKETS: [f64; 16] =
    [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Buckets for sessions (seconds): from a one-call session to a working day.
pub const SESSION_BUCKETS: [f64; 12] =
    [1.0, 5.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0];
/// Buckets for request handling (seconds).
pub const REQUEST_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// JSON-RPC methods that get their own label value; anything else is `other`.
const KNOWN_METHODS: [&str; 26] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
    "response",
    "server/discover",
    "subscriptions/listen",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "skills/list",
    "skills/get",
    "resources/directory/read",
];

/// The HTTP methods that label a request no JSON-RPC method was parsed for.
const HTTP_METHODS: [&str; 3] = ["GET", "DELETE", "POST"];

/// The `(method, status)` pairs of `mcp_requests_total` that a healthy fleet sees, exported at 0 from the start.
/// The status is open-ended: the other pairs appear with their first request.
const HEALTHY_REQUESTS: [(&str, &str); 9] = [
    ("initialize", "200"),
    ("notifications/initialized", "202"),
    ("ping", "200"),
    ("tools/list", "200"),
    ("tools/call", "200"),
    ("server/discover", "200"),
    ("tasks/get", "200"),
    ("GET", "200"),
    ("DELETE", "200"),
];

/// The outcomes of `mcp_tool_calls_total`, in the order its help text lists them.
const TOOL_OUTCOMES: [&str; 14] = [
    "ok",
    "is_error",
    "protocol_error",
    "refused",
    "refused_by_policy",
    "refused_by_limit",
    "invalid_arguments",
    "cancelled",
    "session_gone",
    "panicked",
    "timeout",
    "input_required",
    "replayed",
    "handed_over",
];

/// The `tool` label of a `tools/call` naming a tool the catalog does not have (counted as `protocol_error`).
pub(crate) const UNKNOWN_TOOL: &str = "unknown";

/// The kinds of `mcp_sse_streams_open`.
const STREAM_KINDS: [&str; 3] = ["call", "listen", "subscription"];

/// The reasons of `mcp_auth_refusals_total`.
const AUTH_REFUSALS: [&str; 7] = [
    "missing_token",
    "invalid_request",
    "invalid_token",
    "invalid_dpop_proof",
    "replayed_dpop_proof",
    "insufficient_scope",
    "keys_unavailable",
];

/// The reasons of `mcp_request_state_refusals_total`.
const REQUEST_STATE_REFUSALS: [&str; 6] =
    ["malformed", "unknown_key", "bad_signature", "expired", "wrong_principal", "wrong_request"];

/// The bounded label value for a JSON-RPC method.
#[must_use]
pub fn method_label(method: &str) -> &'static str {
    KNOWN_METHODS.iter().find(|m| **m == method).copied().unwrap_or("other")
}

/// An MCP operation under way, carried in its span's context (`trace::mcp_span`): what
/// `mcp_server_operation_duration_seconds` labels it with when its span ends, and since when.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operation {
    pub(crate) method: &'static str,
    pub(crate) version: &'static str,
    pub(crate) started: std::time::Instant,
}

/// The transport's metrics. Cheap to clone.
///
/// Every request clones the state that holds it, so its handles live behind one `Arc`: a clone is one atomic
/// increment, not one per metric.
#[derive(Clone, Debug)]
pub struct TransportMetrics(Arc<Handles>);

/// The metric handles of [`TransportMetrics`] (each crate-private; read through its `Deref`).
#[derive(Debug)]
pub struct Handles {
    pub(crate) requests: IntCounterVec,
    pub(crate) request_duration: HistogramVec,
    pub(crate) tool_calls: IntCounterVec,
    pub(crate) tool_duration: HistogramVec,
    pub(crate) sse_open: IntGaugeVec,
    pub(crate) calls_in_flight: IntGauge,
    pub(crate) sessions_created: IntCounter,
    pub(crate) sessions_deleted: IntCounter,
    pub(crate) auth_refusals: IntCounterVec,
    pub(crate) idempotent_replays: IntCounter,
    pub(crate) request_state_refusals: IntCounterVec,
    pub(crate) events_dropped: IntCounter,
    /// OpenTelemetry's `mcp.server.operation.duration` and `mcp.server.session.duration`, as Prometheus histograms.
    operation_duration: HistogramVec,
    session_duration: HistogramVec,
    ready: IntGauge,
}

impl Deref for TransportMetrics {
    type Target = Handles;

    fn deref(&self) -> &Handles {
        &self.0
    }
}

impl TransportMetrics {
    /// Creates the metrics and registers them with `registry`. Every series of a known label set is exported from
    /// the start, at 0 (the tools' ones once [`seed_tools`](Self::seed_tools) has named them), so that a dashboard
    /// or an alert never sees "no data" before the first event.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Handles {
            requests: IntCounterVec::new(
                Opts::new(
                    "mcp_requests_total",
                    "HTTP requests to /mcp, by JSON-RPC method (GET, DELETE or POST when none was parsed) and HTTP status.",
                ),
                &["method", "status"],
            )?,
            request_duration: HistogramVec::new(
                HistogramOpts::new(
                    "mcp_request_duration_seconds",
                    "Time from the request to the response head, by method. For an SSE response that is the time to the stream's start.",
                )
                .buckets(REQUEST_BUCKETS.to_vec()),
                &["method"],
            )?,
            tool_calls: IntCounterVec::new(
                Opts::new(
                    "mcp_tool_calls_total",
                    format!("tools/call requests by tool and outcome: {}.", TOOL_OUTCOMES.join(", ")),
                ),
                &["tool", "outcome"],
            )?,
            tool_duration: HistogramVec::new(
                HistogramOpts::new(
                    "mcp_tool_call_duration_seconds",
                    "Duration of a tool call from its start to its result, by tool (calls that ran).",
                )
                .buckets(TOOL_BUCKETS.to_vec()),
                &["tool"],
            )?,
            sse_open: IntGaugeVec::new(
                Opts::new(
                    "mcp_sse_streams_open",
                    "SSE responses open on this replica, by kind: call, listen (2025 GET streams) or subscription (2026 subscriptions/listen).",
                ),
                &["kind"],
            )?,
            calls_in_flight: IntGauge::new(
                "mcp_tool_calls_in_flight",
                "Tool calls running on this replica now, of every generation, whether their client still listens or not, calls run as tasks included: the per-pod load signal for an autoscaler.",
            )?,
            sessions_created: IntCounter::new("mcp_sessions_created_total", "Sessions created by initialize.")?,
            sessions_deleted: IntCounter::new(
                "mcp_sessions_deleted_total",
                "Sessions ended by DELETE (expiry happens in the store and is not counted).",
            )?,
            auth_refusals: IntCounterVec::new(
                Opts::new(
                    "mcp_auth_refusals_total",
                    format!(
                        "Requests refused by authentication or authorization, by reason: {}.",
                        AUTH_REFUSALS.join(", ")
                    ),
                ),
                &["reason"],
            )?,
            idempotent_replays: IntCounter::new(
                "mcp_idempotent_replays_total",
                "tools/call requests answered with the stored result of an earlier call with the same idempotency key (the tool did not run).",
            )?,
            request_state_refusals: IntCounterVec::new(
                Opts::new(
                    "mcp_request_state_refusals_total",
                    format!(
                        "2026-07-28 retries refused because their requestState did not verify, by reason: {}.",
                        REQUEST_STATE_REFUSALS.join(", ")
                    ),
                ),
                &["reason"],
            )?,
            events_dropped: IntCounter::new(
                "mcp_sse_events_dropped_total",
                "Intermediate SSE events (progress, log messages, server→client requests) dropped because the store could not commit them within 10 s. An event is never sent without its committed id; alert on any increase.",
            )?,
            operation_duration: HistogramVec::new(
                HistogramOpts::new(
                    "mcp_server_operation_duration_seconds",
                    "OpenTelemetry's mcp.server.operation.duration: each MCP request from its arrival to the end of its answer (a tools/call to its call's end, over any stream), by method, tool (tools/call that started), error_type (the JSON-RPC code, tool_error, or the refusal) and protocol_version.",
                )
                .buckets(TOOL_BUCKETS.to_vec()),
                &["method", "tool", "error_type", "protocol_version"],
            )?,
            session_duration: HistogramVec::new(
                HistogramOpts::new(
                    "mcp_server_session_duration_seconds",
                    "OpenTelemetry's mcp.server.session.duration: 2025-generation sessions from initialize to the DELETE that ended them, by protocol_version (sessions that expire are not observed).",
                )
                .buckets(SESSION_BUCKETS.to_vec()),
                &["protocol_version"],
            )?,
            ready: IntGauge::new(
                "mcp_ready",
                "1 when this replica's last /readyz answer was ready; 0 until the first one is, after one that was not, and from the start of the drain.",
            )?,
        };
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.request_duration.clone()))?;
        registry.register(Box::new(m.tool_calls.clone()))?;
        registry.register(Box::new(m.tool_duration.clone()))?;
        registry.register(Box::new(m.sse_open.clone()))?;
        registry.register(Box::new(m.calls_in_flight.clone()))?;
        registry.register(Box::new(m.sessions_created.clone()))?;
        registry.register(Box::new(m.sessions_deleted.clone()))?;
        registry.register(Box::new(m.auth_refusals.clone()))?;
        registry.register(Box::new(m.idempotent_replays.clone()))?;
        registry.register(Box::new(m.request_state_refusals.clone()))?;
        registry.register(Box::new(m.events_dropped.clone()))?;
        registry.register(Box::new(m.operation_duration.clone()))?;
        registry.register(Box::new(m.session_duration.clone()))?;
        registry.register(Box::new(m.ready.clone()))?;
        let m = Self(Arc::new(m));
        m.seed();
        Ok(m)
    }

    /// Creates every series of a known label set but the tools' ones, at 0.
    fn seed(&self) {
        for method in KNOWN_METHODS.iter().chain(&HTTP_METHODS) {
            self.request_duration.with_label_values(&[*method]);
        }
        for (method, status) in HEALTHY_REQUESTS {
            self.requests.with_label_values(&[method, status]);
        }
        self.tool_calls.with_label_values(&[UNKNOWN_TOOL, "protocol_error"]);
        for kind in STREAM_KINDS {
            self.sse_open.with_label_values(&[kind]);
        }
        for reason in AUTH_REFUSALS {
            self.auth_refusals.with_label_values(&[reason]);
        }
        for reason in REQUEST_STATE_REFUSALS {
            self.request_state_refusals.with_label_values(&[reason]);
        }
        for v in ProtocolVersion::NEWEST_FIRST {
            self.operation_duration.with_label_values(&["tools/call", "", "", v.as_str()]);
            if !v.is_stateless() {
                self.session_duration.with_label_values(&[v.as_str()]);
            }
        }
    }

    /// One MCP operation ended (its span did): `tool` for a `tools/call` that started (else empty), `error` its
    /// error type.
    pub(crate) fn observe_operation(&self, op: &Operation, tool: &str, error: Option<&str>) {
        let labels = [op.method, tool, error.unwrap_or(""), op.version];
        self.operation_duration.with_label_values(&labels).observe(op.started.elapsed().as_secs_f64());
    }

    /// A session ended by DELETE after `lasted`.
    pub(crate) fn observe_session(&self, ended: &mcpfleet_state::EndedSession, lasted: std::time::Duration) {
        let v = ProtocolVersion::parse(&ended.protocol_version).map_or("", ProtocolVersion::as_str);
        self.session_duration.with_label_values(&[v]).observe(lasted.as_secs_f64());
    }

    /// Exports the series of the catalog's tools at 0: `mcp_tool_calls_total` for every outcome and
    /// `mcp_tool_call_duration_seconds`. The server calls it once, with the names of its `tools/list`; a tool it
    /// did not name gets its series with its first call.
    pub fn seed_tools<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for tool in names {
            for outcome in TOOL_OUTCOMES {
                self.tool_calls.with_label_values(&[tool, outcome]);
            }
            self.tool_duration.with_label_values(&[tool]);
        }
    }

    /// `mcp_ready`, for the admin listener: `/readyz` sets it on every answer, the drain sets it to 0 as it begins.
    #[must_use]
    pub fn ready_gauge(&self) -> IntGauge {
        self.ready.clone()
    }

    /// An open SSE stream, counted until the guard drops.
    pub(crate) fn stream_guard(&self, kind: &'static str) -> GaugeGuard {
        GaugeGuard::new(self.sse_open.with_label_values(&[kind]))
    }

    /// Counts a tool call in `mcp_tool_calls_in_flight` until the guard drops.
    pub(crate) fn call_guard(&self) -> GaugeGuard {
        GaugeGuard::new(self.calls_in_flight.clone())
    }
}

/// One unit of a gauge (`mcp_sse_streams_open`, `mcp_tool_calls_in_flight`), given back when the guard drops.
#[derive(Debug)]
pub(crate) struct GaugeGuard(IntGauge);

impl GaugeGuard {
    fn new(g: IntGauge) -> Self {
        g.inc();
        Self(g)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exported(registry: &Registry) -> String {
        prometheus::TextEncoder::new().encode_to_string(&registry.gather()).expect("encode")
    }

    #[test]
    fn every_known_series_is_exported_at_zero_from_the_start() {
        let registry = Registry::new();
        let m = TransportMetrics::register(&registry).expect("register");
        m.seed_tools(["echo", "add"]);
        let text = exported(&registry);
        for line in [
            r#"mcp_tool_calls_total{outcome="handed_over",tool="echo"} 0"#,
            r#"mcp_tool_calls_total{outcome="ok",tool="add"} 0"#,
            r#"mcp_tool_calls_total{outcome="protocol_error",tool="unknown"} 0"#,
            r#"mcp_tool_call_duration_seconds_count{tool="echo"} 0"#,
            r#"mcp_request_duration_seconds_count{method="tasks/cancel"} 0"#,
            r#"mcp_request_duration_seconds_count{method="POST"} 0"#,
            r#"mcp_requests_total{method="tools/call",status="200"} 0"#,
            r#"mcp_sse_streams_open{kind="subscription"} 0"#,
            r#"mcp_auth_refusals_total{reason="keys_unavailable"} 0"#,
            r#"mcp_auth_refusals_total{reason="replayed_dpop_proof"} 0"#,
            r#"mcp_request_state_refusals_total{reason="wrong_request"} 0"#,
            "mcp_ready 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        let calls = text.lines().filter(|l| l.starts_with("mcp_tool_calls_total{")).count();
        assert_eq!(calls, 2 * TOOL_OUTCOMES.len() + 1, "every outcome of every tool, and the unknown tool's");
    }
}
