//! The seam through which identity enters the transport. The auth crate fills it with bearer-token
//! verification; until then the server runs with [`NoAuth`], and tests inject principals of their own.

use crate::error::TransportError;
use async_trait::async_trait;
use http::request::Parts;
use mcpfleet_state::UserKey;

/// Who is calling, as verified by an [`Authenticator`]. Sessions, streams and routing key on `user`.
#[derive(Clone, Debug)]
pub struct Principal {
    /// The opaque hash of the verified identity.
    pub user: UserKey,
}

/// Verifies the caller of one HTTP request.
#[async_trait]
pub trait Authenticator: Send + Sync + std::fmt::Debug {
    /// # Errors
    /// [`TransportError::Unauthorized`] with the status and challenge to send.
    async fn authenticate(&self, parts: &Parts) -> Result<Principal, TransportError>;
}

/// `--auth none`: one anonymous principal for every caller. Only allowed on a loopback listener.
#[derive(Debug)]
pub struct NoAuth {
    principal: Principal,
}

impl Default for NoAuth {
    fn default() -> Self {
        Self { principal: Principal { user: UserKey::anonymous() } }
    }
}

#[async_trait]
impl Authenticator for NoAuth {
    async fn authenticate(&self, _parts: &Parts) -> Result<Principal, TransportError> {
        Ok(self.principal.clone())
    }
}
