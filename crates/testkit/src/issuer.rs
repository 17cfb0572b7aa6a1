//! A real local token issuer for the auth tests: an HTTP JWKS endpoint on loopback that can publish new keys
//! (rotation), count its fetches, go down and come back on the same port; and a token builder that can produce
//! every malformed or hostile token the tests need (arbitrary headers, `alg: none`, HS256 signed with an RSA
//! public key...). Its keys are committed test fixtures (`crates/testkit/keys/`).

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey};
use mcpfleet_core::time::epoch_secs;
use serde_json::{Map, Value, json};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;

/// The audience the auth tests configure (`--jwt-audience`).
pub const AUDIENCE: &str = "https://mcp.test/mcp";

/// A committed test key pair.
#[derive(Clone)]
pub struct TestKey {
    pub kid: String,
    pub alg: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
    public_pem: &'static [u8],
}

impl std::fmt::Debug for TestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestKey").field("kid", &self.kid).field("alg", &self.alg).finish()
    }
}

macro_rules! key_files {
    ($name:literal) => {
        (
            include_bytes!(concat!("../keys/", $name, ".pem")).as_slice(),
            include_bytes!(concat!("../keys/", $name, ".pub.pem")).as_slice(),
            include_str!(concat!("../keys/", $name, ".jwk.json")),
        )
    };
}

impl TestKey {
    /// One of the committed keys (`rsa-1`, `rsa-2`, `rsa-evil`, `ec-1`, `ed-1`), published under `kid` for `alg`.
    ///
    /// # Panics
    /// An unknown name, or an algorithm that does not fit the key.
    #[must_use]
    pub fn load(name: &str, kid: &str, alg: Algorithm) -> Self {
        let (private, public_pem, jwk) = match name {
            "rsa-1" => key_files!("rsa-1"),
            "rsa-2" => key_files!("rsa-2"),
            "rsa-evil" => key_files!("rsa-evil"),
            "ec-1" => key_files!("ec-1"),
            "ed-1" => key_files!("ed-1"),
            other => panic!("no test key {other}"),
        };
        let encoding = match name {
            "ec-1" => EncodingKey::from_ec_pem(private),
            "ed-1" => EncodingKey::from_ed_pem(private),
            _ => EncodingKey::from_rsa_pem(private),
        }
        .expect("test key");
        let mut jwk: Value = serde_json::from_str(jwk).expect("jwk");
        jwk["kid"] = json!(kid);
        jwk["use"] = json!("sig");
        Self { kid: kid.to_owned(), alg, encoding, jwk, public_pem }
    }

    /// The public JWK, with `kid` and `use`, and `alg` only if `with_alg`.
    #[must_use]
    pub fn jwk(&self, with_alg: bool) -> Value {
        let mut j = self.jwk.clone();
        if with_alg {
            j["alg"] = serde_json::to_value(self.alg).expect("alg");
        }
        j
    }

    /// The SPKI PEM of the public key.
    #[must_use]
    pub fn public_pem(&self) -> &'static [u8] {
        self.public_pem
    }

    /// A token signed by this key for `issuer`: `typ: at+jwt`, this key's `kid` and `alg`, and the claims
    /// `iss`, `aud` ([`AUDIENCE`]), `sub`, `exp` (+5 min), `iat`, `scope` (`mcp:access`), `client_id`, `jti`.
    #[must_use]
    pub fn token(&self, issuer: &str, sub: &str) -> TokenBuilder {
        let now = epoch_secs();
        let jti: [u8; 12] = rand::random();
        let mut header = Map::new();
        header.insert("alg".into(), serde_json::to_value(self.alg).expect("alg"));
        header.insert("typ".into(), json!("at+jwt"));
        header.insert("kid".into(), json!(self.kid));
        let claims = json!({
            "iss": issuer, "aud": AUDIENCE, "sub": sub, "exp": now + 300, "iat": now,
            "scope": "mcp:access", "client_id": "test-client", "jti": URL_SAFE_NO_PAD.encode(jti),
        });
        let Value::Object(claims) = claims else { unreachable!() };
        TokenBuilder { header, claims, key: self.encoding.clone(), alg: self.alg }
    }
}

impl TestKey {
    /// The RFC 7638 SHA-256 thumbprint of the public key (what a DPoP-bound token's `cnf.jkt` names).
    #[must_use]
    pub fn thumbprint(&self) -> String {
        let j = &self.jwk;
        let members: &[&str] = match j["kty"].as_str() {
            Some("EC") => &["crv", "kty", "x", "y"],
            Some("RSA") => &["e", "kty", "n"],
            _ => &["crv", "kty", "x"],
        };
        let fields: Vec<String> = members.iter().map(|m| format!("\"{m}\":{}", j[*m])).collect();
        let canonical = format!("{{{}}}", fields.join(","));
        URL_SAFE_NO_PAD.encode(<sha2::Sha256 as sha2::Digest>::digest(canonical.as_bytes()))
    }

    /// A DPoP proof (RFC 9449) signed by this key, for a request with `htm` to `htu` carrying `token` (its `ath`):
    /// header `typ: dpop+jwt`, this key's `alg` and public `jwk`; claims `jti` (random), `htm`, `htu`, `iat`
    /// (now) and `ath`. Change anything with the builder's methods before signing.
    #[must_use]
    pub fn dpop_proof(&self, htm: &str, htu: &str, token: Option<&str>) -> TokenBuilder {
        let mut header = Map::new();
        header.insert("alg".into(), serde_json::to_value(self.alg).expect("alg"));
        header.insert("typ".into(), json!("dpop+jwt"));
        let mut jwk = self.jwk.clone();
        if let Value::Object(o) = &mut jwk {
            o.remove("kid");
            o.remove("use");
        }
        header.insert("jwk".into(), jwk);
        let jti: [u8; 16] = rand::random();
        let mut claims = Map::new();
        claims.insert("jti".into(), json!(URL_SAFE_NO_PAD.encode(jti)));
        claims.insert("htm".into(), json!(htm));
        claims.insert("htu".into(), json!(htu));
        claims.insert("iat".into(), json!(epoch_secs()));
        if let Some(t) = token {
            let ath = URL_SAFE_NO_PAD.encode(<sha2::Sha256 as sha2::Digest>::digest(t.as_bytes()));
            claims.insert("ath".into(), json!(ath));
        }
        TokenBuilder { header, claims, key: self.encoding.clone(), alg: self.alg }
    }
}

/// A token being built: any header or claim can be set or removed.
#[derive(Clone)]
pub struct TokenBuilder {
    header: Map<String, Value>,
    claims: Map<String, Value>,
    key: EncodingKey,
    alg: Algorithm,
}

impl std::fmt::Debug for TokenBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenBuilder").field("header", &self.header).field("claims", &self.claims).finish()
    }
}

fn b64json(v: &Map<String, Value>) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).expect("json"))
}

impl TokenBuilder {
    #[must_use]
    pub fn claim(mut self, name: &str, value: Value) -> Self {
        self.claims.insert(name.to_owned(), value);
        self
    }

    #[must_use]
    pub fn without_claim(mut self, name: &str) -> Self {
        self.claims.remove(name);
        self
    }

    /// Sets a header field (the `alg` field too: the signature still uses the key's algorithm).
    #[must_use]
    pub fn header(mut self, name: &str, value: Value) -> Self {
        self.header.insert(name.to_owned(), value);
        self
    }

    #[must_use]
    pub fn without_header(mut self, name: &str) -> Self {
        self.header.remove(name);
        self
    }

    /// Signs with the key's algorithm.
    ///
    /// # Panics
    /// A signing failure.
    #[must_use]
    pub fn sign(&self) -> String {
        self.sign_as(&self.header, &self.key, self.alg)
    }

    fn sign_as(&self, header: &Map<String, Value>, key: &EncodingKey, alg: Algorithm) -> String {
        let message = format!("{}.{}", b64json(header), b64json(&self.claims));
        let sig = jsonwebtoken::crypto::sign(message.as_bytes(), key, alg).expect("sign");
        format!("{message}.{sig}")
    }

    /// `alg` set to `alg_value` (e.g. `none`, `NoNe`) and an empty signature.
    #[must_use]
    pub fn unsigned(&self, alg_value: &str) -> String {
        let mut header = self.header.clone();
        header.insert("alg".into(), json!(alg_value));
        format!("{}.{}.", b64json(&header), b64json(&self.claims))
    }

    /// The key-confusion attack: `alg: HS256`, HMAC keyed with the bytes of `public_pem`.
    ///
    /// # Panics
    /// A signing failure.
    #[must_use]
    pub fn hs256_with(&self, public_pem: &[u8]) -> String {
        let mut header = self.header.clone();
        header.insert("alg".into(), json!("HS256"));
        self.sign_as(&header, &EncodingKey::from_secret(public_pem).expect("hmac key"), Algorithm::HS256)
    }
}

#[derive(Debug)]
struct Published {
    jwks: Mutex<Value>,
    /// Cleared by [`Issuer::down`]: connections still open from before get 503.
    up: std::sync::atomic::AtomicBool,
    max_age: AtomicU64,
    fetches: AtomicUsize,
}

/// A JWKS endpoint on loopback.
#[derive(Debug)]
pub struct Issuer {
    addr: SocketAddr,
    state: Arc<Published>,
    task: Mutex<Option<JoinHandle<()>>>,
}

async fn jwks(State(s): State<Arc<Published>>) -> Response {
    s.fetches.fetch_add(1, Ordering::SeqCst);
    if !s.up.load(Ordering::SeqCst) {
        return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let doc = s.jwks.lock().expect("jwks").clone();
    let mut resp = axum::Json(doc).into_response();
    let cc = format!("public, max-age={}", s.max_age.load(Ordering::SeqCst));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_str(&cc).expect("header"));
    resp
}

impl Issuer {
    /// Starts serving `keys` (with their `alg`) at `/jwks.json`, with `max-age=300`.
    ///
    /// # Panics
    /// If it cannot bind.
    pub async fn start(keys: &[&TestKey]) -> Self {
        crate::init_tls();
        let state = Arc::new(Published {
            jwks: Mutex::new(Value::Null),
            up: std::sync::atomic::AtomicBool::new(true),
            max_age: AtomicU64::new(300),
            fetches: AtomicUsize::new(0),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind issuer");
        let addr = listener.local_addr().expect("addr");
        let me = Self { addr, state, task: Mutex::new(None) };
        me.publish(keys);
        me.serve(listener);
        me
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let app = Router::new().route("/jwks.json", get(jwks)).with_state(self.state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        *self.task.lock().expect("task") = Some(task);
    }

    /// The issuer identifier (`iss`): its base URL.
    #[must_use]
    pub fn id(&self) -> String {
        format!("http://{}", self.addr)
    }

    #[must_use]
    pub fn jwks_url(&self) -> String {
        format!("http://{}/jwks.json", self.addr)
    }

    /// Replaces the published keys (a rotation).
    pub fn publish(&self, keys: &[&TestKey]) {
        let doc = json!({ "keys": keys.iter().map(|k| k.jwk(true)).collect::<Vec<_>>() });
        *self.state.jwks.lock().expect("jwks") = doc;
    }

    /// Writes the keys published now (the JWKS document) to `path`, for replicas that cannot reach the issuer,
    /// e.g. inside a [`NetLab`](crate::NetLab) (the server reads it with `--jwks-file`).
    ///
    /// # Panics
    /// If the file cannot be written.
    pub fn write_jwks(&self, path: &std::path::Path) {
        let doc = self.state.jwks.lock().expect("jwks").to_string();
        std::fs::write(path, doc).unwrap_or_else(|e| panic!("write the JWKS to {}: {e}", path.display()));
    }

    pub fn set_max_age(&self, secs: u64) {
        self.state.max_age.store(secs, Ordering::SeqCst);
    }

    /// How many times the JWKS was fetched.
    #[must_use]
    pub fn fetches(&self) -> usize {
        self.state.fetches.load(Ordering::SeqCst)
    }

    /// Stops listening: fetches get connection refused.
    pub fn down(&self) {
        self.state.up.store(false, Ordering::SeqCst);
        if let Some(t) = self.task.lock().expect("task").take() {
            t.abort();
        }
    }

    /// Listens again on the same port.
    ///
    /// # Panics
    /// If the port cannot be bound again.
    pub async fn up(&self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.expect("rebind issuer");
        self.serve(listener);
        self.state.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.down();
    }
}
