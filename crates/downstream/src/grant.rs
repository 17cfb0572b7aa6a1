//! URL mode (docs/DOWNSTREAM.md, "URL mode"): the third party's tokens for a user, kept in the state crate's
//! [`GrantStore`] sealed by the [`Vault`], read and opened on every call that asks, refreshed under a lock (one
//! replica spends a rotating refresh token), dropped when the downstream refuses them; and when there are none, an
//! authorization in progress ([`Pending`]) stored under a single-use, unguessable id, whose start URL the transport
//! sends the client as a URL-mode elicitation.

use crate::client::Client;
use crate::exchange::TokenRequest;
use crate::target::{Target, UrlTarget};
use crate::{Caller, Forget, Had, OAuthError, Vault};
use mcpfleet_state::GrantStore;
use mcpfleet_tools::downstream::{AuthorizationRequest, DownstreamError, DownstreamToken};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long an authorization in progress may take, from the tool's call to the third party's callback.
pub const PENDING_TTL: Duration = Duration::from_secs(600);

/// Where the fleet keeps URL-mode grants, how it seals them, and where its pages are.
pub struct UrlMode {
    pub store: Arc<dyn GrantStore>,
    pub vault: Vault,
    /// The fleet's public origin (`https://mcp.example.com`), under which the start page is
    /// `/downstream/start/<id>`.
    pub origin: String,
    /// How the start page signs the browser user in to the fleet's issuer (`None`: the dev sign-in).
    pub signin: Option<crate::config::SignIn>,
}

impl std::fmt::Debug for UrlMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlMode").field("origin", &self.origin).field("vault", &self.vault).finish_non_exhaustive()
    }
}

/// What a grant holds, sealed: the access token, when it expires (ms since the epoch), the refresh token.
#[derive(Serialize, Deserialize)]
pub(crate) struct Grant {
    pub(crate) a: String,
    pub(crate) e: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) r: Option<String>,
}

/// A grant read within its skew of expiry: its refresh token, its sealed bytes (to tell whether another replica
/// has stored a newer one since), and the skew.
pub(crate) struct Stale {
    refresh: String,
    sealed: Vec<u8>,
    skew: u64,
}

/// An authorization in progress, as stored under its id: whose it is (the verified principal that asked, and its
/// client), for which downstream, and the 2025 session to tell when it completes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub user: String,
    pub issuer: String,
    pub subject: String,
    pub client: Option<String>,
    pub downstream: String,
    pub session: Option<String>,
    pub at_ms: u64,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl UrlMode {
    /// Stores an authorization in progress for `who` and `downstream`; the request the client is sent.
    pub(crate) async fn ask(&self, downstream: &str, who: Caller<'_>) -> Result<AuthorizationRequest, DownstreamError> {
        let p = who.principal;
        let pending = Pending {
            user: p.user.as_str().to_owned(),
            issuer: p.issuer.clone(),
            subject: p.subject.clone(),
            client: p.client_id.clone(),
            downstream: downstream.to_owned(),
            session: who.session.map(str::to_owned),
            at_ms: now_ms(),
        };
        let id = crate::random_id();
        let record = serde_json::to_string(&pending).unwrap_or_default();
        self.store.put_authorization(&id, &record, PENDING_TTL).await.map_err(|e| {
            tracing::warn!(downstream, error = %e, "authorization not stored");
            DownstreamError::Unavailable(downstream.to_owned())
        })?;
        let url = format!("{}/downstream/start/{id}", self.origin);
        Ok(AuthorizationRequest::new(downstream.to_owned(), id, url))
    }

    /// The stored grant of `who` for `downstream`, opened; `None` when there is none (or it no longer opens, in
    /// which case it is dropped).
    pub(crate) async fn stored(
        &self,
        downstream: &str,
        who: Caller<'_>,
    ) -> Result<Option<(Grant, Vec<u8>)>, DownstreamError> {
        let user = &who.principal.user;
        let unavailable = |e: mcpfleet_state::StateError| {
            tracing::warn!(downstream, error = %e, "grant not read");
            DownstreamError::Unavailable(downstream.to_owned())
        };
        let Some(sealed) = self.store.grant(user, downstream).await.map_err(unavailable)? else { return Ok(None) };
        let opened = self.vault.open(user.as_str(), downstream, &sealed).and_then(|plain| {
            serde_json::from_slice::<Grant>(&plain).map_err(|_| OAuthError::Response("the grant is not JSON".into()))
        });
        match opened {
            Ok(g) => Ok(Some((g, sealed))),
            Err(e) => {
                tracing::warn!(downstream, error = %e, "a stored grant does not open: dropped, asked for again");
                let _ = self.store.drop_grant(user, downstream, Some(&sealed)).await;
                Ok(None)
            }
        }
    }

    /// Seals and stores `grant` for `user`; the sealed bytes.
    pub(crate) async fn keep(
        &self,
        user: &mcpfleet_core::UserKey,
        downstream: &str,
        grant: &Grant,
        keep: Duration,
    ) -> Result<Vec<u8>, OAuthError> {
        let plain = serde_json::to_vec(grant).map_err(|e| OAuthError::Client(e.to_string()))?;
        let sealed = self.vault.seal(user.as_str(), downstream, &plain)?;
        self.store
            .put_grant(user, downstream, &sealed, keep)
            .await
            .map_err(|e| OAuthError::Unreachable(format!("the store: {e}")))?;
        Ok(sealed)
    }
}

/// The token endpoint's answer to a code or a refresh, as a grant (the old refresh token kept when no new one
/// came).
pub(crate) async fn token_grant(
    http: &reqwest::Client,
    endpoint: &str,
    client: &Client,
    timeout: Duration,
    form: Vec<(&'static str, String)>,
    old_refresh: Option<String>,
) -> Result<Grant, OAuthError> {
    let request = TokenRequest { http, endpoint, client, timeout, issued_type: None };
    let issued = request.send(form).await?;
    Ok(Grant {
        a: issued.token.secret().to_owned(),
        e: now_ms() + u64::try_from(issued.lifetime.as_millis()).unwrap_or(u64::MAX),
        r: issued.refresh.or(old_refresh),
    })
}

impl crate::Downstreams {
    fn url_mode(&self, t: &Target) -> Result<&UrlMode, DownstreamError> {
        self.url.as_ref().ok_or_else(|| DownstreamError::Unavailable(t.name.clone()))
    }

    /// The user's token for the URL-mode downstream `t`: the stored grant's access token, refreshed when it is
    /// within the skew of its expiry; when there is none (or its refresh is refused), an authorization to ask for.
    pub(crate) async fn granted(&self, t: &Target, u: &UrlTarget, who: Caller<'_>) -> Result<Had, DownstreamError> {
        let url = self.url_mode(t)?;
        let skew = u64::try_from(t.skew.as_millis()).unwrap_or(u64::MAX);
        let Some((grant, sealed)) = url.stored(&t.name, who).await? else {
            return Err(self.ask(t, url, who).await);
        };
        if grant.e > now_ms().saturating_add(skew) {
            return Ok(Had { token: DownstreamToken::new(grant.a), forget: Forget::Grant(sealed) });
        }
        match grant.r {
            Some(refresh) => self.refresh(t, u, url, who, Stale { refresh, sealed, skew }).await,
            None => {
                let _ = url.store.drop_grant(&who.principal.user, &t.name, Some(&sealed)).await;
                self.grant_event(t, who, "expired", None);
                Err(self.ask(t, url, who).await)
            }
        }
    }

    /// Stores an authorization in progress and returns the request to ask the client with.
    async fn ask(&self, t: &Target, url: &UrlMode, who: Caller<'_>) -> DownstreamError {
        match url.ask(&t.name, who).await {
            Ok(request) => {
                self.grant_event(t, who, "asked", None);
                DownstreamError::AuthorizationRequired(Box::new(request))
            }
            Err(e) => e,
        }
    }

    /// Refreshes the grant under its lock: one replica spends a (possibly rotating) refresh token; the others wait
    /// for what it stores. A caller that takes the lock after another has refreshed (it read the grant before the
    /// other stored its refresh, and locked after the other let go) reads the grant again under the lock and uses
    /// the fresh one: a refresh token is never spent twice.
    async fn refresh(
        &self,
        t: &Target,
        u: &UrlTarget,
        url: &UrlMode,
        who: Caller<'_>,
        stale: Stale,
    ) -> Result<Had, DownstreamError> {
        let user = &who.principal.user;
        let name = t.name.as_str();
        let unavailable = || DownstreamError::Unavailable(t.name.clone());
        let holder = mcpfleet_core::hex(&rand::random::<[u8; 16]>());
        let lock_ttl = t.timeout * 2 + Duration::from_secs(1);
        let locked = url.store.lock_grant(user, name, &holder, lock_ttl).await.map_err(|_| unavailable())?;
        if !locked {
            // Another replica refreshes it: wait for the grant it stores.
            let deadline = tokio::time::Instant::now() + lock_ttl;
            while tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                match url.stored(name, who).await? {
                    Some((g, s)) if s != stale.sealed => {
                        return Ok(Had { token: DownstreamToken::new(g.a), forget: Forget::Grant(s) });
                    }
                    Some(_) => {}
                    // The other's refresh was refused and the grant dropped: asked for again, at once.
                    None => return Err(self.ask(t, url, who).await),
                }
            }
            return Err(unavailable());
        }
        let (refresh, sealed) = match url.stored(name, who).await {
            Ok(Some((g, s))) if s == stale.sealed => (g.r.unwrap_or(stale.refresh), s),
            Ok(Some((g, s))) if g.e > now_ms().saturating_add(stale.skew) => {
                let _ = url.store.unlock_grant(user, name, &holder).await;
                return Ok(Had { token: DownstreamToken::new(g.a), forget: Forget::Grant(s) });
            }
            Ok(Some((Grant { r: Some(r), .. }, s))) => (r, s),
            Ok(_) => {
                // Dropped (or stored without a refresh token) since it was read: asked for again.
                let _ = url.store.unlock_grant(user, name, &holder).await;
                return Err(self.ask(t, url, who).await);
            }
            Err(e) => {
                let _ = url.store.unlock_grant(user, name, &holder).await;
                return Err(e);
            }
        };
        let started = std::time::Instant::now();
        let form = vec![("grant_type", "refresh_token".to_owned()), ("refresh_token", refresh.clone())];
        let result = token_grant(&self.http, &t.token_endpoint, &t.client, t.timeout, form, Some(refresh)).await;
        let out = match result {
            Ok(g) => match url.keep(user, name, &g, u.keep).await {
                Ok(s) => {
                    let life = Duration::from_millis(g.e.saturating_sub(now_ms()));
                    self.grant_event(t, who, "refreshed", Some((started.elapsed(), life)));
                    Ok(Had { token: DownstreamToken::new(g.a), forget: Forget::Grant(s) })
                }
                Err(e) => {
                    tracing::warn!(downstream = name, error = %e, "refreshed grant not stored");
                    Err(unavailable())
                }
            },
            Err(OAuthError::Refused(code)) => {
                tracing::info!(downstream = name, error = code, "refresh refused: the grant is dropped, asked again");
                let _ = url.store.drop_grant(user, name, Some(&sealed)).await;
                self.grant_event(t, who, "refresh_refused", Some((started.elapsed(), Duration::ZERO)));
                Err(self.ask(t, url, who).await)
            }
            Err(e) => {
                tracing::warn!(downstream = name, error = %e, "refresh failed");
                self.grant_event(t, who, "refresh_failed", Some((started.elapsed(), Duration::ZERO)));
                Err(unavailable())
            }
        };
        let _ = url.store.unlock_grant(user, name, &holder).await;
        out
    }

    /// Counts (and, for what reaches the third party, audits) a grant's event.
    pub(crate) fn grant_event(
        &self,
        t: &Target,
        who: Caller<'_>,
        event: &'static str,
        took: Option<(Duration, Duration)>,
    ) {
        self.metrics.grants.with_label_values(&[t.name.as_str(), event]).inc();
        if let (Some(audit), Some((duration, life))) = (&self.audit, took) {
            audit.record_downstream(mcpfleet_core::DownstreamRecord {
                at: SystemTime::now(),
                event: mcpfleet_core::DownstreamEvent::Authorization,
                downstream: t.name.clone(),
                outcome: event,
                principal: who.principal.user.as_str().to_owned(),
                client_id: who.principal.client_id.as_ref().map(|c| c.chars().take(200).collect()),
                duration,
                trace_id: who.trace_id.to_owned(),
                lifetime: (!life.is_zero()).then_some(life),
            });
        }
    }
}
