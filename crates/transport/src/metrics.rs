//! The transport's metrics, in the `mcp_` namespace. Every label value comes from a fixed set (methods this server
//! knows, tools the catalog has, outcomes, statuses): never a session id, a principal or a raw client string.
//! Documented in docs/METRICS.md.

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Buckets for tool calls, after the OTel MCP semantic conventions' advice for `mcp.server.operation.duration`
/// (seconds): fine below 100 ms for p50, up to 300 s for long tools' p99.
pub const TOOL_BUCKETS: [f64; 14] = [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 300.0];
/// Buckets for request handling (seconds).
pub const REQUEST_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// JSON-RPC methods that get their own label value; anything else is `other`.
const KNOWN_METHODS: [&str; 23] = [
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
];

/// The bounded label value for a JSON-RPC method.
#[must_use]
pub fn method_label(method: &str) -> &'static str {
    KNOWN_METHODS.iter().find(|m| **m == method).copied().unwrap_or("other")
}

/// The transport's metrics. Cheap to clone.
#[derive(Clone, Debug)]
pub struct TransportMetrics {
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
}

impl TransportMetrics {
    /// Creates the metrics and registers them with `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
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
                    "tools/call requests by tool and outcome: ok, is_error, protocol_error, refused, refused_by_limit, invalid_arguments, cancelled, session_gone, panicked, timeout, input_required, replayed, handed_over.",
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
                    "Requests refused by authentication or authorization, by reason: missing_token, invalid_request, invalid_token, insufficient_scope, keys_unavailable.",
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
                    "2026-07-28 retries refused because their requestState did not verify, by reason: malformed, unknown_key, bad_signature, expired, wrong_principal, wrong_request.",
                ),
                &["reason"],
            )?,
            events_dropped: IntCounter::new(
                "mcp_sse_events_dropped_total",
                "Intermediate SSE events (progress, log messages, server→client requests) dropped because the store could not commit them within 10 s. An event is never sent without its committed id; alert on any increase.",
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
        Ok(m)
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
