//! Revocations (docs/POLICY.md, "Revocation"): a principal, or one of its tokens, refused by every replica until a
//! time. Two places hold one: the principal's own hash (`{u:<user>}:rv`, read by the admission script on every
//! request: the check costs no round trip of its own), and the fleet's registry (`{fleet}:revoked`, what `revoke
//! --list` shows and what each replica keeps in memory, so that with the store away it still refuses them). A
//! change is announced on the fleet's notice channel (`revoke:<user>`), so that every replica closes the
//! principal's open streams at once.

use crate::Result;
use crate::types::UserKey;
use async_trait::async_trait;

/// The revocation message on the fleet's notice channel: [`crate::Ring::Notice`] carries `revoke:<user>`.
pub const REVOKE_NOTICE: &str = "revoke:";

/// One revocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revocation {
    pub user: UserKey,
    /// One token's id (`jti`); `None`: the principal, every token.
    pub token_id: Option<String>,
    /// When it ends, in milliseconds since the epoch.
    pub until_ms: u64,
    /// What `revoke --list` shows of it (JSON: issuer, subject, token id, until, who, when); opaque here.
    pub record: String,
}

impl Revocation {
    /// Its field in the principal's hash and its name in the fleet's registry: `*` or `j:<jti>`.
    #[must_use]
    pub fn field(token_id: Option<&str>) -> String {
        token_id.map_or_else(|| "*".to_owned(), |j| format!("j:{j}"))
    }
}

/// A revocation as the registry lists it: the principal, the field, the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub user: String,
    pub field: String,
    pub record: String,
}

/// Where revocations are kept.
#[async_trait]
pub trait RevocationStore: Send + Sync + std::fmt::Debug {
    /// Records `r` (the principal's hash first, written durably with `WAIT` as other promises are; then the
    /// registry) and announces it.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn revoke(&self, r: &Revocation) -> Result<()>;

    /// Lifts a revocation of `user` (`token_id`: one token's; `None`: the principal's). Returns whether there was
    /// one.
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn lift(&self, user: &UserKey, token_id: Option<&str>) -> Result<bool>;

    /// The registry: every revocation recorded, expired ones included (the record says until when).
    ///
    /// # Errors
    /// A store failure or timeout.
    async fn revocations(&self) -> Result<Vec<Listed>>;
}

#[cfg(test)]
mod tests {
    #[test]
    fn fields_name_the_principal_or_one_token() {
        assert_eq!(super::Revocation::field(None), "*");
        assert_eq!(super::Revocation::field(Some("t-1")), "j:t-1");
    }
}
