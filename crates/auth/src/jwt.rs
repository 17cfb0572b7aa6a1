//! JWT access tokens (RFC 9068), verified the strict way (RFC 8725). jsonwebtoken does the signature and the
//! time claims; this module closes its open defaults: `iss`, `aud`, `sub` and `exp` are required (jsonwebtoken
//! would accept a token that lacks `aud` or `iss`), `nbf` is checked, the leeway is ours (≤ 30 s, not 60), the
//! algorithm is the key's, and a header that names a key by reference (`jku`, `x5u`, `jwk`, `x5c`) or carries
//! `crit` is refused before any key is looked up.

use crate::bearer::Scheme;
use crate::keys::{KeySource, MAX_KID};
use crate::{AuthError, Authenticator, Principal, Scopes, bearer};
use async_trait::async_trait;
use http::request::Parts;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Validation, decode, decode_header};
use mcpfleet_core::Assigner;
use mcpfleet_core::time::epoch_secs;
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Which `typ` header values are accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypPolicy {
    /// `at+jwt` (or `application/at+jwt`) only, as RFC 9068 requires of resource servers.
    AtJwt,
    /// Also `JWT`, for issuers that do not label access tokens (Keycloak, Entra ID v1...). A missing `typ` is
    /// refused under both policies.
    AtJwtOrJwt,
}

/// What a token must say to be accepted.
#[derive(Clone, Debug)]
pub struct JwtSettings {
    /// The only accepted `iss`, compared exactly.
    pub issuer: String,
    /// Our audience: `aud` must be this string, or an array that contains it.
    pub audience: String,
    /// Clock skew allowed on `exp`, `nbf` and `iat`; at most 30 s.
    pub leeway: Duration,
    pub typ: TypPolicy,
    /// Scopes every request to the endpoint needs (default `mcp:access`).
    pub required_scopes: Vec<String>,
    /// The claim naming the caller's tenant (`--tenant-claim`): a token without it is refused. `None`: each
    /// principal is its own tenant.
    pub tenant_claim: Option<String>,
    /// The longest a token may live (`exp - iat`, or `exp - now` without `iat`): a longer-lived one is refused, so
    /// that a revocation lasting this long covers every token it names. `None`: no limit.
    pub max_lifetime: Option<Duration>,
}

/// Longest `sub`, `iss` or `client_id` accepted.
const MAX_CLAIM: usize = 1024;

/// How many verified tokens are remembered per replica.
const VERIFIED_CAPACITY: usize = 16_384;
/// How long a verdict is trusted without checking the signature again (also bounded by the token's `exp`, and
/// dropped as soon as the key set changes).
const VERIFIED_TTL: Duration = Duration::from_secs(60);

/// Tokens verified recently, by SHA-256 of the token: a client sends the same access token with every request,
/// and an RSA or ECDSA verification costs more than the rest of a `tools/call` together (docs/BENCHMARKS.md).
/// Only successes are kept. An entry is used only while the token has not expired, for at most
/// [`VERIFIED_TTL`], and only under the key set it was verified with.
#[derive(Default)]
struct Verified {
    map: std::sync::Mutex<HashMap<[u8; 32], Verdict>>,
}

/// The principal, the token's `exp`, when it was verified, and the key set generation it was verified under.
type Verdict = (Principal, u64, std::time::Instant, u64);

impl Verified {
    fn get(&self, digest: &[u8; 32], generation: u64, leeway: u64) -> Option<Principal> {
        let map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (p, exp, at, g) = map.get(digest)?;
        (*g == generation && epoch_secs() <= exp.saturating_add(leeway) && at.elapsed() < VERIFIED_TTL)
            .then(|| p.clone())
    }

    fn put(&self, digest: [u8; 32], p: &Principal, exp: u64, generation: u64) {
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= VERIFIED_CAPACITY {
            let now = epoch_secs();
            map.retain(|_, (_, exp, at, g)| *g == generation && *exp >= now && at.elapsed() < VERIFIED_TTL);
            if map.len() >= VERIFIED_CAPACITY {
                map.clear();
            }
        }
        map.insert(digest, (p.clone(), exp, std::time::Instant::now(), generation));
    }
}

/// `--auth jwt` and `--auth dev`: bearer JWT access tokens.
pub struct JwtAuthenticator {
    settings: JwtSettings,
    dpop: crate::dpop::DpopSettings,
    keys: KeySource,
    verified: Verified,
    metrics: Option<crate::AuthMetrics>,
    assigner: Option<Arc<dyn Assigner>>,
}

impl std::fmt::Debug for JwtAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtAuthenticator").field("settings", &self.settings).field("keys", &self.keys).finish()
    }
}

fn claim_error(e: &jsonwebtoken::errors::Error) -> &'static str {
    match e.kind() {
        ErrorKind::ExpiredSignature => "the token has expired",
        ErrorKind::ImmatureSignature => "the token is not valid yet",
        ErrorKind::InvalidIssuer => "the token was not issued by the trusted issuer",
        ErrorKind::InvalidAudience => "the token is not meant for this resource",
        ErrorKind::MissingRequiredClaim(c) => match c.as_str() {
            "exp" => "the token has no exp claim",
            "iss" => "the token has no iss claim",
            "aud" => "the token has no aud claim",
            "sub" => "the token has no sub claim",
            _ => "the token lacks a required claim",
        },
        ErrorKind::InvalidClaimFormat(_) | ErrorKind::InvalidSubject => "a claim of the token is malformed",
        ErrorKind::InvalidSignature => "the token signature is invalid",
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm | ErrorKind::UnsupportedAlgorithm => {
            "the token algorithm is not allowed for its key"
        }
        _ => "the token is malformed",
    }
}

fn bounded_str(claims: &Map<String, Value>, name: &str) -> Result<Option<String>, AuthError> {
    match claims.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_CLAIM => Ok(Some(s.clone())),
        Some(_) => Err(AuthError::InvalidToken("a claim of the token is malformed")),
    }
}

impl JwtAuthenticator {
    #[must_use]
    pub fn new(settings: JwtSettings, keys: KeySource) -> Self {
        Self {
            settings,
            dpop: crate::dpop::DpopSettings::default(),
            keys,
            verified: Verified::default(),
            metrics: None,
            assigner: None,
        }
    }

    /// The same authenticator, taking DPoP-bound tokens as `dpop` says (`--dpop`).
    #[must_use]
    pub fn with_dpop(mut self, dpop: crate::dpop::DpopSettings) -> Self {
        self.dpop = dpop;
        self
    }

    /// Gives each verified principal its plan (and the claims its policy reads) through `assigner`; a cached
    /// verdict from another policy version is verified again.
    #[must_use]
    pub fn with_assigner(mut self, assigner: Arc<dyn Assigner>) -> Self {
        self.assigner = Some(assigner);
        self
    }

    /// Counts verifications in `metrics` (`mcp_token_verifications_total`).
    #[must_use]
    pub fn with_metrics(mut self, metrics: crate::AuthMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn count(&self, result: &str) {
        if let Some(m) = &self.metrics {
            m.verifications.with_label_values(&[result]).inc();
        }
    }

    /// Verifies one token and returns its principal (without the endpoint scope check).
    ///
    /// # Errors
    /// [`AuthError::InvalidToken`] with a reason safe to show; [`AuthError::KeysUnavailable`].
    pub async fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let generation = self.keys.generation();
        let leeway = self.settings.leeway.as_secs();
        if let Some(p) = self.verified.get(&digest, generation, leeway) {
            let current =
                self.assigner.as_ref().is_none_or(|a| p.plan.as_ref().map(|t| t.version) == Some(a.version()));
            if current {
                self.count("cached");
                return Ok(p);
            }
        }
        match self.verify_uncached(token).await {
            Ok((mut principal, exp, claims)) => {
                if let Some(a) = &self.assigner {
                    a.assign(&mut principal, &claims);
                }
                self.count("verified");
                self.verified.put(digest, &principal, exp, generation);
                Ok(principal)
            }
            Err(e) => {
                self.count("rejected");
                Err(e)
            }
        }
    }

    async fn verify_uncached(&self, token: &str) -> Result<(Principal, u64, Map<String, Value>), AuthError> {
        if token.split('.').count() != 3 {
            return Err(AuthError::InvalidToken("the token is not a signed JWT"));
        }
        // `alg: none` in any casing, and any algorithm jsonwebtoken does not implement, fail here.
        let header = decode_header(token).map_err(|_| AuthError::InvalidToken("the token header is malformed"))?;
        if header.jku.is_some() || header.x5u.is_some() || header.jwk.is_some() || header.x5c.is_some() {
            return Err(AuthError::InvalidToken("the token header names its own key; keys come only from the issuer"));
        }
        if header.crit.is_some() {
            return Err(AuthError::InvalidToken("the token header has critical extensions this server does not know"));
        }
        let typ = header.typ.as_deref().map(str::to_ascii_lowercase);
        let typ = typ.as_deref().map(|t| t.strip_prefix("application/").unwrap_or(t));
        let typ_ok = matches!((typ, self.settings.typ), (Some("at+jwt"), _) | (Some("jwt"), TypPolicy::AtJwtOrJwt));
        if !typ_ok {
            return Err(AuthError::InvalidToken(match self.settings.typ {
                TypPolicy::AtJwt => "the token typ must be at+jwt",
                TypPolicy::AtJwtOrJwt => "the token typ must be at+jwt or JWT",
            }));
        }
        let kid = header.kid.as_deref();
        if kid.is_some_and(|k| k.is_empty() || k.len() > MAX_KID || !k.bytes().all(|b| (0x20..0x7f).contains(&b))) {
            return Err(AuthError::InvalidToken("unknown signing key"));
        }
        let key = self.keys.key(kid, header.alg).await?;
        // The lookup only returns a key that may verify this algorithm; the pin is the point, so it is checked
        // again where the key is used.
        if !key.algorithms.contains(&header.alg) {
            return Err(AuthError::InvalidToken("the token algorithm is not allowed for its key"));
        }
        let leeway = self.settings.leeway.as_secs();
        let mut v = Validation::new(header.alg);
        v.leeway = leeway;
        v.validate_exp = true;
        v.validate_nbf = true;
        v.validate_aud = true;
        v.set_issuer(&[&self.settings.issuer]);
        v.set_audience(&[&self.settings.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data =
            decode::<Map<String, Value>>(token, &key.key, &v).map_err(|e| AuthError::InvalidToken(claim_error(&e)))?;
        let claims = data.claims;
        if let Some(iat) = claims.get("iat") {
            let ok = iat.as_f64().is_some_and(|t| t <= (epoch_secs() + leeway) as f64);
            if !ok {
                return Err(AuthError::InvalidToken("the token was issued in the future"));
            }
        }
        let issuer = bounded_str(&claims, "iss")?.ok_or(AuthError::InvalidToken("the token has no iss claim"))?;
        let subject = bounded_str(&claims, "sub")?.ok_or(AuthError::InvalidToken("the token has no sub claim"))?;
        let client_id = match bounded_str(&claims, "client_id")? {
            Some(c) => Some(c),
            None => bounded_str(&claims, "azp")?,
        };
        let mut scopes: Vec<&str> = Vec::new();
        match claims.get("scope") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => scopes.push(s),
            Some(_) => return Err(AuthError::InvalidToken("the scope claim must be a string")),
        }
        match claims.get("scp") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => scopes.push(s),
            Some(Value::Array(a)) => {
                for s in a {
                    scopes.push(s.as_str().ok_or(AuthError::InvalidToken("the scp claim must hold strings"))?);
                }
            }
            Some(_) => return Err(AuthError::InvalidToken("the scp claim must be an array of strings")),
        }
        // jsonwebtoken has checked that `exp` is a number in the future.
        #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a validated, positive timestamp")]
        let exp = claims.get("exp").and_then(Value::as_f64).map_or(0, |e| e as u64);
        if let Some(max) = self.settings.max_lifetime {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "checked above: not in the future"
            )]
            let start = claims.get("iat").and_then(Value::as_f64).map_or_else(epoch_secs, |t| t.max(0.0) as u64);
            if exp.saturating_sub(start) > max.as_secs() + leeway {
                return Err(AuthError::InvalidToken("the token lives longer than this server accepts"));
            }
        }
        let tenant = match &self.settings.tenant_claim {
            Some(claim) => Some(
                bounded_str(&claims, claim)?
                    .filter(|t| t.len() <= 128)
                    .ok_or(AuthError::InvalidToken("the token has no tenant claim, or a malformed one"))?,
            ),
            None => None,
        };
        let mut principal = Principal::new(issuer, subject, client_id, Scopes::granted(scopes)).with_tenant(tenant);
        // A `jti` of more than 256 characters is not kept: that token can be revoked only with its principal.
        principal.token_id = bounded_str(&claims, "jti")?.filter(|j| j.len() <= 256);
        // A DPoP-bound token (RFC 9449 §6): the thumbprint of its key.
        principal.bound_to = match claims.get("cnf") {
            None | Some(Value::Null) => None,
            Some(Value::Object(cnf)) => match cnf.get("jkt") {
                Some(Value::String(j)) if !j.is_empty() && j.len() <= 128 => Some(j.clone()),
                None => None,
                Some(_) => return Err(AuthError::InvalidToken("the token's cnf.jkt is malformed")),
            },
            Some(_) => return Err(AuthError::InvalidToken("the token's cnf claim is malformed")),
        };
        Ok((principal, exp, claims))
    }
}

#[async_trait]
impl Authenticator for JwtAuthenticator {
    async fn authenticate(&self, parts: &Parts) -> Result<Principal, AuthError> {
        use crate::dpop::DpopMode;
        let (scheme, token) = bearer::credentials(parts, self.dpop.mode != DpopMode::Off)?;
        let mut principal = self.verify(token).await?;
        match (scheme, principal.bound_to.as_deref()) {
            // RFC 9449 §7.2: a bound token presented as a bearer token is refused, or DPoP would protect nothing.
            (Scheme::Bearer, Some(_)) => {
                return Err(AuthError::InvalidToken(
                    "the token is bound to a DPoP key: send it with the DPoP scheme and a proof",
                ));
            }
            (Scheme::Bearer, None) if self.dpop.mode == DpopMode::Require => {
                return Err(AuthError::InvalidToken("this server accepts only DPoP-bound tokens"));
            }
            (Scheme::Bearer, None) => {}
            (Scheme::Dpop, None) => return Err(AuthError::InvalidToken("the token is not bound to a DPoP key")),
            (Scheme::Dpop, Some(jkt)) => {
                let mut proofs = parts.headers.get_all("dpop").iter();
                let proof = match (proofs.next(), proofs.next()) {
                    (Some(p), None) => {
                        p.to_str().map_err(|_| AuthError::InvalidProof("the DPoP proof is not ASCII"))?
                    }
                    (None, _) => return Err(AuthError::InvalidProof("the DPoP scheme needs a DPoP proof header")),
                    (Some(_), Some(_)) => return Err(AuthError::InvalidProof("more than one DPoP proof header")),
                };
                let htu = match &self.dpop.resource {
                    Some(r) => r.clone(),
                    None => {
                        let host = parts.headers.get(http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
                        format!("http://{host}{}", parts.uri.path())
                    }
                };
                let verified = crate::dpop::verify_proof(
                    proof,
                    parts.method.as_str(),
                    &htu,
                    Some(token),
                    &self.dpop,
                    epoch_secs(),
                )?;
                if verified.jkt != jkt {
                    return Err(AuthError::InvalidProof("the proof is not signed by the key the token is bound to"));
                }
                principal.proof = Some(verified.proof);
            }
        }
        if !principal.scopes.allow(&self.settings.required_scopes) {
            return Err(AuthError::InsufficientScope(self.settings.required_scopes.clone()));
        }
        Ok(principal)
    }

    fn is_ready(&self) -> bool {
        self.keys.is_loaded()
    }
}
