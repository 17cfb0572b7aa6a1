//! A tool writer's server, end to end: `examples/greet` copied out of the repository (its `mcpfleet` dependency
//! pointed at this checkout by path, nothing else changed), built with cargo, and served as three replicas on one
//! Redis behind round-robin to clients of both protocol generations; and the same crate without
//! `deny_unknown_fields`, which must refuse to start.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{Fleet, McpClient, RedisServer, RoundRobinProxy, StatelessClient};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Copies `examples/greet` into `dir` as package `name`, its `mcpfleet` dependency set to this checkout's path,
/// with `edit` applied to its `src/main.rs`; builds it (offline, in a target directory shared by these tests and
/// kept between runs, with the workspace's profile, so that its dependencies build once); its binary.
fn build_greet(dir: &Path, name: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let example = root().join("examples/greet");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let server = root().join("crates/server");
    let manifest = std::fs::read_to_string(example.join("Cargo.toml")).unwrap();
    let manifest = manifest
        .replace("path = \"../../crates/server\"", &format!("path = {:?}", server.to_str().unwrap()))
        .replace("name = \"greet\"", &format!("name = {name:?}"));
    assert!(manifest.contains(server.to_str().unwrap()), "the example depends on ../../crates/server by path");
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::copy(example.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let main = std::fs::read_to_string(example.join("src/main.rs")).unwrap();
    std::fs::write(dir.join("src/main.rs"), edit(&main)).unwrap();
    let target = root().join("target/greet-example");
    let out = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args(["build", "--offline", "--quiet"])
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo build of the copied example failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join("debug").join(name)
}

/// The `serverInfo` object anywhere in a JSON document.
fn server_info(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(m) => m
            .iter()
            .find(|(k, _)| k.as_str() == "serverInfo" || k.ends_with("/serverInfo"))
            .map(|(_, v)| v)
            .or_else(|| m.values().find_map(server_info)),
        Value::Array(a) => a.iter().find_map(server_info),
        _ => None,
    }
}

fn text(result: &Value) -> String {
    result["content"].as_array().unwrap().iter().filter_map(|c| c["text"].as_str()).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_crate_builds_outside_the_workspace_and_serves_greet_on_three_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_greet(dir.path(), "greet", str::to_owned);
    // The crate's own test: the harness, from a writer's crate.
    let out = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .args(["test", "--offline", "--quiet"])
        .env("CARGO_TARGET_DIR", root().join("target/greet-example"))
        .env_remove("RUSTFLAGS")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && report.contains("1 passed"), "cargo test of the copied example:\n{report}");
    let redis = RedisServer::start();
    let fleet = Fleet::builder().replicas(3).redis(redis.url()).binary(&bin).start().await;
    let proxy = RoundRobinProxy::start(fleet.bases()).await;
    let url = proxy.url();

    // 2025-11-25: a session whose messages land on every replica in turn.
    let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } } });
    let first: Value = McpClient::new().post(&url, &init).await.json().await.unwrap();
    assert_eq!(first["result"]["serverInfo"], json!({ "name": "greet", "version": "0.1.0" }), "{first}");
    let mut client = McpClient::new();
    client.initialize(&url).await;
    let list = client.request(&url, 1, "tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{list}");
    let schema = &tools[0]["inputSchema"];
    assert_eq!(tools[0]["name"], "greet");
    assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema", "{schema}");
    assert_eq!(schema["additionalProperties"], false, "closed by deny_unknown_fields: {schema}");
    assert_eq!(schema["properties"]["name"]["maxLength"], 64, "{schema}");
    assert_eq!(schema["required"], json!(["name"]), "{schema}");
    for (id, n) in [(2, "Ada"), (3, "Grace"), (4, "Barbara")] {
        let r = client.request(&url, id, "tools/call", json!({ "name": "greet", "arguments": { "name": n } })).await;
        assert_eq!(r["result"]["isError"], Value::Null, "{r}");
        assert!(text(&r["result"]).contains(&format!("Hello, {n}")), "{r}");
    }
    let unknown = client
        .request(&url, 5, "tools/call", json!({ "name": "greet", "arguments": { "name": "Ada", "admin": true } }))
        .await;
    assert_eq!(unknown["result"]["isError"], true, "an unknown argument is refused: {unknown}");
    assert!(text(&unknown["result"]).contains("(unexpected: \"admin\")"), "{unknown}");
    let long = "x".repeat(65);
    let too_long =
        client.request(&url, 6, "tools/call", json!({ "name": "greet", "arguments": { "name": long } })).await;
    assert_eq!(too_long["result"]["isError"], true, "65 characters are refused: {too_long}");
    assert!(text(&too_long["result"]).contains("/arguments/name"), "{too_long}");

    // 2026-07-28: stateless requests through the same proxy.
    let stateless = StatelessClient::new();
    let (status, discover) = stateless.request(&url, 1, "server/discover", json!({})).await;
    assert_eq!(status, 200, "{discover}");
    assert_eq!(server_info(&discover).map(|s| &s["name"]), Some(&json!("greet")), "{discover}");
    for id in 2..5 {
        let r = stateless.call(&url, id, "greet", json!({ "name": "Ada" }), json!({})).await;
        assert!(text(&r["result"]).contains("Hello, Ada"), "{r}");
    }
    let r = stateless.call(&url, 5, "greet", json!({ "name": "x".repeat(65) }), json!({})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");

    // Every replica's admin listener has greet in the per-tool series, and served some of the calls.
    let http = reqwest::Client::new();
    let mut served = 0.0;
    for replica in &fleet.replicas {
        let metrics = http.get(format!("{}/metrics", replica.admin())).send().await.unwrap().text().await.unwrap();
        assert!(metrics.contains("mcp_tool_calls_total{outcome=\"ok\",tool=\"greet\"}"), "{metrics}");
        served += metrics
            .lines()
            .filter(|l| l.starts_with("mcp_tool_calls_total{") && l.contains("tool=\"greet\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    // 2025: three greetings and two refusals; 2026-07-28: three greetings and one refusal.
    assert_eq!(served, 9.0, "every call counted once, on the replica that ran it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_crate_without_deny_unknown_fields_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let open = |main: &str| {
        assert!(main.contains("#[serde(deny_unknown_fields)]\n"), "the example closes its arguments");
        main.replace("#[serde(deny_unknown_fields)]\n", "")
    };
    let bin = build_greet(dir.path(), "greet-open", open);
    let out = Command::new(&bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("greet-open: tool input schemas fail the lint: greet /: "), "{stderr}");
    assert!(lines[0].contains("(open-object)"), "{stderr}");
    // The fixture sets are the mcpfleet binary's: a writer's build without them has no --fixtures flag.
    let out = Command::new(&bin).args(["serve", "--fixtures", "conformance"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--fixtures"), "{}", String::from_utf8_lossy(&out.stderr));
}
