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
//! | `<p>{fleet}:members` | zset | fleet membership: each replica's id, scored by its record's expiry (ms); renewed every 5 s by `members.lua`, which drops the expired |
//! | `<p>{fleet}:layout` | hash | each member's declaration of the layout it writes and reads ([`crate::layout`]), written with its record by `members.lua` and read by `layouts.lua` before a replica serves |
//! | `<p>{fleet}:dl:<fact>` / `:dv:<fact>` | zset / hash | the replicas' declarations of a fact the fleet compares (`skills`: the skill set's digest): each declarer's id scored by its declaration's expiry (ms), and its value; renewed every 10 s by `declare.lua`, which drops the expired |
//! | `<p>{fleet}:policy` | hash | the policy version in force ([`crate::PolicyStore`]): `v` (its number), `doc` (the document), `by`, `at` (ms), `sum` (what it changed); written by `policy.lua`, which also rings the notice channel; never expires |
//! | `<p>{fleet}:nb` | channel | the fleet's notice channel: `policy:<version>` when a version is stored, `revoke:<user>` when a revocation is made or lifted |
//! | `<p>{u:<user>}:dp:<proof id>` | string | a DPoP proof seen, set `PX … NX` by `admit.lua` in the admission of the request that carried it, for as long as the proof could be accepted: the same proof again is refused on any replica |
//! | `<p>{u:<user>}:rv` | hash | the principal's revocations, read by `admit.lua`: `*` (every token) and `j:<jti>` (one token), each when it ends (ms); lives as long as its longest (`revoke.lua`) |
//! | `<p>{t:<tenant hash>}:tq:<tool>` | string | a tenant's shared fixed window: the uses leased to replicas (`lease.lua`); expires when its window ends |
//! | `<p>{fleet}:revoked` | hash | the fleet's registry of revocations (`<user>:<field>` → the record `revoke --list` shows), which each replica keeps in memory for when the store is away (`revoked.lua`, which also rings the notice channel) |
//!
//! Every script reads the clock with `TIME`. Commands on the hot path go over one shared multiplexed
//! connection (a [`link::Link`]: standalone, cluster or the master the sentinels name); replays, admin calls and
//! `WAIT` go over a second one (on a standalone Redis, the deadpool pool), so that they never hold up the hot path;
//! doorbell subscriptions use a dedicated RESP3 connection owned by one task. On a cluster the channels are sharded
//! (`SPUBLISH`/`SSUBSCRIBE`); each lives in the slot of the keys it rings for, and the scripts publish it themselves.
//!
//! The store's parts: [`config`] (what to reach and how), [`link`] and [`subscriber`] (the connections),
//! [`scripts`] (the Lua), [`codec`] (arguments and replies), [`known`] (what never changes within a session, kept
//! on the replica), [`lanes`] and [`batch`] (admissions that ride together); the calls themselves in [`sessions`]
//! (records, event logs, routing), [`limits`] (admissions), [`idempotency`] and [`tasks`]. This file holds
//! [`RedisStore`] and how a call reaches Redis.

mod batch;
mod codec;
mod config;
mod grants;
mod idempotency;
mod known;
mod lanes;
mod limits;
mod link;
mod policy;
mod revocation;
mod scripts;
mod sessions;
mod subscriber;
mod tasks;

pub use config::{RedisConfig, RedisTopology};

use crate::types::{SessionKey, UserKey};
use crate::{Result, StateError};
use codec::{cat, ms};
use link::{Link, with_deadline};
use redis::Value;
use scripts::{PubSubKind, Scripts, TaskScripts};
use std::sync::Arc;
use std::time::Duration;
use subscriber::{Subscriber, Target};

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
    tasks: TaskScripts,
    pubsub: PubSubKind,
    /// What never changes within a session, kept here (issue 32).
    known: known::Known,
    /// Admissions waiting to ride together (issue 32).
    lanes: lanes::Lanes,
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

impl RedisStore {
    /// Connects the command connection, the bulk connection (a pool on a standalone Redis) and the subscriber.
    ///
    /// # Errors
    /// A bad URL or node address, or Redis not answering within the configured timeout.
    pub async fn connect(cfg: RedisConfig) -> Result<Self> {
        match Self::connect_all(cfg.clone()).await {
            // The connection managers retry on their own until the deadline, which hides why they failed: one bare
            // connection says (refused, a certificate nobody trusts, a wrong password), so that the caller can tell
            // waiting from giving up (`StateError::is_transient`).
            Err(e) if e.is_timeout() => Err(link::why_unreachable(&cfg).await.unwrap_or(e)),
            r => r,
        }
    }

    async fn connect_all(cfg: RedisConfig) -> Result<Self> {
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
            tasks: TaskScripts::new(kind),
            pubsub: kind,
            known: known::Known::default(),
            lanes: lanes::Lanes::default(),
        });
        tokio::spawn(heartbeat(Arc::downgrade(&inner)));
        Ok(Self { inner })
    }

    /// The fleet's membership zset and layout hash (one slot: `{fleet}`).
    fn fleet_keys(&self) -> (String, String) {
        let p = &self.inner.cfg.prefix;
        (cat(&[p, "{fleet}:members"]), cat(&[p, "{fleet}:layout"]))
    }

    /// A fact's zset of live declarers and hash of values (one slot: `{fleet}`).
    fn declare_keys(&self, fact: &str) -> (String, String) {
        let p = &self.inner.cfg.prefix;
        (cat(&[p, "{fleet}:dl:", fact]), cat(&[p, "{fleet}:dv:", fact]))
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
