//! The HTTP shell of `/mcp`: the POST handler, which reads one message, starts its span and access record, picks
//! its protocol generation once, and hands it to that front end (`session` or `stateless`); GET and DELETE belong
//! to the session generation; any other method is 405. Its extractors (`extract.rs`) have checked the caller,
//! the headers and the body.

use crate::error::TransportError;
use crate::extract::{Caller, McpHeaders, Message, Rpc, Subject};
use crate::mcp;
use crate::metrics::method_label;
use crate::observe::{RequestIds, with_info};
use crate::request::{Asker, Post, Result, charge_unadmitted, rpc_info, stateless_header};
use crate::{AppState, PeerAddr, trace};
use axum::Extension;
use axum::extract::State;
use axum::response::Response;
use mcpfleet_core::ProtocolVersion;
use serde_json::Value;

pub(crate) use crate::session::{delete, get};

pub(crate) async fn post(
    State(app): State<AppState>,
    Extension(ids): Extension<RequestIds>,
    peer: Option<Extension<PeerAddr>>,
    Caller(caller): Caller,
    Subject(subject): Subject,
    h: McpHeaders,
    rpc: Result<Rpc, TransportError>,
) -> Response {
    let asker = Asker::new(&app, &caller, peer).with_subject(subject);
    let (message, duplicate) = match rpc {
        Ok(Rpc(m, duplicate)) => (m, duplicate),
        Err(e) => {
            let mut info = rpc_info(None, &caller, &h);
            // A body that could not be read is answered in the generation its version header names.
            info.stateless = stateless_header(&h);
            let r = charge_unadmitted(&app, &mut info, &asker, Err(e)).await;
            return with_info(r, info);
        }
    };
    let label = match &message {
        Message::Request { method, .. } | Message::Notification { method, .. } => method_label(method),
        Message::Response { .. } => "response",
    };
    let mut info = rpc_info(Some(label), &caller, &h);
    // The MCP span: parented to `params._meta.traceparent` when the request carries one (and linked to the HTTP
    // span), else to the HTTP span.
    let span = match &message {
        Message::Request { method, params, .. } | Message::Notification { method, params } => {
            let id = match &message {
                Message::Request { id, .. } => Some(id),
                _ => None,
            };
            let (parent, ambient) = match trace::meta_parent(params) {
                Some(p) => (p, Some(&ids.http)),
                None => (ids.http.clone(), None),
            };
            let target = match method.as_str() {
                "tools/call" | "prompts/get" if id.is_some() => {
                    params.get("name").and_then(Value::as_str).map(|n| mcp::truncate(n, 64))
                }
                _ => None,
            };
            let r = trace::Request {
                method,
                target: target.as_deref(),
                resource: params.get("uri").and_then(Value::as_str).filter(|_| method.starts_with("resources/")),
                request_id: id,
                session: info.session.as_deref(),
                version: request_version(&h, method, params),
            };
            let span = trace::mcp_span(&parent, ambient, &r);
            if method == "tools/call" {
                info.tool = target;
            }
            Some(span)
        }
        Message::Response { .. } => None,
    };
    let mut span = trace::SpanGuard::new(span, &app.metrics);
    let trace_id = span.context().and_then(trace::trace_id_of).unwrap_or_else(|| ids.trace_id.clone());
    if trace_id != ids.trace_id {
        info.trace_id = Some(trace_id.clone());
    }
    let mut cx = Post { app: &app, ids: &ids, trace_id: &trace_id, span: &mut span, asker: &asker, info: &mut info };
    let r = cx.dispatch(h, message, duplicate.as_deref()).await;
    let r = charge_unadmitted(&app, &mut info, &asker, r).await;
    match &r {
        Err(e) if span.error.is_none() => span.error = Some(e.rpc_code().to_string()),
        _ => {}
    }
    drop(span);
    with_info(r, info)
}

impl Post<'_> {
    /// Picks the message's generation, once: the stateless one when its version header or `_meta` says so, else
    /// the session one.
    async fn dispatch(&mut self, h: McpHeaders, mut message: Message, duplicate: Option<&str>) -> Result<Response> {
        let app = self.app;
        // Before anything reads a call's arguments (validation, digests, parameter headers, the tool), in both
        // generations: integral numbers where the schema says integer are integers.
        if let Message::Request { method, params, .. } = &mut message
            && method == "tools/call"
        {
            app.validator.normalize_arguments(params);
        }
        let params = match &message {
            Message::Request { params, .. } | Message::Notification { params, .. } => Some(params),
            Message::Response { .. } => None,
        };
        if crate::stateless::is_stateless(&h, params) {
            return self.stateless(h, message, duplicate).await;
        }
        self.session(h, message, duplicate).await
    }
}

/// The protocol version a request is made in, as far as it says: its `MCP-Protocol-Version` header, else its
/// `_meta` (2026-07-28), else (an `initialize`) the version it asks for.
fn request_version(h: &McpHeaders, method: &str, params: &mcpfleet_tools::JsonObject) -> Option<ProtocolVersion> {
    let named = h.raw_version().ok().flatten().or_else(|| {
        params.get("_meta").and_then(|m| m.get("io.modelcontextprotocol/protocolVersion")).and_then(Value::as_str)
    });
    let named = named.or_else(|| (method == "initialize").then(|| params.get("protocolVersion")?.as_str()).flatten());
    named.and_then(ProtocolVersion::parse)
}

/// Any other method on `/mcp`: 405, after the caller checks.
pub(crate) async fn other(_caller: Caller) -> TransportError {
    TransportError::MethodNotAllowed
}
