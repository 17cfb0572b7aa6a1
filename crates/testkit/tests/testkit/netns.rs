//! The network lab: Redis topologies inside it, replicas cut off Redis and healed for real, and a drop that leaves
//! nothing behind. Each test skips (with a line on stderr) where namespaces cannot be made, unless `CI=true`.
#![expect(clippy::expect_used, reason = "test helpers fail loudly")]

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mcpfleet_testkit::{NetLab, RedisCluster, RedisOptions, RedisSentinel, RedisServer, Role, wait_until};

const USER: &str = "fleet";
/// How long a `redis-cli PING` may take before it counts as unanswered.
const PING_TIMEOUT: Duration = Duration::from_secs(1);
const PASSWORD: &str = "s3cret-Pa55";

/// Runs `cmd` for at most `limit`: its stdout when it exits with 0 in time, else `None` (it is killed).
fn output_within(mut cmd: Command, limit: Duration) -> Option<String> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut out = String::new();
            child.stdout.take().expect("stdout").read_to_string(&mut out).expect("read stdout");
            return status.success().then_some(out);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redis-cli` run inside `ns` against `host:port`, with `flags` and `args`.
fn cli_in(lab: &NetLab, ns: &str, addr: (&str, u16), flags: &[&str], args: &[&str]) -> Command {
    let mut cmd = lab.exec(ns, "redis-cli");
    cmd.args(["-h", addr.0, "-p", &addr.1.to_string()]).args(flags).args(args);
    cmd
}

/// The TLS and ACL flags of `redis-cli` for a topology with CA `ca`.
fn login(ca: &std::path::Path) -> Vec<String> {
    let ca = ca.to_string_lossy().into_owned();
    ["--tls", "--cacert", &ca, "--user", USER, "--pass", PASSWORD, "--no-auth-warning"].map(str::to_owned).to_vec()
}

/// A process this test started, killed when dropped.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_cut_replica_loses_redis_but_keeps_its_front_until_healed() {
    let started = Instant::now();
    let Some(lab) = NetLab::require(2) else { return };
    println!("lab {} with 2 replica namespaces made in {:?}", lab.prefix(), started.elapsed());
    let redis = RedisServer::start_with(&RedisOptions::default().in_lab(&lab));
    let service = lab.redis_ip().to_string();
    assert_eq!(redis.host(), service);
    assert_eq!(redis.url(), format!("redis://{service}:{}/", redis.port()));
    let (r0, r1) = (lab.replica_ns(0), lab.replica_ns(1));
    let ping = |ns: &str| {
        let cmd = cli_in(&lab, ns, (&service, redis.port()), &[], &["PING"]);
        output_within(cmd, PING_TIMEOUT).is_some_and(|o| o.trim() == "PONG")
    };
    assert!(ping(&r0) && ping(&r1), "both replica namespaces reach Redis");
    assert_eq!(redis.cli(&["SET", "k", "v"]).as_deref(), Some("OK\n"), "the root namespace reaches Redis");

    // Something listening on replica 0's front address, inside its namespace: the proxy's view of a replica.
    let front = lab.replica_ip(0).to_string();
    let front_port = "7379";
    let listener = Owned(
        lab.exec(&r0, "redis-server")
            .args(["--bind", &front, "--port", front_port, "--protected-mode", "no", "--save", ""])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a listener in the replica namespace"),
    );
    let front_answers = || {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", &front, "-p", front_port, "PING"]);
        output_within(cmd, Duration::from_secs(2)).is_some_and(|o| o.trim() == "PONG")
    };
    wait_until(5, "the listener on replica 0's front address", front_answers);

    lab.cut(0);
    let cut_at = Instant::now();
    assert!(!ping(&r0), "a cut replica reaches Redis");
    assert!(cut_at.elapsed() >= PING_TIMEOUT, "a cut drops packets (a hang, not a refusal)");
    assert!(ping(&r1), "the other replica still reaches Redis");
    assert!(front_answers(), "the root namespace still reaches the cut replica's front");
    assert_eq!(redis.cli(&["GET", "k"]).as_deref(), Some("\"v\"\n"), "the root namespace still reaches Redis");

    lab.heal(0);
    let took = wait_until(5, "replica 0 to reach Redis again", || ping(&r0));
    println!("replica 0 reaches Redis {took:?} after the heal");

    lab.cut_all();
    assert!(!ping(&r0) && !ping(&r1), "cut_all cuts every replica off");
    assert!(front_answers());
    lab.heal_all();
    wait_until(5, "every replica to reach Redis again", || ping(&r0) && ping(&r1));
    drop(listener);
    println!("the whole test took {:?}", started.elapsed());
}

#[test]
fn a_tls_cluster_inside_a_lab_fails_over_for_its_replicas() {
    let started = Instant::now();
    let Some(lab) = NetLab::require(1) else { return };
    let cluster = RedisCluster::start_with(&RedisOptions::default().with_tls().with_acl(USER, PASSWORD).in_lab(&lab));
    println!("tls+acl cluster inside lab {} up in {:?}", lab.prefix(), started.elapsed());
    let service = lab.redis_ip().to_string();
    assert!(cluster.seeds().iter().all(|s| s.starts_with(&format!("{service}:"))), "{:?}", cluster.seeds());
    for node in cluster.nodes() {
        let view = node.cli(&["CLUSTER", "NODES"]).expect("CLUSTER NODES");
        assert!(view.lines().all(|l| l.contains(&format!(" {service}:"))), "{node} announces another address:\n{view}");
    }
    let ca = cluster.ca_file().expect("a CA");
    let flags: Vec<String> = ["-c".to_owned(), "-e".to_owned()].into_iter().chain(login(&ca)).collect();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let seed = cluster.nodes()[0].port();
    let ns = lab.replica_ns(0);
    let from_replica =
        |args: &[&str]| output_within(cli_in(&lab, &ns, (&service, seed), &flags, args), Duration::from_secs(3));

    let key = "mcpfleet:lab:greeting";
    assert_eq!(from_replica(&["SET", key, "hello"]).as_deref(), Some("OK\n"), "the replica namespace writes");
    let master = cluster.master_of_key(key);
    let replica = cluster.replicas_of(master)[0];
    assert_eq!(master.cli(&["WAIT", "1", "5000"]).as_deref(), Some("1\n"));
    // The seed may be the master about to die: ask another node.
    let seed = cluster.nodes().iter().find(|n| n.port() != master.port()).expect("another node").port();
    let from_replica =
        |args: &[&str]| output_within(cli_in(&lab, &ns, (&service, seed), &flags, args), Duration::from_secs(3));
    master.kill();
    let took = wait_until(15, "the key back, served by the promoted replica", || {
        replica.role() == Some(Role::Master) && from_replica(&["GET", key]).as_deref() == Some("hello\n")
    });
    println!("tls+acl cluster in a lab: SIGKILL of {master}: {replica} serves the key after {took:?}");
    cluster.wait_ok();

    lab.cut(0);
    assert_eq!(from_replica(&["GET", key]), None, "a cut replica reads nothing");
    assert_eq!(cluster.cli(&["GET", key]).as_deref(), Some("hello\n"), "the root namespace still reads");
    lab.heal(0);
    wait_until(5, "the replica namespace to read again", || from_replica(&["GET", key]).as_deref() == Some("hello\n"));
    println!("the whole test took {:?}", started.elapsed());
}

#[test]
fn a_tls_sentinel_inside_a_lab_points_replicas_to_the_new_master() {
    let started = Instant::now();
    let Some(lab) = NetLab::require(1) else { return };
    let sentinel = RedisSentinel::start_with(&RedisOptions::default().with_tls().with_acl(USER, PASSWORD).in_lab(&lab));
    println!("tls+acl sentinel inside lab {} up in {:?}", lab.prefix(), started.elapsed());
    let service = lab.redis_ip().to_string();
    assert!(sentinel.sentinels().iter().all(|s| s.starts_with(&format!("{service}:"))));
    let ca = sentinel.ca_file().expect("a CA").to_string_lossy().into_owned();
    let ns = lab.replica_ns(0);
    let sentinel_port = sentinel.sentinel_nodes()[0].port();
    let ask = |args: &[&str]| {
        let cmd = cli_in(&lab, &ns, (&service, sentinel_port), &["--tls", "--cacert", &ca, "-e"], args);
        output_within(cmd, Duration::from_secs(3))
    };
    let master_addr = || {
        ask(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mcpfleet"])
            .map(|o| o.split_whitespace().collect::<Vec<_>>().join(":"))
    };
    let (master, replica) = (sentinel.master(), sentinel.replica());
    assert_eq!(master_addr(), Some(master.addr()), "the replica namespace asks a sentinel for the master");
    assert_eq!(master.addr(), format!("{service}:{}", master.port()));

    master.kill();
    sentinel.wait_for_master(&replica.addr());
    assert_eq!(master_addr(), Some(replica.addr()));
    let login = login(sentinel.ca_file().as_deref().expect("a CA"));
    let login: Vec<&str> = login.iter().map(String::as_str).collect();
    let set = cli_in(&lab, &ns, (&service, replica.port()), &login, &["SET", "greeting", "hello"]);
    assert_eq!(output_within(set, Duration::from_secs(3)).as_deref(), Some("OK\n"));
    println!("the whole test took {:?}", started.elapsed());
}

/// Whether `ip <args>` prints `needle`.
fn ip_shows(args: &[&str], needle: &str) -> bool {
    let out = Command::new("ip").args(args).output().expect("run ip");
    String::from_utf8_lossy(&out.stdout).contains(needle)
}

#[test]
fn dropping_a_lab_removes_its_namespaces_and_links_even_before_what_runs_inside() {
    let Some(lab) = NetLab::require(2) else { return };
    let (prefix, service, front) = (lab.prefix().to_owned(), lab.redis_ip(), lab.root_ip(1));
    let names = [lab.redis_ns(), lab.replica_ns(0), lab.replica_ns(1)];
    for name in &names {
        assert!(ip_shows(&["netns", "list"], name), "{name} is missing");
    }
    assert!(ip_shows(&["-4", "route"], &service.to_string()));
    assert!(ip_shows(&["-4", "-o", "addr"], &format!("{front}/24")));
    drop(lab);
    assert!(!ip_shows(&["netns", "list"], &prefix), "namespaces of {prefix} outlived the lab");
    assert!(!ip_shows(&["-4", "route"], &service.to_string()), "the route to {service} outlived the lab");
    assert!(!ip_shows(&["-4", "-o", "addr"], &format!("{front}/24")), "the front link outlived the lab");

    // A lab dropped while a topology still runs inside: its links and names go at once, the process later.
    let lab = NetLab::create(1).expect("a second lab");
    let prefix = lab.prefix().to_owned();
    let redis = RedisServer::start_with(&RedisOptions::default().in_lab(&lab));
    let service = lab.redis_ip().to_string();
    drop(lab);
    assert!(!ip_shows(&["netns", "list"], &prefix));
    assert!(!ip_shows(&["-4", "route"], &service));
    assert!(redis.node().is_running(), "the lab kills nothing");
    assert_eq!(redis.cli(&["PING"]), None, "nothing reaches a server inside a dropped lab");
    let pid = redis.node().pid();
    drop(redis);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}
