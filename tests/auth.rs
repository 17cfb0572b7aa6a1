//! End-to-end identity: real replicas (processes) with `--auth jwt` against a real local issuer (a JWKS endpoint
//! on loopback that rotates keys and goes down), a real Redis. Every case checks the status, the
//! `WWW-Authenticate` challenge and the JSON-RPC body a client sees; the table each test prints is the one in the
//! closing note.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use jsonwebtoken::Algorithm;
use mcpfleet_core::time::epoch_secs;
use mcpfleet_fleetkit::issuer::AUDIENCE;
use mcpfleet_fleetkit::{Fleet, Issuer, McpClient, RedisServer, SseStream, TestKey, eventually, scrape, server_bin};
use serde_json::{Value, json};
use std::time::Duration;

const RESOURCE: &str = "https://mcp.test/mcp";
const METADATA: &str = "https://mcp.test/.well-known/oauth-protected-resource/mcp";
const T: Duration = Duration::from_secs(10);

fn rsa1() -> TestKey {
    TestKey::load("rsa-1", "rsa-1", Algorithm::RS256)
}

async fn fleet(redis: &RedisServer, issuer: &Issuer, n: usize, extra: &[&str]) -> Fleet {
    let mut b = Fleet::builder().replicas(n).redis(redis.url()).jwt(issuer);
    for a in extra {
        b = b.arg(*a);
    }
    b.start().await
}

/// A fleet with `--auth jwt` against an issuer publishing `rsa-1`. Bind the fields in this order (`redis`,
/// `issuer`, `key`, `fleet`) so that the replicas are dropped first.
struct Setup {
    fleet: Fleet,
    key: TestKey,
    issuer: Issuer,
    redis: RedisServer,
}

async fn rsa_fleet(n: usize, extra: &[&str]) -> Setup {
    let redis = RedisServer::start();
    let key = rsa1();
    let issuer = Issuer::start(&[&key]).await;
    let fleet = fleet(&redis, &issuer, n, extra).await;
    Setup { fleet, key, issuer, redis }
}

fn init_body() -> Value {
    json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "auth-tests", "version": "1" } } })
}

/// What a client saw.
#[derive(Debug)]
struct Seen {
    status: u16,
    challenge: String,
    body: Value,
}

async fn send(rb: reqwest::RequestBuilder) -> Seen {
    let resp = rb.send().await.unwrap();
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get_all("www-authenticate")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect::<Vec<_>>()
        .join(" | ");
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Seen { status, challenge, body }
}

/// POSTs an initialize with these Authorization header values (none, one, or several).
/// One HTTP client for the whole suite: building one costs tens of milliseconds in a debug build (its TLS roots),
/// which would stretch the timing checks below.
fn http() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        mcpfleet_fleetkit::init_tls();
        reqwest::Client::new()
    })
}

async fn initialize_with(url: &str, authorization: &[&str]) -> Seen {
    let mut rb = http()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init_body().to_string());
    for a in authorization {
        rb = rb.header("authorization", *a);
    }
    send(rb).await
}

async fn with_token(url: &str, token: &str) -> Seen {
    initialize_with(url, &[&format!("Bearer {token}")]).await
}

fn expect(case: &str, seen: &Seen, status: u16, challenge_has: &[&str], table: &mut Vec<String>) {
    assert_eq!(seen.status, status, "{case}: {seen:?}");
    for part in challenge_has {
        assert!(seen.challenge.contains(part), "{case}: challenge {:?} lacks {part:?}", seen.challenge);
    }
    if status >= 400 && status != 503 {
        assert!(seen.challenge.starts_with("Bearer"), "{case}: {seen:?}");
        assert!(seen.body["error"]["message"].is_string(), "{case}: JSON-RPC error body: {seen:?}");
    }
    table.push(format!("| {case} | {} | `{}` |", seen.status, seen.challenge));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_credential_gets_its_challenge() {
    let redis = RedisServer::start();
    let key = rsa1();
    let issuer = Issuer::start(&[&key]).await;
    let evil_key = TestKey::load("rsa-evil", "evil", Algorithm::RS256);
    let evil = Issuer::start(&[&evil_key]).await;
    let logs = std::env::temp_dir().join(format!("mcpfleet-auth-logs-{}", std::process::id()));
    let _ = std::fs::remove_file(&logs);
    let fleet = Fleet::builder().replicas(2).redis(redis.url()).log_to(&logs, "debug").jwt(&issuer).start().await;
    let urls = fleet.urls();
    let url = &urls[0];
    let id = issuer.id();
    let good = || key.token(&id, "alice");
    let mut table = vec!["| case | status | WWW-Authenticate |".to_owned(), "|---|---|---|".to_owned()];
    let t = &mut table;
    let invalid = ["error=\"invalid_token\"", &format!("resource_metadata=\"{METADATA}\"")];

    // No credentials: a bare challenge that points to the metadata and names the scope; no error code.
    let s = initialize_with(url, &[]).await;
    expect(
        "no Authorization header",
        &s,
        401,
        &[&format!("resource_metadata=\"{METADATA}\""), "scope=\"mcp:access\""],
        t,
    );
    assert!(!s.challenge.contains("error="), "{s:?}");

    // Malformed requests: 400 invalid_request.
    for (case, headers) in [
        ("Basic credentials", vec!["Basic YWxpY2U6c2VjcmV0"]),
        ("empty bearer", vec!["Bearer "]),
        ("bearer with a space inside", vec!["Bearer abc def"]),
    ] {
        expect(case, &initialize_with(url, &headers).await, 400, &["error=\"invalid_request\""], t);
    }
    let token = good().sign();
    let two = [format!("Bearer {token}"), format!("Bearer {token}")];
    let s = initialize_with(url, &[&two[0], &two[1]]).await;
    expect("two Authorization headers", &s, 400, &["error=\"invalid_request\""], t);

    // A token in the query string: refused even with a valid header, and never written to the logs.
    let query_token = good().claim("jti", json!("query-string-token-marker")).sign();
    let rb = reqwest::Client::new()
        .post(format!("{url}?access_token={query_token}"))
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init_body().to_string());
    expect("token in the query string", &send(rb).await, 400, &["error=\"invalid_request\""], t);

    // Invalid tokens: 401 invalid_token.
    let cases: Vec<(&str, String)> = vec![
        ("not a JWT", "abc.def".to_owned()),
        ("garbage in three parts", "eyJhbGciOi.eyJzdWIiOi.c2ln".to_owned()),
        ("expired", good().claim("exp", json!(epoch_secs() - 120)).sign()),
        ("not yet valid (nbf)", good().claim("nbf", json!(epoch_secs() + 120)).sign()),
        ("issued in the future (iat)", good().claim("iat", json!(epoch_secs() + 120)).sign()),
        ("wrong iss", good().claim("iss", json!("https://evil.example")).sign()),
        ("missing iss", good().without_claim("iss").sign()),
        ("wrong aud", good().claim("aud", json!("https://other.example/mcp")).sign()),
        ("aud array without ours", good().claim("aud", json!(["a", "b"])).sign()),
        ("missing aud", good().without_claim("aud").sign()),
        ("missing sub", good().without_claim("sub").sign()),
        ("missing exp", good().without_claim("exp").sign()),
        ("lives longer than --max-token-lifetime (24 h)", good().claim("exp", json!(epoch_secs() + 48 * 3600)).sign()),
        ("no iat, and expires beyond --max-token-lifetime", {
            good().without_claim("iat").claim("exp", json!(epoch_secs() + 25 * 3600)).sign()
        }),
        ("typ JWT (policy at+jwt)", good().header("typ", json!("JWT")).sign()),
        ("no typ", good().without_header("typ").sign()),
        ("alg none", good().unsigned("none")),
        ("alg None", good().unsigned("None")),
        ("alg NONE", good().unsigned("NONE")),
        ("alg nOnE", good().unsigned("nOnE")),
        ("HS256 signed with the RSA public key", good().hs256_with(key.public_pem())),
        ("alg RS256 header on a PS256 signature", {
            let ps = TestKey::load("rsa-1", "rsa-1", Algorithm::PS256);
            ps.token(&id, "alice").header("alg", json!("RS256")).sign()
        }),
        ("unknown kid", good().header("kid", json!("no-such-key")).sign()),
        ("kid path traversal", good().header("kid", json!("../../../../etc/passwd")).sign()),
        ("kid naming a URL", good().header("kid", json!(evil.jwks_url())).sign()),
        ("kid SQL", good().header("kid", json!("' OR '1'='1")).sign()),
        ("kid of 1000 characters", good().header("kid", json!("k".repeat(1000))).sign()),
        ("token over 8 KiB", good().claim("pad", json!("p".repeat(9000))).sign()),
        ("kid with control characters", good().header("kid", json!("a\u{0}b\nc")).sign()),
        ("kid as a number", good().header("kid", json!(7)).sign()),
        ("jku to another issuer", { evil_key.token(&id, "alice").header("jku", json!(evil.jwks_url())).sign() }),
        ("jku on a good token", good().header("jku", json!(evil.jwks_url())).sign()),
        ("x5u header", good().header("x5u", json!(evil.jwks_url())).sign()),
        ("embedded jwk header", evil_key.token(&id, "alice").header("jwk", evil_key.jwk(true)).sign()),
        ("crit header", good().header("crit", json!(["exp"])).sign()),
        ("signed by an unknown key with a known kid", {
            TestKey::load("rsa-evil", "rsa-1", Algorithm::RS256).token(&id, "alice").sign()
        }),
        ("tampered payload", {
            let t = good().sign();
            let parts: Vec<&str> = t.split('.').collect();
            let other = good().claim("sub", json!("mallory")).sign();
            format!("{}.{}.{}", parts[0], other.split('.').nth(1).unwrap(), parts[2])
        }),
    ];
    for (case, token) in &cases {
        expect(case, &with_token(url, token).await, 401, &invalid, t);
    }
    assert_eq!(evil.fetches(), 0, "a jku, x5u or kid was followed");

    // GET and DELETE are challenged the same way.
    let http = reqwest::Client::new();
    let s = send(http.get(url).header("accept", "text/event-stream").header("mcp-session-id", "a".repeat(32))).await;
    expect("GET without credentials", &s, 401, &["resource_metadata=", "scope=\"mcp:access\""], t);
    let s =
        send(http.delete(url).header("authorization", "Bearer nope").header("mcp-session-id", "a".repeat(32))).await;
    expect("DELETE with a bad token", &s, 401, &invalid, t);

    // Hostile kids cannot make the replicas hammer the issuer: one refresh per interval at most.
    let before = issuer.fetches();
    let started = std::time::Instant::now();
    for i in 0..40 {
        let s = with_token(&urls[i % 2], &good().header("kid", json!(format!("random-{i}"))).sign()).await;
        assert_eq!(s.status, 401);
    }
    let (extra, took) = (issuer.fetches() - before, started.elapsed());
    println!("40 unknown kids took {took:?}: {extra} JWKS fetches");
    // At most one refresh per replica per 1 s interval (plus the one in flight at each end).
    let allowed = 2 * (took.as_secs() + 2);
    assert!(extra as u64 <= allowed, "40 unknown kids in {took:?} caused {extra} JWKS fetches (allowed {allowed})");

    // And the good ones: a plain token, and aud as an array that contains ours.
    expect("valid token", &with_token(url, &good().sign()).await, 200, &[], t);
    let arr = good().claim("aud", json!(["https://other.example", AUDIENCE])).sign();
    expect("aud array containing ours", &with_token(url, &arr).await, 200, &[], t);
    let jwt_typ = good().header("typ", json!("application/at+jwt")).sign();
    expect("typ application/at+jwt", &with_token(url, &jwt_typ).await, 200, &[], t);

    // A graceful stop flushes the replicas' log writers (a kill could lose the last lines).
    let exits = fleet.stop_gracefully().await;
    assert!(exits.iter().all(|c| *c == Some(0)), "{exits:?}");
    let log = std::fs::read_to_string(&logs).unwrap();
    assert!(log.contains("DEBUG") || log.contains("\"level\""), "the replicas logged nothing: {log:.200}");
    let marker_payload = query_token.split('.').nth(1).unwrap();
    assert!(!log.contains(&query_token) && !log.contains(marker_payload), "a token reached the logs");
    assert!(!log.contains(&token), "a bearer token reached the logs");
    let _ = std::fs::remove_file(&logs);
    println!("{}", table.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_algorithm_verifies_and_its_key_pins_it() {
    let redis = RedisServer::start();
    let rs = rsa1();
    let ps = TestKey::load("rsa-2", "rsa-2", Algorithm::PS256);
    let es = TestKey::load("ec-1", "ec-1", Algorithm::ES256);
    let ed = TestKey::load("ed-1", "ed-1", Algorithm::EdDSA);
    let issuer = Issuer::start(&[&rs, &ps, &es, &ed]).await;
    let fleet = fleet(&redis, &issuer, 1, &[]).await;
    let url = &fleet.urls()[0];
    for k in [&rs, &ps, &es, &ed] {
        let s = with_token(url, &k.token(&issuer.id(), "alice").sign()).await;
        assert_eq!(s.status, 200, "{k:?}: {s:?}");
    }
    // rsa-2 is published for PS256 only: an RS256 signature by the same key is refused, and so is an ES256
    // header on the EC key's kid signed by the RSA key.
    let rs_on_ps = TestKey::load("rsa-2", "rsa-2", Algorithm::RS256).token(&issuer.id(), "alice").sign();
    let s = with_token(url, &rs_on_ps).await;
    assert_eq!(s.status, 401, "{s:?}");
    assert!(s.challenge.contains("invalid_token"));
    let confused = TestKey::load("rsa-1", "ec-1", Algorithm::RS256).token(&issuer.id(), "alice").sign();
    assert_eq!(with_token(url, &confused).await.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_gate_the_endpoint_and_each_tool() {
    let Setup { redis: _redis, issuer, key, fleet } =
        rsa_fleet(2, &["--tool-scope", "test_simple_text=tools:text"]).await;
    let urls = fleet.urls();
    let id = issuer.id();

    // The endpoint scope.
    let s = with_token(&urls[0], &key.token(&id, "alice").claim("scope", json!("tools:text")).sign()).await;
    assert_eq!(s.status, 403, "{s:?}");
    for part in ["error=\"insufficient_scope\"", "scope=\"mcp:access\"", &format!("resource_metadata=\"{METADATA}\"")] {
        assert!(s.challenge.contains(part), "{s:?}");
    }

    // Only mcp:access: tools that need more are hidden from tools/list and refused at tools/call with 403.
    let plain = key.token(&id, "alice").sign();
    let mut c = McpClient::new().with_token(&plain);
    c.initialize(&urls[0]).await;
    let names = |v: &Value| -> Vec<String> {
        v["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
    };
    let listed = names(&c.request(&urls[1], 1, "tools/list", json!({})).await);
    assert!(listed.contains(&"test_image_content".to_owned()));
    assert!(!listed.contains(&"test_whoami".to_owned()), "tool-declared scope not applied to tools/list");
    assert!(!listed.contains(&"test_simple_text".to_owned()), "--tool-scope not applied to tools/list");
    for (tool, scope) in [("test_whoami", "fixtures:whoami"), ("test_simple_text", "tools:text")] {
        let body =
            json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": { "name": tool, "arguments": {} } });
        let resp = c.post(&urls[1], &body).await;
        assert_eq!(resp.status(), 403, "{tool}");
        let ch = resp.headers()["www-authenticate"].to_str().unwrap().to_owned();
        // Every scope the request needs (the endpoint's, then the tool's), so that a client that replaces its
        // scopes with the challenge's (the 1.x SDKs) asks for a token that works.
        assert!(
            ch.contains("error=\"insufficient_scope\"") && ch.contains(&format!("scope=\"mcp:access {scope}\"")),
            "{ch}"
        );
        assert!(ch.contains(&format!("resource_metadata=\"{METADATA}\"")), "{ch}");
        let b: Value = resp.json().await.unwrap();
        assert!(b["error"]["message"].as_str().unwrap().contains(scope), "{b}");
    }

    // The 2026-07-28 generation answers the same challenge.
    let stateless = mcpfleet_fleetkit::StatelessClient::new().with_token(&plain);
    let resp = stateless
        .send(&urls[0], &stateless.body(7, "tools/call", json!({ "name": "test_whoami", "arguments": {} })), &[])
        .await;
    assert_eq!(resp.status(), 403);
    let ch = resp.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert!(ch.contains("error=\"insufficient_scope\"") && ch.contains("scope=\"mcp:access fixtures:whoami\""), "{ch}");

    // Step-up: a new token with the scopes (scp as an array this time), same session, other replica.
    let more = key
        .token(&id, "alice")
        .without_claim("scope")
        .claim("scp", json!(["mcp:access", "fixtures:whoami", "tools:text"]))
        .claim("client_id", json!("step-up-client"))
        .sign();
    let c2 = McpClient { token: Some(more), ..c.clone() };
    let listed = names(&c2.request(&urls[1], 3, "tools/list", json!({})).await);
    assert!(listed.contains(&"test_whoami".to_owned()) && listed.contains(&"test_simple_text".to_owned()));
    let r = c2.request(&urls[0], 4, "tools/call", json!({ "name": "test_whoami", "arguments": {} })).await;
    let who: Value = serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(who["sub"], "alice");
    assert_eq!(who["iss"], id);
    assert_eq!(who["client_id"], "step-up-client");
    assert_eq!(who["scopes"], json!(["fixtures:whoami", "mcp:access", "tools:text"]));
    let r = c2.request(&urls[1], 5, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert_eq!(r["result"]["content"][0]["type"], "text");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_belong_to_their_subject_and_survive_a_token_refresh() {
    let Setup { redis: _redis, issuer, key, fleet } = rsa_fleet(2, &[]).await;
    let [a, b] = [0, 1].map(|i| fleet.urls()[i].clone());
    let id = issuer.id();

    let mut bob = McpClient::new().with_token(&key.token(&id, "bob").sign());
    let bob_sid = bob.initialize(&a).await;
    let resp = bob.get(&b, None).await;
    assert_eq!(resp.status(), 200);
    let mut bob_stream = SseStream::new(resp);
    bob_stream.next(T).await.unwrap().unwrap(); // priming

    // Alice, with a valid token of her own, names Bob's session on every method and every replica.
    let mut alice = McpClient::new().with_token(&key.token(&id, "alice").sign());
    alice.session = Some(bob_sid.clone());
    for url in [&a, &b] {
        let r = alice.post(url, &json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" })).await;
        assert_eq!(r.status(), 404, "POST with a foreign session");
        let r = alice
            .post(
                url,
                &json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": { "name": "test_update_watched_resource", "arguments": {} } }),
            )
            .await;
        assert_eq!(r.status(), 404, "tools/call with a foreign session");
        assert_eq!(alice.get(url, None).await.status(), 404, "GET with a foreign session");
        assert_eq!(alice.delete(url).await.status(), 404, "DELETE with a foreign session");
    }

    // Bob's session and stream are untouched: a call of his still reaches his stream.
    let r = bob.request(&a, 3, "tools/call", json!({ "name": "test_update_watched_resource", "arguments": {} })).await;
    assert!(r["result"].is_object(), "{r}");
    let ev = bob_stream.next(T).await.unwrap().unwrap();
    assert_eq!(ev.json().unwrap()["method"], "notifications/resources/updated");

    // A refreshed token (new jti, exp, scopes) for the same iss and sub keeps the session, on either replica.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let refreshed = key
        .token(&id, "bob")
        .claim("exp", json!(epoch_secs() + 3600))
        .claim("scope", json!("mcp:access tools:read"))
        .sign();
    assert_ne!(refreshed, bob.token.clone().unwrap());
    let bob2 = McpClient { token: Some(refreshed), ..bob.clone() };
    assert_eq!(bob2.request(&b, 4, "ping", json!({})).await["result"], json!({}));
    assert_eq!(bob2.delete(&a).await.status(), 200);
    assert_eq!(bob.post(&b, &json!({ "jsonrpc": "2.0", "id": 5, "method": "ping" })).await.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_without_a_restart_and_survive_an_issuer_outage() {
    let redis = RedisServer::start();
    let old = rsa1();
    let new = TestKey::load("ed-1", "ed-2026", Algorithm::EdDSA);
    let issuer = Issuer::start(&[&old]).await;
    let fleet = fleet(&redis, &issuer, 2, &[]).await;
    let urls = fleet.urls();
    let id = issuer.id();
    // One token, verified (and so remembered) by both replicas before the rotation.
    let old_token = old.token(&id, "alice").sign();
    for u in &urls {
        assert_eq!(with_token(u, &old_token).await.status, 200);
        assert_eq!(with_token(u, &old_token).await.status, 200);
    }
    let admin = fleet.replicas[0].admin();
    let m = scrape(&admin).await;
    assert_eq!(m[r#"mcp_jwks_refresh_total{result="ok"}"#], 1.0, "one load at start");
    assert_eq!(m["mcp_jwks_keys"], 1.0);
    assert!(m["mcp_jwks_last_success_timestamp_seconds"] > 1.7e9);
    assert_eq!(m[r#"mcp_token_verifications_total{result="verified"}"#], 1.0);
    assert_eq!(m[r#"mcp_token_verifications_total{result="cached"}"#], 1.0, "the second use was remembered");

    // Rotation: the issuer publishes a new key and drops the old one. A token with the new kid works on every
    // replica (an unknown kid triggers a refresh, at most once per second here); the old key stops working.
    issuer.publish(&[&new]);
    for u in &urls {
        let u = u.clone();
        let token = new.token(&id, "alice").sign();
        eventually(10, "the new key to be accepted", || {
            let (u, token) = (u.clone(), token.clone());
            async move { with_token(&u, &token).await.status == 200 }
        })
        .await;
    }
    // The remembered verdicts went with the old key set: the same token is refused on both replicas at once.
    for u in &urls {
        let s = with_token(u, &old_token).await;
        assert_eq!(s.status, 401, "a token of a dropped key: {s:?}");
    }

    // The issuer goes down: cached keys keep working; an unknown kid is still a plain 401.
    let errors = |m: &std::collections::BTreeMap<String, f64>| {
        m.get(r#"mcp_jwks_refresh_total{result="error"}"#).copied().unwrap_or(0.0)
    };
    let errors_before = errors(&scrape(&admin).await);
    issuer.down();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for u in &urls {
        let s = with_token(u, &new.token(&id, "alice").sign()).await;
        assert_eq!(s.status, 200, "cached keys while the issuer is down: {s:?}");
        let s = with_token(u, &new.token(&id, "alice").header("kid", json!("unknown")).sign()).await;
        assert_eq!(s.status, 401, "{s:?}");
    }
    let m = scrape(&admin).await;
    assert_eq!(errors(&m) - errors_before, 1.0, "the unknown kid tried one refresh, which failed and is counted");
    assert_eq!(m["mcp_jwks_keys"], 1.0, "the last good keys are kept");
    assert!(m[r#"mcp_token_verifications_total{result="rejected"}"#] >= 2.0);

    // A replica that starts while the issuer is down has no keys: 503 with Retry-After, not a misleading 401.
    let late = self::fleet(&redis, &issuer, 1, &[]).await;
    let late_url = late.urls()[0].clone();
    let resp = reqwest::Client::new()
        .post(&late_url)
        .header("authorization", format!("Bearer {}", new.token(&id, "alice").sign()))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init_body().to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");

    // The issuer comes back: the late replica loads the keys on its own.
    issuer.up().await;
    eventually(10, "the late replica to load the keys", || {
        let (u, token) = (late_url.clone(), new.token(&id, "alice").sign());
        async move { with_token(&u, &token).await.status == 200 }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_cached_for_their_max_age() {
    let Setup { redis, issuer, key, fleet } = rsa_fleet(1, &[]).await;
    let url = fleet.urls()[0].clone();
    let token = key.token(&issuer.id(), "alice").sign();
    assert_eq!(issuer.fetches(), 1, "one fetch at start");
    // max-age=300: known keys are used without asking the issuer again.
    for _ in 0..5 {
        assert_eq!(with_token(&url, &token).await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(with_token(&url, &token).await.status, 200);
    assert_eq!(issuer.fetches(), 1, "keys refetched before their max-age");

    // A replica whose JWKS said max-age=1 refreshes in the background once the keys are stale, while requests
    // keep being served with the cached keys.
    issuer.set_max_age(1);
    let short = self::fleet(&redis, &issuer, 1, &[]).await;
    let short_url = short.urls()[0].clone();
    let before = issuer.fetches();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(with_token(&short_url, &token).await.status, 200);
    eventually(5, "a background refresh of stale keys", || async { issuer.fetches() > before }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_token_still_expires() {
    let Setup { redis: _redis, issuer, key, fleet } = rsa_fleet(1, &["--jwt-leeway", "0s"]).await;
    let url = fleet.urls()[0].clone();
    let token = key.token(&issuer.id(), "alice").claim("exp", json!(epoch_secs() + 2)).sign();
    assert_eq!(with_token(&url, &token).await.status, 200);
    assert_eq!(with_token(&url, &token).await.status, 200);
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let s = with_token(&url, &token).await;
    assert_eq!(s.status, 401, "{s:?}");
    assert!(s.challenge.contains("the token has expired"), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_is_public_and_cors_open() {
    let Setup { redis: _redis, issuer: _issuer, key: _, fleet } =
        rsa_fleet(1, &["--authorization-server", "https://login.test"]).await;
    let base = fleet.bases()[0].clone();
    let http = reqwest::Client::new();
    for path in ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"] {
        let resp = http.get(format!("{base}{path}")).header("origin", "https://app.example").send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.headers()["access-control-allow-origin"], "*");
        let doc: Value = resp.json().await.unwrap();
        assert_eq!(doc["resource"], RESOURCE);
        assert_eq!(doc["authorization_servers"], json!(["https://login.test"]));
        assert_eq!(doc["bearer_methods_supported"], json!(["header"]));
        assert_eq!(doc["scopes_supported"], json!(["fixtures:whoami", "mcp:access"]));
        let pre = http
            .request(reqwest::Method::OPTIONS, format!("{base}{path}"))
            .header("origin", "https://app.example")
            .header("access-control-request-method", "GET")
            .send()
            .await
            .unwrap();
        assert!(pre.status().is_success(), "{path} preflight");
        assert_eq!(pre.headers()["access-control-allow-origin"], "*");
        assert!(pre.headers()["access-control-allow-methods"].to_str().unwrap().contains("GET"));
    }

    // With --auth none there is nothing to discover.
    let none = Fleet::builder().start().await;
    let r = http.get(format!("{}/.well-known/oauth-protected-resource", none.bases()[0])).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

/// The sum of every `mcp_requests_total` series of a replica.
async fn requests_counted(admin: &str) -> f64 {
    scrape(admin).await.iter().filter(|(k, _)| k.starts_with("mcp_requests_total")).map(|(_, v)| v).sum()
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> &'a str {
    resp.headers().get(name).map_or("", |v| v.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_on_allowed_origins_get_cors_and_no_one_else_does() {
    const APP: &str = "https://app.example";
    // A bucket of 3 that barely refills: were preflights admitted, the initialize after them would get 429.
    let Setup { redis: _redis, issuer, key, fleet } =
        rsa_fleet(1, &["--allowed-origins", APP, "--rate-burst", "3", "--rate-per-second", "0.001"]).await;
    let url = fleet.urls()[0].clone();
    let admin = fleet.replicas[0].admin();
    let token = key.token(&issuer.id(), "alice").sign();
    let preflight = |origin: &str, method: &str, headers: &str| {
        http()
            .request(reqwest::Method::OPTIONS, &url)
            .header("origin", origin)
            .header("access-control-request-method", method)
            .header("access-control-request-headers", headers)
    };

    // Preflights from the allowed origin: 204, never authenticated (no token), never admitted or counted.
    let before = requests_counted(&admin).await;
    for _ in 0..10 {
        let pre =
            preflight(APP, "POST", "authorization,content-type,mcp-protocol-version,mcp-session-id,mcp-param-region")
                .send()
                .await
                .unwrap();
        assert_eq!(pre.status(), 204);
        assert_eq!(header(&pre, "access-control-allow-origin"), APP);
        assert!(header(&pre, "vary").contains("Origin"), "{:?}", pre.headers());
        assert_eq!(header(&pre, "access-control-allow-methods"), "GET, POST, DELETE");
        let allowed = header(&pre, "access-control-allow-headers");
        for h in [
            "authorization",
            "content-type",
            "mcp-session-id",
            "mcp-protocol-version",
            "last-event-id",
            "mcp-method",
            "mcp-name",
            "traceparent",
            "x-request-id",
            "mcp-param-region",
        ] {
            assert!(allowed.split(", ").any(|a| a == h), "{h} not in {allowed}");
        }
        let max_age: u64 = header(&pre, "access-control-max-age").parse().unwrap();
        assert!((60..=7200).contains(&max_age), "{max_age}");
        assert!(pre.headers().get("access-control-allow-credentials").is_none());
        assert!(pre.text().await.unwrap().is_empty());
    }
    assert_eq!(requests_counted(&admin).await, before, "preflights are not requests to /mcp");

    // An initialize by `method` from `origin`, with the token or without.
    let initialize = |method: reqwest::Method, origin: &'static str, bearer: bool| {
        let mut rb = http()
            .request(method, &url)
            .header("origin", origin)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(init_body().to_string());
        if bearer {
            rb = rb.header("authorization", format!("Bearer {token}"));
        }
        rb.send()
    };

    // The real request from the allowed origin: its answer is readable, with the session header exposed.
    let init = initialize(reqwest::Method::POST, APP, true).await.unwrap();
    assert_eq!(init.status(), 200, "the preflights took no token of the bucket of 3");
    assert_eq!(header(&init, "access-control-allow-origin"), APP);
    assert!(header(&init, "vary").contains("Origin"));
    let exposed = header(&init, "access-control-expose-headers").to_owned();
    for h in ["mcp-session-id", "mcp-protocol-version", "www-authenticate", "retry-after", "ratelimit", "x-request-id"]
    {
        assert!(exposed.split(", ").any(|e| e == h), "{h} not exposed: {exposed}");
    }
    assert!(init.headers().get("access-control-allow-credentials").is_none());
    assert!(!header(&init, "mcp-session-id").is_empty());

    // A refusal to the allowed origin is readable too: the browser client sees the challenge and signs in.
    let anonymous = initialize(reqwest::Method::POST, APP, false).await.unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(header(&anonymous, "access-control-allow-origin"), APP);
    assert!(header(&anonymous, "www-authenticate").starts_with("Bearer"));

    // Any other origin: 403 whatever the method, preflight included, and no CORS header to read it with.
    let evil = "https://evil.example";
    let refused = preflight(evil, "POST", "authorization").send().await.unwrap();
    assert_eq!(refused.status(), 403);
    assert!(refused.headers().get("access-control-allow-origin").is_none());
    for method in [reqwest::Method::GET, reqwest::Method::POST, reqwest::Method::DELETE, reqwest::Method::OPTIONS] {
        let resp = initialize(method.clone(), evil, true).await.unwrap();
        assert_eq!(resp.status(), 403, "{method}");
        assert!(resp.headers().get("access-control-allow-origin").is_none(), "{method}");
    }
    // An allowed origin asking through a Host that is not allowed is refused too (DNS rebinding).
    let rebound = preflight(APP, "POST", "authorization").header("host", "evil.example").send().await.unwrap();
    assert_eq!(rebound.status(), 403);
    // The metadata documents stay open to any origin.
    let meta = http()
        .get(format!("{}/.well-known/oauth-protected-resource/mcp", fleet.bases()[0]))
        .header("origin", evil)
        .send()
        .await
        .unwrap();
    assert_eq!(header(&meta, "access-control-allow-origin"), "*");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_localhost_listener_answers_localhost_names_only() {
    let Setup { redis: _redis, issuer, key, fleet } = rsa_fleet(1, &[]).await;
    let url = fleet.urls()[0].clone();
    let token = key.token(&issuer.id(), "alice").sign();
    let post = |host: Option<&str>, origin: Option<&str>| {
        let mut rb = reqwest::Client::new()
            .post(&url)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(init_body().to_string());
        if let Some(h) = host {
            rb = rb.header("host", h);
        }
        if let Some(o) = origin {
            rb = rb.header("origin", o);
        }
        rb
    };
    assert_eq!(send(post(Some("evil.example"), None)).await.status, 403);
    assert_eq!(send(post(Some("mcp.test"), None)).await.status, 403);
    assert_eq!(send(post(None, Some("https://evil.example"))).await.status, 403);
    assert_eq!(send(post(Some("localhost:1234"), Some("http://localhost:3000"))).await.status, 200);
}

fn run_cli(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(server_bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn jwt_mode_refuses_to_start_without_issuer_audience_or_keys() {
    let base = ["serve", "--listen", "127.0.0.1:0", "--auth", "jwt"];
    let full = [
        "--jwt-issuer",
        "https://idp.test",
        "--jwt-audience",
        AUDIENCE,
        "--jwks-url",
        "https://idp.test/jwks",
        "--resource-url",
        RESOURCE,
    ];
    for (drop, why) in [
        ("--jwt-issuer", "--jwt-issuer"),
        ("--jwt-audience", "--jwt-audience"),
        ("--jwks-url", "--jwks-url or --jwks-file"),
        ("--resource-url", "--resource-url"),
    ] {
        let mut args: Vec<&str> = base.to_vec();
        let mut it = full.iter();
        while let (Some(flag), Some(value)) = (it.next(), it.next()) {
            if *flag != drop {
                args.extend([*flag, *value]);
            }
        }
        let (code, _, err) = run_cli(&args);
        assert_eq!(code, 64, "{drop}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(why), "{err}");
    }
    let mut args: Vec<&str> = base.to_vec();
    args.extend(full);
    args.extend(["--jwks-url", "http://idp.test/jwks"]);
    let (code, _, err) = run_cli(&args);
    assert_eq!(code, 64, "{err}");
    let (code, _, err) = run_cli(&["serve", "--listen", "0.0.0.0:0", "--auth", "dev"]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("non-loopback"), "{err}");
    let (code, _, err) = run_cli(&["serve", "--auth", "jwt", "--jwt-leeway", "60s"]);
    assert_eq!(code, 64, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_issuer_prints_a_token_and_mints_more() {
    let dir = std::env::temp_dir().join(format!("mcpfleet-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("dev-key.pem");
    let _ = std::fs::remove_file(&key_file);
    let redis = RedisServer::start();
    let mut fleet = Fleet::builder().replicas(2).redis(redis.url()).dev_auth(&key_file).start().await;
    let urls = fleet.urls();
    let line = fleet.replicas[0].stdout_line();
    let printed = line.trim().rsplit(' ').next().unwrap().to_owned();
    assert!(line.starts_with("dev token"), "{line}");

    // The printed token works on both replicas (they share the key file); it carries every scope.
    let mut c = McpClient::new().with_token(&printed);
    c.initialize(&urls[0]).await;
    let r = c.request(&urls[1], 1, "tools/call", json!({ "name": "test_whoami", "arguments": {} })).await;
    let who: Value = serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(who["sub"], "dev");

    // `mcpfleet token` mints more from the same key.
    let (code, out, err) =
        run_cli(&["token", "--sub", "alice", "--scope", "mcp:access", "--dev-key-file", key_file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let alice = out.trim().to_owned();
    assert_eq!(with_token(&urls[1], &alice).await.status, 200);
    let s = with_token(&urls[1], &format!("{alice}x")).await;
    assert_eq!(s.status, 401, "{s:?}");

    // The dev JWKS is published.
    let jwks: Value =
        reqwest::get(format!("{}/.well-known/jwks.json", fleet.bases()[0])).await.unwrap().json().await.unwrap();
    assert_eq!(jwks["keys"][0]["kty"], "OKP");
    drop(fleet);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_file_is_reread_when_it_rotates() {
    let dir = std::env::temp_dir().join(format!("mcpfleet-keyfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pem = dir.join("issuer.pem");
    let rsa = rsa1();
    std::fs::write(&pem, rsa.public_pem()).unwrap();
    let redis = RedisServer::start();
    let id = "https://idp.test";
    let args = [
        "--auth",
        "jwt",
        "--jwt-issuer",
        id,
        "--jwt-audience",
        AUDIENCE,
        "--resource-url",
        RESOURCE,
        "--jwks-refresh-interval",
        "1s",
        "--jwks-file",
        pem.to_str().unwrap(),
    ];
    let mut b = Fleet::builder().redis(redis.url());
    for a in args {
        b = b.arg(a);
    }
    let fleet = b.start().await;
    let url = fleet.urls()[0].clone();
    // A PEM key has no kid: any kid (or none) selects it; the algorithm is still pinned to RSA.
    assert_eq!(with_token(&url, &rsa.token(id, "alice").sign()).await.status, 200);
    assert_eq!(with_token(&url, &rsa.token(id, "alice").without_header("kid").sign()).await.status, 200);
    let es = TestKey::load("ec-1", "ec-1", Algorithm::ES256);
    assert_eq!(with_token(&url, &es.token(id, "alice").sign()).await.status, 401);

    // The mounted secret is replaced by a JWKS with the EC key: picked up without a restart.
    let doc = json!({ "keys": [es.jwk(true)] });
    std::fs::write(&pem, doc.to_string()).unwrap();
    eventually(10, "the rotated key file to be read", || {
        let (u, token) = (url.clone(), es.token(id, "alice").sign());
        async move { with_token(&u, &token).await.status == 200 }
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}
