//! The production store: all session state in Redis, so that any replica answers any request.
//!
//! Key layout, one hash tag per user so that one script touches all of a user's keys, also on Redis Cluster
//! (`<p>` is the configured prefix, `mcp:` by default):
//!
//! | key | type | what |
//! |---|---|---|
//! | `<p>{u:<user>}:s:<sid>` | hash | the session: `ttl`, `pv`, `caps`, `info`, `created`, `n` (streams opened), `lvl`, `g` (standalone holder), `rq:<k>` (request id of POST stream k), `pq:<id>` (pending server→client request), `rsp:<id>` (its delivered answer, until taken); expires between the idle TTL and a sixteenth more after the last request (admit.lua pushes the TTLs out only once less than the idle TTL is left) |
//! | `<p>{u:<user>}:ev:<sid>` | stream | every committed SSE event of the session; fields `s` (stream), `d` (data), `f` (final) |
//! | `<p>{u:<user>}:ls:<sid>` | zset | open streams, scored by lease expiry (ms, from the Redis clock) |
//! | `<p>{u:<user>}:cx:<sid>` | zset | cancelled request ids, scored by marker expiry (60 s) |
//! | `<p>{u:<user>}:db:<sid>` | channel | the session's doorbell |
//! | `<p>{u:<user>}:ss` | zset | the user's open sessions, scored by idle expiry (ms): the session cap counts it |
//! | `<p>{u:<user>}:tb` / `:tb:<peer>` | hash | the token bucket: `u` (tokens, in millionths: an integer), `ts` (last update, ms), `x` (when the key expires, ms); expires 1 to 2 s after it is full |
//! | `<p>{u:<user>}:cs` / `:cc` | zset | leased slots (open SSE streams / calls in flight), scored by lease expiry; the key lives one to two leases past its newest |
//! | `<p>{u:<user>}:q:<tool>` | string | a fixed-window counter; expires when its window ends |
//! | `<p>{u:<user>}:idem:<tool>:<sha256(key)>` | hash | an idempotency record: `d` (argument digest), `s` (`run`/`done`), `t` (runner token), `r` (result); expires with the runner's lease, then after the retention time |
//! | `<p>{u:<user>}:nb` | channel | the principal's notice channel (`subscriptions/listen` streams) |
//!
//! Every script reads the clock with `TIME`. Commands on the hot path go over one shared multiplexed
//! connection (a [`link::Link`]: standalone, cluster or the master the sentinels name); replays, admin calls and
//! `WAIT` go over a second one (on a standalone Redis, the deadpool pool), so that they never hold up the hot path;
//! doorbell subscriptions use a dedicated RESP3 connection owned by one task. On a cluster the channels are sharded
//! (`SPUBLISH`/`SSUBSCRIBE`); each lives in the slot of the keys it rings for, and the scripts publish it themselves.

mod link;
mod subscriber;
mod tasks;

use crate::limits::{Admission, Admitted, BucketReading, Refusal, SessionOp, SlotSet, WindowReading};
use crate::stateless::{Claim, ClaimSpec, IdempotencyKey};
use crate::types::UserKey;
use crate::types::{AppendOptions, Event, EventId, LeaseToken, OpenStream, SessionInfo, SessionKey, StreamState};
use crate::{
    Delivery, EventStore, IdempotencyStore, LimitStore, Result, Router, SessionStore, StateError, Subscription,
};
use async_trait::async_trait;
use link::Link;
use redis::{Script, Value};
use std::sync::Arc;
use std::time::Duration;
use subscriber::{Subscriber, Target};

/// Which Redis: one server, a cluster, or the master a group of sentinels names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server (or a managed endpoint that hides its failover): `redis://`, `rediss://` or `unix://`.
    Standalone { url: String },
    /// A Redis Cluster, found from these seed nodes (`host:port`).
    Cluster { nodes: Vec<String> },
    /// The master that these sentinels (`host:port`) name `master`.
    Sentinel { sentinels: Vec<String>, master: String },
}

impl RedisTopology {
    /// The topology for logs and `Debug`: the nodes, but never a standalone URL (it may hold a password).
    #[must_use]
    pub fn redacted(&self) -> String {
        match self {
            Self::Standalone { .. } => "standalone, url [redacted]".to_owned(),
            Self::Cluster { nodes } => format!("cluster {nodes:?}"),
            Self::Sentinel { sentinels, master } => format!("sentinel {master:?} {sentinels:?}"),
        }
    }
}

/// How to reach Redis and how to use it.
#[derive(Clone)]
pub struct RedisConfig {
    pub topology: RedisTopology,
    /// The ACL user and password of the data nodes (they override those of a standalone URL). Sentinels are
    /// asked without them.
    pub username: Option<String>,
    pub password: Option<String>,
    /// TLS to every node, sentinels included (a standalone URL says it with `rediss://`).
    pub tls: bool,
    /// Prepended to every key and channel, so that several deployments (or test suites) can share one Redis.
    pub prefix: String,
    /// The deadline of every Redis call.
    pub timeout: Duration,
    /// Approximate cap on each session's event log (`XADD MAXLEN ~`).
    pub max_events: usize,
    /// How long a cancellation marker lasts.
    pub cancel_ttl: Duration,
    /// Size of the pool used for replays and admin calls.
    pub pool_size: usize,
    /// Where command latency and errors are recorded.
    pub metrics: Option<crate::StoreMetrics>,
    /// With TLS: the certificate authority to trust (PEM), instead of the system's roots.
    pub tls_ca: Option<Vec<u8>>,
    /// How many replicas must acknowledge the writes that make a promise (a task's creation, queue entry, run lease
    /// and end; an idempotent call's result) before the promise is made: `WAIT <n>`, for at most half the
    /// deadline. 0 waits for none.
    pub durable_replicas: u32,
}

impl std::fmt::Debug for RedisConfig {
    // The URL and the password are secrets: never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("topology", &self.topology.redacted())
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[redacted]"))
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca.as_ref().map(|c| format!("{} bytes of PEM", c.len())))
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("durable_replicas", &self.durable_replicas)
            .finish_non_exhaustive()
    }
}

impl RedisConfig {
    /// A standalone Redis at `url`, with the defaults.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_topology(RedisTopology::Standalone { url: url.into() })
    }

    /// `topology`, with the defaults.
    #[must_use]
    pub fn with_topology(topology: RedisTopology) -> Self {
        Self {
            topology,
            username: None,
            password: None,
            tls: false,
            durable_replicas: 0,
            prefix: "mcp:".to_owned(),
            timeout: Duration::from_secs(2),
            max_events: 1000,
            cancel_ttl: Duration::from_secs(60),
            pool_size: 16,
            metrics: None,
            tls_ca: None,
        }
    }
}

struct Scripts {
    admit: Script,
    slot: Script,
    refund: Script,
    open: Script,
    append: Script,
    renew: Script,
    state: Script,
    abandon: Script,
    replay: Script,
    delete: Script,
    deliver: Script,
    take: Script,
    forget: Script,
    cancel: Script,
    cancelled: Script,
    set_level: Script,
    idem: Script,
}

/// The command a script rings a channel with: sharded on a cluster, where a classic `PUBLISH` would be broadcast to
/// every node.
#[derive(Clone, Copy)]
pub(super) enum PubSubKind {
    Classic,
    Sharded,
}

/// A script, ringing its channels the way `kind` says.
pub(super) fn script(source: &str, kind: PubSubKind) -> Script {
    match kind {
        PubSubKind::Classic => Script::new(source),
        PubSubKind::Sharded => Script::new(&source.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")),
    }
}

impl Scripts {
    fn new(kind: PubSubKind) -> Self {
        let script = |source| script(source, kind);
        Self {
            admit: Script::new(include_str!("admit.lua")),
            slot: Script::new(include_str!("slot.lua")),
            refund: Script::new(include_str!("refund.lua")),
            open: script(include_str!("open.lua")),
            append: script(include_str!("append.lua")),
            renew: Script::new(include_str!("renew.lua")),
            state: Script::new(include_str!("state.lua")),
            abandon: script(include_str!("abandon.lua")),
            replay: Script::new(include_str!("replay.lua")),
            delete: script(include_str!("delete.lua")),
            deliver: script(include_str!("deliver.lua")),
            take: Script::new(include_str!("take.lua")),
            forget: Script::new(include_str!("forget.lua")),
            cancel: script(include_str!("cancel.lua")),
            cancelled: Script::new(include_str!("cancelled.lua")),
            set_level: Script::new(include_str!("set_level.lua")),
            idem: Script::new(include_str!("idem.lua")),
        }
    }
}

/// The Redis store. Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: RedisConfig,
    conn: Link,
    bulk: Bulk,
    subscriber: Subscriber,
    scripts: Scripts,
    tasks: tasks::TaskScripts,
    pubsub: PubSubKind,
}

/// Where replays, admin calls and `WAIT` go: the pool on a standalone Redis, a second link otherwise.
enum Bulk {
    Pool(deadpool_redis::Pool),
    Link(Link),
}

impl std::fmt::Debug for RedisStore {
    // The URL may hold a password: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("prefix", &self.inner.cfg.prefix).finish_non_exhaustive()
    }
}

struct Keys {
    session: String,
    events: String,
    leases: String,
    doorbell: String,
    cancellations: String,
    index: String,
}

/// The keys of session `sid` under a user's base (`<p>{u:<user>}`).
fn keys_at(base: &str, sid: &str) -> Keys {
    Keys {
        index: cat(&[base, ":ss"]),
        session: cat(&[base, ":s:", sid]),
        events: cat(&[base, ":ev:", sid]),
        leases: cat(&[base, ":ls:", sid]),
        doorbell: cat(&[base, ":db:", sid]),
        cancellations: cat(&[base, ":cx:", sid]),
    }
}

/// `parts` end to end, in one allocation (keys are built on every request; `format!` costs more).
fn cat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

impl RedisStore {
    /// Connects the command connection, the bulk connection (a pool on a standalone Redis) and the subscriber.
    ///
    /// # Errors
    /// A bad URL or node address, or Redis not answering within the configured timeout.
    pub async fn connect(cfg: RedisConfig) -> Result<Self> {
        let conn = Link::connect(&cfg).await?;
        let (bulk, target, kind) = match &cfg.topology {
            RedisTopology::Standalone { url } => {
                let info = link::node_info(&cfg, url)?;
                let mut pc = deadpool_redis::PoolConfig::new(cfg.pool_size);
                pc.timeouts.wait = Some(cfg.timeout);
                pc.timeouts.create = Some(cfg.timeout);
                pc.timeouts.recycle = Some(cfg.timeout);
                let pool = deadpool_redis::Pool::builder(deadpool_redis::Manager::new(info.clone())?)
                    .config(pc)
                    .runtime(deadpool_redis::Runtime::Tokio1)
                    .build()
                    .map_err(|_| StateError::Protocol("invalid redis pool configuration"))?;
                (Bulk::Pool(pool), Target::Single(Box::new(info)), PubSubKind::Classic)
            }
            RedisTopology::Cluster { nodes } => {
                (Bulk::Link(Link::connect(&cfg).await?), Target::Cluster(nodes.clone()), PubSubKind::Sharded)
            }
            RedisTopology::Sentinel { .. } => {
                let master = conn.master().ok_or(StateError::Protocol("no master to follow"))?;
                // The bulk link follows the master on its own; only the command link counts master changes.
                let bulk = Link::connect(&RedisConfig { metrics: None, ..cfg.clone() }).await?;
                (Bulk::Link(bulk), Target::Sentinel(master), PubSubKind::Classic)
            }
        };
        let subscriber = Subscriber::connect(&cfg, target).await?;
        let inner = Arc::new(Inner {
            cfg,
            conn,
            bulk,
            subscriber,
            scripts: Scripts::new(kind),
            tasks: tasks::TaskScripts::new(kind),
            pubsub: kind,
        });
        tokio::spawn(heartbeat(Arc::downgrade(&inner)));
        Ok(Self { inner })
    }

    /// The prefix and hash tag of every key of `user`.
    fn user_base(&self, user: &UserKey) -> String {
        cat(&[&self.inner.cfg.prefix, "{u:", user.as_str(), "}"])
    }

    fn keys(&self, key: &SessionKey) -> Keys {
        self.keys_of(&key.user, key.id.as_str())
    }

    fn keys_of(&self, user: &UserKey, sid: &str) -> Keys {
        keys_at(&self.user_base(user), sid)
    }

    fn timeout(&self) -> Duration {
        self.inner.cfg.timeout
    }

    /// Times `f` as one command of `kind`.
    async fn measured<T>(&self, kind: &'static str, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let Some(m) = &self.inner.cfg.metrics else { return f.await };
        let started = std::time::Instant::now();
        let r = f.await;
        m.observe(kind, started.elapsed(), r.is_ok());
        r
    }

    async fn run(&self, kind: &'static str, inv: redis::ScriptInvocation<'_>) -> Result<Value> {
        let mut conn = self.inner.conn.clone();
        let t = self.timeout();
        self.measured(kind, async { with_deadline(t, inv.invoke_async(&mut conn)).await?.map_err(StateError::from) })
            .await
    }

    async fn run_pooled(&self, kind: &'static str, inv: redis::ScriptInvocation<'_>) -> Result<Value> {
        let t = self.timeout();
        self.measured(kind, async {
            match &self.inner.bulk {
                Bulk::Pool(pool) => {
                    let mut conn = pooled(pool, t).await?;
                    with_deadline(t, inv.invoke_async(&mut *conn)).await?.map_err(StateError::from)
                }
                Bulk::Link(link) => {
                    let mut conn = link.clone();
                    with_deadline(t, inv.invoke_async(&mut conn)).await?.map_err(StateError::from)
                }
            }
        })
        .await
    }

    /// For the writes that make a promise (a task's creation, queue entry, run lease and end; an idempotent
    /// call's result): waits until `--redis-durable-replicas` replicas hold every write so far to `key`'s node.
    /// Too few in time, or a `WAIT` that fails, is counted and logged, never failed: the write stands on the master,
    /// and failing the call now would make its client retry a write that was made.
    async fn durable(&self, key: &str) -> Result<()> {
        let want = self.inner.cfg.durable_replicas;
        if want == 0 {
            return Ok(());
        }
        let acked = match self.wait_replicas(key, want).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "WAIT for redis replicas failed");
                0
            }
        };
        if acked < want {
            tracing::warn!(acked, want, "a durable write is not yet on enough redis replicas");
            if let Some(m) = &self.inner.cfg.metrics {
                m.unreplicated();
            }
        }
        Ok(())
    }

    /// Waits until `replicas` replicas hold every write made so far to the node of `key` (`WAIT`, on the bulk
    /// connection, since it blocks the connection it is sent on), for at most half the deadline. Returns how many
    /// did.
    async fn wait_replicas(&self, key: &str, replicas: u32) -> Result<u32> {
        let t = self.timeout();
        let wait_ms = ms(t / 2);
        // The EXISTS routes the pipeline to the key's node on a cluster; WAIT itself has no key.
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS").arg(key).ignore().cmd("WAIT").arg(replicas).arg(wait_ms);
        self.measured("wait", async {
            let (acked,): (u32,) = match &self.inner.bulk {
                Bulk::Pool(pool) => {
                    let mut conn = pooled(pool, t).await?;
                    with_deadline(t, pipe.query_async(&mut *conn)).await??
                }
                Bulk::Link(link) => {
                    let mut conn = link.clone();
                    with_deadline(t, pipe.query_async(&mut conn)).await??
                }
            };
            Ok(acked)
        })
        .await
    }

    /// An admission and the `HGETALL` of a record, pipelined: one round trip. A script cache emptied by a restart
    /// (`NOSCRIPT`) is refilled and the pipeline sent again, once.
    async fn run_with_read(&self, inv: &redis::ScriptInvocation<'_>, record: &str) -> Result<(Value, Value)> {
        let mut conn = self.inner.conn.clone();
        let t = self.timeout();
        self.measured("admit", async {
            let mut pipe = redis::pipe();
            pipe.invoke_script(inv).cmd("HGETALL").arg(record);
            let first = with_deadline(t, pipe.query_async::<(Value, Value)>(&mut conn)).await?;
            match first {
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                    with_deadline(t, inv.load_async(&mut conn)).await??;
                    Ok(with_deadline(t, pipe.query_async::<(Value, Value)>(&mut conn)).await??)
                }
                r => Ok(r?),
            }
        })
        .await
    }

    async fn query<T: redis::FromRedisValue>(&self, kind: &'static str, cmd: &redis::Cmd) -> Result<T> {
        let mut conn = self.inner.conn.clone();
        let t = self.timeout();
        self.measured(kind, async { with_deadline(t, cmd.query_async(&mut conn)).await?.map_err(StateError::from) })
            .await
    }

    fn maxlen(&self) -> usize {
        self.inner.cfg.max_events
    }
}

/// A connection of the pool, within the deadline `t`.
async fn pooled(pool: &deadpool_redis::Pool, t: Duration) -> Result<deadpool_redis::Connection> {
    with_deadline(t, pool.get()).await?.map_err(|e| match e {
        deadpool_redis::PoolError::Backend(e) => StateError::Unavailable(e),
        _ => StateError::Timeout(t),
    })
}

/// Keeps the command connection warm: a PING every second makes the manager reconnect as soon as Redis is back,
/// instead of failing the first request after an outage. Ends when the store is dropped.
async fn heartbeat(inner: std::sync::Weak<Inner>) {
    let mut beat = tokio::time::interval(Duration::from_secs(1));
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        beat.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let mut conn = inner.conn.clone();
        let _ = tokio::time::timeout(inner.cfg.timeout, redis::cmd("PING").query_async::<Value>(&mut conn)).await;
    }
}

async fn with_deadline<F: std::future::Future>(t: Duration, f: F) -> Result<F::Output> {
    tokio::time::timeout(t, f).await.map_err(|_| StateError::Timeout(t))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => {
            std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).ok_or(StateError::Protocol("expected an integer"))
        }
        _ => Err(StateError::Protocol("expected an integer")),
    }
}

fn string(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| StateError::Protocol("expected utf-8")),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        _ => Err(StateError::Protocol("expected a string")),
    }
}

fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(a) => Ok(a),
        _ => Err(StateError::Protocol("expected an array")),
    }
}

/// Splits a script's `{status, ...}` reply.
fn status(v: Value) -> Result<(i64, Vec<Value>)> {
    let mut a = array(v)?;
    if a.is_empty() {
        return Err(StateError::Protocol("empty reply"));
    }
    let rest = a.split_off(1);
    Ok((int(&a[0])?, rest))
}

fn event_id(stream: u64, v: &Value) -> Result<EventId> {
    EventId::from_position(stream, &string(v)?).ok_or(StateError::Protocol("bad stream id"))
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn touch_session(&self, key: &SessionKey) -> Result<Option<SessionInfo>> {
        let a = Admission { session: SessionOp::Touch(&key.id), ..Admission::new(&key.user) };
        Ok(self.admit(&a).await?.session)
    }

    async fn set_log_level(&self, key: &SessionKey, level: &str) -> Result<bool> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.set_level.key(&k.session);
        inv.arg(level);
        Ok(int(&self.run("set_level", inv).await?)? == 1)
    }

    async fn delete_session(&self, key: &SessionKey) -> Result<bool> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.delete.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.cancellations).key(&k.doorbell).key(&k.index).arg(key.id.as_str());
        Ok(int(&self.run_pooled("delete", inv).await?)? == 1)
    }
}

#[async_trait]
impl EventStore for RedisStore {
    async fn open_stream(&self, key: &SessionKey, open: &OpenStream) -> Result<(u64, EventId)> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.open.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.doorbell);
        match open {
            OpenStream::Post { request_id, token, lease } => {
                inv.arg("post").arg(ms(*lease)).arg(&token.0).arg(self.maxlen()).arg(request_id);
            }
            OpenStream::Standalone { token, lease } => {
                inv.arg("get").arg(ms(*lease)).arg(&token.0).arg(self.maxlen()).arg("");
            }
        }
        let (code, rest) = status(self.run("open", inv).await?)?;
        match (code, rest.as_slice()) {
            (1, [n, id]) => {
                let n = u64::try_from(int(n)?).map_err(|_| StateError::Protocol("bad stream number"))?;
                Ok((n, event_id(n, id)?))
            }
            (0, _) => Err(StateError::SessionNotFound),
            _ => Err(StateError::Protocol("bad open reply")),
        }
    }

    async fn append(&self, key: &SessionKey, stream: u64, data: &str, opts: &AppendOptions) -> Result<EventId> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.append.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.doorbell);
        inv.arg(stream)
            .arg(data)
            .arg(if opts.is_final { "1" } else { "0" })
            .arg(self.maxlen())
            .arg(opts.pending_request.as_deref().unwrap_or(""))
            .arg(opts.lease.map(|d| ms(d).to_string()).unwrap_or_default())
            .arg(opts.pending_trace.as_deref().unwrap_or(""))
            .arg(opts.seq.map(|q| q.to_string()).unwrap_or_default());
        let (code, rest) = status(self.run("append", inv).await?)?;
        match (code, rest.as_slice()) {
            (1, [id]) => event_id(stream, id),
            (0, _) => Err(StateError::SessionNotFound),
            (2, _) => Err(StateError::StreamFinished),
            (3, _) => Err(StateError::Superseded),
            _ => Err(StateError::Protocol("bad append reply")),
        }
    }

    async fn renew_lease(&self, key: &SessionKey, stream: u64, token: &LeaseToken, ttl: Duration) -> Result<bool> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.renew.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.index).arg(stream).arg(ms(ttl)).arg(&token.0).arg(key.id.as_str());
        Ok(int(&self.run("renew", inv).await?)? == 1)
    }

    async fn read_after(
        &self,
        key: &SessionKey,
        stream: u64,
        cursor: &EventId,
        check_stream: bool,
        limit: usize,
    ) -> Result<(Vec<Event>, EventId)> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.replay.key(&k.session);
        inv.key(&k.events)
            .arg(cursor.position())
            .arg(stream)
            .arg(if check_stream { "1" } else { "0" })
            .arg(limit.max(1));
        let (code, rest) = status(self.run_pooled("replay", inv).await?)?;
        match code {
            1 => {
                let mut it = rest.iter();
                let last = it.next().ok_or(StateError::Protocol("bad replay reply"))?;
                let last = event_id(stream, last)?;
                let mut out = Vec::new();
                while let (Some(id), Some(d), Some(f)) = (it.next(), it.next(), it.next()) {
                    out.push(Event { id: event_id(stream, id)?, data: string(d)?, is_final: string(f)? == "1" });
                }
                Ok((out, last))
            }
            0 => Err(StateError::SessionNotFound),
            3 => Err(StateError::CursorGone),
            _ => Err(StateError::Protocol("bad replay reply")),
        }
    }

    async fn stream_state(&self, key: &SessionKey, stream: u64) -> Result<StreamState> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.state.key(&k.session);
        inv.key(&k.leases).arg(stream);
        let (code, rest) = status(self.run("state", inv).await?)?;
        match (code, rest.as_slice()) {
            (0, _) => Err(StateError::SessionNotFound),
            (1, _) => Ok(StreamState::Finished),
            (2, _) => Ok(StreamState::Running),
            (3, [rq]) => Ok(StreamState::Abandoned { request_id: string(rq)? }),
            _ => Err(StateError::Protocol("bad state reply")),
        }
    }

    async fn abandon_stream(&self, key: &SessionKey, stream: u64, data: &str) -> Result<Option<EventId>> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.abandon.key(&k.session);
        inv.key(&k.events).key(&k.leases).key(&k.doorbell).arg(stream).arg(data).arg(self.maxlen());
        let (code, rest) = status(self.run("abandon", inv).await?)?;
        match (code, rest.as_slice()) {
            (1, [id]) => Ok(Some(event_id(stream, id)?)),
            (0, _) => Err(StateError::SessionNotFound),
            _ => Ok(None),
        }
    }
}

#[async_trait]
impl Router for RedisStore {
    async fn subscribe(&self, key: &SessionKey) -> Result<Box<dyn Subscription>> {
        let k = self.keys(key);
        Ok(Box::new(self.inner.subscriber.subscribe(k.doorbell).await?))
    }

    async fn deliver_response(&self, key: &SessionKey, request_id: &str, message: &str) -> Result<Delivery> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.deliver.key(&k.session);
        inv.key(&k.doorbell).arg(request_id).arg(message);
        let (code, rest) = status(self.run("deliver", inv).await?)?;
        match (code, rest.as_slice()) {
            (1, [trace]) => {
                let t = string(trace)?;
                Ok(Delivery::Delivered { waiter_trace: (!t.is_empty()).then_some(t) })
            }
            (0, _) => Err(StateError::SessionNotFound),
            _ => Ok(Delivery::NotPending),
        }
    }

    async fn take_response(&self, key: &SessionKey, request_id: &str) -> Result<Option<String>> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.take.key(&k.session);
        inv.arg(request_id);
        match self.run("take", inv).await? {
            Value::Nil => Ok(None),
            v => string(&v).map(Some),
        }
    }

    async fn forget_pending(&self, key: &SessionKey, request_id: &str) -> Result<()> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.forget.key(&k.session);
        inv.arg(request_id);
        self.run("forget", inv).await?;
        Ok(())
    }

    async fn cancel_request(&self, key: &SessionKey, request_id: &str) -> Result<bool> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.cancel.key(&k.session);
        inv.key(&k.cancellations).key(&k.doorbell).arg(request_id).arg(ms(self.inner.cfg.cancel_ttl));
        Ok(int(&self.run("cancel", inv).await?)? == 1)
    }

    async fn is_cancelled(&self, key: &SessionKey, request_id: &str) -> Result<bool> {
        let k = self.keys(key);
        let mut inv = self.inner.scripts.cancelled.key(&k.cancellations);
        inv.arg(request_id);
        Ok(int(&self.run("cancelled", inv).await?)? == 1)
    }

    async fn subscribe_user(&self, user: &UserKey) -> Result<Box<dyn Subscription>> {
        let channel = format!("{}:nb", self.user_base(user));
        Ok(Box::new(self.inner.subscriber.subscribe(channel).await?))
    }

    async fn publish_user(&self, user: &UserKey, message: &str) -> Result<()> {
        let channel = format!("{}:nb", self.user_base(user));
        let publish = match self.inner.pubsub {
            PubSubKind::Classic => "PUBLISH",
            PubSubKind::Sharded => "SPUBLISH",
        };
        let _: i64 = self.query("publish", redis::cmd(publish).arg(channel).arg(format!("n:{message}"))).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        let _: String = self.query("ping", &redis::cmd("PING")).await?;
        Ok(())
    }
}

impl RedisStore {
    fn idem_key(&self, key: &IdempotencyKey) -> String {
        format!("{}:idem:{}:{}", self.user_base(&key.user), key.tool, key.key_hash)
    }
}

#[async_trait]
impl IdempotencyStore for RedisStore {
    async fn claim(&self, key: &IdempotencyKey, spec: &ClaimSpec<'_>) -> Result<Claim> {
        let k = self.idem_key(key);
        let mut inv = self.inner.scripts.idem.key(&k);
        inv.arg("claim").arg(spec.digest).arg(spec.token).arg(ms(spec.lease));
        let reply = array(self.run("idem", inv).await?)?;
        match reply.as_slice() {
            [s] if string(s)? == "run" => Ok(Claim::Run),
            [s] if string(s)? == "running" => Ok(Claim::Running),
            [s] if string(s)? == "mismatch" => Ok(Claim::Mismatch),
            [s, r] if string(s)? == "done" => Ok(Claim::Done(string(r)?)),
            _ => Err(StateError::Protocol("bad idempotency reply")),
        }
    }

    async fn renew_claim(&self, key: &IdempotencyKey, token: &str, lease: Duration) -> Result<bool> {
        let k = self.idem_key(key);
        let mut inv = self.inner.scripts.idem.key(&k);
        inv.arg("renew").arg(token).arg(ms(lease));
        Ok(int(&self.run("idem", inv).await?)? == 1)
    }

    async fn complete_claim(&self, key: &IdempotencyKey, token: &str, result: &str, ttl: Duration) -> Result<bool> {
        let k = self.idem_key(key);
        let mut inv = self.inner.scripts.idem.key(&k);
        inv.arg("complete").arg(token).arg(result).arg(ms(ttl));
        let done = int(&self.run("idem", inv).await?)? == 1;
        if done {
            // "Runs once" is the promise: a failover must not forget the result and let a retry run it again.
            self.durable(&k).await?;
        }
        Ok(done)
    }

    async fn release_claim(&self, key: &IdempotencyKey, token: &str) -> Result<()> {
        let k = self.idem_key(key);
        let mut inv = self.inner.scripts.idem.key(&k);
        inv.arg("release").arg(token);
        self.run("idem", inv).await?;
        Ok(())
    }
}

/// A reply field that is empty when absent.
fn opt_u64(v: &Value) -> Result<Option<u64>> {
    let s = string(v)?;
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| StateError::Protocol("expected a count"))
}

fn millis(v: &Value) -> Result<Duration> {
    Ok(Duration::from_millis(u64::try_from(int(v)?.max(0)).unwrap_or(0)))
}

#[async_trait]
impl LimitStore for RedisStore {
    async fn admit(&self, a: &Admission<'_>) -> Result<Admitted> {
        let base = self.user_base(a.user);
        let sid = match a.session {
            SessionOp::None => "-",
            SessionOp::Touch(id) | SessionOp::Create { id, .. } => id.as_str(),
        };
        let k = keys_at(&base, sid);
        let bucket_key = cat(&[&base, ":", a.bucket.map_or("tb", |b| b.name.as_str())]);
        let set = match (a.slot, a.release) {
            (Some(s), Some((r, _))) if s.set != r => {
                return Err(StateError::Protocol("releases must be of the admitted slot's set"));
            }
            (Some(s), _) => s.set,
            (None, Some((r, _))) => r,
            (None, None) => SlotSet::Calls,
        };
        let slot_key = cat(&[&base, ":", set.suffix()]);
        let window_key = cat(&[&base, ":q:", a.window.map_or("-", |w| w.name.as_str())]);
        let mut inv = self.inner.scripts.admit.key(&bucket_key);
        inv.key(&k.session).key(&k.events).key(&k.leases).key(&k.index).key(&slot_key).key(&window_key);
        // The argument order of admit.lua: what every request may carry first, create's five only on a create.
        match a.bucket {
            Some(b) => inv.arg(b.capacity).arg(b.per_second),
            None => inv.arg("").arg(""),
        };
        match a.slot {
            Some(s) => inv.arg(s.cap).arg(&s.token).arg(ms(s.ttl)),
            None => inv.arg("").arg("").arg(0),
        };
        match a.window {
            Some(w) => inv.arg(w.limit).arg(ms(w.window)),
            None => inv.arg("").arg(0),
        };
        match a.session {
            SessionOp::None => inv.arg("").arg(sid),
            SessionOp::Touch(_) => inv.arg("touch").arg(sid),
            SessionOp::Create { session: s, max_sessions, .. } => inv
                .arg("create")
                .arg(sid)
                .arg(max_sessions)
                .arg(ms(s.idle_ttl))
                .arg(&s.protocol_version)
                .arg(&s.client_capabilities)
                .arg(&s.client_info),
        };
        for token in a.release.map_or(&[][..], |(_, t)| t) {
            inv.arg(token);
        }
        let (reply, task) = match a.read_task {
            None => (self.run("admit", inv).await?, None),
            Some(key) => {
                let (reply, record) = self.run_with_read(&inv, &self.task_record_key(key)).await?;
                (reply, Some(tasks::view_of(record)?))
            }
        };
        let (code, rest) = status(reply)?;
        let [tokens, wait, pv, caps, lvl, slots, wused, wreset] = rest.as_slice() else {
            return Err(StateError::Protocol("bad admit reply"));
        };
        let refused = match code {
            0 => None,
            1 => Some(Refusal::Bucket),
            2 => Some(Refusal::SessionNotFound),
            3 => Some(Refusal::SessionConflict),
            4 => Some(Refusal::Sessions { open: opt_u64(slots)?.unwrap_or(0) }),
            5 => Some(Refusal::Slots { used: opt_u64(slots)?.unwrap_or(0) }),
            6 => Some(Refusal::Window),
            _ => return Err(StateError::Protocol("bad admit code")),
        };
        let bucket = match a.bucket {
            Some(_) => {
                // In millionths of a token (admit.lua keeps an integer, formatted without a float conversion).
                let t: f64 = string(tokens)?.parse().map_err(|_| StateError::Protocol("bad token count"))?;
                let t = t / 1e6;
                Some(BucketReading { allowed: refused != Some(Refusal::Bucket), tokens: t, wait: millis(wait)? })
            }
            None => None,
        };
        let touched = matches!(a.session, SessionOp::Touch(_)) && matches!(code, 0 | 5 | 6);
        let session = if touched {
            let lvl = string(lvl)?;
            Some(SessionInfo {
                protocol_version: string(pv)?,
                client_capabilities: string(caps)?,
                log_level: (!lvl.is_empty()).then_some(lvl),
            })
        } else {
            None
        };
        let window = match opt_u64(wused)? {
            Some(used) => Some(WindowReading { used, reset: (code == 6).then(|| millis(wreset)).transpose()? }),
            None => None,
        };
        let slots_used = if matches!(code, 4) { None } else { opt_u64(slots)? };
        Ok(Admitted { refused, bucket, session, slots_used, window, task })
    }

    async fn renew_slot(&self, user: &UserKey, set: SlotSet, token: &str, ttl: Duration) -> Result<bool> {
        let key = format!("{}:{}", self.user_base(user), set.suffix());
        let mut inv = self.inner.scripts.slot.key(&key);
        inv.arg("renew").arg(ms(ttl)).arg(token);
        Ok(int(&self.run("slot", inv).await?)? == 1)
    }

    async fn release_slots(&self, user: &UserKey, set: SlotSet, tokens: &[String]) -> Result<()> {
        let key = format!("{}:{}", self.user_base(user), set.suffix());
        let mut inv = self.inner.scripts.slot.key(&key);
        inv.arg("release").arg(0);
        for t in tokens {
            inv.arg(t);
        }
        self.run("slot", inv).await?;
        Ok(())
    }

    async fn refund_window(&self, user: &UserKey, name: &str) -> Result<()> {
        let key = format!("{}:q:{name}", self.user_base(user));
        self.run("refund", self.inner.scripts.refund.key(&key)).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{PubSubKind, script};

    #[test]
    fn sharded_scripts_ring_sharded_channels() {
        let sources = [
            include_str!("open.lua"),
            include_str!("append.lua"),
            include_str!("abandon.lua"),
            include_str!("delete.lua"),
            include_str!("deliver.lua"),
            include_str!("cancel.lua"),
            include_str!("tasks/enqueue.lua"),
        ];
        for source in sources {
            assert!(source.contains("redis.call('PUBLISH',"), "{source}");
            let sharded = source.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',");
            assert_eq!(script(source, PubSubKind::Sharded).get_hash(), redis::Script::new(&sharded).get_hash());
            assert!(!sharded.contains("'PUBLISH'"));
        }
    }
}
