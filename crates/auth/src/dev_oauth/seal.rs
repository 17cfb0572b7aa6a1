//! What makes the dev sign-in stateless: a client id, an authorization code and a refresh token each carry what
//! they stand for ([`Client`], [`Code`], [`Refresh`]) in a blob sealed by a [`Sealer`]:
//! `<kind>.<base64url(JSON)>.<base64url(128-bit tag)>`, an HMAC-SHA256 under the dev key's sign-in key that covers
//! the kind, so that one kind never passes for another. A client secret is a MAC of its client id.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::Mac as _;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

type HmacSha256 = hmac::Hmac<Sha256>;

/// The labels of the three signed blobs: each is part of what its MAC covers, so one kind never passes for another.
pub(super) const CLIENT: &str = "mcpdev-c1";
pub(super) const CODE: &str = "mcpdev-ac1";
pub(super) const REFRESH: &str = "mcpdev-rt1";
const SECRET: &str = "mcpdev-cs1";

/// How a client authenticates at the token endpoint (RFC 7591 `token_endpoint_auth_method`). A client with a
/// secret may use either secret method, whichever it registered: the TypeScript SDK picks one from the server's
/// metadata, not from its registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum AuthMethod {
    #[serde(rename = "none")]
    None,
    #[serde(rename = "client_secret_post")]
    Post,
    #[serde(rename = "client_secret_basic")]
    Basic,
}

impl AuthMethod {
    pub(super) fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(Value::String(s.to_owned())).ok()
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Post => "client_secret_post",
            Self::Basic => "client_secret_basic",
        }
    }
}

/// What a client id carries: its registration.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Client {
    /// The token endpoint authentication method.
    pub(super) m: AuthMethod,
    /// The redirect URIs, as registered.
    pub(super) r: Vec<String>,
    /// A nonce: two registrations of the same URIs are two clients.
    pub(super) n: String,
}

/// What an authorization code carries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Code {
    /// Digest of the client id.
    pub(super) c: String,
    /// Digest of the redirect URI.
    pub(super) r: String,
    /// Whether the authorization request named the redirect URI (then the token request must name it too).
    pub(super) x: bool,
    /// The PKCE S256 challenge.
    pub(super) p: String,
    /// The granted scope, space-separated.
    pub(super) s: String,
    /// The resource (RFC 8707).
    pub(super) a: String,
    /// The subject.
    pub(super) u: String,
    /// Expiry, Unix seconds.
    pub(super) e: u64,
    /// A nonce, so that no two codes are alike.
    pub(super) n: String,
}

/// What a refresh token carries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Refresh {
    /// Digest of the client id.
    pub(super) c: String,
    /// The granted scope, space-separated.
    pub(super) s: String,
    /// The resource (RFC 8707).
    pub(super) a: String,
    /// The subject.
    pub(super) u: String,
    /// Expiry, Unix seconds.
    pub(super) e: u64,
    /// A nonce, so that no two refresh tokens are alike.
    pub(super) n: String,
}

/// Seals and opens the blobs, and makes and checks client secrets, under the sign-in key.
#[derive(Clone)]
pub(super) struct Sealer {
    mac: HmacSha256,
}

impl Sealer {
    /// The sealer of the 32-byte sign-in key.
    pub(super) fn new(key32: &[u8; 32]) -> Self {
        // HMAC pads a short key with zeros to the block size (64 bytes): this is HMAC under the 32-byte key.
        let mut key = [0u8; 64];
        key[..32].copy_from_slice(key32);
        Self { mac: <HmacSha256 as hmac::KeyInit>::new(&key.into()) }
    }

    fn mac(&self, kind: &str, payload: &str) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(kind.as_bytes());
        mac.update(b"\0");
        mac.update(payload.as_bytes());
        mac
    }

    /// `<kind>.<base64url(JSON)>.<base64url(128-bit tag)>`.
    pub(super) fn seal<T: Serialize>(&self, kind: &str, claims: &T) -> String {
        let payload = B64.encode(serde_json::to_vec(claims).unwrap_or_default());
        let tag = self.mac(kind, &payload).finalize().into_bytes();
        format!("{kind}.{payload}.{}", B64.encode(&tag[..16]))
    }

    /// The claims of a blob of `kind` whose tag checks out.
    pub(super) fn open<T: DeserializeOwned>(&self, kind: &str, blob: &str) -> Option<T> {
        let (payload, tag) = blob.strip_prefix(kind)?.strip_prefix('.')?.split_once('.')?;
        let tag = B64.decode(tag).ok().filter(|t| t.len() == 16)?;
        self.mac(kind, payload).verify_truncated_left(&tag).ok()?;
        serde_json::from_slice(&B64.decode(payload).ok()?).ok()
    }

    pub(super) fn client_secret(&self, client_id: &str) -> String {
        B64.encode(self.mac(SECRET, client_id).finalize().into_bytes())
    }

    pub(super) fn secret_matches(&self, client_id: &str, secret: &str) -> bool {
        B64.decode(secret).is_ok_and(|s| self.mac(SECRET, client_id).verify_slice(&s).is_ok())
    }
}

/// A short, stable digest of a client id or a redirect URI, to bind a code or a refresh token to it.
pub(super) fn digest(s: &str) -> String {
    B64.encode(&Sha256::digest(s.as_bytes())[..16])
}

/// 96 random bits, so that no two blobs are alike.
pub(super) fn nonce() -> String {
    let n: [u8; 12] = rand::random();
    B64.encode(n)
}
