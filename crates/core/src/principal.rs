//! The verified caller: its opaque key, its token's identity, and the scopes it was granted. The auth crate
//! builds one from a verified token; every other crate reads it.

use crate::{JsonObject, UserKey};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The scopes a principal was granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scopes {
    /// `--auth none` (and test principals): every scope.
    All,
    /// The scopes of a verified token.
    Granted(BTreeSet<String>),
}

impl Scopes {
    /// Parses `scope` (space-separated) or the members of `scp`.
    pub fn granted<'a>(items: impl IntoIterator<Item = &'a str>) -> Self {
        Self::Granted(items.into_iter().flat_map(str::split_whitespace).map(str::to_owned).collect())
    }

    /// Whether every scope in `required` was granted.
    #[must_use]
    pub fn allow<S: AsRef<str>>(&self, required: &[S]) -> bool {
        match self {
            Self::All => true,
            Self::Granted(g) => required.iter().all(|r| g.contains(r.as_ref())),
        }
    }

    /// The granted scopes, for display (`None` for [`Scopes::All`]).
    #[must_use]
    pub fn list(&self) -> Option<Vec<&str>> {
        match self {
            Self::All => None,
            Self::Granted(g) => Some(g.iter().map(String::as_str).collect()),
        }
    }
}

/// Who is calling, as verified by an [`Authenticator`].
///
/// Sessions, event streams, limits and tool data key on `user`, an opaque hash of `(issuer, subject)`. Debug
/// prints only that hash: the subject may be personal data.
#[derive(Clone)]
pub struct Principal {
    /// The opaque hash of `(issuer, subject)`.
    pub user: UserKey,
    /// `iss` of the token.
    pub issuer: String,
    /// `sub` of the token.
    pub subject: String,
    /// `client_id` (RFC 9068), or `azp`, when the token names the client.
    pub client_id: Option<String>,
    pub scopes: Scopes,
    /// The tenant whose data the tools act on, from the token claim the operator names (`--tenant-claim`);
    /// `None` means the principal is its own tenant.
    pub tenant: Option<String>,
    /// The token's claims that the policy in force reads (docs/POLICY.md); empty without a policy.
    pub claims: Arc<JsonObject>,
    /// The plan the policy in force gave this principal when its token was verified (see [`Assigner`]); `None`:
    /// not assigned yet (the transport assigns it).
    pub plan: Option<PlanTag>,
    /// The token's id (`jti`), when it has one: a revocation can name that one token.
    pub token_id: Option<String>,
    /// The DPoP proof this request came with (RFC 9449), when it came with one: the admission records it, and
    /// refuses it if any replica has seen it already. Per request: never cached with the token's verdict.
    pub proof: Option<Proof>,
    /// The thumbprint of the key the token is bound to (RFC 9449 `cnf.jkt`): a DPoP-bound token, usable only with
    /// proofs signed by that key.
    pub bound_to: Option<String>,
}

/// A DPoP proof's replay record: what identifies it, and for how long it could still be accepted (so for how long
/// it must be remembered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proof {
    /// Lowercase hex of SHA-256 over the proof's key thumbprint and its `jti`: two clients' `jti`s never collide,
    /// and nothing of the proof can be read back from a key name.
    pub id: String,
    /// How long to remember it.
    pub ttl: std::time::Duration,
}

/// A principal's plan under one version of the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanTag {
    /// The policy version that assigned it (0: no policy, the flags).
    pub version: u64,
    /// The plan's name.
    pub plan: Arc<str>,
    /// The verdicts of the plan's conditions that depend on the principal alone, decided at assignment, by
    /// condition (`None`: decided per call).
    pub decided: Arc<[Option<bool>]>,
}

/// Gives a verified principal its plan, once per token and policy version: the authenticator calls it with the
/// token's claims when it verifies a token, and verifies again (instead of using its cache) when the version it
/// assigned under is no longer [`Assigner::version`].
pub trait Assigner: Send + Sync + std::fmt::Debug {
    /// The version of the policy in force (0: none).
    fn version(&self) -> u64;

    /// Keeps in `principal.claims` the claims the policy reads, and sets `principal.plan`.
    fn assign(&self, principal: &mut Principal, claims: &JsonObject);
}

impl std::fmt::Debug for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Principal").field("user", &self.user).finish_non_exhaustive()
    }
}

impl Principal {
    /// A verified principal: `user` is derived from `(issuer, subject)`.
    #[must_use]
    pub fn new(issuer: String, subject: String, client_id: Option<String>, scopes: Scopes) -> Self {
        Self {
            user: user_key(&issuer, &subject),
            issuer,
            subject,
            client_id,
            scopes,
            tenant: None,
            claims: Arc::default(),
            plan: None,
            token_id: None,
            proof: None,
            bound_to: None,
        }
    }

    /// The one principal of `--auth none`: every caller, every scope.
    #[must_use]
    pub fn anonymous() -> Self {
        Self {
            user: UserKey::anonymous(),
            issuer: String::new(),
            subject: "anonymous".to_owned(),
            client_id: None,
            scopes: Scopes::All,
            tenant: None,
            claims: Arc::default(),
            plan: None,
            token_id: None,
            proof: None,
            bound_to: None,
        }
    }

    /// This principal, acting for `tenant`.
    #[must_use]
    pub fn with_tenant(mut self, tenant: Option<String>) -> Self {
        self.tenant = tenant;
        self
    }

    /// The tenant whose data the tools act on: the one the token names, else the principal's own key.
    #[must_use]
    pub fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or(self.user.as_str())
    }
}

/// The opaque, stable key of a user: SHA-256 over the length-prefixed issuer and the subject, base64url, 24
/// characters. Two issuers can never collide on one subject, and nothing about the token (its expiry, its id, its
/// scopes) enters the key, so a refreshed token keeps its sessions.
#[must_use]
pub fn user_key(issuer: &str, subject: &str) -> UserKey {
    use base64::Engine as _;
    let mut h = Sha256::new();
    h.update(b"mcpfleet/user/v1\0");
    h.update((issuer.len() as u64).to_be_bytes());
    h.update(issuer.as_bytes());
    h.update(subject.as_bytes());
    let digest = h.finalize();
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..18]);
    UserKey::new(&key).unwrap_or_else(UserKey::anonymous)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_keys_depend_on_issuer_and_subject_only() {
        let a = user_key("https://idp.example", "alice");
        assert_eq!(a, user_key("https://idp.example", "alice"));
        assert_ne!(a, user_key("https://other.example", "alice"));
        // The length prefix keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(user_key("ab", "c"), user_key("a", "bc"));
        assert_eq!(a.as_str().len(), 24);
    }

    #[test]
    fn scopes_allow_only_what_was_granted() {
        let s = Scopes::granted(["mcp:access tools:read", "extra"]);
        assert!(s.allow(&["mcp:access", "extra"]));
        assert!(!s.allow(&["tools:write"]));
        assert!(s.allow::<&str>(&[]));
        assert!(Scopes::All.allow(&["anything"]));
    }
}
