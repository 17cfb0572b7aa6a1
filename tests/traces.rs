//! End-to-end traces: spans captured with an in-memory exporter from two replicas serving in this process (they
//! share the process's tracer provider, so one exporter sees both), on one real Redis. Checks parentage from a
//! `traceparent` header, from `params._meta`, and across replicas for a server→client request answered through
//! another replica. One test per binary: the tracer provider is global.

use mcpfleet_fleetkit::{Fleet, McpClient, RedisServer, eventually};
use opentelemetry::trace::{SpanId, SpanKind, TraceId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::{Value, json};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn attr(s: &SpanData, key: &str) -> Option<String> {
    s.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.to_string())
}

fn find<'a>(spans: &'a [SpanData], name: &str, trace: TraceId) -> &'a SpanData {
    spans.iter().find(|s| s.name == name && s.span_context.trace_id() == trace).unwrap_or_else(|| {
        panic!("no span {name:?} in trace {trace}: {:?}", spans.iter().map(|s| &s.name).collect::<Vec<_>>())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_follow_traceparent_meta_and_cross_replica_answers() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    opentelemetry::global::set_tracer_provider(provider.clone());

    let redis = RedisServer::start();
    let fleet = Fleet::builder().replicas(2).redis(redis.url()).header_auth().start().await;
    let [a, b] = [0, 1].map(|i| fleet.urls()[i].clone());
    let mut c = McpClient::new().as_user("tracer");
    c.initialize(&a).await;

    // 1. A traceparent header: the HTTP span is its child, the MCP span the HTTP span's child.
    let t1 = "0af7651916cd43dd8448eb211c80319c";
    let p1 = "b7ad6b7169203331";
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "test_simple_text", "arguments": {} } });
    let header_parent = format!("00-{t1}-{p1}-01");
    let resp = c.post_with(&b, &body, &[("traceparent", &header_parent)]).await;
    assert_eq!(resp.status(), 200);
    let trace1 = TraceId::from_hex(t1).unwrap();
    eventually(5, "the tools/call span", || async {
        exporter.get_finished_spans().unwrap().iter().any(|s| s.name == "tools/call test_simple_text")
    })
    .await;
    let spans = exporter.get_finished_spans().unwrap();
    let http = find(&spans, "POST /mcp", trace1);
    assert_eq!(http.parent_span_id, SpanId::from_hex(p1).unwrap());
    assert_eq!(http.span_kind, SpanKind::Server);
    assert_eq!(attr(http, "http.response.status_code").as_deref(), Some("200"));
    let call = find(&spans, "tools/call test_simple_text", trace1);
    assert_eq!(call.parent_span_id, http.span_context.span_id());
    assert_eq!(call.span_kind, SpanKind::Server);
    assert_eq!(attr(call, "mcp.method.name").as_deref(), Some("tools/call"));
    assert_eq!(attr(call, "gen_ai.tool.name").as_deref(), Some("test_simple_text"));
    assert_eq!(attr(call, "gen_ai.operation.name").as_deref(), Some("execute_tool"));
    assert_eq!(attr(call, "jsonrpc.request.id").as_deref(), Some("1"));
    assert_eq!(attr(call, "mcp.protocol.version").as_deref(), Some("2025-11-25"), "the request's version header");
    assert!(call.links.is_empty(), "parented to the HTTP span: nothing to link");
    let session_attr = attr(call, "mcp.session.id").unwrap();
    assert_eq!(session_attr.len(), 12, "a short hash, not the session id");
    assert!(!c.session.as_deref().unwrap().contains(&session_attr));

    // 2. `params._meta.traceparent` parents the MCP span; the header still parents the HTTP span.
    let t2 = "4bf92f3577b34da6a3ce929d0e0e4736";
    let p2 = "00f067aa0ba902b7";
    let body = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "test_error_handling", "arguments": {}, "_meta": { "traceparent": format!("00-{t2}-{p2}-01") } } });
    let resp = c.post_with(&a, &body, &[("traceparent", &header_parent)]).await;
    let r: Value = resp.json().await.unwrap();
    assert_eq!(r["result"]["isError"], true);
    let trace2 = TraceId::from_hex(t2).unwrap();
    eventually(5, "the _meta-parented span", || async {
        exporter.get_finished_spans().unwrap().iter().any(|s| s.name == "tools/call test_error_handling")
    })
    .await;
    let spans = exporter.get_finished_spans().unwrap();
    let meta = find(&spans, "tools/call test_error_handling", trace2);
    assert_eq!(meta.parent_span_id, SpanId::from_hex(p2).unwrap());
    assert_eq!(attr(meta, "error.type").as_deref(), Some("tool_error"));
    assert!(attr(meta, "rpc.response.status_code").is_none(), "a tool error is a result, not a JSON-RPC error");
    // Parented to the client's context from `_meta`, and linked to the ambient one: the HTTP span that carried it.
    assert_eq!(meta.links.len(), 1, "a link to the HTTP span");
    let carrier = &meta.links[0].span_context;
    let http2 = spans.iter().find(|s| s.name == "POST /mcp" && s.span_context.span_id() == carrier.span_id());
    assert!(http2.is_some_and(|h| h.span_context.trace_id() == trace1), "the link names the HTTP span");
    assert!(spans.iter().filter(|s| s.name == "POST /mcp").any(|s| s.span_context.trace_id() == trace1
        && s.parent_span_id == SpanId::from_hex(p1).unwrap()
        && s.span_context.span_id() != http.span_context.span_id()));

    // 2b. A resource's URI, and a JSON-RPC error's code as the error type and the status code.
    let read =
        json!({ "jsonrpc": "2.0", "id": 20, "method": "resources/read", "params": { "uri": "test://static-text" } });
    assert_eq!(c.post(&a, &read).await.status(), 200);
    let unknown = json!({ "jsonrpc": "2.0", "id": 21, "method": "tools/call", "params": { "name": "no_such_tool", "arguments": {} } });
    c.post(&b, &unknown).await;
    eventually(5, "the resources/read and failed call spans", || async {
        let spans = exporter.get_finished_spans().unwrap();
        spans.iter().any(|s| s.name == "resources/read") && spans.iter().any(|s| s.name == "tools/call no_such_tool")
    })
    .await;
    let spans = exporter.get_finished_spans().unwrap();
    let read = spans.iter().find(|s| s.name == "resources/read").unwrap();
    assert_eq!(attr(read, "mcp.resource.uri").as_deref(), Some("test://static-text"));
    let failed = spans.iter().find(|s| s.name == "tools/call no_such_tool").unwrap();
    assert_eq!(attr(failed, "error.type").as_deref(), Some("-32602"));
    assert_eq!(attr(failed, "rpc.response.status_code").as_deref(), Some("-32602"));

    // 3. Across replicas: test_sampling runs on A; the client answers the sampling request through B. B's span
    //    for the answer is a child of the call's span on A.
    let mut s = c.call_streaming(&a, 3, "test_sampling", json!({ "prompt": "trace me" })).await;
    let request = s.until_method("sampling/createMessage", T).await.unwrap();
    let reply = json!({ "jsonrpc": "2.0", "id": request["id"], "result": {
        "role": "assistant", "content": { "type": "text", "text": "traced" }, "model": "m", "stopReason": "endTurn" } });
    assert_eq!(c.post(&b, &reply).await.status(), 202);
    s.collect(T).await.unwrap();
    eventually(5, "the sampling call span", || async {
        exporter.get_finished_spans().unwrap().iter().any(|s| s.name == "tools/call test_sampling")
    })
    .await;
    let spans = exporter.get_finished_spans().unwrap();
    let sampling = spans.iter().find(|s| s.name == "tools/call test_sampling").unwrap();
    let answer = spans.iter().find(|s| s.name == "deliver client response").expect("an answer span");
    assert_eq!(answer.span_context.trace_id(), sampling.span_context.trace_id(), "the answer joins the call's trace");
    assert_eq!(answer.parent_span_id, sampling.span_context.span_id());
    assert_eq!(answer.links.len(), 1, "linked to the HTTP request that carried it");
    provider.shutdown().unwrap();
}
