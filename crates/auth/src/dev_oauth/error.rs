//! What the endpoints refuse with: an [`OAuthError`] and its [`ErrorCode`], and the answer of the authorization
//! endpoint ([`AuthorizeOutcome`]), which takes a code or an error back to the client's redirect URI, or refuses
//! a client it cannot trust.

use serde_json::{Value, json};

/// An error code of RFC 6749 §4.1.2.1 and §5.2, RFC 7591 §3.2.2, RFC 8707 §2 and RFC 9449 §5.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidRequest,
    /// Client authentication failed (the transport answers 401).
    InvalidClient,
    InvalidGrant,
    UnsupportedGrantType,
    UnsupportedResponseType,
    InvalidScope,
    /// RFC 8707: the `resource` is not this server.
    InvalidTarget,
    /// RFC 7591.
    InvalidRedirectUri,
    /// RFC 7591.
    InvalidClientMetadata,
    /// The token could not be signed (the transport answers 500).
    ServerError,
    /// RFC 9449 §5: the token request's DPoP proof does not verify.
    InvalidDpopProof,
}

impl ErrorCode {
    /// The code as the protocol spells it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::InvalidClient => "invalid_client",
            Self::InvalidGrant => "invalid_grant",
            Self::UnsupportedGrantType => "unsupported_grant_type",
            Self::UnsupportedResponseType => "unsupported_response_type",
            Self::InvalidScope => "invalid_scope",
            Self::InvalidTarget => "invalid_target",
            Self::InvalidRedirectUri => "invalid_redirect_uri",
            Self::InvalidClientMetadata => "invalid_client_metadata",
            Self::ServerError => "server_error",
            Self::InvalidDpopProof => "invalid_dpop_proof",
        }
    }
}

/// What an endpoint of the dev sign-in tells a client it refused: an OAuth error response, not a failure of this
/// crate. The description is safe to show: it names parameters, never echoes a code, a token or a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {description}", code.as_str())]
pub struct OAuthError {
    pub code: ErrorCode,
    pub description: String,
}

impl OAuthError {
    pub(super) fn new(code: ErrorCode, description: impl Into<String>) -> Self {
        Self { code, description: description.into() }
    }

    /// The JSON body: `{"error": ..., "error_description": ...}`.
    #[must_use]
    pub fn body(&self) -> Value {
        json!({ "error": self.code.as_str(), "error_description": self.description })
    }
}

/// An `invalid_request` error.
pub(super) fn invalid_request(description: impl Into<String>) -> OAuthError {
    OAuthError::new(ErrorCode::InvalidRequest, description)
}

/// The answer of the authorization endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthorizeOutcome {
    /// Send the user agent here (302): the client's redirect URI with `code`, `state` and `iss`, or with `error`,
    /// `error_description`, `state` and `iss` (RFC 6749 §4.1.2.1).
    Redirect(String),
    /// The client or its redirect URI could not be trusted, so nothing is sent back to it: show this (400).
    Refused(OAuthError),
}
