//! mcpfleet-tools is the closed-tool framework: the [`Catalog`] trait (everything the server offers: tools,
//! resources, prompts and completions), the [`ToolContext`] a running tool sees, [`Tool`] and [`Registry`], the
//! schema lint ([`lint`]) and the argument validator ([`validate`]) that the server runs on every catalog, the
//! untrusted-content [`envelope`], the tool parameters carried in HTTP headers ([`headers`]), what a tool sees of the
//! downstream APIs it calls for the user ([`downstream`]: plain data, no HTTP) and [`EmptyCatalog`].
//! It holds no catalog: the reference tools live in `mcpfleet-reference`, the conformance and open fixtures in
//! `mcpfleet-fixtures`, and this crate must never depend on either, so the framework never compiles a fixture.
//!
//! A tool sees the world only through [`ToolContext`]: the verified [`Principal`] that called it, progress,
//! logging, server→client requests, notifications to its session, and tokens and requests for the downstreams the
//! operator named. The transport implements that context over
//! the state crate, so a tool runs the same on any replica. It takes [`Principal`], [`Scopes`] and [`Quota`] from
//! `mcpfleet-core`, and must not depend on auth, limits, state, axum, HTTP, Redis or the transport.

pub mod downstream;
mod empty;
pub mod envelope;
pub mod headers;
pub mod lint;
pub mod schema;
pub mod tool;
pub mod validate;

pub use async_trait::async_trait;
pub use empty::EmptyCatalog;
pub use mcpfleet_core::{JsonObject, Principal, Quota, Scopes};
pub use schemars::{self, JsonSchema};
pub use tool::{Annotations, Registry, Tool, ToolInfo, ToolOutput};

use serde_json::Value;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why a catalog call or a context operation failed. The transport maps each kind to a JSON-RPC error or an
/// `isError` result; messages are safe to show.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("unknown tool: {0}")]
    UnknownTool(String),
    #[error("unknown prompt: {0}")]
    UnknownPrompt(String),
    #[error("resource not found: {0}")]
    ResourceNotFound(String),
    #[error("invalid params: {0}")]
    InvalidParams(String),
    #[error("the client does not support {0}")]
    ClientUnsupported(&'static str),
    #[error("tool failed")]
    Internal(String),
    /// A refusal the model can act on (not found, not ready): its message is shown, with the trace id.
    #[error("{0}")]
    Failed(String),
    #[error("the request was cancelled")]
    Cancelled,
    #[error("the client did not answer within {0:?}")]
    ClientTimeout(Duration),
    #[error("the client answered with error {code}: {message}")]
    ClientError { code: i64, message: String },
    #[error("the session is gone")]
    SessionGone,
    #[error("session state unavailable")]
    Unavailable,
    /// A dependency the tool needs (its database) is down or too slow: the model may try again later. The name is
    /// the only thing shown; `detail` (the driver's message) goes to the log line of the call, never to the model.
    #[error("{name} is unavailable right now; try again in a minute")]
    Dependency { name: &'static str, detail: String },
    /// A downstream token or request failed ([`downstream::DownstreamError`]): its message is shown, with the
    /// trace id.
    #[error(transparent)]
    Downstream(#[from] downstream::DownstreamError),
    /// The call cannot go on until the user completes a URL-mode elicitation (2025-11-25's `-32042` error); the
    /// value is the elicitation (`mode: "url"`, `elicitationId`, `url`, `message`). The transport sends it only to
    /// clients that declared `elicitation.url`.
    #[error("this request needs the user to complete an authorization first")]
    UrlElicitationRequired(serde_json::Value),
}

/// When a call of a tool becomes a durable task (the 2026-07-28 `io.modelcontextprotocol/tasks` extension). The
/// server decides, per tool; a client only says whether it can take a task (the extension in the request's
/// capabilities).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaskMode {
    /// Always answered inline.
    #[default]
    Never,
    /// A call still running after this long becomes a task, if the request declared the extension; else it stays
    /// inline. Input it asks for before then is gathered with multi round-trip requests, synchronously.
    After(Duration),
    /// A 2026-07-28 call is queued as a task at once; a request without the extension is refused (missing client
    /// capability). A 2025-generation session runs it inline.
    Always,
}

/// A tool's task policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskSupport {
    pub mode: TaskMode,
    /// Safe to run again from the start when the replica running it dies (at-least-once). A task whose tool is
    /// not ends `failed` instead, saying the work may be half done.
    pub rerunnable: bool,
}

/// MCP log levels, lowest first.
pub const LOG_LEVELS: [&str; 8] = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"];

/// What a running tool call can do besides returning its result.
#[async_trait]
pub trait ToolContext: Send + Sync {
    /// Sends `notifications/progress` for this call, if the caller asked for progress (a `progressToken`).
    async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) -> Result<(), ToolError>;

    /// Sends `notifications/message` on this call's stream, if `level` is at or above the session's level.
    async fn log(&self, level: &str, logger: Option<&str>, data: Value) -> Result<(), ToolError>;

    /// Sends a server→client request (`sampling/createMessage`, `elicitation/create`, `roots/list`) on this
    /// call's stream and waits for the client's result, whichever replica the client answers through. It waits
    /// at most `timeout`, capped by the server's configured limit, then sends `notifications/cancelled`.
    async fn request(&self, method: &str, params: Value, timeout: Duration) -> Result<Value, ToolError>;

    /// [`request`](Self::request) under a key the tool chooses. In the 2026-07-28 generation, input requests are
    /// multi round-trip requests: the call ends with an `InputRequiredResult` whose `inputRequests` has this key,
    /// and the handler runs again, from the start, when the client retries with the answers; this returns the
    /// answer then. So a handler must do nothing it cannot repeat before its input requests. To ask for several
    /// inputs in one round, await them together (`futures::join!`). The 2025 generation ignores the key.
    async fn ask(&self, _key: &str, method: &str, params: Value, timeout: Duration) -> Result<Value, ToolError> {
        self.request(method, params, timeout).await
    }

    /// Sends a notification to the session's standalone (GET) stream, wherever it is held.
    async fn notify_session(&self, method: &str, params: Value) -> Result<(), ToolError>;

    /// Closes the client's connection to this call's stream (after a `retry:` hint) without ending the stream;
    /// the client resumes with `Last-Event-ID`.
    async fn close_connection(&self, retry: Duration) -> Result<(), ToolError>;

    /// The client's declared capabilities.
    fn client_capabilities(&self) -> &Value;

    /// Who called: the verified principal of the request (never anything from the arguments).
    fn principal(&self) -> &Principal;

    /// Fires when the client cancels this call or its session ends.
    fn cancelled(&self) -> CancellationToken;

    /// An access token for the downstream the operator named `name`, issued for the verified caller
    /// (docs/DOWNSTREAM.md). The default, for contexts without downstream access, answers
    /// [`DownstreamError::Unsupported`](downstream::DownstreamError::Unsupported).
    async fn downstream_token(&self, _name: &str) -> Result<downstream::DownstreamToken, ToolError> {
        Err(downstream::DownstreamError::Unsupported.into())
    }

    /// Sends `request` to the downstream named `name` with a token for the caller; use it through
    /// [`downstream`](trait.ToolContext.html#method.downstream). On a 401 the token is dropped and the request is
    /// sent once more with a fresh one. The default answers
    /// [`DownstreamError::Unsupported`](downstream::DownstreamError::Unsupported).
    async fn downstream_send(
        &self,
        _name: &str,
        _request: downstream::DownstreamRequest,
    ) -> Result<downstream::DownstreamResponse, ToolError> {
        Err(downstream::DownstreamError::Unsupported.into())
    }
}

impl dyn ToolContext + '_ {
    /// The downstream the operator named `name`, for requests with the caller's token for it attached:
    /// `cx.downstream("calendar").get_json("/events", &[("days", "7")]).await?`.
    #[must_use]
    pub fn downstream<'a>(&'a self, name: &'a str) -> downstream::Downstream<'a> {
        downstream::Downstream::new(self, name)
    }
}

/// Everything the server offers to a session.
#[async_trait]
pub trait Catalog: Send + Sync + std::fmt::Debug {
    /// The `capabilities` of the initialize result.
    fn capabilities(&self) -> Value;

    /// Optional `instructions` for the initialize result.
    fn instructions(&self) -> Option<String> {
        None
    }

    /// The tool definitions, in a deterministic order.
    fn tools(&self) -> Vec<Value>;

    /// The scopes a caller needs to see and call `tool`. The transport checks them before the call runs and hides
    /// the tool from `tools/list` for callers without them; the operator can add more (`--tool-scope`).
    fn tool_scopes(&self, _tool: &str) -> Vec<String> {
        Vec::new()
    }

    /// The tool's own quota per principal (at most this many calls per window), for expensive tools. The limits
    /// crate enforces it across the fleet; the operator can override it (`--quota TOOL=LIMIT/WINDOW`, or `off`).
    fn tool_quota(&self, _tool: &str) -> Option<Quota> {
        None
    }

    /// How long `tool` may run before it is stopped (an `isError` result); `None` takes the operator's default
    /// (`--tool-timeout`).
    fn tool_timeout(&self, _tool: &str) -> Option<Duration> {
        None
    }

    /// Whether and when a call of `tool` becomes a task (see [`TaskMode`]).
    fn tool_task(&self, _tool: &str) -> TaskSupport {
        TaskSupport::default()
    }

    /// Runs one tool.
    ///
    /// # Errors
    /// [`ToolError::UnknownTool`] and [`ToolError::InvalidParams`] are protocol errors; the others become an
    /// `isError` result.
    async fn call_tool(&self, name: &str, args: JsonObject, cx: &dyn ToolContext) -> Result<Value, ToolError>;

    fn resources(&self) -> Vec<Value> {
        Vec::new()
    }

    fn resource_templates(&self) -> Vec<Value> {
        Vec::new()
    }

    /// # Errors
    /// [`ToolError::ResourceNotFound`].
    async fn read_resource(&self, uri: &str) -> Result<Value, ToolError> {
        Err(ToolError::ResourceNotFound(uri.to_owned()))
    }

    fn prompts(&self) -> Vec<Value> {
        Vec::new()
    }

    /// # Errors
    /// [`ToolError::UnknownPrompt`] or [`ToolError::InvalidParams`].
    async fn get_prompt(&self, name: &str, _args: &JsonObject) -> Result<Value, ToolError> {
        Err(ToolError::UnknownPrompt(name.to_owned()))
    }

    /// `prompts/get` with a context, for prompts that ask the client for input ([`ToolContext::ask`]; 2026-07-28
    /// multi round-trip requests). Defaults to [`get_prompt`](Self::get_prompt).
    ///
    /// # Errors
    /// As [`get_prompt`](Self::get_prompt).
    async fn get_prompt_with(&self, name: &str, args: &JsonObject, _cx: &dyn ToolContext) -> Result<Value, ToolError> {
        self.get_prompt(name, args).await
    }

    /// `completion/complete`: `reference` is `params.ref`, `argument` is `params.argument`.
    ///
    /// # Errors
    /// [`ToolError::InvalidParams`].
    async fn complete(&self, _reference: &Value, _argument: &Value) -> Result<Value, ToolError> {
        Ok(serde_json::json!({ "completion": { "values": [], "hasMore": false } }))
    }
}
