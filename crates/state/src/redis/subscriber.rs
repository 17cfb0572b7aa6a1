//! One RESP3 connection per replica carries every doorbell subscription of that replica. Local subscribers share
//! a channel's subscription; the last one to leave unsubscribes. Subscribe and unsubscribe commands are issued by
//! one task, in order, so that an unsubscribe can never overtake a later subscribe to the same channel.
//!
//! On a cluster the channels are sharded (`SSUBSCRIBE`, the scripts `SPUBLISH`): each lives on the node that owns
//! its hash slot, which is the slot of the keys it rings for. A node that drops a shard channel (its slot moved) or
//! a connection that comes back is subscribed again, and every local subscriber then gets [`Ring::Lagged`] to
//! re-check what it may have missed. Under Sentinel the connection follows the master.

use super::config::RedisConfig;
use super::link::{cluster_builder, manager_config, with_deadline};
use crate::types::Ring;
use crate::{Result, StateError, Subscription};
use async_trait::async_trait;
use redis::aio::{AsyncPushSender, ConnectionManager, SendError};
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, PushInfo, PushKind, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

/// Rings a slow local subscriber of a session's doorbell may fall behind before it sees [`Ring::Lagged`], which
/// makes it re-read the store: nothing is lost, so the buffer is small. Each open stream holds one, allocated in
/// full (issue 32: 256 rings were about 16 KiB of every open stream's memory on its replica).
pub(super) const DOORBELL_BUFFER: usize = 16;
/// The same for a principal's notice channel, whose rings carry the notifications themselves (a lagged
/// listener loses them: delivery is at most once), so it takes a burst.
pub(super) const NOTICE_BUFFER: usize = 256;
/// How often the subscriber connection is checked (and reconnected).
const HEARTBEAT: Duration = Duration::from_secs(1);

type Channels = Arc<Mutex<HashMap<String, Channel>>>;

struct Channel {
    tx: broadcast::Sender<Ring>,
    refs: usize,
}

enum Command {
    Subscribe(String, oneshot::Sender<redis::RedisResult<()>>),
    Unsubscribe(String),
    /// The server dropped a channel we still want (its slot moved): subscribe again.
    Resubscribe(String),
}

/// Where the subscriber connects.
pub(super) enum Target {
    Single(Box<ConnectionInfo>),
    Cluster(Vec<String>),
    /// The master the sentinels name, as the command connection's watcher follows it.
    Sentinel(watch::Receiver<ConnectionInfo>),
}

#[derive(Clone)]
pub(super) struct Subscriber {
    channels: Channels,
    commands: mpsc::UnboundedSender<Command>,
    timeout: Duration,
}

fn lock(c: &Channels) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
    c.lock().unwrap_or_else(PoisonError::into_inner)
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn ring_all(channels: &Channels) {
    for c in lock(channels).values() {
        let _ = c.tx.send(Ring::Lagged);
    }
}

/// Hands pushed messages to the local subscribers of their channel.
#[derive(Clone)]
struct Pusher {
    channels: Channels,
    /// Set when the connection drops; the heartbeat re-rings everyone once it is back (and resubscribed).
    dropped: Arc<AtomicBool>,
    commands: mpsc::UnboundedSender<Command>,
}

impl AsyncPushSender for Pusher {
    fn send(&self, info: PushInfo) -> std::result::Result<(), SendError> {
        match info.kind {
            PushKind::Message | PushKind::SMessage => {
                if let [ch, payload] = info.data.as_slice()
                    && let (Some(ch), Some(payload)) = (text(ch), text(payload))
                    && let Some(ring) = Ring::decode(&payload)
                    && let Some(c) = lock(&self.channels).get(&ch)
                {
                    let _ = c.tx.send(ring);
                }
            }
            PushKind::SUnsubscribe => {
                // Our own SUNSUBSCRIBE is confirmed for a channel nobody holds any more; one somebody still holds
                // was dropped by the server.
                if let Some(ch) = info.data.first().and_then(text)
                    && let Some(c) = lock(&self.channels).get(&ch)
                {
                    let _ = c.tx.send(Ring::Lagged);
                    let _ = self.commands.send(Command::Resubscribe(ch));
                }
            }
            PushKind::Disconnection => {
                self.dropped.store(true, Ordering::Relaxed);
                ring_all(&self.channels);
            }
            _ => {}
        }
        Ok(())
    }
}

/// The pub/sub connection: classic channels on one node, sharded ones on a cluster.
enum PubSub {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl PubSub {
    async fn connect(cfg: &RedisConfig, target: &Target, pusher: &Pusher) -> Result<Self> {
        let single = |info: &ConnectionInfo| {
            let settings = info.redis_settings().clone().set_protocol(redis::ProtocolVersion::RESP3);
            let client = redis::Client::open(info.clone().set_redis_settings(settings))?;
            let mgr_cfg = manager_config(cfg).set_push_sender(pusher.clone()).set_automatic_resubscription();
            Ok::<_, StateError>(async move { client.get_connection_manager_with_config(mgr_cfg).await })
        };
        match target {
            Target::Single(info) => Ok(Self::Single(with_deadline(cfg.timeout, single(info)?).await??)),
            Target::Sentinel(rx) => {
                let info = rx.borrow().clone();
                Ok(Self::Single(with_deadline(cfg.timeout, single(&info)?).await??))
            }
            Target::Cluster(nodes) => {
                let client = cluster_builder(cfg, nodes)?.push_sender(pusher.clone()).build()?;
                Ok(Self::Cluster(with_deadline(cfg.timeout, client.get_async_connection()).await??))
            }
        }
    }

    async fn subscribe(&mut self, ch: &str) -> redis::RedisResult<()> {
        match self {
            Self::Single(c) => c.subscribe(ch).await,
            Self::Cluster(c) => c.ssubscribe(ch).await,
        }
    }

    async fn unsubscribe(&mut self, ch: &str) -> redis::RedisResult<()> {
        match self {
            Self::Single(c) => c.unsubscribe(ch).await,
            Self::Cluster(c) => c.sunsubscribe(ch).await,
        }
    }

    /// Whether the connection answers (on a cluster: every master).
    async fn alive(&mut self, timeout: Duration) -> bool {
        let ping = redis::cmd("PING");
        let r = match self {
            Self::Single(c) => tokio::time::timeout(timeout, ping.query_async::<Value>(c)).await,
            Self::Cluster(c) => tokio::time::timeout(timeout, ping.query_async::<Value>(c)).await,
        };
        matches!(r, Ok(Ok(_)))
    }
}

impl Subscriber {
    pub(super) async fn connect(cfg: &RedisConfig, target: Target) -> Result<Self> {
        let channels: Channels = Arc::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let pusher = Pusher { channels: channels.clone(), dropped: Arc::default(), commands: tx.clone() };
        let conn = PubSub::connect(cfg, &target, &pusher).await?;
        tokio::spawn(run(conn, rx, pusher, cfg.clone(), target));
        Ok(Self { channels, commands: tx, timeout: cfg.timeout })
    }

    /// Subscribes to `channel`; a local subscriber may fall `buffer` rings behind (the first subscriber of the
    /// channel on this replica sets it) before it sees [`Ring::Lagged`].
    pub(super) async fn subscribe(&self, channel: String, buffer: usize) -> Result<RedisSubscription> {
        let (done_tx, done_rx) = oneshot::channel();
        let rx = {
            let mut map = lock(&self.channels);
            let c = map.entry(channel.clone()).or_insert_with(|| Channel { tx: broadcast::channel(buffer).0, refs: 0 });
            c.refs += 1;
            // Every subscriber sends its own SUBSCRIBE (idempotent in Redis) and waits for its confirmation, so
            // none returns before the channel is live, even if an earlier one failed. It is queued under the map
            // lock, so it is ordered against the UNSUBSCRIBE of a release.
            if self.commands.send(Command::Subscribe(channel.clone(), done_tx)).is_err() {
                c.refs -= 1;
                return Err(StateError::Protocol("subscriber stopped"));
            }
            c.tx.subscribe()
        };
        let sub = RedisSubscription { rx, channel, owner: self.clone() };
        match with_deadline(self.timeout, done_rx).await? {
            Ok(Ok(())) => Ok(sub),
            Ok(Err(e)) => Err(StateError::Unavailable(e)),
            Err(_) => Err(StateError::Protocol("subscriber stopped")),
        }
    }

    fn release(&self, channel: &str) {
        let mut map = lock(&self.channels);
        if let Some(c) = map.get_mut(channel) {
            c.refs -= 1;
            if c.refs == 0 {
                map.remove(channel);
                let _ = self.commands.send(Command::Unsubscribe(channel.to_owned()));
            }
        }
    }
}

/// Issues subscribe and unsubscribe commands in order, and keeps the connection alive: a PING every second
/// makes the connection reconnect (and resubscribe) as soon as Redis is back, after which every local subscriber
/// gets [`Ring::Lagged`] to re-check what it may have missed. An unsubscribe that failed is retried then. Under
/// Sentinel, a new master gets a new connection with every channel subscribed again.
async fn run(
    mut conn: PubSub,
    mut rx: mpsc::UnboundedReceiver<Command>,
    pusher: Pusher,
    cfg: RedisConfig,
    mut target: Target,
) {
    let (channels, dropped, timeout) = (pusher.channels.clone(), pusher.dropped.clone(), cfg.timeout);
    let mut beat = tokio::time::interval(HEARTBEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut healthy = true;
    let mut stale: HashSet<String> = HashSet::new();
    // Channels to subscribe again once the connection answers (a failed resubscription, a new master).
    let mut wanted: HashSet<String> = HashSet::new();
    // Under Sentinel: the master changed and the connection does not follow it yet.
    let mut follow = false;
    loop {
        let master_changed = async {
            match &mut target {
                Target::Sentinel(rx) => rx.changed().await.is_ok(),
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => return,
                Some(Command::Subscribe(ch, done)) => {
                    stale.remove(&ch);
                    let _ = done.send(conn.subscribe(&ch).await);
                }
                Some(Command::Resubscribe(ch)) => {
                    if lock(&channels).contains_key(&ch) && conn.subscribe(&ch).await.is_err() {
                        wanted.insert(ch);
                    }
                }
                Some(Command::Unsubscribe(ch)) => {
                    // Someone subscribed again after the release was queued: keep the subscription.
                    if !lock(&channels).contains_key(&ch)
                        && let Err(e) = conn.unsubscribe(&ch).await
                    {
                        tracing::warn!(error = %e, "doorbell unsubscribe failed; will retry");
                        stale.insert(ch);
                    }
                }
            },
            changed = master_changed => {
                if !changed {
                    return;
                }
                follow = true;
                ring_all(&channels);
                beat.reset_immediately();
            }
            _ = beat.tick() => {
                if follow {
                    match PubSub::connect(&cfg, &target, &pusher).await {
                        Ok(c) => {
                            tracing::info!("doorbell connection follows the new master");
                            conn = c;
                            follow = false;
                            wanted.extend(lock(&channels).keys().cloned());
                            stale.clear();
                        }
                        Err(e) => tracing::warn!(error = %e, "doorbell connection cannot reach the new master yet"),
                    }
                }
                let ok = conn.alive(timeout).await;
                if ok && (!healthy || dropped.swap(false, Ordering::Relaxed)) {
                    tracing::info!("doorbell connection restored");
                    // The cluster client resubscribes on its own too; asking again is harmless and sure.
                    if matches!(conn, PubSub::Cluster(_)) {
                        wanted.extend(lock(&channels).keys().cloned());
                    }
                    ring_all(&channels);
                }
                if ok && !wanted.is_empty() {
                    let again: Vec<String> = wanted.drain().filter(|ch| lock(&channels).contains_key(ch)).collect();
                    let mut failed = false;
                    for ch in again {
                        if conn.subscribe(&ch).await.is_err() {
                            failed = true;
                            wanted.insert(ch);
                        }
                    }
                    if !failed {
                        ring_all(&channels);
                    }
                }
                if ok && !stale.is_empty() {
                    let retry: Vec<String> = stale.drain().filter(|ch| !lock(&channels).contains_key(ch)).collect();
                    for ch in retry {
                        if conn.unsubscribe(&ch).await.is_err() {
                            stale.insert(ch);
                        }
                    }
                }
                healthy = ok;
            }
        }
    }
}

pub(super) struct RedisSubscription {
    rx: broadcast::Receiver<Ring>,
    channel: String,
    owner: Subscriber,
}

impl std::fmt::Debug for RedisSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSubscription").finish_non_exhaustive()
    }
}

impl Drop for RedisSubscription {
    fn drop(&mut self) {
        self.owner.release(&self.channel);
    }
}

#[async_trait]
impl Subscription for RedisSubscription {
    async fn recv(&mut self) -> Option<Ring> {
        match self.rx.recv().await {
            Ok(r) => Some(r),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Ring::Lagged),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// Several subscriptions heard as one (the bells of every queue shard): the first ring of any of them.
pub(super) struct Merged(pub(super) Vec<RedisSubscription>);

impl std::fmt::Debug for Merged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merged").field("channels", &self.0.len()).finish()
    }
}

#[async_trait]
impl Subscription for Merged {
    async fn recv(&mut self) -> Option<Ring> {
        // Each receiver's recv is cancel-safe: the ones that lose the race lose nothing.
        let mut all: Vec<_> = self.0.iter_mut().map(|s| Box::pin(s.recv())).collect();
        std::future::poll_fn(|cx| {
            for f in &mut all {
                if let std::task::Poll::Ready(r) = f.as_mut().poll(cx) {
                    return std::task::Poll::Ready(r);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}
