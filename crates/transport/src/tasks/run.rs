//! A queued task's run on the worker that took it: the third sink of the call pipeline. Its answer goes into the
//! task record, not to a connection; what stops it is a cancellation asked on any replica or a hand-off; input it
//! needs is asked through the task. No progress or log notifications: a task has no stream to carry them.

use super::link::{LinkWatch, TaskLink};
use crate::call::{CallEnd, CallSink, Finished, Identity, Interrupt};
use crate::idempotency::Ran;
use crate::{AppState, Principal, mcp};
use async_trait::async_trait;
use mcpfleet_tools::downstream::{DownstreamRequest, DownstreamResponse, DownstreamToken};
use mcpfleet_tools::{JsonObject, ToolContext, ToolError};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What a run may end with besides a result.
pub(crate) enum RunError {
    Rpc((i64, String)),
    /// The tool asked for input of a kind the creating request's capabilities do not declare.
    Missing(&'static str),
}

impl From<(i64, String)> for RunError {
    fn from(e: (i64, String)) -> Self {
        Self::Rpc(e)
    }
}

pub(crate) struct TaskRun {
    pub(crate) app: AppState,
    pub(crate) principal: Principal,
    pub(crate) trace_id: String,
    pub(crate) span: opentelemetry::Context,
    pub(crate) capabilities: Value,
    pub(crate) link: TaskLink,
    pub(crate) cancel: CancellationToken,
    /// How many input requests of each kind the tool made without a key: `<kind>-<n>`, stable across runs.
    pub(crate) counts: Mutex<HashMap<&'static str, u32>>,
}

impl TaskRun {
    /// Whose downstream tokens this run's tool asks for: no caller's request, so no token to exchange.
    fn downstream_who(&self) -> crate::downstream::Who<'_> {
        crate::downstream::Who {
            app: &self.app,
            principal: &self.principal,
            subject: None,
            trace_id: &self.trace_id,
            session: None,
            generation: crate::downstream::Generation::Rounds,
        }
    }
}

impl std::fmt::Debug for TaskRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRun").field("task", &self.link.key.id).finish_non_exhaustive()
    }
}

#[async_trait]
impl CallSink for TaskRun {
    const GENERATION: &'static str = crate::call::STATELESS_GENERATION;
    type Error = RunError;
    type Watch = LinkWatch;

    fn identity(&self) -> Identity<'_> {
        Identity { app: &self.app, principal: &self.principal, trace_id: &self.trace_id, span: &self.span }
    }

    async fn run(self: Arc<Self>, tool: String, args: JsonObject) -> (Result<Value, RunError>, bool) {
        let r = self.app.catalog.call_tool(&tool, args, &*self).await;
        let own = mcp::own_outcome(&r);
        // Input the creating request's capabilities cannot carry refuses the run, as it refuses a call (-32021).
        if let Err(ToolError::ClientUnsupported(cap)) = &r
            && crate::input::is_capability(cap)
        {
            return (Err(RunError::Missing(cap)), own);
        }
        (mcp::tool_result(r, &tool, &self.trace_id).map_err(RunError::Rpc), own)
    }

    fn settle(&self, ran: Ran<RunError>) -> (Finished, CallEnd) {
        match ran {
            Ran::Here(Err(RunError::Missing(cap))) => (
                Finished::Refused(crate::TransportError::MissingCapability(vec![cap.to_owned()])),
                CallEnd::ProtocolError,
            ),
            Ran::Here(Err(RunError::Rpc(e))) => (Finished::Answer(Err(e)), CallEnd::ProtocolError),
            Ran::Here(Ok(v)) => {
                let end = crate::call::outcome_of(&Ok(v.clone()));
                (Finished::Answer(Ok(v)), end)
            }
            Ran::Replayed(v) => (Finished::Answer(Ok(v)), CallEnd::Replayed),
        }
    }

    async fn deliver(&self, finished: Finished) {
        self.link.end(finished).await;
    }

    async fn go_streaming(&self) {}

    fn watcher(&self) -> LinkWatch {
        LinkWatch::default()
    }

    async fn watch(&self, w: &mut LinkWatch) -> Interrupt {
        Interrupt::Stop(self.link.watch(w).await)
    }

    async fn stopped(&self, end: CallEnd) {
        self.cancel.cancel();
        self.link.stopped(end).await;
    }
}

#[async_trait]
impl ToolContext for TaskRun {
    async fn progress(&self, _: f64, _: Option<f64>, _: Option<&str>) -> Result<(), ToolError> {
        // A task has no stream: its progress is its status.
        Ok(())
    }

    async fn log(&self, _: &str, _: Option<&str>, _: Value) -> Result<(), ToolError> {
        Ok(())
    }

    async fn request(&self, method: &str, params: Value, timeout: Duration) -> Result<Value, ToolError> {
        let kind = crate::input::kind(method).unwrap_or("request");
        let key = {
            let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            let n = counts.entry(kind).or_insert(0);
            *n += 1;
            format!("{kind}-{n}")
        };
        self.ask(&key, method, params, timeout).await
    }

    async fn ask(&self, key: &str, method: &str, params: Value, _: Duration) -> Result<Value, ToolError> {
        self.link.ask(key, method, params, &self.capabilities).await
    }

    async fn notify_session(&self, method: &str, params: Value) -> Result<(), ToolError> {
        let msg = crate::jsonrpc::notification(method, params).to_string();
        self.app.store.publish_user(&self.principal.user, &msg).await.map_err(|_| ToolError::Unavailable)
    }

    async fn close_connection(&self, _: Duration) -> Result<(), ToolError> {
        Err(ToolError::ClientUnsupported("stream resumption"))
    }

    fn principal(&self) -> &Principal {
        &self.principal
    }

    fn client_capabilities(&self) -> &Value {
        &self.capabilities
    }

    fn cancelled(&self) -> CancellationToken {
        self.cancel.clone()
    }

    async fn downstream_token(&self, name: &str) -> Result<DownstreamToken, ToolError> {
        self.downstream_who().token(self, name).await
    }

    async fn downstream_send(&self, name: &str, request: DownstreamRequest) -> Result<DownstreamResponse, ToolError> {
        self.downstream_who().send(self, name, request).await
    }
}
