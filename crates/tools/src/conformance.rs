//! The fixtures the MCP conformance suite (`@modelcontextprotocol/conformance` 0.1.16) expects, implemented for
//! real: server→client requests go through the session's routing, logs and progress through its stream. Only
//! registered with `--fixtures conformance`, never by default.

use crate::{Catalog, JsonObject, ToolContext, ToolError};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::time::Duration;

const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
const WAV: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// The scope `test_whoami` declares, so that tests see a tool-declared scope enforced.
pub const WHOAMI_SCOPE: &str = "fixtures:whoami";

/// The quota `test_costly` declares, so that tests see a tool-declared quota enforced.
pub const COSTLY_QUOTA: crate::Quota = crate::Quota::new(3, Duration::from_secs(3600));

/// What the failing fixtures carry in their errors: everything that must never reach a client.
pub const LEAKY_DETAIL: &str = "query failed: SELECT * FROM users WHERE token = 'tok_live_5ecret' at \
    /srv/mcpfleet/src/db.rs:42 via redis://:hunter2@10.0.0.7:6379/0 (Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.x)";

/// The conformance catalog.
#[derive(Debug, Default)]
pub struct ConformanceCatalog;

fn closed(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

fn tool(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "description": description, "inputSchema": schema })
}

fn text(t: impl Into<String>) -> Value {
    json!({ "type": "text", "text": t.into() })
}

fn ok(content: Vec<Value>) -> Result<Value, ToolError> {
    Ok(json!({ "content": content }))
}

fn string_arg<'a>(args: &'a JsonObject, name: &str) -> Result<&'a str, ToolError> {
    args.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::InvalidParams(format!("arguments.{name} must be a string")))
}

fn no_args(name: &str, description: &str) -> Value {
    tool(name, description, closed(json!({}), &[]))
}

fn require_capability(cx: &dyn ToolContext, cap: &'static str) -> Result<(), ToolError> {
    if cx.client_capabilities().get(cap).is_some() { Ok(()) } else { Err(ToolError::ClientUnsupported(cap)) }
}

async fn elicit(cx: &dyn ToolContext, message: &str, schema: Value) -> Result<Value, ToolError> {
    require_capability(cx, "elicitation")?;
    let params = json!({ "mode": "form", "message": message, "requestedSchema": schema });
    cx.request("elicitation/create", params, CLIENT_TIMEOUT).await
}

/// What the user answered to an elicitation, as text for the model.
fn elicitation_summary(prefix: &str, r: &Value) -> String {
    let field = |k: &str| r.get(k).cloned().unwrap_or(Value::Null);
    format!("{prefix}: action={}, content={}", field("action"), field("content"))
}

/// A one-field form elicitation.
fn form(message: &str, field: &str, ty: &str) -> Value {
    json!({ "mode": "form", "message": message, "requestedSchema": {
        "type": "object", "properties": { field: { "type": ty } }, "required": [field] } })
}

/// A one-message sampling request.
fn sampling(prompt: &str) -> Value {
    json!({ "messages": [{ "role": "user", "content": { "type": "text", "text": prompt } }], "maxTokens": 50 })
}

fn sampled_text(r: &Value) -> String {
    r.get("content").and_then(|c| c.get("text")).and_then(Value::as_str).unwrap_or("").chars().take(200).collect()
}

fn roots_count(r: &Value) -> Result<usize, ToolError> {
    r.get("roots")
        .and_then(Value::as_array)
        .map(Vec::len)
        .ok_or_else(|| ToolError::InvalidParams("the roots/list answer must have a roots array".into()))
}

/// The value of `field` in an accepted elicitation; a declined one is a tool failure the model can read.
fn accepted_field(r: &Value, field: &str) -> Result<String, ToolError> {
    match r.get("action").and_then(Value::as_str) {
        Some("accept") => r
            .get("content")
            .and_then(|c| c.get(field))
            .filter(|v| !v.is_null())
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .ok_or_else(|| ToolError::InvalidParams(format!("the elicitation answer must carry content.{field}"))),
        Some(a @ ("decline" | "cancel")) => Err(ToolError::Failed(format!("the user chose {a}"))),
        _ => Err(ToolError::InvalidParams("the elicitation answer must have an action".into())),
    }
}

fn bounded_string(max: u64) -> Value {
    json!({ "type": "string", "maxLength": max })
}

#[async_trait]
impl Catalog for ConformanceCatalog {
    fn capabilities(&self) -> Value {
        json!({
            "tools": { "listChanged": true },
            "resources": { "subscribe": true, "listChanged": false },
            "prompts": { "listChanged": true },
            "logging": {},
            "completions": {},
        })
    }

    fn instructions(&self) -> Option<String> {
        Some("mcpfleet conformance fixtures".to_owned())
    }

    fn tools(&self) -> Vec<Value> {
        vec![
            no_args("test_simple_text", "Returns a simple text response"),
            no_args("test_image_content", "Returns an image"),
            no_args("test_audio_content", "Returns audio"),
            no_args("test_embedded_resource", "Returns an embedded resource"),
            no_args("test_multiple_content_types", "Returns text, an image and a resource"),
            no_args("test_tool_with_logging", "Sends three log messages while it runs"),
            no_args("test_tool_with_progress", "Reports progress three times while it runs"),
            no_args("test_error_handling", "Always fails, as a tool error"),
            tool(
                "test_sampling",
                "Asks the client's model to complete a prompt",
                closed(json!({ "prompt": bounded_string(4096) }), &["prompt"]),
            ),
            tool(
                "test_elicitation",
                "Asks the user for their details",
                closed(json!({ "message": bounded_string(1024) }), &["message"]),
            ),
            no_args("test_elicitation_sep1034_defaults", "Elicits a form whose fields have defaults (SEP-1034)"),
            no_args("test_elicitation_sep1330_enums", "Elicits a form with every enum style (SEP-1330)"),
            json!({
                "name": "json_schema_2020_12_tool",
                "description": "Tool with JSON Schema 2020-12 features",
                "inputSchema": {
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "object",
                    "$defs": { "address": { "$anchor": "addressDef", "type": "object", "properties": {
                        "street": bounded_string(256), "city": bounded_string(256) }, "additionalProperties": false } },
                    "properties": {
                        "name": bounded_string(256),
                        "address": { "$ref": "#/$defs/address" },
                        "contactMethod": { "type": "string", "enum": ["phone", "email"] },
                        "phone": bounded_string(64),
                        "email": bounded_string(256),
                    },
                    "allOf": [{ "anyOf": [{ "required": ["phone"] }, { "required": ["email"] }] }],
                    "if": { "properties": { "contactMethod": { "const": "phone" } }, "required": ["contactMethod"] },
                    "then": { "required": ["phone"] },
                    "else": { "required": ["email"] },
                    "additionalProperties": false,
                }
            }),
            no_args("test_reconnection", "Closes its SSE connection mid-call; the client resumes with Last-Event-ID"),
            tool(
                "test_countdown",
                "Reports progress `count` times, `interval_ms` apart, then answers (fleet resumption tests)",
                closed(
                    json!({ "count": { "type": "integer", "minimum": 1, "maximum": 1000 },
                            "interval_ms": { "type": "integer", "minimum": 0, "maximum": 10000 } }),
                    &["count", "interval_ms"],
                ),
            ),
            no_args(
                "test_update_watched_resource",
                "Changes test://watched-resource and notifies the session's stream",
            ),
            no_args("test_whoami", "Says who called, from the verified token (auth tests; needs fixtures:whoami)"),
            no_args(
                "test_missing_capability",
                "Asks the client for a sampling completion (needs the sampling capability)",
            ),
            no_args(
                "test_streaming_elicitation",
                "Asks the user for their name (an input request, never a stream request)",
            ),
            no_args("test_logging_tool", "Logs one message (sent only when the request asks for a log level)"),
            no_args(
                "test_trigger_tool_change",
                "Announces that the tool list changed (notifications/tools/list_changed)",
            ),
            no_args(
                "test_trigger_prompt_change",
                "Announces that the prompt list changed (notifications/prompts/list_changed)",
            ),
            no_args(
                "test_input_required_result_elicitation",
                "Asks the user for their name (user_name), then greets them",
            ),
            no_args("test_input_required_result_sampling", "Asks the client's model a question (capital_question)"),
            no_args("test_input_required_result_list_roots", "Asks the client for its roots (client_roots)"),
            no_args(
                "test_input_required_result_request_state",
                "Asks for a confirmation (confirm) and keeps state across the retry",
            ),
            no_args(
                "test_input_required_result_multiple_inputs",
                "Asks for a name, a completion and the roots in one round",
            ),
            no_args("test_input_required_result_multi_round", "Asks for a name (step1), then a colour (step2)"),
            no_args(
                "test_input_required_result_tampered_state",
                "Asks for a confirmation under a signed request state",
            ),
            no_args(
                "test_input_required_result_capabilities",
                "Asks only for the inputs the client declared it can give",
            ),
            tool(
                "test_header_param",
                "Echoes a region that is mirrored into the Mcp-Param-Region header (x-mcp-header)",
                closed(
                    json!({ "region": { "type": "string", "maxLength": 64, "x-mcp-header": "Region" } }),
                    &["region"],
                ),
            ),
            tool(
                "test_mint",
                "Mints a fresh random token after a delay (not idempotent: every run mints another; idempotency tests)",
                closed(json!({ "delay_ms": { "type": "integer", "minimum": 0, "maximum": 10000 } }), &["delay_ms"]),
            ),
            no_args("test_internal_error", "Fails inside, with an error full of internals (leak tests)"),
            no_args("test_panic", "Panics, with a message full of internals (leak tests)"),
            tool(
                "test_costly",
                "Stands for an expensive operation: at most 3 calls per hour per user (limits tests)",
                closed(json!({ "topic": bounded_string(64) }), &["topic"]),
            ),
        ]
    }

    async fn call_tool(&self, name: &str, args: JsonObject, cx: &dyn ToolContext) -> Result<Value, ToolError> {
        match name {
            "test_simple_text" => ok(vec![text("This is a simple text response for testing.")]),
            "test_image_content" => ok(vec![json!({ "type": "image", "data": PNG, "mimeType": "image/png" })]),
            "test_audio_content" => ok(vec![json!({ "type": "audio", "data": WAV, "mimeType": "audio/wav" })]),
            "test_embedded_resource" => ok(vec![json!({ "type": "resource", "resource": {
                "uri": "test://embedded-resource", "mimeType": "text/plain", "text": "This is an embedded resource content." } })]),
            "test_multiple_content_types" => ok(vec![
                text("Multiple content types test:"),
                json!({ "type": "image", "data": PNG, "mimeType": "image/png" }),
                json!({ "type": "resource", "resource": {
                    "uri": "test://mixed-content-resource", "mimeType": "application/json", "text": "{\"test\":\"data\",\"value\":123}" } }),
            ]),
            "test_tool_with_logging" => {
                for (i, m) in
                    ["Tool execution started", "Tool processing data", "Tool execution completed"].iter().enumerate()
                {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    cx.log("info", Some("test_tool_with_logging"), json!(m)).await?;
                }
                ok(vec![text("Logging test completed")])
            }
            "test_tool_with_progress" => {
                for (i, p) in [0.0, 50.0, 100.0].iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    cx.progress(*p, Some(100.0), Some(&format!("Completed step {}", i + 1))).await?;
                }
                ok(vec![text("Progress test completed")])
            }
            "test_error_handling" => Ok(
                json!({ "content": [text("This tool intentionally returns an error for testing")], "isError": true }),
            ),
            "test_sampling" => {
                let prompt = string_arg(&args, "prompt")?;
                require_capability(cx, "sampling")?;
                let params = json!({ "messages": [{ "role": "user", "content": { "type": "text", "text": prompt } }], "maxTokens": 100 });
                let r = cx.request("sampling/createMessage", params, CLIENT_TIMEOUT).await?;
                let reply = r.get("content").and_then(|c| c.get("text")).and_then(Value::as_str).unwrap_or("");
                ok(vec![text(format!("LLM response: {reply}"))])
            }
            "test_elicitation" => {
                let message = string_arg(&args, "message")?;
                let schema = json!({ "type": "object", "properties": {
                    "username": { "type": "string", "description": "User's response" },
                    "email": { "type": "string", "description": "User's email address" } }, "required": ["username", "email"] });
                let r = elicit(cx, message, schema).await?;
                ok(vec![text(elicitation_summary("User response", &r))])
            }
            "test_elicitation_sep1034_defaults" => {
                let schema = json!({ "type": "object", "properties": {
                    "name": { "type": "string", "description": "User name", "default": "John Doe" },
                    "age": { "type": "integer", "description": "User age", "default": 30 },
                    "score": { "type": "number", "description": "User score", "default": 95.5 },
                    "status": { "type": "string", "description": "User status", "enum": ["active", "inactive", "pending"], "default": "active" },
                    "verified": { "type": "boolean", "description": "Verification status", "default": true } }, "required": [] });
                let r = elicit(cx, "Please review and update the form fields with defaults", schema).await?;
                ok(vec![text(elicitation_summary("Elicitation completed", &r))])
            }
            "test_elicitation_sep1330_enums" => {
                let schema = json!({ "type": "object", "properties": {
                    "untitledSingle": { "type": "string", "description": "Select one option", "enum": ["option1", "option2", "option3"] },
                    "titledSingle": { "type": "string", "description": "Select one titled option", "oneOf": [
                        { "const": "value1", "title": "First Option" }, { "const": "value2", "title": "Second Option" }, { "const": "value3", "title": "Third Option" }] },
                    "legacyEnum": { "type": "string", "description": "Select one (legacy)", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"] },
                    "untitledMulti": { "type": "array", "description": "Select multiple options", "minItems": 1, "maxItems": 3, "items": { "type": "string", "enum": ["option1", "option2", "option3"] } },
                    "titledMulti": { "type": "array", "description": "Select multiple titled options", "minItems": 1, "maxItems": 3, "items": { "anyOf": [
                        { "const": "value1", "title": "First Choice" }, { "const": "value2", "title": "Second Choice" }, { "const": "value3", "title": "Third Choice" }] } } }, "required": [] });
                let r = elicit(cx, "Please select options from the enum fields", schema).await?;
                ok(vec![text(elicitation_summary("Elicitation completed", &r))])
            }
            "json_schema_2020_12_tool" => ok(vec![text(format!("Received: {}", Value::Object(args)))]),
            "test_reconnection" => {
                cx.close_connection(Duration::from_millis(500)).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
                ok(vec![text(
                    "Reconnection test completed successfully. If you received this, the client properly reconnected after stream closure.",
                )])
            }
            "test_countdown" => {
                let int = |n: &str, max: u64| {
                    args.get(n)
                        .and_then(Value::as_u64)
                        .filter(|v| *v <= max)
                        .ok_or_else(|| ToolError::InvalidParams(format!("arguments.{n} must be an integer <= {max}")))
                };
                let (count, interval) = (int("count", 1000)?, int("interval_ms", 10_000)?);
                for i in 1..=count {
                    tokio::time::sleep(Duration::from_millis(interval)).await;
                    #[expect(clippy::cast_precision_loss, reason = "count is at most 1000")]
                    cx.progress(i as f64, Some(count as f64), None).await?;
                }
                ok(vec![text(format!("counted to {count}"))])
            }
            "test_update_watched_resource" => {
                cx.notify_session("notifications/resources/updated", json!({ "uri": "test://watched-resource" }))
                    .await?;
                ok(vec![text("test://watched-resource updated")])
            }
            "test_whoami" => {
                let p = cx.principal();
                ok(vec![text(
                    json!({ "sub": p.subject, "iss": p.issuer, "client_id": p.client_id, "scopes": p.scopes.list() })
                        .to_string(),
                )])
            }
            "test_costly" => ok(vec![text(format!("report on {}", string_arg(&args, "topic")?))]),
            "test_missing_capability" => {
                let r = cx.ask("sample", "sampling/createMessage", sampling("Say hello."), CLIENT_TIMEOUT).await?;
                ok(vec![text(format!("LLM response: {}", sampled_text(&r)))])
            }
            "test_streaming_elicitation" | "test_input_required_result_elicitation" => {
                let r = cx
                    .ask(
                        "user_name",
                        "elicitation/create",
                        form("What is your name?", "name", "string"),
                        CLIENT_TIMEOUT,
                    )
                    .await?;
                ok(vec![text(format!("Hello, {}!", accepted_field(&r, "name")?))])
            }
            "test_logging_tool" => {
                cx.log("info", Some("test_logging_tool"), json!("the logging tool ran")).await?;
                ok(vec![text("logged one message")])
            }
            "test_trigger_tool_change" => {
                cx.notify_session("notifications/tools/list_changed", json!({})).await?;
                ok(vec![text("tools/list_changed sent")])
            }
            "test_trigger_prompt_change" => {
                cx.notify_session("notifications/prompts/list_changed", json!({})).await?;
                ok(vec![text("prompts/list_changed sent")])
            }
            "test_input_required_result_sampling" => {
                let q = sampling("What is the capital of France?");
                let r = cx.ask("capital_question", "sampling/createMessage", q, CLIENT_TIMEOUT).await?;
                ok(vec![text(format!("The model said: {}", sampled_text(&r)))])
            }
            "test_input_required_result_list_roots" => {
                let r = cx.ask("client_roots", "roots/list", json!({}), CLIENT_TIMEOUT).await?;
                ok(vec![text(format!("The client has {} roots.", roots_count(&r)?))])
            }
            "test_input_required_result_request_state" | "test_input_required_result_tampered_state" => {
                let r =
                    cx.ask("confirm", "elicitation/create", form("Confirm?", "ok", "boolean"), CLIENT_TIMEOUT).await?;
                accepted_field(&r, "ok")?;
                ok(vec![text("state-ok: confirmed")])
            }
            "test_input_required_result_multiple_inputs" => {
                let (name, greeting, roots) = futures::join!(
                    cx.ask(
                        "user_name",
                        "elicitation/create",
                        form("What is your name?", "name", "string"),
                        CLIENT_TIMEOUT
                    ),
                    cx.ask("greeting", "sampling/createMessage", sampling("Say a greeting."), CLIENT_TIMEOUT),
                    cx.ask("client_roots", "roots/list", json!({}), CLIENT_TIMEOUT),
                );
                let (name, greeting, roots) = (name?, greeting?, roots?);
                let name = accepted_field(&name, "name")?;
                ok(vec![text(format!("{} {name}; {} roots.", sampled_text(&greeting), roots_count(&roots)?))])
            }
            "test_input_required_result_multi_round" => {
                let name = cx
                    .ask("step1", "elicitation/create", form("What is your name?", "name", "string"), CLIENT_TIMEOUT)
                    .await?;
                let name = accepted_field(&name, "name")?;
                let colour = cx
                    .ask(
                        "step2",
                        "elicitation/create",
                        form("What is your favourite colour?", "color", "string"),
                        CLIENT_TIMEOUT,
                    )
                    .await?;
                ok(vec![text(format!("{name} likes {}.", accepted_field(&colour, "color")?))])
            }
            "test_input_required_result_capabilities" => {
                // One input request per capability the client declared, in one round; none it did not declare.
                let caps = cx.client_capabilities();
                let asks = [
                    ("elicitation", "user_name", "elicitation/create", form("What is your name?", "name", "string")),
                    ("sampling", "sample_input", "sampling/createMessage", sampling("Sample request")),
                    ("roots", "client_roots", "roots/list", json!({})),
                ];
                let asks: Vec<_> = asks
                    .into_iter()
                    .filter(|(cap, ..)| caps.get(*cap).is_some())
                    .map(|(_, key, method, params)| cx.ask(key, method, params, CLIENT_TIMEOUT))
                    .collect();
                if asks.is_empty() {
                    return Err(ToolError::ClientUnsupported("sampling"));
                }
                let answers = futures::future::join_all(asks).await.into_iter().collect::<Result<Vec<_>, _>>()?;
                ok(vec![text(format!("{} inputs received", answers.len()))])
            }
            "test_header_param" => ok(vec![text(format!("region {}", string_arg(&args, "region")?))]),
            "test_mint" => {
                let delay = args.get("delay_ms").and_then(Value::as_u64).unwrap_or(0).min(10_000);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let token: [u8; 12] = rand::random();
                let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
                ok(vec![text(format!("minted {token}"))])
            }
            "test_internal_error" => Err(ToolError::Internal(LEAKY_DETAIL.to_owned())),
            "test_panic" => panic!("{LEAKY_DETAIL}"),
            other => Err(ToolError::UnknownTool(other.chars().take(128).collect())),
        }
    }

    fn tool_quota(&self, tool: &str) -> Option<crate::Quota> {
        (tool == "test_costly").then_some(COSTLY_QUOTA)
    }

    fn tool_scopes(&self, tool: &str) -> Vec<String> {
        match tool {
            "test_whoami" => vec![WHOAMI_SCOPE.to_owned()],
            _ => Vec::new(),
        }
    }

    fn resources(&self) -> Vec<Value> {
        vec![
            json!({ "uri": "test://static-text", "name": "Static text resource", "description": "A static text resource", "mimeType": "text/plain" }),
            json!({ "uri": "test://static-binary", "name": "Static binary resource", "description": "A static PNG image", "mimeType": "image/png" }),
            json!({ "uri": "test://watched-resource", "name": "Watched resource", "description": "A resource that can be subscribed to", "mimeType": "text/plain" }),
        ]
    }

    fn resource_templates(&self) -> Vec<Value> {
        vec![
            json!({ "uriTemplate": "test://template/{id}/data", "name": "Template resource", "description": "Data for one id", "mimeType": "application/json" }),
        ]
    }

    async fn read_resource(&self, uri: &str) -> Result<Value, ToolError> {
        let one = |c: Value| Ok(json!({ "contents": [c] }));
        match uri {
            "test://static-text" => one(
                json!({ "uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource." }),
            ),
            "test://static-binary" => one(json!({ "uri": uri, "mimeType": "image/png", "blob": PNG })),
            "test://watched-resource" => {
                one(json!({ "uri": uri, "mimeType": "text/plain", "text": "Watched resource content" }))
            }
            _ => {
                if let Some(id) = uri.strip_prefix("test://template/").and_then(|r| r.strip_suffix("/data"))
                    && !id.is_empty()
                    && id.len() <= 64
                    && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    let body = json!({ "id": id, "templateTest": true, "data": format!("Data for ID: {id}") });
                    return one(json!({ "uri": uri, "mimeType": "application/json", "text": body.to_string() }));
                }
                Err(ToolError::ResourceNotFound(uri.chars().take(256).collect()))
            }
        }
    }

    fn prompts(&self) -> Vec<Value> {
        vec![
            json!({ "name": "test_simple_prompt", "description": "A simple prompt without arguments" }),
            json!({ "name": "test_prompt_with_arguments", "description": "A prompt with two arguments", "arguments": [
                { "name": "arg1", "description": "First argument", "required": true },
                { "name": "arg2", "description": "Second argument", "required": true }] }),
            json!({ "name": "test_prompt_with_embedded_resource", "description": "A prompt that embeds a resource", "arguments": [
                { "name": "resourceUri", "description": "URI of the resource to embed", "required": true }] }),
            json!({ "name": "test_prompt_with_image", "description": "A prompt with an image" }),
            json!({ "name": "test_input_required_result_prompt", "description": "A prompt that asks the user for context first" }),
        ]
    }

    async fn get_prompt_with(&self, name: &str, args: &JsonObject, cx: &dyn ToolContext) -> Result<Value, ToolError> {
        if name != "test_input_required_result_prompt" {
            return self.get_prompt(name, args).await;
        }
        let form = form("What context should the prompt use?", "context", "string");
        let r = cx.ask("user_context", "elicitation/create", form, CLIENT_TIMEOUT).await?;
        let context = accepted_field(&r, "context")?;
        Ok(json!({ "messages": [{ "role": "user", "content": text(format!("Answer with this context: {context}")) }] }))
    }

    async fn get_prompt(&self, name: &str, args: &JsonObject) -> Result<Value, ToolError> {
        let user = |content: Value| json!({ "role": "user", "content": content });
        let messages = match name {
            "test_simple_prompt" => vec![user(text("This is a simple prompt for testing."))],
            "test_prompt_with_arguments" => {
                let (a1, a2) = (string_arg(args, "arg1")?, string_arg(args, "arg2")?);
                vec![user(text(format!("Prompt with arguments: arg1='{a1}', arg2='{a2}'")))]
            }
            "test_prompt_with_embedded_resource" => {
                let uri = string_arg(args, "resourceUri")?;
                vec![
                    user(
                        json!({ "type": "resource", "resource": { "uri": uri, "mimeType": "text/plain", "text": "Embedded resource content for testing." } }),
                    ),
                    user(text("Please process the embedded resource above.")),
                ]
            }
            "test_prompt_with_image" => vec![
                user(json!({ "type": "image", "data": PNG, "mimeType": "image/png" })),
                user(text("Please analyze the image above.")),
            ],
            other => return Err(ToolError::UnknownPrompt(other.chars().take(128).collect())),
        };
        Ok(json!({ "messages": messages }))
    }

    async fn complete(&self, reference: &Value, argument: &Value) -> Result<Value, ToolError> {
        let prefix = argument.get("value").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> =
            match (reference.get("name").and_then(Value::as_str), argument.get("name").and_then(Value::as_str)) {
                (Some("test_prompt_with_arguments"), Some("arg1" | "arg2")) => {
                    ["paris", "park", "party", "test", "testing"]
                        .into_iter()
                        .filter(|v| v.starts_with(prefix))
                        .collect()
                }
                _ => Vec::new(),
            };
        Ok(json!({ "completion": { "values": values, "total": values.len(), "hasMore": false } }))
    }
}
