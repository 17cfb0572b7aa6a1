//! Mixed versions (issue 33): replicas of the newest release (releases.toml; its binary built from its commit by
//! `tests/release-bin.sh`, cached per machine) and of this tree share one Redis, as they do for the minutes of a
//! rolling upgrade, and each session moves between the two versions: what one version wrote, the other reads,
//! from real bytes the other binary wrote. docs/UPGRADING.md states the rule these tests hold.

#![expect(clippy::unwrap_used, clippy::expect_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{
    Fleet, McpClient, RedisServer, RoundRobinProxy, SseEvent, SseStream, StatelessClient, data_messages,
    progress_values,
};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// One replica of the newest release (`old`, at `o`) and one of this tree (`new`, at `n`) on a Redis of their own.
/// Its fields drop in order, the replicas first.
struct Mixed {
    old: Fleet,
    new: Fleet,
    o: String,
    n: String,
    _redis: RedisServer,
}

impl Mixed {
    async fn start() -> Self {
        let redis = RedisServer::start();
        let (old, new) = old_and_new_with(&redis, &[]).await;
        let (o, n) = (old.urls()[0].clone(), new.urls()[0].clone());
        Self { old, new, o, n, _redis: redis }
    }
}

/// The same, both with `flags`.
async fn old_and_new_with(redis: &RedisServer, flags: &[&str]) -> (Fleet, Fleet) {
    let release = tokio::task::spawn_blocking(mcpfleet_fleetkit::previous_release).await.unwrap();
    let (mut old, mut new) = (Fleet::builder().release(release), Fleet::builder());
    for f in flags {
        (old, new) = (old.arg(*f), new.arg(*f));
    }
    (old.redis(redis.url()).start().await, new.redis(redis.url()).start().await)
}

/// A task's status is final.
fn terminal(t: &Value) -> bool {
    matches!(t["status"].as_str(), Some("completed" | "failed" | "cancelled"))
}

fn text_of(response: &Value) -> String {
    response["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Copies the files under `from` into `to`, writing only those whose content differs (so that cargo, which goes by
/// modification times, rebuilds only what changed since the last copy).
fn sync_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "target" {
                sync_tree(&src, &dst);
            }
        } else if std::fs::read(&dst).ok() != Some(std::fs::read(&src).unwrap()) {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// Writes `text` to `path` unless it holds it already.
fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text).unwrap();
    }
}

/// This tree with a layout change planted that breaks the rule: the event log's data field is written and read as
/// `data` instead of `d` (as a release would that renamed it in one step, without an expand release before it).
/// The tree is copied into `target/planted-layout/` and built there, in a target directory of its own kept between
/// runs (so its dependencies build once); its `mcpfleet` binary.
fn build_planted() -> PathBuf {
    let (root, dir) = (root(), root().join("target/planted-layout"));
    let src = dir.join("src");
    for part in ["crates", "migrations"] {
        sync_tree(&root.join(part), &src.join(part));
    }
    // What the sources embed from outside crates/ and migrations/ (as the image's build context carries it).
    std::fs::create_dir_all(src.join("docs")).unwrap();
    for file in ["Cargo.toml", "Cargo.lock", "rust-toolchain.toml", "docs/policy.schema.json"] {
        write_if_changed(&src.join(file), &std::fs::read_to_string(root.join(file)).unwrap());
    }
    let plant = [
        ("append.lua", "'d', ARGV[2]", "'data', ARGV[2]", 2),
        ("abandon.lua", "'d', ARGV[2]", "'data', ARGV[2]", 1),
        ("open.lua", "'d', ''", "'data', ''", 1),
        ("replay.lua", "f[i] == 'd'", "f[i] == 'data'", 1),
    ];
    for (file, from, to, times) in plant {
        let script = std::fs::read_to_string(root.join("crates/state/src/redis").join(file)).unwrap();
        assert_eq!(script.matches(from).count(), times, "the plant no longer fits {file}: update build_planted");
        write_if_changed(&src.join("crates/state/src/redis").join(file), &script.replace(from, to));
    }
    let out = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args(["build", "--offline", "--quiet", "--locked", "-p", "mcpfleet", "--bin", "mcpfleet"])
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .current_dir(&src)
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo build of the planted tree failed:\n{}", String::from_utf8_lossy(&out.stderr));
    dir.join("target/debug/mcpfleet")
}

/// Reads events until `n` of them carry a message; returns every event read.
async fn read_messages(s: &mut SseStream, n: usize) -> Vec<SseEvent> {
    let mut seen = Vec::new();
    while seen.iter().filter(|e: &&SseEvent| !e.data.is_empty()).count() < n {
        seen.push(s.next(T).await.unwrap().unwrap());
    }
    seen
}

/// The messages a `tools/call` of `tool` (no arguments) answers with, whether as JSON or as an SSE stream.
async fn call_messages(client: &McpClient, url: &str, id: i64, tool: &str) -> Vec<Value> {
    let body =
        json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": tool, "arguments": {} } });
    let resp = client.post(url, &body).await;
    assert_eq!(resp.status(), 200);
    let sse = resp.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if sse { data_messages(&SseStream::new(resp).collect(T).await.unwrap()) } else { vec![resp.json().await.unwrap()] }
}

/// A countdown of 12 runs on `from`; the client reads 3 progress events, drops the stream, and resumes on `to` with
/// the last id it saw: every later event comes exactly once, in order, with the call's answer last.
async fn resume_across(client: &McpClient, id: i64, from: &str, to: &str) {
    let mut s = client.call_streaming(from, id, "test_countdown", json!({ "count": 12, "interval_ms": 60 })).await;
    let seen = read_messages(&mut s, 3).await;
    let cursor = seen.last().unwrap().id.clone().unwrap();
    drop(s);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resp = client.get(to, Some(&cursor)).await;
    assert_eq!(resp.status(), 200, "resume of {cursor} on the other version");
    let rest = SseStream::new(resp).collect(T).await.unwrap();
    let after = data_messages(&rest);
    assert_eq!(progress_values(&data_messages(&seen)), vec![1, 2, 3]);
    assert_eq!(progress_values(&after), (4..=12).collect::<Vec<_>>(), "every later event once, in order");
    assert_eq!(after.last().unwrap()["id"], id);
    assert_eq!(after.last().unwrap()["result"]["content"][0]["text"], "counted to 12");
    let ids: Vec<_> = rest.iter().filter_map(|e| e.id.clone()).collect();
    let mut dedup = ids.clone();
    dedup.dedup();
    assert_eq!(ids, dedup, "no event twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_on_either_version_is_served_by_the_other() {
    let m = Mixed::start().await;
    let (o, n) = (m.o.clone(), m.n.clone());
    // Each counts the other in the fleet's membership (the fail-open bucket's share): one set of records.
    let admins = [m.old.replicas[0].admin(), m.new.replicas[0].admin()];
    mcpfleet_fleetkit::eventually(12, "both versions count two replicas", || async {
        let mut counts = Vec::new();
        for a in &admins {
            counts.push(mcpfleet_fleetkit::scrape(a).await.get("mcp_fleet_replicas").copied().unwrap_or(0.0));
        }
        counts == [2.0, 2.0]
    })
    .await;
    for (first, second) in [(&o, &n), (&n, &o)] {
        let mut client = McpClient::new();
        client.initialize(first).await;
        let list = client.request(second, 1, "tools/list", json!({})).await;
        assert!(list["result"]["tools"].as_array().unwrap().iter().any(|t| t["name"] == "test_simple_text"), "{list}");
        let r = client.request(second, 2, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
        assert_eq!(r["result"]["content"][0]["text"], "This is a simple text response for testing.", "{r}");
        // The log level one version sets, the other keeps: above the tool's `info`, its log messages stay back.
        for (level, sent) in [("error", 0), ("debug", 3)] {
            let set = client.request(first, 3, "logging/setLevel", json!({ "level": level })).await;
            assert!(set.get("result").is_some(), "{set}");
            let msgs = call_messages(&client, second, 4, "test_tool_with_logging").await;
            let logs = msgs.iter().filter(|m| m["method"] == "notifications/message").count();
            assert_eq!(logs, sent, "at {level}: {msgs:?}");
            assert_eq!(msgs.last().unwrap()["id"], 4, "the answer last: {msgs:?}");
        }
        // Deleted on one version: gone on both.
        assert_eq!(client.delete(second).await.status(), 200);
        for u in [first, second] {
            assert_eq!(
                client.post(u, &json!({ "jsonrpc": "2.0", "id": 5, "method": "tools/list" })).await.status(),
                404
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_written_by_one_version_resumes_on_the_other_with_nothing_lost_or_repeated() {
    let m = Mixed::start().await;
    let (o, n) = (m.o.clone(), m.n.clone());
    let mut client = McpClient::new();
    client.initialize(&o).await;
    resume_across(&client, 7, &o, &n).await;
    resume_across(&client, 8, &n, &o).await;

    // The standalone stream: opened on one version, a notification from a call on the other reaches it.
    for (listen, call) in [(&o, &n), (&n, &o)] {
        let mut stream = SseStream::new(client.get(listen, None).await);
        assert_eq!(stream.next(T).await.unwrap().unwrap().data, "", "priming event");
        let r = client
            .request(call, 9, "tools/call", json!({ "name": "test_update_watched_resource", "arguments": {} }))
            .await;
        assert_eq!(r["result"]["content"][0]["text"], "test://watched-resource updated");
        let note = stream.next(T).await.unwrap().unwrap().json().unwrap();
        assert_eq!(note["method"], "notifications/resources/updated");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_request_from_one_version_is_answered_and_cancelled_through_the_other() {
    let m = Mixed::start().await;
    let (o, n) = (m.o.clone(), m.n.clone());
    let mut client = McpClient::new();
    client.initialize(&n).await;
    for (runs, answers) in [(&o, &n), (&n, &o)] {
        let mut s = client.call_streaming(runs, 11, "test_sampling", json!({ "prompt": "across versions" })).await;
        let request = s.until_method("sampling/createMessage", T).await.unwrap();
        let reply = json!({ "jsonrpc": "2.0", "id": request["id"], "result": {
            "role": "assistant", "content": { "type": "text", "text": "answered" }, "model": "m", "stopReason": "endTurn" } });
        assert_eq!(client.post(answers, &reply).await.status(), 202);
        let rest = data_messages(&s.collect(T).await.unwrap());
        assert_eq!(rest.last().unwrap()["result"]["content"][0]["text"], "LLM response: answered");

        let mut s = client.call_streaming(runs, 12, "test_countdown", json!({ "count": 500, "interval_ms": 20 })).await;
        s.next(T).await.unwrap().unwrap();
        let cancel = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 12 } });
        assert_eq!(client.post(answers, &cancel).await.status(), 202);
        let rest = data_messages(&s.collect(T).await.unwrap());
        assert!(rest.iter().all(|m| m.get("id").is_none()), "no response after cancellation: {rest:?}");
        assert!(progress_values(&rest).iter().all(|p| *p < 500), "the call stopped before its end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_change_that_breaks_the_rule_is_caught() {
    let planted = tokio::task::spawn_blocking(build_planted).await.unwrap();
    let release = tokio::task::spawn_blocking(mcpfleet_fleetkit::previous_release).await.unwrap();
    let redis = RedisServer::start();
    let old = Fleet::builder().release(release).redis(redis.url()).start().await;
    let new = Fleet::builder().release(planted).replicas(2).redis(redis.url()).start().await;
    let (o, n) = (old.urls()[0].clone(), new.urls());
    let mut client = McpClient::new();
    client.initialize(&n[0]).await;
    // The planted build agrees with itself: its own replicas resume each other's streams.
    resume_across(&client, 7, &n[0], &n[1]).await;
    // A stream it wrote, resumed on the release: the events come without their data. The same check as above
    // must fail (its panic message below is expected).
    let (c, from, to) = (client.clone(), n[0].clone(), o.clone());
    let caught = tokio::spawn(async move { resume_across(&c, 8, &from, &to).await }).await;
    assert!(caught.is_err_and(|e| e.is_panic()), "the mixed-version check missed a layout change that breaks the rule");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_state_signed_by_one_version_is_taken_by_the_other() {
    let m = Mixed::start().await;
    let (o, n) = (m.o.clone(), m.n.clone());
    let c = StatelessClient::new();
    for (a, b) in [(&o, &n), (&n, &o)] {
        // Three rounds of one call: the state each version signs, the other verifies and extends.
        let tool = "test_input_required_result_multi_round";
        let r1 = c.call(a, 1, tool, json!({}), json!({})).await;
        assert_eq!(r1["result"]["resultType"], "input_required", "{r1}");
        let answer = json!({ "action": "accept", "content": { "name": "Alice" } });
        let retry = json!({ "inputResponses": { "step1": answer }, "requestState": r1["result"]["requestState"] });
        let r2 = c.call(b, 2, tool, json!({}), retry).await;
        assert!(r2["result"]["inputRequests"].get("step2").is_some(), "{r2}");
        let answer = json!({ "action": "accept", "content": { "color": "blue" } });
        let retry = json!({ "inputResponses": { "step2": answer }, "requestState": r2["result"]["requestState"] });
        let r3 = c.call(a, 3, tool, json!({}), retry).await;
        assert_eq!(text_of(&r3), "Alice likes blue.", "{r3}");
        // A state that was tampered with is refused by either.
        let state = r1["result"]["requestState"].as_str().unwrap();
        let forged = format!("{}A{}", &state[..state.len() / 2], &state[state.len() / 2 + 1..]);
        let forged = if forged == state {
            format!("{}B{}", &state[..state.len() / 2], &state[state.len() / 2 + 1..])
        } else {
            forged
        };
        let retry = json!({ "inputResponses": { "step1": answer }, "requestState": forged });
        let refused = c.call(b, 4, tool, json!({}), retry).await;
        assert!(refused.get("error").is_some(), "a forged state is refused: {refused}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_call_made_on_one_version_is_replayed_by_the_other_and_runs_once() {
    let m = Mixed::start().await;
    let (o, n) = (m.o.clone(), m.n.clone());
    let c = StatelessClient::new();
    let keyed = |k: &str| json!({ "_meta": { "io.mcpfleet/idempotencyKey": k } });
    let ran = "mcp_tool_calls_total{outcome=\"ok\",tool=\"test_mint\"}";
    let runs = || async {
        let mut sum = 0.0;
        for r in m.old.replicas.iter().chain(&m.new.replicas) {
            sum += mcpfleet_fleetkit::scrape(&r.admin()).await.get(ran).copied().unwrap_or(0.0);
        }
        sum
    };
    for (i, (a, b)) in [(&o, &n), (&n, &o)].into_iter().enumerate() {
        let key = format!("order-{i}");
        let args = json!({ "delay_ms": 700 });
        // At once on both versions, then again later on the other: one run, one result.
        let (x, y) = tokio::join!(
            c.call(a, 1, "test_mint", args.clone(), keyed(&key)),
            c.call(b, 2, "test_mint", args.clone(), keyed(&key)),
        );
        let minted = text_of(&x);
        assert!(minted.starts_with("minted "), "{x}");
        assert_eq!(text_of(&y), minted, "both versions give the one result: {y}");
        let z = c.call(b, 3, "test_mint", args.clone(), keyed(&key)).await;
        assert_eq!(text_of(&z), minted);
        assert_eq!(runs().await, i as f64 + 1.0, "the handler ran once for key {key}");
        // The same key with other arguments is refused by the other version.
        let other = c.call(b, 4, "test_mint", json!({ "delay_ms": 1 }), keyed(&key)).await;
        assert_eq!(other["error"]["code"], -32602, "{other}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_on_one_version_is_finished_by_the_other() {
    let tasks = json!({ "elicitation": {}, "extensions": { "io.modelcontextprotocol/tasks": {} } });
    let c = StatelessClient::new().with_capabilities(tasks);
    for old_creates in [true, false] {
        let redis = RedisServer::start();
        // One worker each and a long lease: the creator's tasks end elsewhere only through the shared queue and
        // the hand-back at its shutdown.
        let flags = ["--task-workers", "1", "--task-lease", "60s", "--shutdown-grace", "20s"];
        let (mut old, mut new) = old_and_new_with(&redis, &flags).await;
        let (creator, finisher) = if old_creates { (&mut old, &new) } else { (&mut new, &old) };
        let (at, by) = (creator.urls()[0].clone(), finisher.urls()[0].clone());
        let mut ids = Vec::new();
        for i in 0..3 {
            let r = c.call(&at, i, "slow_job", json!({ "seconds": 2 }), json!({})).await;
            assert_eq!(r["result"]["resultType"], "task", "{r}");
            ids.push(r["result"]["taskId"].as_str().unwrap().to_owned());
        }
        // The other version knows them at once, and finishes them once the creator is gone.
        creator.replicas[0].terminate();
        for id in &ids {
            let t = c.poll_task(std::slice::from_ref(&by), id, 40, terminal).await;
            assert_eq!(t["status"], "completed", "{t}");
            assert_eq!(text_of(&json!({ "result": t["result"] })), "slow_job: done after 2 s");
        }
        assert_eq!(creator.replicas[0].wait_exit(20), Some(0), "the creator drained and exited");
    }
}

/// A countdown of `count` through `url` (the proxy), followed to its answer: whenever its stream ends early (the
/// replica serving it drains), resumed with the last event id, through the proxy again. Every event read, and how
/// many resumes it took.
async fn countdown_to_the_end(c: &McpClient, url: &str, id: i64, count: u64) -> (Vec<SseEvent>, usize) {
    let mut s = c.call_streaming(url, id, "test_countdown", json!({ "count": count, "interval_ms": 40 })).await;
    let (mut events, mut resumes) = (Vec::new(), 0);
    loop {
        // A stream that ends or breaks: either way, what it delivered is kept.
        while let Ok(Some(e)) = s.next(T).await {
            events.push(e);
        }
        if data_messages(&events).last().is_some_and(|m| m["id"] == id) {
            return (events, resumes);
        }
        let last = events.iter().rev().find_map(|e| e.id.clone()).expect("an event id to resume from");
        resumes += 1;
        assert!(resumes <= 10, "call {id}: still no answer after {resumes} resumes");
        let resp = c.get(url, Some(&last)).await;
        assert_eq!(resp.status(), 200, "call {id}: resume from {last}");
        s = SseStream::new(resp);
    }
}

/// One replica of `release` (or of this tree, given `None`) on `redis` with `flags`.
async fn replica(release: Option<&Path>, redis: &RedisServer, flags: &[&str]) -> Fleet {
    let mut b = Fleet::builder().redis(redis.url());
    if let Some(r) = release {
        b = b.release(r);
    }
    for f in flags {
        b = b.arg(*f);
    }
    b.start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_and_its_rollback_under_load_lose_nothing() {
    let release = tokio::task::spawn_blocking(mcpfleet_fleetkit::previous_release).await.unwrap();
    let redis = RedisServer::start();
    // One PostgreSQL, installed by the release (its migrations), with the audit trail on every replica.
    let pg = mcpfleet_fleetkit::PostgresServer::start();
    pg.create_database("fleet");
    let db = pg.url_for("fleet");
    let migrate = |bin: &Path| {
        let out = Command::new(bin).args(["migrate", "--database-url", &db]).output().unwrap();
        assert!(out.status.success(), "{} migrate: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    };
    migrate(&release);
    let flags = [
        "--quota",
        "test_simple_text=1000000/1h",
        "--task-workers",
        "2",
        "--shutdown-grace",
        "20s",
        "--database-url",
        &db,
    ];
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(replica(Some(&release), &redis, &flags).await);
    }
    let proxy = Arc::new(RoundRobinProxy::start(fleet.iter().map(|f| f.bases()[0].clone()).collect()).await);
    let url = proxy.url();
    let done = Arc::new(AtomicBool::new(false));

    // The load, through the proxy for the whole rollout: sessions calling a tool, sessions following countdowns
    // to their answers across drains, and tasks.
    let calls = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for _ in 0..3 {
        let (url, done, calls) = (url.clone(), done.clone(), calls.clone());
        load.push(tokio::spawn(async move {
            let mut c = McpClient::new();
            c.initialize(&url).await;
            let mut id = 1;
            while !done.load(Ordering::Relaxed) {
                let r = c.request(&url, id, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
                assert!(text_of(&r).starts_with("This is a simple text"), "call {id}: {r}");
                calls.fetch_add(1, Ordering::Relaxed);
                id += 1;
            }
            0
        }));
    }
    for _ in 0..2 {
        let (url, done) = (url.clone(), done.clone());
        load.push(tokio::spawn(async move {
            let mut c = McpClient::new();
            c.initialize(&url).await;
            let (mut id, mut resumes) = (1, 0);
            while !done.load(Ordering::Relaxed) {
                let (events, r) = countdown_to_the_end(&c, &url, id, 15).await;
                let msgs = data_messages(&events);
                assert_eq!(progress_values(&msgs), (1..=15).collect::<Vec<_>>(), "call {id}: every event once");
                assert_eq!(msgs.last().unwrap()["result"]["content"][0]["text"], "counted to 15");
                let ids: Vec<_> = events.iter().filter_map(|e| e.id.clone()).collect();
                assert_eq!(ids.len(), ids.iter().collect::<std::collections::BTreeSet<_>>().len(), "no event twice");
                resumes += r;
                id += 1;
            }
            resumes
        }));
    }
    let tasks = json!({ "elicitation": {}, "extensions": { "io.modelcontextprotocol/tasks": {} } });
    let tasker = StatelessClient::new().with_capabilities(tasks);
    let mut task_ids = Vec::new();

    // Roll each replica to this tree, one at a time (a new one ready, traffic moved, the old one drained), then
    // back to the release the same way.
    let started = Instant::now();
    for to in [None, Some(release.as_path())] {
        // The chart's pre-upgrade hook: this tree's migrations before its first replica (expand-only: the
        // release's replicas serve on); a rollback runs none.
        if to.is_none() {
            migrate(&mcpfleet_fleetkit::server_bin());
        }
        for (i, slot) in fleet.iter_mut().enumerate() {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let r = tasker.call(&url, 1, "slow_job", json!({ "seconds": 1 }), json!({})).await;
            assert_eq!(r["result"]["resultType"], "task", "{r}");
            task_ids.push(r["result"]["taskId"].as_str().unwrap().to_owned());
            let next = replica(to, &redis, &flags).await;
            proxy.replace(i, next.bases()[0].clone());
            let mut old = std::mem::replace(slot, next);
            old.replicas[0].terminate();
            let code = tokio::task::spawn_blocking(move || old.replicas[0].wait_exit(30)).await.unwrap();
            assert_eq!(code, Some(0), "replica {i} drained and exited");
        }
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    done.store(true, Ordering::Relaxed);
    let mut resumes = 0;
    for l in load {
        resumes += l.await.expect("a load task failed: see its panic above");
    }
    let calls = calls.load(Ordering::Relaxed);
    eprintln!("rollout and rollback in {:?}: {calls} calls, {resumes} resumes", started.elapsed());
    assert!(calls > 0);

    // The quota's window is one for the fleet: every call counted once, whichever version admitted it.
    let windows = redis.raw(&["--scan", "--pattern", "*:q:test_simple_text"]);
    let counted: u64 = windows.lines().map(|k| redis.raw(&["GET", k]).trim().parse::<u64>().unwrap()).sum();
    assert_eq!(counted, calls, "one shared quota window ({windows:?})");
    // Every task created during the rollout completed, on whichever replica.
    for id in &task_ids {
        let t = tasker.poll_task(std::slice::from_ref(&url), id, 30, terminal).await;
        assert_eq!(t["status"], "completed", "{t}");
    }

    // The audit trail: every call of the tool in it once, whichever version served it, and nine chains (one per
    // replica that ran), each ended by its drain and intact, as either version verifies them.
    drop(proxy);
    for mut f in fleet {
        f.replicas[0].terminate();
        let code = tokio::task::spawn_blocking(move || f.replicas[0].wait_exit(30)).await.unwrap();
        assert_eq!(code, Some(0));
    }
    let rows = pg.psql("fleet", "SELECT count(*) FROM audit_events WHERE kind = 'call' AND tool = 'test_simple_text'");
    assert_eq!(rows.trim().parse::<u64>().unwrap(), calls, "every call audited once");
    for bin in [mcpfleet_fleetkit::server_bin(), release.clone()] {
        let out = Command::new(&bin).args(["audit", "verify", "--database-url", &db]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{} audit verify: {text}", bin.display());
        assert!(text.contains("verified 9 chains") && text.contains("9 ended, 0 open, 0 tampered"), "{text}");
    }
}

/// `mcpfleet serve` of this tree on the Redis at `redis_url`, run to its exit (killed after 20 s): its exit code and
/// stderr.
fn serve_to_exit_at(redis_url: &str) -> (Option<i32>, String) {
    let mut child = Command::new(mcpfleet_fleetkit::server_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--redis-url", redis_url])
        .args(["--request-state-key", mcpfleet_fleetkit::TEST_STATE_KEY])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refuses_to_join_a_fleet_whose_layout_it_cannot_share() {
    let redis = RedisServer::start();
    // The release (which records no declaration) and this tree share a fleet; this tree's replica records its own.
    let (_old, _new) = old_and_new_with(&redis, &[]).await;
    // Each records itself on its first membership beat, right after it starts.
    let mine = mcpfleet_state::layout::Layout::current().encode();
    mcpfleet_fleetkit::eventually(10, "two live members, one declaration: this tree's", || async {
        redis.raw(&["ZCARD", "mcp:{fleet}:members"]).trim() == "2"
            && redis.raw(&["HVALS", "mcp:{fleet}:layout"]).trim() == mine
    })
    .await;

    // A replica of a later release that writes the event log at version 3 joins (its record, as it would write it).
    let later = mcpfleet_state::layout::Layout::of(&[("events", mcpfleet_state::layout::Version::only(3))]);
    let far =
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() + 60_000).to_string();
    assert_eq!(redis.raw(&["ZADD", "mcp:{fleet}:members", &far, "later-1"]).trim(), "1");
    assert_eq!(redis.raw(&["HSET", "mcp:{fleet}:layout", "later-1", &later.encode()]).trim(), "1");
    let url = redis.url();
    let (code, err) = tokio::task::spawn_blocking(move || serve_to_exit_at(&url)).await.unwrap();
    assert_eq!(code, Some(78), "refused before it serves: {err}");
    let line = err.lines().find(|l| l.starts_with("mcpfleet: ")).unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(line.contains("events at version 3") && line.contains("cannot share a fleet"), "{line}");

    // Gone (its record expired, or it left), the fleet is one this tree shares again.
    assert_eq!(redis.raw(&["ZREM", "mcp:{fleet}:members", "later-1"]).trim(), "1");
    let fleet = Fleet::builder().redis(redis.url()).start().await;
    assert_eq!(fleet.replicas.len(), 1);
}
