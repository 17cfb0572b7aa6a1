//! A URL-mode grant's refresh under its lock, against a real redis-server:
//! - a caller that read the grant just before another replica stored its refresh, and takes the lock just after
//!   that replica let go, uses the fresh grant and never spends the refresh token a second time;
//! - a caller that waits on another replica's lock, whose refresh is refused (the grant dropped), asks the user
//!   again at once instead of waiting out the lock.
//!
//! The store below is the production `RedisStore`; the wrapper only plays "another replica" at the one moment that
//! cannot be timed from outside: between this caller's read of the grant and its lock.

#![expect(clippy::unwrap_used, reason = "a test's helpers fail by panicking")]

use async_trait::async_trait;
use mcpfleet_core::{Principal, Scopes, UserKey};
use mcpfleet_downstream::{Caller, Document, DownstreamMetrics, Downstreams, UrlMode, Vault};
use mcpfleet_state::{GrantStore, RedisConfig, RedisStore};
use mcpfleet_testkit::RedisServer;
use mcpfleet_tools::downstream::DownstreamError;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NAME: &str = "forge";

fn now_ms() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn vault() -> Vault {
    Vault::new(vec![("k1".to_owned(), vec![7; 32])]).unwrap()
}

fn sealed(user: &UserKey, access: &str, expires_ms: u64, refresh: &str) -> Vec<u8> {
    let plain = serde_json::json!({ "a": access, "e": expires_ms, "r": refresh }).to_string();
    vault().seal(user.as_str(), NAME, plain.as_bytes()).unwrap()
}

/// What "another replica" does at this caller's first lock.
#[derive(Debug)]
enum Other {
    /// It has refreshed: it stored this grant and let go of the lock.
    Refreshed(Vec<u8>),
    /// It holds the lock, and its refresh is refused: it drops the grant.
    HoldsAndDrops,
}

/// The production store, with another replica's move just before this caller's first lock.
#[derive(Debug)]
struct OtherReplicaRefreshes {
    inner: RedisStore,
    other: Other,
    locks: AtomicUsize,
}

#[async_trait]
impl GrantStore for OtherReplicaRefreshes {
    async fn grant(&self, user: &UserKey, downstream: &str) -> mcpfleet_state::Result<Option<Vec<u8>>> {
        self.inner.grant(user, downstream).await
    }
    async fn put_grant(&self, u: &UserKey, d: &str, sealed: &[u8], ttl: Duration) -> mcpfleet_state::Result<()> {
        self.inner.put_grant(u, d, sealed, ttl).await
    }
    async fn drop_grant(&self, u: &UserKey, d: &str, sealed: Option<&[u8]>) -> mcpfleet_state::Result<bool> {
        self.inner.drop_grant(u, d, sealed).await
    }
    async fn lock_grant(&self, u: &UserKey, d: &str, holder: &str, ttl: Duration) -> mcpfleet_state::Result<bool> {
        if self.locks.fetch_add(1, Ordering::SeqCst) == 0 {
            match &self.other {
                Other::Refreshed(fresh) => self.inner.put_grant(u, d, fresh, Duration::from_secs(600)).await?,
                Other::HoldsAndDrops => {
                    self.inner.drop_grant(u, d, None).await?;
                    return Ok(false);
                }
            }
        }
        self.inner.lock_grant(u, d, holder, ttl).await
    }
    async fn unlock_grant(&self, u: &UserKey, d: &str, holder: &str) -> mcpfleet_state::Result<()> {
        self.inner.unlock_grant(u, d, holder).await
    }
    async fn put_authorization(&self, id: &str, record: &str, ttl: Duration) -> mcpfleet_state::Result<()> {
        self.inner.put_authorization(id, record, ttl).await
    }
    async fn authorization(&self, id: &str) -> mcpfleet_state::Result<Option<String>> {
        self.inner.authorization(id).await
    }
    async fn take_authorization(&self, id: &str) -> mcpfleet_state::Result<Option<String>> {
        self.inner.take_authorization(id).await
    }
}

/// Carol's grant, within its skew of expiry, in a real Redis; her caller; and downstreams over the wrapped store
/// whose token endpoint is a closed port (so a refresh, if one were sent, fails the call as unavailable).
async fn setup(
    other: impl FnOnce(&UserKey) -> Other,
) -> (RedisServer, String, Principal, Arc<OtherReplicaRefreshes>, Downstreams) {
    let redis = RedisServer::start();
    let cfg = RedisConfig::new(redis.url());
    let prefix = cfg.prefix.clone();
    let inner = RedisStore::connect(cfg).await.unwrap();
    let principal = Principal::new("https://issuer.test".into(), "carol".into(), None, Scopes::All);
    let user = principal.user.clone();
    let stale = sealed(&user, "old-access", now_ms() + 500, "refresh-1");
    inner.put_grant(&user, NAME, &stale, Duration::from_secs(600)).await.unwrap();
    let store = Arc::new(OtherReplicaRefreshes { inner, other: other(&user), locks: AtomicUsize::new(0) });
    let doc = Document::parse(
        "downstreams:\n  forge:\n    base_url: http://127.0.0.1:9/\n    authorization_code:\n      \
         authorization_endpoint: http://127.0.0.1:1/auth\n      token_endpoint: http://127.0.0.1:1/token\n      \
         client: { id: fleet, auth: client_secret_post, secret: { env: S } }\n      scope: [repo]\n    \
         skew_seconds: 5\n",
    )
    .unwrap();
    let url = UrlMode { store: store.clone(), vault: vault(), origin: "http://127.0.0.1:9".into(), signin: None };
    let ds = Downstreams::new(
        doc.resolve(&|_| Ok("s".into())).unwrap(),
        Some(url),
        DownstreamMetrics::unregistered([NAME]).unwrap(),
        None,
    )
    .unwrap();
    (redis, prefix, principal, store, ds)
}

fn caller(principal: &Principal) -> Caller<'_> {
    Caller { principal, subject: None, trace_id: "0af7651916cd43dd8448eb211c80319c", session: None }
}

#[tokio::test]
async fn a_caller_that_locks_after_another_replica_refreshed_uses_its_grant_and_spends_no_refresh_token() {
    let (redis, prefix, principal, store, ds) =
        setup(|user| Other::Refreshed(sealed(user, "fresh-access", now_ms() + 600_000, "refresh-2"))).await;
    let user = principal.user.clone();

    let token = ds.token(NAME, caller(&principal)).await.expect("the grant the other replica stored");
    assert_eq!(token.secret(), "fresh-access");
    assert_eq!(store.locks.load(Ordering::SeqCst), 1, "one lock taken");
    let held = redis.raw(&["EXISTS", &format!("{prefix}{{u:{}}}:dgl:{NAME}", user.as_str())]);
    assert_eq!(held.trim(), "0", "the lock is let go");
    let Other::Refreshed(fresh) = &store.other else { unreachable!() };
    assert_eq!(store.grant(&user, NAME).await.unwrap().as_ref(), Some(fresh), "the fresh grant stays");
}

#[tokio::test]
async fn a_caller_waiting_on_a_refresh_that_is_refused_asks_the_user_again_at_once() {
    let (_redis, _prefix, principal, store, ds) = setup(|_| Other::HoldsAndDrops).await;
    let started = std::time::Instant::now();
    let e = ds.token(NAME, caller(&principal)).await.expect_err("no grant left");
    let DownstreamError::AuthorizationRequired(request) = e else { panic!("asked again, not {e:?}") };
    assert_eq!(request.downstream, NAME);
    assert!(request.url.starts_with("http://127.0.0.1:9/downstream/start/"), "{}", request.url);
    // Not the lock's whole life (the downstream's timeout twice, plus a second: 11 s) but the next poll.
    assert!(started.elapsed() < Duration::from_secs(3), "asked after {:?}", started.elapsed());
    assert_eq!(store.locks.load(Ordering::SeqCst), 1, "one attempt at the lock");
}
