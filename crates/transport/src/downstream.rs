//! A tool's downstream tokens and requests (docs/DOWNSTREAM.md), for every context that runs a tool: the
//! configured [`Downstreams`](mcpfleet_downstream::Downstreams) with the call's principal, the caller's token
//! (none in a task run) and the call's trace id. Without `--downstreams` every context answers "unsupported".

use crate::AppState;
use mcpfleet_core::Principal;
use mcpfleet_downstream::{Caller, SubjectToken};
use mcpfleet_tools::ToolError;
use mcpfleet_tools::downstream::{DownstreamError, DownstreamRequest, DownstreamResponse, DownstreamToken};

/// Whose call asks.
pub(crate) struct Who<'a> {
    pub(crate) app: &'a AppState,
    pub(crate) principal: &'a Principal,
    pub(crate) subject: Option<&'a SubjectToken>,
    pub(crate) trace_id: &'a str,
}

impl Who<'_> {
    fn caller(&self) -> Caller<'_> {
        Caller { principal: self.principal, subject: self.subject, trace_id: self.trace_id }
    }

    pub(crate) async fn token(&self, name: &str) -> Result<DownstreamToken, ToolError> {
        let ds = self.app.downstreams.as_ref().ok_or(DownstreamError::Unsupported)?;
        Ok(ds.token(name, self.caller()).await?)
    }

    pub(crate) async fn send(&self, name: &str, request: DownstreamRequest) -> Result<DownstreamResponse, ToolError> {
        let ds = self.app.downstreams.as_ref().ok_or(DownstreamError::Unsupported)?;
        Ok(ds.send(name, self.caller(), request).await?)
    }
}
