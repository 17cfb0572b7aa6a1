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
    // The MCP span: parented to `params._meta.traceparent` when the request carries one, else to the HTTP span.
    let span = match &message {
        Message::Request { id, method, params } => {
            let parent = trace::meta_parent(params).unwrap_or_else(|| ids.http.clone());
            let target = match method.as_str() {
                "tools/call" | "prompts/get" => {
                    params.get("name").and_then(Value::as_str).map(|n| mcp::truncate(n, 64))
                }
                _ => None,
            };
            let span = trace::mcp_span(&parent, method, target.as_deref(), Some(id), info.session.as_deref());
            if method == "tools/call" {
                info.tool = target;
            }
            Some(span)
        }
        Message::Notification { method, params } => {
            let parent = trace::meta_parent(params).unwrap_or_else(|| ids.http.clone());
            Some(trace::mcp_span(&parent, method, None, None, info.session.as_deref()))
        }
        Message::Response { .. } => None,
    };
    let mut span = trace::SpanGuard::new(span);
    let trace_id = span.context().and_then(trace::trace_id_of).unwrap_or_else(|| ids.trace_id.clone());
    if trace_id != ids.trace_id {
        info.trace_id = Some(trace_id.clone());
    }
    let mut cx = Post { app: &app, ids: &ids, trace_id: &trace_id, span: &mut span, asker: &asker, info: &mut info };
    let r = cx.dispatch(h, message, duplicate.as_deref()).await;
    let r = charge_unadmitted(&app, &mut info, &asker, r).await;
    match &r {
        Err(e) if span.error.is_none() => span.error = Some(e.status_code().as_str().to_owned()),
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

/// Any other method on `/mcp`: 405, after the caller checks.
pub(crate) async fn other(_caller: Caller) -> TransportError {
    TransportError::MethodNotAllowed
}
