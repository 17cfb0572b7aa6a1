//! DPoP-bound tokens (RFC 9449, docs/IDENTITY.md#dpop) through three replicas on one Redis behind round-robin, every
//! request on the next replica. The client is this test: its proofs are signed with the committed P-256 test key by
//! jsonwebtoken (no official MCP client signs DPoP proofs yet), its tokens by the test issuer with `cnf.jkt`.
//!
//! A valid proof is accepted on every replica; the same proof replayed to another replica is refused, with nothing
//! taken; every malformed proof (another method or URL, an old or future `iat`, a wrong `ath`, a key that is not the
//! token's, no proof, two proofs, `alg: none`, a symmetric algorithm, a private key in the header) and a bound token
//! sent as Bearer is refused with `WWW-Authenticate: DPoP`; admission stays one Redis round trip per call (counted on
//! `/metrics`). Then `--dpop require`, the fleet's nonce, and the metadata.

#![expect(clippy::expect_used, reason = "test helpers fail loudly")]

use mcpfleet_core::time::epoch_secs;
use mcpfleet_fleetkit::{JwtFleet, RoundRobinProxy, StatelessClient, TestKey, scrape};
use serde_json::{Value, json};

/// The resource URL the JWT fleets are configured with (`--resource-url`): what proofs name in `htu`, whichever
/// address the client reaches the fleet through.
const HTU: &str = "https://mcp.test/mcp";

struct Setup {
    s: JwtFleet,
    proxy: RoundRobinProxy,
    key: TestKey,
}

async fn setup(extra: &[&str]) -> Setup {
    let s = JwtFleet::start(3, extra).await;
    let proxy = RoundRobinProxy::start(s.fleet.bases()).await;
    Setup { s, proxy, key: TestKey::load("ec-1", "dpop-ec", jsonwebtoken::Algorithm::ES256) }
}

impl Setup {
    /// An access token for `sub` bound to the test's DPoP key.
    fn bound(&self, sub: &str) -> String {
        self.s.token_for(sub).claim("cnf", json!({ "jkt": self.key.thumbprint() })).sign()
    }

    /// A fresh valid proof for a POST of `token`.
    fn proof(&self, token: &str) -> String {
        self.key.dpop_proof("POST", HTU, Some(token)).sign()
    }

    /// A stateless `tools/call` through the proxy with these headers: the status, `WWW-Authenticate`, `DPoP-Nonce`
    /// and the body.
    async fn call(&self, headers: &[(&str, &str)]) -> Answer {
        let c = StatelessClient::new();
        let body = c.body(1, "tools/call", json!({ "name": "test_simple_text", "arguments": {} }));
        let resp = c.send(&self.proxy.url(), &body, headers).await;
        let header = |h: &str| resp.headers().get(h).map(|v| v.to_str().expect("ascii").to_owned());
        let (status, challenge, nonce) = (resp.status().as_u16(), header("www-authenticate"), header("dpop-nonce"));
        let body = resp.text().await.expect("body");
        Answer { status, challenge, nonce, body }
    }

    /// A call with `Authorization: DPoP <token>` and `proof`.
    async fn with_proof(&self, token: &str, proof: &str) -> Answer {
        self.call(&[("authorization", &format!("DPoP {token}")), ("dpop", proof)]).await
    }

    /// Redis round trips a request makes so far, summed over the replicas: every kind but those of the replicas'
    /// own timers (pings, membership, declarations, the eviction check, the task workers' polls).
    async fn round_trips(&self) -> f64 {
        let background = ["ping", "members", "declare", "info", "layouts", "policy", "revoked", "task_"];
        let mut n = 0.0;
        for r in &self.s.fleet.replicas {
            n += scrape(&r.admin())
                .await
                .iter()
                .filter(|(k, _)| k.starts_with("mcp_redis_command_duration_seconds_count{"))
                .filter(|(k, _)| !background.iter().any(|b| k.contains(&format!("kind=\"{b}"))))
                .map(|(_, v)| v)
                .sum::<f64>();
        }
        n
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    challenge: Option<String>,
    nonce: Option<String>,
    body: String,
}

impl Answer {
    /// A 401 whose challenge is DPoP's, with the algorithms, and names `error`.
    fn refused_with(&self, error: &str) {
        assert_eq!(self.status, 401, "{self:?}");
        let c = self.challenge.as_deref().expect("a challenge");
        assert!(c.starts_with("DPoP algs=\"ES256 "), "a DPoP challenge: {c}");
        assert!(c.contains(&format!("error=\"{error}\"")), "{error}: {c}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dpop_proofs_are_checked_on_every_replica_and_accepted_once_across_the_fleet() {
    let t = setup(&["--dpop", "allow"]).await;
    let token = t.bound("alice");

    // Valid proofs, each request on the next replica: accepted everywhere.
    for _ in 0..3 {
        let a = t.with_proof(&token, &t.proof(&token)).await;
        assert_eq!(a.status, 200, "{a:?}");
        assert!(a.body.contains("This is a simple text response"), "{a:?}");
    }
    let served = |m: &std::collections::BTreeMap<String, f64>| {
        m.get(r#"mcp_tool_calls_total{outcome="ok",tool="test_simple_text"}"#).copied().unwrap_or(0.0)
    };
    for r in &t.s.fleet.replicas {
        assert_eq!(served(&scrape(&r.admin()).await), 1.0, "every replica accepted one");
    }

    // One proof, replayed: accepted once, then refused by each of the other replicas (and the first again).
    let proof = t.proof(&token);
    assert_eq!(t.with_proof(&token, &proof).await.status, 200);
    for _ in 0..3 {
        let replay = t.with_proof(&token, &proof).await;
        replay.refused_with("invalid_dpop_proof");
        assert!(replay.challenge.as_deref().is_some_and(|c| c.contains("used before")), "{replay:?}");
    }
    let ok_calls: f64 = {
        let mut n = 0.0;
        for r in &t.s.fleet.replicas {
            n += served(&scrape(&r.admin()).await);
        }
        n
    };
    assert_eq!(ok_calls, 4.0, "the replays never ran");
    let mut replays = 0.0;
    for r in &t.s.fleet.replicas {
        replays += scrape(&r.admin()).await[r#"mcp_auth_refusals_total{reason="replayed_dpop_proof"}"#];
    }
    assert_eq!(replays, 3.0, "each replay counted where it was refused");

    // Every other way a proof can be wrong: refused with a DPoP challenge, before anything runs.
    let other = TestKey::load("ed-1", "other", jsonwebtoken::Algorithm::EdDSA);
    let now = epoch_secs();
    let k = &t.key;
    let cases: Vec<(&str, String)> = vec![
        ("another method", k.dpop_proof("GET", HTU, Some(&token)).sign()),
        ("another URL", k.dpop_proof("POST", "https://elsewhere.test/mcp", Some(&token)).sign()),
        ("an old iat", k.dpop_proof("POST", HTU, Some(&token)).claim("iat", json!(now - 120)).sign()),
        ("a future iat", k.dpop_proof("POST", HTU, Some(&token)).claim("iat", json!(now + 120)).sign()),
        ("a wrong ath", k.dpop_proof("POST", HTU, Some("another-token")).sign()),
        ("no ath", k.dpop_proof("POST", HTU, None).sign()),
        ("no jti", k.dpop_proof("POST", HTU, Some(&token)).without_claim("jti").sign()),
        ("another key than the token's", other.dpop_proof("POST", HTU, Some(&token)).sign()),
        ("typ jwt", k.dpop_proof("POST", HTU, Some(&token)).header("typ", json!("jwt")).sign()),
        ("alg none", k.dpop_proof("POST", HTU, Some(&token)).unsigned("none")),
        ("a symmetric alg", k.dpop_proof("POST", HTU, Some(&token)).hs256_with(b"0123456789abcdef0123456789abcdef")),
        (
            "a private key in its jwk",
            k.dpop_proof("POST", HTU, Some(&token))
                .header("jwk", {
                    let mut j = k.jwk(false);
                    j["d"] = json!("AAAA");
                    j.as_object_mut().expect("jwk").remove("kid");
                    j
                })
                .sign(),
        ),
        ("a tampered signature", {
            let p = t.proof(&token);
            let (head, sig) = p.rsplit_once('.').expect("jws");
            let flipped = if sig.starts_with('A') { "B" } else { "A" };
            format!("{head}.{flipped}{}", &sig[1..])
        }),
        ("not a JWT", "this-is-not-a-jwt".to_owned()),
    ];
    for (what, proof) in &cases {
        let a = t.with_proof(&token, proof).await;
        assert_eq!(a.status, 401, "{what}: {a:?}");
        a.refused_with("invalid_dpop_proof");
    }
    // No proof, and two proofs.
    t.call(&[("authorization", &format!("DPoP {token}"))]).await.refused_with("invalid_dpop_proof");
    let (scheme, p1, p2) = (format!("DPoP {token}"), t.proof(&token), t.proof(&token));
    t.call(&[("authorization", &scheme), ("dpop", &p1), ("dpop", &p2)]).await.refused_with("invalid_dpop_proof");
    // A token the proof's key is not bound to, or bound to no key, under the DPoP scheme: an invalid token.
    let unbound = t.s.token("alice");
    t.with_proof(&unbound, &t.proof(&unbound)).await.refused_with("invalid_token");
    let foreign = t.s.token_for("alice").claim("cnf", json!({ "jkt": other.thumbprint() })).sign();
    t.with_proof(&foreign, &t.proof(&foreign)).await.refused_with("invalid_dpop_proof");
    let wrong_aud = t.s.token_for("alice").claim("aud", json!("https://not-this.test/mcp"));
    let wrong_aud = wrong_aud.claim("cnf", json!({ "jkt": t.key.thumbprint() })).sign();
    t.with_proof(&wrong_aud, &t.proof(&wrong_aud)).await.refused_with("invalid_token");

    // A bound token sent as a bearer token is refused (RFC 9449 §7.2): its challenge offers DPoP.
    let as_bearer = t.call(&[("authorization", &format!("Bearer {token}")), ("dpop", &t.proof(&token))]).await;
    assert_eq!(as_bearer.status, 401, "{as_bearer:?}");
    let c = as_bearer.challenge.expect("a challenge");
    assert!(c.starts_with("Bearer error=\"invalid_token\"") && c.contains(", DPoP algs=\""), "{c}");
    // A plain bearer token still works under `allow`.
    let bearer = t.call(&[("authorization", &format!("Bearer {unbound}"))]).await;
    assert_eq!(bearer.status, 200, "{bearer:?}");

    // Admission stays one round trip per call: the proof's record rides on it.
    let before = t.round_trips().await;
    for _ in 0..6 {
        assert_eq!(t.with_proof(&token, &t.proof(&token)).await.status, 200);
    }
    let dpop_trips = t.round_trips().await - before;
    let before = t.round_trips().await;
    for _ in 0..6 {
        assert_eq!(t.call(&[("authorization", &format!("Bearer {unbound}"))]).await.status, 200);
    }
    let bearer_trips = t.round_trips().await - before;
    assert_eq!(dpop_trips, bearer_trips, "a DPoP call costs the round trips a bearer call does");
    assert_eq!(dpop_trips, 6.0, "one per call");

    // A 2025 session, every request with its own proof for its own method: initialize, a call on the next replica,
    // the GET stream on the third, DELETE.
    let http = reqwest::Client::new();
    let send = |method: reqwest::Method, body: Option<Value>, sid: Option<String>| {
        let proof = t.key.dpop_proof(method.as_str(), HTU, Some(&token)).sign();
        let mut rb = http
            .request(method, t.proxy.url())
            .header("authorization", format!("DPoP {token}"))
            .header("dpop", proof)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(s) = sid {
            rb = rb.header("mcp-session-id", s);
        }
        if let Some(b) = body {
            rb = rb.header("content-type", "application/json").body(b.to_string());
        }
        rb.send()
    };
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "dpop", "version": "1" } } });
    let r = send(reqwest::Method::POST, Some(init), None).await.expect("initialize");
    assert_eq!(r.status(), 200);
    let sid = r.headers()["mcp-session-id"].to_str().expect("sid").to_owned();
    let call = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": { "name": "test_simple_text", "arguments": {} } });
    let r = send(reqwest::Method::POST, Some(call), Some(sid.clone())).await.expect("call");
    assert_eq!(r.status(), 200);
    let r = send(reqwest::Method::GET, None, Some(sid.clone())).await.expect("GET");
    assert_eq!(r.status(), 200, "the GET stream, its proof for GET");
    drop(r);
    let r = send(reqwest::Method::DELETE, None, Some(sid)).await.expect("DELETE");
    assert_eq!(r.status(), 200);

    // The metadata says what is accepted.
    let meta = metadata(&t).await;
    assert_eq!(meta["dpop_signing_alg_values_supported"][0], "ES256");
    assert_eq!(meta["dpop_bound_access_tokens_required"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_refuses_bearer_tokens_and_the_fleets_nonce_is_accepted_by_any_replica() {
    let key = "n1:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    let t = setup(&["--dpop", "require", "--dpop-nonce-key", key]).await;
    let token = t.bound("bob");

    // No credentials: the challenge is DPoP's alone, and points to the metadata.
    let none = t.call(&[]).await;
    assert_eq!(none.status, 401);
    let c = none.challenge.expect("a challenge");
    assert!(c.starts_with("DPoP algs=") && c.contains("resource_metadata=") && !c.contains("Bearer"), "{c}");
    // A bearer token, bound or not: refused, with the DPoP challenge.
    t.call(&[("authorization", &format!("Bearer {}", t.s.token("bob")))]).await.refused_with("invalid_token");

    // A proof without the nonce: use_dpop_nonce, with one in DPoP-Nonce. The retry with it, on the next replica,
    // is accepted; so is a later one on the third; a nonce of another fleet is not.
    let first = t.with_proof(&token, &t.proof(&token)).await;
    first.refused_with("use_dpop_nonce");
    let nonce = first.nonce.expect("DPoP-Nonce");
    for _ in 0..2 {
        let p = t.key.dpop_proof("POST", HTU, Some(&token)).claim("nonce", json!(nonce)).sign();
        let a = t.with_proof(&token, &p).await;
        assert_eq!(a.status, 200, "{a:?}");
    }
    let forged = t.key.dpop_proof("POST", HTU, Some(&token)).claim("nonce", json!("1.definitely-not-ours")).sign();
    t.with_proof(&token, &forged).await.refused_with("use_dpop_nonce");

    let meta = metadata(&t).await;
    assert_eq!(meta["dpop_bound_access_tokens_required"], true);
}

#[test]
fn dpop_flags_that_cannot_work_refuse_the_start() {
    for (args, says) in [
        (vec!["--auth", "none", "--dpop", "allow"], "--auth none"),
        (vec!["--auth", "none", "--dpop", "sometimes"], "invalid value"),
        (vec!["--auth", "none", "--dpop-nonce-key", "k:c2hvcnQ="], "--dpop-nonce-key"),
    ] {
        let err = mcpfleet_fleetkit::refused_start(&args);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// The RFC 9728 metadata of the resource, through the proxy.
async fn metadata(t: &Setup) -> Value {
    let url = format!("{}/.well-known/oauth-protected-resource/mcp", t.proxy.origin());
    reqwest::get(url).await.expect("metadata").json().await.expect("json")
}
