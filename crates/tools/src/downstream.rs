//! What a tool sees of the downstream APIs the operator named (`--downstreams FILE`, docs/DOWNSTREAM.md): a token
//! issued for one downstream and for the verified caller ([`ToolContext::downstream_token`]), and a request to that
//! downstream with the token attached ([`Downstream`], from [`ToolContext::downstream`]). A tool names a downstream
//! by its configured name and gives a path under its configured base URL: it never chooses a host, an audience or
//! a token, and it never sees the caller's own token.
//!
//! The types here are plain data; the HTTP client, the token cache and the authorization flows live in
//! `mcpfleet-downstream`, behind the transport's context.
//!
//! ```
//! use mcpfleet_tools::downstream::DownstreamRequest;
//!
//! let r = DownstreamRequest::get("/events").query("days", "7");
//! assert_eq!(r.path, "/events");
//! assert_eq!(r.query, [("days".to_owned(), "7".to_owned())]);
//! ```

use crate::{ToolContext, ToolError};
use serde_json::Value;

/// An access token for one downstream, for the verified caller. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct DownstreamToken(String);

impl DownstreamToken {
    #[must_use]
    pub fn new(token: String) -> Self {
        Self(token)
    }

    /// The token, for an `Authorization: Bearer` header the tool builds itself.
    #[must_use]
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DownstreamToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DownstreamToken(..)")
    }
}

/// The methods a tool may send to a downstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
        }
    }
}

/// A request to a named downstream: a path under its base URL (`/` first; no scheme, host, `..` or `#`), query
/// pairs (encoded when sent) and an optional JSON body.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DownstreamRequest {
    pub method: Method,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub json: Option<Value>,
}

impl DownstreamRequest {
    #[must_use]
    pub fn new(method: Method, path: impl Into<String>) -> Self {
        Self { method, path: path.into(), query: Vec::new(), json: None }
    }

    #[must_use]
    pub fn get(path: impl Into<String>) -> Self {
        Self::new(Method::Get, path)
    }

    #[must_use]
    pub fn post(path: impl Into<String>, body: Value) -> Self {
        Self::new(Method::Post, path).json(body)
    }

    /// Adds a query pair.
    #[must_use]
    pub fn query(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.query.push((name.into(), value.into()));
        self
    }

    /// Sends `body` as `application/json`.
    #[must_use]
    pub fn json(mut self, body: Value) -> Self {
        self.json = Some(body);
        self
    }
}

/// The downstream's answer, whatever its status (a tool decides what a 404 means); its body is capped by the
/// downstream's `max_response_bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DownstreamResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl DownstreamResponse {
    #[must_use]
    pub fn new(status: u16, content_type: Option<String>, body: Vec<u8>) -> Self {
        Self { status, content_type, body }
    }

    #[must_use]
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as JSON.
    ///
    /// # Errors
    /// [`ToolError::Internal`] when it is not JSON (the downstream broke its contract; logged, never shown).
    pub fn json(&self) -> Result<Value, ToolError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ToolError::Internal(format!("the downstream's answer ({}) is not JSON: {e}", self.status)))
    }
}

/// Why a downstream token or request could not be had. Each message is what the model reads (with the trace id);
/// none carries a token, a URL or the authorization server's own words.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DownstreamError {
    /// The context gives no downstream access (a context without a caller's request, or a server without
    /// `--downstreams`).
    #[error("this server gives tools no access to other services")]
    Unsupported,
    /// The tool named a downstream the server does not configure (a bug of the tool or of the deployment).
    #[error("{0} is not a service this server is configured to reach")]
    Unknown(String),
    /// A task run has no caller's request, so no token to exchange (docs/DOWNSTREAM.md, "Tasks").
    #[error("{0} can only be reached while the caller's request is open; this tool cannot use it in a task")]
    NeedsCallerRequest(String),
    /// The authorization server is down, slow, or answered something that is not a token; or it failed within
    /// the negative-cache interval.
    #[error("signing in to {0} is unavailable right now; try again in a minute")]
    Unavailable(String),
    /// The authorization server refused to issue a token for this caller.
    #[error("{0} refused access for this user")]
    Refused(String),
    /// The downstream did not answer (a connection error or its timeout), or answered more than it may.
    #[error("{0} did not answer; try again in a minute")]
    NoAnswer(String),
    /// The tool's request is not one a downstream may be sent (a path outside its base URL).
    #[error("the request to {0} is not allowed: {1}")]
    BadRequest(String, &'static str),
    /// The downstream needs the user's own authorization (URL mode) and none is stored: the transport asks the
    /// client for it (URL-mode elicitation), or, for a client that cannot, answers [`Self::CannotAuthorize`].
    #[error("{} needs the user's authorization", .0.downstream)]
    AuthorizationRequired(Box<AuthorizationRequest>),
    /// The downstream needs the user's own authorization, and this client cannot ask for it.
    #[error(
        "{0} needs the user's own authorization, which this client cannot ask for (it does not support URL-mode \
         elicitation)"
    )]
    CannotAuthorize(String),
    /// The client was asked for the user's authorization, and the user has not finished it.
    #[error("the user has not finished authorizing {0}; ask them to, then try again")]
    NotAuthorizedYet(String),
    /// The user declined to authorize the downstream.
    #[error("the user declined to authorize {0}")]
    Declined(String),
}

/// An authorization to ask the user for (URL-mode elicitation): where to send them, and the id the client and the
/// completion notice name it by. The URL carries no credential and no personal data: only the single-use id.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuthorizationRequest {
    pub downstream: String,
    pub elicitation_id: String,
    pub url: String,
}

impl AuthorizationRequest {
    #[must_use]
    pub fn new(downstream: String, elicitation_id: String, url: String) -> Self {
        Self { downstream, elicitation_id, url }
    }

    /// What the client shows the user.
    #[must_use]
    pub fn message(&self) -> String {
        format!("Authorize access to {} for this tool.", self.downstream)
    }

    /// The URL-mode elicitation (`elicitation/create` params, and an entry of the -32042 error's `elicitations`).
    #[must_use]
    pub fn elicitation(&self) -> Value {
        serde_json::json!({
            "mode": "url",
            "elicitationId": self.elicitation_id,
            "url": self.url,
            "message": self.message(),
        })
    }
}

/// A named downstream, seen from a running tool: requests go to its base URL with a token for the caller.
pub struct Downstream<'a> {
    cx: &'a dyn ToolContext,
    name: &'a str,
}

impl<'a> Downstream<'a> {
    #[must_use]
    pub fn new(cx: &'a dyn ToolContext, name: &'a str) -> Self {
        Self { cx, name }
    }

    /// Sends `request` with a token for the caller. On a 401 the token is dropped and the request is sent once more
    /// with a fresh one; the answer, whatever its status, is the tool's to read.
    ///
    /// # Errors
    /// [`ToolError::Downstream`] when no token can be had or the downstream does not answer.
    pub async fn send(&self, request: DownstreamRequest) -> Result<DownstreamResponse, ToolError> {
        self.cx.downstream_send(self.name, request).await
    }

    /// `GET path`, answered 2xx with JSON.
    ///
    /// # Errors
    /// As [`send`](Self::send); any other status is [`ToolError::Internal`] (logged with the status).
    pub async fn get_json(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, ToolError> {
        let mut r = DownstreamRequest::get(path);
        for (k, v) in query {
            r = r.query(*k, *v);
        }
        let answer = self.send(r).await?;
        if !answer.is_success() {
            return Err(ToolError::Internal(format!("{} answered {} to GET {path}", self.name, answer.status)));
        }
        answer.json()
    }
}

impl std::fmt::Debug for Downstream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Downstream").field("name", &self.name).finish_non_exhaustive()
    }
}
