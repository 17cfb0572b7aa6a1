//! The Redis topologies of the testkit, against the installed Redis: a 6-node cluster and a Sentinel deployment,
//! each started, checked, and failed over by a kill and on request, plain and with TLS and an ACL user. The
//! failover times are printed (`--nocapture`).
#![expect(clippy::expect_used, reason = "test helpers fail loudly")]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use mcpfleet_testkit::{RedisCluster, RedisNode, RedisOptions, RedisSentinel, Role, wait_until};

/// The pids of `nodes`, to check after a drop that they are gone.
fn pids<'a>(nodes: impl IntoIterator<Item = &'a RedisNode>) -> Vec<u32> {
    nodes.into_iter().map(RedisNode::pid).collect()
}

fn assert_gone(pids: &[u32]) {
    for pid in pids {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} outlived its topology");
    }
}

/// A field of a `field:value` reply such as `CLUSTER INFO`.
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
}

#[test]
fn cluster_survives_a_killed_master_and_fails_over_on_request() {
    let started = Instant::now();
    let cluster = RedisCluster::start();
    println!("cluster: 6 nodes up, cluster ok, replicas in sync in {:?}", started.elapsed());

    assert_eq!(cluster.seeds().len(), 6);
    assert!(cluster.seeds().iter().all(|s| s.starts_with("127.0.0.1:")));
    assert!(cluster.urls().iter().all(|u| u.starts_with("redis://127.0.0.1:")));
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    assert_eq!(cluster.replicas().len(), 3);
    for master in &masters {
        assert_eq!(cluster.replicas_of(master).len(), 1, "{master} should have one replica");
    }
    for node in cluster.nodes() {
        let info = node.cli(&["CLUSTER", "INFO"]).expect("CLUSTER INFO");
        assert_eq!(field(&info, "cluster_state"), Some("ok"), "{node}");
        assert_eq!(field(&info, "cluster_slots_assigned"), Some("16384"), "{node}");
        assert_eq!(field(&info, "cluster_slots_ok"), Some("16384"), "{node}");
        assert_eq!(field(&info, "cluster_size"), Some("3"), "{node}");
    }
    // redis-cli splits the slots evenly: the first slot of each third has a master of its own.
    let mut owners: Vec<u16> = [0, 5461, 10923, 16383].map(|slot| cluster.master_for_slot(slot).port()).to_vec();
    assert_eq!(owners[0..3].iter().filter(|p| masters.iter().any(|m| m.port() == **p)).count(), 3);
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), 3, "the 3 masters share the slots");

    let key = "mcpfleet:ha:greeting";
    assert_eq!(cluster.cli(&["SET", key, "hello"]).as_deref(), Some("OK\n"));
    assert_eq!(cluster.cli(&["GET", key]).as_deref(), Some("hello\n"));
    let master = cluster.master_of_key(key);
    assert_eq!(cluster.slot_of(key).to_string(), master.cli(&["CLUSTER", "KEYSLOT", key]).expect("keyslot").trim());
    assert_eq!(master.cli(&["GET", key]).as_deref(), Some("hello\n"), "the key lives on {master}");
    let replica = cluster.replicas_of(master)[0];
    assert_eq!(master.cli(&["WAIT", "1", "5000"]).as_deref(), Some("1\n"), "the write reached {replica}");

    master.kill();
    assert!(!master.is_running());
    let took = wait_until(15, "the replica to take over the killed master's key", || {
        replica.role() == Some(Role::Master) && cluster.cli(&["GET", key]).as_deref() == Some("hello\n")
    });
    println!("cluster: SIGKILL of master {master}: {replica} promoted and the key readable again after {took:?}");
    assert_eq!(cluster.master_of_key(key).port(), replica.port());
    cluster.wait_ok();
    assert_eq!(cluster.masters().len(), 3);
    assert_eq!(cluster.replicas().len(), 2);

    let other =
        cluster.masters().into_iter().find(|m| !cluster.replicas_of(m).is_empty()).expect("a master with a replica");
    let other_replica = cluster.replicas_of(other)[0];
    let started = Instant::now();
    cluster.failover(other_replica);
    println!("cluster: manual failover from {other} to {other_replica} took {:?}", started.elapsed());
    assert_eq!(other_replica.role(), Some(Role::Master));
    assert!(
        matches!(other.role(), Some(Role::Replica { master_port, .. }) if master_port == other_replica.port()),
        "{other} should now replicate {other_replica}"
    );
    for i in 0..20 {
        let (k, v) = (format!("mcpfleet:ha:{i}"), i.to_string());
        assert_eq!(cluster.cli(&["SET", &k, &v]).as_deref(), Some("OK\n"), "SET {k}");
        assert_eq!(cluster.cli(&["GET", &k]).as_deref(), Some(format!("{v}\n").as_str()), "GET {k}");
    }
    assert_eq!(cluster.cli(&["GET", key]).as_deref(), Some("hello\n"));

    let pids = pids(cluster.nodes());
    drop(cluster);
    assert_gone(&pids);
}

#[test]
fn sentinel_promotes_the_replica_of_a_killed_master() {
    let started = Instant::now();
    let sentinel = RedisSentinel::start();
    println!("sentinel: master, replica and 3 sentinels up and known in {:?}", started.elapsed());

    assert_eq!(sentinel.master_name(), "mcpfleet");
    assert_eq!(sentinel.sentinels().len(), 3);
    let master = sentinel.master();
    let replica = sentinel.replica();
    assert_eq!(sentinel.master_addr(), master.addr());
    assert_eq!(master.role(), Some(Role::Master));
    assert_eq!(replica.role(), Some(Role::Replica { master_port: master.port(), link_up: true }));
    for s in sentinel.sentinel_nodes() {
        assert_eq!(s.role(), Some(Role::Sentinel));
    }
    assert_eq!(master.cli(&["SET", "greeting", "hello"]).as_deref(), Some("OK\n"));
    assert_eq!(master.cli(&["WAIT", "1", "5000"]).as_deref(), Some("1\n"));

    master.kill();
    let started = Instant::now();
    sentinel.wait_for_master(&replica.addr());
    println!("sentinel: SIGKILL of master {master}: every sentinel reports {replica} after {:?}", started.elapsed());
    assert_eq!(sentinel.master_addr(), replica.addr());
    assert_eq!(sentinel.master().port(), replica.port());
    assert_eq!(replica.role(), Some(Role::Master));
    assert_eq!(replica.cli(&["GET", "greeting"]).as_deref(), Some("hello\n"));
    assert_eq!(replica.cli(&["SET", "greeting", "again"]).as_deref(), Some("OK\n"));
    sentinel.wait_ok();

    let pids = pids(sentinel.sentinel_nodes().iter().chain([sentinel.master(), sentinel.replica()]));
    drop(sentinel);
    assert_gone(&pids);
}

#[test]
fn sentinel_fails_over_on_request() {
    let sentinel = RedisSentinel::start();
    let (old_master, old_replica) = (sentinel.master().addr(), sentinel.replica().addr());

    let started = Instant::now();
    let new_master = sentinel.failover();
    println!("sentinel: SENTINEL FAILOVER from {old_master} to {new_master} took {:?}", started.elapsed());
    assert_eq!(new_master, old_replica);
    assert_eq!(sentinel.master_addr(), new_master);
    assert_eq!(sentinel.master().role(), Some(Role::Master));
    let started = Instant::now();
    sentinel.wait_ok();
    println!("sentinel: the sentinels turned the old master {old_master} into a replica after {:?}", started.elapsed());
    let demoted = sentinel.replica();
    assert_eq!(demoted.addr(), old_master);
    assert_eq!(demoted.role(), Some(Role::Replica { master_port: sentinel.master().port(), link_up: true }));

    demoted.stop();
    assert!(!demoted.is_running());
    assert_eq!(sentinel.master_addr(), new_master, "stopping a replica changes nothing");
}

/// The ACL user and password of the secured topologies.
const USER: &str = "fleet";
const PASSWORD: &str = "s3cret-Pa55";

/// `redis-cli -h <host> -p <port> <flags> <args>`, built by hand (not through the topology's helpers, which know
/// the way in): whether it exited with 0, and its stdout and stderr.
fn redis_cli(node: &RedisNode, flags: &[&str], args: &[&str]) -> (bool, String) {
    let out = Command::new("redis-cli")
        .args(["-h", node.host(), "-p", &node.port().to_string()])
        .args(flags)
        .args(args)
        .output()
        .expect("run redis-cli");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Checks that a TLS-only data node refuses plaintext, answers a stranger over TLS only with `NOAUTH`, refuses a
/// wrong password, and answers the ACL user over TLS.
fn assert_secured_data_node(node: &RedisNode, ca: &Path) {
    let ca = ca.to_str().expect("a UTF-8 path");
    let tls = ["--tls", "--cacert", ca];
    let (_, plain) = redis_cli(node, &["-e"], &["PING"]);
    assert!(!plain.contains("PONG"), "{node} answers plaintext: {plain}");
    let (_, stranger) = redis_cli(node, &tls, &["PING"]);
    assert!(stranger.contains("NOAUTH"), "{node} answers a stranger over TLS with {stranger:?}");
    let (_, wrong) =
        redis_cli(node, &[&tls[..], &["--user", USER, "--pass", "wrong", "--no-auth-warning"]].concat(), &["PING"]);
    assert!(wrong.contains("WRONGPASS") || wrong.contains("AUTH failed"), "{node} takes a wrong password: {wrong:?}");
    let login = [&tls[..], &["--user", USER, "--pass", PASSWORD, "--no-auth-warning"]].concat();
    let (ok, pong) = redis_cli(node, &login, &["PING"]);
    assert!(ok && pong.trim() == "PONG", "{node} does not answer its ACL user over TLS: {pong:?}");
    let (_, default) = redis_cli(node, &login, &["ACL", "LIST"]);
    assert!(default.lines().any(|l| l.starts_with("user default off")), "{node}: the default user is on: {default}");
}

#[test]
fn cluster_with_tls_and_an_acl_user_refuses_strangers_and_fails_over() {
    let started = Instant::now();
    let cluster = RedisCluster::start_with(&RedisOptions::default().with_tls().with_acl(USER, PASSWORD));
    println!("tls+acl cluster: up in {:?}", started.elapsed());
    let ca = cluster.ca_file().expect("a CA with TLS");
    assert_eq!((cluster.user(), cluster.password()), (Some(USER), Some(PASSWORD)));
    assert_eq!(cluster.host(), "127.0.0.1");
    assert!(cluster.seeds().iter().all(|s| s.starts_with("127.0.0.1:")));
    assert!(cluster.urls().iter().all(|u| u.starts_with(&format!("rediss://{USER}:{PASSWORD}@127.0.0.1:"))));
    for node in cluster.nodes() {
        assert_secured_data_node(node, &ca);
    }

    let key = "mcpfleet:ha:secured";
    assert_eq!(cluster.cli(&["SET", key, "hello"]).as_deref(), Some("OK\n"));
    let master = cluster.master_of_key(key);
    let replica = cluster.replicas_of(master)[0];
    assert_eq!(master.cli(&["WAIT", "1", "5000"]).as_deref(), Some("1\n"), "the write reached {replica} (over TLS)");
    master.kill();
    let took = wait_until(15, "the replica to take over the killed master's key", || {
        replica.role() == Some(Role::Master) && cluster.cli(&["GET", key]).as_deref() == Some("hello\n")
    });
    println!("tls+acl cluster: SIGKILL of master {master}: {replica} took over after {took:?}");
    cluster.wait_ok();
    assert_eq!(cluster.masters().len(), 3);
}

#[test]
fn sentinel_with_tls_and_an_acl_user_refuses_strangers_and_fails_over() {
    let started = Instant::now();
    let sentinel = RedisSentinel::start_with(&RedisOptions::default().with_tls().with_acl(USER, PASSWORD));
    println!("tls+acl sentinel: up in {:?}", started.elapsed());
    let ca = sentinel.ca_file().expect("a CA with TLS");
    assert_eq!((sentinel.user(), sentinel.password()), (Some(USER), Some(PASSWORD)));
    let (master, replica) = (sentinel.master(), sentinel.replica());
    assert_secured_data_node(master, &ca);
    assert_secured_data_node(replica, &ca);
    let ca_text = ca.to_str().expect("a UTF-8 path");
    let ask = ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mcpfleet"];
    for s in sentinel.sentinel_nodes() {
        let (_, plain) = redis_cli(s, &["-e"], &ask);
        assert!(!plain.contains(&master.port().to_string()), "{s} answers plaintext: {plain}");
        // A sentinel asks for no password, over TLS.
        let (ok, addr) = redis_cli(s, &["--tls", "--cacert", ca_text, "-e"], &ask);
        assert!(ok, "{s} does not answer over TLS: {addr}");
        assert_eq!(addr.split_whitespace().collect::<Vec<_>>(), ["127.0.0.1", master.port().to_string().as_str()]);
    }
    assert_eq!(master.cli(&["SET", "greeting", "hello"]).as_deref(), Some("OK\n"));
    assert_eq!(master.cli(&["WAIT", "1", "5000"]).as_deref(), Some("1\n"));

    master.kill();
    let started = Instant::now();
    sentinel.wait_for_master(&replica.addr());
    println!(
        "tls+acl sentinel: SIGKILL of master {master}: every sentinel reports {replica} after {:?}",
        started.elapsed()
    );
    assert_eq!(replica.role(), Some(Role::Master));
    assert_eq!(replica.cli(&["GET", "greeting"]).as_deref(), Some("hello\n"));
    assert_eq!(replica.cli(&["SET", "greeting", "again"]).as_deref(), Some("OK\n"));
}
