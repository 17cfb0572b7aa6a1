//! `prompts/get`, which may ask the client for input (multi round-trip) like a tool, and nothing else.

use super::meta::Meta;
use super::reply::{complete, ok, rpc_error};
use super::rounds::{Asking, Inputs};
use crate::Principal;
use crate::error::TransportError;
use crate::idempotency;
use crate::mcp;
use crate::request::{Post, Result, admit};
use async_trait::async_trait;
use axum::response::Response;
use mcpfleet_tools::{JsonObject, ToolContext, ToolError};
use serde_json::Value;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

impl Post<'_> {
    /// `prompts/get`, which may ask the client for input (multi round-trip) like a tool.
    pub(super) async fn stateless_prompt(&mut self, id: &Value, params: &JsonObject, m: Meta) -> Result<Response> {
        let app = self.app;
        let (name, args) = mcp::target(params).map_err(|e| TransportError::InvalidMeta(e.1))?;
        let digest = idempotency::digest(&name, &args);
        let answers = self.input_answers("prompts/get", &digest, params)?;
        admit(app, self.info, &self.asker.request()).await?;
        let cx = PromptContext {
            principal: self.asker.caller.clone(),
            cancel: CancellationToken::new(),
            inputs: Inputs::new(answers, m, "prompts/get", digest),
        };
        let r = app.catalog.get_prompt_with(&name, &args, &cx).await;
        match cx.inputs.decide(app, &cx.principal, &r) {
            Some(Ok(v)) => Ok(ok(id, complete(app, v, false))),
            Some(Err(e)) => Err(e),
            None => match r {
                Ok(v) => Ok(ok(id, complete(app, v, false))),
                Err(e) => {
                    let e = mcp::tool_error(e);
                    self.span.error = Some(e.0.to_string());
                    Ok(rpc_error(id, e, None))
                }
            },
        }
    }
}

/// The context of a `prompts/get`: it can ask for input, and nothing else.
struct PromptContext {
    principal: Principal,
    cancel: CancellationToken,
    inputs: Inputs,
}

#[async_trait]
impl ToolContext for PromptContext {
    async fn progress(&self, _: f64, _: Option<f64>, _: Option<&str>) -> std::result::Result<(), ToolError> {
        Ok(())
    }

    async fn log(&self, _: &str, _: Option<&str>, _: Value) -> std::result::Result<(), ToolError> {
        Ok(())
    }

    async fn request(&self, method: &str, params: Value, timeout: Duration) -> std::result::Result<Value, ToolError> {
        self.ask(&self.inputs.auto_key(method), method, params, timeout).await
    }

    async fn ask(&self, key: &str, method: &str, params: Value, _: Duration) -> std::result::Result<Value, ToolError> {
        match self.inputs.ask(key, method, params) {
            Asking::Done(r) => r,
            // A prompt never becomes a task.
            Asking::Task(_) => Err(ToolError::Cancelled),
        }
    }

    async fn notify_session(&self, _: &str, _: Value) -> std::result::Result<(), ToolError> {
        Err(ToolError::ClientUnsupported("notifications"))
    }

    async fn close_connection(&self, _: Duration) -> std::result::Result<(), ToolError> {
        Err(ToolError::ClientUnsupported("stream resumption"))
    }

    fn principal(&self) -> &Principal {
        &self.principal
    }

    fn client_capabilities(&self) -> &Value {
        &self.inputs.meta.capabilities
    }

    fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }
}
