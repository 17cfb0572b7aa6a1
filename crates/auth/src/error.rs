/// Why a request was not authenticated, or why the auth configuration is unusable. Each request-time variant
/// names the challenge the transport sends; the messages are safe to show to a client (they never echo the token).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header: 401 with a challenge that carries no `error` (RFC 6750 §3.1).
    #[error("authentication required: send an access token in the Authorization header")]
    MissingCredentials,
    /// A malformed request: 400 `invalid_request`.
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// A token that is not valid here (bad signature, expired, wrong issuer or audience...): 401 `invalid_token`.
    #[error("invalid token: {0}")]
    InvalidToken(&'static str),
    /// A valid token without the scopes this request needs: 403 `insufficient_scope`, naming them.
    #[error("insufficient scope: this request needs {}", .0.join(" "))]
    InsufficientScope(Vec<String>),
    /// A DPoP proof that does not verify (or is missing, or repeated): 401 `DPoP error="invalid_dpop_proof"`.
    #[error("invalid DPoP proof: {0}")]
    InvalidProof(&'static str),
    /// The fleet requires a DPoP nonce and the proof has none, or an old one: 401 `DPoP error="use_dpop_nonce"`
    /// with this nonce in `DPoP-Nonce`.
    #[error("this server requires a DPoP nonce: retry with the one in the DPoP-Nonce header")]
    UseDpopNonce(String),
    /// No verification key has ever been loaded (the issuer has been unreachable since start): 503.
    #[error("token verification keys are unavailable")]
    KeysUnavailable,
    /// A key set or key file that cannot be used, or an issuer that cannot be reached (logged, never shown).
    #[error("key source: {0}")]
    KeySource(String),
}
