//! RFC 8693 token exchange for a downstream in the same trust domain (docs/DOWNSTREAM.md, "Exchange"): the
//! caller's token as `subject_token`, the server's own actor token when configured, the answer counted, logged and
//! audited (never the token), kept in the replica's cache for the earlier of its life and the subject token's, less
//! the skew; a failure kept for the negative-cache interval.

use crate::cache::{Fetched, Key};
use crate::exchange::{ACCESS_TOKEN_TYPE, Issued, TokenRequest};
use crate::target::{ExchangeTarget, Target};
use crate::{Caller, Downstreams, Forget, Had, OAuthError, SubjectToken};
use mcpfleet_core::{DownstreamEvent, DownstreamRecord};
use mcpfleet_tools::downstream::{DownstreamError, DownstreamToken};
use std::time::{Instant, SystemTime};

impl Downstreams {
    /// An exchanged token for `t`, from the replica's cache or a new exchange.
    pub(crate) async fn exchanged(
        &self,
        t: &Target,
        x: &ExchangeTarget,
        who: Caller<'_>,
    ) -> Result<Had, DownstreamError> {
        let subject = who.subject.ok_or_else(|| DownstreamError::NeedsCallerRequest(t.name.clone()))?;
        let key = Key::of(&[b"exchange", t.name.as_bytes(), subject.raw.as_bytes()]);
        let (outcome, source) = self.cache.get(key, || self.exchange(t, x, who, subject)).await;
        self.metrics.tokens.with_label_values(&[t.name.as_str(), source.label()]).inc();
        outcome.map(|token| Had { token, forget: Forget::Cache(key) })
    }

    /// One exchange for `who`, audited and counted; what the cache keeps, and for how long.
    async fn exchange(&self, t: &Target, x: &ExchangeTarget, who: Caller<'_>, subject: &SubjectToken) -> Fetched {
        let started = Instant::now();
        let result = self.exchange_once(t, x, subject).await;
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
            Ok(Issued { token, lifetime, .. }) => {
                let mut keep = lifetime;
                if let Some(exp) = subject.expires() {
                    keep = keep.min(exp.duration_since(SystemTime::now()).unwrap_or_default());
                }
                Ok((token, keep.saturating_sub(t.skew)))
            }
            Err(e) => Err((e.for_tool(name), t.negative)),
        }
    }

    async fn exchange_once(
        &self,
        t: &Target,
        x: &ExchangeTarget,
        subject: &SubjectToken,
    ) -> Result<Issued, OAuthError> {
        let mut form = x.form.clone();
        form.push(("subject_token", subject.raw.to_string()));
        form.push(("subject_token_type", ACCESS_TOKEN_TYPE.to_owned()));
        if let Some(scope) = &x.actor_scope {
            let actor = self.actor_token(t, scope).await?;
            form.push(("actor_token", actor.secret().to_owned()));
            form.push(("actor_token_type", ACCESS_TOKEN_TYPE.to_owned()));
        }
        self.request(t, Some(x.issued_type)).send(form).await
    }

    pub(crate) fn request<'a>(&'a self, t: &'a Target, issued_type: Option<&'a str>) -> TokenRequest<'a> {
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
}
