//! mcpfleet-transport owns the Streamable HTTP endpoint `/mcp` for both protocol generations, chosen per request:
//! the session generation (2025-03-26, 2025-06-18, 2025-11-25: POST/GET/DELETE, sessions, SSE resumption,
//! server→client requests) and the stateless one (2026-07-28: per-request `_meta` and header checks,
//! `server/discover`, multi round-trip requests with a signed `requestState` (`mrtr`), `subscriptions/listen`, and
//! the tasks extension (`tasks`): durable tasks any replica answers for and any replica may run).
//! Both share the JSON-RPC envelope, Origin/Host checks, the bearer challenges and RFC 9728 metadata of the auth
//! crate's verdicts, per-tool scope checks, idempotency keys (`idempotency`), the admission of every request
//! through the limits crate (and its `RateLimit` headers), and the mapping of every error to an HTTP status and
//! JSON-RPC code. A tool's downstream tokens (`--downstreams`) come from `mcpfleet-downstream`, which the contexts
//! here call with the caller's token, carried past authentication only when downstreams are configured.
//!
//! It keeps no per-session state: a session, an idempotency record, a notice channel and a task live in the state
//! crate's [`Store`], so any replica serves any message. A replica holds only its open streams, its in-flight calls
//! and the task runs it is executing (each under a lease that another replica takes over if this one dies).
//!
//! It must not read the environment, and it must not know Redis: it talks to the [`Store`] traits only.

mod admin;
mod backoff;
mod call;
mod dev_oauth;
mod downstream;
mod downstream_pages;
mod drain;
mod error;
mod extract;
mod idempotency;
mod input;
mod jsonrpc;
mod mcp;
mod metrics;
mod observe;
mod origin;
pub mod policy;
mod request;
mod session;
mod shell;
mod sse;
mod stateless;
mod streams;
mod tasks;
mod trace;
mod well_known;

pub use admin::{AdminState, Readiness, admin_router};
pub use drain::{DRAIN_MAX_BYTES, DRAIN_MAX_TIME};
pub use error::{TransportError, code};
pub use mcpfleet_auth::{AuthError, Authenticator, NoAuth, Principal, ProtectedResource};
pub use mcpfleet_core::ProtocolVersion;
pub use mcpfleet_limits::Limiter;
pub use metrics::TransportMetrics;
pub use origin::HostPattern;
pub use stateless::mrtr::RequestStateKeys;
pub use streams::OpenStreams;
pub use tasks::{EXTENSION as TASKS_EXTENSION, TaskConfig, TaskMetrics, Tasks};

use axum::Router;
use axum::routing::get;
use mcpfleet_state::Store;
use mcpfleet_tools::Catalog;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How the endpoint behaves. Built once by the server's config module.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// Allowed `Origin` values (`scheme://host[:port]`, or `scheme://host:*` for any port). A request without
    /// `Origin` is allowed; one with an Origin not listed gets 403. An empty list allows no Origin at all.
    pub allowed_origins: Vec<HostPattern>,
    /// Allowed `Host` values (`host[:port]`, or `host:*`). Empty allows none.
    pub allowed_hosts: Vec<HostPattern>,
    pub max_body_bytes: usize,
    /// Largest total size of a request's headers (names, values and separators); more gets 431.
    pub max_header_bytes: usize,
    /// How long a client may take to send a request body; slower gets 408.
    pub body_timeout: Duration,
    /// How long a client may take to send a request head; slower connections are closed.
    pub header_read_timeout: Duration,
    pub session_idle_ttl: Duration,
    /// How long a replica's claim on a running call lasts without renewal; a resumer reports the call as lost
    /// this long after its replica died.
    pub lease_ttl: Duration,
    pub keep_alive: Duration,
    /// The `retry:` hint sent before the server closes a stream's connection.
    pub retry: Duration,
    /// A call that has produced nothing after this long switches to SSE, so that it gets keep-alives and can be
    /// resumed.
    pub sse_after: Duration,
    /// A call running longer than this subscribes to its session's doorbell, to hear cancellations.
    pub cancel_watch_after: Duration,
    /// How long a server→client request waits for the client's answer.
    pub client_request_timeout: Duration,
    /// How long a tool may run before it is stopped, unless it declares its own timeout.
    pub tool_timeout: Duration,
    pub server_name: String,
    pub server_version: String,
    /// The RFC 9728 metadata served under `/.well-known/oauth-protected-resource` and named by every challenge;
    /// `None` with `--auth none`.
    pub protected_resource: Option<ProtectedResource>,
    /// Scopes the operator requires per tool (`--tool-scope`), on top of those the tool declares.
    pub tool_scopes: BTreeMap<String, Vec<String>>,
    /// The dev issuer's JWKS, served at `/.well-known/jwks.json` with `--auth dev`.
    pub dev_jwks: Option<serde_json::Value>,
    /// The sign-in of `--auth dev` (RFC 8414 metadata, registration, authorization, token under `/oauth/`). With
    /// it, the RFC 9728 metadata and every challenge are named after the `Host` the client used.
    pub dev_oauth: Option<Arc<mcpfleet_auth::dev_oauth::DevAuthServer>>,
    /// Key the rate limit by the peer address instead of the principal (`--auth none`, where everyone is the
    /// same anonymous principal).
    pub rate_key_by_peer: bool,
    /// Signs and verifies the `requestState` of multi round-trip requests (2026-07-28); every replica of a fleet
    /// needs the same ring.
    pub request_state: RequestStateKeys,
    /// The `ttlMs` of cacheable 2026-07-28 results (`server/discover`, the lists, `resources/read`).
    pub cache_ttl: Duration,
    /// How long the result of a call with an idempotency key is kept for repeats.
    pub idempotency_ttl: Duration,
    /// Tasks (the 2026-07-28 tasks extension): workers, queue shards, lease, TTL and poll interval.
    pub tasks: TaskConfig,
    /// Whether DPoP-bound tokens are taken (`--dpop`): which challenges a refusal carries.
    pub dpop: mcpfleet_auth::dpop::DpopMode,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            allowed_origins: HostPattern::loopback_origins(),
            allowed_hosts: HostPattern::loopback_hosts(),
            max_body_bytes: 1024 * 1024,
            max_header_bytes: 16 * 1024,
            body_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            session_idle_ttl: Duration::from_secs(30 * 60),
            lease_ttl: Duration::from_secs(6),
            keep_alive: Duration::from_secs(15),
            retry: Duration::from_millis(1000),
            sse_after: Duration::from_secs(5),
            cancel_watch_after: Duration::from_millis(50),
            client_request_timeout: Duration::from_secs(60),
            tool_timeout: Duration::from_secs(120),
            server_name: "mcpfleet".to_owned(),
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            protected_resource: None,
            tool_scopes: BTreeMap::new(),
            dev_jwks: None,
            dev_oauth: None,
            rate_key_by_peer: false,
            request_state: RequestStateKeys::random(Duration::from_secs(600)),
            cache_ttl: Duration::from_secs(300),
            idempotency_ttl: Duration::from_secs(24 * 3600),
            tasks: TaskConfig::default(),
            dpop: mcpfleet_auth::dpop::DpopMode::Off,
        }
    }
}

/// Everything a request handler needs: one `Arc` of [`Shared`], since axum clones it for every request (the
/// middleware's copy and the handler's), so a clone is one atomic increment. Its fields read through `Deref`.
#[derive(Clone, Debug)]
pub struct AppState(Arc<Shared>);

impl AppState {
    #[must_use]
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }

    /// The same state with `change` applied (a copy of the fields when another clone still holds them).
    #[must_use]
    pub fn with(self, change: impl FnOnce(&mut Shared)) -> Self {
        let mut shared = Arc::unwrap_or_clone(self.0);
        change(&mut shared);
        Self::new(shared)
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The fields of [`AppState`].
#[derive(Clone, Debug)]
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub catalog: Arc<dyn Catalog>,
    pub auth: Arc<dyn Authenticator>,
    pub config: Arc<TransportConfig>,
    /// Fires on shutdown: every open stream ends with a `retry:` hint.
    pub shutdown: CancellationToken,
    /// Every running tool call. On shutdown the server stops accepting work, ends its streams, and waits here for
    /// the calls to finish (they keep committing to the store, so clients resume them on other replicas).
    pub calls: TaskTracker,
    pub metrics: TransportMetrics,
    /// Admits every request: the bucket, the session, the caps and the quotas, in one store call.
    pub limits: Arc<Limiter>,
    /// The catalog's input schemas, compiled: every `tools/call` is checked here before its tool runs.
    pub validator: Arc<mcpfleet_tools::validate::Validator>,
    /// The audit trail, when there is a database: every call's outcome is handed to it (it never blocks).
    pub audit: Option<Arc<dyn mcpfleet_core::AuditSink>>,
    /// The task runs this replica holds, and its workers (see `tasks`).
    pub tasks: Arc<Tasks>,
    /// The policy in force (docs/POLICY.md): each caller's plan, the tools it lists, the conditions on its calls.
    pub policy: Arc<policy::Policies>,
    /// The open streams of each principal here, which a revocation closes.
    pub streams: Arc<OpenStreams>,
    /// The downstream APIs tools may call for the caller (`--downstreams`, docs/DOWNSTREAM.md); `None`: none, and
    /// the caller's token is never carried past authentication.
    pub downstreams: Option<Arc<mcpfleet_downstream::Downstreams>>,
    /// The skills served (the `io.modelcontextprotocol/skills` extension, docs/SKILLS.md), loaded at start and
    /// never changed; empty: the extension is not declared.
    pub skills: Arc<mcpfleet_skills::Skills>,
}

/// Starts this replica's task workers (the 2026-07-28 tasks extension: taking queued tasks, renewing leases,
/// taking over those of dead replicas), once; [`serve`] does it too. A router served by another listener needs it.
pub fn start_workers(state: &AppState) {
    tasks::start(state);
}

/// The axum router serving `/mcp`, the protected resource metadata, and (in dev) the issuer's JWKS.
pub fn router(state: AppState) -> Router {
    // OPTIONS is a route of its own so that `observe` (which answers CORS preflights first) sees it.
    let mcp = get(shell::get).post(shell::post).delete(shell::delete).options(shell::other).fallback(shell::other);
    let mut r = Router::new()
        .route("/mcp", mcp.route_layer(axum::middleware::from_fn_with_state(state.clone(), observe::observe)));
    if let Some(pr) = &state.config.protected_resource {
        for path in pr.metadata_paths() {
            r = r.route(&path, get(well_known::resource_metadata).options(well_known::preflight));
        }
    }
    if state.config.dev_jwks.is_some() {
        r = r.route("/.well-known/jwks.json", get(well_known::dev_jwks).options(well_known::preflight));
    }
    if state.downstreams.as_ref().is_some_and(|d| d.pages_origin().is_some()) {
        // URL-mode downstreams: the start, signed-in and callback pages (docs/DOWNSTREAM.md).
        r = downstream_pages::routes(r);
    }
    if state.config.dev_oauth.is_some() {
        // `--auth dev`: the sign-in, and the client's Host in scope for every challenge (origin::with_host).
        r = dev_oauth::routes(r, &state).layer(axum::middleware::from_fn_with_state(state.clone(), origin::with_host));
    }
    r.with_state(state)
}

/// The router of a replica still starting (its store has not answered yet, so there is no state to serve from):
/// every request gets the answer of an unavailable store, 503 with `Retry-After` and a JSON-RPC error
/// (`docs/ERRORS.md`). A replica serves it on its listener while it waits for Redis, until [`router`] takes over.
pub fn starting_router() -> Router {
    Router::new()
        .fallback(|| async { TransportError::Unavailable(mcpfleet_state::StateError::Timeout(Duration::ZERO)) })
}

impl AppState {
    /// Every scope a caller needs for `tool`: the tool's own and the operator's.
    pub(crate) fn tool_scopes(&self, tool: &str) -> Vec<String> {
        let mut s = self.catalog.tool_scopes(tool);
        if let Some(extra) = self.config.tool_scopes.get(tool) {
            s.extend(extra.iter().cloned());
        }
        s.sort();
        s.dedup();
        s
    }
}

/// The address a request's connection came from (request extension).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerAddr(pub(crate) std::net::SocketAddr);

/// `N` random bytes from the thread's CSPRNG, base64url without padding.
fn random_base64<const N: usize>() -> String {
    use base64::Engine as _;
    let bytes: [u8; N] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// 192 random bits, base64url (32 characters): lease tokens, trace ids.
pub(crate) fn random_token() -> String {
    random_base64::<24>()
}

/// A session id: 22 base64url characters of 16 bytes, a tag (`1`), 11 random bytes (88 bits: with the owner
/// check by key name, far beyond guessing) and the Unix second it was made, big-endian, so that the `DELETE` that
/// ends it can say how long it lasted without a byte of it in Redis (`mcp_server_session_duration_seconds`).
pub(crate) fn new_session_id() -> String {
    use base64::Engine as _;
    let mut bytes = [0u8; 16];
    bytes[0] = SESSION_ID_TAG;
    bytes[1..12].copy_from_slice(&rand::random::<[u8; 11]>());
    let now = u32::try_from(mcpfleet_core::time::epoch_secs()).unwrap_or(u32::MAX);
    bytes[12..].copy_from_slice(&now.to_be_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The first byte of a session id that carries its start ([`new_session_id`]).
const SESSION_ID_TAG: u8 = 1;

/// How long the session `id` has lasted, if its id says when it began (one made by [`new_session_id`]; an id of
/// a build before it, 16 random bytes, is believed only when it reads as a start in the past year: rarely).
pub(crate) fn session_age(id: &str) -> Option<std::time::Duration> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(id).ok()?;
    let bytes: [u8; 16] = bytes.try_into().ok()?;
    if bytes[0] != SESSION_ID_TAG {
        return None;
    }
    let began = u64::from(u32::from_be_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]));
    let age = mcpfleet_core::time::epoch_secs().checked_sub(began)?;
    (age <= 366 * 24 * 3600).then(|| std::time::Duration::from_secs(age))
}

/// Serves `/mcp` on `listener` until `shutdown` fires, then waits for the open connections to close (every SSE
/// stream ends with a `retry:` hint when `shutdown` fires). Each connection gets TCP_NODELAY, a deadline for its
/// request head (`header_read_timeout`, against slow-header clients) and a bounded read buffer.
///
/// # Errors
/// None today: accept errors are logged and retried.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: CancellationToken) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt as _;
    let cfg = state.config.clone();
    let state = state.with(|s| s.shutdown = shutdown.clone());
    tasks::start(&state);
    let app = router(state);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "set_nodelay failed");
        }
        let svc = app.clone().map_request(move |mut req: http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(PeerAddr(peer));
            // A body nobody reads is drained (see `drain`), unless the client waits for `100 Continue`: it sends
            // nothing until the body is read, so a refusal needs no drain and must not ask for the body.
            if req.headers().contains_key(http::header::EXPECT) {
                req.map(axum::body::Body::new)
            } else {
                req.map(|b| axum::body::Body::new(drain::DrainOnDrop::new(b)))
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(cfg.header_read_timeout)
            .max_buf_size(cfg.max_header_bytes.max(8192) + 8192);
        let conn = builder.serve_connection(TokioIo::new(tcp), hyper_util::service::TowerToHyperService::new(svc));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_says_when_it_began_and_nothing_else_does() {
        let id = new_session_id();
        assert_eq!(id.len(), 22);
        assert!(mcpfleet_state::SessionId::parse(&id).is_some(), "a valid session id: {id}");
        assert!(session_age(&id).is_some_and(|a| a.as_secs() <= 1));
        assert_ne!(new_session_id(), id, "88 random bits");
        // An id of a build before it (16 random bytes, whose first is not the tag), and ids that are not ours.
        assert_eq!(session_age("AAAAAAAAAAAAAAAAAAAAAA"), None);
        assert_eq!(session_age("not base64!"), None);
        assert_eq!(session_age("AQ"), None);
    }
}
