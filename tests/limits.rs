//! End-to-end limits: real replicas (processes) with `--auth jwt` against a local issuer, one real Redis shared by
//! the fleet. Each test shows one claim of the limits issue with real requests: the burst holds for the fleet,
//! not per replica; sustained traffic gets capacity + rate × t; `Retry-After` is exact; one principal's flood
//! never reaches another; quotas, caps and their slots; every key expires; an admission is one round trip;
//! Redis down or paused gives 503s that recover. The figures each test prints are the ones in the closing note.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use futures::future::join_all;
use mcpfleet_fleetkit::{Fleet, JwtFleet, McpClient, RedisServer, SseStream, data_messages, eventually, scrape};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

async fn setup(n: usize, extra: &[&str]) -> JwtFleet {
    JwtFleet::start(n, extra).await
}

/// What a client saw.
#[derive(Debug)]
struct Seen {
    status: u16,
    retry_after: Option<u64>,
    policy: Option<String>,
    ratelimit: Option<String>,
    body: Value,
}

async fn seen(resp: reqwest::Response) -> Seen {
    let h = resp.headers().clone();
    let header = |n: &str| h.get(n).map(|v| v.to_str().unwrap().to_owned());
    Seen {
        status: resp.status().as_u16(),
        retry_after: header("retry-after").map(|v| v.parse().unwrap()),
        policy: header("ratelimit-policy"),
        ratelimit: header("ratelimit"),
        body: resp.json().await.unwrap_or(Value::Null),
    }
}

fn rpc(id: u64, method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })
}

fn call(id: u64, tool: &str, args: Value) -> Value {
    rpc(id, "tools/call", json!({ "name": tool, "arguments": args }))
}

fn init(id: u64) -> Value {
    rpc(
        id,
        "initialize",
        json!({ "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": { "name": "limits-tests", "version": "1" } }),
    )
}

async fn ping(c: &McpClient, url: &str, id: u64) -> Seen {
    seen(c.post(url, &rpc(id, "ping", json!({}))).await).await
}

/// A 429's JSON-RPC error names the limit.
fn assert_limited(s: &Seen, limit: &str) {
    assert_eq!(s.status, 429, "{s:?}");
    assert_eq!(s.body["error"]["code"], -32006, "{s:?}");
    assert_eq!(s.body["error"]["data"]["limit"], limit, "{s:?}");
    assert!(s.body["id"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_spread_over_three_replicas_passes_exactly_the_capacity_once() {
    const C: usize = 20;
    let s = setup(3, &["--rate-burst", "20", "--rate-per-second", "0.001", "--max-sessions-per-user", "0"]).await;
    let urls = s.fleet.urls();
    let token = s.token("alice");
    // 200 concurrent initialize requests of one principal, round-robin over the replicas.
    let results = join_all((0..200_usize).map(|i| {
        let (url, c) = (urls[i % 3].clone(), McpClient::new().with_token(&token));
        async move { (i % 3, seen(c.post(&url, &init(i as u64)).await).await) }
    }))
    .await;
    let mut table = BTreeMap::new();
    for (replica, r) in &results {
        *table.entry((*replica, r.status)).or_insert(0) += 1;
        assert_eq!(r.policy.as_deref(), Some("\"user\";q=20;w=20000"), "{r:?}");
        if r.status == 429 {
            assert_limited(r, "rate");
            assert!(r.retry_after.unwrap() >= 1);
            assert!(r.ratelimit.as_deref().unwrap().starts_with("\"user\";r=0;t="), "{r:?}");
        } else {
            assert_eq!(r.status, 200, "{r:?}");
        }
    }
    println!("burst of 200 (capacity {C}) by replica and status: {table:?}");
    let passed = results.iter().filter(|(_, r)| r.status == 200).count();
    assert_eq!(passed, C, "exactly the capacity passes, for the whole fleet");
    for replica in 0..3 {
        assert!(table.get(&(replica, 429)).copied().unwrap_or(0) > 0, "replica {replica} refused too");
    }
    let allowed = s.metric(r#"mcp_limit_decisions_total{kind="rate",outcome="allowed"}"#).await;
    let denied = s.metric(r#"mcp_limit_decisions_total{kind="rate",outcome="denied"}"#).await
        + s.metric(r#"mcp_limit_decisions_total{kind="rate",outcome="denied_cached"}"#).await;
    println!("decisions: allowed {allowed}, denied {denied}");
    assert_eq!((allowed, denied), (20.0, 180.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twice_the_refill_rate_gets_capacity_plus_rate_times_t() {
    let s = setup(3, &["--rate-burst", "5", "--rate-per-second", "4"]).await;
    let urls = s.fleet.urls();
    let mut c = s.client("alice");
    c.initialize(&urls[0]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await; // full again
    let mut tick = tokio::time::interval(Duration::from_millis(125)); // 8 a second: twice the refill rate
    let started = Instant::now();
    let (mut accepted, mut refused) = (0_u32, 0_u32);
    let mut last = started;
    for i in 0..32_u64 {
        tick.tick().await;
        last = Instant::now();
        match ping(&c, &urls[i as usize % 3], i).await.status {
            200 => accepted += 1,
            429 => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    let t = (last - started).as_secs_f64();
    let expected = 5.0 + 4.0 * t;
    println!("sustained 8/s for {t:.2} s: accepted {accepted}, refused {refused}, expected {expected:.1}");
    assert!((f64::from(accepted) - expected).abs() <= 2.0, "accepted {accepted}, expected about {expected:.1}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_exact_a_second_early_fails_on_time_passes() {
    let s = setup(2, &["--rate-burst", "2", "--rate-per-second", "0.25"]).await;
    let [a, b] = [0, 1].map(|i| s.fleet.urls()[i].clone());
    let mut c = s.client("alice");
    c.initialize(&a).await; // both tokens
    let refused = ping(&c, &a, 1).await;
    assert_limited(&refused, "rate");
    let ra = refused.retry_after.unwrap();
    assert!((3..=4).contains(&ra), "one token at 0.25/s: {refused:?}");
    assert_eq!(refused.policy.as_deref(), Some("\"user\";q=2;w=8"));
    assert_eq!(refused.ratelimit.as_deref(), Some(format!("\"user\";r=0;t={ra}").as_str()));
    let refused_at = Instant::now();
    assert!(refused.body["error"]["message"].as_str().unwrap().contains(&format!("retry after {ra} s")));
    // One second early, on the other replica: still refused.
    tokio::time::sleep_until((refused_at + Duration::from_secs(ra - 1)).into()).await;
    let early = ping(&c, &b, 2).await;
    assert_limited(&early, "rate");
    assert_eq!(early.retry_after, Some(1), "{early:?}");
    // On time: passes, and says the bucket is empty again.
    tokio::time::sleep_until((refused_at + Duration::from_secs(ra)).into()).await;
    let on_time = ping(&c, &b, 3).await;
    assert_eq!(on_time.status, 200, "{on_time:?}");
    assert!(on_time.ratelimit.as_deref().unwrap().starts_with("\"user\";r=0;t="), "{on_time:?}");
    println!("Retry-After {ra}: at {}-1 s → 429, at {ra} s → 200", ra);
    // Every /mcp response carries the headers, a 404 too.
    let mut stranger = s.client("alice");
    stranger.session = Some("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_owned());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let r = ping(&stranger, &a, 4).await;
    assert_eq!(r.status, 404);
    assert!(r.policy.is_some() && r.ratelimit.is_some(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_principal_gets_429s_while_another_sees_none() {
    let s = setup(3, &["--rate-burst", "10", "--rate-per-second", "2"]).await;
    let urls = s.fleet.urls();
    let (mut alice, mut bob) = (s.client("alice"), s.client("bob"));
    alice.initialize(&urls[0]).await;
    bob.initialize(&urls[1]).await;
    let deadline = Instant::now() + Duration::from_secs(4);
    let flood = join_all((0..8_usize).map(|w| {
        let (c, urls) = (alice.clone(), urls.clone());
        async move {
            let (mut ok, mut limited, mut i) = (0, 0, 0_usize);
            while Instant::now() < deadline {
                match ping(&c, &urls[(w + i) % 3], i as u64).await.status {
                    200 => ok += 1,
                    429 => limited += 1,
                    other => panic!("unexpected {other}"),
                }
                i += 1;
            }
            (ok, limited)
        }
    }));
    let polite = async {
        let mut statuses = Vec::new();
        for i in 0..8_u64 {
            statuses.push(ping(&bob, &urls[i as usize % 3], i).await.status);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        statuses
    };
    let (flood, bob_statuses) = tokio::join!(flood, polite);
    let (ok, limited) = flood.iter().fold((0, 0), |(a, b), (o, l)| (a + o, b + l));
    println!("alice flooding: {ok} passed, {limited} refused; bob: {bob_statuses:?}");
    assert!(bob_statuses.iter().all(|s| *s == 200), "bob never sees a 429: {bob_statuses:?}");
    assert!(limited > 0, "alice is limited");
    assert!(ok <= 10 + 2 * 4 + 2, "alice gets her burst and her rate, no more: {ok}");
    // The flood stays on the replicas: most refusals come from their over-limit caches, without a Redis call.
    let remote = s.metric(r#"mcp_limit_decisions_total{kind="rate",outcome="denied"}"#).await;
    let local = s.metric(r#"mcp_limit_decisions_total{kind="rate",outcome="denied_cached"}"#).await;
    println!("refusals decided by Redis: {remote}, by the replicas' caches: {local}");
    assert_eq!(remote + local, f64::from(limited));
    assert!(local > 4.0 * remote, "a flood does not reach Redis: {remote} remote, {local} local");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_are_per_tool_and_principal_and_only_calls_that_run_use_them() {
    // test_costly declares 3 per hour; a small bucket shows that a bucket refusal does not use the quota.
    let s = setup(2, &["--rate-burst", "4", "--rate-per-second", "1", "--tool-scope", "test_costly=reports:run"]).await;
    let [a, b] = [0, 1].map(|i| s.fleet.urls()[i].clone());
    let scoped = s.key.token(&s.issuer.id(), "alice").claim("scope", json!("mcp:access reports:run")).sign();
    let mut alice = McpClient::new().with_token(&scoped);
    alice.initialize(&a).await; // 2 of 4 tokens
    let topic = json!({ "topic": "q3" });
    let costly = |c: &McpClient, url: &str, id: u64, args: &Value| {
        let (c, url, args) = (c.clone(), url.to_owned(), args.clone());
        async move { seen(c.post(&url, &call(id, "test_costly", args)).await).await }
    };
    // Without the scope (same principal, another token): 403, no quota used.
    let unscoped = McpClient { token: Some(s.token("alice")), ..alice.clone() };
    assert_eq!(costly(&unscoped, &b, 1, &topic).await.status, 403);
    let first = costly(&alice, &a, 2, &topic).await; // 1 of 3; the bucket is empty now
    assert_eq!(first.body["result"]["content"][0]["text"], "report on q3", "{first:?}");
    assert_limited(&costly(&alice, &b, 3, &topic).await, "rate");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Invalid arguments: refused by the validator before the tool runs or the quota is counted.
    let invalid = costly(&alice, &a, 4, &json!({})).await;
    assert_eq!(invalid.body["result"]["isError"], true, "{invalid:?}");
    let text = invalid.body["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains(r#"/arguments: the required property "topic""#), "{text}");
    for id in [5, 6] {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let r = costly(&alice, &b, id, &topic).await;
        assert!(r.body["result"]["isError"].is_null(), "call {id} is within the quota: {r:?}");
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let exhausted = costly(&alice, &a, 7, &topic).await;
    assert_eq!(exhausted.status, 200, "a quota refusal is a tool result, for the model: {exhausted:?}");
    assert_eq!(exhausted.body["result"]["isError"], true);
    let text = exhausted.body["result"]["content"][0]["text"].as_str().unwrap();
    println!("quota refusal: {text}");
    for needle in ["test_costly", "3 per 1h", "again in 3", "ask whether to wait", "Do not retry"] {
        assert!(text.contains(needle), "{needle:?} in {text}");
    }
    // Bob's quota is his own.
    let mut bob = McpClient::new()
        .with_token(&s.key.token(&s.issuer.id(), "bob").claim("scope", json!("mcp:access reports:run")).sign());
    bob.initialize(&b).await;
    assert!(costly(&bob, &a, 1, &topic).await.body["result"]["isError"].is_null());

    // A window ends: an operator quota of 2 per 2 s on test_simple_text, with a roomy bucket.
    let s = setup(1, &["--quota", "test_simple_text=2/2s", "--quota", "test_costly=off"]).await;
    let url = s.fleet.urls()[0].clone();
    let mut carol = s.client("carol");
    carol.initialize(&url).await;
    let simple = |id| call(id, "test_simple_text", json!({}));
    for id in [1, 2] {
        assert!(seen(carol.post(&url, &simple(id)).await).await.body["result"]["isError"].is_null());
    }
    let refused = seen(carol.post(&url, &simple(3)).await).await;
    assert_eq!(refused.body["result"]["isError"], true);
    let text = refused.body["result"]["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(text.contains("2 per 2s"), "{text}");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(seen(carol.post(&url, &simple(4)).await).await.body["result"]["isError"].is_null(), "the window reset");
    // test_costly=off lifts the tool's own quota.
    for id in 5..10 {
        let r = seen(carol.post(&url, &call(id, "test_costly", json!({ "topic": "x" }))).await).await;
        assert!(r.body["result"]["isError"].is_null());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_refuse_clearly_and_free_their_slots_when_the_holder_ends_or_dies() {
    let mut s = setup(
        3,
        &[
            "--max-sessions-per-user",
            "2",
            "--max-streams-per-user",
            "1",
            "--max-inflight-per-user",
            "1",
            "--lease-ttl",
            "1500ms",
            "--redis-timeout",
            "500ms",
        ],
    )
    .await;
    let urls = s.fleet.urls();
    let (a, b, c) = (urls[0].clone(), urls[1].clone(), urls[2].clone());

    // Sessions.
    let (mut s1, mut s2, mut s3) = (s.client("alice"), s.client("alice"), s.client("alice"));
    s1.initialize(&a).await;
    s2.initialize(&b).await;
    let third = seen(s3.post(&c, &init(0)).await).await;
    assert_limited(&third, "sessions");
    let msg = third.body["error"]["message"].as_str().unwrap();
    println!("session cap: {msg}");
    assert!(msg.contains("open sessions") && msg.contains("cap 2") && msg.contains("DELETE"), "{msg}");
    assert_eq!(s.client("bob").post(&c, &init(0)).await.status(), 200, "bob has his own cap");
    assert_eq!(s1.delete(&c).await.status(), 200);
    s3.initialize(&c).await;

    // Streams: one GET stream; a second is refused until the first closes.
    let first = s2.get(&a, None).await;
    assert_eq!(first.status(), 200);
    let mut first = SseStream::new(first);
    first.next(T).await.unwrap();
    let second = seen(s3.get(&b, None).await).await;
    assert_limited(&second, "streams");
    assert!(second.body["error"]["message"].as_str().unwrap().contains("open SSE streams"));
    assert_eq!(second.retry_after, Some(1));
    drop(first);
    eventually(5, "the stream's slot is free once it closes", || async { s3.get(&b, None).await.status() == 200 })
        .await;

    // In flight: one call at a time.
    let mut long = s2.call_streaming(&a, 1, "test_countdown", json!({ "count": 30, "interval_ms": 50 })).await;
    long.next(T).await.unwrap();
    let busy = seen(s3.post(&b, &call(2, "test_simple_text", json!({}))).await).await;
    assert_limited(&busy, "inflight");
    assert!(busy.body["error"]["message"].as_str().unwrap().contains("tool calls in flight"));
    long.collect(T).await.unwrap();
    eventually(5, "the call's slot is free once it ends", || async {
        s3.post(&b, &call(3, "test_simple_text", json!({}))).await.status() == 200
    })
    .await;

    // A holder that dies: its slots run out with their leases (1.5 s). (The probes above freed theirs when they
    // ended, a moment after their answers: wait for that.)
    let mut held = None;
    for _ in 0..50 {
        let r = s2.get(&a, None).await;
        if r.status() == 200 {
            held = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = held.expect("a stream slot frees");
    let countdown = rpc(
        4,
        "tools/call",
        json!({ "name": "test_countdown",
        "arguments": { "count": 1000, "interval_ms": 50 }, "_meta": { "progressToken": 4 } }),
    );
    let mut long = None;
    for _ in 0..50 {
        let r = s3.post(&b, &countdown).await;
        if r.status() == 200 {
            long = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut long = SseStream::new(long.expect("a call slot frees"));
    long.next(T).await.unwrap();
    s.fleet.replicas[0].kill();
    s.fleet.replicas[1].kill();
    let died = Instant::now();
    assert_limited(&seen(s2.get(&c, None).await).await, "streams");
    eventually(10, "the dead replica's stream slot frees", || async { s2.get(&c, None).await.status() == 200 }).await;
    eventually(10, "the dead replica's call slot frees", || async {
        s3.post(&c, &call(5, "test_simple_text", json!({}))).await.status() == 200
    })
    .await;
    println!("slots of a killed replica freed after {:?} (lease 1.5 s)", died.elapsed());
    drop((held, long));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_key_expires_and_the_key_count_returns_to_baseline() {
    let redis = RedisServer::start();
    // --auth none: the bucket is keyed by the peer address, under the anonymous principal.
    let fleet = Fleet::builder()
        .redis(redis.url())
        .arg("--rate-burst")
        .arg("50")
        .arg("--rate-per-second")
        .arg("50")
        .arg("--quota")
        .arg("test_simple_text=5/1s")
        .arg("--max-sessions-per-user")
        .arg("10")
        .arg("--max-streams-per-user")
        .arg("10")
        .arg("--max-inflight-per-user")
        .arg("10")
        .start()
        .await;
    let url = fleet.urls()[0].clone();
    assert!(redis.keys().iter().all(|k| k.contains("{fleet}")), "only the membership records");
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut c = McpClient::new();
        c.initialize(&url).await;
        c.request(&url, 1, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
        clients.push(c);
    }
    let stream = clients[0].get(&url, None).await;
    assert_eq!(stream.status(), 200);
    let mut stream = SseStream::new(stream);
    stream.next(T).await.unwrap();
    let keys = redis.keys();
    println!("keys at the peak: {keys:?}");
    for suffix in [":tb:127.0.0.1", ":q:test_simple_text", ":ss", ":cs"] {
        assert!(keys.iter().any(|k| k.ends_with(suffix)), "{suffix} in {keys:?}");
    }
    for k in &keys {
        // -1 is a key without a TTL; -2 one that already expired since KEYS listed it.
        let ttl: i64 = redis.raw(&["PTTL", k]).trim().parse().unwrap();
        assert_ne!(ttl, -1, "{k} has no TTL");
    }
    drop(stream);
    for c in &clients {
        assert_eq!(c.delete(&url).await.status(), 200);
    }
    eventually(10, "the key count returns to baseline", || async {
        redis.keys().iter().all(|k| k.contains("{fleet}"))
    })
    .await;
}

/// One MONITOR line: who sent it (`lua` for commands inside a script) and the command with its arguments.
fn monitor_line(l: &str) -> Option<(bool, Vec<String>)> {
    let open = l.find('[')?;
    let close = l[open..].find(']')? + open;
    let from_script = l[open..close].contains("lua");
    let args = l[close + 1..].split("\" \"").map(|a| a.trim().trim_matches('"').to_owned()).collect();
    Some((from_script, args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_with_every_limit_on_is_one_redis_round_trip() {
    let redis = RedisServer::start();
    let fleet = Fleet::builder()
        .redis(redis.url())
        .arg("--rate-burst")
        .arg("1000")
        .arg("--quota")
        .arg("test_simple_text=100/1h")
        .arg("--max-inflight-per-user")
        .arg("4")
        .arg("--cancel-watch-after")
        .arg("60s")
        .start()
        .await;
    let url = fleet.urls()[0].clone();
    let mut c = McpClient::new();
    c.initialize(&url).await;
    c.request(&url, 1, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await; // warm up
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "monitor"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = monitor.stdout.take().unwrap();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            sink.lock().unwrap().push(l);
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = c.request(&url, 2, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert_eq!(r["result"]["content"][0]["type"], "text");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = monitor.kill();
    let _ = monitor.wait();
    let lines = lines.lock().unwrap().clone();
    let top: Vec<Vec<String>> = lines
        .iter()
        .filter_map(|l| monitor_line(l))
        .filter(|(from_script, args)| !from_script && !matches!(args[0].to_ascii_uppercase().as_str(), "PING" | "OK"))
        // The replica's task loops (the queue's shards, `{tq:<n>}`) run on their own, not for this call.
        .filter(|(_, args)| !args.iter().any(|a| a.contains("{tq:")))
        .map(|(_, args)| args)
        .collect();
    println!("top-level commands for one tools/call:");
    for t in &top {
        println!(
            "  {} {} keys: {:?}",
            t[0],
            t.get(2).map_or("", String::as_str),
            t.iter().filter(|a| a.contains('{')).collect::<Vec<_>>()
        );
    }
    let session = c.session.clone().unwrap();
    let admissions: Vec<&Vec<String>> =
        top.iter().filter(|t| t.iter().any(|a| a.ends_with(&format!(":s:{session}")))).collect();
    assert_eq!(admissions.len(), 1, "the admission is one command: {top:?}");
    let admission = admissions[0];
    assert_eq!(admission[0].to_ascii_uppercase(), "EVALSHA");
    for part in [":tb:127.0.0.1", ":cc", ":q:test_simple_text"] {
        assert!(admission.iter().any(|a| a.ends_with(part)), "the admission covers {part}: {admission:?}");
    }
    // The replica has seen this session: its touch is a tap, which reads only what may change of the session
    // (its TTL field and log level), not the protocol version and capabilities the replica keeps.
    assert!(admission.iter().any(|a| a == "tap"), "a seen session is tapped: {admission:?}");
    let reads: Vec<Vec<String>> = lines
        .iter()
        .filter_map(|l| monitor_line(l))
        .filter(|(from_script, args)| {
            *from_script && args[0].eq_ignore_ascii_case("HMGET") && args[1].ends_with(&format!(":s:{session}"))
        })
        .map(|(_, args)| args)
        .collect();
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert_eq!(reads[0][2..], ["ttl".to_owned(), "lvl".to_owned()], "{reads:?}");
    // The only other command is the release of the call's slot, after the answer.
    assert_eq!(top.len(), 2, "{top:?}");
    let release = top.iter().find(|t| !std::ptr::eq(*t, admission)).unwrap();
    assert!(release.iter().any(|a| a.ends_with(":cc")) && release.iter().any(|a| a == "release"), "{release:?}");

    // NOSCRIPT: an emptied script cache (a restart, a failover) is reloaded on the way.
    assert_eq!(redis.raw(&["SCRIPT", "FLUSH"]).trim(), "OK");
    let r = c.request(&url, 3, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert_eq!(r["result"]["content"][0]["type"], "text");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_or_stopped_gives_503_with_retry_after_and_recovers() {
    // A deadline longer than the breaker's 1 s cooldown, as the defaults are (2 s): the cooldown must run from the
    // failure, or it has already ended when the third failure opens the breaker.
    let s = setup(1, &["--lease-ttl", "4s", "--redis-timeout", "1200ms"]).await;
    let url = s.fleet.urls()[0].clone();
    let mut c = s.client("alice");
    c.initialize(&url).await;

    // Frozen: each request fails within the deadline, and after three failures without calling Redis at all.
    s.redis.signal("-STOP");
    let mut took = Vec::new();
    for i in 0..6 {
        let started = Instant::now();
        let r = ping(&c, &url, i).await;
        took.push(started.elapsed());
        assert_eq!(r.status, 503, "{r:?}");
        assert_eq!(r.retry_after, Some(1));
        assert_eq!(r.body["error"]["message"], "service temporarily unavailable", "no internals: {r:?}");
    }
    println!("Redis stopped: 503 after {took:?}");
    assert!(took.iter().all(|t| *t < Duration::from_millis(2500)), "within the deadline: {took:?}");
    assert!(took[3..].iter().all(|t| *t < Duration::from_millis(600)), "the breaker answers at once: {took:?}");
    s.redis.signal("-CONT");
    eventually(10, "serving again without a restart", || async { ping(&c, &url, 9).await.status == 200 }).await;

    // CLIENT PAUSE: the same, and back once the pause ends.
    assert_eq!(s.redis.raw(&["CLIENT", "PAUSE", "1500", "ALL"]).trim(), "OK");
    assert_eq!(ping(&c, &url, 10).await.status, 503);
    eventually(10, "serving again after the pause", || async { ping(&c, &url, 11).await.status == 200 }).await;
    let failures = s.metric(r#"mcp_limit_store_failures_total{reason="timeout"}"#).await;
    let skipped = s.metric(r#"mcp_limit_store_failures_total{reason="breaker_open"}"#).await;
    println!("store failures: {failures} timeouts, {skipped} skipped by the breaker");
    assert!(failures >= 3.0 && skipped >= 1.0);
}

/// Alice initializes on replica 0, then pings it three times while Redis is stopped (`SIGSTOP`): what the fail-open
/// bucket lets through.
async fn three_pings_with_redis_stopped(s: &JwtFleet) -> [Seen; 3] {
    let url = s.fleet.urls()[0].clone();
    let mut c = s.client("alice");
    c.initialize(&url).await;
    s.redis.signal("-STOP");
    let statuses = [ping(&c, &url, 1).await, ping(&c, &url, 2).await, ping(&c, &url, 3).await];
    s.redis.signal("-CONT");
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_decides_the_rate_on_a_local_share_and_counts_it() {
    let s = setup(
        1,
        &[
            "--rate-fail-mode",
            "open",
            "--rate-burst",
            "4",
            "--rate-per-second",
            "0.1",
            "--replicas",
            "2",
            "--redis-timeout",
            "300ms",
        ],
    )
    .await;
    // This replica's share is 4 ÷ 2: two requests pass the bucket (and then fail closed on their session, 503),
    // the third is refused by the local bucket (429) without waiting for Redis.
    let statuses = three_pings_with_redis_stopped(&s).await;
    println!("fail open with Redis stopped: {:?}", statuses.iter().map(|r| r.status).collect::<Vec<_>>());
    assert_eq!(statuses.iter().map(|r| r.status).collect::<Vec<_>>(), [503, 503, 429]);
    assert_limited(&statuses[2], "rate");
    assert_eq!(s.metric(r#"mcp_limit_fail_open_total{outcome="allowed"}"#).await, 2.0);
    assert_eq!(s.metric(r#"mcp_limit_fail_open_total{outcome="denied"}"#).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replicas_count_themselves_and_the_fail_open_share_follows() {
    // No --replicas: the fleet's size comes from its membership records.
    let mut s = setup(
        3,
        &["--rate-fail-mode", "open", "--rate-burst", "6", "--rate-per-second", "0.01", "--redis-timeout", "300ms"],
    )
    .await;
    let admins: Vec<String> = s.fleet.replicas.iter().map(|r| r.admin()).collect();
    let counts = |admins: Vec<String>| async move {
        let mut out = Vec::new();
        for a in &admins {
            out.push(scrape(a).await.get("mcp_fleet_replicas").copied().unwrap_or(0.0));
        }
        out
    };
    let all = admins.clone();
    eventually(12, "every replica counts 3", || {
        let all = all.clone();
        async move { counts(all).await == [3.0, 3.0, 3.0] }
    })
    .await;
    // This replica's share is 6 ÷ 3 (not 6 ÷ 1): two pass the local bucket (then fail closed on their session),
    // the third is refused.
    let statuses = three_pings_with_redis_stopped(&s).await;
    assert_eq!(statuses.iter().map(|r| r.status).collect::<Vec<_>>(), [503, 503, 429]);
    // A replica drains (SIGTERM): it removes its record, and the others count 2 at their next beat.
    s.fleet.replicas[2].terminate();
    let two = admins[..2].to_vec();
    let started = Instant::now();
    eventually(8, "the others count 2 after a drain", || {
        let two = two.clone();
        async move { counts(two).await == [2.0, 2.0] }
    })
    .await;
    println!("membership: a drained replica stopped counting after {:?}", started.elapsed());
    // A replica dies: the last one counts 1 once the dead one's record expires (15 s), without a restart.
    s.fleet.replicas[1].kill();
    let one = admins[..1].to_vec();
    let started = Instant::now();
    eventually(25, "the survivor counts 1", || {
        let one = one.clone();
        async move { counts(one).await == [1.0] }
    })
    .await;
    println!("membership: a dead replica stopped counting after {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_messages_never_wait_on_the_bucket_and_have_a_bucket_of_their_own() {
    // A bucket of 6 that does not refill during the test.
    let s = setup(2, &["--rate-burst", "6", "--rate-per-second", "0.001"]).await;
    let (a, b) = (s.url(0), s.url(1));
    let mut c = s.client("alice");
    c.initialize(&a).await; // 2 tokens: initialize, notifications/initialized
    let mut stream = c.call_streaming(&b, 1, "test_sampling", json!({ "prompt": "hi" })).await; // 3
    let ask = stream.until_method("sampling/createMessage", T).await.unwrap();
    // The client uses its bucket up.
    let mut refused = None;
    for id in 10..20 {
        let r = ping(&c, &a, id).await;
        if r.status == 429 {
            refused = Some(id);
            break;
        }
    }
    assert_eq!(refused, Some(13), "3 tokens were left for pings");
    // Its answer to the server's request, a cancellation and the DELETE still go through.
    let answer = json!({ "jsonrpc": "2.0", "id": ask["id"], "result": {
        "role": "assistant", "content": { "type": "text", "text": "sampled" }, "model": "m" } });
    assert_eq!(c.post(&a, &answer).await.status(), 202, "the answer to a server request");
    let events = stream.collect(T).await.unwrap();
    let last = data_messages(&events).pop().unwrap();
    assert!(last["result"]["content"][0]["text"].as_str().unwrap().contains("sampled"), "{last}");
    let cancel = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 99 } });
    assert_eq!(c.post(&b, &cancel).await.status(), 202, "notifications/cancelled");
    assert_eq!(c.delete(&a).await.status(), 200, "the session DELETE");
    // They have a bucket of their own, as large: 3 of its 6 tokens are used, so DELETEs of sessions that do not
    // exist get 404 three times, then 429.
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..5 {
            v.push(c.delete(&b).await.status().as_u16());
        }
        v
    };
    assert_eq!(statuses, [404, 404, 404, 429, 429], "the control bucket bounds a DELETE flood");
}

/// Runs `workers` clients through `url`, each making `calls` tool calls one after another; the statuses seen.
async fn call_loops(fleet: &JwtFleet, url: &str, workers: usize, calls: u64) -> BTreeMap<u16, usize> {
    let runs = (0..workers).map(|_| {
        let mut c = fleet.client("alice");
        let url = url.to_owned();
        async move {
            c.initialize(&url).await;
            let mut seen = Vec::new();
            for id in 0..calls {
                seen.push(c.post(&url, &call(id, "test_simple_text", json!({}))).await.status().as_u16());
            }
            seen
        }
    });
    let mut counts = BTreeMap::new();
    for s in join_all(runs).await.into_iter().flatten() {
        *counts.entry(s).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inflight_cap_never_refuses_a_client_at_it_across_replicas() {
    const CAP: usize = 8;
    let s = setup(3, &["--max-inflight-per-user", "8"]).await;
    let proxy = mcpfleet_fleetkit::RoundRobinProxy::start(s.fleet.bases()).await;
    // CAP workers, each with one call in flight at a time, round-robin over the replicas: never over the cap.
    let counts = call_loops(&s, &proxy.url(), CAP, 100).await;
    println!("{CAP} workers × 100 calls at a cap of {CAP}: {counts:?}");
    assert_eq!(counts, BTreeMap::from([(200, CAP * 100)]), "a client at its cap was refused");
    // The cap still holds: CAP long calls in flight, and one more is refused.
    let mut c = s.client("alice");
    c.initialize(&s.url(0)).await;
    let mut long = Vec::new();
    for id in 0..CAP {
        let args = json!({ "count": 40, "interval_ms": 50 });
        let mut st = c.call_streaming(&s.url(id % 3), i64::try_from(id).unwrap(), "test_countdown", args).await;
        st.next(T).await.unwrap();
        long.push(st);
    }
    let over = seen(c.post(&s.url(1), &call(100, "test_simple_text", json!({}))).await).await;
    assert_limited(&over, "inflight");
    drop(long);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_limits_let_an_ordinary_client_work_and_the_strict_profile_does_not() {
    // The server's own defaults, as a new user gets them, through three replicas behind round-robin.
    let redis = RedisServer::start();
    let fleet = Fleet::builder().replicas(3).redis(redis.url()).server_limits().start().await;
    let proxy = mcpfleet_fleetkit::RoundRobinProxy::start(fleet.bases()).await;
    let url = proxy.url();
    let sdk_loop = |url: String| async move {
        let mut c = McpClient::new();
        c.initialize(&url).await;
        let mut statuses = BTreeMap::<u16, usize>::new();
        for id in 0..100 {
            *statuses
                .entry(c.post(&url, &call(id, "test_simple_text", json!({}))).await.status().as_u16())
                .or_default() += 1;
        }
        (statuses, c.delete(&url).await.status().as_u16())
    };
    let (statuses, deleted) = sdk_loop(url.clone()).await;
    assert_eq!(statuses, BTreeMap::from([(200, 100)]), "the 100-call loop under the default limits");
    assert_eq!(deleted, 200);
    drop((proxy, fleet));
    // The seed's stricter profile (burst 60, 1/s), documented as an example, refuses the same loop partway; the
    // DELETE after it still goes through.
    let redis = RedisServer::start();
    let strict = Fleet::builder()
        .replicas(3)
        .redis(redis.url())
        .server_limits()
        .arg("--rate-burst")
        .arg("60")
        .arg("--rate-per-second")
        .arg("1")
        .start()
        .await;
    let proxy = mcpfleet_fleetkit::RoundRobinProxy::start(strict.bases()).await;
    let (statuses, deleted) = sdk_loop(proxy.url()).await;
    println!("the strict profile: {statuses:?}");
    assert!(statuses.get(&429).copied().unwrap_or(0) > 30, "{statuses:?}");
    assert_eq!(deleted, 200, "a DELETE is never refused by the bucket");
}
