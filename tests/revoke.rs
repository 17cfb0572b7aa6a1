//! Revocation (issue 34): `mcpfleet revoke` refuses a principal on every replica of a fleet within a second, with
//! 401 `invalid_token`, closes its open streams (a 2025 GET stream and a 2026-07-28 `subscriptions/listen`),
//! refuses its resumptions, leaves everyone else alone, is listed, audited and lifted; one token can be revoked
//! alone; and with the store away under `--rate-fail-mode open` a replica still refuses the principals it knows to
//! be revoked, and keeps the policy version it had.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{JwtFleet, McpClient, PostgresServer, RoundRobinProxy, SseStream, StatelessClient, server_bin};
use serde_json::json;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn revoke(f: &JwtFleet, args: &[&str], db: Option<&str>) -> Output {
    let mut c = Command::new(server_bin());
    c.arg("revoke").args(args).args(["--redis-url", &f.redis.url(), "--iss", &f.issuer.id(), "--by", "sec@ops"]);
    if let Some(db) = db {
        c.args(["--database-url", db]);
    }
    c.output().unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn ping(c: &McpClient, url: &str) -> reqwest::Response {
    c.post(url, &json!({ "jsonrpc": "2.0", "id": 9, "method": "ping" })).await
}

/// Waits at most `within` for `stream` to end (the server closed it); panics if it does not.
async fn ends(stream: &mut SseStream, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        match stream.next(deadline.saturating_duration_since(Instant::now())).await {
            Ok(None) | Err(_) if Instant::now() < deadline => return,
            Ok(Some(_)) => {}
            other => panic!("{what} still open after {within:?}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_principal_is_refused_everywhere_within_a_second_and_its_streams_close() {
    let pg = PostgresServer::start();
    let db = pg.url();
    assert!(Command::new(server_bin()).args(["migrate", "--database-url", &db]).status().unwrap().success());
    let f = JwtFleet::start(3, &[]).await;
    let proxy = RoundRobinProxy::start(f.fleet.bases()).await;
    let mut alice = f.client("alice");
    let sid = alice.initialize(&proxy.url()).await;
    let mut get = SseStream::new(alice.get(&proxy.url(), None).await);
    get.next(Duration::from_secs(5)).await.unwrap().expect("priming event");
    let listener = StatelessClient::new().with_token(&f.token("alice"));
    let resp = listener
        .send(
            &proxy.url(),
            &listener.body(1, "subscriptions/listen", json!({ "notifications": { "toolsListChanged": true } })),
            &[],
        )
        .await;
    assert_eq!(resp.status(), 200);
    let mut listen = SseStream::new(resp);
    listen.next(Duration::from_secs(5)).await.unwrap().expect("acknowledged");
    let mut bob = f.client("bob");
    bob.initialize(&proxy.url()).await;

    let out = stdout(&revoke(&f, &["--sub", "alice"], Some(&db)));
    let revoked = Instant::now();
    assert!(
        out.starts_with("revoked principal ") && out.contains(" (sub alice of ") && out.ends_with(" by sec@ops\n"),
        "{out}"
    );
    // Every replica refuses her next request, asked directly, within a second.
    for url in f.fleet.urls() {
        let r = ping(&alice, &url).await;
        assert_eq!(r.status(), 401, "{url}");
        let challenge = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert_eq!(challenge, "Bearer error=\"invalid_token\", error_description=\"the token has been revoked\"");
    }
    assert!(revoked.elapsed() < Duration::from_secs(1));
    // Her open streams close within a second, on whichever replica holds them.
    ends(&mut get, Duration::from_secs(1), "the GET stream").await;
    ends(&mut listen, Duration::from_secs(1), "the subscriptions/listen stream").await;
    // Her session cannot be resumed, and a new one cannot be opened; bob goes on.
    assert_eq!(alice.get(&proxy.url(), Some("1:0-1")).await.status(), 401);
    let fresh = McpClient::new().with_token(&f.token("alice"));
    let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } } });
    assert_eq!(fresh.post(&proxy.url(), &init).await.status(), 401);
    for _ in 0..3 {
        assert_eq!(ping(&bob, &proxy.url()).await.status(), 200);
    }
    // Listed, with who and until when.
    let list = stdout(&revoke(&f, &["--list"], None));
    let line: Vec<&str> = list.lines().next().unwrap().split('\t').collect();
    assert_eq!((line[2], line[4], line[5]), ("alice", "*", "sec@ops"), "{list}");
    // Lifted: she is back, her session with her.
    let out = stdout(&revoke(&f, &["--sub", "alice", "--lift"], Some(&db)));
    assert!(out.starts_with("lifted the revocation of principal "), "{out}");
    for url in f.fleet.urls() {
        assert_eq!(ping(&alice, &url).await.status(), 200, "{url}: the session {sid} is hers again");
    }
    assert_eq!(stdout(&revoke(&f, &["--list"], None)).trim(), "no revocation in force");

    // One token: that one is refused, another of the same principal is not.
    let t1 = f.token_for("carol").claim("jti", json!("t-1")).sign();
    let t2 = f.token_for("carol").claim("jti", json!("t-2")).sign();
    let mut carol = McpClient::new().with_token(&t1);
    carol.initialize(&proxy.url()).await;
    stdout(&revoke(&f, &["--sub", "carol", "--jti", "t-1", "--for", "10m"], Some(&db)));
    assert_eq!(ping(&carol, &proxy.url()).await.status(), 401);
    let mut carol2 = McpClient::new().with_token(&t2);
    carol2.initialize(&proxy.url()).await;
    assert_eq!(ping(&carol2, &proxy.url()).await.status(), 200);

    // Audited: three changes, chained; verify passes.
    let rows =
        pg.psql("postgres", "SELECT principal, outcome, detail FROM audit_events WHERE kind = 'revoke' ORDER BY at");
    let rows: Vec<&str> = rows.lines().collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows[0].starts_with("sec@ops|revoked|revoked principal "), "{rows:?}");
    assert!(rows[1].starts_with("sec@ops|lifted|lifted the revocation of principal "), "{rows:?}");
    assert!(rows[2].starts_with("sec@ops|revoked|revoked token t-1 of principal "), "{rows:?}");
    assert!(!rows.iter().any(|r| r.contains("carol") || r.contains("alice")), "the subject stays out: {rows:?}");
    let o = Command::new(server_bin()).args(["audit", "verify", "--database-url", &db]).output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 ended, 0 open, 0 tampered"), "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_open_a_replica_still_refuses_the_principals_it_knows_are_revoked() {
    let f = JwtFleet::start(1, &["--rate-fail-mode", "open", "--policy-poll", "1s", "--redis-timeout", "200ms"]).await;
    let url = f.url(0);
    let (alice, bob) =
        (StatelessClient::new().with_token(&f.token("alice")), StatelessClient::new().with_token(&f.token("bob")));
    let list = |c: &StatelessClient| {
        let c = c.clone();
        let url = url.clone();
        async move { c.request(&url, 1, "tools/list", json!({})).await.0 }
    };
    assert_eq!(list(&alice).await, 200);
    // A policy in force, so that the replica has a version to keep while Redis is away.
    let doc = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(doc.path(), "plans: { free: {} }\ndefault: free\n").unwrap();
    let applied = Command::new(server_bin())
        .args(["policy", "apply"])
        .arg(doc.path())
        .args(["--redis-url", &f.redis.url()])
        .output()
        .unwrap();
    stdout(&applied);
    stdout(&revoke(&f, &["--sub", "alice"], None));
    // The replica has read the registry (the announcement, or the poll) before Redis goes away.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    f.redis.signal("-STOP");
    let statuses = (list(&alice).await, list(&bob).await);
    // The replica keeps the version it had, and counts the reads that failed (one every --policy-poll).
    let admin = f.fleet.replicas[0].admin();
    let kept = async {
        for _ in 0..40 {
            let m = mcpfleet_fleetkit::scrape(&admin).await;
            if m.get("mcp_policy_load_failures_total{reason=\"store\"}").copied().unwrap_or(0.0) >= 1.0 {
                return m.get("mcp_policy_version").copied();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }
    .await;
    f.redis.signal("-CONT");
    assert_eq!(statuses, (401, 200), "the store away: bob passes on the local bucket, alice never");
    assert_eq!(kept, Some(1.0), "the version in force stays while Redis is away, and the failed reads are counted");
}
