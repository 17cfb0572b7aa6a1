//! mcpfleet-downstream owns the server's side of calling other APIs for the verified user (docs/DOWNSTREAM.md):
//! the downstreams document (`--downstreams FILE`, [`Document`]), the OAuth client that gets a token for a
//! downstream (RFC 8693 token exchange with the server's own client authentication, and an optional actor token),
//! the replica's token cache (memory only, keyed by a hash of the inputs, one exchange in flight per key, a
//! negative cache), and the HTTP client a tool's requests go through ([`Downstreams::send`]), which attaches the
//! token and, on a 401, drops it and tries once more with a fresh one.
//!
//! The caller's own token reaches this crate only as a [`SubjectToken`], which never prints; it is sent to the
//! configured token endpoint as `subject_token` and nowhere else (never to a downstream: no passthrough). It is
//! never a cache key, never logged, never written to Redis.
//!
//! URL mode (a third party's consent, docs/DOWNSTREAM.md "URL mode"): the grants sealed by the [`Vault`] and kept
//! through the state crate's `GrantStore`, their refresh under a lock, the authorizations in progress, the consent
//! URL and the callback's code exchange, the start page's sign-in at the fleet's issuer.
//!
//! It takes the tool-facing types (`DownstreamToken`, `DownstreamRequest`, `DownstreamError`) from
//! `mcpfleet-tools`, the principal and audit record from `mcpfleet-core`, and the `GrantStore` trait from
//! `mcpfleet-state`. It must not depend on the transport, auth, limits, axum or Redis itself: the transport holds a
//! [`Downstreams`], calls it from a tool's context and serves the pages.

mod cache;
mod client;
pub mod config;
mod consent;
mod error;
mod exchange;
mod grant;
mod metrics;
mod target;
mod token_exchange;
mod vault;

pub use config::{Document, Resolved, SecretRef, SignIn};
pub use consent::{CALLBACK_PATH, pkce};
pub use error::OAuthError;
pub use grant::{PENDING_TTL, Pending, UrlMode};
pub use metrics::DownstreamMetrics;
pub use vault::Vault;

use cache::{Cache, Key};
use mcpfleet_core::{AuditSink, Principal};
use mcpfleet_tools::downstream::{DownstreamError, DownstreamRequest, DownstreamResponse, DownstreamToken};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use target::{Kind, Target};

/// The caller's own bearer token, as verified by the server's authenticator, carried to the token endpoint as
/// `subject_token` and nowhere else. Its `Debug` never shows it.
#[derive(Clone)]
pub struct SubjectToken {
    raw: Arc<str>,
}

impl SubjectToken {
    /// The token as the request's `Authorization: Bearer` carried it. Nothing is parsed here: a request whose tool
    /// never asks for a downstream token pays one copy of the header and nothing more.
    #[must_use]
    pub fn new(raw: &str) -> Self {
        Self { raw: raw.into() }
    }

    /// When the token expires, when it is a JWT that says (read when an exchange is kept, to bound the cache).
    #[must_use]
    pub fn expires(&self) -> Option<SystemTime> {
        jwt_exp(&self.raw)
    }
}

impl std::fmt::Debug for SubjectToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectToken").finish_non_exhaustive()
    }
}

/// A single-use random value (an authorization's id, a step's `state`): 256 bits, base64url.
#[must_use]
pub fn random_id() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// `exp` of a JWT's payload (already verified by the authenticator; read here only to bound the cache).
fn jwt_exp(raw: &str) -> Option<SystemTime> {
    use base64::Engine as _;
    let payload = raw.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(claims.get("exp")?.as_u64()?))
}

/// Who asks for a downstream token: the verified principal, the caller's token when there is a request (a task
/// run has none), and the call's trace id (in the audit row).
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    pub principal: &'a Principal,
    pub subject: Option<&'a SubjectToken>,
    pub trace_id: &'a str,
    /// The 2025 session of the call, told when a URL-mode authorization completes.
    pub session: Option<&'a str>,
}

/// A token handed out, and what to forget if the downstream refuses it.
struct Had {
    token: DownstreamToken,
    forget: Forget,
}

enum Forget {
    /// The replica's cached exchange under this key.
    Cache(Key),
    /// The stored grant, as sealed (dropped only if still the one stored).
    Grant(Vec<u8>),
}

/// Every configured downstream, the HTTP client, the replica's token cache, metrics and the audit trail.
pub struct Downstreams {
    targets: BTreeMap<String, Target>,
    http: reqwest::Client,
    cache: Cache,
    metrics: DownstreamMetrics,
    audit: Option<Arc<dyn AuditSink>>,
    /// Where URL-mode grants are kept (required when a downstream is URL-mode).
    url: Option<UrlMode>,
    /// The start page's sign-in to the fleet's issuer, when configured.
    signin: Option<consent::SignInClient>,
}

impl std::fmt::Debug for Downstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Downstreams").field("names", &self.targets.keys().collect::<Vec<_>>()).finish()
    }
}

impl Downstreams {
    /// The downstreams of `resolved` (a document with its secrets read).
    ///
    /// # Errors
    /// [`OAuthError::Client`] when the HTTP client cannot be built; [`OAuthError::Schema`] for a credential that
    /// does not fit its method, or a URL-mode downstream without `url` (its store, key ring and pages).
    pub fn new(
        resolved: Vec<Resolved>,
        url: Option<UrlMode>,
        metrics: DownstreamMetrics,
        audit: Option<Arc<dyn AuditSink>>,
    ) -> Result<Self, OAuthError> {
        // reqwest's rustls backend uses the process-wide provider; ring is the one this build links.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            // A token is never sent anywhere the document does not name: no redirects.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("mcpfleet/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OAuthError::Client(e.to_string()))?;
        let mut targets = BTreeMap::new();
        for r in resolved {
            let t = Target::new(r)?;
            if matches!(t.kind, Kind::Url(_)) && url.is_none() {
                return Err(OAuthError::Schema {
                    pointer: "--downstream-key".to_owned(),
                    expected: format!("a key: {} is a URL-mode downstream, whose grants are kept sealed", t.name),
                });
            }
            targets.insert(t.name.clone(), t);
        }
        let signin = url.as_ref().and_then(|u| u.signin.as_ref()).map(consent::SignInClient::new).transpose()?;
        Ok(Self { targets, http, cache: Cache::default(), metrics, audit, url, signin })
    }

    fn target(&self, name: &str) -> Result<&Target, DownstreamError> {
        self.targets.get(name).ok_or_else(|| DownstreamError::Unknown(name.chars().take(64).collect()))
    }

    /// A token for the downstream `name`, for `who`.
    ///
    /// # Errors
    /// [`DownstreamError`]: unknown downstream, no caller's request (a task run), the authorization server
    /// refusing or unavailable.
    pub async fn token(&self, name: &str, who: Caller<'_>) -> Result<DownstreamToken, DownstreamError> {
        let t = self.target(name)?;
        self.token_for(t, who).await.map(|had| had.token)
    }

    /// The token for `t`, and what to forget if the downstream refuses it.
    async fn token_for(&self, t: &Target, who: Caller<'_>) -> Result<Had, DownstreamError> {
        match &t.kind {
            Kind::Exchange(x) => self.exchanged(t, x, who).await,
            Kind::Url(u) => self.granted(t, u, who).await,
        }
    }

    /// Forgets a token the downstream refused: the replica's cached one, or the stored grant it came from.
    async fn forget(&self, t: &Target, who: Caller<'_>, forget: Forget) {
        match forget {
            Forget::Cache(key) => self.cache.forget(&key),
            Forget::Grant(sealed) => {
                if let Some(url) = &self.url {
                    let dropped = url.store.drop_grant(&who.principal.user, &t.name, Some(&sealed)).await;
                    if matches!(dropped, Ok(true)) {
                        self.grant_event(t, who, "dropped", None);
                    }
                }
            }
        }
    }

    /// Sends a tool's `request` to the downstream `name` with a token for `who`; on a 401, the token is dropped
    /// and the request sent once more with a fresh one.
    ///
    /// # Errors
    /// [`DownstreamError`]: as [`token`](Self::token), a path outside the base URL, or no answer.
    pub async fn send(
        &self,
        name: &str,
        who: Caller<'_>,
        request: DownstreamRequest,
    ) -> Result<DownstreamResponse, DownstreamError> {
        let t = self.target(name)?;
        let url = url_for(t, &request)?;
        let body = request
            .json
            .as_ref()
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|_| DownstreamError::BadRequest(t.name.clone(), "the body is not JSON"))?;
        let method = reqwest::Method::from_bytes(request.method.as_str().as_bytes())
            .map_err(|_| DownstreamError::BadRequest(t.name.clone(), "the method"))?;
        let mut retried = false;
        loop {
            let Had { token, forget } = self.token_for(t, who).await?;
            let mut r = self.http.request(method.clone(), url.clone()).timeout(t.timeout).bearer_auth(token.secret());
            if let Some(b) = &body {
                r = r.header(reqwest::header::CONTENT_TYPE, "application/json").body(b.clone());
            }
            let count = |status: &str| self.metrics.requests.with_label_values(&[t.name.as_str(), status]).inc();
            let answer = match r.send().await {
                Ok(a) => a,
                Err(e) => {
                    count("no_answer");
                    tracing::warn!(downstream = t.name.as_str(), error = exchange::without_url(&e), "no answer");
                    return Err(DownstreamError::NoAnswer(t.name.clone()));
                }
            };
            let status = answer.status().as_u16();
            if status == 401 && !retried {
                retried = true;
                count("401");
                tracing::info!(downstream = t.name.as_str(), "the downstream refused its token; exchanging again");
                self.forget(t, who, forget).await;
                continue;
            }
            count(match status {
                200..=299 => "2xx",
                300..=399 => "3xx",
                400..=499 => "4xx",
                _ => "5xx",
            });
            let content_type =
                answer.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = exchange::read_capped(answer, t.max_response).await.map_err(|e| {
                tracing::warn!(downstream = t.name.as_str(), error = %e, "answer not read");
                DownstreamError::NoAnswer(t.name.clone())
            })?;
            return Ok(DownstreamResponse::new(status, content_type, body));
        }
    }
}

/// The URL of `request` under `t`'s base URL: the path must start with `/`, and stay under the base (no `..`,
/// no `//`, no backslash, no encoded dot or slash, no `?` or `#` in the path).
fn url_for(t: &Target, request: &DownstreamRequest) -> Result<reqwest::Url, DownstreamError> {
    let bad = |why: &'static str| DownstreamError::BadRequest(t.name.clone(), why);
    let path = request.path.as_str();
    if !path.starts_with('/') || path.starts_with("//") {
        return Err(bad("the path must start with one /"));
    }
    if path.len() > 2048 || path.chars().any(|c| c.is_control() || c == '\\' || c == '?' || c == '#') {
        return Err(bad("the path has a character it may not have"));
    }
    let lower = path.to_ascii_lowercase();
    if path.split('/').any(|seg| seg == ".." || seg == ".") || lower.contains("%2e") || lower.contains("%2f") {
        return Err(bad("the path must stay under the downstream's base URL"));
    }
    let mut url = t.base.join(&path[1..]).map_err(|_| bad("the path is not a URL path"))?;
    if !request.query.is_empty() {
        url.query_pairs_mut().extend_pairs(request.query.iter());
    }
    if url.origin() != t.base.origin() || !url.path().starts_with(t.base.path()) {
        return Err(bad("the path must stay under the downstream's base URL"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_token_never_prints_and_its_expiry_is_read() {
        use base64::Engine as _;
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"sub":"alice","exp":2000000000}"#);
        let t = SubjectToken::new(&format!("eyJhbGciOiJFUzI1NiJ9.{payload}.c2ln"));
        assert_eq!(t.expires(), Some(UNIX_EPOCH + Duration::from_secs(2_000_000_000)));
        assert!(!format!("{t:?}").contains("eyJ"), "{t:?}");
        assert_eq!(SubjectToken::new("opaque").expires(), None);
    }

    #[test]
    fn a_tool_s_path_stays_under_the_base_url() {
        let doc = Document::parse(
            "downstreams:\n  cal:\n    base_url: http://127.0.0.1:9/api\n    exchange:\n      token_endpoint: \
             http://127.0.0.1:8/token\n      client: { id: c, auth: client_secret_post, secret: { env: S } }\n      \
             audience: a\n",
        )
        .unwrap();
        let ds = Downstreams::new(
            doc.resolve(&|_| Ok("s".into())).unwrap(),
            None,
            DownstreamMetrics::unregistered(["cal"]).unwrap(),
            None,
        )
        .unwrap();
        let t = ds.target("cal").unwrap();
        let url = |p: &str| url_for(t, &DownstreamRequest::get(p).query("q", "a b&c")).map(|u| u.to_string());
        assert_eq!(url("/events").unwrap(), "http://127.0.0.1:9/api/events?q=a+b%26c");
        for bad in
            ["events", "//evil.test/x", "/../admin", "/a/../../b", "/%2e%2e/x", "/a%2Fb", "/a\\b", "/a?x=1", "/a#f"]
        {
            assert!(url(bad).is_err(), "{bad} must be refused");
        }
        assert!(matches!(ds.target("nope"), Err(DownstreamError::Unknown(n)) if n == "nope"));
    }
}
