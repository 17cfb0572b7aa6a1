//! A tool's downstream tokens and requests (docs/DOWNSTREAM.md), for every context that runs a tool: the
//! configured [`Downstreams`](mcpfleet_downstream::Downstreams) with the call's principal, the caller's token
//! (none in a task run), the call's trace id and its 2025 session. Without `--downstreams` every context answers
//! "unsupported".
//!
//! A URL-mode downstream without a stored grant answers with an authorization to ask the user for, which this
//! module turns into what the call's generation sends, and only to a client that declared `elicitation.url`:
//! - a 2025 session: the call ends with the `-32042` error (URL elicitation required), its `data.elicitations`
//!   naming the start URL ([`Generation::Session`]; the session's sink adds the data);
//! - 2026-07-28 (and a task run): an input request (`elicitation/create`, `mode: "url"`) through the context's
//!   [`ask`](ToolContext::ask), a multi round-trip request or the task's input; on the client's accepted answer the
//!   token is asked for again, and a user who has not finished yet is asked again, up to [`ROUNDS`] times;
//! - any other client: an `isError` saying this client cannot authorize the downstream.

use crate::AppState;
use mcpfleet_core::Principal;
use mcpfleet_downstream::{Caller, SubjectToken};
use mcpfleet_tools::downstream::{DownstreamError, DownstreamRequest, DownstreamResponse, DownstreamToken};
use mcpfleet_tools::{ToolContext, ToolError};
use serde_json::Value;
use std::time::Duration;

/// How many times one call asks the user for a downstream's authorization before it tells the model to wait.
pub(crate) const ROUNDS: u32 = 3;

/// How long a 2026-07-28 URL elicitation may wait for the client (the input request's timeout, in a task run).
const ASK_TIMEOUT: Duration = Duration::from_secs(600);

/// How the call's generation asks for a URL-mode authorization.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Generation {
    /// A 2025 session: the `-32042` error.
    Session,
    /// 2026-07-28 or a task run: an input request through the context.
    Rounds,
}

/// Whose call asks.
pub(crate) struct Who<'a> {
    pub(crate) app: &'a AppState,
    pub(crate) principal: &'a Principal,
    pub(crate) subject: Option<&'a SubjectToken>,
    pub(crate) trace_id: &'a str,
    pub(crate) session: Option<&'a str>,
    pub(crate) generation: Generation,
}

/// What a session's call ends with when the user must authorize a downstream: the `-32042` error's data.
pub(crate) fn elicitation_data(elicitation: &Value) -> Value {
    serde_json::json!({ "elicitations": [elicitation] })
}

/// Whether the client declared URL-mode elicitation (`capabilities.elicitation.url`).
fn url_mode(capabilities: &Value) -> bool {
    capabilities.get("elicitation").and_then(|e| e.get("url")).is_some_and(Value::is_object)
}

impl Who<'_> {
    fn caller(&self) -> Caller<'_> {
        Caller { principal: self.principal, subject: self.subject, trace_id: self.trace_id, session: self.session }
    }

    pub(crate) async fn token(&self, cx: &dyn ToolContext, name: &str) -> Result<DownstreamToken, ToolError> {
        let ds = self.app.downstreams.as_ref().ok_or(DownstreamError::Unsupported)?;
        self.authorized(cx, name, || ds.token(name, self.caller())).await
    }

    pub(crate) async fn send(
        &self,
        cx: &dyn ToolContext,
        name: &str,
        request: DownstreamRequest,
    ) -> Result<DownstreamResponse, ToolError> {
        let ds = self.app.downstreams.as_ref().ok_or(DownstreamError::Unsupported)?;
        self.authorized(cx, name, || ds.send(name, self.caller(), request.clone())).await
    }

    /// Runs `op`, asking the client for the user's authorization when a URL-mode downstream needs it.
    async fn authorized<T, F, Fut>(&self, cx: &dyn ToolContext, name: &str, op: F) -> Result<T, ToolError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, DownstreamError>>,
    {
        for round in 1..=ROUNDS {
            let request = match op().await {
                Err(DownstreamError::AuthorizationRequired(r)) => r,
                other => return other.map_err(ToolError::from),
            };
            if !url_mode(cx.client_capabilities()) {
                return Err(DownstreamError::CannotAuthorize(request.downstream).into());
            }
            if self.generation == Generation::Session {
                return Err(ToolError::UrlElicitationRequired(request.elicitation()));
            }
            let key = format!("authorize-{name}-{round}");
            let answer = cx.ask(&key, "elicitation/create", request.elicitation(), ASK_TIMEOUT).await?;
            if answer.get("action").and_then(Value::as_str) != Some("accept") {
                return Err(DownstreamError::Declined(request.downstream).into());
            }
        }
        Err(DownstreamError::NotAuthorizedYet(name.chars().take(64).collect()).into())
    }
}
