//! DPoP proofs for the load (RFC 9449, `--dpop-key`): one fresh ES256 proof per request, for the token the run
//! sends, so that a server under `--dpop require` can be measured (tests/cost.sh `SET=dpop`).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header, jwk::Jwk};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::sync::atomic::{AtomicU64, Ordering};

/// Signs a proof per request with one P-256 key.
pub(crate) struct Prover {
    key: EncodingKey,
    header: Header,
    /// What every proof's `jti` starts with: this run's random prefix (the counter makes each one new).
    prefix: String,
    next: AtomicU64,
    /// `htu`, when not the request's URL (a proxy in between).
    htu: Option<String>,
}

impl Prover {
    /// A prover of the ES256 key in `pem` (PKCS#8) whose public JWK is `jwk`.
    pub(crate) fn new(pem: &[u8], jwk: &str, htu: Option<String>) -> Result<Self, String> {
        let key = EncodingKey::from_ec_pem(pem).map_err(|e| format!("--dpop-key: {e}"))?;
        let jwk: Jwk = serde_json::from_str(jwk).map_err(|e| format!("--dpop-jwk: {e}"))?;
        let mut header = Header::new(Algorithm::ES256);
        header.typ = Some("dpop+jwt".to_owned());
        header.jwk = Some(jwk);
        let prefix = URL_SAFE_NO_PAD.encode(std::process::id().to_be_bytes())
            + &URL_SAFE_NO_PAD.encode(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos()
                    .to_be_bytes(),
            );
        Ok(Self { key, header, prefix, next: AtomicU64::new(0), htu })
    }

    /// A proof of a POST to `url` carrying `token`.
    pub(crate) fn proof(&self, url: &str, token: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let iat = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        let claims: Value = json!({
            "jti": format!("{}-{n}", self.prefix),
            "htm": "POST",
            "htu": self.htu.as_deref().unwrap_or(url),
            "iat": iat,
            "ath": URL_SAFE_NO_PAD.encode(Sha256::digest(token.as_bytes())),
        });
        jsonwebtoken::encode(&self.header, &claims, &self.key).unwrap_or_default()
    }
}
