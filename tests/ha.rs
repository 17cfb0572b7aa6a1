//! Redis that fails over, under load: fleets of replica processes on a 6-node Redis Cluster and behind Sentinel,
//! driven by clients (calls on sessions, and progress streams that are resumed on another replica) while a master
//! is killed, a failover is asked for, a slot moves, or, in network namespaces of the test's own, a link is cut.
//!
//! Every fault test holds the same rules (see docs/REDIS.md, "What a failover may lose"): a client sees a 200, a
//! 503 with `Retry-After`, or a 404 for a session a failover lost (it starts a new one); never a 500, never a
//! request that outlives the Redis deadline by more than the slack; no stream ever replays another stream's
//! events, no principal ever sees another's data; every replica serves again without a restart, within the bound
//! the fault allows; no replica panics. Each prints one line with what its clients saw, for the closing notes.

#![expect(clippy::expect_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{
    Fleet, FleetBuilder, Issuer, NetLab, RedisCluster, RedisOptions, RedisSentinel, RedisTopology as _, SseStream,
    TestKey,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Every replica's `--redis-timeout`.
const REDIS_TIMEOUT: Duration = Duration::from_millis(1000);
/// A request that takes longer than the Redis deadline and this is a hang.
const SLACK: Duration = Duration::from_secs(2);
/// Principals of a load: enough that every master of the cluster holds some.
const PRINCIPALS: usize = 6;
/// What a replica is told about Redis, besides the topology flags (a test's own flags replace these).
const COMMON_FLAGS: [(&str, &str); 4] =
    [("--redis-timeout", "1s"), ("--lease-ttl", "3s"), ("--task-lease", "3s"), ("--rate-fail-mode", "closed")];

/// The principals' tokens: an issuer's key, which the replicas read from a file (replicas in namespaces have no
/// route to the issuer, which listens on loopback).
struct Tokens {
    key: TestKey,
    issuer: Issuer,
    _dir: tempfile::TempDir,
    jwks: PathBuf,
}

impl Tokens {
    async fn new() -> Self {
        let key = TestKey::load("ed-1", "ed", jsonwebtoken::Algorithm::EdDSA);
        let issuer = Issuer::start(&[&key]).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let jwks = dir.path().join("jwks.json");
        Self { key, issuer, _dir: dir, jwks }
    }

    fn token(&self, sub: &str) -> String {
        self.key.token(&self.issuer.id(), sub).sign()
    }
}

/// `n` replicas with `redis` flags, logging to a file each test reads for panics.
async fn fleet(n: usize, redis: Vec<String>, tokens: &Tokens, log: &std::path::Path, lab: Option<&NetLab>) -> Fleet {
    fleet_with(n, redis, &[], tokens, log, lab).await
}

/// [`fleet`], with `extra` serve flags.
async fn fleet_with(
    n: usize,
    redis: Vec<String>,
    extra: &[&str],
    tokens: &Tokens,
    log: &std::path::Path,
    lab: Option<&NetLab>,
) -> Fleet {
    let mut b: FleetBuilder =
        Fleet::builder().replicas(n).redis_flags(redis).log_to(log, "warn").jwt_file(&tokens.issuer, &tokens.jwks);
    let common = COMMON_FLAGS.iter().filter(|(flag, _)| !extra.contains(flag)).flat_map(|(f, v)| [*f, *v]);
    for f in common.chain(extra.iter().copied()) {
        b = b.arg(f);
    }
    if let Some(lab) = lab {
        b = b.in_lab(lab);
    }
    b.start().await
}

// ---------------------------------------------------------------------------------------------------------------
// The load: what the clients see

/// What every client saw, counted.
#[derive(Debug, Default)]
struct Seen {
    ok: u64,
    /// 503 with `Retry-After`.
    unavailable: u64,
    /// A 503 without `Retry-After`: a violation.
    unavailable_bare: u64,
    /// 404 on a session: the failover lost its record, the client starts a new one.
    sessions_lost: u64,
    /// Requests that outlived the deadline plus the slack: a violation.
    hangs: u64,
    /// Anything else (a 500, a broken connection, an unexpected body): a violation, with what it was.
    other: Vec<String>,
    /// Data of another principal or another stream: a violation.
    leaks: Vec<String>,
    /// Streams read whole and resumed on another replica.
    resumes: u64,
    /// Events a client had received, that the resume (200) no longer had.
    lost_events: u64,
    /// Resumes answered with an explicit error (404 for a lost session, or the stream's error event).
    resume_errors: u64,
    /// Resumes answered 410: the cursor was lost.
    gone: u64,
    /// Per replica: when it last failed a request, and when it last served one.
    last_bad: BTreeMap<usize, Instant>,
    last_ok: BTreeMap<usize, Instant>,
}

impl Seen {
    fn bad(&mut self, replica: usize) {
        self.last_bad.insert(replica, Instant::now());
    }

    fn good(&mut self, replica: usize) {
        self.ok += 1;
        self.last_ok.insert(replica, Instant::now());
    }
}

type Shared = Arc<Mutex<Seen>>;

fn seen(s: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One principal's client on one replica: its own HTTP client, token and session.
struct Client {
    http: reqwest::Client,
    url: String,
    replica: usize,
    token: String,
    name: String,
    session: Option<String>,
    seen: Shared,
}

/// How one response ended, for the tally.
enum Reply {
    Ok(reqwest::Response),
    /// Counted already (503, 404, hang, other).
    Counted,
}

impl Client {
    async fn post(&mut self, body: &Value, accept_sse: bool) -> Reply {
        let mut rb = self
            .http
            .post(&self.url)
            .header("authorization", format!("Bearer {}", self.token))
            .header("mcp-protocol-version", "2025-11-25")
            .header("content-type", "application/json")
            .header(
                "accept",
                if accept_sse { "text/event-stream, application/json" } else { "application/json, text/event-stream" },
            )
            .body(body.to_string());
        if let Some(s) = &self.session {
            rb = rb.header("mcp-session-id", s);
        }
        self.send(rb, self.replica).await
    }

    /// Sends a request to replica `target`, counting how it ended.
    async fn send(&mut self, rb: reqwest::RequestBuilder, target: usize) -> Reply {
        let started = Instant::now();
        let r = tokio::time::timeout(REDIS_TIMEOUT + SLACK, rb.send()).await;
        let mut s = seen(&self.seen);
        match r {
            Err(_) => {
                s.hangs += 1;
                s.bad(target);
                Reply::Counted
            }
            Ok(Err(e)) => {
                s.other.push(format!("replica {}: {e}", target));
                s.bad(target);
                Reply::Counted
            }
            Ok(Ok(resp)) => match resp.status().as_u16() {
                200 | 202 => Reply::Ok(resp),
                503 => {
                    if resp.headers().contains_key("retry-after") {
                        s.unavailable += 1;
                    } else {
                        s.unavailable_bare += 1;
                    }
                    if started.elapsed() > REDIS_TIMEOUT + SLACK {
                        s.hangs += 1;
                    }
                    s.bad(target);
                    Reply::Counted
                }
                // A resume whose cursor a failover lost: the explicit error, as the rules allow.
                410 => {
                    s.gone += 1;
                    Reply::Counted
                }
                404 if self.session.is_some() => {
                    s.sessions_lost += 1;
                    s.bad(target);
                    drop(s);
                    self.session = None;
                    Reply::Counted
                }
                status => {
                    s.other.push(format!("replica {}: HTTP {status}", target));
                    s.bad(target);
                    Reply::Counted
                }
            },
        }
    }

    /// Opens a session; false when it could not (counted).
    async fn ensure_session(&mut self) -> bool {
        if self.session.is_some() {
            return true;
        }
        let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "ha", "version": "1" } } });
        let Reply::Ok(resp) = self.post(&init, false).await else { return false };
        let Some(sid) = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned) else {
            seen(&self.seen).other.push("initialize without a session id".into());
            return false;
        };
        self.session = Some(sid);
        let done = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        match self.post(&done, false).await {
            Reply::Ok(_) => {
                seen(&self.seen).good(self.replica);
                true
            }
            Reply::Counted => false,
        }
    }

    /// One `greet` call: the answer must name this client's principal.
    async fn call(&mut self, id: i64) {
        if !self.ensure_session().await {
            return;
        }
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": "greet", "arguments": { "name": self.name } } });
        let Reply::Ok(resp) = self.post(&body, false).await else { return };
        let text = tokio::time::timeout(SLACK, resp.text()).await;
        let mut s = seen(&self.seen);
        match text.ok().and_then(Result::ok).and_then(|t| serde_json::from_str::<Value>(&t).ok()) {
            Some(v) if v["result"]["content"][0]["text"] == format!("Hello, {}!", self.name) => s.good(self.replica),
            Some(v) if v.to_string().contains("Hello, ") => {
                s.leaks.push(format!("{} got {v}", self.name));
            }
            Some(v) if v["error"].is_object() => {
                // A JSON-RPC error for a store failure mid-call is a clear error, but count it with what it was.
                s.other.push(format!("replica {}: {}", self.replica, v["error"]));
                s.bad(self.replica);
            }
            other => {
                s.other.push(format!("replica {}: unreadable answer {other:?}", self.replica));
                s.bad(self.replica);
            }
        }
    }

    /// A countdown streamed on this replica, then resumed from its first event on `resume_url`: the resume must
    /// replay this stream's later events (or fail explicitly), and nothing of anyone else's.
    async fn stream_and_resume(&mut self, id: i64, resume: (usize, &str)) {
        let (resumer, resume_url) = resume;
        if !self.ensure_session().await {
            return;
        }
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": "test_countdown", "arguments": { "count": 4, "interval_ms": 30 },
                        "_meta": { "progressToken": id } } });
        let Reply::Ok(resp) = self.post(&body, true).await else { return };
        let mut stream = SseStream::new(resp);
        let mut got: Vec<(String, Value)> = Vec::new();
        // A stream that breaks (its replica lost Redis mid-call) is resumed below, like a finished one.
        while let Ok(Some(e)) = stream.next(REDIS_TIMEOUT + SLACK).await {
            if let (Some(eid), Some(v)) = (e.id.clone(), e.json()) {
                let last = v["id"] == id;
                got.push((eid, v));
                if last {
                    break;
                }
            }
        }
        for (_, v) in &got {
            if !ours(v, id) {
                seen(&self.seen).leaks.push(format!("stream {id} carried {v}"));
            }
        }
        let Some((first, _)) = got.first().cloned() else { return };
        let expected: Vec<String> = got.iter().skip(1).map(|(e, _)| e.clone()).collect();
        let mut rb = self
            .http
            .get(resume_url)
            .header("authorization", format!("Bearer {}", self.token))
            .header("mcp-protocol-version", "2025-11-25")
            .header("accept", "text/event-stream")
            .header("last-event-id", &first);
        if let Some(s) = &self.session {
            rb = rb.header("mcp-session-id", s);
        }
        let Reply::Ok(resp) = self.send(rb, resumer).await else {
            seen(&self.seen).resume_errors += 1;
            return;
        };
        let mut replay = SseStream::new(resp);
        let mut replayed = Vec::new();
        let mut explicit_error = false;
        while let Ok(Some(e)) = replay.next(REDIS_TIMEOUT + SLACK).await {
            let Some(v) = e.json() else { continue };
            if !ours(&v, id) {
                seen(&self.seen).leaks.push(format!("resume of stream {id} carried {v}"));
            }
            if v["id"] == id && v["error"].is_object() {
                explicit_error = true;
            }
            if let Some(eid) = e.id {
                replayed.push(eid);
            }
            if v["id"] == id {
                break;
            }
        }
        let mut s = seen(&self.seen);
        s.resumes += 1;
        if explicit_error {
            s.resume_errors += 1;
        } else {
            let lost = expected.iter().filter(|e| !replayed.contains(e)).count();
            s.lost_events += u64::try_from(lost).unwrap_or(0);
        }
        s.good(resumer);
    }
}

/// Whether a message of a stream belongs to request `id` (its progress, or its response).
fn ours(v: &Value, id: i64) -> bool {
    v["id"] == id || v["params"]["progressToken"] == id
}

/// Clients of `PRINCIPALS` principals on every replica, calling and streaming until stopped.
struct Load {
    seen: Shared,
    stop: CancellationToken,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(urls: &[String], tokens: &Tokens) -> Self {
        let seen: Shared = Arc::default();
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        for p in 0..PRINCIPALS {
            let name = format!("principal-{p}");
            let token = tokens.token(&name);
            for (r, url) in urls.iter().enumerate() {
                let mut c = Client {
                    http: reqwest::Client::builder().no_proxy().build().expect("http client"),
                    url: url.clone(),
                    replica: r,
                    token: token.clone(),
                    name: name.clone(),
                    session: None,
                    seen: seen.clone(),
                };
                let stop = stop.clone();
                // Half the clients stream and resume on the next replica; the others call.
                let streams = (p + r) % 2 == 0;
                let resumer = (r + 1) % urls.len();
                let resume_url = urls[resumer].clone();
                workers.push(tokio::spawn(async move {
                    let mut id = 1;
                    while !stop.is_cancelled() {
                        id += 1;
                        if streams {
                            c.stream_and_resume(id, (resumer, &resume_url)).await;
                        } else {
                            c.call(id).await;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }));
            }
        }
        Self { seen, stop, workers }
    }

    /// Runs until every replica has served since `t`, and at least `min` has passed.
    async fn until_all_serve_after(&self, replicas: usize, t: Instant, min: Duration, max: Duration) {
        let deadline = t + max;
        loop {
            let now = Instant::now();
            let all = {
                let s = seen(&self.seen);
                (0..replicas)
                    .all(|r| s.last_ok.get(&r).is_some_and(|ok| *ok > t && s.last_bad.get(&r).is_none_or(|b| ok > b)))
            };
            if all && now >= t + min {
                return;
            }
            assert!(
                now < deadline,
                "not every replica serves again {} s after the fault: {:?}",
                max.as_secs(),
                seen(&self.seen)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) -> Seen {
        self.stop.cancel();
        for w in self.workers {
            let _ = w.await;
        }
        Arc::try_unwrap(self.seen)
            .map(|m| m.into_inner().unwrap_or_else(PoisonError::into_inner))
            .expect("workers done")
    }
}

/// The report of one fault, and the rules every fault holds. `outage` is measured from `fault` to each replica's
/// last failed request.
fn report(label: &str, s: &Seen, fault: Instant, replicas: usize, log: &std::path::Path) -> Duration {
    let outage = (0..replicas)
        .map(|r| s.last_bad.get(&r).map_or(Duration::ZERO, |b| b.saturating_duration_since(fault)))
        .max()
        .unwrap_or_default();
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let panics = log.matches("panicked").count();
    eprintln!(
        "HA {label}: ok {}, 503+Retry-After {}, sessions lost {}, resumes {} (explicit errors {}, 410 {}), events lost {}, \
         longest outage {} ms, hangs {}, 503 without Retry-After {}, other {}, leaks {}, panics {}",
        s.ok,
        s.unavailable,
        s.sessions_lost,
        s.resumes,
        s.resume_errors,
        s.gone,
        s.lost_events,
        outage.as_millis(),
        s.hangs,
        s.unavailable_bare,
        s.other.len(),
        s.leaks.len(),
        panics
    );
    assert_eq!(s.hangs, 0, "{label}: requests outlived the Redis deadline: {s:?}");
    assert_eq!(s.unavailable_bare, 0, "{label}: 503 without Retry-After");
    assert!(s.other.is_empty(), "{label}: unexpected answers: {:?}", s.other);
    assert!(s.leaks.is_empty(), "{label}: cross-principal or cross-stream data: {:?}", s.leaks);
    assert_eq!(panics, 0, "{label}: a replica panicked:\n{log}");
    assert!(s.ok > 0 && s.resumes > 0, "{label}: the load did not run: {s:?}");
    outage
}

/// Warms the load up: every replica serves, nothing fails, before the fault.
async fn warm(load: &Load, replicas: usize) {
    let t = Instant::now();
    load.until_all_serve_after(replicas, t, Duration::from_millis(1500), Duration::from_secs(20)).await;
    let s = seen(&load.seen);
    assert!(s.last_bad.is_empty() && s.other.is_empty(), "failures before the fault: {s:?}");
}

fn log_file(label: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(format!("{label}.log"));
    (dir, path)
}

// ---------------------------------------------------------------------------------------------------------------
// Cluster faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_killed_under_load() {
    let cluster = RedisCluster::start();
    let tokens = Tokens::new().await;
    let (_d, log) = log_file("kill");
    let fleet = fleet(3, cluster.serve_flags(), &tokens, &log, None).await;
    let load = Load::start(&fleet.urls(), &tokens);
    warm(&load, 3).await;
    // The master with the most of the principals' keys.
    let victim = busiest_master(&cluster);
    let fault = Instant::now();
    victim.kill();
    cluster.wait_ok();
    let promoted = fault.elapsed();
    load.until_all_serve_after(3, fault, promoted + Duration::from_secs(2), Duration::from_secs(30)).await;
    let s = load.stop().await;
    let outage = report("cluster master SIGKILL", &s, fault, 3, &log);
    eprintln!("HA cluster master SIGKILL: replica promoted after {} ms", promoted.as_millis());
    assert!(outage < promoted + Duration::from_secs(5), "replicas served again {outage:?} after the kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_manual_failover_under_load() {
    let cluster = RedisCluster::start();
    let tokens = Tokens::new().await;
    let (_d, log) = log_file("failover");
    let fleet = fleet(3, cluster.serve_flags(), &tokens, &log, None).await;
    let load = Load::start(&fleet.urls(), &tokens);
    warm(&load, 3).await;
    let master = busiest_master(&cluster);
    let replica = cluster.replicas_of(master)[0];
    let fault = Instant::now();
    cluster.failover(replica);
    let done = fault.elapsed();
    load.until_all_serve_after(3, fault, done + Duration::from_secs(2), Duration::from_secs(30)).await;
    let s = load.stop().await;
    let outage = report("cluster manual CLUSTER FAILOVER", &s, fault, 3, &log);
    // A manual failover waits for the replica to catch up: nothing acknowledged is lost.
    assert_eq!((s.sessions_lost, s.lost_events), (0, 0), "{s:?}");
    assert!(outage < done + Duration::from_secs(3), "replicas served again {outage:?} after the failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_slot_migrated_while_in_use() {
    let cluster = RedisCluster::start();
    let tokens = Tokens::new().await;
    let (_d, log) = log_file("migrate");
    let fleet = fleet(3, cluster.serve_flags(), &tokens, &log, None).await;
    let load = Load::start(&fleet.urls(), &tokens);
    warm(&load, 3).await;
    // The slot of a principal's keys, moved key by key to another master while its clients call and stream.
    let key = principal_key(&cluster);
    let slot = cluster.slot_of(&key);
    let from = cluster.master_for_slot(slot);
    let to = cluster.masters().into_iter().find(|m| m.port() != from.port()).expect("another master");
    let fault = Instant::now();
    migrate_slot(&cluster, slot, from, to);
    let done = fault.elapsed();
    load.until_all_serve_after(3, fault, done + Duration::from_secs(2), Duration::from_secs(30)).await;
    let s = load.stop().await;
    report("cluster slot migration", &s, fault, 3, &log);
    assert_eq!(cluster.master_for_slot(slot).port(), to.port(), "the slot moved");
    // A migration moves keys, it loses none; MOVED, ASK and TRYAGAIN never reach a client.
    assert_eq!((s.sessions_lost, s.lost_events), (0, 0), "{s:?}");
}

/// The master that holds the most keys of the load (every principal's keys share one slot).
fn busiest_master(cluster: &RedisCluster) -> &mcpfleet_fleetkit::RedisNode {
    cluster
        .masters()
        .into_iter()
        .max_by_key(|m| m.cli(&["DBSIZE"]).and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0))
        .expect("a master")
}

/// A key of one of the load's principals (their sessions, `…{u:<uid>}:s:<sid>`: the session index `ss` exists
/// only while the session cap is on).
fn principal_key(cluster: &RedisCluster) -> String {
    for m in cluster.masters() {
        if let Some(out) = m.cli(&["SCAN", "0", "MATCH", "mcp:{u:*}:s:*", "COUNT", "1000"])
            && let Some(k) = out.lines().skip(1).find(|l| l.contains("{u:"))
        {
            return k.to_owned();
        }
    }
    panic!("no principal's key in the cluster");
}

/// Moves `slot` from `from` to `to` the way `redis-cli --cluster reshard` does: `IMPORTING`/`MIGRATING`, then the
/// keys in batches of `MIGRATE … KEYS` (10 at a time, as redis-cli's pipeline), then `SETSLOT NODE` on every master.
/// While the slot is half moved, the load runs into `ASK` and `TRYAGAIN`.
fn migrate_slot(
    cluster: &RedisCluster,
    slot: u16,
    from: &mcpfleet_fleetkit::RedisNode,
    to: &mcpfleet_fleetkit::RedisNode,
) {
    let id = |n: &mcpfleet_fleetkit::RedisNode| n.cli(&["CLUSTER", "MYID"]).expect("node id").trim().to_owned();
    let (from_id, to_id, s) = (id(from), id(to), slot.to_string());
    to.cli(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]).expect("importing");
    from.cli(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]).expect("migrating");
    let port = to.port().to_string();
    loop {
        let keys = from.cli(&["CLUSTER", "GETKEYSINSLOT", &s, "10"]).expect("keys in slot");
        let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
        if keys.is_empty() {
            break;
        }
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys);
        from.cli(&args).expect("migrate keys");
    }
    for m in cluster.masters() {
        m.cli(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]).expect("assign the slot");
    }
    cluster.wait_ok();
}

// ---------------------------------------------------------------------------------------------------------------
// Sentinel

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_under_load() {
    let sentinel = RedisSentinel::start();
    let tokens = Tokens::new().await;
    let (_d, log) = log_file("sentinel");
    let fleet = fleet(3, sentinel.serve_flags(), &tokens, &log, None).await;
    let load = Load::start(&fleet.urls(), &tokens);
    warm(&load, 3).await;
    let before = scrape_sum(&fleet, "mcp_redis_master_changes_total").await;
    let fault = Instant::now();
    let new_master = sentinel.failover();
    let done = fault.elapsed();
    load.until_all_serve_after(3, fault, done + Duration::from_secs(2), Duration::from_secs(30)).await;
    let s = load.stop().await;
    let outage = report("sentinel failover", &s, fault, 3, &log);
    eprintln!("HA sentinel failover: sentinels named {new_master} after {} ms", done.as_millis());
    assert_eq!(scrape_sum(&fleet, "mcp_redis_master_changes_total").await - before, 3.0, "every replica followed");
    // Commands were held from the promotion to the switch: nothing reached the old master after it, so nothing
    // acknowledged was lost.
    assert_eq!((s.sessions_lost, s.lost_events, s.gone), (0, 0, 0), "{s:?}");
    assert!(outage < done + Duration::from_secs(5), "replicas served again {outage:?} after the failover");
}

/// The status of replica `i`'s `/readyz`.
async fn ready(fleet: &Fleet, i: usize) -> u16 {
    let url = format!("{}/readyz", fleet.replicas[i].admin());
    let r = tokio::time::timeout(REDIS_TIMEOUT + SLACK, reqwest::get(&url)).await.expect("readyz answers in time");
    r.expect("GET /readyz").status().as_u16()
}

async fn scrape_sum(fleet: &Fleet, name: &str) -> f64 {
    let mut sum = 0.0;
    for r in &fleet.replicas {
        sum += mcpfleet_fleetkit::scrape(&r.admin()).await.get(name).copied().unwrap_or(0.0);
    }
    sum
}

// ---------------------------------------------------------------------------------------------------------------
// Partitions: real cut links between network namespaces

/// The cut lasts longer than a lease (`--lease-ttl 3s`): the cut replica's streams are lost and reported so.
const LONG_CUT: Duration = Duration::from_millis(4500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_cut_from_a_cluster_longer_than_its_lease() {
    let Some(lab) = NetLab::require(3) else { return };
    let cluster = RedisCluster::start_with(&RedisOptions::default().in_lab(&lab));
    let tokens = Tokens::new().await;
    let (_d, log) = log_file("cut-one");
    let fleet = fleet(3, cluster.serve_flags(), &tokens, &log, Some(&lab)).await;
    let load = Load::start(&fleet.urls(), &tokens);
    warm(&load, 3).await;
    let fault = Instant::now();
    lab.cut(0);
    // Readiness says it: the cut replica cannot reach its masters (its probe ticks every second, with a 1 s
    // deadline: it sees the cut within about 2 s), the others can.
    let deadline = fault + LONG_CUT - Duration::from_millis(500);
    while ready(&fleet, 0).await != 503 {
        assert!(Instant::now() < deadline, "the cut replica is still ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ready(&fleet, 1).await, 200, "the others are");
    tokio::time::sleep_until((fault + LONG_CUT).into()).await;
    let healed = Instant::now();
    lab.heal(0);
    load.until_all_serve_after(3, healed, Duration::from_secs(2), Duration::from_secs(30)).await;
    assert_eq!(ready(&fleet, 0).await, 200, "ready again once healed");
    let s = load.stop().await;
    let outage = report("replica cut from the cluster longer than its lease", &s, fault, 3, &log);
    let back = s.last_bad.get(&0).map_or(Duration::ZERO, |b| b.saturating_duration_since(healed));
    eprintln!(
        "HA replica cut from the cluster: cut for {} ms, served again {} ms after the heal",
        healed.duration_since(fault).as_millis(),
        back.as_millis()
    );
    assert!(s.unavailable > 0, "the cut replica answered 503 while cut: {s:?}");
    assert!(back < Duration::from_secs(5), "the cut replica served again {back:?} after the heal ({outage:?} in all)");
    // The others never lost Redis: their own requests all succeeded (resumes of the cut replica's streams may
    // end with the explicit "call lost" error, which is not a failed request).
    assert!(s.last_bad.keys().all(|r| *r == 0), "only the cut replica failed requests: {s:?}");
    drop(fleet);
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_setup_cut_from_every_replica_for_5_s() {
    let Some(lab) = NetLab::require(3) else { return };
    let sentinel = RedisSentinel::start_with(&RedisOptions::default().in_lab(&lab));
    let tokens = Tokens::new().await;
    let (_d, log) = log_file("cut-all");
    let fleet = fleet(3, sentinel.serve_flags(), &tokens, &log, Some(&lab)).await;
    let load = Load::start(&fleet.urls(), &tokens);
    warm(&load, 3).await;
    let fault = Instant::now();
    lab.cut_all();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let healed = Instant::now();
    lab.heal_all();
    load.until_all_serve_after(3, healed, Duration::from_secs(2), Duration::from_secs(30)).await;
    let back = {
        let s = seen(&load.seen);
        (0..3).map(|r| s.last_bad.get(&r).map_or(Duration::ZERO, |b| b.saturating_duration_since(healed))).max()
    }
    .unwrap_or_default();
    eprintln!("HA Redis cut from every replica: all served again {} ms after the heal", back.as_millis());
    assert!(back < Duration::from_secs(5), "every replica served again {back:?} after the heal");
    // The replicas still hear the sentinels after the cut (their listeners found the half-open connections and
    // made new ones): a failover now is held and followed as usual, and loses nothing.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let switched = Instant::now();
    sentinel.failover();
    load.until_all_serve_after(3, switched, Duration::from_secs(2), Duration::from_secs(30)).await;
    let s = load.stop().await;
    report("Redis (Sentinel) cut from every replica for 5 s, then a failover", &s, fault, 3, &log);
    assert_eq!((s.sessions_lost, s.lost_events, s.gone), (0, 0, 0), "{s:?}");
    assert!(s.unavailable > 0 && (0..3).all(|r| s.last_bad.contains_key(&r)), "every replica was cut: {s:?}");
    drop(fleet);
    drop(sentinel);
}

// ---------------------------------------------------------------------------------------------------------------
// TLS and an ACL user, on a cluster and behind Sentinel

/// The ACL rules docs/REDIS.md gives the fleet's user, exactly: the tests below run the fleet as such a user.
const APP_RULES: &str =
    "~mcp:* &mcp:* +@read +@write +@scripting +@pubsub +@connection +time +wait +cluster|slots +info";

/// TLS, an admin user for the topology itself, and the fleet's own user with only [`APP_RULES`].
fn secured() -> RedisOptions {
    RedisOptions::default()
        .with_tls()
        .with_acl("admin", "s3cret-admin")
        .with_user(format!("fleet on >s3cret-fleet {APP_RULES}"))
}

/// `flags` with the fleet's user instead of the topology's admin.
fn as_fleet(flags: Vec<String>) -> Vec<String> {
    flags
        .into_iter()
        .map(|f| match f.as_str() {
            "admin" => "fleet".to_owned(),
            "s3cret-admin" => "s3cret-fleet".to_owned(),
            _ => f,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_cluster_over_tls_as_an_acl_user() {
    let cluster = RedisCluster::start_with(&secured());
    shares_state_and_refuses_wrong_access(as_fleet(cluster.serve_flags()), "cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_sentinel_setup_over_tls_as_an_acl_user() {
    let sentinel = RedisSentinel::start_with(&secured());
    shares_state_and_refuses_wrong_access(as_fleet(sentinel.serve_flags()), "sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_standalone_redis_over_tls_as_an_acl_user() {
    // The URL names no user: --redis-username and --redis-password give the fleet's.
    let redis = mcpfleet_fleetkit::RedisServer::start_with(&secured());
    let ca = redis.ca_file().expect("a CA").to_string_lossy().into_owned();
    let url = format!("rediss://{}/", redis.addr());
    let flags = ["--redis-url", &url, "--redis-tls", "--redis-ca-file", &ca]
        .into_iter()
        .chain(["--redis-username", "fleet", "--redis-password", "s3cret-fleet"])
        .map(str::to_owned)
        .collect();
    shares_state_and_refuses_wrong_access(flags, "standalone").await;
}

/// Two replicas on `flags` (TLS, the fleet's ACL user): a session opened on A is served on B, a notification
/// published on A reaches a GET stream on B, and a 2026-07-28 task created on A is run and polled on B. A replica with a wrong password, or without TLS, does not start (exit 69), and
/// says so without the password.
async fn shares_state_and_refuses_wrong_access(flags: Vec<String>, label: &str) {
    const T: Duration = Duration::from_secs(5);
    assert!(flags.iter().any(|f| f == "--redis-tls") && flags.iter().any(|f| f == "--redis-password"), "{flags:?}");
    let tokens = Tokens::new().await;
    let (_d, log) = log_file(label);
    let fleet = fleet(2, flags.clone(), &tokens, &log, None).await;
    let [a, b] = [0, 1].map(|i| fleet.urls()[i].clone());
    let mut client = mcpfleet_fleetkit::McpClient::new().with_token(&tokens.token("alice"));
    client.initialize(&a).await;
    let mut stream = SseStream::new(client.get(&b, None).await);
    assert_eq!(stream.next(T).await.expect("priming").expect("an event").data, "", "{label}: the priming event");
    let r =
        client.request(&a, 2, "tools/call", json!({ "name": "test_update_watched_resource", "arguments": {} })).await;
    assert_eq!(r["result"]["content"][0]["text"], "test://watched-resource updated", "{label}");
    let note = stream.next(T).await.expect("the notice").expect("an event").json().expect("json");
    assert_eq!(note["method"], "notifications/resources/updated", "{label}: published on A, heard on B");
    // A task: created on A (its record, queue entry and WAIT), run by whichever replica takes it, polled on B.
    let tasks = mcpfleet_fleetkit::StatelessClient::new()
        .with_token(&tokens.token("alice"))
        .with_capabilities(json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } }));
    let r = tasks.call(&a, 1, "slow_job", json!({ "seconds": 0 }), json!({})).await;
    let id = r["result"]["taskId"].as_str().unwrap_or_else(|| panic!("{label}: no task: {r}")).to_owned();
    tasks.poll_task(std::slice::from_ref(&b), &id, 10, |t| t["status"] == "completed").await;

    let wrong_password: Vec<String> = flags
        .iter()
        .scan(false, |after, f| {
            let out = if *after { "wrong-password".to_owned() } else { f.clone() };
            *after = f == "--redis-password";
            Some(out)
        })
        .collect();
    let without_tls: Vec<String> =
        flags.iter().filter(|f| *f != "--redis-tls").map(|f| f.replace("rediss://", "redis://")).collect();
    let without_tls: Vec<String> = without_tls
        .iter()
        .enumerate()
        .filter(|(i, f)| *f != "--redis-ca-file" && (*i == 0 || without_tls[i - 1] != "--redis-ca-file"))
        .map(|(_, f)| f.clone())
        .collect();
    for (what, flags) in [("a wrong password", wrong_password), ("no TLS", without_tls)] {
        let out = std::process::Command::new(mcpfleet_fleetkit::server_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--redis-timeout", "1s"])
            .args(["--request-state-key", mcpfleet_fleetkit::TEST_STATE_KEY])
            .args(&flags)
            .output()
            .expect("run the server");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{label} with {what}: {stderr}");
        assert!(stderr.contains("cannot reach Redis") && !stderr.contains("s3cret"), "{label} with {what}: {stderr}");
    }
    // The eviction policy was read on every node (INFO, allowed by `+info`): Redis's default, noeviction.
    let policy = r#"mcp_redis_maxmemory_policy{policy="noeviction"}"#;
    let admin = fleet.replicas[0].admin();
    mcpfleet_fleetkit::eventually(10, "the eviction policy is read", || {
        let admin = admin.clone();
        async move { mcpfleet_fleetkit::scrape(&admin).await.get(policy) == Some(&1.0) }
    })
    .await;
    // Everything the fleet did, it did with the rights the docs give it: nothing was refused.
    for line in std::fs::read_to_string(&log).unwrap_or_default().lines() {
        assert!(!line.contains("NOPERM") && !line.contains("no permissions"), "{label}: {line}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// A principal's doorbells and bucket across a slot move and a master's death

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doorbells_ring_and_buckets_limit_across_a_slot_move_and_a_failover() {
    const T: Duration = Duration::from_secs(8);
    let cluster = RedisCluster::start();
    let tokens = Tokens::new().await;
    let (_d, log) = log_file("doorbells");
    // A bucket of 8 that refills one token every 50 s: within this test it only drains. A lease of a minute: B's
    // stream re-reads the log only every half lease, so within this test it hears only through its doorbell.
    let limits = ["--rate-burst", "8", "--rate-per-second", "0.02", "--lease-ttl", "60s", "--session-idle-ttl", "5m"];
    let fleet = fleet_with(2, cluster.serve_flags(), &limits, &tokens, &log, None).await;
    let [a, b] = [0, 1].map(|i| fleet.urls()[i].clone());
    let mut alice = mcpfleet_fleetkit::McpClient::new().with_token(&tokens.token("alice"));
    alice.initialize(&a).await;
    let mut stream = SseStream::new(alice.get(&b, None).await);
    stream.next(T).await.expect("priming").expect("an event");
    let update = json!({ "name": "test_update_watched_resource", "arguments": {} });
    // Rings alice's doorbell from A until it answers (a 503 while the slot has no master), and returns once B's
    // stream heard it.
    let ring_and_hear = async |stream: &mut SseStream, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r =
                alice.post(&a, &json!({ "jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": update })).await;
            if r.status() == 200 {
                break;
            }
            assert_eq!(r.status(), 503, "{what}: only a 503 while the slot moves or fails over");
            assert!(Instant::now() < deadline, "{what}: A never served again");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        loop {
            let e = stream.next(T).await.unwrap_or_else(|e| panic!("{what}: B's stream heard nothing: {e}"));
            let e = e.unwrap_or_else(|| panic!("{what}: B's stream ended"));
            if e.json().is_some_and(|m| m["method"] == "notifications/resources/updated") {
                return;
            }
        }
    };
    ring_and_hear(&mut stream, "before").await;

    // The slot of alice's keys moves to another master: B's subscription there is dropped by the old owner and
    // made again on the new one.
    let key = principal_key(&cluster);
    let slot = cluster.slot_of(&key);
    let from = cluster.master_for_slot(slot);
    let to = cluster.masters().into_iter().find(|m| m.port() != from.port()).expect("another master");
    migrate_slot(&cluster, slot, from, to);
    ring_and_hear(&mut stream, "after the slot moved").await;

    // Its new master dies; its replica takes over: B subscribes there, and the bucket is still a bucket.
    cluster.master_for_slot(slot).kill();
    cluster.wait_ok();
    ring_and_hear(&mut stream, "after the failover").await;
    // The requests so far took tokens; whatever the failover lost of them, the bucket admits at most a full bucket
    // again, and once it refuses it keeps refusing: over-admission is bounded, the limit is never broken.
    let mut answers = Vec::new();
    for id in 100..116 {
        let r = alice.post(&a, &json!({ "jsonrpc": "2.0", "id": id, "method": "ping" })).await;
        answers.push(r.status().as_u16());
    }
    let answered = answers.iter().filter(|s| **s == 200).count();
    let first_refusal = answers.iter().position(|s| *s == 429).expect("the bucket refuses again");
    assert!(answered <= 8, "at most a bucket: {answers:?}");
    assert!(answers[first_refusal..].iter().all(|s| *s == 429), "refusing, it keeps refusing: {answers:?}");
    drop(fleet);
}
