//! The downstream crate's one error: a refused document or secret, or why an exchange did not give a token. Its
//! messages go to the log and the operator; what the model reads is [`mcpfleet_tools::downstream::DownstreamError`],
//! which [`OAuthError::for_tool`] picks without any of this text.

use mcpfleet_tools::downstream::DownstreamError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OAuthError {
    /// Not YAML, or YAML with a duplicate key.
    #[error("not a downstreams document: {0}")]
    Syntax(String),
    /// A place the schema (or a check after it) refuses.
    #[error("{pointer}: expected {expected}")]
    Schema { pointer: String, expected: String },
    /// A secret the document names could not be read (the reference, never the value).
    #[error("{pointer}: {what}")]
    Secret { pointer: String, what: String },
    /// The HTTP client could not be built.
    #[error("http client: {0}")]
    Client(String),
    /// The token endpoint did not answer (connection refused, timeout, reset).
    #[error("the token endpoint did not answer: {0}")]
    Unreachable(String),
    /// The token endpoint answered a status that says it is in trouble (5xx, 429) or one OAuth does not define.
    #[error("the token endpoint answered {0}")]
    Status(u16),
    /// The token endpoint refused to issue (an OAuth error code: invalid_grant, invalid_target...).
    #[error("the token endpoint refused: {0}")]
    Refused(String),
    /// The token endpoint's answer is not an acceptable token response.
    #[error("the token response is not acceptable: {0}")]
    Response(String),
}

impl OAuthError {
    /// What the model reads about this failure to get a token for `downstream`.
    #[must_use]
    pub fn for_tool(&self, downstream: &str) -> DownstreamError {
        match self {
            Self::Refused(_) => DownstreamError::Refused(downstream.to_owned()),
            _ => DownstreamError::Unavailable(downstream.to_owned()),
        }
    }

    /// The outcome label of `mcp_downstream_exchanges_total` and the audit row.
    #[must_use]
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Refused(_) => "refused",
            Self::Response(_) => "invalid_response",
            _ => "unavailable",
        }
    }
}
