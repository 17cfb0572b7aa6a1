//! The embedded issuer of `--auth dev`: an Ed25519 key kept in a local file (created on first use, mode 0600),
//! whose JWKS the server publishes and with which `mcpfleet token` mints access tokens. Replicas that share the
//! file share the issuer. It is for one machine's development only: the server refuses it on a non-loopback
//! address. [`crate::dev_oauth`] builds the sign-in of real OAuth clients on the same key.

use crate::keys::{KeySet, VerifyKey};
use crate::{AuthError, JwtSettings, TypPolicy};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header};
use mcpfleet_core::time::epoch_secs;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

/// `iss` of dev tokens.
pub const DEV_ISSUER: &str = "urn:mcpfleet:dev";
/// `aud` of dev tokens.
pub const DEV_AUDIENCE: &str = "urn:mcpfleet:dev";

/// PKCS#8 v1 prefix of an Ed25519 private key (RFC 8410): the 32-byte seed follows.
const PKCS8_ED25519: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

/// The dev issuer's key.
#[derive(Clone)]
pub struct DevIssuer {
    kid: String,
    public: [u8; 32],
    encoding: EncodingKey,
    /// The MAC key of the dev sign-in ([`crate::dev_oauth`]), derived from the seed with its own label: every
    /// replica that shares the key file shares it, and it is never the signing key.
    oauth_key: [u8; 32],
}

impl std::fmt::Debug for DevIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevIssuer").field("kid", &self.kid).finish_non_exhaustive()
    }
}

fn pem(der: &[u8]) -> String {
    format!("-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n", STANDARD.encode(der))
}

fn seed_from_pem(text: &str) -> Option<[u8; 32]> {
    let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = STANDARD.decode(body.trim()).ok()?;
    let seed = der.strip_prefix(&PKCS8_ED25519[..])?;
    seed.try_into().ok()
}

impl DevIssuer {
    /// Loads the key at `path`, or creates it (mode 0600) if the file does not exist.
    ///
    /// # Errors
    /// The file cannot be read or written, or does not hold a dev key.
    pub fn load_or_create(path: &Path) -> Result<Self, AuthError> {
        let io = |e: std::io::Error| AuthError::KeySource(format!("dev key {}: {e}", path.display()));
        let seed = match std::fs::read_to_string(path) {
            Ok(text) => seed_from_pem(&text).ok_or_else(|| {
                AuthError::KeySource(format!("dev key {}: not an Ed25519 PKCS#8 key", path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let seed: [u8; 32] = rand::random();
                let mut der = PKCS8_ED25519.to_vec();
                der.extend_from_slice(&seed);
                let mut opts = std::fs::OpenOptions::new();
                opts.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
                match opts.open(path) {
                    Ok(mut f) => {
                        f.write_all(pem(&der).as_bytes()).map_err(io)?;
                        seed
                    }
                    // Another replica created it first: use theirs.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        let text = std::fs::read_to_string(path).map_err(io)?;
                        seed_from_pem(&text)
                            .ok_or_else(|| AuthError::KeySource("dev key: not an Ed25519 key".into()))?
                    }
                    Err(e) => return Err(io(e)),
                }
            }
            Err(e) => return Err(io(e)),
        };
        Ok(Self::from_seed(seed))
    }

    pub(crate) fn from_seed(seed: [u8; 32]) -> Self {
        let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key().to_bytes();
        let mut der = PKCS8_ED25519.to_vec();
        der.extend_from_slice(&seed);
        let kid = URL_SAFE_NO_PAD.encode(&Sha256::digest(public)[..12]);
        let mut h = Sha256::new();
        h.update(b"mcpfleet/dev-oauth/mac-key/v1\0");
        h.update(seed);
        let oauth_key = h.finalize().into();
        Self { kid, public, encoding: EncodingKey::from_ed_der(&der), oauth_key }
    }

    /// The MAC key of the dev sign-in.
    pub(crate) fn oauth_key(&self) -> &[u8; 32] {
        &self.oauth_key
    }

    /// The JWKS of this issuer.
    #[must_use]
    pub fn jwks(&self) -> Value {
        json!({ "keys": [{
            "kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig",
            "kid": self.kid, "x": URL_SAFE_NO_PAD.encode(self.public),
        }]})
    }

    /// The verification key set.
    #[must_use]
    pub fn key_set(&self) -> KeySet {
        let key = VerifyKey { algorithms: vec![Algorithm::EdDSA], key: DecodingKey::from_ed_der(&self.public) };
        KeySet::single(self.kid.clone(), key)
    }

    /// The verifier settings for dev tokens.
    #[must_use]
    pub fn settings(required_scopes: Vec<String>) -> JwtSettings {
        JwtSettings {
            issuer: DEV_ISSUER.to_owned(),
            audience: DEV_AUDIENCE.to_owned(),
            leeway: Duration::from_secs(5),
            typ: TypPolicy::AtJwt,
            required_scopes,
            tenant_claim: None,
            // `mcpfleet token --ttl` mints up to 30 days for local use.
            max_lifetime: None,
        }
    }

    /// Mints an access token for `sub` with `scope`, valid for `ttl`.
    ///
    /// # Errors
    /// Signing failed.
    pub fn mint(&self, sub: &str, scope: &str, client_id: Option<&str>, ttl: Duration) -> Result<String, AuthError> {
        self.mint_bound(sub, scope, client_id, ttl, None)
    }

    /// [`mint`](Self::mint), bound to the DPoP key whose thumbprint is `jkt` (`cnf.jkt`, RFC 9449) when given.
    ///
    /// # Errors
    /// Signing failed.
    pub fn mint_bound(
        &self,
        sub: &str,
        scope: &str,
        client_id: Option<&str>,
        ttl: Duration,
        jkt: Option<&str>,
    ) -> Result<String, AuthError> {
        let now = epoch_secs();
        let mut claims = json!({
            "iss": DEV_ISSUER, "aud": DEV_AUDIENCE, "sub": sub, "scope": scope,
            "client_id": client_id.unwrap_or("mcpfleet-dev"),
            "iat": now, "exp": now + ttl.as_secs(),
        });
        if let Some(j) = jkt {
            claims["cnf"] = json!({ "jkt": j });
        }
        self.sign(claims)
    }

    /// Signs an access token (`typ: at+jwt`, EdDSA, this key's `kid`) with `claims` and a fresh `jti`.
    pub(crate) fn sign(&self, mut claims: Value) -> Result<String, AuthError> {
        let mut header = Header::new(Algorithm::EdDSA);
        header.typ = Some("at+jwt".to_owned());
        header.kid = Some(self.kid.clone());
        let jti: [u8; 12] = rand::random();
        claims["jti"] = Value::String(URL_SAFE_NO_PAD.encode(jti));
        jsonwebtoken::encode(&header, &claims, &self.encoding).map_err(|e| AuthError::KeySource(format!("sign: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{JwtAuthenticator, KeySource};
    use std::sync::Arc;

    #[tokio::test]
    async fn minted_tokens_verify_and_the_key_survives_a_restart() {
        let dir = tempfile_dir();
        let path = dir.join("dev-key.pem");
        let a = DevIssuer::load_or_create(&path).unwrap();
        let b = DevIssuer::load_or_create(&path).unwrap();
        assert_eq!(a.kid, b.kid);
        let token = a.mint("alice", "mcp:access tools:read", None, Duration::from_secs(60)).unwrap();
        let v = JwtAuthenticator::new(DevIssuer::settings(vec![]), KeySource::Static(Arc::new(b.key_set())));
        let p = v.verify(&token).await.unwrap();
        assert_eq!(p.subject, "alice");
        assert!(p.scopes.allow(&["tools:read"]));
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mcpfleet-dev-test-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
