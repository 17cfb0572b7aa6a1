//! End-to-end: the fixtures of the benchmark's realistic work (`tests/cost.sh` with `SET=realistic`, issue 32) on a
//! real replica with a real Redis, checked the way `mcpfleet-bench --op progress|blob|resume|task` checks them:
//! `bench_progress` sends exactly 5 progress notifications over the call's SSE stream and then answers; the stream
//! replays from its priming event after its end; `bench_blob` answers 65 536 bytes of text in both generations; a
//! `slow_job` of 0 s is a task polled to its result.

use mcpfleet_fleetkit::{JwtFleet, SseStream, data_messages, progress_values};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
const TASKS: &str = "io.modelcontextprotocol/tasks";

fn text_of(response: &Value) -> &str {
    response["result"]["content"][0]["text"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_progress_streams_five_notifications_then_its_answer_and_replays_them_from_the_priming_event() {
    let s = JwtFleet::start(1, &[]).await;
    let url = s.url(0);
    let mut c = s.client("alice");
    c.initialize(&url).await;

    // With a progressToken: the priming event, 5 notifications, the answer, and the end of the stream.
    let events = c.call_streaming(&url, 7, "bench_progress", json!({})).await.collect(T).await.expect("the stream");
    let priming = &events[0];
    assert_eq!(priming.data, "", "the priming event first: {events:?}");
    let cursor = priming.id.clone().expect("the priming event has an id");
    let messages = data_messages(&events);
    assert_eq!(progress_values(&messages), vec![1, 2, 3, 4, 5]);
    for m in messages.iter().filter(|m| m["method"] == "notifications/progress") {
        assert_eq!((m["params"]["progressToken"].clone(), m["params"]["total"].as_f64()), (json!(7), Some(5.0)), "{m}");
    }
    assert_eq!(messages.len(), 6, "5 notifications and the answer: {messages:?}");
    let answer = &messages[5];
    assert_eq!(answer["id"], 7);
    assert_eq!(text_of(answer), "sent 5 progress notifications");

    // Resumed from the priming event once the stream has ended: the same events, with the same ids, then the end.
    let resp = c.get(&url, Some(&cursor)).await;
    assert_eq!(resp.status(), 200);
    let replayed = SseStream::new(resp).collect(T).await.expect("the replay");
    let ids = |events: &[mcpfleet_fleetkit::SseEvent]| -> Vec<Option<String>> {
        events.iter().filter(|e| !e.data.is_empty()).map(|e| e.id.clone()).collect()
    };
    assert_eq!(ids(&replayed), ids(&events[1..]), "{replayed:?}");
    assert_eq!(data_messages(&replayed), messages);

    // Without a progressToken: nothing to stream, the answer as JSON.
    let body = json!({ "jsonrpc": "2.0", "id": 8, "method": "tools/call",
        "params": { "name": "bench_progress", "arguments": {} } });
    let resp = c.post(&url, &body).await;
    assert_eq!(resp.status(), 200);
    let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(ct.starts_with("application/json"), "{ct}");
    let r: Value = resp.json().await.expect("json");
    assert_eq!(text_of(&r), "sent 5 progress notifications");

    // A closed schema: an argument it does not declare is refused before the tool runs.
    let r = c.request(&url, 9, "tools/call", json!({ "name": "bench_progress", "arguments": { "n": 1 } })).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_blob_answers_64_kib_and_a_quick_task_is_polled_to_its_result() {
    let s = JwtFleet::start(1, &[]).await;
    let url = s.url(0);
    let mut c = s.client("alice");
    c.initialize(&url).await;

    // 65 536 bytes of text, in a 2025 session and in a 2026-07-28 request.
    let r = c.request(&url, 1, "tools/call", json!({ "name": "bench_blob", "arguments": {} })).await;
    assert_eq!(r["result"]["content"].as_array().map(Vec::len), Some(1), "one block");
    assert_eq!(text_of(&r).len(), 65_536);
    assert!(text_of(&r).bytes().all(|b| b == b'x'));
    let stateless = s.stateless("alice");
    let r = stateless.call(&url, 2, "bench_blob", json!({}), json!({})).await;
    assert_eq!((r["result"]["resultType"].clone(), text_of(&r).len()), (json!("complete"), 65_536));
    let r = c.request(&url, 3, "tools/call", json!({ "name": "bench_blob", "arguments": { "kib": 1 } })).await;
    assert_eq!(r["result"]["isError"], true, "closed: {r}");

    // The task workload: slow_job of 0 s, created, then polled with tasks/get until it has its result.
    let tasks = stateless.with_capabilities(json!({ "extensions": { TASKS: {} } }));
    let r = tasks.call(&url, 4, "slow_job", json!({ "seconds": 0 }), json!({})).await;
    assert_eq!(r["result"]["resultType"], "task", "{r}");
    let id = r["result"]["taskId"].as_str().expect("a task id").to_owned();
    let deadline = Instant::now() + T;
    let done = loop {
        let (status, r) = tasks.request(&url, 5, "tasks/get", json!({ "taskId": id })).await;
        assert_eq!(status, 200, "{r}");
        match r["result"]["status"].as_str() {
            Some("working") => assert!(Instant::now() < deadline, "still working after {T:?}"),
            Some("completed") => break r,
            _ => panic!("{r}"),
        }
    };
    assert_eq!(done["result"]["result"]["content"][0]["text"], "slow_job: done after 0 s", "{done}");
}
