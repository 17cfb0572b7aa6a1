//! The 2026-07-28 generation: every request is self-describing and answered on its own, by any replica, with no
//! session. A POST is answered this way when its `MCP-Protocol-Version` header or its
//! `params._meta["io.modelcontextprotocol/protocolVersion"]` names a stateless version; anything else takes the
//! session path (`session/`).
//!
//! This module holds the entry point, [`Post::stateless`]: a message's kind, then a request's checks and its
//! method. Each part lives in a child, by what it does: [`meta`] (whether a POST is of this generation, and the
//! request's `_meta`: `-32602`, `-32022`), [`headers`] (the standard headers against the body: `-32020`),
//! [`reply`] (results with `resultType`, `serverInfo` and caching hints; method errors; stream frames),
//! [`discover`] (`server/discover`), [`call`] (`tools/call`: per-request log levels, cancellation by closing the
//! stream, idempotency keys, the task it may become), [`prompt`] (`prompts/get`), [`rounds`] and [`mrtr`] (multi
//! round-trip requests and their signed `requestState`), and [`listen`] (`subscriptions/listen` streams fed by the
//! principal's notice channel). The tasks extension's methods are `tasks/`'s.

mod call;
mod discover;
mod headers;
mod listen;
mod meta;
pub(crate) mod mrtr;
mod prompt;
mod reply;
mod rounds;

pub(crate) use meta::is_stateless;

use crate::code;
use crate::error::TransportError;
use crate::extract::{McpHeaders, Message};
use crate::mcp;
use crate::request::{Post, Result, accepted, admit};
use axum::response::Response;
use mcpfleet_tools::JsonObject;
use reply::{complete, ok, rpc_error};
use serde_json::{Value, json};

impl Post<'_> {
    /// Answers a message of the stateless generation.
    pub(crate) async fn stateless(
        &mut self,
        h: McpHeaders,
        message: Message,
        duplicate: Option<&str>,
    ) -> Result<Response> {
        let app = self.app;
        self.info.stateless = true;
        match message {
            Message::Request { id, method, params } => {
                self.info.request_id = Some(id.clone());
                self.stateless_request(&h, &id, &method, &params, duplicate).await
            }
            // 2026-07-28 defines no client notification over HTTP: accepted, and ignored (a cancellation, as in the
            // session generation, without touching the bucket).
            Message::Notification { method, .. } => {
                let req = self.asker.request();
                let req = if method == "notifications/cancelled" { req.as_control() } else { req };
                admit(app, self.info, &req).await?;
                Ok(accepted())
            }
            Message::Response { .. } => Err(TransportError::InvalidRequest(
                "2026-07-28 clients send no responses: answer input requests with inputResponses on a retry",
            )),
        }
    }

    /// Answers one stateless request. Every error carries the request's id and the stateless code allocation.
    async fn stateless_request(
        &mut self,
        h: &McpHeaders,
        id: &Value,
        method: &str,
        params: &JsonObject,
        duplicate: Option<&str>,
    ) -> Result<Response> {
        let m = meta::meta(h, params)?;
        headers::check_headers(h, method, params)?;
        let app = self.app;
        let cacheable = matches!(
            method,
            "tools/list"
                | "prompts/list"
                | "resources/list"
                | "resources/templates/list"
                | "resources/read"
                | "skills/list"
                | "skills/get"
        );
        match method {
            "tools/call" => self.stateless_call(h, id, params, m, duplicate).await,
            "prompts/get" => self.stateless_prompt(id, params, m).await,
            "subscriptions/listen" => self.listen(id, params, &m.capabilities).await,
            "tasks/get" | "tasks/update" | "tasks/cancel" => {
                Ok(match self.task_method(method, params, &m.capabilities).await? {
                    Ok(v) => ok(id, complete(app, v, false)),
                    Err(e) => {
                        self.span.error = Some(e.0.to_string());
                        rpc_error(id, e, None)
                    }
                })
            }
            "server/discover" => {
                admit(app, self.info, &self.asker.request()).await?;
                Ok(ok(id, discover::discover(app)))
            }
            _ if !mcp::CATALOG_METHODS.contains(&method) => {
                Err(TransportError::MethodNotFound(mcp::truncate(method, 64)))
            }
            _ => {
                admit(app, self.info, &self.asker.request()).await?;
                let r = mcp::catalog_method(app, self.asker.caller, method, params).await;
                let r = r.unwrap_or_else(|| Err((code::METHOD_NOT_FOUND, "method not found".to_owned())));
                Ok(match r {
                    Ok(v) => ok(id, complete(app, v, cacheable)),
                    Err(e) => {
                        self.span.error = Some(e.0.to_string());
                        // A resource not found names the URI (SEP-2164), under -32602.
                        let data = (e.0 == code::RESOURCE_NOT_FOUND)
                            .then(|| params.get("uri").map(|u| json!({ "uri": u })))
                            .flatten();
                        rpc_error(id, e, data)
                    }
                })
            }
        }
    }
}
