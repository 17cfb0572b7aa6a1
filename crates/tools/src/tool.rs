//! The `Tool` trait and the `Registry` that serves tools as a [`Catalog`]. A tool is a name, a closed input
//! schema, a typed argument struct (`#[serde(deny_unknown_fields)]`), annotations, scopes, an optional quota and
//! timeout, a task policy, and an async handler. The registry refuses to register a tool whose name is not
//! `[A-Za-z0-9_.-]{1,128}` or is taken, lists tools in name order, validates `structuredContent` against a declared
//! output schema before it is sent (a mismatch is a server bug: logged, and an `isError` result), and hands the
//! transport everything it enforces (scopes, quota, timeout, task policy). The transport validates the arguments
//! against the published input schema before [`Catalog::call_tool`] runs.

use crate::{Catalog, JsonObject, Quota, TaskSupport, ToolContext, ToolError};
use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

/// MCP tool annotations: hints for clients, set truthfully. Build them with [`ToolInfo`]'s setters
/// ([`read_only`](ToolInfo::read_only), [`destructive`](ToolInfo::destructive), ...).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Annotations {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

/// Everything a tool declares: its name and what differs from the defaults, set with chained calls. Strings are
/// owned, so a tool can be built from configuration. Unless [`input_schema`](Self::input_schema) gives one by hand,
/// the input schema is derived from the tool's [`Tool::Args`] when it is registered ([`crate::schema::derive`]),
/// and that document is the one `tools/list` publishes and every call is validated against.
///
/// ```
/// use mcpfleet_tools::{Quota, ToolInfo};
/// use std::time::Duration;
///
/// let info = ToolInfo::new("order_status")
///     .title("Order status")
///     .description("The status of one of the calling user's orders.")
///     .read_only()
///     .scopes(["orders:read"])
///     .quota(Quota::new(100, Duration::from_secs(3600)));
/// assert_eq!(info.scopes, ["orders:read"]);
/// assert!(info.input_schema.is_none(), "derived from the tool's Args at registration");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ToolInfo {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    /// A hand-written input schema; `None` derives it from [`Tool::Args`].
    pub input_schema: Option<Value>,
    pub output_schema: Option<Value>,
    pub annotations: Annotations,
    /// Scopes a caller needs to see and call it.
    pub scopes: Vec<String>,
    pub quota: Option<Quota>,
    pub timeout: Option<Duration>,
    /// Whether and when a call becomes a task ([`crate::TaskMode`]); `TaskSupport::default()` answers inline.
    pub task: TaskSupport,
}

impl ToolInfo {
    /// A tool named `name` (`[A-Za-z0-9_.-]{1,128}`, checked at registration) with every default: no title or
    /// description, the input schema derived from its arguments, no output schema, every annotation false, no
    /// scopes, no quota, the server's timeout, answered inline.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            title: None,
            description: None,
            input_schema: None,
            output_schema: None,
            annotations: Annotations::default(),
            scopes: Vec::new(),
            quota: None,
            timeout: None,
            task: TaskSupport::default(),
        }
    }

    /// A human-readable name (`title`, also the annotations' title).
    #[must_use]
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// What the tool does, for the model.
    #[must_use]
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// A hand-written input schema instead of the derived one, for a bound schemars cannot express. It is linted
    /// and enforced like a derived one; it must still describe what [`Tool::Args`] accepts.
    #[must_use]
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = Some(schema);
        self
    }

    /// The output schema, derived from `O` (a `Serialize + JsonSchema` type); `structuredContent` is checked
    /// against it before anything is sent.
    #[must_use]
    pub fn output<O: schemars::JsonSchema>(self) -> Self {
        self.output_schema(crate::schema::derive::<O>())
    }

    /// A hand-written output schema.
    #[must_use]
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// `readOnlyHint`: the tool changes nothing.
    #[must_use]
    pub fn read_only(mut self) -> Self {
        self.annotations.read_only = true;
        self
    }

    /// `destructiveHint`: the tool may delete or overwrite.
    #[must_use]
    pub fn destructive(mut self) -> Self {
        self.annotations.destructive = true;
        self
    }

    /// `idempotentHint`: calling it twice with the same arguments does no more than once.
    #[must_use]
    pub fn idempotent(mut self) -> Self {
        self.annotations.idempotent = true;
        self
    }

    /// `openWorldHint`: the tool reaches outside the server (the internet, another service).
    #[must_use]
    pub fn open_world(mut self) -> Self {
        self.annotations.open_world = true;
        self
    }

    /// Scopes a caller needs to see and call it (on top of what the operator adds with `--tool-scope`).
    #[must_use]
    pub fn scopes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, scopes: I) -> Self {
        self.scopes = scopes.into_iter().map(Into::into).collect();
        self
    }

    /// The tool's own quota per principal, enforced across the fleet (the operator may override it).
    #[must_use]
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quota = Some(quota);
        self
    }

    /// How long a call may run before it is stopped (an `isError` result); unset, `--tool-timeout`.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Whether and when a call becomes a task.
    #[must_use]
    pub fn task(mut self, task: TaskSupport) -> Self {
        self.task = task;
        self
    }
}

/// What a handler returns: content blocks, and structured content when it declares an output schema.
#[derive(Clone, Debug, Default)]
pub struct ToolOutput {
    pub content: Vec<Value>,
    pub structured: Option<Value>,
}

impl ToolOutput {
    /// One text block.
    #[must_use]
    pub fn text(t: impl Into<String>) -> Self {
        Self { content: vec![json!({ "type": "text", "text": t.into() })], structured: None }
    }

    /// Content users or third parties wrote, in the untrusted envelope.
    #[must_use]
    pub fn untrusted(source: &str, items: &[crate::envelope::Item]) -> Self {
        Self::text(crate::envelope::wrap(source, items))
    }

    #[must_use]
    pub fn with_structured(mut self, v: Value) -> Self {
        self.structured = Some(v);
        self
    }
}

/// A tool with typed arguments.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// The arguments: `#[derive(Deserialize, JsonSchema)]` with `#[serde(deny_unknown_fields)]`, every string,
    /// number and list bounded by a `#[schemars(...)]` attribute. Its derived schema is the published input schema,
    /// unless [`ToolInfo::input_schema`] gives one by hand.
    type Args: DeserializeOwned + schemars::JsonSchema + Send;

    fn info(&self) -> ToolInfo;

    /// Runs the tool for the verified caller (`cx.principal()`), never for anyone the arguments name.
    ///
    /// # Errors
    /// A [`ToolError`]; `Internal` details are logged and never shown.
    async fn call(&self, args: Self::Args, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError>;
}

#[async_trait]
trait Erased: Send + Sync {
    async fn call(&self, args: JsonObject, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError>;
}

struct Typed<T>(T);

#[async_trait]
impl<T: Tool> Erased for Typed<T> {
    async fn call(&self, args: JsonObject, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
        // The transport validated the arguments against the schema; this only fails if the struct and the schema
        // disagree, which is a bug in the tool.
        let args: T::Args = serde_json::from_value(Value::Object(args))
            .map_err(|e| ToolError::Internal(format!("arguments passed the schema but not the struct: {e}")))?;
        self.0.call(args, cx).await
    }
}

struct Entry {
    info: ToolInfo,
    listed: Value,
    output: Option<jsonschema::Validator>,
    run: Box<dyn Erased>,
}

/// Tools served as a catalog.
#[derive(Default)]
pub struct Registry {
    tools: BTreeMap<String, Entry>,
    instructions: Option<String>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("tools", &self.tools.keys().collect::<Vec<_>>()).finish()
    }
}

/// A valid MCP tool name.
#[must_use]
pub fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

impl Registry {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    #[must_use]
    pub fn with_instructions(mut self, text: impl Into<String>) -> Self {
        self.instructions = Some(text.into());
        self
    }

    /// Adds a tool. Its input schema is [`ToolInfo::input_schema`] if it has one, else derived from
    /// [`Tool::Args`]. The server lints every schema at start-up ([`crate::lint`]); this does not.
    ///
    /// # Errors
    /// A name that is not `[A-Za-z0-9_.-]{1,128}` or already taken, or an output schema that does not compile.
    pub fn register<T: Tool>(&mut self, tool: T) -> Result<&mut Self, String> {
        let info = tool.info();
        if !valid_name(&info.name) {
            return Err(format!("tool name {:?} is not [A-Za-z0-9_.-]{{1,128}}", info.name));
        }
        if self.tools.contains_key(&info.name) {
            return Err(format!("tool {} is registered twice", info.name));
        }
        let output = match &info.output_schema {
            Some(s) => Some(
                crate::validate::options()
                    .build(s)
                    .map_err(|e| format!("{}: the output schema does not compile: {e}", info.name))?,
            ),
            None => None,
        };
        let input = info.input_schema.clone().unwrap_or_else(crate::schema::derive::<T::Args>);
        let a = info.annotations;
        let mut annotations = json!({ "readOnlyHint": a.read_only, "destructiveHint": a.destructive,
                                      "idempotentHint": a.idempotent, "openWorldHint": a.open_world });
        let mut listed = json!({ "name": info.name, "inputSchema": input });
        if let Some(t) = &info.title {
            listed["title"] = json!(t);
            annotations["title"] = json!(t);
        }
        if let Some(d) = &info.description {
            listed["description"] = json!(d);
        }
        listed["annotations"] = annotations;
        if let Some(o) = &info.output_schema {
            listed["outputSchema"] = o.clone();
        }
        self.tools.insert(info.name.clone(), Entry { info, listed, output, run: Box::new(Typed(tool)) });
        Ok(self)
    }

    /// The input schema `tool` publishes (hand-written or derived), if it is registered.
    #[must_use]
    pub fn input_schema(&self, tool: &str) -> Option<&Value> {
        self.tools.get(tool).map(|e| &e.listed["inputSchema"])
    }

    /// Whether no tool is registered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

#[async_trait]
impl Catalog for Registry {
    fn capabilities(&self) -> Value {
        json!({ "tools": { "listChanged": false } })
    }

    fn instructions(&self) -> Option<String> {
        self.instructions.clone()
    }

    fn tools(&self) -> Vec<Value> {
        self.tools.values().map(|e| e.listed.clone()).collect()
    }

    fn tool_scopes(&self, tool: &str) -> Vec<String> {
        self.tools.get(tool).map(|e| e.info.scopes.clone()).unwrap_or_default()
    }

    fn tool_quota(&self, tool: &str) -> Option<Quota> {
        self.tools.get(tool).and_then(|e| e.info.quota)
    }

    fn tool_timeout(&self, tool: &str) -> Option<Duration> {
        self.tools.get(tool).and_then(|e| e.info.timeout)
    }

    fn tool_task(&self, tool: &str) -> TaskSupport {
        self.tools.get(tool).map(|e| e.info.task).unwrap_or_default()
    }

    async fn call_tool(&self, name: &str, args: JsonObject, cx: &dyn ToolContext) -> Result<Value, ToolError> {
        let Some(entry) = self.tools.get(name) else {
            return Err(ToolError::UnknownTool(name.chars().take(128).collect()));
        };
        let out = entry.run.call(args, cx).await?;
        let mut result = json!({ "content": out.content });
        match (&entry.output, out.structured) {
            (Some(v), Some(s)) => {
                if let Err(e) = v.validate(&s) {
                    // A server bug: the model gets a generic failure, the log the mismatch.
                    return Err(ToolError::Internal(format!(
                        "structuredContent does not match the output schema at {}: {e}",
                        e.instance_path().as_str()
                    )));
                }
                result["structuredContent"] = s;
            }
            (Some(_), None) => {
                return Err(ToolError::Internal(
                    "the tool declares an output schema but sent no structuredContent".into(),
                ));
            }
            (None, Some(s)) => result["structuredContent"] = s,
            (None, None) => {}
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Principal, Scopes, TaskMode};
    use serde::Deserialize;
    use tokio_util::sync::CancellationToken;

    struct Cx(Principal);

    #[async_trait]
    impl ToolContext for Cx {
        async fn progress(&self, _: f64, _: Option<f64>, _: Option<&str>) -> Result<(), ToolError> {
            Ok(())
        }
        async fn log(&self, _: &str, _: Option<&str>, _: Value) -> Result<(), ToolError> {
            Ok(())
        }
        async fn request(&self, _: &str, _: Value, _: Duration) -> Result<Value, ToolError> {
            Err(ToolError::ClientUnsupported("requests"))
        }
        async fn notify_session(&self, _: &str, _: Value) -> Result<(), ToolError> {
            Ok(())
        }
        async fn close_connection(&self, _: Duration) -> Result<(), ToolError> {
            Ok(())
        }
        fn client_capabilities(&self) -> &Value {
            &Value::Null
        }
        fn principal(&self) -> &Principal {
            &self.0
        }
        fn cancelled(&self) -> CancellationToken {
            CancellationToken::new()
        }
    }

    /// Answers with whatever structured content it is given, against an output schema.
    struct Echo;

    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct EchoArgs {
        #[schemars(range(min = -9, max = 9))]
        n: i64,
    }

    #[async_trait]
    impl Tool for Echo {
        type Args = EchoArgs;
        fn info(&self) -> ToolInfo {
            ToolInfo::new("echo")
                .title("Echo")
                .description("Echoes n as structured content")
                .output_schema(json!({ "type": "object", "properties": { "n": { "type": "integer", "minimum": 0 } },
                                       "required": ["n"], "additionalProperties": false }))
                .read_only()
                .scopes(["tools:read"])
                .timeout(Duration::from_secs(2))
                .task(TaskSupport { mode: TaskMode::After(Duration::from_secs(1)), rerunnable: true })
        }
        async fn call(&self, a: EchoArgs, _cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::text("ok").with_structured(json!({ "n": a.n })))
        }
    }

    fn cx() -> Cx {
        Cx(Principal {
            user: mcpfleet_core::UserKey::new("u").expect("key"),
            issuer: "i".into(),
            subject: "s".into(),
            client_id: None,
            scopes: Scopes::All,
            tenant: None,
            claims: std::sync::Arc::default(),
            plan: None,
            token_id: None,
            proof: None,
            bound_to: None,
        })
    }

    #[tokio::test]
    async fn the_registry_lists_in_order_and_checks_structured_content() {
        let mut r = Registry::new();
        r.register(Echo).expect("register");
        assert!(r.register(Echo).is_err(), "a name is registered once");
        let listed = r.tools();
        assert_eq!(listed[0]["name"], "echo");
        assert_eq!(listed[0]["annotations"]["readOnlyHint"], true);
        assert_eq!(listed[0]["outputSchema"]["required"], json!(["n"]));
        let derived = &listed[0]["inputSchema"];
        assert_eq!(derived["additionalProperties"], false, "deny_unknown_fields closes it: {derived}");
        assert_eq!(
            (&derived["properties"]["n"]["minimum"], &derived["properties"]["n"]["maximum"]),
            (&json!(-9), &json!(9))
        );
        assert_eq!(r.input_schema("echo"), Some(derived));
        assert!(crate::lint::lint_tool(&listed[0]).is_empty(), "{:?}", crate::lint::lint_tool(&listed[0]));
        assert_eq!(r.tool_scopes("echo"), vec!["tools:read".to_owned()]);
        assert_eq!(r.tool_timeout("echo"), Some(Duration::from_secs(2)));
        let task = TaskSupport { mode: TaskMode::After(Duration::from_secs(1)), rerunnable: true };
        assert_eq!(r.tool_task("echo"), task);
        assert_eq!(r.tool_task("nope"), TaskSupport::default(), "an unknown tool is never a task");
        let args = |n: i64| json!({ "n": n }).as_object().cloned().expect("object");
        let ok = r.call_tool("echo", args(3), &cx()).await.expect("ok");
        assert_eq!(ok["structuredContent"], json!({ "n": 3 }));
        // Output that breaks the declared schema is a server bug: an internal error, never sent.
        match r.call_tool("echo", args(-1), &cx()).await {
            Err(ToolError::Internal(detail)) => assert!(detail.contains("/n"), "{detail}"),
            other => panic!("expected an internal error, got {other:?}"),
        }
        assert!(matches!(r.call_tool("nope", args(1), &cx()).await, Err(ToolError::UnknownTool(_))));
        assert!(!valid_name("has space") && !valid_name("") && valid_name("a.b-c_D9"));
        // A schema written by hand is published (and so enforced) instead of the derived one.
        struct Hand;
        #[async_trait]
        impl Tool for Hand {
            type Args = EchoArgs;
            fn info(&self) -> ToolInfo {
                ToolInfo::new("hand").input_schema(json!({ "type": "object", "additionalProperties": false,
                    "properties": { "n": { "type": "integer", "minimum": 0, "maximum": 3 } }, "required": ["n"] }))
            }
            async fn call(&self, a: EchoArgs, _cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
                Ok(ToolOutput::text(a.n.to_string()))
            }
        }
        r.register(Hand).expect("register");
        let hand = r.input_schema("hand").expect("listed");
        assert_eq!(hand["properties"]["n"]["maximum"], 3, "{hand}");
        assert!(hand.get("$schema").is_none(), "not the derived document: {hand}");
        assert!(r.tools().iter().any(|t| t["name"] == "hand" && &t["inputSchema"] == hand));
        assert!(r.tools().iter().all(|t| t["name"] != "hand" || t.get("title").is_none()), "no title unless given");
    }
}
