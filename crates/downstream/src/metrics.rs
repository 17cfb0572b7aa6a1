//! The `mcp_downstream_*` metrics (docs/OPERATIONS.md, docs/DOWNSTREAM.md). Labels are the configured downstream
//! names and fixed outcome words: never a user, a URL or a token.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// The downstream metrics of one replica.
#[derive(Clone, Debug)]
pub struct DownstreamMetrics {
    /// `mcp_downstream_exchanges_total{downstream,outcome}`: token exchanges sent to the authorization server;
    /// `outcome` is `issued`, `refused` (an OAuth error about the user), `unavailable` (no answer, 5xx, 429, our
    /// client refused) or `invalid_response`.
    pub exchanges: IntCounterVec,
    /// `mcp_downstream_exchange_duration_seconds{downstream}`: how long each exchange took, whatever its outcome.
    pub exchange_seconds: HistogramVec,
    /// `mcp_downstream_actor_tokens_total{downstream,outcome}`: the server's own client-credentials tokens
    /// fetched to send as `actor_token`.
    pub actor_tokens: IntCounterVec,
    /// `mcp_downstream_tokens_total{downstream,source}`: tokens handed to tools, by where they came from:
    /// `cache`, `exchange`, `shared` (another call's exchange in flight) or `negative_cache` (a failure kept).
    pub tokens: IntCounterVec,
    /// `mcp_downstream_requests_total{downstream,status}`: requests tools sent through the downstream client, by
    /// status class (`2xx`, `3xx`, `4xx`, `5xx`), `401` (the token was dropped) or `no_answer`.
    pub requests: IntCounterVec,
    /// `mcp_downstream_grants_total{downstream,event}`: URL-mode grants: `asked` (the client was sent a URL),
    /// `completed` (the third party's callback stored one), `refused_at_callback` (the third party did not
    /// exchange its code), `refreshed`, `refresh_refused` (dropped, asked again), `refresh_failed`, `expired` (no
    /// refresh token: asked again), `dropped` (the downstream refused its token).
    pub grants: IntCounterVec,
}

impl DownstreamMetrics {
    /// Registers the metrics in `registry`, each downstream's series at zero.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register<'a>(registry: &Registry, names: impl IntoIterator<Item = &'a str>) -> prometheus::Result<Self> {
        let m = Self::unregistered(names)?;
        registry.register(Box::new(m.exchanges.clone()))?;
        registry.register(Box::new(m.exchange_seconds.clone()))?;
        registry.register(Box::new(m.actor_tokens.clone()))?;
        registry.register(Box::new(m.tokens.clone()))?;
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.grants.clone()))?;
        Ok(m)
    }

    /// The metrics, registered nowhere.
    ///
    /// # Errors
    /// Never with these names; prometheus's constructors return a `Result`.
    pub fn unregistered<'a>(names: impl IntoIterator<Item = &'a str>) -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str, labels: &[&str]| IntCounterVec::new(Opts::new(name, help), labels);
        let m = Self {
            exchanges: counter(
                "mcp_downstream_exchanges_total",
                "Token exchanges (RFC 8693) sent to an authorization server, by downstream and outcome.",
                &["downstream", "outcome"],
            )?,
            exchange_seconds: HistogramVec::new(
                HistogramOpts::new("mcp_downstream_exchange_duration_seconds", "How long each token exchange took.")
                    .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
                &["downstream"],
            )?,
            actor_tokens: counter(
                "mcp_downstream_actor_tokens_total",
                "The server's own client-credentials tokens fetched to send as actor_token, by outcome.",
                &["downstream", "outcome"],
            )?,
            tokens: counter(
                "mcp_downstream_tokens_total",
                "Downstream tokens handed to tools, by where they came from (cache, exchange, shared, negative_cache).",
                &["downstream", "source"],
            )?,
            requests: counter(
                "mcp_downstream_requests_total",
                "Requests tools sent to a downstream, by status class, 401 (token dropped) or no_answer.",
                &["downstream", "status"],
            )?,
            grants: counter(
                "mcp_downstream_grants_total",
                "URL-mode grants by event: asked, completed, refreshed, refresh_refused, refresh_failed, expired, dropped.",
                &["downstream", "event"],
            )?,
        };
        for name in names {
            for outcome in ["issued", "refused", "unavailable", "invalid_response"] {
                m.exchanges.with_label_values(&[name, outcome]);
            }
            m.exchange_seconds.with_label_values(&[name]);
            for source in ["cache", "exchange", "shared", "negative_cache"] {
                m.tokens.with_label_values(&[name, source]);
            }
            for event in ["asked", "completed", "refreshed", "refresh_refused", "refresh_failed", "dropped"] {
                m.grants.with_label_values(&[name, event]);
            }
        }
        Ok(m)
    }
}
