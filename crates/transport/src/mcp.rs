//! MCP method dispatch for one session-bound request. Everything but `tools/call` answers with plain JSON;
//! `tools/call` runs through an [`Exchange`](crate::session::exchange::Exchange).

use crate::AppState;
use crate::code;
use mcpfleet_tools::{JsonObject, LOG_LEVELS, ToolContext, ToolError};
use serde_json::{Value, json};

/// A JSON-RPC error for a request whose id we know.
pub(crate) type RpcResult = Result<Value, (i64, String)>;

fn invalid(msg: impl Into<String>) -> (i64, String) {
    (code::INVALID_PARAMS, msg.into())
}

pub(crate) fn str_param<'a>(params: &'a JsonObject, name: &str) -> Result<&'a str, (i64, String)> {
    params.get(name).and_then(Value::as_str).ok_or_else(|| invalid(format!("params.{name} must be a string")))
}

pub(crate) fn tool_error(e: ToolError) -> (i64, String) {
    match e {
        ToolError::UnknownTool(_) | ToolError::UnknownPrompt(_) | ToolError::InvalidParams(_) => {
            (code::INVALID_PARAMS, e.to_string())
        }
        ToolError::ResourceNotFound(_) => (code::RESOURCE_NOT_FOUND, e.to_string()),
        other => {
            tracing::warn!(error = %other, "catalog call failed");
            (code::INTERNAL_ERROR, "internal error".to_owned())
        }
    }
}

/// Answers a request that needs no stream, in a session.
pub(crate) async fn plain(
    app: &AppState,
    key: &mcpfleet_state::SessionKey,
    caller: &crate::Principal,
    method: &str,
    params: &JsonObject,
) -> RpcResult {
    match method {
        "ping" => Ok(json!({})),
        "resources/subscribe" | "resources/unsubscribe" => {
            let uri = str_param(params, "uri")?;
            if !app.skills.serves(uri) {
                app.catalog.read_resource(uri).await.map_err(tool_error)?;
            }
            Ok(json!({}))
        }
        "logging/setLevel" => {
            let level = str_param(params, "level")?;
            if !LOG_LEVELS.contains(&level) {
                return Err(invalid(format!("params.level must be one of {}", LOG_LEVELS.join(", "))));
            }
            match app.store.set_log_level(key, level).await {
                Ok(_) => Ok(json!({})),
                Err(e) => {
                    tracing::warn!(error = %e, "set_log_level failed");
                    Err((code::UNAVAILABLE, "service temporarily unavailable".to_owned()))
                }
            }
        }
        _ => match catalog_method(app, caller, method, params).await {
            Some(r) => r,
            None => Err((code::METHOD_NOT_FOUND, format!("method not found: {}", truncate(method, 64)))),
        },
    }
}

/// The methods [`catalog_method`] answers (the skills extension's only when skills are served).
pub(crate) const CATALOG_METHODS: [&str; 10] = [
    "tools/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "skills/list",
    "skills/get",
    "resources/directory/read",
];

/// The server's capabilities: the catalog's, plus the skills extension (with `resources`, which it needs) when
/// skills are served.
pub(crate) fn capabilities(app: &AppState) -> Value {
    let mut caps = app.catalog.capabilities();
    if let (Some(settings), Value::Object(c)) = (app.skills.capability(), &mut caps) {
        c.entry("resources").or_insert_with(|| json!({ "listChanged": false }));
        if let Value::Object(e) = c.entry("extensions").or_insert_with(|| json!({})) {
            e.insert(mcpfleet_skills::EXTENSION.into(), settings);
        }
    }
    caps
}

/// A skills request refused: every [`SkillError`](mcpfleet_skills::SkillError) of a request is invalid params.
fn skill_error(e: mcpfleet_skills::SkillError) -> (i64, String) {
    invalid(e.to_string())
}

/// `params.cursor`: absent, or a string.
fn cursor(params: &JsonObject) -> Result<Option<&str>, (i64, String)> {
    match params.get("cursor") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(c)) => Ok(Some(c)),
        Some(_) => Err(invalid("params.cursor must be a string")),
    }
}

/// A page as a paginated result: its items under `field`, and `nextCursor` when there is more.
fn paged(field: &str, p: mcpfleet_skills::Page) -> Value {
    let mut r = json!({ field: p.items });
    if let Some(c) = p.next_cursor {
        r["nextCursor"] = json!(c);
    }
    r
}

/// `params.name` and `params.arguments` (absent arguments are an empty object) of a `tools/call` or `prompts/get`.
pub(crate) fn target(params: &JsonObject) -> Result<(String, JsonObject), (i64, String)> {
    let name = str_param(params, "name")?.to_owned();
    match params.get("arguments") {
        None => Ok((name, JsonObject::new())),
        Some(Value::Object(a)) => Ok((name, a.clone())),
        Some(_) => Err(invalid("params.arguments must be an object")),
    }
}

/// The params of `notifications/progress`.
pub(crate) fn progress_params(token: &Value, progress: f64, total: Option<f64>, message: Option<&str>) -> Value {
    let mut params = json!({ "progressToken": token, "progress": progress });
    if let Some(t) = total {
        params["total"] = json!(t);
    }
    if let Some(m) = message {
        params["message"] = json!(m);
    }
    params
}

/// The params of `notifications/message` at `level`, if that is at or above `min` (an index into [`LOG_LEVELS`]).
pub(crate) fn log_params(min: usize, level: &str, logger: Option<&str>, data: Value) -> Option<Value> {
    let rank = LOG_LEVELS.iter().position(|l| *l == level).unwrap_or(0);
    if rank < min {
        return None;
    }
    let mut params = json!({ "level": level, "data": data });
    if let Some(l) = logger {
        params["logger"] = json!(l);
    }
    Some(params)
}

/// The `isError` result of a call stopped at its timeout.
pub(crate) fn timed_out(timeout: std::time::Duration, trace_id: &str) -> Value {
    is_error(&format!(
        "The tool did not finish within {} s and was stopped. Do not retry with the same arguments; tell the user, \
         quoting the trace id {trace_id}.",
        timeout.as_secs_f64()
    ))
}

/// The methods both generations answer from the catalog alone (those of [`CATALOG_METHODS`]); `None` for any
/// other method.
pub(crate) async fn catalog_method(
    app: &AppState,
    caller: &crate::Principal,
    method: &str,
    params: &JsonObject,
) -> Option<RpcResult> {
    let c = &app.catalog;
    Some(match method {
        "tools/list" => {
            // A caller is offered only the tools its scopes and its plan allow it to call.
            let plan = app.policy.plan_of(caller);
            let mut tools = c.tools();
            tools.retain(|t| {
                t.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| plan.allows(n) && caller.scopes.allow(&app.tool_scopes(n)))
            });
            Ok(json!({ "tools": tools }))
        }
        "resources/list" => {
            let mut all = c.resources();
            all.extend(app.skills.resources());
            Ok(json!({ "resources": all }))
        }
        "resources/templates/list" => Ok(json!({ "resourceTemplates": c.resource_templates() })),
        "resources/read" => match str_param(params, "uri") {
            Ok(uri) => match app.skills.read(uri) {
                Some(r) => Ok(r),
                None => c.read_resource(uri).await.map_err(tool_error),
            },
            Err(e) => Err(e),
        },
        "skills/list" if !app.skills.is_empty() => {
            cursor(params).and_then(|at| app.skills.list(at).map(|p| paged("skills", p)).map_err(skill_error))
        }
        "skills/get" if !app.skills.is_empty() => str_param(params, "uri")
            .and_then(|uri| app.skills.get(uri).map_err(skill_error))
            .map(|skill| json!({ "skill": skill })),
        "resources/directory/read" if !app.skills.is_empty() => match (str_param(params, "uri"), cursor(params)) {
            (Ok(uri), Ok(at)) => app.skills.directory(uri, at).map(|p| paged("resources", p)).map_err(skill_error),
            (Err(e), _) | (_, Err(e)) => Err(e),
        },
        "prompts/list" => Ok(json!({ "prompts": c.prompts() })),
        "prompts/get" => match target(params) {
            Ok((name, args)) => c.get_prompt(&name, &args).await.map_err(tool_error),
            Err(e) => Err(e),
        },
        "completion/complete" => match (params.get("ref"), params.get("argument")) {
            (Some(r), Some(a)) => c.complete(r, a).await.map_err(tool_error),
            _ => Err(invalid("params.ref and params.argument are required")),
        },
        _ => return None,
    })
}

pub(crate) fn truncate(s: &str, n: usize) -> String {
    prefix(s, n).to_owned()
}

/// The first `n` characters of `s`, borrowed.
pub(crate) fn prefix(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(i, _)| &s[..i])
}

/// Runs a tool. Unknown tools are protocol errors; tool failures become `isError` results with no internals.
/// Also says whether the result is the tool's own outcome (what an idempotency key keeps: a result, or a refusal
/// the tool made) rather than a transient failure.
pub(crate) async fn call_tool(
    app: &AppState,
    name: &str,
    args: JsonObject,
    cx: &dyn ToolContext,
    trace_id: &str,
) -> (RpcResult, bool) {
    let r = app.catalog.call_tool(name, args, cx).await;
    let own = own_outcome(&r);
    (tool_result(r, name, trace_id), own)
}

/// Whether a tool's outcome is its own (a result, or a refusal it made), as opposed to a failure that a retry may
/// not meet (the store, the client, an internal error, a cancellation).
pub(crate) fn own_outcome(r: &Result<Value, ToolError>) -> bool {
    matches!(r, Ok(_) | Err(ToolError::Failed(_)))
}

/// What a tool's outcome becomes: unknown tools and refused arguments are protocol errors; every other failure
/// is an `isError` result with no internals (the detail goes to the log).
pub(crate) fn tool_result(r: Result<Value, ToolError>, name: &str, trace_id: &str) -> RpcResult {
    match r {
        Ok(v) => Ok(v),
        Err(e @ (ToolError::UnknownTool(_) | ToolError::InvalidParams(_))) => {
            Err((code::INVALID_PARAMS, e.to_string()))
        }
        // A 2025 session's call that needs the user's authorization first: the session's sink adds the
        // elicitation as the error's data.
        Err(e @ ToolError::UrlElicitationRequired(_)) => Err((code::URL_ELICITATION_REQUIRED, e.to_string())),
        Err(e) => {
            // The detail (an internal error's message: paths, SQL, hosts) goes to the log only.
            tracing::warn!(tool.name = name, trace_id = %trace_id, error = %e, detail = ?e, "tool call failed");
            Ok(match &e {
                ToolError::Internal(_) => tool_failure(trace_id),
                other => is_error(&format!("{other}. Trace id: {trace_id}.")),
            })
        }
    }
}

/// An `isError` result with `text`.
pub(crate) fn is_error(text: &str) -> Value {
    json!({ "content": [{ "type": "text", "text": text }], "isError": true })
}

/// The one text of a tool that failed inside (an error, a panic): nothing of the failure, the trace id to quote.
pub(crate) fn tool_failure(trace_id: &str) -> Value {
    is_error(&format!(
        "The tool failed. Do not retry with the same arguments; tell the user, quoting the trace id {trace_id}."
    ))
}
