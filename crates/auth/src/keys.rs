//! Verification keys: a [`KeySet`] parsed from a JWKS document or a PEM key, and the [`KeySource`] that keeps it
//! current. Each key carries the algorithms it may verify, decided by the key (its `alg`, or its type), never by
//! the token. A `kid` is only ever a map lookup: never a path, a URL or a query.

use crate::AuthError;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Largest JWKS document accepted, in bytes.
const MAX_JWKS_BYTES: usize = 512 * 1024;
/// Most keys kept from one JWKS document.
const MAX_KEYS: usize = 64;
/// Longest `kid` accepted.
pub(crate) const MAX_KID: usize = 256;
/// Smallest RSA modulus accepted (RFC 8725 §3.5, NIST SP 800-131A).
const MIN_RSA_BITS: usize = 2048;

/// One verification key and the algorithms it may verify.
pub struct VerifyKey {
    pub(crate) algorithms: Vec<Algorithm>,
    pub(crate) key: DecodingKey,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyKey").field("algorithms", &self.algorithms).finish_non_exhaustive()
    }
}

/// The keys of one issuer, by `kid`.
#[derive(Debug, Default)]
pub struct KeySet {
    by_kid: HashMap<String, Arc<VerifyKey>>,
    unnamed: Vec<Arc<VerifyKey>>,
}

fn b64_len(s: &str) -> usize {
    s.trim_end_matches('=').len() * 3 / 4
}

fn jwk_algorithms(jwk: &serde_json::Map<String, Value>) -> Result<(Vec<Algorithm>, DecodingKey), String> {
    let s = |k: &str| jwk.get(k).and_then(Value::as_str);
    let named = match s("alg") {
        None => None,
        Some("RS256") => Some(Algorithm::RS256),
        Some("RS384") => Some(Algorithm::RS384),
        Some("RS512") => Some(Algorithm::RS512),
        Some("PS256") => Some(Algorithm::PS256),
        Some("PS384") => Some(Algorithm::PS384),
        Some("PS512") => Some(Algorithm::PS512),
        Some("ES256") => Some(Algorithm::ES256),
        Some("EdDSA") => Some(Algorithm::EdDSA),
        Some(other) => return Err(format!("unsupported alg {other:?}")),
    };
    let err = |e: jsonwebtoken::errors::Error| e.to_string();
    let (family, key) = match (s("kty"), s("crv")) {
        (Some("RSA"), _) => {
            let (Some(n), Some(e)) = (s("n"), s("e")) else { return Err("RSA key without n or e".into()) };
            if b64_len(n) * 8 < MIN_RSA_BITS {
                return Err(format!("RSA key shorter than {MIN_RSA_BITS} bits"));
            }
            (vec![Algorithm::RS256, Algorithm::PS256], DecodingKey::from_rsa_components(n, e).map_err(err)?)
        }
        (Some("EC"), Some("P-256")) => {
            let (Some(x), Some(y)) = (s("x"), s("y")) else { return Err("EC key without x or y".into()) };
            (vec![Algorithm::ES256], DecodingKey::from_ec_components(x, y).map_err(err)?)
        }
        (Some("OKP"), Some("Ed25519")) => {
            let Some(x) = s("x") else { return Err("OKP key without x".into()) };
            if b64_len(x) != 32 {
                return Err("Ed25519 key of the wrong length".into());
            }
            (vec![Algorithm::EdDSA], DecodingKey::from_ed_components(x).map_err(err)?)
        }
        (kty, crv) => return Err(format!("unsupported key type {kty:?} / curve {crv:?}")),
    };
    let algorithms = match named {
        None => family,
        Some(a) if key.family() == a.family() => vec![a],
        Some(a) => return Err(format!("alg {a:?} does not fit the key type")),
    };
    Ok((algorithms, key))
}

impl KeySet {
    /// Parses a JWKS document (`{"keys": [...]}`). Keys this server cannot or must not use (encryption keys,
    /// unsupported types or curves, RSA shorter than 2048 bits, duplicate `kid`s) are skipped with a warning.
    ///
    /// # Errors
    /// A document that is not a JWKS, or that holds no usable key.
    pub fn from_jwks(doc: &[u8]) -> Result<Self, AuthError> {
        let v: Value = serde_json::from_slice(doc).map_err(|_| AuthError::KeySource("JWKS is not JSON".into()))?;
        let keys = v
            .get("keys")
            .and_then(Value::as_array)
            .ok_or_else(|| AuthError::KeySource("JWKS has no \"keys\" array".into()))?;
        let mut set = Self::default();
        for (i, k) in keys.iter().enumerate().take(MAX_KEYS) {
            let Some(jwk) = k.as_object() else { continue };
            if jwk.get("use").and_then(Value::as_str).is_some_and(|u| u != "sig") {
                continue;
            }
            if let Some(ops) = jwk.get("key_ops").and_then(Value::as_array)
                && !ops.iter().any(|o| o == "verify")
            {
                continue;
            }
            let kid = match jwk.get("kid") {
                None => None,
                Some(Value::String(k)) if !k.is_empty() && k.len() <= MAX_KID => Some(k.clone()),
                Some(_) => {
                    tracing::warn!(index = i, "JWKS key skipped: unusable kid");
                    continue;
                }
            };
            match jwk_algorithms(jwk) {
                Ok((algorithms, key)) => {
                    let vk = Arc::new(VerifyKey { algorithms, key });
                    match kid {
                        Some(kid) if set.by_kid.contains_key(&kid) => {
                            tracing::warn!(index = i, "JWKS key skipped: duplicate kid");
                        }
                        Some(kid) => {
                            set.by_kid.insert(kid, vk);
                        }
                        None => set.unnamed.push(vk),
                    }
                }
                Err(why) => tracing::warn!(index = i, reason = %why, "JWKS key skipped"),
            }
        }
        if set.is_empty() {
            return Err(AuthError::KeySource("JWKS holds no usable signing key".into()));
        }
        Ok(set)
    }

    /// Parses one PEM public key (RSA: RS256/PS256; EC P-256: ES256; Ed25519: EdDSA).
    ///
    /// # Errors
    /// A PEM that holds none of these.
    pub fn from_pem(pem: &[u8]) -> Result<Self, AuthError> {
        let key = if let Ok(k) = DecodingKey::from_rsa_pem(pem) {
            VerifyKey { algorithms: vec![Algorithm::RS256, Algorithm::PS256], key: k }
        } else if let Ok(k) = DecodingKey::from_ec_pem(pem) {
            VerifyKey { algorithms: vec![Algorithm::ES256], key: k }
        } else if let Ok(k) = DecodingKey::from_ed_pem(pem) {
            VerifyKey { algorithms: vec![Algorithm::EdDSA], key: k }
        } else {
            return Err(AuthError::KeySource("PEM holds no RSA, EC P-256 or Ed25519 public key".into()));
        };
        Ok(Self { by_kid: HashMap::new(), unnamed: vec![Arc::new(key)] })
    }

    /// A JWKS document or a PEM key, by its first bytes.
    ///
    /// # Errors
    /// See [`KeySet::from_jwks`] and [`KeySet::from_pem`].
    pub fn parse(doc: &[u8]) -> Result<Self, AuthError> {
        if doc.trim_ascii_start().starts_with(b"-----BEGIN") { Self::from_pem(doc) } else { Self::from_jwks(doc) }
    }

    /// One key, for the dev issuer.
    pub(crate) fn single(kid: String, key: VerifyKey) -> Self {
        Self { by_kid: HashMap::from([(kid, Arc::new(key))]), unnamed: Vec::new() }
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.by_kid.len() + self.unnamed.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key a token's `kid` names, if it may verify `alg`. A `kid` finds its key; without one (or in a set
    /// whose keys have no `kid`, like a PEM key), the one key that may verify `alg` answers, if there is exactly one.
    #[must_use]
    pub fn find(&self, kid: Option<&str>, alg: Algorithm) -> Option<Arc<VerifyKey>> {
        let fits = |k: &&Arc<VerifyKey>| k.algorithms.contains(&alg);
        let only = || {
            let mut it = self.by_kid.values().chain(&self.unnamed).filter(fits);
            match (it.next(), it.next()) {
                (Some(k), None) => Some(k.clone()),
                _ => None,
            }
        };
        match kid {
            Some(k) if !self.by_kid.is_empty() => self.by_kid.get(k).filter(fits).cloned(),
            _ => only(),
        }
    }
}

/// Where the keys come from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// Fixed at start (the dev issuer).
    Static(Arc<KeySet>),
    /// A JWKS URL or a key file, cached and refreshed.
    Remote(Arc<RemoteJwks>),
}

impl KeySource {
    /// The key for a token's `kid`.
    ///
    /// # Errors
    /// [`AuthError::InvalidToken`] for a key this issuer does not have; [`AuthError::KeysUnavailable`] when no key
    /// has been loaded yet.
    pub async fn key(&self, kid: Option<&str>, alg: Algorithm) -> Result<Arc<VerifyKey>, AuthError> {
        match self {
            Self::Static(set) => set.find(kid, alg).ok_or(AuthError::InvalidToken("unknown signing key")),
            Self::Remote(r) => r.key(kid, alg).await,
        }
    }

    /// Keys have loaded at least once (a static set always has).
    #[must_use]
    pub fn is_loaded(&self) -> bool {
        match self {
            Self::Static(_) => true,
            Self::Remote(r) => r.loads() > 0,
        }
    }

    /// Changes whenever the key set is replaced, so that verdicts reached under older keys can be dropped.
    #[must_use]
    pub fn generation(&self) -> u64 {
        match self {
            Self::Static(_) => 0,
            Self::Remote(r) => r.loads(),
        }
    }
}

enum Origin {
    Url { client: reqwest::Client, url: String },
    File(PathBuf),
}

struct Cache {
    keys: Option<Arc<KeySet>>,
    /// The keys are used past this instant, but a background refresh starts.
    fresh_until: Instant,
    last_attempt: Option<Instant>,
    /// Bumped at every attempt, so that requests that queued behind one do not repeat it.
    attempts: u64,
    /// Bumped at every successful load: tokens verified under older keys are verified again.
    loads: u64,
}

/// A JWKS fetched over HTTP (or read from a file), cached for its `max-age` (clamped between the refresh interval
/// and one day; five minutes without one), refreshed in the background when stale and at most once per refresh
/// interval when a token names an unknown `kid`. A failed refresh keeps the last good keys.
pub struct RemoteJwks {
    origin: Origin,
    metrics: Option<crate::AuthMetrics>,
    min_refresh: Duration,
    state: RwLock<Cache>,
    refresh: tokio::sync::Mutex<()>,
    refreshing: AtomicBool,
}

impl std::fmt::Debug for RemoteJwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.origin {
            Origin::Url { url, .. } => url.clone(),
            Origin::File(p) => p.display().to_string(),
        };
        f.debug_struct("RemoteJwks").field("origin", &what).finish_non_exhaustive()
    }
}

/// How long keys are used without a `max-age`.
const DEFAULT_TTL: Duration = Duration::from_secs(300);
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

impl RemoteJwks {
    /// A JWKS URL, fetched with `timeout` and without following redirects.
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn url(url: String, timeout: Duration, min_refresh: Duration) -> Result<Self, AuthError> {
        // reqwest's rustls backend uses the process-wide provider; ring is the one this build links.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("mcpfleet/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| AuthError::KeySource(format!("http client: {e}")))?;
        Ok(Self::new(Origin::Url { client, url }, min_refresh))
    }

    /// A JWKS or PEM file, re-read like a URL is re-fetched (a mounted secret can rotate in place).
    #[must_use]
    pub fn file(path: PathBuf, min_refresh: Duration) -> Self {
        Self::new(Origin::File(path), min_refresh)
    }

    fn new(origin: Origin, min_refresh: Duration) -> Self {
        Self {
            origin,
            metrics: None,
            min_refresh,
            state: RwLock::new(Cache {
                keys: None,
                fresh_until: Instant::now(),
                last_attempt: None,
                attempts: 0,
                loads: 0,
            }),
            refresh: tokio::sync::Mutex::new(()),
            refreshing: AtomicBool::new(false),
        }
    }

    /// Records loads in `metrics` (`mcp_jwks_*`).
    #[must_use]
    pub fn with_metrics(mut self, metrics: crate::AuthMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn loads(&self) -> u64 {
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner).loads
    }

    fn snapshot(&self) -> (Option<Arc<KeySet>>, Instant, Option<Instant>, u64) {
        let c = self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        (c.keys.clone(), c.fresh_until, c.last_attempt, c.attempts)
    }

    /// Loads the keys now (at start-up).
    ///
    /// # Errors
    /// The source is unreachable or holds no usable key; the cache stays empty and requests retry the load.
    pub async fn load(&self) -> Result<usize, AuthError> {
        let _g = self.refresh.lock().await;
        self.refresh_now().await
    }

    /// Until a first load succeeds, loads again with backoff (1 s, doubling to 30 s): a replica nobody sends
    /// requests to (it is not ready without keys) still gets its keys once the issuer answers. Returns once loaded.
    pub async fn load_until_loaded(self: Arc<Self>) {
        let mut wait = Duration::from_secs(1);
        while self.loads() == 0 {
            tokio::time::sleep(wait).await;
            let _ = self.load().await;
            wait = (wait * 2).min(Duration::from_secs(30));
        }
    }

    async fn key(self: &Arc<Self>, kid: Option<&str>, alg: Algorithm) -> Result<Arc<VerifyKey>, AuthError> {
        let (keys, fresh_until, last_attempt, attempts) = self.snapshot();
        let now = Instant::now();
        let due = |interval: Duration| last_attempt.is_none_or(|t| now.duration_since(t) >= interval);
        if let Some(k) = keys.as_ref().and_then(|ks| ks.find(kid, alg)) {
            if now >= fresh_until && due(self.min_refresh) && !self.refreshing.swap(true, Ordering::AcqRel) {
                let me = self.clone();
                tokio::spawn(async move {
                    let _g = me.refresh.lock().await;
                    let _ = me.refresh_now().await;
                    me.refreshing.store(false, Ordering::Release);
                });
            }
            return Ok(k);
        }
        // An unknown kid (perhaps a rotation) or nothing loaded yet: refresh, at most once per interval. Until a
        // first load succeeds, retry every second rather than every interval.
        let interval = if keys.is_some() { self.min_refresh } else { self.min_refresh.min(Duration::from_secs(1)) };
        if due(interval) {
            let _g = self.refresh.lock().await;
            if self.snapshot().3 == attempts {
                let _ = self.refresh_now().await;
            }
        }
        match self.snapshot().0 {
            None => Err(AuthError::KeysUnavailable),
            Some(ks) => ks.find(kid, alg).ok_or(AuthError::InvalidToken("unknown signing key")),
        }
    }

    /// One fetch; the caller holds the refresh lock.
    async fn refresh_now(&self) -> Result<usize, AuthError> {
        {
            let mut c = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            c.last_attempt = Some(Instant::now());
            c.attempts += 1;
        }
        match self.fetch().await.and_then(|(doc, ttl)| Ok((KeySet::parse(&doc)?, ttl))) {
            Ok((set, ttl)) => {
                let n = set.len();
                let ttl = ttl.unwrap_or(DEFAULT_TTL).clamp(self.min_refresh, MAX_TTL.max(self.min_refresh));
                let mut c = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                c.keys = Some(Arc::new(set));
                c.fresh_until = Instant::now() + ttl;
                c.loads += 1;
                drop(c);
                if let Some(m) = &self.metrics {
                    m.refreshes.with_label_values(&["ok"]).inc();
                    m.keys.set(i64::try_from(n).unwrap_or(i64::MAX));
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                    m.last_refresh.set(now.as_secs_f64());
                }
                tracing::info!(keys = n, ttl_secs = ttl.as_secs(), "verification keys loaded");
                Ok(n)
            }
            Err(e) => {
                if let Some(m) = &self.metrics {
                    m.refreshes.with_label_values(&["error"]).inc();
                }
                let kept = self.snapshot().0.is_some();
                tracing::warn!(error = %e, keeping_last_good_keys = kept, "verification keys not refreshed");
                Err(e)
            }
        }
    }

    async fn fetch(&self) -> Result<(Vec<u8>, Option<Duration>), AuthError> {
        match &self.origin {
            Origin::File(path) => {
                let doc = tokio::fs::read(path).await.map_err(|e| AuthError::KeySource(format!("read: {e}")))?;
                if doc.len() > MAX_JWKS_BYTES {
                    return Err(AuthError::KeySource("key file too large".into()));
                }
                Ok((doc, None))
            }
            Origin::Url { client, url } => {
                let mut resp = client
                    .get(url)
                    .header(http::header::ACCEPT, "application/jwk-set+json, application/json")
                    .send()
                    .await
                    .map_err(|e| AuthError::KeySource(format!("fetch: {}", e.without_url())))?;
                if resp.status() != reqwest::StatusCode::OK {
                    return Err(AuthError::KeySource(format!("fetch: HTTP {}", resp.status().as_u16())));
                }
                let ttl = resp
                    .headers()
                    .get_all(http::header::CACHE_CONTROL)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(|v| v.split(','))
                    .find_map(|d| {
                        let d = d.trim().to_ascii_lowercase();
                        if d == "no-store" || d == "no-cache" {
                            Some(Duration::ZERO)
                        } else {
                            d.strip_prefix("max-age=")
                                .and_then(|s| s.trim_matches('"').parse().ok())
                                .map(Duration::from_secs)
                        }
                    });
                let mut doc = Vec::new();
                while let Some(chunk) =
                    resp.chunk().await.map_err(|e| AuthError::KeySource(format!("fetch: {}", e.without_url())))?
                {
                    if doc.len() + chunk.len() > MAX_JWKS_BYTES {
                        return Err(AuthError::KeySource("JWKS too large".into()));
                    }
                    doc.extend_from_slice(&chunk);
                }
                Ok((doc, ttl))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_keeps_usable_signing_keys_only() {
        let doc = serde_json::json!({ "keys": [
            { "kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo" },
            { "kty": "OKP", "crv": "Ed25519", "kid": "enc", "use": "enc", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo" },
            { "kty": "OKP", "crv": "X25519", "kid": "x", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo" },
            { "kty": "RSA", "kid": "short", "n": "AQAB", "e": "AQAB" },
            { "kty": "OKP", "crv": "Ed25519", "kid": "ed", "alg": "RS256", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo" },
            { "kty": "oct", "kid": "hmac", "k": "c2VjcmV0" }
        ]});
        let set = KeySet::from_jwks(doc.to_string().as_bytes()).unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(set.find(Some("ed"), Algorithm::EdDSA).unwrap().algorithms, vec![Algorithm::EdDSA]);
        assert!(set.find(Some("ed"), Algorithm::RS256).is_none());
        assert!(set.find(Some("hmac"), Algorithm::HS256).is_none());
        assert!(set.find(Some("../../etc/passwd"), Algorithm::EdDSA).is_none());
        // One named key and no kid in the token: the only key that fits answers.
        assert!(set.find(None, Algorithm::EdDSA).is_some());
        assert!(set.find(None, Algorithm::ES256).is_none());
        assert!(KeySet::from_jwks(br#"{"keys":[]}"#).is_err());
        assert!(KeySet::from_jwks(b"not json").is_err());
    }
}
