//! How the store reaches Redis in each topology: one shared, multiplexed command connection ([`Link`]) that every
//! script and pipeline goes through, whatever stands behind it.
//!
//! - **standalone**: a [`ConnectionManager`] to the URL; it reconnects by itself.
//! - **cluster**: the async cluster client ([`ClusterConnection`]); it follows `MOVED`/`ASK`, retries `TRYAGAIN` and
//!   refreshes its slot map after failovers, so that no redirect ever reaches a caller.
//! - **sentinel**: a [`ConnectionManager`] to the master the sentinels name, and a watcher that asks them again
//!   every second, at once when a sentinel announces `+switch-master`, and at once when a command fails as a
//!   master's would not (`READONLY`, a dropped or refused connection). When the answer changes, the watcher
//!   connects to the new master and swaps it in; the subscriber follows through a [`watch`] channel. Writes that
//!   reach the old master after a replica was promoted would be lost when it resyncs, so commands are **held**
//!   from the moment a sentinel announces it is promoting one (`+failover-state-send-slaveof-noone`) until the
//!   new master is followed (or the failover is aborted, or [`HOLD_MAX`] passed); the store's deadline still
//!   bounds each call, so a held call that outlasts it is a 503 like any other.
//!
//! Credentials come from the URL or from [`RedisConfig::username`]/[`RedisConfig::password`]; they are never logged.

use super::config::{RedisConfig, RedisTopology};
use crate::{Result, StateError};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ConnectionInfo, Pipeline, RedisFuture, Value};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// How often the sentinel watcher asks who the master is, without a reason to ask sooner.
const SENTINEL_POLL: Duration = Duration::from_secs(1);
/// The least time between two asks that failed commands triggered.
const SENTINEL_NUDGE_GAP: Duration = Duration::from_millis(100);
/// How often an idle listener to a sentinel's announcements checks its connection.
const SENTINEL_LISTEN_PING: Duration = Duration::from_secs(5);
/// The longest commands are held for a failover the sentinels announced, should its end never be heard.
const HOLD_MAX: Duration = Duration::from_secs(10);
/// What the sentinels announce about a failover, on the channels of the same names.
const FAILOVER_EVENTS: [&str; 6] = [
    "+failover-state-send-slaveof-noone",
    "+switch-master",
    "-failover-abort-not-elected",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout",
    "+failover-end-for-timeout",
];

/// `f`, or [`StateError::Timeout`] if it takes longer than `t`: the deadline of every Redis call.
pub(super) async fn with_deadline<F: std::future::Future>(t: Duration, f: F) -> Result<F::Output> {
    tokio::time::timeout(t, f).await.map_err(|_| StateError::Timeout(t))
}

/// The connection info of one data node at `host:port` (or of the standalone URL), with the configured TLS,
/// certificate authority and credentials.
pub(super) fn node_info(cfg: &RedisConfig, target: &str) -> Result<ConnectionInfo> {
    let url = if target.contains("://") {
        target.to_owned()
    } else {
        format!("{}://{target}/", if cfg.tls { "rediss" } else { "redis" })
    };
    let info = match &cfg.tls_ca {
        Some(ca) if url.starts_with("rediss://") => {
            let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) };
            redis::Client::build_with_tls(url.as_str(), certs)?.get_connection_info().clone()
        }
        _ => redis::IntoConnectionInfo::into_connection_info(url.as_str())?,
    };
    let mut settings = info.redis_settings().clone();
    if let Some(u) = &cfg.username {
        settings = settings.set_username(u);
    }
    if let Some(p) = &cfg.password {
        settings = settings.set_password(p);
    }
    Ok(info.set_redis_settings(settings))
}

/// The options of every [`ConnectionManager`] the store opens (the subscriber adds its push sender).
pub(super) fn manager_config(cfg: &RedisConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(cfg.timeout))
        .set_response_timeout(Some(cfg.timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(2))
}

/// The cluster client's options: RESP3 (sharded pub/sub needs it), the configured TLS and credentials, and
/// redirects and `TRYAGAIN` retried well inside the store's deadline.
pub(super) fn cluster_builder(cfg: &RedisConfig, nodes: &[String]) -> Result<ClusterClientBuilder> {
    let infos = nodes.iter().map(|n| node_info(cfg, n)).collect::<Result<Vec<_>>>()?;
    let mut b = ClusterClientBuilder::new(infos)
        .use_protocol(redis::ProtocolVersion::RESP3)
        .connection_timeout(cfg.timeout)
        .response_timeout(cfg.timeout)
        .retries(6)
        .min_retry_wait(10)
        .max_retry_wait(u64::try_from(cfg.timeout.as_millis() / 4).unwrap_or(500).max(20));
    if let Some(ca) = &cfg.tls_ca {
        b = b.certs(redis::TlsCertificates { client_tls: None, root_cert: Some(ca.clone()) });
    }
    Ok(b)
}

/// One shared command connection, whatever the topology. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub(super) enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<Follower>),
}

impl Link {
    /// Connects to the configured topology. For Sentinel, also starts the watcher.
    pub(super) async fn connect(cfg: &RedisConfig) -> Result<Self> {
        match &cfg.topology {
            RedisTopology::Standalone { url } => Ok(Self::Single(connect_manager(cfg, node_info(cfg, url)?).await?)),
            RedisTopology::Cluster { nodes } => {
                let client = cluster_builder(cfg, nodes)?.build()?;
                Ok(Self::Cluster(with_deadline(cfg.timeout, client.get_async_connection()).await??))
            }
            RedisTopology::Sentinel { sentinels, master } => {
                Ok(Self::Sentinel(Follower::start(cfg, sentinels, master).await?))
            }
        }
    }

    /// Under Sentinel: the master this link follows, as it changes (for the subscriber, which follows it too).
    pub(super) fn master(&self) -> Option<watch::Receiver<ConnectionInfo>> {
        match self {
            Self::Sentinel(f) => Some(f.master.subscribe()),
            Self::Single(_) | Self::Cluster(_) => None,
        }
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::Sentinel(f) => {
                let f = f.clone();
                Box::pin(async move {
                    let mut c = f.ready().await;
                    let r = c.req_packed_command(cmd).await;
                    f.check(r.as_ref().err());
                    r
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Sentinel(f) => {
                let f = f.clone();
                Box::pin(async move {
                    let mut c = f.ready().await;
                    let r = c.req_packed_commands(pipeline, offset, count).await;
                    f.check(r.as_ref().err());
                    r
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
            Self::Sentinel(f) => f.current().get_db(),
        }
    }
}

/// The master the sentinels name, followed: the connection to it, and a watcher that swaps in a new one when the
/// sentinels name another.
pub(super) struct Follower {
    current: RwLock<(String, ConnectionManager)>,
    nudge: Notify,
    /// Since when commands are held for a failover under way (`None`: not held).
    hold: watch::Sender<Option<std::time::Instant>>,
    /// The master followed now, for whoever follows it too.
    master: watch::Sender<ConnectionInfo>,
    metrics: Option<crate::StoreMetrics>,
}

impl Follower {
    async fn start(cfg: &RedisConfig, sentinels: &[String], master: &str) -> Result<Arc<Self>> {
        let mut ask = Sentinels::new(cfg, sentinels, master)?;
        let addr = ask.master().await?;
        let info = node_info(cfg, &addr)?;
        let conn = connect_manager(cfg, info.clone()).await?;
        let me = Arc::new(Self {
            current: RwLock::new((addr, conn)),
            nudge: Notify::new(),
            hold: watch::Sender::new(None),
            master: watch::Sender::new(info),
            metrics: cfg.metrics.clone(),
        });
        // The sentinel that leads a failover is the one that announces its steps: listen to every one.
        for info in &ask.infos {
            tokio::spawn(hear_failovers(Arc::downgrade(&me), info.clone(), master.to_owned(), cfg.timeout));
        }
        tokio::spawn(watch_master(Arc::downgrade(&me), ask, cfg.clone()));
        Ok(me)
    }

    fn current(&self) -> ConnectionManager {
        self.current.read().unwrap_or_else(PoisonError::into_inner).1.clone()
    }

    fn addr(&self) -> String {
        self.current.read().unwrap_or_else(PoisonError::into_inner).0.clone()
    }

    /// The connection to send a command on, once commands are no longer held.
    async fn ready(&self) -> ConnectionManager {
        self.unheld().await;
        self.current()
    }

    /// Waits while commands are held for a failover (at most until [`HOLD_MAX`] after it began).
    async fn unheld(&self) {
        // The common case, no failover under way, reads the flag and nothing more.
        if self.hold.borrow().is_none() {
            return;
        }
        let mut rx = self.hold.subscribe();
        let since = *rx.borrow_and_update();
        let Some(since) = since else { return };
        let left = HOLD_MAX.saturating_sub(since.elapsed());
        let _ = tokio::time::timeout(left, rx.wait_for(Option::is_none)).await;
    }

    /// Holds commands from now, or lets them go.
    fn set_hold(&self, on: bool) {
        self.hold.send_if_modified(|h| {
            let changed = h.is_some() != on;
            if changed {
                *h = on.then(std::time::Instant::now);
            }
            changed
        });
    }

    /// A command failed in a way that suggests the master moved: ask the sentinels now.
    fn check(&self, err: Option<&redis::RedisError>) {
        if let Some(e) = err
            && (e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
                || e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal())
        {
            self.nudge.notify_one();
        }
    }
}

/// Why a first node of the topology (the standalone node, the first cluster seed, the first sentinel) cannot be
/// reached, from one bare connection without retries; `None` when it answers or only times out.
pub(super) async fn why_unreachable(cfg: &RedisConfig) -> Option<StateError> {
    let info = match &cfg.topology {
        RedisTopology::Standalone { url } => node_info(cfg, url),
        RedisTopology::Cluster { nodes } => node_info(cfg, nodes.first()?),
        // Sentinels speak the data nodes' TLS, but take no data-node credentials.
        RedisTopology::Sentinel { sentinels, .. } => {
            node_info(&RedisConfig { username: None, password: None, ..cfg.clone() }, sentinels.first()?)
        }
    };
    let attempt = async {
        let client = redis::Client::open(info?)?;
        let mut conn = with_deadline(cfg.timeout, client.get_multiplexed_async_connection()).await??;
        with_deadline(cfg.timeout, redis::cmd("PING").query_async::<Value>(&mut conn)).await??;
        Ok::<_, StateError>(())
    };
    match attempt.await {
        Err(e) if !e.is_timeout() => Some(e),
        _ => None,
    }
}

async fn connect_manager(cfg: &RedisConfig, info: ConnectionInfo) -> Result<ConnectionManager> {
    let client = redis::Client::open(info)?;
    with_deadline(cfg.timeout, client.get_connection_manager_with_config(manager_config(cfg)))
        .await?
        .map_err(Into::into)
}

/// Asks the sentinels every second (or when nudged) who the master is, and follows it. Ends when the store is
/// dropped.
async fn watch_master(me: std::sync::Weak<Follower>, mut ask: Sentinels, cfg: RedisConfig) {
    loop {
        let Some(f) = me.upgrade() else { return };
        let nudged = tokio::select! {
            () = tokio::time::sleep(SENTINEL_POLL) => false,
            () = f.nudge.notified() => true,
        };
        if f.hold.borrow().is_some_and(|since| since.elapsed() >= HOLD_MAX) {
            tracing::warn!("no end heard of the failover the sentinels announced: releasing redis commands");
            f.set_hold(false);
        }
        drop(f);
        if nudged {
            // Let a burst of failing commands settle into one ask.
            tokio::time::sleep(SENTINEL_NUDGE_GAP).await;
        }
        let Ok(addr) = ask.master().await else { continue };
        let Some(f) = me.upgrade() else { return };
        if addr == f.addr() {
            continue;
        }
        // Held commands go to the new master only: the old one is let go once the new one is in place.
        let info = match node_info(&cfg, &addr) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "sentinels name a master that cannot be addressed");
                continue;
            }
        };
        match connect_manager(&cfg, info.clone()).await {
            Ok(conn) => {
                tracing::warn!(master = %addr, "redis master changed; following it");
                *f.current.write().unwrap_or_else(PoisonError::into_inner) = (addr, conn);
                f.set_hold(false);
                if let Some(m) = &f.metrics {
                    m.master_changed();
                }
                f.master.send_replace(info);
            }
            Err(e) => tracing::warn!(master = %addr, error = %e, "cannot reach the new redis master yet"),
        }
    }
}

/// Listens to one sentinel's failover announcements for `master` (again after a second when the connection
/// fails): commands are held from a promotion's start until its end, and the watcher asks at once on
/// `+switch-master`. Ends when the store is dropped.
async fn hear_failovers(me: std::sync::Weak<Follower>, sentinel: ConnectionInfo, master: String, timeout: Duration) {
    use futures::StreamExt as _;
    loop {
        let heard = async {
            let mut pubsub =
                with_deadline(timeout, redis::Client::open(sentinel.clone())?.get_async_pubsub()).await??;
            with_deadline(timeout, pubsub.subscribe(&FAILOVER_EVENTS[..])).await??;
            let (mut sink, mut messages) = pubsub.split();
            loop {
                // Events are rare: a PING every few seconds finds a connection a partition left half open.
                let msg = tokio::select! {
                    msg = messages.next() => msg,
                    () = tokio::time::sleep(SENTINEL_LISTEN_PING) => {
                        with_deadline(timeout, sink.ping::<Value>()).await??;
                        continue;
                    }
                };
                let Some(msg) = msg else { return Ok(()) };
                let Some(f) = me.upgrade() else { return Ok(()) };
                // "+switch-master <master> <old ip> <old port> <new ip> <new port>"; the others end with
                // "@ <master> <ip> <port>".
                let payload: String = msg.get_payload().unwrap_or_default();
                let words: Vec<&str> = payload.split(' ').collect();
                let ours =
                    words.first() == Some(&master.as_str()) || words.windows(2).any(|w| w[0] == "@" && w[1] == master);
                if !ours {
                    continue;
                }
                match msg.get_channel_name() {
                    "+failover-state-send-slaveof-noone" => {
                        tracing::warn!("the sentinels are promoting a replica: holding redis commands");
                        f.set_hold(true);
                    }
                    "+switch-master" => f.nudge.notify_one(),
                    _ => f.set_hold(false),
                }
            }
        };
        let _: Result<()> = heard.await;
        if me.upgrade().is_none() {
            return;
        }
        tokio::time::sleep(SENTINEL_POLL).await;
    }
}

/// The sentinels, asked in turn; the one that answered last is asked first next time.
struct Sentinels {
    infos: Vec<ConnectionInfo>,
    conns: Vec<Option<MultiplexedConnection>>,
    master: String,
    timeout: Duration,
}

impl Sentinels {
    fn new(cfg: &RedisConfig, sentinels: &[String], master: &str) -> Result<Self> {
        // Sentinels speak the data nodes' TLS, but take no data-node credentials.
        let plain = RedisConfig { username: None, password: None, ..cfg.clone() };
        let infos = sentinels.iter().map(|s| node_info(&plain, s)).collect::<Result<Vec<_>>>()?;
        let conns = infos.iter().map(|_| None).collect();
        Ok(Self { infos, conns, master: master.to_owned(), timeout: cfg.timeout })
    }

    /// `host:port` of the master, from the first sentinel that knows it.
    async fn master(&mut self) -> Result<String> {
        let mut last = StateError::Protocol("no sentinel named the master");
        for i in 0..self.infos.len() {
            match self.ask(i).await {
                Ok(addr) => {
                    self.infos[..=i].rotate_right(1);
                    self.conns[..=i].rotate_right(1);
                    return Ok(addr);
                }
                Err(e) => {
                    self.conns[i] = None;
                    last = e;
                }
            }
        }
        Err(last)
    }

    async fn ask(&mut self, i: usize) -> Result<String> {
        let conn = match &self.conns[i] {
            Some(c) => c.clone(),
            None => {
                let client = redis::Client::open(self.infos[i].clone())?;
                let c = with_deadline(self.timeout, client.get_multiplexed_async_connection()).await??;
                self.conns[i] = Some(c.clone());
                c
            }
        };
        let mut conn = conn;
        let cmd = redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(&self.master).clone();
        let reply: Option<(String, u16)> = with_deadline(self.timeout, cmd.query_async(&mut conn)).await??;
        let (host, port) = reply.ok_or(StateError::Protocol("the sentinels do not know the master name"))?;
        Ok(if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") })
    }
}
