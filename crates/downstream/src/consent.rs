//! The third party's side of a URL-mode authorization (docs/DOWNSTREAM.md, "URL mode"): the consent URL the start
//! page sends the signed-in user to (authorization code with PKCE S256, a single-use `state`), and the callback's
//! code exchange, whose tokens are sealed and stored for the user who asked. The fleet's own sign-in (proving who
//! the browser user is) and the HTTP pages are the transport's.

use crate::grant::{Pending, now_ms, token_grant};
use crate::target::{Kind, Target, UrlTarget};
use crate::{Downstreams, OAuthError};
use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use std::time::Duration;

/// Where the third party sends the user back, under the fleet's origin.
pub const CALLBACK_PATH: &str = "/downstream/callback";

/// A PKCE verifier (256 random bits, base64url) and its S256 challenge.
#[must_use]
pub fn pkce() -> (String, String) {
    let verifier = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

/// The start page's sign-in to the fleet's own issuer: endpoints, this server's client there, the scope.
pub(crate) struct SignInClient {
    authorization_endpoint: String,
    token_endpoint: String,
    client: crate::client::Client,
    scope: String,
}

impl SignInClient {
    pub(crate) fn new(s: &crate::config::SignIn) -> Result<Self, OAuthError> {
        let client = crate::client::Client::new(&s.doc.client, &s.credential)
            .map_err(|expected| OAuthError::Schema { pointer: "/signin/client".to_owned(), expected })?;
        Ok(Self {
            authorization_endpoint: s.doc.authorization_endpoint.clone(),
            token_endpoint: s.doc.token_endpoint.clone(),
            client,
            scope: s.doc.scope.join(" "),
        })
    }
}

/// What an authorization request (code flow, PKCE S256) carries.
struct CodeRequest<'a> {
    client: &'a crate::client::Client,
    redirect_uri: &'a str,
    state: &'a str,
    challenge: &'a str,
    scope: &'a str,
}

/// `endpoint` with the request's query: the client, the redirect URI, `state`, the PKCE challenge, the scope when
/// there is one, and `resource` (RFC 8707) when given; `place` names the endpoint in an error.
fn authorize_url(
    endpoint: &str,
    place: &str,
    r: &CodeRequest<'_>,
    resource: Option<&str>,
) -> Result<String, OAuthError> {
    let mut url = reqwest::Url::parse(endpoint)
        .map_err(|e| OAuthError::Schema { pointer: place.to_owned(), expected: e.to_string() })?;
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", r.client.id())
            .append_pair("redirect_uri", r.redirect_uri)
            .append_pair("state", r.state)
            .append_pair("code_challenge", r.challenge)
            .append_pair("code_challenge_method", "S256");
        if let Some(resource) = resource {
            q.append_pair("resource", resource);
        }
        if !r.scope.is_empty() {
            q.append_pair("scope", r.scope);
        }
    }
    Ok(url.into())
}

impl Downstreams {
    /// Whether the start page signs users in with a configured sign-in (else the dev sign-in).
    #[must_use]
    pub fn has_signin(&self) -> bool {
        self.signin.is_some()
    }

    /// The fleet issuer's authorization URL for the start page's sign-in: `redirect_uri` (the signed-in page),
    /// `state`, the PKCE `challenge`, and `resource` (RFC 8707: the token must be for this server).
    ///
    /// # Errors
    /// No sign-in is configured, or its endpoint is not a URL.
    pub fn signin_url(
        &self,
        redirect_uri: &str,
        state: &str,
        challenge: &str,
        resource: &str,
    ) -> Result<String, OAuthError> {
        let s = self.signin.as_ref().ok_or_else(|| OAuthError::Client("no sign-in is configured".into()))?;
        let request = CodeRequest { client: &s.client, redirect_uri, state, challenge, scope: &s.scope };
        authorize_url(&s.authorization_endpoint, "/signin/authorization_endpoint", &request, Some(resource))
    }

    /// The sign-in's code, exchanged for the access token the authenticator verifies.
    ///
    /// # Errors
    /// No sign-in is configured; the issuer refused or did not answer.
    pub async fn signin_token(
        &self,
        code: &str,
        verifier: &str,
        redirect_uri: &str,
        resource: &str,
    ) -> Result<String, OAuthError> {
        let s = self.signin.as_ref().ok_or_else(|| OAuthError::Client("no sign-in is configured".into()))?;
        let form = vec![
            ("grant_type", "authorization_code".to_owned()),
            ("code", code.to_owned()),
            ("redirect_uri", redirect_uri.to_owned()),
            ("code_verifier", verifier.to_owned()),
            ("resource", resource.to_owned()),
        ];
        let timeout = Duration::from_secs(10);
        let g = token_grant(&self.http, &s.token_endpoint, &s.client, timeout, form, None).await?;
        Ok(g.a)
    }

    fn url_target(&self, name: &str) -> Result<(&Target, &UrlTarget), OAuthError> {
        let missing = || OAuthError::Schema { pointer: format!("/downstreams/{name}"), expected: "URL mode".into() };
        let t = self.targets.get(name).ok_or_else(missing)?;
        match &t.kind {
            Kind::Url(u) => Ok((t, u)),
            Kind::Exchange(_) => Err(missing()),
        }
    }

    /// The fleet's public origin, where the start and callback pages are.
    #[must_use]
    pub fn pages_origin(&self) -> Option<&str> {
        self.url.as_ref().map(|u| u.origin.as_str())
    }

    /// The authorization in progress under `id`, if it has not expired or been taken.
    ///
    /// # Errors
    /// The store did not answer.
    pub async fn pending(&self, id: &str) -> Result<Option<Pending>, OAuthError> {
        let Some(url) = &self.url else { return Ok(None) };
        let raw = url.store.authorization(id).await.map_err(|e| OAuthError::Unreachable(format!("the store: {e}")))?;
        Ok(raw.and_then(|r| serde_json::from_str(&r).ok()))
    }

    /// Takes the authorization under `id` (single use).
    ///
    /// # Errors
    /// The store did not answer.
    pub async fn take_pending(&self, id: &str) -> Result<Option<Pending>, OAuthError> {
        let Some(url) = &self.url else { return Ok(None) };
        let raw =
            url.store.take_authorization(id).await.map_err(|e| OAuthError::Unreachable(format!("the store: {e}")))?;
        Ok(raw.and_then(|r| serde_json::from_str(&r).ok()))
    }

    /// The third party's authorization URL for `downstream`: this server's client, the callback under the fleet's
    /// origin, the configured scope, `state` and the PKCE `challenge`.
    ///
    /// # Errors
    /// `downstream` is not a URL-mode downstream.
    pub fn consent_url(&self, downstream: &str, state: &str, challenge: &str) -> Result<String, OAuthError> {
        let (t, u) = self.url_target(downstream)?;
        let redirect_uri = format!("{}{CALLBACK_PATH}", self.pages_origin().unwrap_or_default());
        let request = CodeRequest { client: &t.client, redirect_uri: &redirect_uri, state, challenge, scope: &u.scope };
        authorize_url(&u.authorization_endpoint, &format!("/downstreams/{downstream}"), &request, None)
    }

    /// The callback: exchanges `code` (with the PKCE `verifier`) at the third party's token endpoint and stores
    /// the grant, sealed, for the user of `pending`; counted and audited.
    ///
    /// # Errors
    /// The third party refused the code or did not answer; the store did not take the grant.
    pub async fn complete(
        &self,
        pending: &Pending,
        code: &str,
        verifier: &str,
        trace_id: &str,
    ) -> Result<(), OAuthError> {
        let (t, u) = self.url_target(&pending.downstream)?;
        let url = self.url.as_ref().ok_or_else(|| OAuthError::Client("URL mode is not configured".into()))?;
        let origin = url.origin.as_str();
        let form = vec![
            ("grant_type", "authorization_code".to_owned()),
            ("code", code.to_owned()),
            ("redirect_uri", format!("{origin}{CALLBACK_PATH}")),
            ("code_verifier", verifier.to_owned()),
        ];
        let started = std::time::Instant::now();
        let result = token_grant(&self.http, &t.token_endpoint, &t.client, t.timeout, form, None).await;
        let user = mcpfleet_core::UserKey::new(&pending.user)
            .ok_or_else(|| OAuthError::Response("the authorization names no user".into()))?;
        let outcome = match &result {
            Ok(g) => match url.keep(&user, &t.name, g, u.keep).await {
                Ok(_) => Ok(g.e),
                Err(e) => Err(e),
            },
            Err(e) => Err(e.clone()),
        };
        let event = if outcome.is_ok() { "completed" } else { "refused_at_callback" };
        self.metrics.grants.with_label_values(&[t.name.as_str(), event]).inc();
        if let Some(audit) = &self.audit {
            audit.record_downstream(mcpfleet_core::DownstreamRecord {
                at: std::time::SystemTime::now(),
                event: mcpfleet_core::DownstreamEvent::Authorization,
                downstream: t.name.clone(),
                outcome: event,
                principal: pending.user.clone(),
                client_id: pending.client.clone(),
                duration: started.elapsed(),
                trace_id: trace_id.to_owned(),
                lifetime: outcome.as_ref().ok().map(|e| Duration::from_millis(e.saturating_sub(now_ms()))),
            });
        }
        outcome.map(drop)
    }
}
