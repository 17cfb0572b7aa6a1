use std::process::Command;

use crate::redis_node::{self, NotYet, RedisNode, Role, STEP_TIMEOUT, wait_for};
use crate::redis_options::{RedisOptions, Setup};

const TOPOLOGY: &str = "redis cluster";
const MASTERS: usize = 3;
const SLOTS: u16 = 16384;
/// `cluster-node-timeout`: a master that does not answer for 1 s is failing, and its replica takes over soon after.
const NODE_TIMEOUT_MS: &str = "1000";
/// The node timeout while the cluster forms: a handshake between two nodes must finish within the node timeout, and
/// on a loaded machine (a whole test suite on 2 cores) 1 s is not always enough; the nodes forget a peer whose
/// handshake timed out. It is lowered to [`NODE_TIMEOUT_MS`] once every node knows every other.
const FORMING_NODE_TIMEOUT_MS: &str = "10000";

/// A Redis Cluster of its own: 6 `redis-server` nodes, 3 masters with one replica each, on free ports of one host
/// (and free cluster bus ports, through `cluster-port`), each in a temp dir of its own, made with
/// `redis-cli --cluster create --cluster-replicas 1`. The node timeout is 1 s (10 s while the cluster forms), so a killed master's replica takes
/// over within a few seconds. Every node is killed, and its dir removed, on drop.
///
/// The host is `127.0.0.1`, or the service address of a [`NetLab`](crate::NetLab), which every node announces
/// (`cluster-announce-ip`); with [`RedisOptions::tls`] the nodes serve TLS only and the cluster bus uses TLS too
/// (`tls-cluster`); with [`RedisOptions::acl`] every node asks for the ACL user.
///
/// Roles change with failovers: [`masters`](Self::masters) and [`replicas`](Self::replicas) ask the nodes each time.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisNode>,
    setup: Setup,
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster and waits until it is ready: every node says `cluster_state:ok` and
    /// knows the other five in their roles, every replica is in sync with its master, and there are 3 masters with
    /// one replica each.
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
        let nodes: Vec<RedisNode> = (1..=2 * MASTERS)
            .map(|i| {
                setup.data_node(format!("cluster node {i}"), 2, |cmd, ports| {
                    let bus_port = ports[1].to_string();
                    cmd.args(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]);
                    cmd.args(["--cluster-port", &bus_port, "--cluster-node-timeout", FORMING_NODE_TIMEOUT_MS]);
                    if setup.tls() {
                        cmd.args(["--tls-cluster", "yes"]);
                    }
                    if setup.in_lab() {
                        cmd.args(["--cluster-announce-ip", setup.host()]);
                    }
                })
            })
            .collect();
        let me = Self { nodes, setup };
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]).args(me.seeds()).args(["--cluster-replicas", "1", "--cluster-yes"]);
        create.args(me.setup.data_access().flags());
        if let Err(e) = redis_node::run(create, STEP_TIMEOUT) {
            panic!("{TOPOLOGY}: redis-cli --cluster create failed: {e}");
        }
        wait_for(TOPOLOGY, "start (3 masters with a replica each, all agreeing)", || me.check(true));
        for node in &me.nodes {
            if let Err(e) =
                node.cli_result(&["--raw", "-e"], &["CONFIG", "SET", "cluster-node-timeout", NODE_TIMEOUT_MS])
            {
                panic!("{TOPOLOGY}: lowering the node timeout on {node}: {e}");
            }
        }
        me
    }

    /// `<host>:<port>` of every node, masters and replicas, running or not.
    #[must_use]
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::addr).collect()
    }

    /// `redis://<host>:<port>/` of every node, masters and replicas, running or not (`rediss://` with TLS, with
    /// `user:password@` with an ACL user).
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::url).collect()
    }

    /// Every node, running or not, in the order they were started.
    #[must_use]
    pub fn nodes(&self) -> &[RedisNode] {
        &self.nodes
    }

    /// The running nodes that say they are masters (`ROLE`).
    #[must_use]
    pub fn masters(&self) -> Vec<&RedisNode> {
        self.running().filter(|n| n.role() == Some(Role::Master)).collect()
    }

    /// The running nodes that say they are replicas (`ROLE`).
    #[must_use]
    pub fn replicas(&self) -> Vec<&RedisNode> {
        self.running().filter(|n| matches!(n.role(), Some(Role::Replica { .. }))).collect()
    }

    /// The running nodes that say they replicate `master`.
    #[must_use]
    pub fn replicas_of(&self, master: &RedisNode) -> Vec<&RedisNode> {
        self.running()
            .filter(|n| matches!(n.role(), Some(Role::Replica { master_port, .. }) if master_port == master.port()))
            .collect()
    }

    /// The master that serves `slot`, as the first running node that answers sees it (`CLUSTER SHARDS`). Right
    /// after a master dies, that is the dead master until its replica has taken over.
    ///
    /// # Panics
    /// If no node answers, `slot` is not below 16384, or no master serves it.
    #[must_use]
    pub fn master_for_slot(&self, slot: u16) -> &RedisNode {
        assert!(slot < SLOTS, "slot {slot} is not below {SLOTS}");
        let shards = self
            .running()
            .find_map(|n| n.json(&["CLUSTER", "SHARDS"]))
            .unwrap_or_else(|| panic!("{TOPOLOGY}: no node answers CLUSTER SHARDS"));
        let port = shard_master_port(&shards, slot)
            .unwrap_or_else(|| panic!("{TOPOLOGY}: no master serves slot {slot}; CLUSTER SHARDS: {shards}"));
        self.node(port).unwrap_or_else(|| panic!("{TOPOLOGY}: slot {slot} is served by port {port}, not ours"))
    }

    /// The master that serves `key` (`CLUSTER KEYSLOT`, then [`master_for_slot`](Self::master_for_slot)).
    ///
    /// # Panics
    /// If no node answers, or no master serves the key's slot.
    #[must_use]
    pub fn master_of_key(&self, key: &str) -> &RedisNode {
        self.master_for_slot(self.slot_of(key))
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    ///
    /// # Panics
    /// If no node answers.
    #[must_use]
    pub fn slot_of(&self, key: &str) -> u16 {
        self.running()
            .find_map(|n| n.raw_opt(&["CLUSTER", "KEYSLOT", key])?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{TOPOLOGY}: no node answers CLUSTER KEYSLOT"))
    }

    /// Runs one command through `redis-cli -c` (which follows `MOVED` and `ASK`) on the first running node and
    /// returns its raw output; `None` when no node answers within 5 s or the reply is an error (e.g. `CLUSTERDOWN`
    /// while a failover is under way).
    #[must_use]
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let node = self.running().next()?;
        node.cli_result(&["-c", "--raw", "-e"], args).ok()
    }

    /// A manual failover (`CLUSTER FAILOVER`) to `replica`: waits until it is a master and the cluster is ok again
    /// (see [`wait_ok`](Self::wait_ok)). Its master, when running, becomes its replica.
    ///
    /// # Panics
    /// If `replica` is not a running replica of this cluster, refuses, or is not a master within 20 s.
    pub fn failover(&self, replica: &RedisNode) {
        assert!(self.node(replica.port()).is_some(), "{replica} is not a node of this cluster");
        if let Err(e) = replica.cli_result(&["--raw", "-e"], &["CLUSTER", "FAILOVER"]) {
            panic!("{TOPOLOGY}: CLUSTER FAILOVER on {replica}: {e}\n{}", replica.log_tail());
        }
        wait_for(TOPOLOGY, &format!("manual failover to {replica}"), || match replica.role() {
            Some(Role::Master) => self.check(false),
            other => Err(NotYet::new(replica, format!("ROLE is {other:?}, not master yet"))),
        });
    }

    /// Waits until the running nodes form a healthy cluster: each says `cluster_state:ok` with all 16384 slots ok,
    /// sees every running node in the role it claims and none failing, and gives no slot to a node that is down;
    /// each running replica is in sync with a running master.
    ///
    /// # Panics
    /// If that does not happen within 20 s.
    pub fn wait_ok(&self) {
        wait_for(TOPOLOGY, "wait until ok", || self.check(false));
    }

    fn running(&self) -> impl Iterator<Item = &RedisNode> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    fn node(&self, port: u16) -> Option<&RedisNode> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// One look at the cluster for [`wait_ok`](Self::wait_ok); `initial` also asks for 3 masters with a replica each.
    fn check(&self, initial: bool) -> Result<(), NotYet<'_>> {
        let running: Vec<&RedisNode> = self.running().collect();
        let Some(first) = running.first() else {
            panic!("{TOPOLOGY}: no node is running");
        };
        let mut roles = Vec::with_capacity(running.len());
        for &node in &running {
            let role = node.role().ok_or_else(|| NotYet::new(node, "does not answer ROLE"))?;
            if let Role::Replica { master_port, link_up } = role {
                if !running.iter().any(|n| n.port() == master_port) {
                    return Err(NotYet::new(node, format!("replicates port {master_port}, which is down")));
                }
                if !link_up {
                    return Err(NotYet::new(node, format!("not in sync with its master on port {master_port} yet")));
                }
            }
            roles.push((node, role));
        }
        for &node in &running {
            let info = node.info(&["CLUSTER", "INFO"]).ok_or_else(|| NotYet::new(node, "no CLUSTER INFO"))?;
            let field = |name: &str| info.iter().find(|(k, _)| k == name).map_or("?", |(_, v)| v.as_str());
            if field("cluster_state") != "ok" || field("cluster_slots_ok") != "16384" {
                return Err(NotYet::new(
                    node,
                    format!(
                        "cluster_state:{} cluster_slots_ok:{} cluster_slots_pfail:{} cluster_slots_fail:{}",
                        field("cluster_state"),
                        field("cluster_slots_ok"),
                        field("cluster_slots_pfail"),
                        field("cluster_slots_fail")
                    ),
                ));
            }
            let view = node.raw_opt(&["CLUSTER", "NODES"]).ok_or_else(|| NotYet::new(node, "no CLUSTER NODES"))?;
            let view: Vec<ViewedNode> = view.lines().filter_map(ViewedNode::parse).collect();
            for (other, role) in &roles {
                let Some(seen) = view.iter().find(|v| v.port == other.port()) else {
                    return Err(NotYet::new(node, format!("does not know {other}")));
                };
                if let Some(flag) = seen.flags.iter().find(|f| ["fail?", "fail", "handshake", "noaddr"].contains(f)) {
                    return Err(NotYet::new(node, format!("sees {other} as {flag}")));
                }
                let master = seen.flags.contains(&"master");
                if master != (*role == Role::Master) {
                    return Err(NotYet::new(
                        node,
                        format!("sees {other}, whose ROLE is {role:?}, as {}", seen.flags_text),
                    ));
                }
            }
            if let Some(dead) = view.iter().find(|v| v.serves_slots && !running.iter().any(|n| n.port() == v.port)) {
                return Err(NotYet::new(node, format!("still gives slots to port {}, which is down", dead.port)));
            }
        }
        if initial {
            let masters: Vec<&&RedisNode> = roles.iter().filter(|(_, r)| *r == Role::Master).map(|(n, _)| n).collect();
            if masters.len() != MASTERS || running.len() != 2 * MASTERS {
                return Err(NotYet::new(first, format!("{} masters among {} nodes", masters.len(), running.len())));
            }
            for master in masters {
                let replicas = roles
                    .iter()
                    .filter(|(_, r)| matches!(r, Role::Replica { master_port, .. } if *master_port == master.port()))
                    .count();
                if replicas != 1 {
                    return Err(NotYet::new(master, format!("has {replicas} replicas, not 1")));
                }
            }
        }
        Ok(())
    }
}

/// One line of `CLUSTER NODES`: `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link>
/// <slot>...`.
struct ViewedNode<'a> {
    port: u16,
    flags_text: &'a str,
    flags: Vec<&'a str>,
    serves_slots: bool,
}

impl<'a> ViewedNode<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let addr = fields.get(1)?.split(['@', ',']).next()?;
        let port = addr.rsplit_once(':')?.1.parse().ok()?;
        let flags_text = *fields.get(2)?;
        // Slots are `a-b` or `a`; `[a->-id]` and `[a-<-id]` are migrations.
        let serves_slots = fields.iter().skip(8).any(|s| !s.starts_with('['));
        Some(Self { port, flags_text, flags: flags_text.split(',').collect(), serves_slots })
    }
}

/// The port of the master of the shard that holds `slot`, in `CLUSTER SHARDS` as JSON:
/// `[{"slots": [start, end, ...], "nodes": [{"port": p, "role": "master", ...}, ...]}, ...]` (`"tls-port"` for a
/// node that serves TLS only).
fn shard_master_port(shards: &serde_json::Value, slot: u16) -> Option<u16> {
    let slot = u64::from(slot);
    shards.as_array()?.iter().find_map(|shard| {
        let ranges: Vec<u64> = shard.get("slots")?.as_array()?.iter().filter_map(serde_json::Value::as_u64).collect();
        if !ranges.chunks(2).any(|r| r.len() == 2 && r[0] <= slot && slot <= r[1]) {
            return None;
        }
        let master = shard
            .get("nodes")?
            .as_array()?
            .iter()
            .find(|n| n.get("role").and_then(|r| r.as_str()) == Some("master"))?;
        let port = master.get("port").or_else(|| master.get("tls-port"))?;
        u16::try_from(port.as_u64()?).ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes_lines() {
        let line = "d632eb 127.0.0.1:41001@41101 myself,master - 0 1796157781000 1 connected 0-5460";
        let seen = ViewedNode::parse(line).expect("a node line");
        assert_eq!((seen.port, seen.flags, seen.serves_slots), (41001, vec!["myself", "master"], true));
        let line = "a11b3f 127.0.0.1:41006@41106,host slave d632eb 0 1796157783660 3 connected";
        let seen = ViewedNode::parse(line).expect("a node line");
        assert_eq!((seen.port, seen.flags, seen.serves_slots), (41006, vec!["slave"], false));
        let line = "0a9600 127.0.0.1:41003@41103 master,fail - 0 1 3 disconnected [5->-d632eb]";
        assert!(!ViewedNode::parse(line).expect("a node line").serves_slots);
    }

    #[test]
    fn finds_the_master_of_a_slot_in_cluster_shards() {
        let shards = serde_json::json!([
            {"slots": [0, 5460], "nodes": [{"port": 41004, "role": "replica"}, {"port": 41001, "role": "master"}]},
            {"slots": [5461, 5470, 6000, 10922], "nodes": [{"port": 41002, "role": "master"}]},
            {"slots": [10923, 16383], "nodes": [{"tls-port": 41003, "role": "master"}]},
        ]);
        assert_eq!(shard_master_port(&shards, 0), Some(41001));
        assert_eq!(shard_master_port(&shards, 5460), Some(41001));
        assert_eq!(shard_master_port(&shards, 5470), Some(41002));
        assert_eq!(shard_master_port(&shards, 5800), None);
        assert_eq!(shard_master_port(&shards, 10922), Some(41002));
        assert_eq!(shard_master_port(&shards, 16383), Some(41003));
    }
}

crate::redis_options::setup_accessors!(RedisCluster);
