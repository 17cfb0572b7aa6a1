use serde_json::Value;

use crate::redis_node::{NotYet, RedisNode, Role, wait_for};
use crate::redis_options::{RedisOptions, Setup};

const TOPOLOGY: &str = "redis sentinel";
/// The name the sentinels monitor the master under.
const MASTER_NAME: &str = "mcpfleet";
const SENTINELS: usize = 3;

/// A Redis Sentinel deployment of its own: a master, a replica (`--replicaof`) and 3 sentinels that monitor the
/// master as `mcpfleet` with a quorum of 2, each on a free port of one host in a temp dir of its own (a sentinel's
/// config file is in its dir: Sentinel rewrites it). A master that does not answer for 1 s is down
/// (`down-after-milliseconds 1000`), so its replica takes over within a few seconds. Every process is killed, and
/// its dir removed, on drop.
///
/// The host is `127.0.0.1`, or the service address of a [`NetLab`](crate::NetLab); with [`RedisOptions::tls`]
/// every process, sentinels included, serves TLS only; with [`RedisOptions::acl`] the data nodes ask for the ACL
/// user and the sentinels log in to them as it (`auth-user`, `auth-pass`), while the sentinels ask for nothing.
///
/// Roles change with failovers: [`master`](Self::master) and [`replica`](Self::replica) ask the sentinels each time.
#[derive(Debug)]
pub struct RedisSentinel {
    // Declared first, dropped first: no sentinel sees the data nodes go.
    sentinels: Vec<RedisNode>,
    data: [RedisNode; 2],
    setup: Setup,
}

impl RedisSentinel {
    /// Starts the master, the replica and the sentinels, and waits until the replica is in sync and every sentinel
    /// knows the master, the replica and the two other sentinels.
    ///
    /// # Panics
    /// If `redis-server` or `redis-cli` is not installed, or a step does not finish within 20 s; the message names
    /// the step and the node, with the tail of its log.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(&RedisOptions::default())
    }

    /// Like [`start`](Self::start), deployed as `options` say: TLS only, with an ACL user, inside a lab.
    ///
    /// # Panics
    /// Like [`start`](Self::start); also when `openssl` (TLS) or `ip` (a lab) is missing.
    #[must_use]
    pub fn start_with(options: &RedisOptions) -> Self {
        let setup = Setup::new(options);
        let master = setup.data_node("sentinel's master".to_owned(), 1, |_, _| {});
        let master_port = master.port();
        let replica = setup.data_node("sentinel's replica".to_owned(), 1, |cmd, _| {
            cmd.args(["--replicaof", setup.host(), &master_port.to_string()]);
        });
        wait_for(TOPOLOGY, "the replica attaches", || match replica.role() {
            Some(Role::Replica { master_port: p, link_up: true }) if p == master_port => Ok(()),
            other => Err(NotYet::new(&replica, format!("ROLE is {other:?}"))),
        });
        let sentinels = (1..=SENTINELS)
            .map(|i| {
                setup.sentinel_node(format!("sentinel {i}"), |host| {
                    format!(
                        "sentinel monitor {MASTER_NAME} {host} {master_port} 2\n{auth}\
                         sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                         sentinel failover-timeout {MASTER_NAME} 3000\n\
                         sentinel parallel-syncs {MASTER_NAME} 1\n",
                        auth = setup.sentinel_auth(MASTER_NAME),
                    )
                })
            })
            .collect();
        let me = Self { sentinels, data: [master, replica], setup };
        wait_for(TOPOLOGY, "every sentinel knows the master, the replica and the other sentinels", || me.check_ok());
        me
    }

    /// The name the sentinels know the master by.
    #[must_use]
    pub fn master_name(&self) -> &'static str {
        MASTER_NAME
    }

    /// `<host>:<port>` of every sentinel, running or not.
    #[must_use]
    pub fn sentinels(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisNode::addr).collect()
    }

    /// The sentinel processes, to kill or stop one.
    #[must_use]
    pub fn sentinel_nodes(&self) -> &[RedisNode] {
        &self.sentinels
    }

    /// The master's `host:port` as the first running sentinel that answers reports it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    ///
    /// # Panics
    /// If no sentinel answers.
    #[must_use]
    pub fn master_addr(&self) -> String {
        self.running_sentinels()
            .find_map(master_addr_of)
            .unwrap_or_else(|| panic!("{TOPOLOGY}: no sentinel answers SENTINEL GET-MASTER-ADDR-BY-NAME"))
    }

    /// The data node the sentinels report as the master (after a kill, the dead one until the failover).
    ///
    /// # Panics
    /// If no sentinel answers, or the address is not one of ours.
    #[must_use]
    pub fn master(&self) -> &RedisNode {
        let addr = self.master_addr();
        self.data
            .iter()
            .find(|n| n.addr() == addr)
            .unwrap_or_else(|| panic!("{TOPOLOGY}: the sentinels report {addr} as the master, not one of ours"))
    }

    /// The data node that is not [`master`](Self::master).
    ///
    /// # Panics
    /// Like [`master`](Self::master).
    #[must_use]
    pub fn replica(&self) -> &RedisNode {
        let master = self.master().port();
        let [a, b] = &self.data;
        if a.port() == master { b } else { a }
    }

    /// Waits until every running sentinel reports `addr` as the master's address and the node there says it is a
    /// master, e.g. after killing the master.
    ///
    /// # Panics
    /// If that does not happen within 20 s.
    pub fn wait_for_master(&self, addr: &str) {
        wait_for(TOPOLOGY, &format!("every sentinel reports {addr} as the master"), || self.check_master(addr));
    }

    /// A failover (`SENTINEL FAILOVER`, without asking the master's agreement): waits until every running sentinel
    /// reports another address and the node there says it is a master. Returns the new master's `host:port`.
    ///
    /// The old master keeps saying it is a master until the sentinels next look at it and turn it into a replica,
    /// about 10 s later: [`wait_ok`](Self::wait_ok) waits for that.
    ///
    /// # Panics
    /// If the sentinel refuses (e.g. no replica to promote) or that does not happen within 20 s.
    pub fn failover(&self) -> String {
        let old = self.master().addr();
        let sentinel = self.running_sentinels().next().unwrap_or_else(|| panic!("{TOPOLOGY}: no sentinel is running"));
        let command = ["SENTINEL", "FAILOVER", MASTER_NAME];
        if let Err(e) = sentinel.cli_result(&["--raw", "-e"], &command) {
            panic!("{TOPOLOGY}: SENTINEL FAILOVER on {sentinel}: {e}\n{}", sentinel.log_tail());
        }
        wait_for(TOPOLOGY, &format!("failover away from {old}"), || {
            let addr = master_addr_of(sentinel).ok_or_else(|| NotYet::new(sentinel, "no master address"))?;
            if addr == old {
                return Err(NotYet::new(sentinel, format!("still reports {addr}")));
            }
            self.check_master(&addr)?;
            Ok(addr)
        })
    }

    /// Waits until the deployment is steady: every running sentinel reports the same master, not down, and knows
    /// the other running sentinels; the master says it is one; the other data node, when running, says it is its
    /// replica in sync, and every running sentinel lists it as a replica. After a failover, that takes about 10 s:
    /// a sentinel turns the old master into a replica only after it has said it is a master for 8 s, and it asks
    /// every 10 s.
    ///
    /// # Panics
    /// If that does not happen within 20 s.
    pub fn wait_ok(&self) {
        wait_for(TOPOLOGY, "wait until ok", || self.check_ok());
    }

    fn running_sentinels(&self) -> impl Iterator<Item = &RedisNode> {
        self.sentinels.iter().filter(|s| s.is_running())
    }

    /// Whether every running sentinel reports `addr` and the node there is a master.
    fn check_master(&self, addr: &str) -> Result<(), NotYet<'_>> {
        for sentinel in self.running_sentinels() {
            match master_addr_of(sentinel) {
                Some(seen) if seen == addr => {}
                seen => return Err(NotYet::new(sentinel, format!("reports {seen:?}"))),
            }
        }
        let Some(node) = self.data.iter().find(|n| n.addr() == addr) else {
            panic!("{TOPOLOGY}: waiting for {addr}, which is not one of our data nodes");
        };
        match node.role() {
            Some(Role::Master) => Ok(()),
            other => Err(NotYet::new(node, format!("ROLE is {other:?}, not master yet"))),
        }
    }

    /// One look for [`wait_ok`](Self::wait_ok).
    fn check_ok(&self) -> Result<(), NotYet<'_>> {
        let sentinels: Vec<&RedisNode> = self.running_sentinels().collect();
        let Some(first) = sentinels.first() else {
            panic!("{TOPOLOGY}: no sentinel is running");
        };
        let addr = master_addr_of(first).ok_or_else(|| NotYet::new(first, "no master address"))?;
        self.check_master(&addr)?;
        let [a, b] = &self.data;
        let (master, replica) = if a.addr() == addr { (a, b) } else { (b, a) };
        let replica = replica.is_running().then_some(replica);
        if let Some(replica) = replica {
            match replica.role() {
                Some(Role::Replica { master_port, link_up: true }) if master_port == master.port() => {}
                other => return Err(NotYet::new(replica, format!("ROLE is {other:?}, not a replica of {master}"))),
            }
        }
        for &sentinel in &sentinels {
            let seen = sentinel
                .json(&["SENTINEL", "MASTER", MASTER_NAME])
                .ok_or_else(|| NotYet::new(sentinel, "no SENTINEL MASTER"))?;
            if port_of(&seen) != Some(master.port()) || text(&seen, "flags") != "master" {
                return Err(NotYet::new(sentinel, format!("SENTINEL MASTER says {seen}")));
            }
            if let Some(replica) = replica {
                let replicas = sentinel
                    .json(&["SENTINEL", "REPLICAS", MASTER_NAME])
                    .ok_or_else(|| NotYet::new(sentinel, "no SENTINEL REPLICAS"))?;
                // Only its flags: a sentinel reads the rest (`master-link-status`) from the replica's INFO, which
                // it asks for every 10 s.
                let knows_replica = replicas.as_array().is_some_and(|rs| {
                    rs.iter().any(|r| port_of(r) == Some(replica.port()) && text(r, "flags") == "slave")
                });
                if !knows_replica {
                    let why = format!("SENTINEL REPLICAS says {replicas}, not {replica} as a replica");
                    return Err(NotYet::new(sentinel, why));
                }
            }
            let others = sentinel
                .json(&["SENTINEL", "SENTINELS", MASTER_NAME])
                .ok_or_else(|| NotYet::new(sentinel, "no SENTINEL SENTINELS"))?;
            let known: Vec<u16> = others.as_array().into_iter().flatten().filter_map(port_of).collect();
            let missing: Vec<u16> =
                sentinels.iter().map(|s| s.port()).filter(|p| *p != sentinel.port() && !known.contains(p)).collect();
            if !missing.is_empty() {
                return Err(NotYet::new(sentinel, format!("does not know the sentinels on {missing:?} yet")));
            }
        }
        Ok(())
    }
}

/// `host:port` from one sentinel's `SENTINEL GET-MASTER-ADDR-BY-NAME`.
fn master_addr_of(sentinel: &RedisNode) -> Option<String> {
    let out = sentinel.raw_opt(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])?;
    let mut lines = out.lines();
    let (host, port) = (lines.next()?, lines.next()?);
    (!host.is_empty() && !port.is_empty()).then(|| format!("{host}:{port}"))
}

/// A string field of a Sentinel reply (a JSON object), or "" when missing.
fn text<'a>(reply: &'a Value, field: &str) -> &'a str {
    reply.get(field).and_then(Value::as_str).unwrap_or_default()
}

/// The `port` field of a Sentinel reply, which Sentinel sends as a string.
fn port_of(reply: &Value) -> Option<u16> {
    text(reply, "port").parse().ok()
}

crate::redis_options::setup_accessors!(RedisSentinel);
