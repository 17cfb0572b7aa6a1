//! DPoP (RFC 9449) for the resource server: an access token bound to a key the client holds (`cnf.jkt`), presented
//! as `Authorization: DPoP <token>` with a `DPoP` proof that the client signed with that key for this one request.
//! [`verify_proof`] checks a proof: its `typ`, an asymmetric algorithm, a public key only, the signature, `htm`,
//! `htu`, `iat` within [`DpopSettings::max_age`], `ath` over the token, and (when the operator configures one) the
//! fleet's nonce. What it cannot check alone is replay: the proof's id ([`mcpfleet_core::Proof`]) is recorded by
//! the store in the same round trip that admits the request, under the user's hash tag, so that a proof replayed
//! to any replica is refused there (the state crate's `admit.lua`).
//!
//! The nonce ([`NonceKey`]) needs no store: it is an HMAC of the current period under a key every replica holds,
//! so a nonce one replica issued is accepted by all, for this period and the next.

use crate::AuthError;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit as _, Mac as _};
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};
use std::time::Duration;

/// The proof algorithms accepted, as `WWW-Authenticate: DPoP algs` and the metadata's
/// `dpop_signing_alg_values_supported` name them: asymmetric only.
pub const ALGS: [&str; 9] = ["ES256", "ES384", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "EdDSA"];

/// Longest accepted proof, in bytes.
const MAX_PROOF_BYTES: usize = 8 * 1024;
/// Longest accepted `jti`.
const MAX_JTI: usize = 256;
/// Members of a JWK that only a private key has.
const PRIVATE_MEMBERS: [&str; 8] = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"];
/// How much longer than its acceptance a proof's replay record lives (replicas' clocks differ a little).
const REPLAY_MARGIN: Duration = Duration::from_secs(5);

/// Whether DPoP-bound tokens are accepted (`--dpop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DpopMode {
    /// Bearer tokens only; a `DPoP` scheme is refused.
    #[default]
    Off,
    /// Bearer tokens, and DPoP-bound tokens with their proofs; a bound token sent as Bearer is refused.
    Allow,
    /// DPoP-bound tokens with their proofs only.
    Require,
}

/// The resource server's DPoP settings.
#[derive(Clone, Debug, Default)]
pub struct DpopSettings {
    pub mode: DpopMode,
    /// How far a proof's `iat` may be from this replica's clock, either way.
    pub max_age: Duration,
    /// The URL proofs name in `htu` (the protected resource's); `None`: `http://<Host><path>` of the request
    /// (`--auth dev` on loopback).
    pub resource: Option<String>,
    /// The fleet's nonce, when the operator requires one (`--dpop-nonce-key`).
    pub nonce: Option<NonceKey>,
}

/// The key and period of the fleet's DPoP nonce. `Debug` shows the period only.
#[derive(Clone)]
pub struct NonceKey {
    keys: Vec<Vec<u8>>,
    period: Duration,
}

impl std::fmt::Debug for NonceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NonceKey").field("keys", &self.keys.len()).field("period", &self.period).finish()
    }
}

impl NonceKey {
    /// Nonces made with the first of `keys` (each replica of a fleet must have the same), any of them accepted (a
    /// rotation), each good for the period it was issued in and the next.
    #[must_use]
    pub fn new(keys: Vec<Vec<u8>>, period: Duration) -> Self {
        Self { keys, period: period.max(Duration::from_secs(1)) }
    }

    fn window(&self, now: u64) -> u64 {
        now / self.period.as_secs().max(1)
    }

    fn mac(key: &[u8], window: u64) -> String {
        #[expect(clippy::expect_used, reason = "HMAC takes a key of any length")]
        let mut m = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
        m.update(b"mcpfleet dpop nonce ");
        m.update(window.to_string().as_bytes());
        URL_SAFE_NO_PAD.encode(&m.finalize().into_bytes()[..16])
    }

    /// The nonce to hand out now (`DPoP-Nonce`).
    #[must_use]
    pub fn current(&self, now: u64) -> String {
        let w = self.window(now);
        format!("{w}.{}", Self::mac(self.keys.first().map_or(&[][..], Vec::as_slice), w))
    }

    /// Whether `nonce` was issued by this fleet in this period or the one before.
    #[must_use]
    pub fn accepts(&self, nonce: &str, now: u64) -> bool {
        let Some((w, mac)) = nonce.split_once('.') else { return false };
        let Ok(w) = w.parse::<u64>() else { return false };
        let current = self.window(now);
        (w == current || w + 1 == current) && self.keys.iter().any(|k| Self::mac(k, w) == mac)
    }
}

/// What a verified proof says: the thumbprint of its key, and its replay record.
#[derive(Debug)]
pub struct VerifiedProof {
    /// RFC 7638 SHA-256 thumbprint of the proof's key, base64url (what `cnf.jkt` names).
    pub jkt: String,
    pub proof: mcpfleet_core::Proof,
}

/// Verifies `proof` for a request with method `htm` to `htu`, carrying `token` (none at a token endpoint, where
/// the proof has no `ath`), at `now` (Unix seconds).
///
/// # Errors
/// [`AuthError::InvalidProof`] naming the first check that failed; [`AuthError::UseDpopNonce`] (with a fresh
/// nonce) when the fleet requires a nonce and the proof has none, or one it did not issue lately.
pub fn verify_proof(
    proof: &str,
    htm: &str,
    htu: &str,
    token: Option<&str>,
    settings: &DpopSettings,
    now: u64,
) -> Result<VerifiedProof, AuthError> {
    let bad = AuthError::InvalidProof;
    if proof.len() > MAX_PROOF_BYTES {
        return Err(bad("the DPoP proof is too long"));
    }
    let mut parts = proof.split('.');
    let (Some(h), Some(_), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(bad("the DPoP proof is not a signed JWT"));
    };
    let header: Map<String, Value> = URL_SAFE_NO_PAD
        .decode(h)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or(bad("the DPoP proof header is malformed"))?;
    if header.get("typ").and_then(Value::as_str) != Some("dpop+jwt") {
        return Err(bad("the DPoP proof typ must be dpop+jwt"));
    }
    let alg = header.get("alg").and_then(Value::as_str).unwrap_or_default();
    let algorithm = allowed(alg).ok_or(bad("the DPoP proof must be signed with an asymmetric algorithm"))?;
    let Some(Value::Object(jwk)) = header.get("jwk") else {
        return Err(bad("the DPoP proof header has no jwk"));
    };
    if PRIVATE_MEMBERS.iter().any(|m| jwk.contains_key(*m)) {
        return Err(bad("the DPoP proof's jwk must be a public key"));
    }
    let jkt = thumbprint(jwk).ok_or(bad("the DPoP proof's jwk is not a key this server knows"))?;
    let key: Jwk =
        serde_json::from_value(Value::Object(jwk.clone())).map_err(|_| bad("the DPoP proof's jwk is malformed"))?;
    let key = DecodingKey::from_jwk(&key).map_err(|_| bad("the DPoP proof's jwk is malformed"))?;
    let mut v = Validation::new(algorithm);
    v.required_spec_claims.clear();
    v.validate_exp = false;
    v.validate_nbf = false;
    v.validate_aud = false;
    let claims = jsonwebtoken::decode::<Map<String, Value>>(proof, &key, &v)
        .map_err(|_| bad("the DPoP proof signature does not verify with its jwk"))?
        .claims;
    let jti = claims.get("jti").and_then(Value::as_str).unwrap_or_default();
    if jti.is_empty() || jti.len() > MAX_JTI {
        return Err(bad("the DPoP proof needs a jti"));
    }
    if claims.get("htm").and_then(Value::as_str) != Some(htm) {
        return Err(bad("the DPoP proof's htm is not this request's method"));
    }
    let sent = claims.get("htu").and_then(Value::as_str).ok_or(bad("the DPoP proof has no htu"))?;
    if normalize(sent).is_none_or(|s| Some(s) != normalize(htu)) {
        return Err(bad("the DPoP proof's htu is not this resource's URL"));
    }
    let iat = claims.get("iat").and_then(Value::as_u64).ok_or(bad("the DPoP proof has no iat"))?;
    let window = settings.max_age.as_secs();
    if iat.abs_diff(now) > window {
        return Err(bad("the DPoP proof's iat is too far from the server's clock"));
    }
    if let Some(token) = token {
        let ath = URL_SAFE_NO_PAD.encode(Sha256::digest(token.as_bytes()));
        if claims.get("ath").and_then(Value::as_str) != Some(ath.as_str()) {
            return Err(bad("the DPoP proof's ath is not the hash of the access token"));
        }
    }
    if let Some(n) = &settings.nonce {
        let ok = claims.get("nonce").and_then(Value::as_str).is_some_and(|x| n.accepts(x, now));
        if !ok {
            return Err(AuthError::UseDpopNonce(n.current(now)));
        }
    }
    let id = mcpfleet_core::hex(&Sha256::digest(format!("{jkt}:{jti}").as_bytes()));
    // A proof accepted now (its iat at most `max_age` ahead) is accepted until at most twice `max_age` from now:
    // remembered that long, and a little more. One span for every proof, so that one principal's admissions with
    // proofs ride together.
    let ttl = settings.max_age * 2 + REPLAY_MARGIN;
    Ok(VerifiedProof { jkt, proof: mcpfleet_core::Proof { id, ttl } })
}

fn allowed(alg: &str) -> Option<Algorithm> {
    Some(match alg {
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "EdDSA" => Algorithm::EdDSA,
        _ => return None,
    })
}

/// The RFC 7638 SHA-256 thumbprint of a public JWK, base64url: its required members, in order, as JSON without
/// spaces.
#[must_use]
pub fn thumbprint(jwk: &Map<String, Value>) -> Option<String> {
    let kty = jwk.get("kty")?.as_str()?;
    let members: &[&str] = match kty {
        "EC" => &["crv", "kty", "x", "y"],
        "RSA" => &["e", "kty", "n"],
        "OKP" => &["crv", "kty", "x"],
        _ => return None,
    };
    let mut canonical = String::from("{");
    for (i, m) in members.iter().enumerate() {
        let v = jwk.get(*m)?.as_str()?;
        if i > 0 {
            canonical.push(',');
        }
        canonical.push_str(&serde_json::to_string(m).ok()?);
        canonical.push(':');
        canonical.push_str(&serde_json::to_string(v).ok()?);
    }
    canonical.push('}');
    Some(URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes())))
}

/// A URL as `htu` compares it (RFC 9449 §4.3): without query and fragment, scheme and host lowercase, no default
/// port.
fn normalize(url: &str) -> Option<String> {
    let url = url.split(['?', '#']).next()?;
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let (authority, path) = rest.find('/').map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
    let mut authority = authority.to_ascii_lowercase();
    for (s, port) in [("http", ":80"), ("https", ":443")] {
        if scheme == s && authority.ends_with(port) {
            authority.truncate(authority.len() - port.len());
        }
    }
    (!authority.is_empty()).then(|| format!("{scheme}://{authority}{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbprints_follow_rfc_7638() {
        // RFC 7638 §3.1's example key and thumbprint.
        let jwk: Map<String, Value> = serde_json::from_str(
            r#"{"kty":"RSA","n":"0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw","e":"AQAB","alg":"RS256","kid":"2011-04-29"}"#,
        )
        .unwrap();
        assert_eq!(thumbprint(&jwk).unwrap(), "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs");
    }

    #[test]
    fn htu_compares_without_query_case_or_default_port() {
        assert_eq!(normalize("HTTPS://Example.com:443/mcp?x=1#f").unwrap(), "https://example.com/mcp");
        assert_eq!(normalize("http://localhost:3000/mcp").unwrap(), "http://localhost:3000/mcp");
        assert_ne!(normalize("http://localhost:3000/mcp"), normalize("http://localhost:3000/other"));
        assert!(normalize("not a url").is_none());
    }

    #[test]
    fn nonces_are_the_fleets_for_this_period_and_the_last() {
        let n = NonceKey::new(vec![b"k1".to_vec()], Duration::from_secs(60));
        let issued = n.current(6000);
        assert!(n.accepts(&issued, 6000) && n.accepts(&issued, 6059 + 60), "this period and the next");
        assert!(!n.accepts(&issued, 6000 + 120), "two periods on");
        let other = NonceKey::new(vec![b"k2".to_vec()], Duration::from_secs(60));
        assert!(!other.accepts(&issued, 6000), "another fleet's key");
        let rotated = NonceKey::new(vec![b"k2".to_vec(), b"k1".to_vec()], Duration::from_secs(60));
        assert!(rotated.accepts(&issued, 6000), "a key kept for the rotation");
        assert!(!n.accepts("garbage", 6000) && !n.accepts("100.x", 6000));
    }
}
