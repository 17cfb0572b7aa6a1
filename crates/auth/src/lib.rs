//! mcpfleet-auth owns identity: who is calling, as proven by a verified bearer token and by nothing the client or
//! the model can write. It is a strict OAuth 2.1 resource server:
//!
//! - [`bearer`] reads the one `Authorization: Bearer` header (RFC 6750) and refuses tokens in the URL;
//! - [`dpop`] checks the proof of a DPoP-bound token (RFC 9449), whose replay the store refuses in the admission;
//! - [`JwtAuthenticator`] verifies JWT access tokens (RFC 9068, RFC 8725): the algorithm is pinned by the key,
//!   `exp`/`iss`/`aud`/`sub` are required, key references in the header are never followed;
//! - [`KeySource`] holds the verification keys: a JWKS URL (cached by `max-age`, refreshed on an unknown `kid` at
//!   most once per interval, last good keys kept while the issuer is down), a JWKS file or a PEM key;
//! - [`dev`] is the embedded issuer of `--auth dev`, and [`dev_oauth`] its sign-in for real OAuth clients (a
//!   stateless authorization server: metadata, registration, authorization code with PKCE, refresh);
//! - [`ProtectedResource`] is the RFC 9728 metadata and the parameters of every challenge.
//!
//! The [`Principal`] it yields keys every session, stream, limit and tool datum on an opaque hash of `(iss, sub)`,
//! never on a token, so a token refresh keeps the session.
//!
//! [`Principal`], [`Scopes`] and [`UserKey`] are `mcpfleet-core`'s (re-exported here). It must not depend on the
//! transport, the state crate, axum, or Redis: it sees one request's head (`http::request::Parts`)
//! and answers with a [`Principal`] or an [`AuthError`]. Only the transport turns an [`AuthError`] into an HTTP
//! status and a `WWW-Authenticate` challenge.

pub mod bearer;
pub mod dev;
pub mod dev_oauth;
pub mod dpop;
mod error;
mod jwt;
mod keys;
mod metadata;
mod metrics;

pub use error::AuthError;
pub use jwt::{JwtAuthenticator, JwtSettings, TypPolicy};
pub use keys::{KeySet, KeySource, RemoteJwks};
pub use metadata::{ProtectedResource, WELL_KNOWN, split_url};
pub use metrics::AuthMetrics;

use async_trait::async_trait;
use http::request::Parts;
pub use mcpfleet_core::{Principal, Scopes, UserKey, user_key};
use std::sync::Arc;

/// Verifies the caller of one HTTP request.
#[async_trait]
pub trait Authenticator: Send + Sync + std::fmt::Debug {
    /// # Errors
    /// The [`AuthError`] that says which challenge to send.
    async fn authenticate(&self, parts: &Parts) -> Result<Principal, AuthError>;

    /// Whether a token can be verified now; a replica whose authenticator cannot is not ready (`/readyz` answers
    /// 503). With `--auth jwt`, false until the issuer's keys have loaded once. Answered from memory, at once.
    fn is_ready(&self) -> bool {
        true
    }
}

/// `--auth none`: one anonymous principal with every scope, for every caller. Only allowed on a loopback listener.
#[derive(Debug)]
pub struct NoAuth {
    principal: Principal,
}

impl Default for NoAuth {
    fn default() -> Self {
        Self { principal: Principal::anonymous() }
    }
}

#[async_trait]
impl Authenticator for NoAuth {
    async fn authenticate(&self, _parts: &Parts) -> Result<Principal, AuthError> {
        Ok(self.principal.clone())
    }
}

#[async_trait]
impl<T: Authenticator + ?Sized> Authenticator for Arc<T> {
    async fn authenticate(&self, parts: &Parts) -> Result<Principal, AuthError> {
        (**self).authenticate(parts).await
    }

    fn is_ready(&self) -> bool {
        (**self).is_ready()
    }
}
