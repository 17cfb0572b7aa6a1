//! End-to-end: the tasks extension (`io.modelcontextprotocol/tasks`) on a fleet of real replicas sharing one Redis
//! of the suite's own. A task is created on one replica, polled, answered and cancelled on the others, outlives its
//! client's connection, survives the death of the replica running it (run again, or failed with an explanation),
//! and is handed back when its replica shuts down; another principal learns nothing, and the cap and the quota
//! hold across replicas.

use mcpfleet_fleetkit::StatelessClient;
use mcpfleet_fleetkit::{JwtFleet, SseStream, eventually};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const EXT: &str = "io.modelcontextprotocol/tasks";
const T: Duration = Duration::from_secs(10);

/// A client of `sub` that declares the extension (and elicitation).
fn tasks_client(s: &JwtFleet, sub: &str) -> StatelessClient {
    s.stateless(sub).with_capabilities(json!({ "elicitation": {}, "extensions": { EXT: {} } }))
}

/// Calls `tool` and returns its task id (the answer must be a `CreateTaskResult`).
async fn create(c: &StatelessClient, url: &str, tool: &str, args: Value) -> String {
    let r = c.call(url, 1, tool, args, json!({})).await;
    let res = &r["result"];
    assert_eq!(res["resultType"], "task", "{tool}: {r}");
    assert!(res.get("result").is_none() && res.get("requestState").is_none(), "{r}");
    res["taskId"].as_str().unwrap_or_else(|| panic!("no taskId: {r}")).to_owned()
}

/// `tasks/get`: the HTTP status and the JSON-RPC response.
async fn get(c: &StatelessClient, url: &str, task: &str) -> (u16, Value) {
    c.request(url, 2, "tasks/get", json!({ "taskId": task })).await
}

fn status_is(s: &'static str) -> impl Fn(&Value) -> bool {
    move |t| t["status"] == s
}

fn terminal(t: &Value) -> bool {
    matches!(t["status"].as_str(), Some("completed" | "failed" | "cancelled"))
}

fn text(t: &Value) -> String {
    t["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

/// `mcp_tasks_running` of each replica.
async fn running(s: &JwtFleet) -> Vec<f64> {
    let mut out = Vec::new();
    for r in &s.fleet.replicas {
        out.push(mcpfleet_fleetkit::scrape(&r.admin()).await.get("mcp_tasks_running").copied().unwrap_or(0.0));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_lives_in_the_fleet_not_in_a_replica_or_a_connection() {
    let s = JwtFleet::start(3, &[]).await;
    let urls: Vec<String> = (0..3).map(|i| s.url(i)).collect();
    let alice = tasks_client(&s, "alice");
    // Created on A: the handle, flat, with the wire fields in milliseconds.
    let r = alice.call(&urls[0], 1, "slow_job", json!({ "seconds": 1 }), json!({})).await;
    let created = &r["result"];
    assert_eq!((created["resultType"].clone(), created["status"].clone()), (json!("task"), json!("working")), "{r}");
    let id = created["taskId"].as_str().unwrap().to_owned();
    assert!(id.len() >= 22, "at least 128 random bits: {id}");
    assert!(
        created["ttlMs"].as_u64().is_some_and(|t| t >= 3_600_000) && created["pollIntervalMs"].as_u64() == Some(2000)
    );
    assert!(created["createdAt"].as_str().is_some_and(|c| c.ends_with('Z') && c.len() == 24), "{created}");
    // Durable before the handle left A: B knows it at once.
    let (status, on_b) = get(&alice, &urls[1], &id).await;
    assert_eq!(status, 200);
    assert_eq!(on_b["result"]["taskId"], json!(id));
    assert_eq!(on_b["result"]["resultType"], "complete");
    // A new client (a new connection, as after a restart) on C follows it to its end.
    let later = tasks_client(&s, "alice");
    let done = later.poll_task(&urls[2..], &id, 10, status_is("completed")).await;
    assert_eq!(text(&done), "slow_job: done after 1 s");
    assert!(done.get("inputRequests").is_none() && done.get("error").is_none() && done.get("requestState").is_none());
    // It stays readable (its TTL is an hour), on every replica.
    for u in &urls {
        assert_eq!(get(&alice, u, &id).await.1["result"]["status"], "completed");
    }
    // A poll is one Redis round trip: the admission script and the record's read, pipelined.
    let b = s.fleet.replicas[1].admin();
    let trips = |kind: &'static str| {
        let b = b.clone();
        async move {
            let m = mcpfleet_fleetkit::scrape(&b).await;
            m.get(&format!("mcp_redis_command_duration_seconds_count{{kind=\"{kind}\"}}")).copied().unwrap_or(0.0)
        }
    };
    let (admits, reads) = (trips("admit").await, trips("task_get").await);
    for _ in 0..20 {
        assert_eq!(get(&alice, &urls[1], &id).await.0, 200);
    }
    assert_eq!((trips("admit").await - admits, trips("task_get").await - reads), (20.0, 0.0));

    // Another principal learns nothing: the same answer as an id that never existed, for every method.
    let bob = tasks_client(&s, "bob");
    let unknown = "AAAAAAAAAAAAAAAAAAAAAAAA";
    for (method, params) in [
        ("tasks/get", json!({})),
        ("tasks/update", json!({ "inputResponses": { "confirm": { "action": "accept" } } })),
        ("tasks/cancel", json!({})),
    ] {
        let ask = |task: &str| {
            let mut p = params.clone();
            p["taskId"] = json!(task);
            p
        };
        let (s1, theirs) = bob.request(&urls[1], 3, method, ask(&id)).await;
        let (s2, none) = bob.request(&urls[1], 3, method, ask(unknown)).await;
        assert_eq!((s1, s2), (200, 200));
        assert_eq!(theirs["error"]["code"], -32602, "{method}: {theirs}");
        assert_eq!(theirs, none, "{method}: another principal's task looks unknown");
    }
    assert_eq!(get(&alice, &urls[0], &id).await.1["result"]["status"], "completed", "bob changed nothing");

    // Without the extension on the request: the task methods and an always-a-task tool are refused (-32021, 400,
    // naming the extension); a tool that may become a task runs inline.
    let plain = s.stateless("alice").with_capabilities(json!({}));
    let (status, r) = get(&plain, &urls[0], &id).await;
    assert_eq!((status, r["error"]["code"].clone()), (400, json!(-32021)), "{r}");
    assert_eq!(r["error"]["data"]["requiredCapabilities"], json!({ "extensions": { EXT: {} } }));
    let resp = plain
        .send(&urls[1], &plain.body(4, "tools/call", json!({ "name": "slow_job", "arguments": { "seconds": 1 } })), &[])
        .await;
    assert_eq!(resp.status(), 400);
    let r: Value = resp.json().await.unwrap();
    assert_eq!(r["error"]["code"], -32021, "{r}");
    let r = plain.call(&urls[2], 5, "slow_compute", json!({ "seconds": 1, "label": "inline" }), json!({})).await;
    assert_eq!((r["result"]["resultType"].clone(), r["result"].get("taskId")), (json!("complete"), None), "{r}");
    // A 2025-generation session runs even an always-a-task tool inline.
    let mut legacy = s.client("alice");
    legacy.initialize(&urls[0]).await;
    let r =
        legacy.request(&urls[1], 6, "tools/call", json!({ "name": "slow_job", "arguments": { "seconds": 1 } })).await;
    assert_eq!(r["result"]["content"][0]["text"], "slow_job: done after 1 s", "{r}");

    // Under an idempotency key, a repeat (on another replica) gets the same task, not a second one.
    let keyed = json!({ "_meta": { "io.mcpfleet/idempotencyKey": "export-42" } });
    let first = alice.call(&urls[0], 7, "slow_job", json!({ "seconds": 1 }), keyed.clone()).await;
    let again = alice.call(&urls[2], 8, "slow_job", json!({ "seconds": 1 }), keyed).await;
    assert_eq!(first["result"]["resultType"], "task", "{first}");
    assert_eq!(first["result"]["taskId"], again["result"]["taskId"], "{again}");
    let replayed = "mcp_tool_calls_total{outcome=\"replayed\",tool=\"slow_job\"}";
    assert_eq!(s.metric(replayed).await, 1.0, "a repeat is a replay");

    // A call that may become a task does, after its delay, and keeps running where it started.
    let started = Instant::now();
    let id = create(&alice, &urls[0], "slow_compute", json!({ "seconds": 2, "label": "converted" })).await;
    assert!(started.elapsed() < Duration::from_millis(1500), "the handle comes after the delay, not the result");
    let done = alice.poll_task(&urls[1..], &id, 10, terminal).await;
    assert_eq!(
        (done["status"].clone(), text(&done)),
        (json!("completed"), "slow_compute converted: done after 2 s".into())
    );

    // A result larger than a task keeps ends the task failed, never truncated; a small one completes.
    let big = create(&alice, &urls[1], "big_result", json!({ "kib": 1100 })).await;
    let t = alice.poll_task(&urls, &big, 10, terminal).await;
    assert_eq!(t["status"], "failed", "{}", t["statusMessage"]);
    assert!(t["error"]["message"].as_str().unwrap().contains("more than a task may keep"), "{}", t["error"]);
    assert!(t.get("result").is_none());
    let small = create(&alice, &urls[1], "big_result", json!({ "kib": 10 })).await;
    let t = alice.poll_task(&urls, &small, 10, terminal).await;
    assert_eq!((t["status"].clone(), text(&t).len()), (json!("completed"), 10 * 1024));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_and_cancellation_reach_a_task_from_any_replica() {
    let s = JwtFleet::start(3, &[]).await;
    let urls: Vec<String> = (0..3).map(|i| s.url(i)).collect();
    let alice = tasks_client(&s, "alice");
    let id = create(&alice, &urls[0], "confirm_delete", json!({ "filename": "report.pdf" })).await;
    // A listen stream on C, for this task only.
    let filter = json!({ "notifications": { "taskIds": [id] } });
    let mut stream = SseStream::new(alice.send(&urls[2], &alice.body(40, "subscriptions/listen", filter), &[]).await);
    let ack = stream.until_method("notifications/subscriptions/acknowledged", T).await.unwrap();
    assert_eq!(ack["params"]["notifications"]["taskIds"], json!([id]));
    // The task asks through the task: B shows the request.
    let t = alice.poll_task(&urls[1..2], &id, 10, status_is("input_required")).await;
    let requests = t["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1, "{t}");
    assert_eq!(requests["confirm"]["method"], "elicitation/create");
    // Answered on C, with a key nobody asked for (ignored): an empty acknowledgment.
    let answers = json!({ "confirm": { "action": "accept", "content": { "confirm": true } }, "other": { "x": 1 } });
    let (status, ack) =
        alice.request(&urls[2], 41, "tasks/update", json!({ "taskId": id, "inputResponses": answers })).await;
    assert_eq!(
        (status, ack["result"].clone()),
        (200, json!({ "resultType": "complete", "_meta": ack["result"]["_meta"] }))
    );
    let done = alice.poll_task(&urls[..1], &id, 10, terminal).await;
    assert_eq!(text(&done), "Deleted report.pdf (not really: this is a fixture).");
    // The listen stream on C heard the end, from whichever replica ran the task.
    let n = loop {
        let n = stream.until_method("notifications/tasks", T).await.unwrap();
        if n["params"]["status"] == "completed" {
            break n;
        }
    };
    assert_eq!(n["params"]["taskId"], json!(id));
    assert_eq!(n["params"]["result"]["content"][0]["text"], "Deleted report.pdf (not really: this is a fixture).");
    assert_eq!(n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], json!(40));
    // Asking for task notifications needs the extension too.
    let plain = s.stateless("alice").with_capabilities(json!({}));
    for ids in [json!([id]), json!(["not-a-task-id"])] {
        let listen = plain.body(42, "subscriptions/listen", json!({ "notifications": { "taskIds": ids } }));
        let resp = plain.send(&urls[0], &listen, &[]).await;
        assert_eq!(resp.status(), 400);
        let r: Value = resp.json().await.unwrap();
        assert_eq!(r["error"]["code"], -32021, "{r}");
    }

    // A task that asks for input the creating request cannot take fails with -32021, naming what is missing.
    let mute = s.stateless("alice").with_capabilities(json!({ "extensions": { EXT: {} } }));
    let id = create(&mute, &urls[0], "confirm_delete", json!({ "filename": "x.txt" })).await;
    let t = mute.poll_task(&urls[1..], &id, 10, terminal).await;
    assert_eq!((t["status"].clone(), t["error"]["code"].clone()), (json!("failed"), json!(-32021)), "{t}");
    assert_eq!(t["error"]["data"]["requiredCapabilities"], json!({ "elicitation": {} }));

    // Cancelled while it waits for input: it ends cancelled, not with the tool's complaint.
    let waiting = create(&alice, &urls[1], "confirm_delete", json!({ "filename": "keep.txt" })).await;
    alice.poll_task(&urls[..1], &waiting, 10, status_is("input_required")).await;
    alice.request(&urls[2], 45, "tasks/cancel", json!({ "taskId": waiting })).await;
    let t = alice.poll_task(&urls, &waiting, 5, terminal).await;
    assert_eq!(t["status"], "cancelled", "{t}");

    // Cancelled on B while it runs: the tool stops, and the task ends cancelled.
    let id = create(&alice, &urls[0], "slow_job", json!({ "seconds": 60 })).await;
    eventually(10, "the task runs", || async { running(&s).await.iter().sum::<f64>() >= 1.0 }).await;
    let (status, ack) = alice.request(&urls[1], 43, "tasks/cancel", json!({ "taskId": id })).await;
    assert_eq!(status, 200);
    assert!(["taskId", "status", "result", "error", "inputRequests"].iter().all(|k| ack["result"].get(k).is_none()));
    let t = alice.poll_task(&urls[2..], &id, 5, terminal).await;
    assert_eq!(t["status"], "cancelled");
    eventually(5, "the tool stopped", || async {
        s.metric("mcp_tool_calls_total{outcome=\"cancelled\",tool=\"slow_job\"}").await >= 1.0
            && running(&s).await.iter().sum::<f64>() == 0.0
    })
    .await;
    // A terminal task never changes: cancelling again is acknowledged, and nothing moves.
    let (_, again) = alice.request(&urls[0], 44, "tasks/cancel", json!({ "taskId": id })).await;
    assert_eq!(again["result"]["resultType"], "complete");
    assert_eq!(get(&alice, &urls[1], &id).await.1["result"]["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_tasks_run_again_or_fail_with_an_explanation() {
    // Five replicas for four tasks: whichever replicas take them, one is left to take them over. The tasks run 6 s:
    // all four are still running when their replicas are killed, however slowly the creates went.
    let mut s = JwtFleet::start(5, &["--task-lease", "1s", "--redis-timeout", "300ms"]).await;
    let urls: Vec<String> = (0..5).map(|i| s.url(i)).collect();
    let alice = tasks_client(&s, "alice");
    let rerun = create(&alice, &urls[0], "slow_job", json!({ "seconds": 6 })).await;
    let fragile = create(&alice, &urls[0], "fragile_job", json!({ "seconds": 6 })).await;
    // A call that became a task where it ran (on A), re-runnable.
    let converted = create(&alice, &urls[0], "slow_compute", json!({ "seconds": 6, "label": "moved" })).await;
    let abandoned = create(&alice, &urls[0], "fragile_job", json!({ "seconds": 6 })).await;
    eventually(10, "all four run", || async { running(&s).await.iter().sum::<f64>() >= 4.0 }).await;
    // SIGKILL every replica that runs one of them.
    let held = running(&s).await;
    let dead: Vec<usize> = (0..5).filter(|i| held[*i] > 0.0).collect();
    let survivors: Vec<usize> = (0..5).filter(|i| held[*i] == 0.0).collect();
    let alive: Vec<String> = survivors.iter().map(|i| urls[*i].clone()).collect();
    assert!(!alive.is_empty(), "a replica must survive: {held:?}");
    let killed = Instant::now();
    for i in &dead {
        s.fleet.replicas[*i].kill();
    }
    // Its client gives up on one while its replica is dead: the sweeper ends it cancelled, not failed.
    alice.request(&alive[0], 9, "tasks/cancel", json!({ "taskId": abandoned })).await;
    // Never silent: the one that may not run twice fails and says why, within the lease and a sweep.
    let t = alice.poll_task(&alive, &fragile, 20, terminal).await;
    assert_eq!(t["status"], "failed", "{t}");
    assert!(killed.elapsed() < Duration::from_secs(5), "failed within the lease and a sweep: {:?}", killed.elapsed());
    let message = t["error"]["message"].as_str().unwrap();
    assert!(message.contains("may be half done") && message.contains("fragile_job"), "{message}");
    assert_eq!(t["statusMessage"].as_str(), Some(message));
    assert!(t.get("result").is_none());
    assert_eq!(alice.poll_task(&alive, &abandoned, 5, terminal).await["status"], "cancelled");
    // Within the lease, the sweep and a second run: the re-runnable ones complete elsewhere.
    for id in [&rerun, &converted] {
        let t = alice.poll_task(&alive, id, 25, terminal).await;
        assert_eq!(t["status"], "completed", "{t}");
    }
    assert!(
        killed.elapsed() < Duration::from_secs(18),
        "reclaimed within lease + sweep + a run: {:?}",
        killed.elapsed()
    );
    // The survivors' sweepers counted what they did.
    let mut reclaims = std::collections::BTreeMap::new();
    for i in &survivors {
        for (k, v) in mcpfleet_fleetkit::scrape(&s.fleet.replicas[*i].admin()).await {
            if k.starts_with("mcp_task_reclaims_total") {
                *reclaims.entry(k).or_insert(0.0) += v;
            }
        }
    }
    let count = |o: &str| reclaims.get(&format!("mcp_task_reclaims_total{{outcome=\"{o}\"}}")).copied().unwrap_or(0.0);
    assert!(count("rerun") >= 2.0 && count("failed_replica_lost") >= 1.0, "{reclaims:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_shutting_down_hands_its_tasks_back_and_loses_none() {
    // One worker per replica and a long lease: only a hand-back explains a task finishing fast elsewhere.
    let mut s = JwtFleet::start(2, &["--task-lease", "60s", "--task-workers", "1", "--shutdown-grace", "20s"]).await;
    let urls: Vec<String> = (0..2).map(|i| s.url(i)).collect();
    let alice = tasks_client(&s, "alice");
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(create(&alice, &urls[0], "slow_job", json!({ "seconds": 3 })).await);
    }
    let fragile = create(&alice, &urls[0], "fragile_job", json!({ "seconds": 2 })).await;
    eventually(10, "both replicas run a task", || async { running(&s).await.iter().all(|n| *n >= 1.0) }).await;
    let stopped = Instant::now();
    s.fleet.replicas[0].terminate();
    // Every task completes, none waits for a lease; the non-re-runnable one finished on its own replica or
    // elsewhere, within the grace, never run twice.
    for id in ids.iter().chain([&fragile]) {
        let t = alice.poll_task(&urls[1..], id, 40, terminal).await;
        assert_eq!(t["status"], "completed", "{t}");
    }
    assert!(stopped.elapsed() < Duration::from_secs(30), "no lease expiry needed: {:?}", stopped.elapsed());
    assert_eq!(s.fleet.replicas[0].wait_exit(20), Some(0), "the replica drained and exited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_cap_and_the_quota_hold_across_replicas() {
    let s = JwtFleet::start(3, &["--max-tasks-per-user", "2", "--quota", "slow_job=3/1h"]).await;
    let urls: Vec<String> = (0..3).map(|i| s.url(i)).collect();
    let alice = tasks_client(&s, "alice");
    let first = create(&alice, &urls[0], "slow_job", json!({ "seconds": 60 })).await;
    let _second = create(&alice, &urls[1], "slow_job", json!({ "seconds": 60 })).await;
    // A third open task, on the third replica: 429, naming the cap.
    let body = alice.body(3, "tools/call", json!({ "name": "slow_job", "arguments": { "seconds": 60 } }));
    let resp = alice.send(&urls[2], &body, &[]).await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().get("retry-after").is_some());
    let r: Value = resp.json().await.unwrap();
    assert_eq!(r["error"]["data"]["limit"], "tasks", "{r}");
    assert_eq!(r["error"]["data"]["cap"], 2);
    let refused = "mcp_tool_calls_total{outcome=\"refused_by_limit\",tool=\"slow_job\"}";
    assert_eq!(s.metric(refused).await, 1.0, "counted and audited like any refused call");
    // Bob has his own cap.
    let bob = tasks_client(&s, "bob");
    create(&bob, &urls[2], "slow_job", json!({ "seconds": 1 })).await;
    // Polls cost no quota, however many.
    for i in 0..20 {
        assert_eq!(get(&alice, &urls[i % 3], &first).await.0, 200);
    }
    // Cancelling one frees its place; the quota (3 per hour, charged once per task, and not for the refused
    // one) allows one more task, then refuses with a result for the model.
    alice.request(&urls[0], 4, "tasks/cancel", json!({ "taskId": first })).await;
    alice.poll_task(&urls, &first, 5, status_is("cancelled")).await;
    create(&alice, &urls[2], "slow_job", json!({ "seconds": 60 })).await;
    let r = alice.call(&urls[1], 5, "slow_job", json!({ "seconds": 60 }), json!({})).await;
    let refused = r["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(r["result"]["isError"] == true && refused.contains("Quota exhausted"), "{r}");
}
