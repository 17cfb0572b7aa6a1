//! End-to-end operability: what an SRE sees. Exact counters on `/metrics` after known traffic, health and
//! readiness, the access log and audit events, the hardening headers and timeouts, and the SIGTERM drain of a
//! real process under load. Real processes, real Redis.

use jsonwebtoken::Algorithm;
use mcpfleet_fleetkit::{
    Fleet, Issuer, McpClient, RedisServer, SseEvent, SseStream, TestKey, data_messages, eventually, progress_values,
    scrape,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn metric(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

fn call(id: i64, tool: &str, args: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": tool, "arguments": args } })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_exactly_what_happened() {
    let redis = RedisServer::start();
    let key = TestKey::load("ed-1", "ed", Algorithm::EdDSA);
    let issuer = Issuer::start(&[&key]).await;
    // Eight requests' worth of tokens that do not come back during the test, and one test_simple_text an hour.
    let fleet = Fleet::builder()
        .redis(redis.url())
        .jwt(&issuer)
        .arg("--rate-burst")
        .arg("8")
        .arg("--rate-per-second")
        .arg("0.001")
        .arg("--quota")
        .arg("test_simple_text=1/1h")
        .start()
        .await;
    let (url, admin) = (fleet.urls()[0].clone(), fleet.replicas[0].admin());
    let before = scrape(&admin).await;
    assert!(before.contains_key("process_cpu_seconds_total"), "process metrics");
    assert!(before.contains_key("process_resident_memory_bytes"));

    // Tokens 1 and 2.
    let mut c = McpClient::new().with_token(&key.token(&issuer.id(), "alice").sign());
    c.initialize(&url).await;
    // 3 to 6: ok, isError, unknown tool, missing scope.
    let ok = c.request(&url, 1, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert!(ok["result"]["isError"].is_null());
    let err = c.request(&url, 2, "tools/call", json!({ "name": "test_error_handling", "arguments": {} })).await;
    assert_eq!(err["result"]["isError"], true);
    let unknown = c.request(&url, 3, "tools/call", json!({ "name": "no_such_tool", "arguments": {} })).await;
    assert_eq!(unknown["error"]["code"], -32602);
    assert_eq!(c.post(&url, &call(4, "test_whoami", json!({}))).await.status(), 403);
    // Not identified: no token taken.
    let anonymous = McpClient { token: None, ..c.clone() };
    assert_eq!(anonymous.post(&url, &call(5, "test_simple_text", json!({}))).await.status(), 401);
    // 7: the quota refuses, as a tool result.
    let quota = c.request(&url, 6, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert_eq!(quota["result"]["isError"], true);
    // 8: the last token.
    assert_eq!(c.post(&url, &json!({ "jsonrpc": "2.0", "id": 9, "method": "ping" })).await.status(), 200);
    // The bucket is empty: refused by Redis, then locally.
    for id in [7, 8] {
        let r = c.post(&url, &call(id, "test_simple_text", json!({}))).await;
        assert_eq!(r.status(), 429);
        assert!(r.headers().contains_key("retry-after"));
    }
    // The DELETE takes no token from the empty bucket, but one from the principal's control bucket.
    assert_eq!(c.delete(&url).await.status(), 200);

    let m = scrape(&admin).await;
    let exact = [
        (r#"mcp_tool_calls_total{outcome="ok",tool="test_simple_text"}"#, 1.0),
        (r#"mcp_tool_calls_total{outcome="is_error",tool="test_error_handling"}"#, 1.0),
        (r#"mcp_tool_calls_total{outcome="protocol_error",tool="unknown"}"#, 1.0),
        (r#"mcp_tool_calls_total{outcome="refused",tool="test_whoami"}"#, 1.0),
        (r#"mcp_tool_calls_total{outcome="refused_by_limit",tool="test_simple_text"}"#, 3.0),
        (r#"mcp_tool_call_duration_seconds_count{tool="test_simple_text"}"#, 1.0),
        (r#"mcp_tool_call_duration_seconds_count{tool="test_error_handling"}"#, 1.0),
        (r#"mcp_requests_total{method="initialize",status="200"}"#, 1.0),
        (r#"mcp_requests_total{method="notifications/initialized",status="202"}"#, 1.0),
        (r#"mcp_requests_total{method="tools/call",status="200"}"#, 4.0),
        (r#"mcp_requests_total{method="tools/call",status="403"}"#, 1.0),
        (r#"mcp_requests_total{method="tools/call",status="429"}"#, 2.0),
        (r#"mcp_requests_total{method="POST",status="401"}"#, 1.0),
        (r#"mcp_requests_total{method="DELETE",status="200"}"#, 1.0),
        (r#"mcp_requests_total{method="ping",status="200"}"#, 1.0),
        (r#"mcp_request_duration_seconds_count{method="tools/call"}"#, 7.0),
        (r#"mcp_auth_refusals_total{reason="missing_token"}"#, 1.0),
        (r#"mcp_auth_refusals_total{reason="insufficient_scope"}"#, 1.0),
        ("mcp_sessions_created_total", 1.0),
        ("mcp_sessions_deleted_total", 1.0),
        // 8 from the bucket, 1 (the DELETE) from the control bucket.
        (r#"mcp_limit_decisions_total{kind="rate",outcome="allowed"}"#, 9.0),
        (r#"mcp_limit_decisions_total{kind="rate",outcome="denied"}"#, 1.0),
        (r#"mcp_limit_decisions_total{kind="rate",outcome="denied_cached"}"#, 1.0),
        (r#"mcp_limit_decisions_total{kind="quota",outcome="allowed"}"#, 1.0),
        (r#"mcp_limit_decisions_total{kind="quota",outcome="denied"}"#, 1.0),
        // Tokens 7 and 8 left the bucket ≥ 80 % used; the 8th emptied it. The one allowed call used the quota up.
        (r#"mcp_limit_near_limit_total{kind="rate"}"#, 2.0),
        (r#"mcp_limit_exhausted_total{kind="rate"}"#, 1.0),
        (r#"mcp_limit_exhausted_total{kind="quota"}"#, 1.0),
        (r#"mcp_limit_fail_open_total{outcome="allowed"}"#, 0.0),
        // One admission per request that took a token from Redis: initialize (with the session's creation),
        // notifications/initialized, the three tools/call that ran, the scope refusal (charged after), the quota
        // refusal, the ping, the first 429, and the DELETE (then its delete). The second 429 never reached Redis; the 401
        // never reached the store.
        (r#"mcp_redis_command_duration_seconds_count{kind="admit"}"#, 10.0),
        (r#"mcp_redis_command_duration_seconds_count{kind="delete"}"#, 1.0),
    ];
    for (k, v) in exact {
        assert_eq!(metric(&m, k) - metric(&before, k), v, "{k}");
    }
    assert_eq!(metric(&m, r#"mcp_redis_errors_total{kind="admit"}"#), 0.0);
    assert_eq!(metric(&m, r#"mcp_sse_streams_open{kind="call"}"#), 0.0);
    // No unbounded label values: nothing that looks like a session id or a subject.
    let text = reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap();
    assert!(!text.contains("alice") && !text.contains(c.session.as_deref().unwrap()), "an unbounded label");
}

/// The raw `/metrics` text of a replica.
#[expect(clippy::unwrap_used, reason = "a test helper fails loudly")]
async fn metrics_text(admin: &str) -> String {
    reqwest::get(format!("{admin}/metrics")).await.unwrap().text().await.unwrap()
}

/// Whether `text` has exactly `line` (a series and its value, labels sorted by name as the encoder prints them).
fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_known_series_is_exported_before_its_first_event() {
    let redis = RedisServer::start();
    let key = TestKey::load("ed-1", "ed", Algorithm::EdDSA);
    let issuer = Issuer::start(&[&key]).await;
    let mut fleet = Fleet::builder().redis(redis.url()).jwt(&issuer).arg("--drain-delay").arg("3s").start().await;
    let (url, admin) = (fleet.urls()[0].clone(), fleet.replicas[0].admin());

    // Before any MCP request, and before any /readyz.
    let text = metrics_text(&admin).await;
    for line in [
        // Transport: a catalog tool under every outcome, the unknown tool, methods, statuses, streams, refusals.
        r#"mcp_tool_calls_total{outcome="ok",tool="test_simple_text"} 0"#,
        r#"mcp_tool_calls_total{outcome="handed_over",tool="test_simple_text"} 0"#,
        r#"mcp_tool_calls_total{outcome="protocol_error",tool="unknown"} 0"#,
        r#"mcp_tool_call_duration_seconds_count{tool="test_simple_text"} 0"#,
        r#"mcp_tool_call_duration_seconds_bucket{tool="test_simple_text",le="60"} 0"#,
        r#"mcp_tool_call_duration_seconds_bucket{tool="test_simple_text",le="120"} 0"#,
        r#"mcp_request_duration_seconds_count{method="tools/call"} 0"#,
        r#"mcp_request_duration_seconds_count{method="POST"} 0"#,
        r#"mcp_requests_total{method="tools/call",status="200"} 0"#,
        r#"mcp_requests_total{method="notifications/initialized",status="202"} 0"#,
        r#"mcp_sse_streams_open{kind="call"} 0"#,
        r#"mcp_sse_streams_open{kind="subscription"} 0"#,
        r#"mcp_auth_refusals_total{reason="invalid_token"} 0"#,
        r#"mcp_request_state_refusals_total{reason="bad_signature"} 0"#,
        // Tasks.
        r#"mcp_tasks_created_total{how="queued"} 0"#,
        r#"mcp_tasks_ended_total{status="failed"} 0"#,
        r#"mcp_task_reclaims_total{outcome="failed_replica_lost"} 0"#,
        // Limits: only the combinations that can occur.
        r#"mcp_limit_decisions_total{kind="rate",outcome="denied"} 0"#,
        r#"mcp_limit_decisions_total{kind="rate",outcome="unavailable"} 0"#,
        r#"mcp_limit_decisions_total{kind="tasks",outcome="denied"} 0"#,
        r#"mcp_limit_near_limit_total{kind="inflight"} 0"#,
        r#"mcp_limit_exhausted_total{kind="rate"} 0"#,
        r#"mcp_limit_store_failures_total{reason="breaker_open"} 0"#,
        r#"mcp_limit_fail_open_total{outcome="allowed"} 0"#,
        // Redis: every kind, before its first command.
        r#"mcp_redis_errors_total{kind="admit"} 0"#,
        r#"mcp_redis_errors_total{kind="task_dequeue"} 0"#,
        r#"mcp_redis_command_duration_seconds_count{kind="idem"} 0"#,
        // Keys and tokens.
        r#"mcp_jwks_refresh_total{result="error"} 0"#,
        r#"mcp_token_verifications_total{result="rejected"} 0"#,
        // Ready as soon as it serves: the store probe and the loaded keys set it, not a /readyz.
        "mcp_ready 1",
    ] {
        assert!(has_line(&text, line), "{line} is not exported at start:\n{text}");
    }
    assert!(!text.contains(r#"kind="tasks",outcome="allowed""#), "the task cap never counts allowed");
    assert!(!text.contains(r#"mcp_limit_exhausted_total{kind="sessions"}"#), "the session cap measures no use");
    // Every tool the catalog lists, under every outcome, at 0 (a token without scopes may see fewer of them).
    let outcomes = [
        "ok",
        "is_error",
        "protocol_error",
        "refused",
        "refused_by_policy",
        "refused_by_limit",
        "invalid_arguments",
        "cancelled",
        "session_gone",
        "panicked",
        "timeout",
        "input_required",
        "replayed",
        "handed_over",
    ];
    let seeded: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(r#"mcp_tool_calls_total{outcome="ok",tool=""#))
        .filter_map(|rest| rest.strip_suffix(r#""} 0"#))
        .collect();
    let mut c = McpClient::new().with_token(&key.token(&issuer.id(), "alice").sign());
    c.initialize(&url).await;
    let listed = c.request(&url, 1, "tools/list", json!({})).await;
    let listed: Vec<&str> =
        listed["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(listed.len() > 10 && listed.contains(&"test_simple_text"), "{listed:?}");
    for tool in &listed {
        assert!(seeded.contains(tool), "{tool} has no series at start: {seeded:?}");
        for outcome in outcomes {
            let line = format!(r#"mcp_tool_calls_total{{outcome="{outcome}",tool="{tool}"}} 0"#);
            assert!(has_line(&text, &line), "{line} is not exported at start");
        }
    }
    let families = text.lines().filter(|l| l.starts_with("mcp_tool_calls_total{")).count();
    assert_eq!(families, seeded.len() * outcomes.len() + 1, "the catalog's tools and the unknown tool, nothing else");

    // mcp_ready follows /readyz.
    assert_eq!(reqwest::get(format!("{admin}/readyz")).await.unwrap().status(), 200);
    assert!(has_line(&metrics_text(&admin).await, "mcp_ready 1"));
    // The drain lowers it at once; the admin listener answers during --drain-delay.
    fleet.replicas[0].terminate();
    let a = admin.clone();
    eventually(2, "mcp_ready 0 once the drain began", || {
        let a = a.clone();
        async move { has_line(&metrics_text(&a).await, "mcp_ready 0") }
    })
    .await;
    assert_eq!(reqwest::get(format!("{admin}/readyz")).await.unwrap().status(), 503);
    assert!(has_line(&metrics_text(&admin).await, "mcp_ready 0"), "still 0 after a /readyz during the drain");
    let code = tokio::task::spawn_blocking(move || fleet.replicas[0].wait_exit(20)).await.unwrap();
    assert_eq!(code, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_and_running_calls_are_counted_while_they_live() {
    let redis = RedisServer::start();
    let fleet = Fleet::builder().redis(redis.url()).start().await;
    let (url, admin) = (fleet.urls()[0].clone(), fleet.replicas[0].admin());
    let mut c = McpClient::new();
    c.initialize(&url).await;
    let listen = SseStream::new(c.get(&url, None).await);
    let mut s = c.call_streaming(&url, 1, "test_countdown", json!({ "count": 20, "interval_ms": 100 })).await;
    s.next(T).await.unwrap();
    let m = scrape(&admin).await;
    assert_eq!(metric(&m, r#"mcp_sse_streams_open{kind="call"}"#), 1.0);
    assert_eq!(metric(&m, r#"mcp_sse_streams_open{kind="listen"}"#), 1.0);
    assert_eq!(metric(&m, "mcp_tool_calls_in_flight"), 1.0, "the countdown runs");
    drop(listen);
    s.collect(T).await.unwrap();
    let admin2 = admin.clone();
    eventually(5, "both gauges back to 0", || {
        let a = admin2.clone();
        async move {
            let m = scrape(&a).await;
            metric(&m, r#"mcp_sse_streams_open{kind="call"}"#) == 0.0
                && metric(&m, r#"mcp_sse_streams_open{kind="listen"}"#) == 0.0
                && metric(&m, "mcp_tool_calls_in_flight") == 0.0
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness_follow_redis() {
    let redis = RedisServer::start();
    let fleet = Fleet::builder().redis(redis.url()).short_leases().start().await;
    let admin = fleet.replicas[0].admin();
    let get = |path: &'static str| {
        let admin = admin.clone();
        async move { reqwest::get(format!("{admin}{path}")).await.unwrap().status().as_u16() }
    };
    assert_eq!(get("/healthz").await, 200);
    assert_eq!(get("/readyz").await, 200);
    redis.signal("-STOP");
    // The probe (every second, one second to answer) notices; /readyz itself answers at once from what it found.
    eventually(5, "Redis frozen: not ready", || async { get("/readyz").await == 503 }).await;
    let started = std::time::Instant::now();
    assert_eq!(get("/readyz").await, 503);
    assert!(started.elapsed() < Duration::from_millis(500), "/readyz waits for nothing: {:?}", started.elapsed());
    assert_eq!(get("/healthz").await, 200, "liveness does not depend on Redis");
    redis.signal("-CONT");
    eventually(10, "ready again", || async { get("/readyz").await == 200 }).await;
    let body = reqwest::get(format!("{admin}/readyz")).await.unwrap().text().await.unwrap();
    assert_eq!(body, "ready\n", "readiness says nothing about sessions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_are_hardened_and_slow_clients_are_cut_off() {
    let fleet = Fleet::builder()
        .arg("--header-read-timeout")
        .arg("1s")
        .arg("--body-timeout")
        .arg("1s")
        .arg("--max-header-bytes")
        .arg("4096")
        .start()
        .await;
    let url = fleet.urls()[0].clone();
    let mut c = McpClient::new();
    c.initialize(&url).await;
    let ping = json!({ "jsonrpc": "2.0", "id": 1, "method": "ping" });
    let resp = c.post_with(&url, &ping, &[("x-request-id", "req-hardening-1")]).await;
    assert_eq!(resp.status(), 200);
    let h = resp.headers();
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["cache-control"], "no-store");
    assert_eq!(h["x-request-id"], "req-hardening-1");
    assert!(h.get("server").is_none(), "no server banner");
    // Errors are hardened too, and get a request id of their own.
    let resp = c.http.post(&url).body("{}").send().await.unwrap();
    assert_eq!(resp.status(), 415);
    assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
    assert_eq!(resp.headers()["x-request-id"].len(), 24);
    // SSE streams: no-store as well.
    let s = c.get(&url, None).await;
    assert!(s.headers()["cache-control"].to_str().unwrap().contains("no-store"));
    drop(s);

    // Oversized headers: 431.
    let resp = c.http.post(&url).header("x-padding", "p".repeat(5000)).body("{}").send().await.unwrap();
    assert_eq!(resp.status(), 431);

    let addr = url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    // A body that never arrives: 408 after the body timeout.
    let a = addr.clone();
    let got = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(&a).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            tcp,
            "POST /mcp HTTP/1.1\r\nHost: {a}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{"
        )
        .unwrap();
        let mut buf = [0_u8; 512];
        let n = tcp.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .unwrap();
    assert!(got.starts_with("HTTP/1.1 408"), "{got:?}");
    // A head that never ends: the connection is closed after the header read timeout.
    let a = addr.clone();
    let closed = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(&a).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(tcp, "POST /mcp HTTP/1.1\r\nHost: {a}\r\n").unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0_u8; 512];
        let n = tcp.read(&mut buf);
        (n.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned()).map_err(|e| e.kind()), started.elapsed())
    })
    .await
    .unwrap();
    match closed {
        (Ok(text), took) => {
            assert!(took < Duration::from_secs(4), "closed after the header timeout, not the client's: {took:?}");
            assert!(text.is_empty() || text.starts_with("HTTP/1.1 408"), "{text:?}");
        }
        (Err(kind), took) => panic!("the server kept a slow-header connection open: {kind:?} after {took:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_and_audit_logs_carry_ids_and_hashes_only() {
    let redis = RedisServer::start();
    let key = TestKey::load("ed-1", "ed", Algorithm::EdDSA);
    let issuer = Issuer::start(&[&key]).await;
    let logs = std::env::temp_dir().join(format!("mcpfleet-ops-logs-{}", std::process::id()));
    let _ = std::fs::remove_file(&logs);
    let fleet = Fleet::builder()
        .redis(redis.url())
        .jwt(&issuer)
        .log_to(&logs, "info")
        .arg("--quota")
        .arg("test_costly=1/1h")
        .arg("--worker-threads")
        .arg("1")
        .start()
        .await;
    let url = fleet.urls()[0].clone();
    let token = key.token(&issuer.id(), "alice-subject").sign();
    let mut c = McpClient::new().with_token(&token);
    let sid = c.initialize(&url).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let secret_arg = "a-secret-argument-value-7f3a";
    let traceparent = format!("00-{trace}-00f067aa0ba902b7-01");
    let body = call(9, "json_schema_2020_12_tool", json!({ "name": secret_arg, "email": "a@example.com" }));
    let resp = c.post_with(&url, &body, &[("x-request-id", "req-audit-1"), ("traceparent", &traceparent)]).await;
    assert_eq!(resp.status(), 200);
    // A tool failure reaches the model as isError with the request's trace id: test_sampling in a session whose
    // client declared no sampling capability.
    let plain = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } } });
    let resp = McpClient::new().with_token(&token).post(&url, &plain).await;
    let plain_sid = resp.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let plain_client = McpClient { session: Some(plain_sid), ..c.clone() };
    let r = plain_client
        .post_with(&url, &call(10, "test_sampling", json!({ "prompt": "hi" })), &[("traceparent", &traceparent)])
        .await
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(r["result"]["isError"], true, "{r}");
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains(&format!("Trace id: {trace}")), "{r}");
    // A call refused by its quota is audited too.
    for id in [11, 12] {
        assert_eq!(c.post(&url, &call(id, "test_costly", json!({ "topic": secret_arg }))).await.status(), 200);
    }
    // A graceful stop flushes the replicas' log writers (a kill could lose the last lines).
    let exits = fleet.stop_gracefully().await;
    assert!(exits.iter().all(|c| *c == Some(0)), "{exits:?}");

    let text = std::fs::read_to_string(&logs).unwrap();
    let lines: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let start = lines.iter().find(|l| l["message"] == "serving MCP on /mcp").unwrap();
    assert_eq!(start["workers"], 1, "--worker-threads 1: {start}");
    let access = lines
        .iter()
        .find(|l| l["request_id"] == "req-audit-1")
        .unwrap_or_else(|| panic!("no access line with the request id in {text}"));
    assert_eq!(access["trace_id"], trace);
    assert_eq!(access["rpc.method"], "tools/call");
    assert_eq!(access["tool.name"], "json_schema_2020_12_tool");
    assert_eq!(access["status"], 200);
    assert_eq!(access["outcome"], "ok");
    assert!(access["latency_ms"].as_f64().is_some());
    let principal = access["principal"].as_str().unwrap();
    assert_eq!(principal.len(), 24, "the principal is its opaque hash");
    let session = access["session"].as_str().unwrap();
    assert_eq!(session.len(), 12, "the session id only as a short hash");
    let audit: Vec<&Value> = lines.iter().filter(|l| l["message"] == "tools/call").collect();
    assert_eq!(audit.len(), 4, "one audit event per call: {audit:?}");
    let a = audit.iter().find(|l| l["tool.name"] == "json_schema_2020_12_tool").unwrap();
    assert_eq!(a["outcome"], "ok");
    assert_eq!(a["trace_id"], trace);
    assert_eq!(a["principal"], principal);
    assert_eq!(a["args.sha256"].as_str().unwrap().len(), 64);
    assert!(a["duration_ms"].as_f64().is_some());
    let e = audit.iter().find(|l| l["tool.name"] == "test_sampling").unwrap();
    assert_eq!(e["outcome"], "is_error");
    assert_eq!(e["trace_id"], trace);
    let costly: Vec<&&Value> = audit.iter().filter(|l| l["tool.name"] == "test_costly").collect();
    assert_eq!(costly.iter().map(|l| l["outcome"].as_str().unwrap()).collect::<Vec<_>>(), ["ok", "refused_by_limit"]);
    assert_eq!(costly[0]["args.sha256"], costly[1]["args.sha256"], "the same arguments, the same hash");
    for forbidden in [secret_arg, "alice-subject", sid.as_str(), token.as_str()] {
        assert!(!text.contains(forbidden), "the logs hold {forbidden:?}");
    }
    let _ = std::fs::remove_file(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_loaded_replica_without_losing_an_event() {
    let redis = RedisServer::start();
    let mut draining = Fleet::builder().redis(redis.url()).short_leases().arg("--drain-delay").arg("1s").start().await;
    let other = Fleet::builder().redis(redis.url()).short_leases().start().await;
    let (a, b) = (draining.urls()[0].clone(), other.urls()[0].clone());
    let admin = draining.replicas[0].admin();
    const CLIENTS: usize = 6;
    const COUNT: u64 = 30;
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let mut c = McpClient::new();
        c.initialize(&b).await;
        let s =
            c.call_streaming(&a, 100 + i as i64, "test_countdown", json!({ "count": COUNT, "interval_ms": 100 })).await;
        clients.push((c, s));
    }
    for (_, s) in &mut clients {
        s.next(T).await.unwrap();
    }
    draining.replicas[0].terminate();
    // 1. Readiness turns 503 at once, while the replica still serves (new connections included).
    let ready = reqwest::get(format!("{admin}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 503);
    let probe = McpClient::new();
    let mut probe = probe;
    probe.initialize(&a).await;
    // 2-4. After the delay it stops accepting; every stream ends with a retry hint; each client resumes on B.
    let mut tasks = Vec::new();
    for (c, mut s) in clients {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = s.collect(Duration::from_secs(20)).await.unwrap();
            assert!(seen.last().unwrap().retry.is_some(), "the stream ended with a retry hint");
            let cursor = seen.iter().rev().find_map(|e| e.id.clone()).unwrap();
            let rest = SseStream::new(c.get(&b, Some(&cursor)).await).collect(Duration::from_secs(20)).await.unwrap();
            seen.extend(rest);
            seen
        }));
    }
    for t in tasks {
        let seen = t.await.unwrap();
        assert_eq!(
            progress_values(&data_messages(&seen)),
            (1..=COUNT).collect::<Vec<_>>(),
            "every progress event exactly once"
        );
        let last = seen.iter().rev().find_map(SseEvent::json).unwrap();
        assert_eq!(last["result"]["content"][0]["text"], format!("counted to {COUNT}"));
    }
    // 5. The process exits 0.
    let code = tokio::task::spawn_blocking(move || draining.replicas[0].wait_exit(20)).await.unwrap();
    assert_eq!(code, Some(0));
}

/// Runs `mcpfleet serve` with `extra` flags, its stderr a pipe or (through `script`) a terminal, until its
/// "serving MCP" log line appears; that line.
#[expect(clippy::unwrap_used, clippy::expect_used, reason = "a test helper fails loudly")]
fn first_log_line(extra: &[&str], on_terminal: bool) -> String {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};
    let bin = mcpfleet_fleetkit::server_bin();
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut cmd = if on_terminal {
        // `script` gives the server a pseudo-terminal for stdout and stderr; its output is what the terminal showed.
        let line = std::iter::once(bin.to_string_lossy().into_owned())
            .chain(args.iter().map(|a| (*a).to_owned()))
            .collect::<Vec<_>>()
            .join(" ");
        let mut c = Command::new("script");
        c.args(["-qfec", &line, "/dev/null"]).stdout(Stdio::piped()).stderr(Stdio::null());
        c
    } else {
        let mut c = Command::new(&bin);
        c.args(&args).stdout(Stdio::null()).stderr(Stdio::piped());
        c
    };
    let mut child = cmd.env("MCPFLEET_LOG", "info").env_remove("MCPFLEET_LOG_FORMAT").spawn().unwrap();
    let out: Box<dyn std::io::Read + Send> =
        if on_terminal { Box::new(child.stdout.take().unwrap()) } else { Box::new(child.stderr.take().unwrap()) };
    let mut found = None;
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        if line.contains("serving MCP") {
            found = Some(line);
            break;
        }
    }
    let _ = Command::new("kill").args(["-KILL", &child.id().to_string()]).status();
    let _ = child.wait();
    found.expect("no 'serving MCP' log line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_text_on_a_terminal_and_json_elsewhere() {
    let lines = tokio::task::spawn_blocking(|| {
        [
            first_log_line(&[], true),
            first_log_line(&[], false),
            first_log_line(&["--log-format", "json"], true),
            first_log_line(&["--log-format", "text"], false),
        ]
    })
    .await
    .unwrap();
    let is_json =
        |l: &str| serde_json::from_str::<Value>(l.trim()).is_ok_and(|v| v["message"] == "serving MCP on /mcp");
    assert!(!is_json(&lines[0]) && lines[0].contains(" INFO ") && lines[0].contains("serving MCP"), "{lines:?}");
    assert!(is_json(&lines[1]), "{lines:?}");
    assert!(is_json(&lines[2]), "{lines:?}");
    assert!(!is_json(&lines[3]) && lines[3].contains(" INFO "), "{lines:?}");
}

/// Sends a POST head declaring `len` bytes of body on a raw connection to `addr`, then writes the body in chunks
/// while reading the answer, as a proxy relaying an upload does. Returns the answer's status line, whether the
/// whole body was written without a reset, and whether the connection then served a second request.
#[expect(clippy::unwrap_used, reason = "a test helper fails loudly")]
async fn refused_upload(addr: &str, extra_headers: &str, len: usize) -> (String, bool, bool) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\naccept: application/json, \
         text/event-stream\r\ncontent-length: {len}\r\n{extra_headers}\r\n"
    );
    wr.write_all(head.as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move {
        let chunk = vec![b' '; 16 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            if wr.write_all(&chunk[..n]).await.is_err() {
                return (false, wr);
            }
            left -= n;
        }
        (true, wr)
    });
    // The answer: its head, then its Content-Length worth of body.
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let mut read_answer = async |rd: &mut tokio::net::tcp::OwnedReadHalf, buf: &mut Vec<u8>| -> Option<String> {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                let cl: usize = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                while buf.len() < end + 4 + cl {
                    let n = rd.read(&mut tmp).await.ok()?;
                    if n == 0 {
                        return None;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                }
                buf.drain(..end + 4 + cl);
                return Some(head.lines().next().unwrap_or_default().to_owned());
            }
            let n = rd.read(&mut tmp).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&tmp[..n]);
        }
    };
    let status = tokio::time::timeout(T, read_answer(&mut rd, &mut buf)).await.unwrap().unwrap_or_default();
    let (written, mut wr) = tokio::time::timeout(T, writer).await.unwrap().unwrap();
    // The same connection again: a request with no body.
    let again = format!("GET /mcp HTTP/1.1\r\nhost: {addr}\r\naccept: text/event-stream\r\n{extra_headers}\r\n");
    let reused = written
        && wr.write_all(again.as_bytes()).await.is_ok()
        && tokio::time::timeout(T, read_answer(&mut rd, &mut buf)).await.ok().flatten().is_some();
    (status, written, reused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_is_read_reaches_the_client_whole() {
    let s = mcpfleet_fleetkit::JwtFleet::start(1, &[]).await;
    let addr = s.url(0).trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    // No token: 401 before the body is read, while a 900 KB body is still being sent.
    let (status, written, reused) = refused_upload(&addr, "", 900 * 1024).await;
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    assert!(written, "the client could send its whole body: no reset");
    assert!(reused, "the connection serves the next request");
    // A token, and a declared size over --max-body-bytes (1 MiB): 413 before the body is read.
    let auth = format!("authorization: Bearer {}\r\n", s.token("alice"));
    let (status, written, reused) = refused_upload(&addr, &auth, 1024 * 1024 + 1).await;
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    assert!(written && reused, "413: written {written}, reused {reused}");
    // Up to the documented bound (8 MiB) a refused body is drained; past it the connection is closed, but the
    // answer was written first.
    let (status, _, _) =
        refused_upload(&addr, "", usize::try_from(mcpfleet_transport::DRAIN_MAX_BYTES).unwrap() + 1).await;
    assert!(status.starts_with("HTTP/1.1 401") || status.is_empty(), "{status}");
}

/// POSTs an initialize to `url`: the status, `Retry-After`, and the body.
#[expect(clippy::expect_used, reason = "a test helper fails loudly")]
async fn initialize(url: &str) -> (u16, Option<String>, Value) {
    let resp = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(
            json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } } })
            .to_string(),
        )
        .send()
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").map(|v| v.to_str().expect("ASCII").to_owned());
    (status, retry, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_during_a_redis_outage_waits_and_serves_when_redis_returns() {
    let redis = RedisServer::start();
    redis.node().stop();
    let fleet = Fleet::builder().redis(redis.url()).start().await;
    let (url, admin) = (fleet.urls()[0].clone(), fleet.replicas[0].admin());
    let pid = fleet.replicas[0].pid();
    let get = |path: &'static str| {
        let admin = admin.clone();
        async move {
            let r = reqwest::get(format!("{admin}{path}")).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    // Up, listening, alive, not ready, and saying why; /mcp answers 503 with Retry-After, never hangs.
    assert_eq!(get("/healthz").await.0, 200);
    for _ in 0..3 {
        assert_eq!(get("/readyz").await, (503, "starting: the state store has not answered yet\n".to_owned()));
        let (status, retry, body) = tokio::time::timeout(T, initialize(&url)).await.expect("an answer, not a hang");
        assert_eq!((status, retry.as_deref()), (503, Some("1")), "{body}");
        assert_eq!(body["error"]["code"], -32005, "{body}");
        assert_eq!(body["error"]["message"], "service temporarily unavailable", "{body}");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert!(has_line(&metrics_text(&admin).await, "mcp_ready 0"));
    // Redis returns: the same process becomes ready within seconds (the retries back off to 5 s at most), and serves.
    redis.node().start_again();
    let back = std::time::Instant::now();
    eventually(10, "ready once Redis is back", || async { get("/readyz").await.0 == 200 }).await;
    let waited = back.elapsed();
    assert!(waited < Duration::from_secs(7), "ready {waited:?} after Redis came back");
    assert!(has_line(&metrics_text(&admin).await, "mcp_ready 1"));
    assert_eq!(fleet.replicas[0].pid(), pid, "no restart");
    let mut c = McpClient::new();
    c.initialize(&url).await;
    let r = c.request(&url, 1, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert!(r["result"]["content"][0]["text"].is_string(), "{r}");
    assert!(!redis.keys().is_empty(), "the session lives in the Redis that came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_its_token_keys_is_never_ready() {
    let redis = RedisServer::start();
    let key = TestKey::load("ed-1", "ed", Algorithm::EdDSA);
    let issuer = Issuer::start(&[&key]).await;
    issuer.down();
    let fleet = Fleet::builder().redis(redis.url()).jwt(&issuer).start().await;
    let admin = fleet.replicas[0].admin();
    let ready = || {
        let admin = admin.clone();
        async move {
            let r = reqwest::get(format!("{admin}/readyz")).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    // Redis answers, the keys do not load: not ready, for as long as that lasts (a rollout never takes this pod).
    for _ in 0..4 {
        assert_eq!(ready().await, (503, "token verification keys not loaded\n".to_owned()));
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    assert!(has_line(&metrics_text(&admin).await, "mcp_ready 0"));
    // The issuer comes back: the replica loads its keys by itself (nobody sends it requests) and becomes ready.
    issuer.up().await;
    eventually(20, "ready once the keys load", || async { ready().await.0 == 200 }).await;
    assert!(has_line(&metrics_text(&admin).await, "mcp_ready 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_redis_is_named_measured_and_a_refused_info_explained() {
    let dir = tempfile::tempdir().unwrap();
    // A Redis that may drop keys with a TTL under memory pressure.
    let redis = RedisServer::start();
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]).expect("CONFIG SET");
    let log = dir.path().join("evicting.log");
    let fleet = Fleet::builder().redis(redis.url()).log_to(&log, "info").start().await;
    let admin = fleet.replicas[0].admin();
    let evicting = r#"mcp_redis_maxmemory_policy{policy="allkeys-lru"}"#;
    let a = admin.clone();
    eventually(10, "the policy is measured", || {
        let a = a.clone();
        async move { scrape(&a).await.get(evicting) == Some(&1.0) }
    })
    .await;
    assert_eq!(scrape(&admin).await.get(r#"mcp_redis_maxmemory_policy{policy="noeviction"}"#), None);
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().find(|l| l.contains("maxmemory_policy")).unwrap_or_else(|| panic!("no line:\n{text}"));
    assert!(line.contains("ERROR") && line.contains("allkeys-lru") && line.contains("noeviction"), "{line}");

    // An ACL user without `+info`: the policy is unknown, and the log says once how to allow it.
    let rules = "~mcp:* &mcp:* +@read +@write +@scripting +@pubsub +@connection +time +wait";
    let locked = RedisServer::start_with(
        &mcpfleet_fleetkit::RedisOptions::default()
            .with_acl("admin", "admin-pw")
            .with_user(format!("fleet on >fleet-pw {rules}")),
    );
    let log = dir.path().join("noperm.log");
    let url = format!("redis://{}/", locked.addr());
    let fleet = Fleet::builder()
        .redis(url)
        .arg("--redis-username")
        .arg("fleet")
        .arg("--redis-password")
        .arg("fleet-pw")
        .log_to(&log, "info")
        .start()
        .await;
    let admin = fleet.replicas[0].admin();
    let a = admin.clone();
    eventually(10, "the policy is unknown", || {
        let a = a.clone();
        async move { scrape(&a).await.get(r#"mcp_redis_maxmemory_policy{policy="unknown"}"#) == Some(&1.0) }
    })
    .await;
    let mut c = McpClient::new();
    c.initialize(&fleet.urls()[0]).await;
    let text = std::fs::read_to_string(&log).unwrap();
    let said: Vec<&str> = text.lines().filter(|l| l.contains("may not run INFO")).collect();
    assert_eq!(said.len(), 1, "said once:\n{text}");
    assert!(said[0].contains("+info"), "{}", said[0]);
}

/// An OTLP/HTTP collector that counts the export requests it receives.
#[expect(clippy::expect_used, reason = "a test helper fails loudly")]
async fn collector() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move || {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_ratio_decides_new_traces_and_callers_decide_theirs() {
    use std::sync::atomic::Ordering;
    let redis = RedisServer::start();
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "test_simple_text", "arguments": {} } });
    // Ratio 0: five calls of new traces, nothing exported (the replica flushes its spans when it stops).
    for (traceparent, exported) in
        [(None, false), (Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), true)]
    {
        let (url, seen) = collector().await;
        let mut fleet = Fleet::builder()
            .redis(redis.url())
            .arg("--otlp-endpoint")
            .arg(url)
            .arg("--trace-sample-ratio")
            .arg("0")
            .start()
            .await;
        let mcp = fleet.urls()[0].clone();
        let mut c = McpClient::new();
        c.initialize(&mcp).await;
        for _ in 0..5 {
            let headers: Vec<(&str, &str)> = traceparent.iter().map(|t| ("traceparent", *t)).collect();
            assert_eq!(c.post_with(&mcp, &call, &headers).await.status(), 200);
        }
        fleet.replicas[0].terminate();
        let code = tokio::task::spawn_blocking(move || fleet.replicas[0].wait_exit(20)).await.unwrap();
        assert_eq!(code, Some(0));
        let n = seen.load(Ordering::SeqCst);
        assert_eq!(n > 0, exported, "{traceparent:?}: {n} exports");
    }
}

/// A supervisor that reads where the replica listens and then closes its end of stdout (a shell's `| head -1`, a
/// test helper) does not stop it: with `--auth dev`, the dev token is written to that closed pipe after the reader
/// has gone, and the replica goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_stdout_reader_leaves_serves_on() {
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};
    mcpfleet_fleetkit::init_tls();
    let mut child = Command::new(mcpfleet_fleetkit::server_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--auth", "dev"])
        .args(["--fixtures", "conformance"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    // The reader is gone (dropped above): the second line and the dev token meet a closed pipe.
    let addr = first.trim().strip_prefix("listening on ").expect("the first line says where").to_owned();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let alive = child.try_wait().unwrap();
    let (status, _, _) = initialize(&format!("http://{addr}/mcp")).await;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(alive, None, "the replica exited when its stdout's reader left");
    // Without a token, the dev replica challenges: it answers, so it serves.
    assert_eq!(status, 401);
}

/// OpenTelemetry's MCP metrics as Prometheus histograms: `mcp_server_operation_duration_seconds` for every MCP
/// request (a tools/call by its tool, a JSON-RPC error by its code, each by protocol version, both generations) and
/// `mcp_server_session_duration_seconds` for a session a DELETE ended on another replica than the one it began on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_operation_and_session_histograms() {
    let redis = RedisServer::start();
    let fleet = Fleet::builder().replicas(2).redis(redis.url()).start().await;
    let [a, b] = [0, 1].map(|i| fleet.urls()[i].clone());
    let mut c = McpClient::new();
    c.initialize(&a).await;
    c.request(&a, 1, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    let unknown = c.request(&a, 2, "tools/call", json!({ "name": "no_such_tool", "arguments": {} })).await;
    assert_eq!(unknown["error"]["code"], -32602);
    c.request(&a, 3, "tools/list", json!({})).await;
    // The session's id says when it began, to the second: 2.1 s later it has lasted at least 2.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(c.delete(&b).await.status(), 200);
    let stateless = mcpfleet_fleetkit::StatelessClient::new();
    let (status, _) =
        stateless.request(&a, 4, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert_eq!(status, 200);
    let on_a = scrape(&fleet.replicas[0].admin()).await;
    let op = |labels: &str| on_a.get(&format!("mcp_server_operation_duration_seconds_count{{{labels}}}")).copied();
    assert_eq!(
        op(r#"error_type="",method="tools/call",protocol_version="2025-11-25",tool="test_simple_text""#),
        Some(1.0)
    );
    assert_eq!(
        op(r#"error_type="-32602",method="tools/call",protocol_version="2025-11-25",tool="unknown""#),
        Some(1.0)
    );
    assert_eq!(op(r#"error_type="",method="tools/list",protocol_version="2025-11-25",tool="""#), Some(1.0));
    assert_eq!(op(r#"error_type="",method="initialize",protocol_version="2025-11-25",tool="""#), Some(1.0));
    assert_eq!(
        op(r#"error_type="",method="tools/call",protocol_version="2026-07-28",tool="test_simple_text""#),
        Some(1.0)
    );
    let on_b = scrape(&fleet.replicas[1].admin()).await;
    assert_eq!(on_b[r#"mcp_server_session_duration_seconds_count{protocol_version="2025-11-25"}"#], 1.0);
    let lasted = on_b[r#"mcp_server_session_duration_seconds_sum{protocol_version="2025-11-25"}"#];
    assert!((2.0..30.0).contains(&lasted), "from initialize on A to DELETE on B: {lasted} s");
    assert_eq!(on_b[r#"mcp_server_session_duration_seconds_bucket{le="1",protocol_version="2025-11-25"}"#], 0.0);
}
