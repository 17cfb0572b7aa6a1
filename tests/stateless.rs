//! End-to-end: the 2026-07-28 generation (stateless requests) on a fleet of real replicas sharing one Redis of the
//! suite's own, beside the 2025 generation. Every test sends its requests to chosen replicas, so that a retry, a
//! duplicate or a notification crosses from one replica to another.

use mcpfleet_fleetkit::{JwtFleet, SseStream, eventually};
use serde_json::{Value, json};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// A JWT fleet on a Redis of its own (so that tests can act as several principals).
async fn setup(n: usize, extra: &[&str]) -> JwtFleet {
    JwtFleet::start(n, extra).await
}

fn text_of(response: &Value) -> String {
    response["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_generations_on_every_replica() {
    let s = setup(2, &[]).await;
    let (a, b) = (s.url(0), s.url(1));
    // A 2025 session: initialize on A, call on B.
    let mut legacy = s.client("alice");
    legacy.initialize(&a).await;
    let r = legacy.request(&b, 1, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert_eq!(text_of(&r), "This is a simple text response for testing.");
    assert!(r["result"].get("resultType").is_none(), "2025 results are unchanged: {r}");
    // A stateless client on the same replicas, in between: no session, and every result says what it is.
    let stateless = s.stateless("alice");
    let (status, d) = stateless.request(&a, 2, "server/discover", json!({})).await;
    assert_eq!(status, 200);
    let d = &d["result"];
    assert_eq!(d["resultType"], "complete");
    assert_eq!(d["supportedVersions"], json!(["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"]));
    assert_eq!(d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "mcpfleet");
    assert!(d["ttlMs"].as_u64().is_some() && d["cacheScope"] == "private", "{d}");
    assert!(
        d["capabilities"]["resources"].get("subscribe").is_none(),
        "the stateless generation has no resources/subscribe: {d}"
    );
    let r = stateless.call(&b, 3, "test_simple_text", json!({}), json!({})).await;
    assert_eq!(
        (text_of(&r), r["result"]["resultType"].clone()),
        ("This is a simple text response for testing.".into(), json!("complete"))
    );
    // The session still works after the stateless traffic, on either replica.
    let r = legacy.request(&a, 4, "tools/list", json!({})).await;
    assert!(r["result"]["tools"].as_array().unwrap().len() > 5);
    // A stateless request ignores Mcp-Session-Id and Last-Event-ID (even a garbage one) and mints no session.
    let body = stateless.body(5, "tools/list", json!({}));
    let resp = stateless.send(&b, &body, &[("mcp-session-id", "not-a-session"), ("last-event-id", "garbage")]).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("mcp-session-id").is_none());
    let l: Value = resp.json().await.unwrap();
    assert_eq!(l["result"]["resultType"], "complete");
    assert_eq!(l["result"]["cacheScope"], "private", "lists filtered by scopes are the caller's own");
    // tools/list is the same list in the same order on every replica.
    let names =
        |v: &Value| v["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].clone()).collect::<Vec<_>>();
    let (_, on_a) = stateless.request(&a, 6, "tools/list", json!({})).await;
    assert_eq!(names(&on_a), names(&l));
    // GET and DELETE saying 2026-07-28 get 405 (Allow: POST), on both replicas.
    let http = reqwest::Client::new();
    let token = format!("Bearer {}", s.token("alice"));
    for url in [&a, &b] {
        let get = http.get(url).header("mcp-protocol-version", "2026-07-28").header("authorization", &token);
        let get = get.header("accept", "text/event-stream").send().await.unwrap();
        assert_eq!(get.status(), 405);
        assert_eq!(get.headers()["allow"], "POST");
        let del = http.delete(url).header("mcp-protocol-version", "2026-07-28").header("authorization", &token);
        assert_eq!(del.send().await.unwrap().status(), 405);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_requests_are_checked_before_anything_runs() {
    let s = setup(1, &[]).await;
    let url = s.url(0);
    let c = s.stateless("alice");
    let err = |v: &Value| (v["id"].clone(), v["error"]["code"].clone());
    // Missing required _meta fields: 400, -32602, the id echoed.
    let no_meta = json!({ "jsonrpc": "2.0", "id": 7, "method": "server/discover", "params": {} });
    let resp = c.send(&url, &no_meta, &[("mcp-protocol-version", "2026-07-28")]).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(err(&resp.json().await.unwrap()), (json!(7), json!(-32602)));
    let mut no_caps = c.body(8, "tools/list", json!({}));
    no_caps["params"]["_meta"].as_object_mut().unwrap().remove("io.modelcontextprotocol/clientCapabilities");
    let resp = c.send(&url, &no_caps, &[]).await;
    assert_eq!(resp.status(), 400);
    assert!(resp.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("clientCapabilities"));
    // The version header against the body: -32020; an unsupported version: -32022 with what is supported.
    let body = c.body(9, "tools/list", json!({}));
    let resp = c.send(&url, &body, &[("mcp-protocol-version", "2025-11-25")]).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(err(&resp.json().await.unwrap()), (json!(9), json!(-32020)));
    let old = c.body(10, "tools/list", json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": "2027-01-01" } }));
    let resp = c.send(&url, &old, &[]).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(err(&v), (json!(10), json!(-32022)));
    assert_eq!(v["error"]["data"]["requested"], "2027-01-01");
    assert_eq!(v["error"]["data"]["supported"][0], "2026-07-28");
    // A _meta that names a session version is the session generation's business: it asks for the session.
    let legacy =
        c.body(17, "tools/list", json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": "2025-11-25" } }));
    let resp = c.send(&url, &legacy, &[]).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("MCP-Session-Id header is required"), "{v}");
    // Mcp-Method and Mcp-Name must be there and match the body (a base64-encoded name is decoded first).
    let call = c.body(11, "tools/call", json!({ "name": "test_simple_text", "arguments": {} }));
    for headers in [
        vec![("mcp-method", "tools/list")],
        vec![("mcp-name", "test_error_handling")],
        vec![("mcp-name", "=?base64?!!!?=")],
    ] {
        let resp = c.send(&url, &call, &headers).await;
        assert_eq!(resp.status(), 400, "{headers:?}");
        assert_eq!(err(&resp.json().await.unwrap()), (json!(11), json!(-32020)), "{headers:?}");
    }
    let http = reqwest::Client::new();
    let token = format!("Bearer {}", s.token("alice"));
    let bare = http
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", &token)
        .header("mcp-protocol-version", "2026-07-28");
    let resp = bare.try_clone().unwrap().body(call.to_string()).send().await.unwrap();
    assert_eq!(resp.status(), 400, "no Mcp-Method");
    let encoded = format!("=?base64?{}?=", "dGVzdF9zaW1wbGVfdGV4dA==");
    let resp = c.send(&url, &call, &[("mcp-name", encoded.as_str())]).await;
    assert_eq!(mcpfleet_fleetkit::response_of(resp).await["result"]["resultType"], "complete");
    // A parameter mirrored into a header (x-mcp-header): the header must be there and match, decoded.
    let region =
        c.body(16, "tools/call", json!({ "name": "test_header_param", "arguments": { "region": "us-west1" } }));
    let ok = c.send(&url, &region, &[("mcp-param-region", "us-west1")]).await;
    assert_eq!(mcpfleet_fleetkit::response_of(ok).await["result"]["content"][0]["text"], "region us-west1");
    let encoded = c.send(&url, &region, &[("Mcp-Param-Region", "=?base64?dXMtd2VzdDE=?=")]).await;
    assert_eq!(encoded.status(), 200);
    for headers in
        [vec![], vec![("mcp-param-region", "eu-north1")], vec![("mcp-param-region", "=?base64?dXMtd2VzdDE?=")]]
    {
        let resp = c.send(&url, &region, &headers).await;
        assert_eq!(resp.status(), 400, "{headers:?}");
        assert_eq!(err(&resp.json().await.unwrap()), (json!(16), json!(-32020)), "{headers:?}");
    }
    // Methods of the session generation, and unknown ones: 404 and -32601.
    for method in ["initialize", "ping", "logging/setLevel", "resources/subscribe", "no/such"] {
        let (status, v) = c.request(&url, 12, method, json!({})).await;
        assert_eq!((status, err(&v)), (404, (json!(12), json!(-32601))), "{method}");
    }
    // A resource not found: -32602 naming the URI.
    let (_, v) = c.request(&url, 13, "resources/read", json!({ "uri": "test://nope" })).await;
    assert_eq!((v["error"]["code"].clone(), v["error"]["data"]["uri"].clone()), (json!(-32602), json!("test://nope")));
    // A tool that needs a capability the request did not declare: 400, -32021, naming it; the tool never ran.
    let bare_caps = s.stateless("alice").with_capabilities(json!({}));
    let resp = bare_caps
        .send(&url, &bare_caps.body(14, "tools/call", json!({ "name": "test_missing_capability" })), &[])
        .await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        (err(&v), v["error"]["data"]["requiredCapabilities"].clone()),
        ((json!(14), json!(-32021)), json!({ "sampling": {} }))
    );
    // Arguments that do not match the schema: the isError result of the session generation, marked complete.
    let r = c.call(&url, 15, "test_costly", json!({ "topic": 5 }), json!({})).await;
    assert_eq!((r["result"]["isError"].clone(), r["result"]["resultType"].clone()), (json!(true), json!("complete")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_messages_only_at_the_requested_level() {
    let s = setup(1, &[]).await;
    let url = s.url(0);
    let c = s.stateless("alice");
    let logs = |level: Option<&'static str>| {
        let c = c.clone();
        let url = url.clone();
        async move {
            let mut params = json!({ "name": "test_tool_with_logging", "arguments": {} });
            if let Some(l) = level {
                params["_meta"] = json!({ "io.modelcontextprotocol/logLevel": l });
            }
            let resp = c.send(&url, &c.body(1, "tools/call", params), &[]).await;
            let sse = resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream");
            if !sse {
                let v: Value = resp.json().await.unwrap();
                assert_eq!(v["result"]["resultType"], "complete");
                return 0;
            }
            let events = SseStream::new(resp).collect(T).await.unwrap();
            events.iter().filter(|e| e.data.contains("notifications/message")).count()
        }
    };
    assert_eq!(logs(None).await, 0, "no notifications/message without a logLevel");
    assert_eq!(logs(Some("info")).await, 3);
    assert_eq!(logs(Some("error")).await, 0, "below the requested level");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_round_trip_continues_on_other_replicas() {
    let s = setup(3, &[]).await;
    let c = s.stateless("alice");
    // Round 1 on A: the tool asks for a name.
    let r1 = c.call(&s.url(0), 1, "test_input_required_result_multi_round", json!({}), json!({})).await;
    let r1 = &r1["result"];
    assert_eq!(r1["resultType"], "input_required");
    assert_eq!(r1["inputRequests"]["step1"]["method"], "elicitation/create");
    assert!(r1.get("ttlMs").is_none(), "input_required results carry no caching hints");
    // Round 2 on B, with the answer and the state: it asks for a colour, under a new state.
    let answer = json!({ "action": "accept", "content": { "name": "Alice" } });
    let retry = json!({ "inputResponses": { "step1": answer }, "requestState": r1["requestState"] });
    let r2 = c.call(&s.url(1), 2, "test_input_required_result_multi_round", json!({}), retry).await;
    let r2 = &r2["result"];
    assert_eq!(r2["resultType"], "input_required");
    assert!(r2["inputRequests"].get("step2").is_some() && r2["inputRequests"].get("step1").is_none(), "{r2}");
    assert_ne!(r2["requestState"], r1["requestState"]);
    // Round 3 on C: only step2 is answered; step1's answer comes from the state.
    let answer = json!({ "action": "accept", "content": { "color": "blue" } });
    let retry = json!({ "inputResponses": { "step2": answer }, "requestState": r2["requestState"] });
    let r3 = c.call(&s.url(2), 3, "test_input_required_result_multi_round", json!({}), retry).await;
    assert_eq!(text_of(&r3), "Alice likes blue.");
    assert_eq!(r3["result"]["resultType"], "complete");
    // A 2025 fixture works in the stateless generation too: the server→client request becomes an input request.
    let args = json!({ "prompt": "What is 2+2?" });
    let r1 = c.call(&s.url(2), 4, "test_sampling", args.clone(), json!({})).await;
    let key = r1["result"]["inputRequests"].as_object().unwrap().keys().next().unwrap().clone();
    let sampled = json!({ "role": "assistant", "content": { "type": "text", "text": "4" }, "model": "m" });
    let retry = json!({ "inputResponses": { key: sampled }, "requestState": r1["result"]["requestState"] });
    let r2 = c.call(&s.url(0), 5, "test_sampling", args, retry).await;
    assert_eq!(text_of(&r2), "LLM response: 4");
    // Prompts ask too.
    let (_, p1) = c.request(&s.url(1), 6, "prompts/get", json!({ "name": "test_input_required_result_prompt" })).await;
    let state = p1["result"]["requestState"].clone();
    let answer = json!({ "action": "accept", "content": { "context": "fleet" } });
    let params = json!({ "name": "test_input_required_result_prompt", "inputResponses": { "user_context": answer }, "requestState": state });
    let (_, p2) = c.request(&s.url(2), 7, "prompts/get", params).await;
    assert_eq!(p2["result"]["messages"][0]["content"]["text"], "Answer with this context: fleet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_expired_and_foreign_states_are_refused() {
    // 4 s: the four calls before the genuine one must land while the state lives, or they read "expired".
    let s = setup(2, &["--request-state-ttl", "4s"]).await;
    let alice = s.stateless("alice");
    let tool = "test_input_required_result_request_state";
    let r1 = alice.call(&s.url(0), 1, tool, json!({}), json!({})).await;
    let state = r1["result"]["requestState"].as_str().unwrap().to_owned();
    let answers = json!({ "confirm": { "action": "accept", "content": { "ok": true } } });
    let refused = |v: &Value, want: &str| {
        assert_eq!(v["error"]["code"], -32602, "{v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(want), "{want:?} in {m:?}");
    };
    // One changed character of the payload (on the other replica): refused, and the tool did not complete.
    let mut forged = state.clone().into_bytes();
    let i = state.find('.').unwrap() + 10;
    forged[i] = if forged[i] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let retry = |st: &str| json!({ "inputResponses": answers.clone(), "requestState": st });
    let v = alice.call(&s.url(1), 2, tool, json!({}), retry(&forged)).await;
    refused(&v, "failed verification");
    // Another principal presenting alice's state: refused.
    let v = s.stateless("bob").call(&s.url(1), 3, tool, json!({}), retry(&state)).await;
    refused(&v, "another principal");
    // The state of one tool on another: refused.
    let v = alice.call(&s.url(1), 4, "test_input_required_result_tampered_state", json!({}), retry(&state)).await;
    refused(&v, "another request");
    // The genuine state works on the other replica, until it expires.
    let ok = alice.call(&s.url(1), 5, tool, json!({}), retry(&state)).await;
    assert_eq!(text_of(&ok), "state-ok: confirmed");
    tokio::time::sleep(Duration::from_millis(4300)).await;
    let v = alice.call(&s.url(0), 6, tool, json!({}), retry(&state)).await;
    refused(&v, "expired");
    let reasons = ["bad_signature", "wrong_principal", "wrong_request", "expired"];
    for r in reasons {
        let n = s.metric(&format!("mcp_request_state_refusals_total{{reason=\"{r}\"}}")).await;
        assert_eq!(n, 1.0, "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_streams_hear_notifications_published_on_other_replicas() {
    let mut s = setup(2, &["--max-streams-per-user", "1"]).await;
    let alice = s.stateless("alice");
    let filter =
        json!({ "notifications": { "toolsListChanged": true, "resourceSubscriptions": ["test://watched-resource"] } });
    let resp = alice.send(&s.url(0), &alice.body(41, "subscriptions/listen", filter.clone()), &[]).await;
    assert_eq!(resp.status(), 200);
    let mut stream = SseStream::new(resp);
    let ack = stream.until_method("notifications/subscriptions/acknowledged", T).await.unwrap();
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], json!(41), "the listen id, as sent");
    assert_eq!(ack["params"]["notifications"], filter["notifications"]);
    // The per-principal stream cap applies to listen streams (bob has his own).
    let again = alice.send(&s.url(1), &alice.body(42, "subscriptions/listen", filter.clone()), &[]).await;
    assert_eq!(again.status(), 429);
    let bob = s.stateless("bob");
    let mut bobs =
        SseStream::new(bob.send(&s.url(1), &bob.body(43, "subscriptions/listen", filter.clone()), &[]).await);
    bobs.until_method("notifications/subscriptions/acknowledged", T).await.unwrap();
    // A call on the other replica updates the watched resource: alice's stream on A hears it, tagged.
    let r = alice.call(&s.url(1), 2, "test_update_watched_resource", json!({}), json!({})).await;
    assert_eq!(r["result"]["resultType"], "complete");
    let n = stream.until_method("notifications/resources/updated", T).await.unwrap();
    assert_eq!(n["params"]["uri"], "test://watched-resource");
    assert_eq!(n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], json!(41));
    // Only what the filter asked for: a prompt-list change is not sent, a tool-list change is.
    alice.call(&s.url(1), 3, "test_trigger_prompt_change", json!({}), json!({})).await;
    alice.call(&s.url(1), 4, "test_trigger_tool_change", json!({}), json!({})).await;
    let next = stream.next(T).await.unwrap().unwrap();
    let next: Value = serde_json::from_str(&next.data).unwrap();
    assert_eq!(next["method"], "notifications/tools/list_changed", "the prompt change was filtered out");
    // Bob heard none of alice's notifications.
    let quiet = tokio::time::timeout(Duration::from_millis(500), bobs.next(T)).await;
    assert!(quiet.is_err(), "another principal's notifications: {quiet:?}");
    // On shutdown the subscription ends gracefully: its own response, then the end of the stream.
    s.fleet.replicas[0].terminate();
    let end = loop {
        let e = stream.next(T).await.unwrap().expect("a final response before the end");
        let v: Value = serde_json::from_str(&e.data).unwrap_or(Value::Null);
        if v.get("id").is_some() {
            break v;
        }
    };
    assert_eq!(end["id"], 41);
    assert_eq!(end["result"]["resultType"], "complete");
    assert_eq!(end["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 41);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_call_runs_once_across_replicas() {
    let s = setup(2, &[]).await;
    let c = s.stateless("alice");
    let keyed = |k: &str| json!({ "_meta": { "io.mcpfleet/idempotencyKey": k } });
    let args = json!({ "delay_ms": 700 });
    // The same call with the same key, at once, to both replicas.
    let (a, b) = (s.url(0), s.url(1));
    let (x, y) = tokio::join!(
        c.call(&a, 1, "test_mint", args.clone(), keyed("order-1")),
        c.call(&b, 2, "test_mint", args.clone(), keyed("order-1")),
    );
    let minted = text_of(&x);
    assert!(minted.starts_with("minted "), "{x}");
    assert_eq!(text_of(&y), minted, "both callers get the one result");
    let ran = "mcp_tool_calls_total{outcome=\"ok\",tool=\"test_mint\"}";
    let replayed = "mcp_tool_calls_total{outcome=\"replayed\",tool=\"test_mint\"}";
    assert_eq!((s.metric(ran).await, s.metric(replayed).await), (1.0, 1.0), "the handler ran once");
    // Later, in the other generation too: the stored result, and the tool does not run.
    let mut legacy = s.client("alice");
    legacy.initialize(&s.url(1)).await;
    let params =
        json!({ "name": "test_mint", "arguments": args, "_meta": { "io.mcpfleet/idempotencyKey": "order-1" } });
    let r = legacy.request(&s.url(0), 3, "tools/call", params).await;
    assert_eq!(text_of(&r), minted);
    assert_eq!(s.metric(ran).await, 1.0);
    // The same key with other arguments is refused; another key, or another principal, runs again.
    let other = c.call(&s.url(0), 4, "test_mint", json!({ "delay_ms": 1 }), keyed("order-1")).await;
    assert_eq!(other["error"]["code"], -32602, "{other}");
    let fresh = c.call(&s.url(0), 5, "test_mint", args.clone(), keyed("order-2")).await;
    let bobs = s.stateless("bob").call(&s.url(1), 6, "test_mint", args.clone(), keyed("order-1")).await;
    assert!(text_of(&fresh) != minted && text_of(&bobs) != minted && text_of(&bobs) != text_of(&fresh));
    assert_eq!(s.metric(ran).await, 3.0);
    // A key that is not a short visible string is refused before anything runs.
    let bad = c.call(&s.url(0), 7, "test_mint", args, json!({ "_meta": { "io.mcpfleet/idempotencyKey": "" } })).await;
    assert_eq!(bad["error"]["code"], -32602);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_stream_cancels_the_call() {
    let s = setup(1, &[]).await;
    let c = s.stateless("alice");
    let params = json!({ "name": "test_countdown", "arguments": { "count": 50, "interval_ms": 100 }, "_meta": { "progressToken": "p" } });
    let resp = c.send(&s.url(0), &c.body(1, "tools/call", params), &[]).await;
    let mut stream = SseStream::new(resp);
    stream.until_method("notifications/progress", T).await.unwrap();
    drop(stream);
    let cancelled = "mcp_tool_calls_total{outcome=\"cancelled\",tool=\"test_countdown\"}";
    eventually(10, "the call to be cancelled", || async { s.metric(cancelled).await == 1.0 }).await;
    assert_eq!(s.metric("mcp_tool_calls_total{outcome=\"ok\",tool=\"test_countdown\"}").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_silent_call_switches_to_sse_and_still_answers() {
    let s = setup(1, &["--sse-after", "200ms", "--keep-alive", "100ms"]).await;
    let c = s.stateless("alice");
    let body = c.body(1, "tools/call", json!({ "name": "test_mint", "arguments": { "delay_ms": 1200 } }));
    let resp = c.send(&s.url(0), &body, &[]).await;
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    // The stream opens with an empty event (no id: it is never resumed), then keep-alives, then the result.
    let raw = resp.text().await.unwrap();
    assert!(raw.starts_with("data: \n\n"), "{raw:?}");
    assert!(raw.contains(": keep-alive"), "{raw:?}");
    let last = raw.lines().filter_map(|l| l.strip_prefix("data: ")).rfind(|d| !d.is_empty()).unwrap();
    let r: Value = serde_json::from_str(last).unwrap();
    assert!(text_of(&r).starts_with("minted "), "{r}");
    assert_eq!(r["result"]["resultType"], "complete");
    assert_eq!(s.metric("mcp_tool_calls_total{outcome=\"ok\",tool=\"test_mint\"}").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_call_whose_stream_broke_finishes_for_its_re_issue() {
    let s = setup(2, &[]).await;
    let c = s.stateless("alice");
    let params = json!({ "name": "test_mint", "arguments": { "delay_ms": 1500 },
        "_meta": { "io.mcpfleet/idempotencyKey": "broken-1" } });
    // The first attempt's connection breaks while the tool runs.
    let (a, body) = (s.url(0), c.body(1, "tools/call", params.clone()));
    let first = c.send(&a, &body, &[]);
    assert!(tokio::time::timeout(Duration::from_millis(300), first).await.is_err(), "still running");
    // The client re-issues it (new id, same key) on the other replica: it waits for the first run, which went on.
    let again = mcpfleet_fleetkit::response_of(c.send(&s.url(1), &c.body(2, "tools/call", params), &[]).await).await;
    assert!(text_of(&again).starts_with("minted "), "{again}");
    let count = |outcome: &str| format!("mcp_tool_calls_total{{outcome=\"{outcome}\",tool=\"test_mint\"}}");
    assert_eq!(s.metric(&count("ok")).await, 1.0, "the tool ran once");
    assert_eq!(s.metric(&count("replayed")).await, 1.0);
    assert_eq!(s.metric(&count("cancelled")).await, 0.0, "a keyed call is not stopped when its client goes away");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_keeps_the_tools_own_outcome_and_not_a_passing_failure() {
    let s = setup(2, &["--tool-timeout", "1s"]).await;
    let c = s.stateless("alice");
    let keyed = |k: &str| json!({ "_meta": { "io.mcpfleet/idempotencyKey": k } });
    let count = |tool: &str, outcome: &str| format!("mcp_tool_calls_total{{outcome=\"{outcome}\",tool=\"{tool}\"}}");
    // A failure inside the tool (it may pass) is not kept: the re-issue runs again.
    for (i, url) in [s.url(0), s.url(1)].iter().enumerate() {
        let r = c.call(url, i as i64, "test_internal_error", json!({}), keyed("k-internal")).await;
        assert_eq!(r["result"]["isError"], true);
    }
    assert_eq!(s.metric(&count("test_internal_error", "is_error")).await, 2.0);
    // The tool's own isError result is its outcome: kept, and replayed.
    for (i, url) in [s.url(0), s.url(1)].iter().enumerate() {
        let r = c.call(url, 10 + i as i64, "test_error_handling", json!({}), keyed("k-own")).await;
        assert_eq!(r["result"]["isError"], true);
    }
    assert_eq!(s.metric(&count("test_error_handling", "is_error")).await, 1.0);
    assert_eq!(s.metric(&count("test_error_handling", "replayed")).await, 1.0);
    // A call stopped at its timeout may have done half its work: "did not finish" is kept, never run again.
    let slow = json!({ "delay_ms": 3000 });
    let first = c.call(&s.url(0), 20, "test_mint", slow.clone(), keyed("k-slow")).await;
    assert!(text_of(&first).contains("did not finish"), "{first}");
    let again = c.call(&s.url(1), 21, "test_mint", slow, keyed("k-slow")).await;
    assert_eq!(text_of(&again), text_of(&first));
    assert_eq!(s.metric(&count("test_mint", "timeout")).await, 1.0);
    assert_eq!(s.metric(&count("test_mint", "replayed")).await, 1.0);
    // A keyed call that sends progress and whose stream breaks still finishes with its result for the re-issue.
    let params = json!({ "name": "test_countdown", "arguments": { "count": 5, "interval_ms": 100 },
        "_meta": { "progressToken": "p", "io.mcpfleet/idempotencyKey": "k-count" } });
    let mut stream = SseStream::new(c.send(&s.url(0), &c.body(30, "tools/call", params.clone()), &[]).await);
    stream.until_method("notifications/progress", T).await.unwrap();
    drop(stream);
    let again = mcpfleet_fleetkit::response_of(c.send(&s.url(1), &c.body(31, "tools/call", params), &[]).await).await;
    assert_eq!(text_of(&again), "counted to 5", "{again}");
    assert_eq!(s.metric(&count("test_countdown", "ok")).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_round_call_uses_one_quota_unit_and_a_state_cannot_be_replayed_for_free() {
    let tool = "test_input_required_result_request_state";
    let s = setup(2, &["--quota", "test_input_required_result_request_state=1/1h"]).await;
    let c = s.stateless("alice");
    // Round 1 asks for input: its unit comes back. Round 2 completes: one unit used.
    let r1 = c.call(&s.url(0), 1, tool, json!({}), json!({})).await;
    assert_eq!(r1["result"]["resultType"], "input_required");
    let retry = json!({ "inputResponses": { "confirm": { "action": "accept", "content": { "ok": true } } },
        "requestState": r1["result"]["requestState"] });
    let r2 = c.call(&s.url(1), 2, tool, json!({}), retry.clone()).await;
    assert_eq!(text_of(&r2), "state-ok: confirmed");
    // The same state again would run the tool again: it is a call like any other, and the quota is used up.
    let r3 = c.call(&s.url(0), 3, tool, json!({}), retry).await;
    assert!(text_of(&r3).starts_with("Quota exhausted"), "{r3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_carries_only_the_answers_the_tool_used() {
    let s = setup(1, &["--max-body-bytes", "2000000"]).await;
    let c = s.stateless("alice");
    let tool = "test_input_required_result_multi_round";
    let junk = "x".repeat(300_000);
    let first = json!({ "inputResponses": {
        "step1": { "action": "accept", "content": { "name": "Alice" } },
        "padding": { "action": "accept", "content": { "junk": junk } } } });
    let r1 = c.call(&s.url(0), 1, tool, json!({}), first).await;
    let state = r1["result"]["requestState"].as_str().unwrap().to_owned();
    assert!(state.len() < 2000, "the unused answer is not carried: {} bytes", state.len());
    let retry = json!({ "inputResponses": { "step2": { "action": "accept", "content": { "color": "red" } } }, "requestState": state });
    let r2 = c.call(&s.url(0), 2, tool, json!({}), retry).await;
    assert_eq!(text_of(&r2), "Alice likes red.");
    // A mirrored header without a value in the body is a mismatch too.
    let bare = c.body(3, "tools/call", json!({ "name": "test_header_param", "arguments": {} }));
    let resp = c.send(&s.url(0), &bare, &[("mcp-param-region", "us-west1")]).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.json::<Value>().await.unwrap()["error"]["code"], -32020);
}

/// Closing a call's stream is its cancellation (2026-07-28): a burst of slow calls whose streams the client drops
/// as soon as they open stops every one of them and gives back their in-flight slots at once, so that the next call
/// is admitted though the cap is lower than the burst; whichever replica ran each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_streams_stop_their_calls_and_free_their_slots_at_once() {
    let s = setup(3, &["--sse-after", "300ms", "--max-inflight-per-user", "3"]).await;
    let c = s.stateless("alice");
    for i in 0..6 {
        let body = c.body(i, "tools/call", json!({ "name": "test_tool_slow", "arguments": { "durationMs": 10000 } }));
        let resp = c.send(&s.url(usize::try_from(i).unwrap() % 3), &body, &[]).await;
        assert_eq!(resp.status(), 200, "call {i} admitted");
        assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let mut stream = SseStream::new(resp);
        let first = stream.next(T).await.unwrap().expect("the opening event");
        assert_eq!(first.data, "", "an empty event opens a stream that ran long");
        drop(stream);
    }
    let cancelled = "mcp_tool_calls_total{outcome=\"cancelled\",tool=\"test_tool_slow\"}";
    eventually(10, "every dropped call to be stopped", || async { s.metric(cancelled).await == 6.0 }).await;
    let started = std::time::Instant::now();
    let (status, fast) =
        c.request(&s.url(0), 9, "tools/call", json!({ "name": "test_tool_fast", "arguments": {} })).await;
    assert_eq!(status, 200, "{fast}");
    assert_eq!(text_of(&fast), "Fast response");
    assert!(started.elapsed() < Duration::from_secs(2), "answered at once");
    assert_eq!(s.metric("mcp_tool_calls_total{outcome=\"ok\",tool=\"test_tool_slow\"}").await, 0.0);
}
