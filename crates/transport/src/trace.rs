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

use crate::metrics::Operation;
use mcpfleet_core::ProtocolVersion;
use mcpfleet_tools::JsonObject;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue, global};
use serde_json::Value;
use std::time::Instant;

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
        None,
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

/// What one MCP request is, for its span and for `mcp_server_operation_duration_seconds`.
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    /// The tool (`tools/call`) or prompt (`prompts/get`) it names.
    pub(crate) target: Option<&'a str>,
    /// The resource it names (`resources/read`, `resources/subscribe`, `resources/directory/read`, …).
    pub(crate) resource: Option<&'a str>,
    pub(crate) request_id: Option<&'a Value>,
    /// A short hash, never the session id.
    pub(crate) session: Option<&'a str>,
    /// The protocol version the request is made in, when it says.
    pub(crate) version: Option<ProtocolVersion>,
}

/// Starts the MCP span of one JSON-RPC request: named `{method} {target}`, with the MCP semantic-convention
/// attributes. `parent` is the request's `params._meta` trace context when it carries one (then the span links to
/// `ambient`, the HTTP span), else the HTTP span.
pub(crate) fn mcp_span(parent: &Context, ambient: Option<&Context>, r: &Request<'_>) -> Context {
    let method = crate::metrics::method_label(r.method);
    let name = || match r.target {
        Some(t) => format!("{} {t}", r.method),
        None => r.method.to_owned(),
    };
    let link = ambient.map(|a| a.span().span_context().clone()).filter(SpanContext::is_valid);
    let cx = server_span(parent, link, name, || {
        let mut attrs = vec![KeyValue::new("mcp.method.name", method), KeyValue::new("network.transport", "tcp")];
        if let Some(v) = r.version {
            attrs.push(KeyValue::new("mcp.protocol.version", v.as_str()));
        }
        if let Some(id) = r.request_id {
            attrs.push(KeyValue::new("jsonrpc.request.id", id.to_string()));
        }
        if let Some(s) = r.session {
            attrs.push(KeyValue::new("mcp.session.id", s.to_owned()));
        }
        if let Some(u) = r.resource {
            attrs.push(KeyValue::new("mcp.resource.uri", crate::mcp::truncate(u, 256)));
        }
        match (r.method, r.target) {
            ("tools/call", Some(t)) => {
                attrs.push(KeyValue::new("gen_ai.tool.name", t.to_owned()));
                attrs.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
            }
            ("prompts/get", Some(p)) => attrs.push(KeyValue::new("gen_ai.prompt.name", p.to_owned())),
            _ => {}
        }
        attrs
    });
    let version = r.version.map_or("", ProtocolVersion::as_str);
    cx.with_value(Operation { method, version, started: Instant::now() })
}

/// The operation a span's context carries ([`mcp_span`]'s).
pub(crate) fn operation(cx: &Context) -> Option<Operation> {
    cx.get::<Operation>().copied()
}

/// A server span under `parent`, linked to `link`. Its name and attributes are built only if it records (an
/// exporter is installed and the sampler took it): without an exporter a span carries only its ids, and every
/// request would build strings for nobody (issue 19).
fn server_span(
    parent: &Context,
    link: Option<SpanContext>,
    name: impl FnOnce() -> String,
    attrs: impl FnOnce() -> Vec<KeyValue>,
) -> Context {
    let tracer = global::tracer(TRACER);
    let mut builder = tracer.span_builder("").with_kind(SpanKind::Server);
    if let Some(l) = link {
        builder = builder.with_links(vec![opentelemetry::trace::Link::with_context(l)]);
    }
    let mut span = builder.start_with_context(&tracer, parent);
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

/// Ends the span in `cx` with an error type, if any (`error.type`, and an error status; a JSON-RPC error's code is
/// its error type, and also `rpc.response.status_code`).
pub(crate) fn end(cx: &Context, error_type: Option<&str>, extra: &[KeyValue]) {
    let span = cx.span();
    span.set_attributes(extra.iter().cloned());
    if let Some(e) = error_type {
        span.set_attribute(KeyValue::new("error.type", e.to_owned()));
        if e.parse::<i64>().is_ok() {
            span.set_attribute(KeyValue::new("rpc.response.status_code", e.to_owned()));
        }
        span.set_status(Status::error(e.to_owned()));
    }
    span.end();
}

/// Ends its span when dropped, with the error type recorded so far, and observes its operation's duration,
/// unless the span was handed on (a `tools/call` span belongs to its exchange once the call starts, and the call's
/// record ends it).
pub(crate) struct SpanGuard {
    cx: Option<Context>,
    pub(crate) error: Option<String>,
    metrics: Option<crate::metrics::TransportMetrics>,
}

impl SpanGuard {
    pub(crate) fn new(cx: Option<Context>, metrics: &crate::metrics::TransportMetrics) -> Self {
        Self { cx, error: None, metrics: Some(metrics.clone()) }
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
            if let (Some(m), Some(op)) = (&self.metrics, operation(&cx)) {
                m.observe_operation(&op, "", self.error.as_deref());
            }
        }
    }
}
