//! The behavioural contract of [`Store`]. Every check runs twice: against [`MemoryStore`] and against
//! [`RedisStore`] on a redis-server of its own, so the embedded store and the production one cannot drift apart.
//! The Redis runs also look inside Redis where the contract promises something about it (nothing is left behind
//! once a session ends, the event log is really trimmed).
//!
//! Each check is an `async fn(Kind)`; `contract!` turns it into a module with a `memory` and a `redis` test, so a
//! failure reads `streams_replay_by_stream::redis`. Every wait for a ring has a deadline: a broken store fails,
//! it never hangs. Two more tests run every check in turn on a 6-node Redis Cluster and on a Sentinel setup (one
//! topology each, a prefix per check), so that every script, pipeline and channel is proven on them too: no
//! `CROSSSLOT`, sharded channels that ring.

#![expect(clippy::expect_used, reason = "a contract check fails by panicking with what it expected")]

use mcpfleet_core::time::epoch_ms;
use mcpfleet_state::{
    Admission, Admitted, AfterTake, AppendOptions, Asked, BucketSpec, CancelOutcome, Claim, ClaimSpec, Event, EventId,
    IdempotencyKey, LeaseToken, MemoryStore, NewSession, NewTask, OpenStream, QueueStats, RedisConfig, RedisStore,
    RedisTopology, Refusal, Requeue, Ring, RunCheck, STANDALONE_STREAM, SessionId, SessionInfo, SessionKey, SessionOp,
    SlotSet, SlotSpec, StateError, Store, StreamState, Subscription, TaskEnd, TaskId, TaskKey, TaskStatus, TaskView,
    UpdateOutcome, UserKey, WindowSpec,
};
use mcpfleet_testkit::{RedisCluster, RedisSentinel, RedisServer};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a ring may take to arrive.
const RING_WAIT: Duration = Duration::from_secs(5);
/// How long we listen to conclude that no ring is coming.
const QUIET: Duration = Duration::from_millis(300);
/// An idle TTL no check outlives.
const LONG: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------------------------
// Harness

#[derive(Clone, Copy, Debug)]
enum Kind {
    Memory,
    Redis,
    /// A topology shared by every check of one run (a cluster, a sentinel setup), each under its own prefix.
    Shared(&'static RedisConfig),
}

/// One check's store. Fields drop in order: the store goes before its redis-server.
struct Harness {
    store: Arc<dyn Store>,
    backend: Backend,
}

enum Backend {
    Memory(MemoryStore),
    Redis { server: Box<RedisServer>, cfg: RedisConfig },
    Shared { cfg: RedisConfig },
}

fn next() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

impl Harness {
    async fn new(kind: Kind) -> Self {
        Self::with_max_events(kind, None).await
    }

    async fn with_max_events(kind: Kind, max_events: Option<usize>) -> Self {
        match kind {
            Kind::Memory => {
                let m = max_events.map_or_else(MemoryStore::new, MemoryStore::with_max_events);
                Self { store: Arc::new(m.clone()), backend: Backend::Memory(m) }
            }
            Kind::Redis => {
                let server = RedisServer::start();
                let mut cfg = RedisConfig { prefix: format!("contract{}:", next()), ..RedisConfig::new(server.url()) };
                if let Some(n) = max_events {
                    cfg.max_events = n;
                }
                let store = RedisStore::connect(cfg.clone()).await.expect("connect to redis");
                Self { store: Arc::new(store), backend: Backend::Redis { server: Box::new(server), cfg } }
            }
            Kind::Shared(shared) => {
                let mut cfg = RedisConfig { prefix: format!("contract{}:", next()), ..shared.clone() };
                if let Some(n) = max_events {
                    cfg.max_events = n;
                }
                let store = RedisStore::connect(cfg.clone()).await.expect("connect to the shared topology");
                Self { store: Arc::new(store), backend: Backend::Shared { cfg } }
            }
        }
    }

    /// Whether the store is a Redis one (a standalone server of the check's own, or a shared topology).
    fn is_redis(&self) -> bool {
        !matches!(self.backend, Backend::Memory(_))
    }

    fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// A second handle on the same state: another replica on the same Redis and prefix, or a clone of the memory
    /// store (clones share state).
    async fn replica(&self) -> Arc<dyn Store> {
        match &self.backend {
            Backend::Memory(m) => Arc::new(m.clone()),
            Backend::Redis { cfg, .. } | Backend::Shared { cfg } => {
                Arc::new(RedisStore::connect(cfg.clone()).await.expect("connect replica"))
            }
        }
    }

    fn redis(&self) -> Option<&RedisServer> {
        match &self.backend {
            Backend::Memory(_) | Backend::Shared { .. } => None,
            Backend::Redis { server, .. } => Some(server),
        }
    }

    /// The Redis keys under this harness's prefix; `None` for the memory store.
    fn redis_keys(&self) -> Option<Vec<String>> {
        match &self.backend {
            Backend::Memory(_) | Backend::Shared { .. } => None,
            Backend::Redis { server, cfg } => {
                Some(server.keys().into_iter().filter(|k| k.starts_with(&cfg.prefix)).collect())
            }
        }
    }

    /// A command run with `redis-cli --raw` on the node that holds its key (`None` for the memory store).
    fn raw(&self, args: &[&str]) -> Option<String> {
        let cli = |host_port: &str, extra: &[&str], args: &[&str]| {
            let (host, port) = host_port.rsplit_once(':').expect("host:port");
            let out = std::process::Command::new("redis-cli")
                .args(["-h", host, "-p", port, "--raw"])
                .args(extra)
                .args(args)
                .output()
                .expect("redis-cli");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        match &self.backend {
            Backend::Memory(_) => None,
            Backend::Redis { server, .. } => Some(server.raw(args)),
            Backend::Shared { cfg } => match &cfg.topology {
                RedisTopology::Cluster { nodes } => Some(cli(&nodes[0], &["-c"], args)),
                RedisTopology::Sentinel { sentinels, master } => {
                    let addr = cli(&sentinels[0], &[], &["SENTINEL", "get-master-addr-by-name", master]);
                    let mut lines = addr.lines();
                    let (host, port) = (lines.next().expect("master host"), lines.next().expect("master port"));
                    Some(cli(&format!("{host}:{port}"), &[], args))
                }
                RedisTopology::Standalone { .. } => unreachable!("a shared topology is a cluster or a sentinel setup"),
            },
        }
    }

    /// Empties the script cache of every data node (a restart or a failover does that); false for the memory store.
    fn flush_scripts(&self) -> bool {
        match &self.backend {
            Backend::Memory(_) => false,
            Backend::Redis { server, .. } => {
                assert_eq!(server.raw(&["SCRIPT", "FLUSH"]).trim(), "OK");
                true
            }
            Backend::Shared { cfg } => {
                let nodes = match &cfg.topology {
                    RedisTopology::Cluster { nodes } => nodes.clone(),
                    _ => Vec::new(),
                };
                if nodes.is_empty() {
                    assert_eq!(self.raw(&["SCRIPT", "FLUSH"]).expect("flush").trim(), "OK");
                }
                for n in nodes {
                    let (host, port) = n.rsplit_once(':').expect("host:port");
                    let out = std::process::Command::new("redis-cli")
                        .args(["-h", host, "-p", port, "SCRIPT", "FLUSH"])
                        .output()
                        .expect("redis-cli");
                    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK", "SCRIPT FLUSH on {n}");
                }
                true
            }
        }
    }

    /// `suffix` under the store's prefix (`None` for the memory store).
    fn prefixed(&self, suffix: &str) -> Option<String> {
        match &self.backend {
            Backend::Memory(_) => None,
            Backend::Redis { cfg, .. } | Backend::Shared { cfg } => Some(format!("{}{suffix}", cfg.prefix)),
        }
    }

    /// The Redis key of a session's event log.
    fn redis_events_key(&self, key: &SessionKey) -> Option<String> {
        match &self.backend {
            Backend::Memory(_) => None,
            Backend::Redis { cfg, .. } | Backend::Shared { cfg } => {
                Some(format!("{}{{u:{}}}:ev:{}", cfg.prefix, key.user.as_str(), key.id.as_str()))
            }
        }
    }
}

type Check = fn(Kind) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// Generates a `memory` and a `redis` test for each check, and the list of them all for the topology runs.
macro_rules! contract {
    ($($check:ident),* $(,)?) => {
        $(
        mod $check {
            #[tokio::test]
            async fn memory() {
                super::$check(super::Kind::Memory).await;
            }

            #[tokio::test]
            async fn redis() {
                super::$check(super::Kind::Redis).await;
            }
        }
        )*

        /// Every check, by name.
        const CHECKS: &[(&str, Check)] = &[$((stringify!($check), |k| Box::pin($check(k)))),*];
    };
}

/// Runs every check in turn against `cfg`'s topology; a failure names the check and the topology.
async fn run_all(topology: &str, cfg: RedisConfig) {
    let cfg: &'static RedisConfig = Box::leak(Box::new(cfg));
    for (name, check) in CHECKS {
        eprintln!("{topology}: {name}");
        if tokio::time::timeout(Duration::from_secs(60), check(Kind::Shared(cfg))).await.is_err() {
            panic!("{topology}: {name} did not finish in 60 s");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let cfg = RedisConfig {
        durable_replicas: 1,
        ..RedisConfig::with_topology(RedisTopology::Cluster { nodes: cluster.seeds() })
    };
    run_all("redis cluster", cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_check_behind_sentinel() {
    let sentinel = RedisSentinel::start();
    let cfg = RedisConfig {
        durable_replicas: 1,
        ..RedisConfig::with_topology(RedisTopology::Sentinel {
            sentinels: sentinel.sentinels(),
            master: sentinel.master_name().to_owned(),
        })
    };
    run_all("sentinel", cfg).await;
}

contract!(
    sessions_create_touch_and_ownership,
    sessions_idle_ttl,
    sessions_delete,
    streams_replay_by_stream,
    streams_sequenced_appends_are_written_once,
    streams_final_event_and_errors,
    cursors_gone,
    cursors_gone_after_trim,
    leases_expire_and_abandon,
    leases_renew_and_append_extend,
    leases_standalone_takeover,
    a_listener_that_falls_behind_is_told_and_loses_nothing,
    routing_responses,
    routing_cancellation,
    routing_doorbells_are_per_session,
    routing_shared_subscriptions,
    replicas_share_state,
    limits_bucket,
    limits_session_cap,
    limits_sessions_opened_without_a_cap_count_once_touched,
    limits_slots_and_windows,
    limits_admissions_at_once_decide_as_one_by_one,
    notices_reach_the_principal_on_every_replica,
    idempotency_runs_once_and_keeps_the_result,
    tasks_create_get_and_cap,
    tasks_expire_with_their_ttl,
    tasks_update_answers_and_resume,
    tasks_cancel,
    tasks_terminal_states_never_change,
    tasks_generations_fence_old_runs,
    tasks_queue_hands_out_and_settles,
    tasks_queue_hands_over_stale_entries,
    tasks_leases_renew_and_sweep,
    tasks_read_beside_an_admission,
    tasks_queue_consumers_are_tidied,
    tasks_queue_bell_rings_every_replica,
    scripts_reload_after_the_cache_empties,
    membership_records_each_replicas_layout,
    declarations_are_compared_per_fact_and_expire,
    dpop_proofs_are_admitted_once_on_any_replica,
    policy_versions_are_stored_and_announced,
    revocations_refuse_in_the_admission_and_are_listed_and_announced,
    tenant_windows_lease_what_is_left_to_any_replica,
    grants_are_per_user_and_downstream_locked_once_and_taken_once,
);

// ---------------------------------------------------------------------------------------------------------------
// Helpers

/// The Redis key of a session's event log (empty for the memory store, which has none).
fn events_key(h: &Harness, key: &SessionKey) -> String {
    h.redis_events_key(key).unwrap_or_default()
}

fn user(name: &str) -> UserKey {
    UserKey::new(name).expect("valid user key")
}

fn session_id() -> SessionId {
    SessionId::parse(&format!("sess-{:016}", next())).expect("valid session id")
}

fn key_for(name: &str) -> SessionKey {
    SessionKey { user: user(name), id: session_id() }
}

fn new_session(idle_ttl: Duration) -> NewSession {
    NewSession {
        protocol_version: "2025-06-18".to_owned(),
        client_capabilities: r#"{"roots":{"listChanged":true}}"#.to_owned(),
        idle_ttl,
    }
}

/// A fresh session of alice's.
async fn session(store: &dyn Store, idle_ttl: Duration) -> SessionKey {
    let key = key_for("alice");
    create(store, &key, &new_session(idle_ttl)).await.expect("create session");
    key
}

fn token(t: &str) -> LeaseToken {
    LeaseToken(t.to_owned())
}

fn post(request_id: &str, lease: Duration) -> OpenStream {
    OpenStream::Post { request_id: request_id.to_owned(), token: token(&format!("tok-{request_id}")), lease }
}

/// Creates a session the way the transport does: an admission with `SessionOp::Create` (no cap).
async fn create(store: &dyn Store, key: &SessionKey, s: &NewSession) -> Result<(), StateError> {
    let op = SessionOp::Create { id: &key.id, session: s, max_sessions: 0 };
    match store.admit(&Admission { session: op, ..Admission::new(&key.user) }).await?.refused {
        None => Ok(()),
        Some(_) => Err(StateError::Conflict),
    }
}

async fn open_post(store: &dyn Store, key: &SessionKey, request_id: &str, lease: Duration) -> (u64, EventId) {
    store.open_stream(key, &post(request_id, lease)).await.expect("open post stream")
}

async fn append(store: &dyn Store, key: &SessionKey, stream: u64, data: &str) -> EventId {
    store.append(key, stream, data, &AppendOptions::default()).await.expect("append")
}

async fn append_final(store: &dyn Store, key: &SessionKey, stream: u64, data: &str) -> EventId {
    store
        .append(key, stream, data, &AppendOptions { is_final: true, ..AppendOptions::default() })
        .await
        .expect("append final")
}

/// The log position of an event, which orders events across streams (`EventId`'s `Ord` compares the stream first).
fn pos(id: &EventId) -> (u64, u64) {
    (id.ms, id.seq)
}

/// Everything of `stream` after `cursor`, in pages of `page`, following the returned cursor.
async fn read_all(store: &dyn Store, key: &SessionKey, stream: u64, cursor: &EventId, page: usize) -> Vec<Event> {
    let mut out = Vec::new();
    let mut cursor = *cursor;
    let mut check = true;
    for _ in 0..10_000 {
        let (events, last) = store.read_after(key, stream, &cursor, check, page).await.expect("read_after");
        if last == cursor {
            assert!(events.is_empty(), "events without progress: {events:?}");
            return out;
        }
        assert_eq!(last.stream, stream, "the returned cursor names the stream that was read");
        assert!(pos(&last) > pos(&cursor), "cursor went backwards: {cursor} -> {last}");
        out.extend(events);
        cursor = last;
        // A page may end on another stream's entry: only the first cursor is an event of this stream.
        check = false;
    }
    panic!("read_all did not terminate");
}

/// Waits for `want`, skipping other rings (the stores may ring more than the contract requires).
async fn wait_for(sub: &mut Box<dyn Subscription>, want: &Ring) {
    let deadline = tokio::time::Instant::now() + RING_WAIT;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, sub.recv()).await {
            Ok(Some(r)) if &r == want => return,
            Ok(Some(r)) => seen.push(r),
            Ok(None) => panic!("subscription ended while waiting for {want:?}; saw {seen:?}"),
            Err(_) => panic!("no {want:?} within {RING_WAIT:?}; saw {seen:?}"),
        }
    }
}

/// Asserts that nothing rings for a while.
async fn assert_quiet(sub: &mut Box<dyn Subscription>, what: &str) {
    if let Ok(r) = tokio::time::timeout(QUIET, sub.recv()).await {
        panic!("{what}: expected no ring, got {r:?}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Sessions

async fn sessions_create_touch_and_ownership(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    s.ping().await.expect("ping");

    let key = session(s, LONG).await;
    let expected = SessionInfo {
        protocol_version: "2025-06-18".to_owned(),
        client_capabilities: r#"{"roots":{"listChanged":true}}"#.to_owned(),
        log_level: None,
    };
    assert_eq!(s.touch_session(&key).await.expect("touch"), Some(expected.clone()));

    assert!(s.set_log_level(&key, "debug").await.expect("set level"));
    let info = s.touch_session(&key).await.expect("touch");
    assert_eq!(info, Some(SessionInfo { log_level: Some("debug".to_owned()), ..expected.clone() }));
    assert!(s.set_log_level(&key, "error").await.expect("set level"));
    assert_eq!(s.touch_session(&key).await.expect("touch").and_then(|i| i.log_level).as_deref(), Some("error"));

    // Unknown ids and other users' keys name nothing.
    let unknown = SessionKey { user: key.user.clone(), id: session_id() };
    assert_eq!(s.touch_session(&unknown).await.expect("touch unknown"), None);
    assert!(!s.set_log_level(&unknown, "debug").await.expect("set level unknown"));
    let bob = SessionKey { user: user("bob"), id: key.id.clone() };
    assert_eq!(s.touch_session(&bob).await.expect("touch as bob"), None);
    assert!(!s.set_log_level(&bob, "debug").await.expect("set level as bob"));
    assert!(matches!(s.open_stream(&bob, &post("1", LONG)).await, Err(StateError::SessionNotFound)));

    // Creating an existing session again is refused and changes nothing.
    let again = NewSession { protocol_version: "2024-11-05".to_owned(), ..new_session(LONG) };
    let r = create(s, &key, &again).await;
    assert!(matches!(r, Err(StateError::Conflict)), "second create: {r:?}");
    let info = s.touch_session(&key).await.expect("touch").expect("still there");
    assert_eq!(info.protocol_version, "2025-06-18");
    assert_eq!(info.log_level.as_deref(), Some("error"));
}

async fn sessions_idle_ttl(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let ttl = Duration::from_millis(400);
    let key = session(s, ttl).await;
    let (k, priming) = open_post(s, &key, "1", LONG).await;
    let (g, _) =
        s.open_stream(&key, &OpenStream::Standalone { token: token("g"), lease: LONG }).await.expect("open get");
    assert_eq!(g, STANDALONE_STREAM);
    let a = append(s, &key, k, "kept alive").await;

    // Touching every 100 ms keeps the session, its log and its leases alive well past the TTL.
    for i in 0..8 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(s.touch_session(&key).await.expect("touch").is_some(), "session expired despite touch {i}");
    }
    let (events, _) = s.read_after(&key, k, &priming, true, 100).await.expect("log outlives its first TTL");
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), vec![a]);
    assert_eq!(s.stream_state(&key, k).await.expect("state"), StreamState::Running);
    if let Some(keys) = h.redis_keys() {
        assert_eq!(keys.len(), 4, "session, log, leases and the user's session index: {keys:?}");
    }

    // Without touches it is gone after the TTL, with everything it owned.
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    assert_eq!(s.touch_session(&key).await.expect("touch expired"), None);
    assert!(matches!(s.open_stream(&key, &post("2", LONG)).await, Err(StateError::SessionNotFound)));
    assert!(matches!(s.append(&key, k, "x", &AppendOptions::default()).await, Err(StateError::SessionNotFound)));
    assert!(matches!(s.read_after(&key, k, &priming, true, 10).await, Err(StateError::SessionNotFound)));
    assert!(!s.renew_lease(&key, k, &token("tok-1"), LONG).await.expect("renew expired"));
    if let Some(keys) = h.redis_keys() {
        assert_eq!(keys, Vec::<String>::new(), "keys left after expiry");
    }

    // The id can be used again once expired.
    create(s, &key, &new_session(LONG)).await.expect("create after expiry");
    let (k2, _) = open_post(s, &key, "1", LONG).await;
    assert_eq!(k2, 1, "a new session numbers its streams from 1");
}

async fn sessions_delete(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let (k, _) = open_post(s, &key, "1", LONG).await;
    append(s, &key, k, "one").await;
    let mut sub = s.subscribe(&key).await.expect("subscribe");

    let bob = SessionKey { user: user("bob"), id: key.id.clone() };
    assert!(s.delete_session(&bob).await.expect("delete as bob").is_none());
    assert!(s.touch_session(&key).await.expect("touch").is_some(), "bob's delete must not end alice's session");

    let ended = s.delete_session(&key).await.expect("delete").expect("it existed");
    assert_eq!(ended.protocol_version, new_session(LONG).protocol_version, "the version it was opened with");
    wait_for(&mut sub, &Ring::Closed).await;
    assert!(s.delete_session(&key).await.expect("delete twice").is_none());
    assert_eq!(s.touch_session(&key).await.expect("touch deleted"), None);
    assert!(matches!(s.open_stream(&key, &post("2", LONG)).await, Err(StateError::SessionNotFound)));
    assert!(matches!(s.append(&key, k, "x", &AppendOptions::default()).await, Err(StateError::SessionNotFound)));
    assert!(!s.cancel_request(&key, "1").await.expect("cancel in deleted session"));
    if let Some(keys) = h.redis_keys() {
        assert_eq!(keys, Vec::<String>::new(), "keys left after delete");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Streams and replay

async fn streams_sequenced_appends_are_written_once(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let (k, primed) = open_post(s, &key, "1", LONG).await;
    let at = |q: u64| AppendOptions { seq: Some(q), ..AppendOptions::default() };
    let e1 = s.append(&key, k, "one", &at(1)).await.expect("first write of 1");
    // A repeat (a retry after a timeout whose write landed, or the late write itself) writes nothing and tells
    // the id of the write that landed.
    assert_eq!(s.append(&key, k, "one", &at(1)).await.expect("repeat of 1"), e1);
    let e2 = s.append(&key, k, "two", &at(2)).await.expect("2");
    // A write of 1 that arrives after 2: nothing.
    assert!(matches!(s.append(&key, k, "one", &at(1)).await, Err(StateError::Superseded)));
    // Places may be skipped (an event given up on), never repeated.
    let e4 = s.append(&key, k, "four", &at(4)).await.expect("4");
    assert!(matches!(s.append(&key, k, "three", &at(3)).await, Err(StateError::Superseded)));
    let done = append_final(s, &key, k, "done").await;
    // After the final event, a late write of any place finds the stream finished.
    assert!(matches!(s.append(&key, k, "five", &at(5)).await, Err(StateError::StreamFinished)));
    let (events, _) = s.read_after(&key, k, &primed, true, 100).await.expect("read");
    let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
    assert_eq!(data, ["one", "two", "four", "done"], "each event once");
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), [e1, e2, e4, done]);
    // Another stream keeps its own places.
    let (k2, _) = open_post(s, &key, "2", LONG).await;
    let f1 = s.append(&key, k2, "other one", &at(1)).await.expect("stream 2, place 1");
    assert_ne!(f1, e1);
    if let Backend::Redis { server, cfg } = &h.backend {
        // The places of a finished stream are not kept.
        let hash = format!("{}{{u:{}}}:s:{}", cfg.prefix, key.user.as_str(), key.id.as_str());
        let fields = server.raw(&["HKEYS", &hash]);
        assert!(!fields.contains(&format!("sq:{k}")) && fields.contains(&format!("sq:{k2}")), "{fields}");
    }
}

async fn streams_replay_by_stream(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;

    let (k1, p1) = open_post(s, &key, "1", LONG).await;
    let (k2, p2) = open_post(s, &key, "2", LONG).await;
    let (k3, p3) = open_post(s, &key, "3", LONG).await;
    assert_eq!((k1, k2, k3), (1, 2, 3), "POST streams are numbered from 1");
    assert_eq!((p1.stream, p2.stream, p3.stream), (1, 2, 3), "priming ids name their stream");

    // Interleave two streams; the third stays silent.
    let a1 = append(s, &key, 1, "a1").await;
    let b1 = append(s, &key, 2, "b1").await;
    let a2 = append(s, &key, 1, "a2").await;
    let b2 = append_final(s, &key, 2, "b2").await;
    let a3 = append_final(s, &key, 1, "a3").await;
    let order = [p1, p2, p3, a1, b1, a2, b2, a3];
    assert!(order.windows(2).all(|w| pos(&w[0]) < pos(&w[1])), "ids must increase in commit order: {order:?}");
    assert_eq!([a1, a2, a3].map(|i| i.stream), [1, 1, 1]);
    assert_eq!([b1, b2].map(|i| i.stream), [2, 2]);

    let ev = |id: EventId, data: &str, is_final: bool| Event { id, data: data.to_owned(), is_final };
    let want1 = vec![ev(a1, "a1", false), ev(a2, "a2", false), ev(a3, "a3", true)];
    let want2 = vec![ev(b1, "b1", false), ev(b2, "b2", true)];

    let (events, last) = s.read_after(&key, 1, &p1, true, 100).await.expect("read stream 1");
    assert_eq!(events, want1);
    assert_eq!(last, a3, "the cursor is the last entry scanned");
    let (events, last) = s.read_after(&key, 2, &p2, true, 100).await.expect("read stream 2");
    assert_eq!(events, want2);
    assert_eq!(
        (last.stream, pos(&last)),
        (2, pos(&a3)),
        "the cursor is the last entry scanned, labelled with stream 2"
    );
    let (events, last) = s.read_after(&key, 3, &p3, true, 100).await.expect("read stream 3");
    assert_eq!(events, vec![], "stream 3 must not see other streams' events");
    assert_eq!(pos(&last), pos(&a3));

    // Resuming from the middle, and paging through the log one entry at a time.
    let (events, _) = s.read_after(&key, 1, &a1, true, 100).await.expect("resume stream 1");
    assert_eq!(events, want1[1..].to_vec());
    let (events, last) = s.read_after(&key, 1, &a3, true, 100).await.expect("read at the end");
    assert_eq!((events, last), (vec![], a3));
    for page in [1, 2, 3] {
        assert_eq!(read_all(s, &key, 1, &p1, page).await, want1, "stream 1 in pages of {page}");
        assert_eq!(read_all(s, &key, 2, &p2, page).await, want2, "stream 2 in pages of {page}");
    }
    // A page of one entry that is another stream's: no events, but the cursor moves on.
    let (events, last) = s.read_after(&key, 1, &p1, true, 1).await.expect("one-entry page");
    assert_eq!((events, last.stream, pos(&last)), (vec![], 1, pos(&p2)));
}

async fn streams_final_event_and_errors(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let (k, p) = open_post(s, &key, "1", LONG).await;
    let (other, _) = open_post(s, &key, "2", LONG).await;

    let last = append_final(s, &key, k, "result").await;
    assert_eq!(last.stream, k);
    for _ in 0..2 {
        let r = s.append(&key, k, "late", &AppendOptions::default()).await;
        assert!(matches!(r, Err(StateError::StreamFinished)), "append after final: {r:?}");
        let r = s.append(&key, k, "late", &AppendOptions { is_final: true, ..AppendOptions::default() }).await;
        assert!(matches!(r, Err(StateError::StreamFinished)), "second final: {r:?}");
    }
    assert_eq!(s.stream_state(&key, k).await.expect("state"), StreamState::Finished);
    let (events, _) = s.read_after(&key, k, &p, true, 100).await.expect("read");
    assert_eq!(
        events,
        vec![Event { id: last, data: "result".to_owned(), is_final: true }],
        "late appends left no trace"
    );

    // The other stream is unaffected; a stream that was never opened cannot be written.
    append(s, &key, other, "still open").await;
    let r = s.append(&key, 99, "x", &AppendOptions::default()).await;
    assert!(matches!(r, Err(StateError::StreamFinished)), "append to an unopened stream: {r:?}");
    assert_eq!(s.stream_state(&key, 99).await.expect("state of unopened"), StreamState::Finished);

    let unknown = key_for("alice");
    let r = s.append(&unknown, 1, "x", &AppendOptions::default()).await;
    assert!(matches!(r, Err(StateError::SessionNotFound)), "append to an unknown session: {r:?}");
    let r = s.stream_state(&unknown, 1).await;
    assert!(matches!(r, Err(StateError::SessionNotFound)), "state in an unknown session: {r:?}");
}

// ---------------------------------------------------------------------------------------------------------------
// Cursors

async fn cursors_gone(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let (k1, p1) = open_post(s, &key, "1", LONG).await;
    let (k2, p2) = open_post(s, &key, "2", LONG).await;
    let a = append(s, &key, k1, "a").await;
    let b = append(s, &key, k2, "b").await;

    // Another stream's cursor: refused when checked, a plain position otherwise.
    for (stream, cursor) in [(k1, p2), (k1, b), (k2, p1), (k2, a)] {
        let r = s.read_after(&key, stream, &cursor, true, 10).await;
        assert!(matches!(r, Err(StateError::CursorGone)), "stream {stream} from {cursor}: {r:?}");
    }
    let (events, _) = s.read_after(&key, k1, &p2, false, 10).await.expect("unchecked cursor");
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), vec![a]);

    // Cursors that never were events.
    let fabricated = [
        EventId { stream: k1, ms: 1, seq: 0 },
        EventId { stream: k1, ms: 0, seq: 0 },
        EventId { stream: k1, ms: p1.ms, seq: p1.seq + 1000 },
        EventId { stream: k1, ms: u64::MAX / 2, seq: 0 },
    ];
    for cursor in fabricated {
        for check in [true, false] {
            let r = s.read_after(&key, k1, &cursor, check, 10).await;
            assert!(matches!(r, Err(StateError::CursorGone)), "fabricated {cursor} (check {check}): {r:?}");
        }
    }

    // Another user's session, and an unknown one.
    let bob = SessionKey { user: user("bob"), id: key.id.clone() };
    assert!(matches!(s.read_after(&bob, k1, &p1, true, 10).await, Err(StateError::SessionNotFound)));
    assert!(matches!(s.read_after(&key_for("alice"), k1, &p1, true, 10).await, Err(StateError::SessionNotFound)));
}

async fn cursors_gone_after_trim(kind: Kind) {
    const MAX: usize = 5;
    // Redis trims `MAXLEN ~` only by whole macro nodes (100 entries by default), so write well past that.
    const WRITES: usize = 300;
    let h = Harness::with_max_events(kind, Some(MAX)).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let (k, priming) = open_post(s, &key, "1", LONG).await;
    let mut ids = Vec::new();
    for i in 0..WRITES {
        ids.push(append(s, &key, k, &format!("e{i}")).await);
    }

    let r = s.read_after(&key, k, &priming, true, 10).await;
    assert!(matches!(r, Err(StateError::CursorGone)), "priming cursor after trim: {r:?}");
    let r = s.read_after(&key, k, &ids[0], true, 10).await;
    assert!(matches!(r, Err(StateError::CursorGone)), "first event after trim: {r:?}");

    // The newest events are retained and still resume.
    let (events, last) = s.read_after(&key, k, &ids[WRITES - 2], true, 10).await.expect("recent cursor");
    assert_eq!(events.iter().map(|e| e.data.as_str()).collect::<Vec<_>>(), vec![format!("e{}", WRITES - 1)]);
    assert_eq!(last, ids[WRITES - 1]);

    if let (Some(len), Some(events_key)) = (h.raw(&["XLEN", &events_key(&h, &key)]), h.redis_events_key(&key)) {
        let len: usize = len.trim().parse().expect("XLEN");
        assert!(len < WRITES, "MAXLEN ~ {MAX} never trimmed: {len} entries");
        // Trimming to exactly MAX (as XTRIM without `~` does) loses everything older than the last MAX.
        let trimmed = h.raw(&["XTRIM", &events_key, "MAXLEN", &MAX.to_string()]).expect("XTRIM");
        assert_eq!(trimmed.trim().parse::<usize>().expect("XTRIM"), len - MAX);
    }
    // Exactly MAX events are kept by the memory store, and by Redis once trimmed exactly.
    let oldest_kept = WRITES - MAX;
    let r = s.read_after(&key, k, &ids[oldest_kept - 1], true, 10).await;
    assert!(matches!(r, Err(StateError::CursorGone)), "just outside the window: {r:?}");
    let (events, _) = s.read_after(&key, k, &ids[oldest_kept], true, 100).await.expect("oldest kept");
    assert_eq!(events.len(), MAX - 1);

    // Deleting the whole log (expiry or operator) also makes every cursor gone while the session lives.
    if let Some(deleted) = h.raw(&["DEL", &events_key(&h, &key)]) {
        assert_eq!(deleted.trim(), "1");
        let r = s.read_after(&key, k, &ids[WRITES - 1], true, 10).await;
        assert!(matches!(r, Err(StateError::CursorGone)), "log deleted: {r:?}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Leases

async fn leases_expire_and_abandon(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let request_id = r#""req-7""#;
    let lease = Duration::from_millis(300);
    let (k, priming) = open_post(s, &key, request_id, lease).await;
    let (alive, _) = open_post(s, &key, "8", LONG).await;
    assert_eq!(s.stream_state(&key, k).await.expect("state"), StreamState::Running);
    append(s, &key, k, "progress").await;

    // A running stream cannot be abandoned.
    assert_eq!(s.abandon_stream(&key, k, "nope").await.expect("abandon running"), None);
    assert_eq!(s.abandon_stream(&key, alive, "nope").await.expect("abandon running"), None);

    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    assert_eq!(
        s.stream_state(&key, k).await.expect("state"),
        StreamState::Abandoned { request_id: request_id.to_owned() }
    );
    assert_eq!(s.stream_state(&key, alive).await.expect("state"), StreamState::Running);

    let mut sub = s.subscribe(&key).await.expect("subscribe");
    let id = s.abandon_stream(&key, k, "replica died").await.expect("abandon").expect("the first abandon wins");
    assert_eq!(id.stream, k);
    wait_for(&mut sub, &Ring::Event(k)).await;
    assert_eq!(s.abandon_stream(&key, k, "again").await.expect("abandon twice"), None);
    assert_eq!(s.stream_state(&key, k).await.expect("state"), StreamState::Finished);

    let (events, _) = s.read_after(&key, k, &priming, true, 100).await.expect("read");
    let tail: Vec<_> = events.iter().map(|e| (e.data.as_str(), e.is_final)).collect();
    assert_eq!(tail, vec![("progress", false), ("replica died", true)]);
    assert_eq!(events.last().map(|e| e.id), Some(id));
    assert!(matches!(s.append(&key, k, "late", &AppendOptions::default()).await, Err(StateError::StreamFinished)));
    assert!(!s.renew_lease(&key, k, &token(&format!("tok-{request_id}")), LONG).await.expect("renew abandoned"));
    assert_eq!(s.stream_state(&key, alive).await.expect("state"), StreamState::Running);

    // Abandoning never leaves a log without an expiry, even one that had vanished (evicted, say).
    if let Some(redis) = h.redis() {
        let (k3, _) = open_post(s, &key, "9", lease).await;
        let events_key = h.redis_keys().expect("keys").into_iter().find(|k| k.contains(":ev:")).expect("log key");
        let _ = redis.raw(&["DEL", &events_key]);
        tokio::time::sleep(lease + Duration::from_millis(300)).await;
        s.abandon_stream(&key, k3, "lost").await.expect("abandon").expect("abandoned");
        let pttl: i64 = redis.raw(&["PTTL", &events_key]).trim().parse().expect("pttl");
        assert!(pttl > 0, "the recreated log expires with its session: PTTL {pttl}");
    }
}

async fn leases_renew_and_append_extend(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let lease = Duration::from_millis(300);

    // renew_lease keeps a stream running past its first lease.
    let (k, _) = open_post(s, &key, "1", lease).await;
    for i in 0..6 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(s.renew_lease(&key, k, &token("tok-1"), lease).await.expect("renew"), "renewal {i} refused");
    }
    assert_eq!(s.stream_state(&key, k).await.expect("state"), StreamState::Running);
    assert_eq!(s.abandon_stream(&key, k, "x").await.expect("abandon renewed"), None);

    // A live stream keeps its session alive past its idle TTL: renewals push the session's life out (each time
    // less than the idle TTL is left), with no request of the session's own.
    let short = session(s, Duration::from_millis(320)).await;
    let (ks, _) = open_post(s, &short, "s", lease).await;
    for i in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(s.renew_lease(&short, ks, &token("tok-s"), lease).await.expect("renew"), "renewal {i} refused");
    }
    assert_eq!(s.stream_state(&short, ks).await.expect("state"), StreamState::Running);
    assert!(s.touch_session(&short).await.expect("touch").is_some(), "the session outlived its idle TTL");

    // So does an append that asks for it.
    let (k2, _) = open_post(s, &key, "2", lease).await;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let opts = AppendOptions { lease: Some(lease), ..AppendOptions::default() };
        s.append(&key, k2, "tick", &opts).await.expect("append with lease");
    }
    assert_eq!(s.stream_state(&key, k2).await.expect("state"), StreamState::Running);

    // Once final, there is nothing to renew.
    append_final(s, &key, k, "done").await;
    assert!(!s.renew_lease(&key, k, &token("tok-1"), lease).await.expect("renew finished"));
    assert_eq!(s.stream_state(&key, k).await.expect("state"), StreamState::Finished);
    assert!(!s.renew_lease(&key, 99, &token("tok-99"), lease).await.expect("renew unopened"));
    let bob = SessionKey { user: user("bob"), id: key.id.clone() };
    assert!(!s.renew_lease(&bob, k2, &token("tok-2"), lease).await.expect("renew as bob"));
}

/// A doorbell's listener that falls behind is told (`Ring::Lagged`) rather than held up, and the log keeps every
/// event for it to re-read. On Redis the buffer is small (16 rings: each open stream holds one, issue 32), so 100
/// rings nobody reads make it lag.
async fn a_listener_that_falls_behind_is_told_and_loses_nothing(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let mut sub = s.subscribe(&key).await.expect("subscribe");
    let (k, primed) = open_post(s, &key, "1", LONG).await;
    for i in 0..100 {
        s.append(&key, k, &format!("e{i}"), &AppendOptions::default()).await.expect("append");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut lagged, mut rings) = (false, 0);
    while let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
        lagged |= r == Ring::Lagged;
        rings += 1;
    }
    if matches!(kind, Kind::Redis) {
        assert!(lagged, "100 unread rings make the listener lag ({rings} rings read)");
    } else {
        assert!(lagged || rings >= 101, "every ring, or a lag ({rings} rings read)");
    }
    let (events, _) = s.read_after(&key, k, &primed, false, 1000).await.expect("read");
    assert_eq!(events.len(), 100, "the log keeps every event");
}

async fn leases_standalone_takeover(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let mut sub = s.subscribe(&key).await.expect("subscribe");

    let (k, primed) =
        s.open_stream(&key, &OpenStream::Standalone { token: token("first"), lease: LONG }).await.expect("open get");
    assert_eq!((k, primed.stream), (STANDALONE_STREAM, STANDALONE_STREAM));
    wait_for(&mut sub, &Ring::Takeover("first".to_owned())).await;
    assert!(s.renew_lease(&key, k, &token("first"), LONG).await.expect("renew"));
    assert!(!s.renew_lease(&key, k, &token("stranger"), LONG).await.expect("renew with a wrong token"));
    // The holder's poll: renewed, and nothing in the log after its priming event (a store may say "maybe").
    let peek = s.renew_and_peek(&key, k, &token("first"), LONG, &primed).await.expect("peek");
    assert!(peek.is_some(), "renewed");
    if matches!(kind, Kind::Redis) {
        assert_eq!(peek, Some(false), "nothing after the priming event");
    }
    assert_eq!(s.renew_and_peek(&key, k, &token("stranger"), LONG, &primed).await.expect("peek"), None);

    // POST streams still count from 1 around the standalone stream.
    let (post_k, post_primed) = open_post(s, &key, "1", LONG).await;
    assert_eq!(post_k, 1);
    // Any stream's entry after the cursor is something to read (the drain skips other streams' entries).
    let peek = s.renew_and_peek(&key, k, &token("first"), LONG, &primed).await.expect("peek");
    assert_eq!(peek, Some(true), "an entry after the cursor");
    assert!(s.renew_and_peek(&key, k, &token("first"), LONG, &post_primed).await.expect("peek").is_some());

    let (k2, primed2) =
        s.open_stream(&key, &OpenStream::Standalone { token: token("second"), lease: LONG }).await.expect("reopen get");
    assert_eq!((k2, primed2.stream), (STANDALONE_STREAM, STANDALONE_STREAM));
    assert!(pos(&primed2) > pos(&primed));
    wait_for(&mut sub, &Ring::Takeover("second".to_owned())).await;
    assert!(!s.renew_lease(&key, k, &token("first"), LONG).await.expect("renew by the old holder"));
    assert!(s.renew_lease(&key, k, &token("second"), LONG).await.expect("renew by the new holder"));

    // The standalone stream takes events (it never finishes by itself) and rings them.
    let e = append(s, &key, STANDALONE_STREAM, "notification").await;
    assert_eq!(e.stream, STANDALONE_STREAM);
    wait_for(&mut sub, &Ring::Event(STANDALONE_STREAM)).await;
    let (events, _) = s.read_after(&key, STANDALONE_STREAM, &primed2, true, 10).await.expect("read get stream");
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), vec![e]);
}

// ---------------------------------------------------------------------------------------------------------------
// Routing

async fn routing_responses(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let (k, _) = open_post(s, &key, "1", LONG).await;
    let mut sub = s.subscribe(&key).await.expect("subscribe");

    let pending = |id: &str| AppendOptions { pending_request: Some(id.to_owned()), ..AppendOptions::default() };
    s.append(&key, k, r#"{"method":"sampling/createMessage","id":"s-1"}"#, &pending("s-1"))
        .await
        .expect("append request");
    wait_for(&mut sub, &Ring::Event(k)).await;

    let msg = r#"{"jsonrpc":"2.0","id":"s-1","result":{}}"#;
    assert!(s.deliver_response(&key, "s-1", msg).await.expect("deliver").delivered());
    wait_for(&mut sub, &Ring::Response("s-1".to_owned())).await;
    let bob = SessionKey { user: user("bob"), id: key.id.clone() };
    assert_eq!(s.take_response(&bob, "s-1").await.expect("take as bob"), None, "bob cannot take alice's response");
    assert_eq!(s.take_response(&key, "s-1").await.expect("take"), Some(msg.to_owned()));
    assert_eq!(s.take_response(&key, "s-1").await.expect("take twice"), None);

    // Only a pending request can be answered, and only once.
    assert!(!s.deliver_response(&key, "s-1", msg).await.expect("deliver twice").delivered());
    assert!(!s.deliver_response(&key, "never", msg).await.expect("deliver unknown").delivered());
    assert_eq!(s.take_response(&key, "never").await.expect("take unknown"), None);

    // A forgotten request refuses its late response.
    s.append(&key, k, "request 2", &pending("s-2")).await.expect("append request");
    s.forget_pending(&key, "s-2").await.expect("forget");
    assert!(!s.deliver_response(&key, "s-2", msg).await.expect("deliver forgotten").delivered());
    assert_eq!(s.take_response(&key, "s-2").await.expect("take forgotten"), None);

    // Other users and unknown sessions.
    s.append(&key, k, "request 3", &pending("s-3")).await.expect("append request");
    let r = s.deliver_response(&bob, "s-3", msg).await;
    assert!(matches!(r, Err(StateError::SessionNotFound)), "deliver as bob: {r:?}");
    let r = s.deliver_response(&key_for("alice"), "s-3", msg).await;
    assert!(matches!(r, Err(StateError::SessionNotFound)), "deliver to an unknown session: {r:?}");
    assert!(s.deliver_response(&key, "s-3", "three").await.expect("deliver s-3").delivered(), "s-3 is still pending");
    wait_for(&mut sub, &Ring::Response("s-3".to_owned())).await;
    assert_eq!(s.take_response(&key, "s-3").await.expect("take s-3").as_deref(), Some("three"));
    s.forget_pending(&key_for("carol"), "x").await.expect("forget in an unknown session");

    // The waiter's traceparent travels to whoever delivers the answer.
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = AppendOptions { pending_trace: Some(tp.to_owned()), ..pending("s-4") };
    s.append(&key, k, "request 4", &traced).await.expect("append traced request");
    let d = s.deliver_response(&key, "s-4", "four").await.expect("deliver s-4");
    assert_eq!(d, mcpfleet_state::Delivery::Delivered { waiter_trace: Some(tp.to_owned()) });
    let d = s.deliver_response(&key, "s-4", "four").await.expect("deliver s-4 twice");
    assert_eq!(d, mcpfleet_state::Delivery::NotPending);
}

async fn routing_cancellation(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let mut sub = s.subscribe(&key).await.expect("subscribe");

    assert!(!s.is_cancelled(&key, "7").await.expect("is_cancelled before"));
    assert!(s.cancel_request(&key, "7").await.expect("cancel"));
    wait_for(&mut sub, &Ring::Cancel("7".to_owned())).await;
    assert!(s.is_cancelled(&key, "7").await.expect("is_cancelled"));
    assert!(!s.is_cancelled(&key, "8").await.expect("is_cancelled other id"));
    let bob = SessionKey { user: user("bob"), id: key.id.clone() };
    assert!(!s.is_cancelled(&bob, "7").await.expect("is_cancelled as bob"));
    assert!(!s.cancel_request(&bob, "7").await.expect("cancel as bob"));
    assert!(!s.cancel_request(&key_for("alice"), "7").await.expect("cancel in an unknown session"));

    // JSON ids keep their quotes and colons.
    assert!(s.cancel_request(&key, r#""a:b""#).await.expect("cancel string id"));
    wait_for(&mut sub, &Ring::Cancel(r#""a:b""#.to_owned())).await;
    assert!(s.is_cancelled(&key, r#""a:b""#).await.expect("is_cancelled string id"));
}

async fn routing_doorbells_are_per_session(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let x = session(s, LONG).await;
    let y = session(s, LONG).await;
    let bob_x = SessionKey { user: user("bob"), id: x.id.clone() };
    create(s, &bob_x, &new_session(LONG)).await.expect("bob's session with the same id");
    let mut sub_x = s.subscribe(&x).await.expect("subscribe x");
    let mut sub_y = s.subscribe(&y).await.expect("subscribe y");
    let mut sub_bob = s.subscribe(&bob_x).await.expect("subscribe bob");

    let (kx, _) = open_post(s, &x, "1", LONG).await;
    append(s, &x, kx, "for x").await;
    wait_for(&mut sub_x, &Ring::Event(kx)).await;
    assert!(s.cancel_request(&x, "9").await.expect("cancel"));
    wait_for(&mut sub_x, &Ring::Cancel("9".to_owned())).await;
    assert_quiet(&mut sub_y, "another session of the same user").await;
    assert_quiet(&mut sub_bob, "another user's session with the same id").await;

    let (ky, _) = open_post(s, &y, "1", LONG).await;
    append(s, &y, ky, "for y").await;
    wait_for(&mut sub_y, &Ring::Event(ky)).await;
    assert!(s.delete_session(&bob_x).await.expect("delete bob's").is_some());
    wait_for(&mut sub_bob, &Ring::Closed).await;
    assert_quiet(&mut sub_x, "rings of y and of bob").await;
    assert!(s.touch_session(&x).await.expect("touch").is_some(), "deleting bob's session left alice's");
}

async fn routing_shared_subscriptions(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = session(s, LONG).await;
    let (k, _) = open_post(s, &key, "1", LONG).await;

    // Two local subscribers of one session both hear every ring.
    let mut first = s.subscribe(&key).await.expect("subscribe");
    let mut second = s.subscribe(&key).await.expect("subscribe again");
    append(s, &key, k, "both").await;
    wait_for(&mut first, &Ring::Event(k)).await;
    wait_for(&mut second, &Ring::Event(k)).await;

    // Dropping one leaves the other subscribed.
    drop(first);
    assert!(s.cancel_request(&key, "1").await.expect("cancel"));
    wait_for(&mut second, &Ring::Cancel("1".to_owned())).await;

    // Dropping the last and subscribing again at once never loses the new subscription.
    for i in 0..5 {
        drop(second);
        second = s.subscribe(&key).await.expect("resubscribe");
        let id = format!("again-{i}");
        assert!(s.cancel_request(&key, &id).await.expect("cancel"));
        wait_for(&mut second, &Ring::Cancel(id)).await;
    }
}

async fn replicas_share_state(kind: Kind) {
    let h = Harness::new(kind).await;
    let a = h.store();
    let b = h.replica().await;
    let b = &*b;

    let key = key_for("alice");
    create(b, &key, &new_session(LONG)).await.expect("create on b");
    assert!(a.touch_session(&key).await.expect("touch on a").is_some(), "a sees the session b created");
    assert!(matches!(create(a, &key, &new_session(LONG)).await, Err(StateError::Conflict)));
    let mut sub = a.subscribe(&key).await.expect("subscribe on a");

    // Events committed on b ring on a, and a replays them.
    let (k, priming) = open_post(b, &key, "1", LONG).await;
    let pending = AppendOptions { pending_request: Some("s-1".to_owned()), ..AppendOptions::default() };
    let e = b.append(&key, k, "request", &pending).await.expect("append on b");
    wait_for(&mut sub, &Ring::Event(k)).await;
    let (events, _) = a.read_after(&key, k, &priming, true, 10).await.expect("replay on a");
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), vec![e]);

    // A response delivered through b wakes a, which takes it.
    assert!(b.deliver_response(&key, "s-1", "answer").await.expect("deliver on b").delivered());
    wait_for(&mut sub, &Ring::Response("s-1".to_owned())).await;
    assert_eq!(a.take_response(&key, "s-1").await.expect("take on a").as_deref(), Some("answer"));
    assert_eq!(b.take_response(&key, "s-1").await.expect("take on b"), None);

    // A cancellation recorded on b rings on a.
    assert!(b.cancel_request(&key, "9").await.expect("cancel on b"));
    wait_for(&mut sub, &Ring::Cancel("9".to_owned())).await;
    assert!(a.is_cancelled(&key, "9").await.expect("is_cancelled on a"));

    // A takeover on b rings on a and fences a's holder.
    a.open_stream(&key, &OpenStream::Standalone { token: token("on-a"), lease: LONG }).await.expect("get on a");
    b.open_stream(&key, &OpenStream::Standalone { token: token("on-b"), lease: LONG }).await.expect("get on b");
    wait_for(&mut sub, &Ring::Takeover("on-b".to_owned())).await;
    assert!(!a.renew_lease(&key, STANDALONE_STREAM, &token("on-a"), LONG).await.expect("renew on a"));

    // Ending the session on b closes a's subscription.
    assert!(b.delete_session(&key).await.expect("delete on b").is_some());
    wait_for(&mut sub, &Ring::Closed).await;
    assert_eq!(a.touch_session(&key).await.expect("touch on a"), None);
    if let Some(keys) = h.redis_keys() {
        // Delivered answers and cancellation markers live in the session's own keys: nothing outlives it.
        assert!(keys.is_empty(), "keys left after delete: {keys:?}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Limits

fn admission<'a>(user: &'a UserKey) -> Admission<'a> {
    Admission::new(user)
}

async fn admit(s: &dyn Store, a: &Admission<'_>) -> Admitted {
    s.admit(a).await.expect("admit")
}

/// Every key of the Redis run has a TTL (limits never leave a key behind forever).
fn assert_all_keys_expire(h: &Harness) {
    let Some(server) = h.redis() else { return };
    for k in h.redis_keys().expect("keys") {
        let ttl: i64 = server.raw(&["PTTL", &k]).trim().parse().expect("pttl");
        assert!(ttl > 0, "{k} has no TTL ({ttl})");
    }
}

async fn limits_bucket(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let (alice, bob) = (user("alice"), user("bob"));
    let spec = BucketSpec { name: "tb".to_owned(), capacity: 3.0, per_second: 2.0 };
    for left in [2.0, 1.0, 0.0] {
        let a = Admission { bucket: Some(&spec), ..admission(&alice) };
        let r = admit(s, &a).await;
        assert_eq!(r.refused, None);
        let b = r.bucket.expect("reading");
        assert!(b.allowed && (b.tokens - left).abs() < 0.1, "{b:?}");
    }
    let a = Admission { bucket: Some(&spec), ..admission(&alice) };
    let r = admit(s, &a).await;
    assert_eq!(r.refused, Some(Refusal::Bucket));
    let b = r.bucket.expect("reading");
    assert!(!b.allowed);
    assert!(b.wait > Duration::from_millis(300) && b.wait <= Duration::from_millis(500), "{b:?}");
    // A refused request names nothing else: the session it names is not touched.
    let key = session(s, LONG).await;
    let a = Admission { bucket: Some(&spec), session: SessionOp::Touch(&key.id), ..admission(&alice) };
    assert_eq!(admit(s, &a).await.session, None);
    // Another user's bucket is untouched.
    let a = Admission { bucket: Some(&spec), ..admission(&bob) };
    assert_eq!(admit(s, &a).await.refused, None);
    // A token comes back after 1/rate.
    tokio::time::sleep(Duration::from_millis(550)).await;
    let a = Admission { bucket: Some(&spec), session: SessionOp::Touch(&key.id), ..admission(&alice) };
    let r = admit(s, &a).await;
    assert_eq!(r.refused, None);
    assert_eq!(r.session.map(|i| i.protocol_version).as_deref(), Some("2025-06-18"));
    assert_all_keys_expire(&h);
}

async fn limits_session_cap(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let alice = user("alice");
    let ns = new_session(LONG);
    let ids: Vec<SessionId> = (0..3).map(|_| session_id()).collect();
    for id in &ids[..2] {
        let a = Admission { session: SessionOp::Create { id, session: &ns, max_sessions: 2 }, ..admission(&alice) };
        assert_eq!(admit(s, &a).await.refused, None);
    }
    let a =
        Admission { session: SessionOp::Create { id: &ids[2], session: &ns, max_sessions: 2 }, ..admission(&alice) };
    assert_eq!(admit(s, &a).await.refused, Some(Refusal::Sessions { open: 2 }));
    // Bob has his own count.
    let bob = user("bob");
    let a = Admission { session: SessionOp::Create { id: &ids[2], session: &ns, max_sessions: 2 }, ..admission(&bob) };
    assert_eq!(admit(s, &a).await.refused, None);
    // Ending a session frees its place.
    let first = SessionKey { user: alice.clone(), id: ids[0].clone() };
    assert!(s.delete_session(&first).await.expect("delete").is_some());
    let a =
        Admission { session: SessionOp::Create { id: &ids[2], session: &ns, max_sessions: 2 }, ..admission(&alice) };
    assert_eq!(admit(s, &a).await.refused, None);
    // So does an idle expiry.
    let short = new_session(Duration::from_millis(300));
    let carol = user("carol");
    let a =
        Admission { session: SessionOp::Create { id: &ids[0], session: &short, max_sessions: 1 }, ..admission(&carol) };
    assert_eq!(admit(s, &a).await.refused, None);
    let a =
        Admission { session: SessionOp::Create { id: &ids[1], session: &short, max_sessions: 1 }, ..admission(&carol) };
    assert_eq!(admit(s, &a).await.refused, Some(Refusal::Sessions { open: 1 }));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(admit(s, &a).await.refused, None);
    assert_all_keys_expire(&h);
}

/// With no session cap the store need not count sessions (Redis keeps no index of them then: issue 32, an idle
/// session's bytes). A cap turned on later counts such a session once a touch extends its life.
async fn limits_sessions_opened_without_a_cap_count_once_touched(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let dave = user("dave");
    // An idle TTL of 1.6 s: a touch extends the session once 100 ms (a sixteenth) have passed.
    let ns = new_session(Duration::from_millis(1600));
    let ids: Vec<SessionId> = (0..2).map(|_| session_id()).collect();
    let uncounted = Admission {
        session: SessionOp::Create { id: &ids[0], session: &ns, max_sessions: 0 },
        count_sessions: false,
        ..admission(&dave)
    };
    assert_eq!(admit(s, &uncounted).await.refused, None);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let touch = Admission { session: SessionOp::Touch(&ids[0]), ..admission(&dave) };
    let r = admit(s, &touch).await;
    assert_eq!(r.refused, None);
    assert!(r.session.is_some(), "the session is there");
    let capped =
        Admission { session: SessionOp::Create { id: &ids[1], session: &ns, max_sessions: 1 }, ..admission(&dave) };
    assert_eq!(admit(s, &capped).await.refused, Some(Refusal::Sessions { open: 1 }), "the touched session counts");
    // Ended, it frees its place.
    assert!(s.delete_session(&SessionKey { user: dave.clone(), id: ids[0].clone() }).await.expect("delete").is_some());
    assert_eq!(admit(s, &capped).await.refused, None);
    assert_all_keys_expire(&h);
}

/// How many `EVALSHA`s the check's own redis-server has run (`None` on a shared topology or the memory store).
fn evalshas(h: &Harness) -> Option<u64> {
    let server = h.redis()?;
    let stats = server.raw(&["INFO", "commandstats"]);
    let line = stats.lines().find(|l| l.starts_with("cmdstat_evalsha:")).unwrap_or("cmdstat_evalsha:calls=0,");
    line.split("calls=").nth(1)?.split(',').next()?.parse().ok()
}

/// Many admissions of one principal at once (issue 32: on Redis, those that arrive while one is on its way ride
/// together in one `admit.lua` call): each gets the decision it would get alone, one after the other. The bucket
/// admits exactly its tokens, the slot cap exactly its slots (a refused slot charges no window), the window exactly
/// its limit (a refused window takes no slot), a missing session is refused among live ones, and releases that
/// ride in a batch free their slots for the batch. On the check's own Redis, the 40 went in fewer round trips.
async fn limits_admissions_at_once_decide_as_one_by_one(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let alice = user("alice");
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(session(s, LONG).await);
    }

    // The bucket: 10 tokens (and no refill to speak of) for 40 calls over four sessions.
    let before = evalshas(&h);
    let bucket = BucketSpec { name: "tb".to_owned(), capacity: 10.0, per_second: 0.001 };
    let rs = all_at_once(
        s,
        &(0..40)
            .map(|i| Admission {
                bucket: Some(&bucket),
                session: SessionOp::Touch(&sessions[i % 4].id),
                ..admission(&alice)
            })
            .collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(admitted(&rs), 10, "the bucket's ten tokens");
    assert!(rs.iter().all(|r| r.refused.is_none() || r.refused == Some(Refusal::Bucket)), "{rs:?}");
    let mut left: Vec<f64> = rs
        .iter()
        .filter(|r| r.refused.is_none())
        .map(|r| {
            assert!(r.session.is_some(), "an admitted touch reads its session");
            // Tokens left after each: 9, 8, ... 0, each once.
            r.bucket.expect("a reading").tokens.round()
        })
        .collect();
    left.sort_by(f64::total_cmp);
    assert_eq!(left, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], "each admission took its own token");
    if let (Some(b), Some(a)) = (before, evalshas(&h)) {
        assert!(a - b < 20, "40 admissions at once ride together: {} round trips", a - b);
    }

    // The slot cap: 5 slots for 40 calls, and the quota is charged only for the 5.
    let win = WindowSpec { name: "tool.y".to_owned(), limit: 100, window: LONG };
    let specs = slot_specs(SlotSet::Calls, 5, "s", 40);
    let rs = all_at_once(s, &with_slot_and_window(&alice, &specs, &win)).await;
    assert_eq!(admitted(&rs), 5, "the cap's five slots");
    let held: Vec<[String; 1]> =
        rs.iter().zip(&specs).filter(|(r, _)| r.refused.is_none()).map(|(_, spec)| [spec.token.clone()]).collect();
    assert!(rs.iter().all(|r| r.refused.is_none() || r.refused == Some(Refusal::Slots { used: 5 })), "{rs:?}");
    let r = admit(s, &Admission { window: Some(&win), ..admission(&alice) }).await;
    assert_eq!(r.window.map(|w| w.used), Some(6), "refused slots charged no window");

    // The window: 7 uses for 40 calls, and a refused use takes no slot.
    let win = WindowSpec { name: "tool.z".to_owned(), limit: 7, window: LONG };
    let specs = slot_specs(SlotSet::Streams, 100, "w", 40);
    let rs = all_at_once(s, &with_slot_and_window(&alice, &specs, &win)).await;
    assert_eq!(admitted(&rs), 7, "the window's seven uses");
    assert!(rs.iter().filter(|r| r.refused.is_some()).all(|r| r.refused == Some(Refusal::Window)), "{rs:?}");
    let one = SlotSpec { set: SlotSet::Streams, cap: 100, token: "w-last".to_owned(), ttl: LONG };
    let r = admit(s, &Admission { slot: Some(&one), ..admission(&alice) }).await;
    assert_eq!(r.slots_used, Some(8), "refused uses took no slot");
    let r = admit(s, &Admission { window: Some(&win), ..admission(&alice) }).await;
    assert_eq!(r.refused, Some(Refusal::Window), "the seven uses were all written");
    let w = r.window.expect("a reading");
    assert!(w.used == 7 && w.reset.is_some_and(|r| r <= LONG), "{w:?}");

    // Missing sessions among live ones.
    let gone = session_id();
    let rs = all_at_once(
        s,
        &(0..20)
            .map(|i| Admission {
                session: SessionOp::Touch(if i % 2 == 0 { &sessions[i % 4].id } else { &gone }),
                ..admission(&alice)
            })
            .collect::<Vec<_>>(),
    )
    .await;
    for (i, r) in rs.iter().enumerate() {
        let want = if i % 2 == 0 { None } else { Some(Refusal::SessionNotFound) };
        assert_eq!(r.refused, want, "admission {i}");
        assert_eq!(r.session.is_some(), i % 2 == 0, "admission {i}");
    }

    // Releases riding in a batch: the five calls of the slot cap end, each with the next call, which takes a slot.
    let next = slot_specs(SlotSet::Calls, 5, "n", 40);
    let rs = all_at_once(
        s,
        &(0..40)
            .map(|i| Admission {
                slot: Some(&next[i]),
                release: held.get(i).map(|e| (SlotSet::Calls, &e[..])),
                ..admission(&alice)
            })
            .collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(admitted(&rs), 5, "every slot released is free again, and no more");
    assert_all_keys_expire(&h);
}

/// Redis only (the memory store decides at once, so nothing ever waits): an admission whose caller gave up while it
/// waited for its lane's batch is left out of the batch, so it takes nothing; and when the caller of the lane's
/// first admission gives up, the others still go.
#[tokio::test]
async fn limits_admissions_given_up_while_waiting_take_nothing() {
    let h = Harness::new(Kind::Redis).await;
    let s = h.store();
    let alice = user("alice");
    let specs = slot_specs(SlotSet::Calls, 100, "g", 10);
    let admissions: Vec<Admission<'_>> =
        specs.iter().map(|sp| Admission { slot: Some(sp), ..admission(&alice) }).collect();
    let mut calls: Vec<_> = admissions.iter().map(|a| s.admit(a)).collect();
    // Each polled once: the first opened its principal's lane and yields, the nine others joined it.
    for call in &mut calls {
        assert!(futures::poll!(call.as_mut()).is_pending(), "no admission is decided before Redis answers");
    }
    // The callers of the first (which would send the batch) and of the last four give up.
    calls.truncate(6);
    drop(calls.remove(0));
    let answered = tokio::time::timeout(RING_WAIT, futures::future::join_all(calls)).await;
    for r in answered.expect("the others are answered without the first") {
        assert_eq!(r.expect("admit").refused, None);
    }
    let last = SlotSpec { set: SlotSet::Calls, cap: 100, token: "g-last".to_owned(), ttl: LONG };
    let r = admit(s, &Admission { slot: Some(&last), ..admission(&alice) }).await;
    assert_eq!(r.slots_used, Some(6), "five slots taken before it, none for the calls given up");
}

/// `mcp_redis_admissions_total` counts every admission sent, and `mcp_redis_command_duration_seconds_count` of kind
/// `admit` the round trips: 40 admissions of one principal at once take fewer round trips than admissions, and a
/// lone one takes one of each.
#[tokio::test]
async fn limits_admissions_are_counted_against_their_round_trips() {
    let server = RedisServer::start();
    let registry = prometheus::Registry::new();
    let metrics = mcpfleet_state::StoreMetrics::register(&registry).expect("metrics");
    let cfg = RedisConfig {
        metrics: Some(metrics),
        prefix: format!("contract{}:", next()),
        ..RedisConfig::new(server.url())
    };
    let store = RedisStore::connect(cfg).await.expect("connect");
    let s: &dyn Store = &store;
    let counts = || {
        let families = registry.gather();
        let admissions = families
            .iter()
            .find(|f| f.name() == "mcp_redis_admissions_total")
            .map_or(0.0, |f| f.get_metric()[0].get_counter().get_value());
        let trips = families
            .iter()
            .find(|f| f.name() == "mcp_redis_command_duration_seconds")
            .and_then(|f| {
                f.get_metric().iter().find(|m| m.get_label().iter().any(|l| l.name() == "kind" && l.value() == "admit"))
            })
            .map_or(0, |m| m.get_histogram().get_sample_count());
        (admissions, trips)
    };
    let alice = user("alice");
    let bucket = BucketSpec { name: "tb".to_owned(), capacity: 100.0, per_second: 1.0 };
    let admissions: Vec<Admission<'_>> =
        (0..40).map(|_| Admission { bucket: Some(&bucket), ..admission(&alice) }).collect();
    all_at_once(s, &admissions).await;
    let (sent, trips) = counts();
    assert_eq!(sent, 40.0, "every admission counted");
    assert!(trips > 0 && trips < 40, "they rode together: {trips} round trips");
    admit(s, &admissions[0]).await;
    assert_eq!(counts(), (41.0, trips + 1), "a lone admission: one of each");
}

/// Redis only: when Redis stops answering, every admission of a batch fails with the store's timeout, the one on
/// its way and those waiting behind it alike, and none waits for ever; once Redis is back, the lane works again.
#[tokio::test]
async fn limits_admissions_waiting_in_a_lane_fail_when_redis_does_not_answer() {
    let server = RedisServer::start();
    let cfg = RedisConfig {
        timeout: Duration::from_millis(400),
        prefix: format!("contract{}:", next()),
        ..RedisConfig::new(server.url())
    };
    let store = RedisStore::connect(cfg).await.expect("connect");
    let store: &dyn Store = &store;
    let alice = user("alice");
    let bucket = BucketSpec { name: "tb".to_owned(), capacity: 100.0, per_second: 1.0 };
    let admissions: Vec<Admission<'_>> =
        (0..10).map(|_| Admission { bucket: Some(&bucket), ..admission(&alice) }).collect();
    server.signal("-STOP");
    let started = std::time::Instant::now();
    let rs = futures::future::join_all(admissions.iter().map(|a| store.admit(a))).await;
    let took = started.elapsed();
    server.signal("-CONT");
    for r in &rs {
        assert!(r.as_ref().is_err_and(StateError::is_timeout), "{r:?}");
    }
    assert!(took < Duration::from_secs(3), "the batch behind the first waited one deadline more at most: {took:?}");
    let rs = futures::future::join_all(admissions.iter().map(|a| store.admit(a))).await;
    assert!(rs.iter().all(|r| r.as_ref().is_ok_and(|r| r.refused.is_none())), "{rs:?}");
}

/// `n` slots of `set` under `cap`, with the tokens `<prefix>0`, `<prefix>1`...
fn slot_specs(set: SlotSet, cap: u64, prefix: &str, n: usize) -> Vec<SlotSpec> {
    (0..n).map(|i| SlotSpec { set, cap, token: format!("{prefix}{i}"), ttl: LONG }).collect()
}

/// An admission of `user` for each slot, each with the window.
fn with_slot_and_window<'a>(user: &'a UserKey, specs: &'a [SlotSpec], win: &'a WindowSpec) -> Vec<Admission<'a>> {
    specs.iter().map(|spec| Admission { slot: Some(spec), window: Some(win), ..admission(user) }).collect()
}

async fn all_at_once(s: &dyn Store, admissions: &[Admission<'_>]) -> Vec<Admitted> {
    futures::future::join_all(admissions.iter().map(|a| admit(s, a))).await
}

fn admitted(rs: &[Admitted]) -> usize {
    rs.iter().filter(|r| r.refused.is_none()).count()
}

async fn limits_slots_and_windows(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let alice = user("alice");
    let key = session(s, LONG).await;
    let slot = |t: &str, ttl: Duration| SlotSpec { set: SlotSet::Calls, cap: 2, token: t.to_owned(), ttl };
    let win = WindowSpec { name: "tool.x".to_owned(), limit: 2, window: Duration::from_millis(800) };
    let (a1, a2, a3) = (slot("a1", LONG), slot("a2", Duration::from_millis(300)), slot("a3", LONG));
    let r = admit(
        s,
        &Admission { slot: Some(&a1), window: Some(&win), session: SessionOp::Touch(&key.id), ..admission(&alice) },
    )
    .await;
    assert_eq!((r.refused, r.slots_used, r.window.map(|w| w.used)), (None, Some(1), Some(1)));
    assert!(r.session.is_some());
    let r = admit(s, &Admission { slot: Some(&a2), ..admission(&alice) }).await;
    assert_eq!((r.refused, r.slots_used), (None, Some(2)));
    // Full: the slot is refused and the window is not charged.
    let r = admit(s, &Admission { slot: Some(&a3), window: Some(&win), ..admission(&alice) }).await;
    assert_eq!(r.refused, Some(Refusal::Slots { used: 2 }));
    let r = admit(s, &Admission { window: Some(&win), ..admission(&alice) }).await;
    assert_eq!(r.window.map(|w| w.used), Some(2), "a refused slot must not use the window");
    // The window is used up; a refusal takes no slot.
    s.release_slots(&alice, SlotSet::Calls, &["a1".to_owned()]).await.expect("release");
    let r = admit(s, &Admission { slot: Some(&a3), window: Some(&win), ..admission(&alice) }).await;
    assert_eq!(r.refused, Some(Refusal::Window));
    let w = r.window.expect("reading");
    assert!(w.used == 2 && w.reset.is_some_and(|r| r <= Duration::from_millis(800)), "{w:?}");
    // A refund gives one use back.
    s.refund_window(&alice, "tool.x").await.expect("refund");
    let r = admit(s, &Admission { window: Some(&win), ..admission(&alice) }).await;
    assert_eq!((r.refused, r.window.map(|w| w.used)), (None, Some(2)));
    // A renewed slot stays; an unrenewed one lapses.
    assert!(!s.renew_slot(&alice, SlotSet::Calls, "a1", LONG).await.expect("renew released"));
    let r = admit(s, &Admission { slot: Some(&a1), ..admission(&alice) }).await;
    assert_eq!((r.refused, r.slots_used), (None, Some(2)));
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(s.renew_slot(&alice, SlotSet::Calls, "a1", LONG).await.expect("renew"));
    assert!(!s.renew_slot(&alice, SlotSet::Calls, "a2", LONG).await.expect("renew lapsed"));
    let r = admit(s, &Admission { slot: Some(&a3), ..admission(&alice) }).await;
    assert_eq!((r.refused, r.slots_used), (None, Some(2)));
    // Releases ride on an admission: a3 and a1 end, and the same call takes a new slot.
    let ended = ["a3".to_owned(), "a1".to_owned()];
    let a4 = slot("a4", LONG);
    let r =
        admit(s, &Admission { slot: Some(&a4), release: Some((SlotSet::Calls, &ended)), ..admission(&alice) }).await;
    assert_eq!((r.refused, r.slots_used), (None, Some(1)), "two released before one taken");
    // A session's creation carries releases too (in Redis they come after create's own arguments): a4 ends as
    // alice opens a session, which then reads back as it was created.
    let (ns, id, ended) = (new_session(LONG), session_id(), ["a4".to_owned()]);
    let create = SessionOp::Create { id: &id, session: &ns, max_sessions: 0 };
    let r =
        admit(s, &Admission { session: create, release: Some((SlotSet::Calls, &ended)), ..admission(&alice) }).await;
    assert_eq!(r.refused, None);
    let a5 = slot("a5", LONG);
    let r = admit(s, &Admission { slot: Some(&a5), session: SessionOp::Touch(&id), ..admission(&alice) }).await;
    assert_eq!((r.refused, r.slots_used), (None, Some(1)), "a4 released by the create");
    assert_eq!(r.session.map(|i| i.protocol_version), Some(ns.protocol_version.clone()));
    // Releases are applied whatever else the admission does: without a slot taken...
    let ended = ["a5".to_owned()];
    assert_eq!(
        admit(s, &Admission { release: Some((SlotSet::Calls, &ended)), ..admission(&alice) }).await.refused,
        None
    );
    let (a6, a7, a8) = (slot("a6", LONG), slot("a7", LONG), slot("a8", LONG));
    let r = admit(s, &Admission { slot: Some(&a6), ..admission(&alice) }).await;
    assert_eq!(r.slots_used, Some(1), "a5 released by an admission that took no slot");
    assert_eq!(admit(s, &Admission { slot: Some(&a7), ..admission(&alice) }).await.slots_used, Some(2));
    // ...at the cap, before the count (a6 ends as a8 comes in)...
    let ended = ["a6".to_owned()];
    let r =
        admit(s, &Admission { slot: Some(&a8), release: Some((SlotSet::Calls, &ended)), ..admission(&alice) }).await;
    assert_eq!((r.refused, r.slots_used), (None, Some(2)), "a6 released at the cap, before the count");
    // ...and on a refusal (the bucket's: a7 ends, and a9 finds a8 alone).
    let one = BucketSpec { name: "tb.one".to_owned(), capacity: 1.0, per_second: 0.5 };
    assert_eq!(admit(s, &Admission { bucket: Some(&one), ..admission(&alice) }).await.refused, None);
    let ended = ["a7".to_owned()];
    let r =
        admit(s, &Admission { bucket: Some(&one), release: Some((SlotSet::Calls, &ended)), ..admission(&alice) }).await;
    assert_eq!(r.refused, Some(Refusal::Bucket));
    let a9 = slot("a9", LONG);
    let r = admit(s, &Admission { slot: Some(&a9), ..admission(&alice) }).await;
    assert_eq!((r.refused, r.slots_used), (None, Some(2)), "a7 released by a refused admission");
    // Sets are per user and per kind.
    let streams = SlotSpec { set: SlotSet::Streams, ..slot("s1", LONG) };
    assert_eq!(admit(s, &Admission { slot: Some(&streams), ..admission(&alice) }).await.slots_used, Some(1));
    // The window ends and starts again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = admit(s, &Admission { window: Some(&win), ..admission(&alice) }).await;
    assert_eq!((r.refused, r.window.map(|w| w.used)), (None, Some(1)));
    assert_all_keys_expire(&h);
}

async fn notices_reach_the_principal_on_every_replica(kind: Kind) {
    let h = Harness::new(kind).await;
    let a = h.store();
    let b = h.replica().await;
    let (alice, bob) = (user("alice"), user("bob"));
    let mut on_a = a.subscribe_user(&alice).await.expect("subscribe on a");
    let mut on_b = b.subscribe_user(&alice).await.expect("subscribe on b");
    let mut bobs = b.subscribe_user(&bob).await.expect("subscribe bob");
    let msg = r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"test://x"}}"#;
    b.publish_user(&alice, msg).await.expect("publish on b");
    wait_for(&mut on_a, &Ring::Notice(msg.to_owned())).await;
    wait_for(&mut on_b, &Ring::Notice(msg.to_owned())).await;
    assert_quiet(&mut bobs, "another principal's notices").await;
    // Publishing with no subscriber is not an error, and leaves nothing behind.
    a.publish_user(&user("carol"), msg).await.expect("publish to nobody");
    if let Some(keys) = h.redis_keys() {
        assert!(keys.is_empty(), "notices store nothing: {keys:?}");
    }
}

async fn idempotency_runs_once_and_keeps_the_result(kind: Kind) {
    let h = Harness::new(kind).await;
    let a = h.store();
    let b = h.replica().await;
    let alice = user("alice");
    let key = IdempotencyKey::new(&alice, "tool.x", "client-key-1");
    let spec = |token| ClaimSpec { digest: "d1", token, lease: Duration::from_millis(400) };
    // The first claim runs; a concurrent one on another replica sees it running.
    assert_eq!(a.claim(&key, &spec("t1")).await.expect("claim"), Claim::Run);
    assert_eq!(b.claim(&key, &spec("t2")).await.expect("claim on b"), Claim::Running);
    // Other arguments under the same key are a mismatch; the same key of another user or tool is free.
    let other = ClaimSpec { digest: "d2", ..spec("t3") };
    assert_eq!(b.claim(&key, &other).await.expect("claim"), Claim::Mismatch);
    let bobs = IdempotencyKey::new(&user("bob"), "tool.x", "client-key-1");
    assert_eq!(b.claim(&bobs, &spec("t4")).await.expect("claim bob"), Claim::Run);
    // Only the runner renews or completes.
    assert!(!b.renew_claim(&key, "t2", LONG).await.expect("renew by another"));
    assert!(a.renew_claim(&key, "t1", Duration::from_millis(400)).await.expect("renew"));
    assert!(!b.complete_claim(&key, "t2", "forged", LONG).await.expect("complete by another"));
    assert!(a.complete_claim(&key, "t1", r#"{"content":[]}"#, LONG).await.expect("complete"));
    assert_eq!(b.claim(&key, &spec("t5")).await.expect("claim"), Claim::Done(r#"{"content":[]}"#.to_owned()));
    assert!(!a.renew_claim(&key, "t1", LONG).await.expect("renew a done record"));
    // A runner that dies lets its claim lapse after the lease; a released claim is free at once.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(a.claim(&bobs, &spec("t6")).await.expect("claim lapsed"), Claim::Run);
    a.release_claim(&bobs, "t6").await.expect("release");
    assert_eq!(b.claim(&bobs, &spec("t7")).await.expect("claim released"), Claim::Run);
    // A done record expires after its retention time.
    let short = IdempotencyKey::new(&alice, "tool.x", "client-key-2");
    assert_eq!(a.claim(&short, &spec("t8")).await.expect("claim"), Claim::Run);
    assert!(a.complete_claim(&short, "t8", "r", Duration::from_millis(200)).await.expect("complete"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(a.claim(&short, &spec("t9")).await.expect("claim expired"), Claim::Run);
    assert_all_keys_expire(&h);
}

// ---------------------------------------------------------------------------------------------------------------
// Tasks

fn task_key(name: &str) -> TaskKey {
    TaskKey { user: user(name), id: TaskId::random() }
}

/// A queued task of `key`'s, with no cap.
fn new_task(key: &TaskKey) -> NewTask<'_> {
    NewTask {
        key,
        tool: "tool.x",
        args: r#"{"n":1}"#,
        capabilities: r#"{"elicitation":{}}"#,
        principal: r#"{"sub":"x"}"#,
        answers: "{}",
        trace_id: "trace-1",
        ttl: LONG,
        poll_interval: Duration::from_millis(500),
        rerunnable: true,
        running_on: None,
        max_open: 0,
    }
}

/// The same task, already running on replica `r1`.
fn running_task(key: &TaskKey) -> NewTask<'_> {
    NewTask { running_on: Some("r1"), ..new_task(key) }
}

async fn create_task(s: &dyn Store, task: &NewTask<'_>) -> u64 {
    s.create_task(task).await.expect("create task").expect("under the cap")
}

async fn task(s: &dyn Store, key: &TaskKey) -> TaskView {
    s.get_task(key).await.expect("get task").expect("task exists")
}

async fn status(s: &dyn Store, key: &TaskKey) -> TaskStatus {
    task(s, key).await.status
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).expect("valid JSON")
}

const REQ_A: &str = r#"{"method":"elicitation/create","params":{"message":"a?"}}"#;
const REQ_B: &str = r#"{"method":"elicitation/create","params":{"message":"b?"}}"#;
const RESULT: &str = r#"{"content":[{"type":"text","text":"done"}],"isError":false}"#;
const ERROR: &str = r#"{"code":-32603,"message":"tool failed"}"#;

async fn tasks_create_get_and_cap(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();

    // A queued task: every field as created, generation 1.
    let key = task_key("alice");
    let before = epoch_ms();
    let created = create_task(s, &new_task(&key)).await;
    assert!(created >= before.saturating_sub(1000) && created <= epoch_ms() + 1000, "{created} vs {before}");
    let want = TaskView {
        status: TaskStatus::Queued,
        created_ms: created,
        updated_ms: created,
        ttl_ms: 60_000,
        poll_ms: 500,
        message: None,
        outcome: None,
        input_requests: vec![],
        generation: 1,
        rerunnable: true,
        tool: "tool.x".to_owned(),
        cancel_requested: false,
    };
    assert_eq!(task(s, &key).await, want);
    // An id names one task: creating it again is refused and changes nothing.
    let again = s.create_task(&running_task(&key)).await;
    assert!(matches!(again, Err(StateError::Conflict)), "second create: {again:?}");
    assert_eq!(task(s, &key).await, want);
    // A call that became a task is running from the start.
    let running = task_key("alice");
    let other = NewTask { rerunnable: false, tool: "tool.y", ..running_task(&running) };
    create_task(s, &other).await;
    let v = task(s, &running).await;
    assert_eq!((v.status, v.generation, v.rerunnable, v.tool.as_str()), (TaskStatus::Working, 1, false, "tool.y"));

    // Unknown ids and another principal's key name nothing, and change nothing.
    let unknown = task_key("alice");
    assert_eq!(s.get_task(&unknown).await.expect("get unknown"), None);
    let bobs = TaskKey { user: user("bob"), id: key.id.clone() };
    assert_eq!(s.get_task(&bobs).await.expect("get as bob"), None);
    assert_eq!(s.update_task(&bobs, &[("a".to_owned(), "1".to_owned())]).await.expect("update as bob"), None);
    assert_eq!(s.cancel_task(&bobs).await.expect("cancel as bob"), None);
    assert_eq!(s.start_task(&bobs, 1, "r2").await.expect("start as bob"), None);
    assert_eq!(s.check_task(&bobs, 1).await.expect("check as bob"), RunCheck::Gone);
    assert_eq!(s.ask_task(&bobs, 1, "a", REQ_A).await.expect("ask as bob"), Asked::Stop);
    assert_eq!(s.finish_task(&bobs, 1, &TaskEnd::Cancelled).await.expect("finish as bob"), None);
    assert_eq!(s.requeue_task(&bobs, 1).await.expect("requeue as bob"), Requeue::Refused);
    assert_eq!(task(s, &key).await, want, "alice's task is untouched");

    // The cap counts the principal's open tasks only.
    let carol: Vec<TaskKey> = (0..4).map(|_| task_key("carol")).collect();
    let capped = |k| NewTask { max_open: 2, ..new_task(k) };
    create_task(s, &capped(&carol[0])).await;
    create_task(s, &NewTask { max_open: 2, ..running_task(&carol[1]) }).await;
    assert_eq!(s.create_task(&capped(&carol[2])).await.expect("create over the cap"), None);
    assert_eq!(s.get_task(&carol[2]).await.expect("get refused"), None, "a refused task is not stored");
    let dave = task_key("dave");
    create_task(s, &NewTask { max_open: 1, ..new_task(&dave) }).await;
    // A cancelled task frees its place...
    assert_eq!(s.cancel_task(&carol[0]).await.expect("cancel"), Some(CancelOutcome::Cancelled));
    create_task(s, &capped(&carol[2])).await;
    assert_eq!(s.create_task(&capped(&carol[3])).await.expect("create over the cap"), None);
    // ...and so does a finished one.
    s.finish_task(&carol[1], 1, &TaskEnd::Completed(RESULT.to_owned())).await.expect("finish").expect("finished");
    create_task(s, &capped(&carol[3])).await;
    assert_eq!(s.create_task(&capped(&task_key("carol"))).await.expect("create over the cap"), None);
    // No cap: anything goes.
    create_task(s, &new_task(&task_key("carol"))).await;
}

async fn tasks_expire_with_their_ttl(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let ttl = Duration::from_millis(200);
    let key = task_key("alice");
    create_task(s, &NewTask { ttl, max_open: 1, ..running_task(&key) }).await;
    assert_eq!(task(s, &key).await.ttl_ms, 200);
    let next = task_key("alice");
    assert_eq!(s.create_task(&NewTask { max_open: 1, ..new_task(&next) }).await.expect("create"), None);

    tokio::time::sleep(ttl + Duration::from_millis(150)).await;
    assert_eq!(s.get_task(&key).await.expect("get expired"), None);
    assert_eq!(s.update_task(&key, &[("a".to_owned(), "1".to_owned())]).await.expect("update expired"), None);
    assert_eq!(s.cancel_task(&key).await.expect("cancel expired"), None);
    assert_eq!(s.check_task(&key, 1).await.expect("check expired"), RunCheck::Gone);
    assert_eq!(s.ask_task(&key, 1, "a", REQ_A).await.expect("ask expired"), Asked::Stop);
    assert_eq!(s.finish_task(&key, 1, &TaskEnd::Cancelled).await.expect("finish expired"), None);
    assert_eq!(s.requeue_task(&key, 1).await.expect("requeue expired"), Requeue::Refused);
    assert_eq!(s.start_task(&key, 1, "r2").await.expect("start expired"), None);
    // An expired task no longer counts against the cap.
    create_task(s, &NewTask { max_open: 1, ..new_task(&next) }).await;
}

async fn tasks_update_answers_and_resume(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = task_key("alice");
    let t = NewTask { answers: r#"{"pre":{"action":"accept"}}"#, ..running_task(&key) };
    let created = create_task(s, &t).await;

    // An answer gathered before the task existed is there at once, and asking for it changes nothing.
    let pre = s.ask_task(&key, 1, "pre", REQ_A).await.expect("ask pre");
    let Asked::Answer(pre) = pre else { panic!("expected the stored answer, got {pre:?}") };
    assert_eq!(json(&pre), json(r#"{"action":"accept"}"#));
    let v = task(s, &key).await;
    assert_eq!((v.status, v.input_requests.len()), (TaskStatus::Working, 0));

    // Unanswered requests are outstanding, in key order, and the task is input_required.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(s.ask_task(&key, 1, "b", REQ_B).await.expect("ask b"), Asked::Pending);
    assert_eq!(s.ask_task(&key, 1, "a", REQ_A).await.expect("ask a"), Asked::Pending);
    assert_eq!(s.ask_task(&key, 1, "a", REQ_A).await.expect("ask a again"), Asked::Pending);
    let v = task(s, &key).await;
    assert_eq!(v.status, TaskStatus::InputRequired);
    assert_eq!(v.input_requests, vec![("a".to_owned(), REQ_A.to_owned()), ("b".to_owned(), REQ_B.to_owned())]);
    assert!(v.updated_ms > created, "an input request is an update: {} vs {created}", v.updated_ms);

    // Only outstanding keys are taken.
    let answer = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let none = s.update_task(&key, &[answer("zzz", "1"), answer("pre", "2")]).await.expect("update unknown");
    assert_eq!(none, Some(UpdateOutcome { accepted: 0, resumed: false }));
    assert_eq!(task(s, &key).await, v, "ignored answers change nothing");
    let one = s.update_task(&key, &[answer("a", r#"{"action":"decline"}"#), answer("c", "3")]).await.expect("update a");
    assert_eq!(one, Some(UpdateOutcome { accepted: 1, resumed: false }));
    let v = task(s, &key).await;
    assert_eq!(v.status, TaskStatus::InputRequired, "b is still outstanding");
    assert_eq!(v.input_requests, vec![("b".to_owned(), REQ_B.to_owned())]);
    // An answered key is no longer outstanding: a second answer is ignored and the first one stays.
    let again = s.update_task(&key, &[answer("a", r#"{"action":"accept"}"#)]).await.expect("update a again");
    assert_eq!(again, Some(UpdateOutcome { accepted: 0, resumed: false }));
    let a = s.ask_task(&key, 1, "a", REQ_A).await.expect("ask answered a");
    assert!(matches!(&a, Asked::Answer(x) if json(x) == json(r#"{"action":"decline"}"#)), "{a:?}");

    // The last answer resumes the task.
    let last = s.update_task(&key, &[answer("b", "42")]).await.expect("update b");
    assert_eq!(last, Some(UpdateOutcome { accepted: 1, resumed: true }));
    let v = task(s, &key).await;
    assert_eq!((v.status, v.input_requests.len()), (TaskStatus::Working, 0));
    assert_eq!(s.ask_task(&key, 1, "b", REQ_B).await.expect("ask answered b"), Asked::Answer("42".to_owned()));
    assert_eq!(s.check_task(&key, 1).await.expect("check"), RunCheck::Run);

    // A new run starts with every answer so far.
    assert_eq!(s.requeue_task(&key, 1).await.expect("requeue"), Requeue::Queued(2));
    let work = s.start_task(&key, 2, "r2").await.expect("start").expect("queued at 2");
    assert_eq!(
        (work.tool.as_str(), work.args.as_str(), work.capabilities.as_str(), work.trace_id.as_str(), work.rerunnable),
        ("tool.x", r#"{"n":1}"#, r#"{"elicitation":{}}"#, "trace-1", true)
    );
    assert_eq!(work.principal, r#"{"sub":"x"}"#);
    assert_eq!(json(&work.answers), json(r#"{"pre":{"action":"accept"},"a":{"action":"decline"},"b":42}"#));
    // Without answers, a run gets an empty object.
    let bare = task_key("alice");
    create_task(s, &new_task(&bare)).await;
    let work = s.start_task(&bare, 1, "r1").await.expect("start").expect("queued");
    assert_eq!(json(&work.answers), json("{}"));
}

async fn tasks_cancel(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();

    // A queued task is cancelled at once: it will never start.
    let queued = task_key("alice");
    let created = create_task(s, &new_task(&queued)).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(s.cancel_task(&queued).await.expect("cancel queued"), Some(CancelOutcome::Cancelled));
    let v = task(s, &queued).await;
    assert_eq!(v.status, TaskStatus::Cancelled);
    assert!(v.updated_ms > created, "{} vs {created}", v.updated_ms);
    assert_eq!(s.cancel_task(&queued).await.expect("cancel again"), Some(CancelOutcome::AlreadyEnded));
    assert_eq!(s.start_task(&queued, 1, "r1").await.expect("start cancelled"), None);
    assert_eq!(s.check_task(&queued, 1).await.expect("check cancelled"), RunCheck::Gone);

    // A running task's runner is asked to stop; the task runs until it does.
    let running = task_key("alice");
    create_task(s, &running_task(&running)).await;
    assert_eq!(s.check_task(&running, 1).await.expect("check"), RunCheck::Run);
    assert_eq!(s.cancel_task(&running).await.expect("cancel running"), Some(CancelOutcome::Requested));
    assert_eq!(status(s, &running).await, TaskStatus::Working);
    assert!(task(s, &running).await.cancel_requested, "the view says it was asked");
    assert_eq!(s.check_task(&running, 1).await.expect("check"), RunCheck::CancelRequested);
    assert_eq!(s.ask_task(&running, 1, "a", REQ_A).await.expect("ask"), Asked::Stop);
    assert_eq!(task(s, &running).await.input_requests, vec![], "a stopped run asks nothing");
    assert_eq!(s.cancel_task(&running).await.expect("cancel again"), Some(CancelOutcome::Requested));
    // The cancellation came first: whatever the run ends with, it ends cancelled.
    let done = TaskEnd::Completed(r#"{"content":[]}"#.to_owned());
    let v = s.finish_task(&running, 1, &done).await.expect("finish").expect("finished");
    assert_eq!((v.status, v.outcome, v.message), (TaskStatus::Cancelled, None, None));
    assert_eq!(s.cancel_task(&running).await.expect("cancel ended"), Some(CancelOutcome::AlreadyEnded));

    // So is a task waiting for input; its outstanding request stays until the run ends.
    let waiting = task_key("alice");
    create_task(s, &running_task(&waiting)).await;
    assert_eq!(s.ask_task(&waiting, 1, "a", REQ_A).await.expect("ask"), Asked::Pending);
    assert_eq!(s.cancel_task(&waiting).await.expect("cancel"), Some(CancelOutcome::Requested));
    assert_eq!(status(s, &waiting).await, TaskStatus::InputRequired);
    assert_eq!(s.ask_task(&waiting, 1, "b", REQ_B).await.expect("ask"), Asked::Stop);
    assert_eq!(s.check_task(&waiting, 1).await.expect("check"), RunCheck::CancelRequested);
}

async fn tasks_terminal_states_never_change(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let answer = [("a".to_owned(), "1".to_owned())];

    // Completed, with an outstanding request that the end clears.
    let done = task_key("alice");
    create_task(s, &running_task(&done)).await;
    assert_eq!(s.ask_task(&done, 1, "a", REQ_A).await.expect("ask"), Asked::Pending);
    let v = s.finish_task(&done, 1, &TaskEnd::Completed(RESULT.to_owned())).await.expect("finish").expect("ended");
    assert_eq!(
        (v.status, v.outcome.as_deref(), v.message.as_deref(), v.input_requests.len()),
        (TaskStatus::Completed, Some(RESULT), None, 0)
    );
    assert_eq!(task(s, &done).await, v, "get shows the final view");
    let failed = TaskEnd::Failed { error: ERROR.to_owned(), message: "late".to_owned() };
    assert_eq!(s.finish_task(&done, 1, &failed).await.expect("finish twice"), None);
    assert_eq!(s.finish_task(&done, 1, &TaskEnd::Cancelled).await.expect("finish twice"), None);
    assert_eq!(s.cancel_task(&done).await.expect("cancel"), Some(CancelOutcome::AlreadyEnded));
    let none = s.update_task(&done, &answer).await.expect("update");
    assert_eq!(none, Some(UpdateOutcome { accepted: 0, resumed: false }));
    assert_eq!(s.requeue_task(&done, 1).await.expect("requeue"), Requeue::Refused);
    assert_eq!(s.start_task(&done, 1, "r2").await.expect("start"), None);
    assert_eq!(s.ask_task(&done, 1, "a", REQ_A).await.expect("ask"), Asked::Stop);
    assert_eq!(s.check_task(&done, 1).await.expect("check"), RunCheck::Gone);
    assert_eq!(task(s, &done).await, v, "nothing changed a completed task");

    // Failed: the error object and the message.
    let bad = task_key("alice");
    create_task(s, &running_task(&bad)).await;
    let v = s.finish_task(&bad, 1, &failed).await.expect("fail").expect("ended");
    assert_eq!((v.status, v.outcome.as_deref(), v.message.as_deref()), (TaskStatus::Failed, Some(ERROR), Some("late")));
    assert_eq!(s.finish_task(&bad, 1, &TaskEnd::Completed(RESULT.to_owned())).await.expect("finish"), None);
    assert_eq!(s.requeue_task(&bad, 1).await.expect("requeue"), Requeue::Refused);
    assert_eq!(task(s, &bad).await, v, "nothing changed a failed task");

    // Cancelled while queued: a worker that took it anyway cannot finish it.
    let gone = task_key("alice");
    create_task(s, &new_task(&gone)).await;
    assert_eq!(s.cancel_task(&gone).await.expect("cancel"), Some(CancelOutcome::Cancelled));
    let v = task(s, &gone).await;
    assert_eq!(s.finish_task(&gone, 1, &TaskEnd::Completed(RESULT.to_owned())).await.expect("finish"), None);
    assert_eq!(
        s.update_task(&gone, &answer).await.expect("update"),
        Some(UpdateOutcome { accepted: 0, resumed: false })
    );
    assert_eq!(s.requeue_task(&gone, 1).await.expect("requeue"), Requeue::Refused);
    assert_eq!(task(s, &gone).await, v, "nothing changed a cancelled task");
}

async fn tasks_generations_fence_old_runs(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = task_key("alice");
    create_task(s, &running_task(&key)).await;
    // Run 1 gets an answer and asks again; then its replica dies and the task is requeued.
    assert_eq!(s.ask_task(&key, 1, "a", REQ_A).await.expect("ask a"), Asked::Pending);
    let taken = s.update_task(&key, &[("a".to_owned(), "1".to_owned())]).await.expect("update");
    assert_eq!(taken, Some(UpdateOutcome { accepted: 1, resumed: true }));
    assert_eq!(s.ask_task(&key, 1, "b", REQ_B).await.expect("ask b"), Asked::Pending);
    assert_eq!(s.requeue_task(&key, 2).await.expect("requeue a future run"), Requeue::Refused);
    assert_eq!(s.requeue_task(&key, 1).await.expect("requeue"), Requeue::Queued(2));
    let v = task(s, &key).await;
    assert_eq!((v.status, v.generation, v.input_requests), (TaskStatus::Queued, 2, vec![]));

    // Run 1 can no longer write anything.
    let end = TaskEnd::Completed(RESULT.to_owned());
    assert_eq!(s.finish_task(&key, 1, &end).await.expect("old finish"), None);
    assert_eq!(s.ask_task(&key, 1, "c", REQ_A).await.expect("old ask"), Asked::Stop);
    assert_eq!(s.check_task(&key, 1).await.expect("old check"), RunCheck::Gone);
    assert_eq!(s.requeue_task(&key, 1).await.expect("old requeue"), Requeue::Refused);
    assert_eq!(s.start_task(&key, 1, "r1").await.expect("old start"), None);
    assert_eq!(task(s, &key).await.generation, 2);

    // Run 2 starts afresh: the answers kept, the unanswered request asked again.
    assert_eq!(s.check_task(&key, 2).await.expect("check"), RunCheck::Run);
    let work = s.start_task(&key, 2, "r2").await.expect("start").expect("queued at 2");
    assert_eq!(json(&work.answers), json(r#"{"a":1}"#));
    assert_eq!(s.start_task(&key, 2, "r3").await.expect("start twice"), None, "a run starts once");
    assert_eq!(status(s, &key).await, TaskStatus::Working);
    assert_eq!(s.ask_task(&key, 2, "a", REQ_A).await.expect("ask a"), Asked::Answer("1".to_owned()));
    assert_eq!(s.ask_task(&key, 2, "b", REQ_B).await.expect("ask b"), Asked::Pending);
    assert_eq!(s.finish_task(&key, 1, &end).await.expect("old finish"), None);
    let v = s.finish_task(&key, 2, &end).await.expect("finish").expect("ended");
    assert_eq!((v.status, v.generation), (TaskStatus::Completed, 2));

    // A run its client asked to stop is not run again: requeueing it cancels it.
    let asked = task_key("alice");
    create_task(s, &running_task(&asked)).await;
    assert_eq!(s.cancel_task(&asked).await.expect("cancel"), Some(CancelOutcome::Requested));
    assert_eq!(s.requeue_task(&asked, 1).await.expect("requeue a run asked to stop"), Requeue::Cancelled);
    let v = task(s, &asked).await;
    assert_eq!((v.status, v.generation), (TaskStatus::Cancelled, 1));
    assert_eq!(s.check_task(&asked, 1).await.expect("check"), RunCheck::Gone);
}

async fn tasks_queue_hands_out_and_settles(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let shard = 3;
    let keys: Vec<TaskKey> = (0..3).map(|_| task_key("alice")).collect();
    for k in &keys {
        create_task(s, &new_task(k)).await;
        s.enqueue(shard, k, 1, LONG).await.expect("enqueue");
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let st = s.queue_stats(shard).await.expect("stats");
    assert_eq!((st.waiting, st.taken, st.leased), (3, 0, 3), "{st:?}");
    assert!(st.oldest.is_some_and(|d| d >= Duration::from_millis(20) && d < LONG), "{st:?}");
    assert_eq!(s.dequeue(shard + 1, "c1", 10, LONG).await.expect("dequeue other shard"), vec![], "shards are apart");

    // Entries come out in order, each once.
    let first = s.dequeue(shard, "c1", 2, LONG).await.expect("dequeue");
    assert_eq!(first.iter().map(|q| (&q.key, q.generation)).collect::<Vec<_>>(), [(&keys[0], 1), (&keys[1], 1)]);
    assert_ne!(first[0].entry, first[1].entry);
    let st = s.queue_stats(shard).await.expect("stats");
    assert_eq!((st.waiting, st.taken, st.leased), (1, 2, 3), "{st:?}");
    let rest = s.dequeue(shard, "c2", 5, LONG).await.expect("dequeue");
    assert_eq!(rest.iter().map(|q| (&q.key, q.generation)).collect::<Vec<_>>(), [(&keys[2], 1)]);
    assert!(!first.iter().any(|q| q.entry == rest[0].entry), "entry ids are unique");
    assert_eq!(s.dequeue(shard, "c3", 5, LONG).await.expect("dequeue empty"), vec![]);
    let st = s.queue_stats(shard).await.expect("stats");
    assert_eq!((st.waiting, st.taken, st.oldest, st.leased), (0, 3, None, 3), "{st:?}");

    // Settling: the started task keeps a lease, the ended one drops it, the one with a newer run leaves it alone.
    s.start_task(&keys[0], 1, "c1").await.expect("start").expect("queued");
    s.settle(shard, &first[0], AfterTake::Lease(LONG)).await.expect("settle with a lease");
    assert_eq!(s.cancel_task(&keys[1]).await.expect("cancel"), Some(CancelOutcome::Cancelled));
    assert_eq!(s.start_task(&keys[1], 1, "c1").await.expect("start cancelled"), None);
    s.settle(shard, &first[1], AfterTake::Release).await.expect("settle, release");
    s.settle(shard, &rest[0], AfterTake::Keep).await.expect("settle, keep");
    let st = s.queue_stats(shard).await.expect("stats");
    assert_eq!((st.waiting, st.taken, st.leased), (0, 0, 2), "{st:?}");
    let lost = s
        .renew_task_leases(shard, &[(keys[0].clone(), 1), (keys[1].clone(), 1), (keys[2].clone(), 1)], LONG)
        .await
        .expect("renew");
    assert_eq!(lost, [(keys[1].clone(), 1)], "only the released lease is gone");
    assert_eq!(s.dequeue(shard, "c1", 5, Duration::ZERO).await.expect("dequeue settled"), vec![]);
    // A shard nothing was ever queued in is an empty queue.
    assert_eq!(s.queue_stats(shard + 2).await.expect("stats of an unused shard"), QueueStats::default());
}

async fn tasks_queue_hands_over_stale_entries(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let shard = 5;
    let stale = Duration::from_millis(100);
    let (a, b) = (task_key("alice"), task_key("bob"));
    for k in [&a, &b] {
        create_task(s, &new_task(k)).await;
        s.enqueue(shard, k, 1, LONG).await.expect("enqueue");
    }
    // c1 takes a and dies; c2 takes b. Nothing is stale yet.
    let took_a = s.dequeue(shard, "c1", 1, stale).await.expect("dequeue");
    assert_eq!(took_a.iter().map(|q| &q.key).collect::<Vec<_>>(), [&a]);
    let took_b = s.dequeue(shard, "c2", 2, stale).await.expect("dequeue");
    assert_eq!(took_b.iter().map(|q| &q.key).collect::<Vec<_>>(), [&b], "a fresh taken entry stays with its taker");

    // Once stale, entries go to whoever asks, oldest first, with the same id.
    tokio::time::sleep(stale + Duration::from_millis(50)).await;
    let again_a = s.dequeue(shard, "c2", 1, stale).await.expect("dequeue stale");
    assert_eq!(again_a, took_a);
    let again_b = s.dequeue(shard, "c3", 5, stale).await.expect("dequeue stale");
    assert_eq!(again_b, took_b, "a was just taken again: only b is stale");
    assert_eq!(s.dequeue(shard, "c4", 5, stale).await.expect("dequeue"), vec![]);
    let st = s.queue_stats(shard).await.expect("stats");
    assert_eq!((st.waiting, st.taken, st.leased), (0, 2, 2), "{st:?}");

    // A settled entry is never handed over again.
    s.start_task(&a, 1, "c2").await.expect("start").expect("queued");
    s.settle(shard, &again_a[0], AfterTake::Lease(LONG)).await.expect("settle");
    tokio::time::sleep(stale + Duration::from_millis(50)).await;
    assert_eq!(s.dequeue(shard, "c5", 5, stale).await.expect("dequeue stale"), took_b);
    s.settle(shard, &took_b[0], AfterTake::Keep).await.expect("settle");
    assert_eq!(s.dequeue(shard, "c6", 5, Duration::ZERO).await.expect("dequeue"), vec![]);
    let st = s.queue_stats(shard).await.expect("stats");
    assert_eq!((st.waiting, st.taken, st.leased), (0, 0, 2), "{st:?}");
}

async fn tasks_leases_renew_and_sweep(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let shard = 7;
    let short = Duration::from_millis(80);
    let grace = Duration::from_millis(300);
    // r runs (taken, started, settled with a lease); t was taken by a worker that died before settling; q waits.
    let (r, t, q) = (task_key("alice"), task_key("alice"), task_key("bob"));
    for k in [&r, &t, &q] {
        create_task(s, &new_task(k)).await;
    }
    s.enqueue(shard, &r, 1, short).await.expect("enqueue r");
    s.enqueue(shard, &t, 1, short).await.expect("enqueue t");
    let taken = s.dequeue(shard, "c1", 2, LONG).await.expect("dequeue");
    assert_eq!(taken.iter().map(|e| &e.key).collect::<Vec<_>>(), [&r, &t]);
    s.start_task(&r, 1, "c1").await.expect("start").expect("queued");
    s.settle(shard, &taken[0], AfterTake::Lease(short)).await.expect("settle");
    s.enqueue(shard, &q, 1, short).await.expect("enqueue q");
    // w is a call that became a task: leased before its record exists, running where it was created.
    let w = task_key("bob");
    s.lease_task(shard, &w, 1, short).await.expect("lease w");
    create_task(s, &running_task(&w)).await;
    assert_eq!(s.expired_task_leases(shard, grace, 10).await.expect("sweep"), vec![], "nothing expired yet");

    // Renewing keeps a lease; a run that holds none has lost it.
    let never = task_key("alice");
    let lost = s.renew_task_leases(shard, &[(r.clone(), 1), (never.clone(), 1)], short).await.expect("renew");
    assert_eq!(lost, [(never.clone(), 1)]);
    assert_eq!(s.renew_task_leases(shard, &[], short).await.expect("renew nothing"), vec![]);

    // All four run out. Only the running r and w are the sweeper's: q's entry waits its turn, t's will be handed
    // over. A sweep takes at most `limit`.
    tokio::time::sleep(short + Duration::from_millis(70)).await;
    let first = s.expired_task_leases(shard, grace, 1).await.expect("sweep one");
    let second = s.expired_task_leases(shard, grace, 10).await.expect("sweep the rest");
    let (rr, ww) = ((r.clone(), 1), (w.clone(), 1));
    assert!(
        (first == [rr.clone()] && second == [ww.clone()]) || (first == [ww.clone()] && second == [rr.clone()]),
        "first {first:?}, then {second:?}"
    );
    // The sweeper holds them for the grace time: another sweep does not see them.
    assert_eq!(s.expired_task_leases(shard, grace, 10).await.expect("sweep again"), vec![]);
    let st = s.queue_stats(shard).await.expect("stats");
    assert_eq!((st.waiting, st.taken, st.leased), (1, 1, 4), "{st:?}");

    // The sweeper reclaims r: a new run in line, the old lease gone. The old runner learns it lost its run.
    assert_eq!(s.requeue_task(&r, 1).await.expect("requeue"), Requeue::Queued(2));
    s.enqueue(shard, &r, 2, LONG).await.expect("enqueue r again");
    s.release_task_lease(shard, &r, 1).await.expect("release");
    let lost = s.renew_task_leases(shard, &[(r.clone(), 1)], short).await.expect("renew lost");
    assert_eq!(lost, [(r.clone(), 1)]);
    assert_eq!(s.check_task(&r, 1).await.expect("check old run"), RunCheck::Gone);
    let st = s.queue_stats(shard).await.expect("stats");
    assert_eq!((st.waiting, st.taken, st.leased), (2, 1, 4), "{st:?}");
    // Releasing a lease that is not there is not an error.
    s.release_task_lease(shard, &never, 1).await.expect("release nothing");
}

async fn tasks_read_beside_an_admission(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = task_key("alice");
    create_task(s, &new_task(&key)).await;
    let spec = BucketSpec { name: "tb".to_owned(), capacity: 1.0, per_second: 0.001 };
    // Admitted, with the task read in the same call.
    let a = Admission { bucket: Some(&spec), read_task: Some(&key), ..admission(&key.user) };
    let r = admit(s, &a).await;
    assert_eq!(r.refused, None);
    let v = r.task.expect("read").expect("the task");
    assert_eq!((v.status, v.tool.as_str()), (TaskStatus::Queued, "tool.x"));
    // Refused by the bucket: the read comes along anyway (the caller drops it).
    let r = admit(s, &a).await;
    assert_eq!(r.refused, Some(Refusal::Bucket));
    // Another principal's admission reads nothing of alice's: its key names another record.
    let bobs = TaskKey { user: user("bob"), id: key.id.clone() };
    let r = admit(s, &Admission { read_task: Some(&bobs), ..admission(&bobs.user) }).await;
    assert_eq!(r.task, Some(None));
    // No read asked, none made.
    assert_eq!(admit(s, &admission(&key.user)).await.task, None);
}

async fn tasks_queue_consumers_are_tidied(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let shard = 9;
    let (a, b) = (task_key("alice"), task_key("alice"));
    for k in [&a, &b] {
        create_task(s, &new_task(k)).await;
        s.enqueue(shard, k, 1, LONG).await.expect("enqueue");
    }
    let first = s.dequeue(shard, "c1", 1, LONG).await.expect("dequeue c1");
    let second = s.dequeue(shard, "c2", 1, LONG).await.expect("dequeue c2");
    assert_eq!((first.len(), second.len()), (1, 1));
    s.settle(shard, &second[0], AfterTake::Release).await.expect("settle");
    // c1 holds an entry: it stays, even leaving (its entry would be lost). c2 holds none: it goes.
    let redis = h.is_redis();
    assert_eq!(s.tidy_consumers(shard, Some("c1"), LONG).await.expect("tidy c1"), 0);
    assert_eq!(s.tidy_consumers(shard, Some("c2"), LONG).await.expect("tidy c2"), u64::from(redis));
    // Idle ones go too, once idle long enough (and holding nothing).
    s.settle(shard, &first[0], AfterTake::Release).await.expect("settle");
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(s.tidy_consumers(shard, None, Duration::from_millis(10)).await.expect("tidy idle"), u64::from(redis));
    // A shard nothing was queued in has nothing to tidy.
    assert_eq!(s.tidy_consumers(shard + 1, Some("c1"), LONG).await.expect("tidy empty"), 0);
}

async fn tasks_queue_bell_rings_every_replica(kind: Kind) {
    let h = Harness::new(kind).await;
    let (a, b) = (h.store(), h.replica().await);
    let mut on_a = a.subscribe_queue(8).await.expect("subscribe a");
    let mut on_b = b.subscribe_queue(8).await.expect("subscribe b");
    let key = task_key("alice");
    create_task(a, &new_task(&key)).await;
    b.enqueue(7, &key, 1, LONG).await.expect("enqueue on b");
    for sub in [&mut on_a, &mut on_b] {
        let ring = tokio::time::timeout(Duration::from_secs(2), sub.recv()).await.expect("rung in time");
        assert_eq!(ring, Some(Ring::Event(7)), "the shard that got work");
    }
}

/// A restart or a failover empties the script cache (`NOSCRIPT`): every call reloads what it needs and goes on,
/// the plain scripts and the admission pipelined with a task's read alike.
async fn scripts_reload_after_the_cache_empties(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let key = task_key("alice");
    create_task(s, &new_task(&key)).await;
    let session = session(s, LONG).await;
    let a = Admission { read_task: Some(&key), ..admission(&key.user) };
    for round in 0..2 {
        let r = admit(s, &a).await;
        assert_eq!(r.refused, None, "round {round}");
        assert_eq!(r.task.expect("read").expect("the task").status, TaskStatus::Queued, "round {round}");
        let (k, _) = open_post(s, &session, &format!("r{round}"), LONG).await;
        append(s, &session, k, "an event").await;
        assert!(s.touch_session(&session).await.expect("touch").is_some(), "round {round}");
        if !h.flush_scripts() {
            break;
        }
    }
}

/// `--redis-durable-replicas`: a task's creation waits for a replica to hold it. With the replica gone it waits
/// half the deadline, then goes ahead (the task stands) and counts the write in
/// `mcp_redis_unreplicated_writes_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_writes_wait_for_a_replica() {
    let sentinel = RedisSentinel::start();
    let registry = prometheus::Registry::new();
    let metrics = mcpfleet_state::StoreMetrics::register(&registry).expect("metrics");
    let cfg = RedisConfig {
        durable_replicas: 1,
        timeout: Duration::from_millis(800),
        metrics: Some(metrics),
        prefix: format!("contract{}:", next()),
        ..RedisConfig::with_topology(RedisTopology::Sentinel {
            sentinels: sentinel.sentinels(),
            master: sentinel.master_name().to_owned(),
        })
    };
    let store = RedisStore::connect(cfg).await.expect("connect");
    let unreplicated = || {
        registry
            .gather()
            .iter()
            .find(|f| f.name() == "mcp_redis_unreplicated_writes_total")
            .map_or(0.0, |f| f.get_metric()[0].get_counter().get_value())
    };
    let first = task_key("alice");
    let started = std::time::Instant::now();
    create_task(&store, &new_task(&first)).await;
    assert!(started.elapsed() < Duration::from_millis(300), "a replica acknowledged at once: {:?}", started.elapsed());
    assert_eq!(unreplicated(), 0.0);

    sentinel.replica().kill();
    let second = task_key("alice");
    let started = std::time::Instant::now();
    create_task(&store, &new_task(&second)).await;
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(350) && waited < Duration::from_millis(800), "waited {waited:?}");
    assert_eq!(unreplicated(), 1.0, "counted");
    assert_eq!(task(&store, &second).await.status, TaskStatus::Queued, "the task stands");
}

/// Fleet membership records each replica's declaration of the Redis layout beside its record
/// (`mcpfleet_state::layout`), and `fleet_layouts` reads those of the live records: `None` for a record without
/// one (a build from before declarations). A replica that leaves takes its declaration along, and a declaration
/// whose record is gone is dropped by the next write. A store one process holds has no fleet.
async fn membership_records_each_replicas_layout(kind: Kind) {
    let h = Harness::new(kind).await;
    let s = h.store();
    let ttl = Duration::from_secs(15);
    assert_eq!(s.fleet_layouts().await.expect("layouts"), Vec::<Option<String>>::new(), "no member yet");
    assert_eq!(s.heartbeat("a", ttl).await.expect("heartbeat"), 1);
    let (Some(members), Some(layout)) = (h.prefixed("{fleet}:members"), h.prefixed("{fleet}:layout")) else {
        assert_eq!(s.fleet_layouts().await.expect("layouts"), Vec::<Option<String>>::new(), "one process: no fleet");
        return;
    };
    let mine = Some(mcpfleet_state::layout::Layout::current().encode());
    assert_eq!(s.fleet_layouts().await.expect("layouts"), vec![mine.clone()]);
    assert_eq!(s.heartbeat("b", ttl).await.expect("heartbeat"), 2);
    // A live record written by a build without declarations (as 0.1.0's members.lua writes it).
    let later = (epoch_ms() + 60_000).to_string();
    assert_eq!(h.raw(&["ZADD", &members, &later, "old"]).expect("redis-cli").trim(), "1");
    let mut seen = s.fleet_layouts().await.expect("layouts");
    seen.sort();
    assert_eq!(seen, vec![None, mine.clone(), mine.clone()]);
    // An expired record's declaration is not read.
    assert_eq!(h.raw(&["ZADD", &members, "1", "b"]).expect("redis-cli").trim(), "0");
    assert_eq!(s.fleet_layouts().await.expect("layouts").len(), 2, "b's record expired");
    // Leaving takes the declaration along; one whose record is gone goes at the next write.
    assert_eq!(s.heartbeat("a", Duration::ZERO).await.expect("heartbeat"), 1, "only old is left: b expired, a left");
    assert_eq!(h.raw(&["HEXISTS", &layout, "a"]).expect("redis-cli").trim(), "0");
    assert_eq!(h.raw(&["HEXISTS", &layout, "b"]).expect("redis-cli").trim(), "0", "dropped with its expired record");
    assert_eq!(h.raw(&["HSET", &layout, "ghost", "events:1:1-1"]).expect("redis-cli").trim(), "1");
    assert_eq!(s.heartbeat("c", ttl).await.expect("heartbeat"), 2);
    assert_eq!(h.raw(&["HEXISTS", &layout, "ghost"]).expect("redis-cli").trim(), "0", "a declaration without a record");
    assert_eq!(h.raw(&["HEXISTS", &layout, "c"]).expect("redis-cli").trim(), "1");
}

async fn policy_versions_are_stored_and_announced(kind: Kind) {
    use mcpfleet_state::{NewPolicy, PutPolicy};
    let h = Harness::new(kind).await;
    let a = h.store();
    let b = h.replica().await;
    assert_eq!(a.policy_version().await.expect("version"), 0, "none applied");
    assert_eq!(a.policy().await.expect("policy"), None);
    let mut on_b = b.subscribe_fleet().await.expect("subscribe on b");
    let new = |expected, version, text| NewPolicy { expected, version, text, by: "ops@host", summary: "first" };
    assert_eq!(a.put_policy(&new(0, None, "v1: doc")).await.expect("put"), PutPolicy::Stored(1));
    wait_for(&mut on_b, &Ring::Notice("policy:1".to_owned())).await;
    let stored = b.policy().await.expect("policy").expect("in force");
    assert_eq!((stored.version, stored.text.as_str(), stored.by.as_str()), (1, "v1: doc", "ops@host"));
    assert!(stored.at_ms >= epoch_ms() - 60_000, "stamped by the store's clock");
    // A writer that compared against a version no longer in force stores nothing.
    assert_eq!(b.put_policy(&new(0, None, "stale")).await.expect("put"), PutPolicy::Moved(1));
    // A number the database gave must be ahead of the one in force.
    assert_eq!(b.put_policy(&new(1, Some(1), "same")).await.expect("put"), PutPolicy::Moved(1));
    assert_quiet(&mut on_b, "a refused write announces nothing").await;
    assert_eq!(b.put_policy(&new(1, Some(7), "v7: doc")).await.expect("put"), PutPolicy::Stored(7));
    wait_for(&mut on_b, &Ring::Notice("policy:7".to_owned())).await;
    assert_eq!(a.policy_version().await.expect("version"), 7);
    assert_eq!(a.policy().await.expect("policy").expect("in force").text, "v7: doc");
}

async fn revocations_refuse_in_the_admission_and_are_listed_and_announced(kind: Kind) {
    use mcpfleet_state::Revocation;
    let h = Harness::new(kind).await;
    let s = h.store();
    let b = h.replica().await;
    let (alice, bob) = (user("alice"), user("bob"));
    let spec = BucketSpec { name: "tb".to_owned(), capacity: 10.0, per_second: 1.0 };
    let mut fleet = b.subscribe_fleet().await.expect("subscribe");
    let key = session(s, LONG).await;
    let later = epoch_ms() + 60_000;
    let revoke = |u: &UserKey, jti: Option<&str>, until| Revocation {
        user: u.clone(),
        token_id: jti.map(str::to_owned),
        until_ms: until,
        record: format!("{{\"sub\":\"{}\"}}", u.as_str()),
    };
    // One token of alice's: that token is refused, her others are not, and nothing is taken from her bucket.
    s.revoke(&revoke(&alice, Some("t-1"), later)).await.expect("revoke");
    wait_for(&mut fleet, &Ring::Notice(format!("revoke:{}", alice.as_str()))).await;
    let with = |jti| Admission { bucket: Some(&spec), token_id: jti, ..admission(&alice) };
    assert_eq!(admit(s, &with(Some("t-1"))).await.refused, Some(Refusal::Revoked));
    let r = admit(&*b, &with(Some("t-2"))).await;
    assert_eq!(r.refused, None);
    assert!((r.bucket.expect("reading").tokens - 9.0).abs() < 0.1, "the refused admission took nothing");
    // The whole principal: every token, on every replica; the session it names is not touched.
    s.revoke(&revoke(&alice, None, later)).await.expect("revoke");
    assert_eq!(admit(&*b, &with(Some("t-2"))).await.refused, Some(Refusal::Revoked));
    assert_eq!(admit(s, &with(None)).await.refused, Some(Refusal::Revoked));
    let touch = Admission { session: SessionOp::Touch(&key.id), ..admission(&alice) };
    assert_eq!(admit(s, &touch).await.refused, Some(Refusal::Revoked));
    assert_eq!(admit(s, &Admission { bucket: Some(&spec), ..admission(&bob) }).await.refused, None);
    // The registry lists both, with their records.
    let listed = b.revocations().await.expect("list");
    let fields: Vec<(&str, &str)> = listed.iter().map(|l| (l.user.as_str(), l.field.as_str())).collect();
    assert_eq!(fields, [(alice.as_str(), "*"), (alice.as_str(), "j:t-1")]);
    assert_eq!(listed[0].record, format!("{{\"sub\":\"{}\"}}", alice.as_str()));
    // Lifted: the principal is back, the single token still is not.
    assert!(b.lift(&alice, None).await.expect("lift"));
    assert!(!b.lift(&alice, None).await.expect("lift again"), "nothing left to lift");
    assert_eq!(admit(s, &with(Some("t-2"))).await.refused, None);
    assert_eq!(admit(s, &with(Some("t-1"))).await.refused, Some(Refusal::Revoked));
    // A revocation ends by itself at its time.
    s.revoke(&revoke(&bob, None, epoch_ms() + 300)).await.expect("revoke");
    assert_eq!(admit(s, &admission(&bob)).await.refused, Some(Refusal::Revoked));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(admit(s, &admission(&bob)).await.refused, None);
}

async fn tenant_windows_lease_what_is_left_to_any_replica(kind: Kind) {
    let h = Harness::new(kind).await;
    let (a, b) = (h.store(), h.replica().await);
    let w = Duration::from_millis(400);
    assert_eq!(a.lease_window("acme", "t", 4, 10, w).await.expect("lease").0, 4);
    assert_eq!(b.lease_window("acme", "t", 4, 10, w).await.expect("lease").0, 4, "another replica, the same window");
    let (granted, left) = a.lease_window("acme", "t", 4, 10, w).await.expect("lease");
    assert_eq!(granted, 2, "never more than the window has left");
    assert!(left <= w && left > Duration::ZERO, "{left:?}");
    assert_eq!(b.lease_window("acme", "t", 4, 10, w).await.expect("lease").0, 0);
    assert_eq!(a.lease_window("globex", "t", 4, 10, w).await.expect("lease").0, 4, "another tenant's window");
    assert_eq!(a.lease_window("acme", "u", 4, 10, w).await.expect("lease").0, 4, "another tool's window");
    tokio::time::sleep(w + Duration::from_millis(50)).await;
    assert_eq!(b.lease_window("acme", "t", 4, 10, w).await.expect("lease").0, 4, "a new window");
}

async fn grants_are_per_user_and_downstream_locked_once_and_taken_once(kind: Kind) {
    let h = Harness::new(kind).await;
    let a = h.store();
    let b = h.replica().await;
    let (alice, bob) = (user(&format!("alice-{}", next())), user(&format!("bob-{}", next())));
    let ttl = Duration::from_secs(60);
    assert_eq!(a.grant(&alice, "tickets").await.expect("grant"), None);
    a.put_grant(&alice, "tickets", b"sealed-1\x00\xff", ttl).await.expect("put");
    assert_eq!(b.grant(&alice, "tickets").await.expect("grant").as_deref(), Some(&b"sealed-1\x00\xff"[..]));
    assert_eq!(b.grant(&bob, "tickets").await.expect("grant"), None, "another user's is not served");
    assert_eq!(b.grant(&alice, "calendar").await.expect("grant"), None, "another downstream's is not served");
    // A 401 on an old grant never drops the one a refresh stored meanwhile.
    b.put_grant(&alice, "tickets", b"sealed-2", ttl).await.expect("put");
    assert!(!a.drop_grant(&alice, "tickets", Some(b"sealed-1\x00\xff")).await.expect("drop"));
    assert!(a.drop_grant(&alice, "tickets", Some(b"sealed-2")).await.expect("drop"));
    assert_eq!(b.grant(&alice, "tickets").await.expect("grant"), None);
    a.put_grant(&alice, "tickets", b"sealed-3", Duration::from_millis(150)).await.expect("put");
    assert!(b.grant(&alice, "tickets").await.expect("grant").is_some());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.grant(&alice, "tickets").await.expect("grant"), None, "a grant lives its TTL");

    // One refresh at a time, across replicas; only the holder releases; an abandoned lock expires.
    assert!(a.lock_grant(&alice, "tickets", "replica-a", Duration::from_millis(300)).await.expect("lock"));
    assert!(!b.lock_grant(&alice, "tickets", "replica-b", ttl).await.expect("lock"));
    assert!(b.lock_grant(&bob, "tickets", "replica-b", ttl).await.expect("lock"), "bob's lock is his own");
    b.unlock_grant(&alice, "tickets", "replica-b").await.expect("unlock");
    assert!(!b.lock_grant(&alice, "tickets", "replica-b", ttl).await.expect("lock"), "not released by another");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(b.lock_grant(&alice, "tickets", "replica-b", ttl).await.expect("lock"), "expired");
    b.unlock_grant(&alice, "tickets", "replica-b").await.expect("unlock");
    assert!(a.lock_grant(&alice, "tickets", "replica-a", ttl).await.expect("lock"), "released");

    // An authorization in progress: read on any replica, taken once.
    let id = format!("az-{}", next());
    a.put_authorization(&id, r#"{"user":"alice"}"#, ttl).await.expect("put");
    assert_eq!(b.authorization(&id).await.expect("read").as_deref(), Some(r#"{"user":"alice"}"#));
    assert_eq!(b.take_authorization(&id).await.expect("take").as_deref(), Some(r#"{"user":"alice"}"#));
    assert_eq!(a.take_authorization(&id).await.expect("take"), None, "single use");
    assert_eq!(a.authorization(&id).await.expect("read"), None);
    a.put_authorization(&id, "short", Duration::from_millis(100)).await.expect("put");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(b.take_authorization(&id).await.expect("take"), None, "expired");
}

/// A fact the replicas compare (their skill sets' digests): each replica's declaration lives its TTL, every
/// declarer's value is answered to each, facts are apart, and a replica that withdraws takes its value along. A
/// store one process holds answers the one value.
async fn declarations_are_compared_per_fact_and_expire(kind: Kind) {
    let h = Harness::new(kind).await;
    let (a, b) = (h.store(), h.replica().await);
    let fact = format!("skills-{}", next());
    let ttl = Duration::from_secs(30);
    assert_eq!(a.declare(&fact, "a", "sha256:one", ttl).await.expect("declare"), vec!["sha256:one".to_owned()]);
    if h.prefixed("{fleet}:dl:x").is_none() {
        assert_eq!(a.declare(&fact, "a", "sha256:one", Duration::ZERO).await.expect("withdraw"), Vec::<String>::new());
        return;
    }
    let mut seen = b.declare(&fact, "b", "sha256:two", ttl).await.expect("declare");
    seen.sort();
    assert_eq!(seen, vec!["sha256:one".to_owned(), "sha256:two".to_owned()], "both replicas' values");
    let other = format!("{fact}-other");
    assert_eq!(a.declare(&other, "a", "x", ttl).await.expect("declare"), vec!["x".to_owned()], "facts are apart");
    // A replica that dies stops counting when its declaration expires.
    b.declare(&fact, "b", "sha256:two", Duration::from_millis(200)).await.expect("declare");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(a.declare(&fact, "a", "sha256:one", ttl).await.expect("declare"), vec!["sha256:one".to_owned()]);
    b.declare(&fact, "b", "sha256:two", ttl).await.expect("declare");
    assert_eq!(b.declare(&fact, "b", "", Duration::ZERO).await.expect("withdraw"), vec!["sha256:one".to_owned()]);
}

/// A DPoP proof rides on its admission: the first admission with it is admitted (and records it), the same proof
/// again is refused on any replica, with nothing taken from the bucket, until it can no longer be accepted; another
/// user's proof with the same id is another proof; a session touch and a slot ride along as usual; every key
/// expires.
async fn dpop_proofs_are_admitted_once_on_any_replica(kind: Kind) {
    let h = Harness::new(kind).await;
    let (s, b) = (h.store(), h.replica().await);
    let (alice, bob) = (user(&format!("alice-{}", next())), user(&format!("bob-{}", next())));
    let spec = BucketSpec { name: "tb".to_owned(), capacity: 10.0, per_second: 1.0 };
    let key = SessionKey { user: alice.clone(), id: session_id() };
    create(s, &key, &new_session(LONG)).await.expect("create");
    let ttl = Duration::from_millis(400);
    let with = |id| Admission { bucket: Some(&spec), proof: Some((id, ttl)), ..admission(&alice) };
    let first = admit(s, &with("p-1")).await;
    assert_eq!(first.refused, None);
    let again = admit(&*b, &with("p-1")).await;
    assert_eq!(again.refused, Some(Refusal::Replayed), "the same proof through another replica");
    assert_eq!(admit(s, &with("p-1")).await.refused, Some(Refusal::Replayed), "and through the first");
    let other = admit(&*b, &with("p-2")).await;
    assert_eq!(other.refused, None);
    let taken = 10.0 - other.bucket.expect("reading").tokens;
    assert!((taken - 2.0).abs() < 0.2, "the replays took nothing: {taken} tokens taken");
    let bobs = Admission { bucket: Some(&spec), proof: Some(("p-1", ttl)), ..admission(&bob) };
    assert_eq!(admit(s, &bobs).await.refused, None, "another user's proof id is another proof");
    let touch = Admission { session: SessionOp::Touch(&key.id), proof: Some(("p-3", ttl)), ..admission(&alice) };
    let touched = admit(&*b, &touch).await;
    assert_eq!(touched.refused, None);
    assert!(touched.session.is_some(), "the session is touched in the same round trip");
    assert_eq!(admit(s, &touch).await.refused, Some(Refusal::Replayed));
    // Admissions with proofs that arrive together (they may ride in one batch, each proof its own key, the session
    // touches among them): one of two arrivals of one proof is admitted, the other refused; the rest admitted.
    let t = SessionOp::Touch(&key.id);
    let at = |id| Admission { bucket: Some(&spec), session: t, proof: Some((id, ttl)), ..admission(&alice) };
    let (a1, a2, a3, a4) = (at("p-10"), at("p-11"), at("p-10"), at("p-12"));
    let (r1, r2, r3, r4) = tokio::join!(s.admit(&a1), s.admit(&a2), s.admit(&a3), s.admit(&a4));
    let decided: Vec<Option<Refusal>> = [r1, r2, r3, r4].into_iter().map(|r| r.expect("admit").refused).collect();
    assert_eq!(decided[1], None);
    assert_eq!(decided[3], None);
    let mut same = vec![decided[0], decided[2]];
    same.sort_by_key(Option::is_some);
    assert_eq!(same, vec![None, Some(Refusal::Replayed)], "one proof, arriving twice together: {decided:?}");
    // Remembered as long as it could be accepted, no longer.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(admit(&*b, &with("p-1")).await.refused, None, "forgotten after its time");
    assert_all_keys_expire(&h);
}
