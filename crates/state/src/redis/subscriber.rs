//! One RESP3 connection per replica carries every doorbell subscription of that replica. Local subscribers share
//! a channel's subscription; the last one to leave unsubscribes. Subscribe and unsubscribe commands are issued by
//! one task, in order, so that an unsubscribe can never overtake a later subscribe to the same channel.

use super::{RedisConfig, with_deadline};
use crate::types::Ring;
use crate::{Result, StateError, Subscription};
use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{PushInfo, PushKind, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};

/// Rings a slow local subscriber may fall behind before it sees [`Ring::Lagged`].
const LOCAL_BUFFER: usize = 256;
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

impl Subscriber {
    pub(super) async fn connect(cfg: &RedisConfig, info: redis::ConnectionInfo) -> Result<Self> {
        let settings = info.redis_settings().clone().set_protocol(redis::ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let channels: Channels = Arc::default();
        let dispatch = channels.clone();
        // Set when the connection drops; the heartbeat re-rings everyone once it is back (and resubscribed).
        let dropped = Arc::new(AtomicBool::new(false));
        let dropped_push = dropped.clone();
        let push = move |info: PushInfo| -> std::result::Result<(), std::convert::Infallible> {
            match info.kind {
                PushKind::Message => {
                    if let [ch, payload] = info.data.as_slice()
                        && let (Some(ch), Some(payload)) = (text(ch), text(payload))
                        && let Some(ring) = Ring::decode(&payload)
                        && let Some(c) = lock(&dispatch).get(&ch)
                    {
                        let _ = c.tx.send(ring);
                    }
                }
                PushKind::Disconnection => {
                    dropped_push.store(true, Ordering::Relaxed);
                    for c in lock(&dispatch).values() {
                        let _ = c.tx.send(Ring::Lagged);
                    }
                }
                _ => {}
            }
            Ok(())
        };
        let mgr_cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.timeout))
            .set_response_timeout(Some(cfg.timeout))
            .set_push_sender(push)
            .set_automatic_resubscription();
        let conn = with_deadline(cfg.timeout, client.get_connection_manager_with_config(mgr_cfg)).await??;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(conn, rx, channels.clone(), dropped, cfg.timeout));
        Ok(Self { channels, commands: tx, timeout: cfg.timeout })
    }

    pub(super) async fn subscribe(&self, channel: String) -> Result<RedisSubscription> {
        let (done_tx, done_rx) = oneshot::channel();
        let rx = {
            let mut map = lock(&self.channels);
            let c = map
                .entry(channel.clone())
                .or_insert_with(|| Channel { tx: broadcast::channel(LOCAL_BUFFER).0, refs: 0 });
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
/// makes the manager reconnect (and resubscribe) as soon as Redis is back, after which every local subscriber gets
/// [`Ring::Lagged`] to re-check what it may have missed. An unsubscribe that failed is retried then.
async fn run(
    mut conn: ConnectionManager,
    mut rx: mpsc::UnboundedReceiver<Command>,
    channels: Channels,
    dropped: Arc<AtomicBool>,
    timeout: Duration,
) {
    let mut beat = tokio::time::interval(HEARTBEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut healthy = true;
    let mut stale: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => return,
                Some(Command::Subscribe(ch, done)) => {
                    stale.remove(&ch);
                    let _ = done.send(conn.subscribe(&ch).await);
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
            _ = beat.tick() => {
                let ok = matches!(
                    tokio::time::timeout(timeout, redis::cmd("PING").query_async::<Value>(&mut conn)).await,
                    Ok(Ok(_))
                );
                if ok && (!healthy || dropped.swap(false, Ordering::Relaxed)) {
                    tracing::info!("doorbell connection restored");
                    for c in lock(&channels).values() {
                        let _ = c.tx.send(Ring::Lagged);
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
