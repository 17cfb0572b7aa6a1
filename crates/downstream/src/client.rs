//! The server's own client authentication at a token endpoint (RFC 6749 section 2.3, RFC 7523 section 2.2):
//! `client_secret_basic` (the id and secret form-encoded, then Basic), `client_secret_post` (both in the form) or
//! `private_key_jwt` (a signed assertion, one minute long, for the token endpoint alone, with a fresh `jti`).

use crate::OAuthError;
use crate::config::{ClientAuthMethod, ClientDoc, Credential, KeyAlg, Secret};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use std::time::{SystemTime, UNIX_EPOCH};

const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

pub(crate) struct Client {
    id: String,
    how: How,
}

enum How {
    Basic(String),
    Post(Secret),
    Jwt { key: EncodingKey, alg: Algorithm, kid: Option<String> },
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match self.how {
            How::Basic(_) => "client_secret_basic",
            How::Post(_) => "client_secret_post",
            How::Jwt { .. } => "private_key_jwt",
        };
        f.debug_struct("Client").field("id", &self.id).field("auth", &how).finish()
    }
}

fn algorithm(alg: KeyAlg) -> Algorithm {
    match alg {
        KeyAlg::RS256 => Algorithm::RS256,
        KeyAlg::PS256 => Algorithm::PS256,
        KeyAlg::ES256 => Algorithm::ES256,
        KeyAlg::ES384 => Algorithm::ES384,
        KeyAlg::EdDSA => Algorithm::EdDSA,
    }
}

fn encoding_key(pem: &Secret, alg: KeyAlg) -> Result<EncodingKey, String> {
    let bytes = pem.expose().as_bytes();
    match alg {
        KeyAlg::RS256 | KeyAlg::PS256 => EncodingKey::from_rsa_pem(bytes),
        KeyAlg::ES256 | KeyAlg::ES384 => EncodingKey::from_ec_pem(bytes),
        KeyAlg::EdDSA => EncodingKey::from_ed_pem(bytes),
    }
    .map_err(|e| format!("not a PEM private key for {alg:?}: {e}"))
}

/// The signing key of `pem`, once it has signed a probe (checked at start, so a bad key exits 64).
fn signing_key(pem: &Secret, alg: KeyAlg) -> Result<EncodingKey, String> {
    let key = encoding_key(pem, alg)?;
    let claims = serde_json::json!({ "probe": true });
    jsonwebtoken::encode(&Header::new(algorithm(alg)), &claims, &key)
        .map_err(|e| format!("private_key: the key cannot sign {alg:?}: {e}"))?;
    Ok(key)
}

fn form_encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

impl Client {
    /// The client id at the token endpoint (and the third party's authorization endpoint).
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn new(doc: &ClientDoc, credential: &Credential) -> Result<Self, String> {
        let how = match (doc.auth, credential) {
            (ClientAuthMethod::ClientSecretBasic, Credential::Secret(s)) => {
                let pair = format!("{}:{}", form_encode(&doc.id), form_encode(s.expose()));
                How::Basic(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair)))
            }
            (ClientAuthMethod::ClientSecretPost, Credential::Secret(s)) => How::Post(s.clone()),
            (ClientAuthMethod::PrivateKeyJwt, Credential::Key { pem, alg, kid }) => {
                How::Jwt { key: signing_key(pem, *alg)?, alg: algorithm(*alg), kid: kid.clone() }
            }
            _ => return Err("the client's credential does not fit its auth method".to_owned()),
        };
        Ok(Self { id: doc.id.clone(), how })
    }

    /// Authenticates `request` (a token request whose form is `form`) to `token_endpoint`.
    pub(crate) fn authenticate(
        &self,
        request: reqwest::RequestBuilder,
        form: &mut Vec<(&'static str, String)>,
        token_endpoint: &str,
    ) -> Result<reqwest::RequestBuilder, OAuthError> {
        Ok(match &self.how {
            How::Basic(header) => request.header(reqwest::header::AUTHORIZATION, header),
            How::Post(secret) => {
                form.push(("client_id", self.id.clone()));
                form.push(("client_secret", secret.expose().to_owned()));
                request
            }
            How::Jwt { key, alg, kid } => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                let mut header = Header::new(*alg);
                header.kid.clone_from(kid);
                let claims = serde_json::json!({
                    "iss": self.id,
                    "sub": self.id,
                    "aud": token_endpoint,
                    "iat": now,
                    "exp": now + 60,
                    "jti": mcpfleet_core::hex(&rand::random::<[u8; 16]>()),
                });
                let assertion = jsonwebtoken::encode(&header, &claims, key)
                    .map_err(|e| OAuthError::Client(format!("client assertion: {e}")))?;
                form.push(("client_id", self.id.clone()));
                form.push(("client_assertion_type", ASSERTION_TYPE.to_owned()));
                form.push(("client_assertion", assertion));
                request
            }
        })
    }
}
