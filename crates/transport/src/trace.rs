//! OpenTelemetry spans, after the MCP semantic conventions. Each request gets an HTTP server span (`POST /mcp`,
//! parented to a W3C `traceparent` header) and an MCP span (`{mcp.method.name} {target}`, e.g. `tools/call
//! get_weather`) parented to the `traceparent` in `params._meta` when the request carries one, and to the HTTP span
//! otherwise. A `tools/call` span lives until the call ends, whichever replica the client reads it from.
//!
//! Across replicas: a server→client request records its call span's `traceparent` with the pending request in the
//! store; the replica that receives the client's answer starts its span as a child of it, so the answer joins the
//! waiting call's trace.
//!
//! The spans go to the global tracer provider the server installs (an OTLP exporter when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set; otherwise nothing is exported, but trace ids are still real).

use mcpfleet_tools::JsonObject;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue, global};
use serde_json::Value;

const TRACER: &str = "mcpfleet";

/// A `Context` whose remote parent is the `traceparent` value (`00-<32 hex trace id>-<16 hex span id>-<2 hex
/// flags>`), if it is valid W3C: lowercase hex, ids not all zero, version not `ff`, nothing after the flags in
/// version 00.
pub(crate) fn remote_parent(traceparent: &str) -> Option<Context> {
    let mut parts = traceparent.trim().split('-');
    let (ver, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !(hex(ver, 2) && ver != "ff" && hex(trace, 32) && hex(span, 16) && hex(flags, 2)) {
        return None;
    }
    if ver == "00" && parts.next().is_some() {
        return None;
    }
    let sc = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & 1),
        true,
        TraceState::default(),
    );
    // All-zero ids are invalid, and an invalid context is no parent.
    sc.is_valid().then(|| Context::new().with_remote_span_context(sc))
}

/// The parent named by `params._meta.traceparent` (MCP context propagation), if any.
pub(crate) fn meta_parent(params: &JsonObject) -> Option<Context> {
    params.get("_meta").and_then(|m| m.get("traceparent")).and_then(Value::as_str).and_then(remote_parent)
}

/// The `traceparent` of the span in `cx`.
pub(crate) fn traceparent_of(cx: &Context) -> Option<String> {
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8()))
}

/// The trace id of the span in `cx`, if it has a valid one.
pub(crate) fn trace_id_of(cx: &Context) -> Option<String> {
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// Starts the HTTP server span of a request.
pub(crate) fn http_span(method: &str, parent: &Context) -> Context {
    server_span(
        parent,
        || format!("{method} /mcp"),
        || {
            vec![
                KeyValue::new("http.request.method", method.to_owned()),
                KeyValue::new("http.route", "/mcp"),
                KeyValue::new("network.protocol.name", "http"),
            ]
        },
    )
}

/// Starts the MCP span of one JSON-RPC request: named `{method} {target}`, with the MCP semantic-convention
/// attributes. `session` is a short hash, never the session id.
pub(crate) fn mcp_span(
    parent: &Context,
    method: &str,
    target: Option<&str>,
    request_id: Option<&Value>,
    session: Option<&str>,
) -> Context {
    let name = || match target {
        Some(t) => format!("{method} {t}"),
        None => method.to_owned(),
    };
    server_span(parent, name, || {
        let mut attrs = vec![
            KeyValue::new("mcp.method.name", crate::metrics::method_label(method)),
            KeyValue::new("network.transport", "tcp"),
        ];
        if let Some(id) = request_id {
            attrs.push(KeyValue::new("jsonrpc.request.id", id.to_string()));
        }
        if let Some(s) = session {
            attrs.push(KeyValue::new("mcp.session.id", s.to_owned()));
        }
        if method == "tools/call"
            && let Some(t) = target
        {
            attrs.push(KeyValue::new("gen_ai.tool.name", t.to_owned()));
            attrs.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
        }
        attrs
    })
}

/// A server span under `parent`. Its name and attributes are built only if it records (an exporter is installed
/// and the sampler took it): without an exporter a span carries only its ids, and every request would build
/// strings for nobody (issue 19).
fn server_span(parent: &Context, name: impl FnOnce() -> String, attrs: impl FnOnce() -> Vec<KeyValue>) -> Context {
    let tracer = global::tracer(TRACER);
    let mut span = tracer.span_builder("").with_kind(SpanKind::Server).start_with_context(&tracer, parent);
    if span.is_recording() {
        span.update_name(name());
        span.set_attributes(attrs());
    }
    parent.with_span(span)
}

/// A span for a client's answer to a server→client request, in the trace of the call that waits for it (its
/// `traceparent` came from the store), linked to the HTTP span that carried it.
pub(crate) fn answer_span(waiter: &str, carrier: &Context) -> Option<Context> {
    let parent = remote_parent(waiter)?;
    let tracer = global::tracer(TRACER);
    let carrier_sc = carrier.span().span_context().clone();
    let mut builder = tracer.span_builder("deliver client response").with_kind(SpanKind::Server);
    if carrier_sc.is_valid() {
        builder = builder.with_links(vec![opentelemetry::trace::Link::with_context(carrier_sc)]);
    }
    let span = builder.start_with_context(&tracer, &parent);
    Some(parent.with_span(span))
}

/// Ends the span in `cx` with an error type, if any (`error.type`, and an error status).
pub(crate) fn end(cx: &Context, error_type: Option<&str>, extra: &[KeyValue]) {
    let span = cx.span();
    span.set_attributes(extra.iter().cloned());
    if let Some(e) = error_type {
        span.set_attribute(KeyValue::new("error.type", e.to_owned()));
        span.set_status(Status::error(e.to_owned()));
    }
    span.end();
}

/// Ends its span when dropped, with the error type recorded so far, unless the span was handed on (a
/// `tools/call` span belongs to its exchange once the call starts).
pub(crate) struct SpanGuard {
    cx: Option<Context>,
    pub(crate) error: Option<String>,
}

impl SpanGuard {
    pub(crate) fn new(cx: Option<Context>) -> Self {
        Self { cx, error: None }
    }

    pub(crate) fn context(&self) -> Option<&Context> {
        self.cx.as_ref()
    }

    /// Hands the span on: the guard no longer ends it.
    pub(crate) fn take(&mut self) -> Option<Context> {
        self.cx.take()
    }
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        if let Some(cx) = self.cx.take() {
            end(&cx, self.error.as_deref(), &[]);
        }
    }
}
