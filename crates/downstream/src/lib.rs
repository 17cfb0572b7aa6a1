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
//! It takes the tool-facing types (`DownstreamToken`, `DownstreamRequest`, `DownstreamError`) from
//! `mcpfleet-tools` and the principal and audit record from `mcpfleet-core`. It must not depend on the transport,
//! the state crate, auth, limits, axum or Redis: the transport holds a [`Downstreams`] and calls it from a tool's
//! context.

mod cache;
mod client;
pub mod config;
mod error;
mod exchange;
mod metrics;
mod vault;

pub use config::{Document, Resolved, SecretRef};
pub use error::OAuthError;
pub use metrics::DownstreamMetrics;
pub use vault::Vault;

use cache::{Cache, Key};
use client::Client;
use exchange::{ACCESS_TOKEN_TYPE, GRANT_TOKEN_EXCHANGE, Issued, TokenRequest};
use mcpfleet_core::{AuditSink, DownstreamEvent, DownstreamRecord, Principal};
use mcpfleet_tools::downstream::{DownstreamError, DownstreamRequest, DownstreamResponse, DownstreamToken};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The caller's own bearer token, as verified by the server's authenticator, carried to the token endpoint as
/// `subject_token` and nowhere else. Its `Debug` never shows it.
#[derive(Clone)]
pub struct SubjectToken {
    raw: Arc<str>,
    /// `exp` of the token, when it is a JWT (it was verified before it got here).
    expires: Option<SystemTime>,
}

impl SubjectToken {
    /// The token as the request's `Authorization: Bearer` carried it.
    #[must_use]
    pub fn new(raw: &str) -> Self {
        Self { raw: raw.into(), expires: jwt_exp(raw) }
    }

    /// When the token expires, when it says.
    #[must_use]
    pub fn expires(&self) -> Option<SystemTime> {
        self.expires
    }
}

impl std::fmt::Debug for SubjectToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectToken").field("expires", &self.expires).finish_non_exhaustive()
    }
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
}

/// One configured downstream, ready.
struct Target {
    name: String,
    base: reqwest::Url,
    token_endpoint: String,
    client: Client,
    form: Vec<(&'static str, String)>,
    actor_scope: Option<String>,
    issued_type: &'static str,
    timeout: Duration,
    negative: Duration,
    skew: Duration,
    max_response: usize,
}

/// Every configured downstream, the HTTP client, the replica's token cache, metrics and the audit trail.
pub struct Downstreams {
    targets: BTreeMap<String, Target>,
    http: reqwest::Client,
    cache: Cache,
    metrics: DownstreamMetrics,
    audit: Option<Arc<dyn AuditSink>>,
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
    /// does not fit its method.
    pub fn new(
        resolved: Vec<Resolved>,
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
            let at = format!("/downstreams/{}", r.name);
            let d = &r.doc;
            let x = &d.exchange;
            let client = Client::new(&x.client, &r.credential)
                .map_err(|expected| OAuthError::Schema { pointer: format!("{at}/exchange/client"), expected })?;
            let mut base = reqwest::Url::parse(&d.base_url)
                .map_err(|e| OAuthError::Schema { pointer: format!("{at}/base_url"), expected: e.to_string() })?;
            if !base.path().ends_with('/') {
                base.set_path(&format!("{}/", base.path()));
            }
            let mut form = vec![("grant_type", GRANT_TOKEN_EXCHANGE.to_owned()), ("audience", x.audience.clone())];
            if let Some(resource) = &x.resource {
                form.push(("resource", resource.clone()));
            }
            if !x.scope.is_empty() {
                form.push(("scope", x.scope.join(" ")));
            }
            if let Some(t) = &x.requested_token_type {
                form.push(("requested_token_type", t.clone()));
            }
            let issued_type = match x.requested_token_type.as_deref() {
                Some("urn:ietf:params:oauth:token-type:jwt") => "urn:ietf:params:oauth:token-type:jwt",
                _ => ACCESS_TOKEN_TYPE,
            };
            targets.insert(
                r.name.clone(),
                Target {
                    name: r.name.clone(),
                    base,
                    token_endpoint: x.token_endpoint.clone(),
                    client,
                    form,
                    actor_scope: x.actor_token.as_ref().map(|a| a.scope.join(" ")),
                    issued_type,
                    timeout: d.timeout(),
                    negative: d.negative_cache(),
                    skew: d.skew(),
                    max_response: d.max_response_bytes,
                },
            );
        }
        Ok(Self { targets, http, cache: Cache::default(), metrics, audit })
    }

    /// The configured downstreams' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.targets.keys().map(String::as_str)
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
        self.token_for(t, who).await.map(|(token, _)| token)
    }

    /// The token for `t` and its cache key.
    async fn token_for(&self, t: &Target, who: Caller<'_>) -> Result<(DownstreamToken, Key), DownstreamError> {
        let subject = who.subject.ok_or_else(|| DownstreamError::NeedsCallerRequest(t.name.clone()))?;
        let key = Key::of(&[b"exchange", t.name.as_bytes(), subject.raw.as_bytes()]);
        let (outcome, source) = self.cache.get(key, || self.exchange(t, who, subject)).await;
        self.metrics.tokens.with_label_values(&[t.name.as_str(), source.label()]).inc();
        outcome.map(|token| (token, key))
    }

    /// One exchange for `who`, audited and counted; what the cache keeps, and for how long.
    async fn exchange(&self, t: &Target, who: Caller<'_>, subject: &SubjectToken) -> cache::Fetched {
        let started = Instant::now();
        let result = self.exchange_once(t, subject).await;
        let took = started.elapsed();
        let name = t.name.as_str();
        let outcome = match &result {
            Ok(_) => "issued",
            Err(e) => e.outcome(),
        };
        self.metrics.exchanges.with_label_values(&[name, outcome]).inc();
        self.metrics.exchange_seconds.with_label_values(&[name]).observe(took.as_secs_f64());
        let lifetime = result.as_ref().ok().map(|i| i.lifetime);
        match &result {
            Ok(i) => tracing::info!(
                downstream = name,
                principal = who.principal.user.as_str(),
                lifetime_s = i.lifetime.as_secs(),
                duration_ms = took.as_secs_f64() * 1e3,
                trace_id = who.trace_id,
                "token exchanged"
            ),
            Err(e) => tracing::warn!(
                downstream = name,
                principal = who.principal.user.as_str(),
                outcome,
                error = %e,
                duration_ms = took.as_secs_f64() * 1e3,
                trace_id = who.trace_id,
                "token exchange failed"
            ),
        }
        if let Some(audit) = &self.audit {
            audit.record_downstream(DownstreamRecord {
                at: SystemTime::now(),
                event: DownstreamEvent::Exchange,
                downstream: t.name.clone(),
                outcome,
                principal: who.principal.user.as_str().to_owned(),
                client_id: who.principal.client_id.as_ref().map(|c| c.chars().take(200).collect()),
                duration: took,
                trace_id: who.trace_id.to_owned(),
                lifetime,
            });
        }
        match result {
            Ok(Issued { token, lifetime }) => {
                let mut keep = lifetime;
                if let Some(exp) = subject.expires {
                    keep = keep.min(exp.duration_since(SystemTime::now()).unwrap_or_default());
                }
                Ok((token, keep.saturating_sub(t.skew)))
            }
            Err(e) => Err((e.for_tool(name), t.negative)),
        }
    }

    async fn exchange_once(&self, t: &Target, subject: &SubjectToken) -> Result<Issued, OAuthError> {
        let mut form = t.form.clone();
        form.push(("subject_token", subject.raw.to_string()));
        form.push(("subject_token_type", ACCESS_TOKEN_TYPE.to_owned()));
        if let Some(scope) = &t.actor_scope {
            let actor = self.actor_token(t, scope).await?;
            form.push(("actor_token", actor.secret().to_owned()));
            form.push(("actor_token_type", ACCESS_TOKEN_TYPE.to_owned()));
        }
        self.request(t, Some(t.issued_type)).send(form).await
    }

    fn request<'a>(&'a self, t: &'a Target, issued_type: Option<&'a str>) -> TokenRequest<'a> {
        TokenRequest {
            http: &self.http,
            endpoint: &t.token_endpoint,
            client: &t.client,
            timeout: t.timeout,
            issued_type,
        }
    }

    /// The server's own client-credentials token for `t`, cached like an exchanged one.
    async fn actor_token(&self, t: &Target, scope: &str) -> Result<DownstreamToken, OAuthError> {
        let key = Key::of(&[b"actor", t.name.as_bytes()]);
        let fetch = || async {
            let mut form = vec![("grant_type", "client_credentials".to_owned())];
            if !scope.is_empty() {
                form.push(("scope", scope.to_owned()));
            }
            let r = self.request(t, None).send(form).await;
            let outcome = r.as_ref().map_or_else(OAuthError::outcome, |_| "issued");
            self.metrics.actor_tokens.with_label_values(&[t.name.as_str(), outcome]).inc();
            match r {
                Ok(i) => Ok((i.token, i.lifetime.saturating_sub(t.skew))),
                Err(e) => {
                    tracing::warn!(downstream = t.name.as_str(), error = %e, "actor token not issued");
                    Err((DownstreamError::Unavailable(t.name.clone()), t.negative))
                }
            }
        };
        let (outcome, _) = self.cache.get(key, fetch).await;
        outcome.map_err(|_| OAuthError::Status(503))
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
        for attempt in 0..2 {
            let (token, key) = self.token_for(t, who).await?;
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
            if status == 401 && attempt == 0 {
                count("401");
                tracing::info!(downstream = t.name.as_str(), "the downstream refused its token; exchanging again");
                self.cache.forget(&key);
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
        Err(DownstreamError::Refused(t.name.clone()))
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
