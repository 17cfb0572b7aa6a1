//! The input requests of the stateless generation (multi round-trip requests): the server→client requests a tool
//! may ask for, the client capability each needs, and how a client's answer reaches the tool. Shared by the
//! stateless front end (`stateless/`, where input is asked round by round) and the tasks (`tasks/`, where it is
//! asked through the task record).

use crate::mcp;
use mcpfleet_tools::ToolError;
use serde_json::Value;

/// The server→client requests a round may ask for, each with the client capability it needs (which also names
/// its kind in automatic input keys).
const KINDS: [(&str, &str); 3] =
    [("sampling/createMessage", "sampling"), ("elicitation/create", "elicitation"), ("roots/list", "roots")];

/// Whether `cap` is a client capability that input requests need.
pub(crate) fn is_capability(cap: &str) -> bool {
    KINDS.iter().any(|(_, c)| *c == cap)
}

/// The capability an input request of `method` needs.
pub(crate) fn kind(method: &str) -> Option<&'static str> {
    KINDS.iter().find(|(m, _)| *m == method).map(|(_, c)| *c)
}

/// A client's answer to an input request as the tool gets it: a JSON-RPC error object becomes
/// [`ToolError::ClientError`]; anything but an object is refused.
pub(crate) fn answer_value(key: &str, answer: &Value) -> Result<Value, ToolError> {
    match answer {
        Value::Object(o) if o.contains_key("code") && o.contains_key("message") && o.len() <= 3 => {
            Err(ToolError::ClientError {
                code: o.get("code").and_then(Value::as_i64).unwrap_or(-32603),
                message: o.get("message").and_then(Value::as_str).unwrap_or("error").chars().take(200).collect(),
            })
        }
        Value::Object(_) => Ok(answer.clone()),
        _ => Err(ToolError::InvalidParams(format!("inputResponses[\"{}\"] must be an object", mcp::truncate(key, 64)))),
    }
}
