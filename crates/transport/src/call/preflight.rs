//! The checks of a `tools/call` that both generations run, in the same order, before anything runs or is
//! counted against a quota: the tool's scopes (403 step-up), the arguments against the tool's published schema
//! (an `isError` result naming each pointer), and the results a call refused by its quota gets.

use crate::AppState;
use crate::call::{CallEnd, RefusedCall};
use crate::error::{TransportError, auth_rejection};
use crate::mcp;
use crate::request::{Post, Result};
use mcpfleet_limits as limits;
use mcpfleet_tools::JsonObject;
use serde_json::{Value, json};

impl Post<'_> {
    /// Step-up (MCP authorization): a caller without the tool's scopes gets 403 insufficient_scope naming them,
    /// before anything runs or is counted against a quota; the refusal is audited.
    pub(crate) fn require_tool_scopes(&mut self, name: &str, args: &JsonObject) -> Result<()> {
        let app = self.app;
        let required = app.tool_scopes(name);
        if self.asker.caller.scopes.allow(&required) {
            return Ok(());
        }
        self.record_refused(name, args, CallEnd::Refused);
        self.span.error = Some("insufficient_scope".to_owned());
        Err(auth_rejection(app, mcpfleet_auth::AuthError::InsufficientScope(required)))
    }

    /// Counts and audits a call refused before it started.
    pub(crate) fn record_refused(&self, tool: &str, args: &JsonObject, end: CallEnd) {
        let principal = self.asker.caller;
        RefusedCall { app: self.app, principal, tool, args, trace_id: self.trace_id, end }.record();
    }
}

/// The duplicate keys and schema violations of a call's arguments, if any. A duplicate key elsewhere in the
/// message is a malformed request.
pub(crate) fn invalid_arguments(
    app: &AppState,
    tool: &str,
    args: Option<&Value>,
    duplicate: Option<&str>,
) -> Result<Option<Vec<mcpfleet_tools::validate::Invalid>>> {
    use mcpfleet_tools::validate::Invalid;
    if let Some(at) = duplicate {
        // `classify` lets through only duplicates inside the arguments; any other is a malformed request.
        return match at.strip_prefix("/params") {
            Some(rest) if rest.starts_with("/arguments/") => {
                Ok(Some(vec![Invalid { pointer: rest.to_owned(), expected: "each key once (a duplicate key)".into() }]))
            }
            _ => Err(TransportError::Envelope(format!("the key at {} is given twice", mcp::truncate(at, 128)))),
        };
    }
    // Absent arguments are an empty object (MCP makes them optional), checked like any other.
    let empty = Value::Object(JsonObject::new());
    Ok(app.validator.check(tool, args.unwrap_or(&empty)).err())
}

/// The `isError` result of a call whose arguments do not match the tool's schema: every finding with its
/// pointer, and what to do. The values sent are not echoed.
pub(crate) fn invalid_result(tool: &str, found: &[mcpfleet_tools::validate::Invalid]) -> Value {
    let list = found.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    let text = format!(
        "Invalid arguments for the tool {tool}: {list}. The tool did not run. Correct the arguments to match its \
         input schema and call it again."
    );
    json!({ "content": [{ "type": "text", "text": text }], "isError": true })
}

/// The `isError` result of a call refused by its tool's quota: it names the tool, the quota and when to come
/// back, and tells the model to ask its user rather than retry.
pub(crate) fn quota_result(tool: &str, quota: limits::Quota, retry_after: u64, trace_id: &str) -> Value {
    let text = format!(
        "Quota exhausted: the tool {tool} may be called {quota} by this user, and that is used up. It can be \
         called again in {retry_after} s. Do not retry it before then, and do not retry blindly: tell the user, \
         and ask whether to wait or to do something else. Trace id: {trace_id}."
    );
    json!({ "content": [{ "type": "text", "text": text }], "isError": true })
}
