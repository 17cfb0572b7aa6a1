//! Policy as data on a fleet (issue 34): three replicas on one Redis behind a round-robin proxy, with JWT
//! identities. A version applied with `mcpfleet policy apply` reaches every replica within 2 s (by its announcement:
//! the poll is set to a minute), moves a principal between plans without a restart or a dropped stream; plans hide
//! and refuse tools, their conditions refuse calls that passed validation, dry runs count and refuse nothing; a
//! version this build refuses leaves the last good one in force; `--policy FILE` serves one process without Redis.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{JwtFleet, server_bin};
use mcpfleet_fleetkit::{McpClient, RoundRobinProxy, SseStream, StatelessClient, eventually, scrape};
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

/// The issue's document, as written: test_simple_text 3 a minute on free, 100 on pro.
const PLANS: &str = r#"plans:
  free:
    rate: { per_second: 20, burst: 40 }
    quotas:
      test_simple_text: { limit: 3, window: 60s }
  pro:
    quotas:
      test_simple_text: { limit: 100, window: 60s }
assign:
  - when: 'principal.claims.plan == "pro"'
    plan: pro
default: free
"#;

/// Two plans: free lists two tools, with a condition on one and a dry run on the other; staff has everything.
const PLANS_WITH_TOOLS: &str = r#"plans:
  free:
    tools:
      allow: [test_simple_text, test_countdown]
      conditions:
        - tool: test_countdown
          when: 'args.count <= 10'
          message: 'The free plan counts to 10 at most: ask for fewer.'
        - tool: test_simple_text
          when: 'principal.claims.region == "eu"'
          message: 'EU only'
          mode: dry-run
  staff: {}
assign:
  - when: 'principal.claims.staff == true'
    plan: staff
default: free
"#;

/// `mcpfleet policy <verb> FILE --redis-url URL [extra]` of a file holding `text`: exit code, stdout, stderr.
fn policy(verb: &str, redis: &str, text: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(server_bin())
        .args(["policy", verb])
        .arg(&file)
        .args(["--redis-url", redis])
        .args(extra)
        .output()
        .unwrap();
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), s(&out.stdout), s(&out.stderr))
}

fn apply(f: &JwtFleet, text: &str) -> String {
    let (code, out, err) = policy("apply", &f.redis.url(), text, &["--by", "ops@test"]);
    assert_eq!(code, Some(0), "{out}{err}");
    out
}

/// Waits until every replica has `version` in force.
async fn converged(f: &JwtFleet, version: f64, secs: u64) {
    eventually(secs, "every replica has the version in force", || async {
        let mut all = true;
        for r in &f.fleet.replicas {
            all &= scrape(&r.admin()).await.get("mcp_policy_version").copied() == Some(version);
        }
        all
    })
    .await;
}

fn text_of(r: &Value) -> String {
    r["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

fn is_error(r: &Value) -> bool {
    r["result"]["isError"] == json!(true)
}

async fn call(c: &McpClient, url: &str, id: i64, tool: &str, args: Value) -> Value {
    c.request(url, id, "tools/call", json!({ "name": tool, "arguments": args })).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_applied_moves_a_principal_to_another_plan_on_every_replica_within_two_seconds() {
    let f = JwtFleet::start(3, &["--policy-poll", "60s"]).await;
    let proxy = RoundRobinProxy::start(f.fleet.bases()).await;
    let out = apply(&f, PLANS);
    assert!(out.contains("applied as version 1 by ops@test: first version: plans free, pro"), "{out}");
    converged(&f, 1.0, 5).await;

    // alice's token says nothing of a plan: free, 3 calls a minute.
    let mut alice = McpClient::new().with_token(&f.token("alice"));
    alice.initialize(&proxy.url()).await;
    let mut stream = SseStream::new(alice.get(&proxy.url(), None).await);
    stream.next(Duration::from_secs(5)).await.unwrap().expect("the stream's priming event");
    for i in 0..3 {
        let r = call(&alice, &proxy.url(), 10 + i, "test_simple_text", json!({})).await;
        assert!(!is_error(&r), "{r}");
    }
    let r = call(&alice, &proxy.url(), 13, "test_simple_text", json!({})).await;
    assert!(is_error(&r) && text_of(&r).starts_with("Quota exhausted"), "{r}");

    // Version 2 gives alice the pro plan by her subject.
    let v2 = PLANS.replace("assign:\n", "assign:\n  - when: 'principal.subject == \"alice\"'\n    plan: pro\n");
    let (_, diff, _) = policy("diff", &f.redis.url(), &v2, &[]);
    assert_eq!(diff, "against version 1 (applied by ops@test):\n  assignment rules changed (1 → 2)\n");
    let out = apply(&f, &v2);
    let applied = Instant::now();
    assert!(out.contains("applied as version 2 by ops@test: assignment rules changed (1 → 2)"), "{out}");
    // Every replica admits her now, each asked directly (the session is the fleet's).
    for (i, url) in f.fleet.urls().iter().enumerate() {
        loop {
            let r = call(&alice, url, 20 + i64::try_from(i).unwrap(), "test_simple_text", json!({})).await;
            if !is_error(&r) {
                break;
            }
            assert!(applied.elapsed() < Duration::from_secs(2), "replica {i} still refuses after 2 s: {r}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(applied.elapsed() < Duration::from_secs(2));
    // explain without --file: the version in force.
    let out = Command::new(server_bin())
        .args(["policy", "explain", "--sub", "alice", "--redis-url", &f.redis.url(), "--tool", "test_simple_text"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.starts_with("version 2 (applied by ops@test)\nplan: pro (/assign/0: principal.subject == \"alice\")\n"),
        "{text}"
    );
    assert!(
        text.contains("quotas test_simple_text 100 per 1m") && text.ends_with("call test_simple_text: allowed\n"),
        "{text}"
    );
    // No restart, no dropped stream: her GET stream still carries what the session is told.
    let r = call(&alice, &proxy.url(), 30, "test_trigger_tool_change", json!({})).await;
    assert!(!is_error(&r), "{r}");
    stream.until_method("notifications/tools/list_changed", Duration::from_secs(5)).await.unwrap();
    // bob, whom no rule names, is still on free; a claim picks pro for carol.
    let bob = McpClient::new().with_token(&f.token("bob"));
    let mut bob = bob;
    bob.initialize(&proxy.url()).await;
    for i in 0..4 {
        let r = call(&bob, &proxy.url(), 40 + i, "test_simple_text", json!({})).await;
        assert_eq!(is_error(&r), i == 3, "{r}");
    }
    let mut carol = McpClient::new().with_token(&f.token_for("carol").claim("plan", json!("pro")).sign());
    carol.initialize(&proxy.url()).await;
    for i in 0..5 {
        let r = call(&carol, &proxy.url(), 50 + i, "test_simple_text", json!({})).await;
        assert!(!is_error(&r), "{r}");
    }
    assert_eq!(f.metric("mcp_policy_version").await, 6.0, "three replicas at version 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_hide_and_refuse_tools_and_their_conditions_refuse_valid_calls_while_dry_runs_only_count() {
    let f = JwtFleet::start(3, &[]).await;
    let proxy = RoundRobinProxy::start(f.fleet.bases()).await;
    apply(&f, PLANS_WITH_TOOLS);
    converged(&f, 1.0, 10).await;
    let mut alice = McpClient::new().with_token(&f.token_for("alice").claim("region", json!("us")).sign());
    alice.initialize(&proxy.url()).await;
    let listed = alice.request(&proxy.url(), 1, "tools/list", json!({})).await;
    let mut names: Vec<&str> =
        listed["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["test_countdown", "test_simple_text"], "the plan lists only its tools");

    // A tool the plan does not list: 403, before its arguments are read, with no challenge to sign in again.
    let resp = alice
        .post(&proxy.url(), &json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": { "name": "test_image_content", "arguments": {} } }))
        .await;
    assert_eq!(resp.status(), 403);
    assert!(resp.headers().get("www-authenticate").is_none());
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]["message"].as_str().unwrap().contains("does not allow the tool test_image_content"),
        "{body}"
    );

    // A call that passes its schema (count up to 1000) and not the plan's condition: an isError for the model.
    let r = call(&alice, &proxy.url(), 3, "test_countdown", json!({ "count": 11, "interval_ms": 0 })).await;
    assert!(is_error(&r), "{r}");
    let text = text_of(&r);
    assert!(text.starts_with("Refused by policy: the call of the tool test_countdown was not made. The free plan counts to 10 at most: ask for fewer."), "{text}");
    assert!(text.contains("Trace id: "), "{text}");
    let r = call(&alice, &proxy.url(), 4, "test_countdown", json!({ "count": 2, "interval_ms": 0 })).await;
    assert!(!is_error(&r), "{r}");
    // The same through the 2026-07-28 generation.
    let stateless = StatelessClient::new().with_token(&f.token_for("alice").claim("region", json!("us")).sign());
    let r =
        stateless.call(&proxy.url(), 5, "test_countdown", json!({ "count": 50, "interval_ms": 0 }), json!({})).await;
    assert!(is_error(&r) && text_of(&r).contains("counts to 10 at most"), "{r}");

    // The dry run would refuse every call of a non-EU principal: it counts them, and refuses none.
    for i in 0..3 {
        let r = call(&alice, &proxy.url(), 10 + i, "test_simple_text", json!({})).await;
        assert!(!is_error(&r), "{r}");
    }
    let would = "mcp_policy_would_refuse_total{plan=\"free\",rule=\"tools.conditions.1\"}";
    let refused = "mcp_policy_refusals_total{plan=\"free\",rule=\"tools.conditions.0\"}";
    let allow = "mcp_policy_refusals_total{plan=\"free\",rule=\"tools.allow\"}";
    assert_eq!(f.metric(would).await, 3.0);
    assert_eq!(f.metric(refused).await, 2.0);
    assert_eq!(f.metric(allow).await, 1.0);

    // A version that changes what alice's plan lists: her 2025 GET stream is told, and her next list has it.
    let mut get = SseStream::new(alice.get(&proxy.url(), None).await);
    get.next(Duration::from_secs(5)).await.unwrap().expect("priming event");
    let (_, out, err) = policy(
        "apply",
        &f.redis.url(),
        &PLANS_WITH_TOOLS
            .replace("[test_simple_text, test_countdown]", "[test_simple_text, test_countdown, test_image_content]"),
        &[],
    );
    assert!(out.contains("applied as version 2"), "{out}{err}");
    get.until_method("notifications/tools/list_changed", Duration::from_secs(5)).await.unwrap();
    // The notice comes from the replica holding the stream; each replica swaps the version in on its own ring, so
    // the next list (on another replica) may be a few milliseconds early: within a second every replica has it.
    let deadline = Instant::now() + Duration::from_secs(1);
    let listed = loop {
        let listed = alice.request(&proxy.url(), 20, "tools/list", json!({})).await;
        if listed["result"]["tools"].as_array().map(Vec::len) == Some(3) || Instant::now() > deadline {
            break listed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(listed["result"]["tools"].as_array().unwrap().len(), 3, "{listed}");

    // The staff plan has no conditions and every tool.
    let mut staff = McpClient::new().with_token(&f.token_for("sam").claim("staff", json!(true)).sign());
    staff.initialize(&proxy.url()).await;
    let r = call(&staff, &proxy.url(), 1, "test_countdown", json!({ "count": 11, "interval_ms": 0 })).await;
    assert!(!is_error(&r), "{r}");
    let r = call(&staff, &proxy.url(), 2, "test_image_content", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_document_changes_nothing_and_a_bad_stored_version_leaves_the_last_good_one() {
    let f = JwtFleet::start(3, &["--policy-poll", "1s"]).await;
    apply(&f, PLANS);
    converged(&f, 1.0, 10).await;
    // apply checks first: an unknown key or a CEL error is refused with 64 and the pointer, and nothing is stored.
    let (code, out, err) = policy(
        "apply",
        &f.redis.url(),
        &PLANS.replace("quotas:\n      test_simple_text: { limit: 3", "quotaz:\n      test_simple_text: { limit: 3"),
        &[],
    );
    assert_eq!((code, out.as_str()), (Some(64), ""), "{err}");
    assert!(err.contains(": /plans/free/quotaz: expected no such key here"), "{err}");
    let (code, _, err) = policy("apply", &f.redis.url(), &PLANS.replace("== \"pro\"", "=="), &[]);
    assert_eq!(code, Some(64));
    assert!(err.contains(": /assign/0/when: does not compile"), "{err}");
    // A version written by something that did not check it (a newer build, a hand edit): every replica counts
    // it, logs it, and keeps version 1.
    let key = "mcp:{fleet}:policy";
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli").args(["-p", &f.redis.port().to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(cli(&["HSET", key, "v", "2", "doc", "plans: {}\ndefault: nothing\n"]), "0");
    eventually(10, "every replica saw version 2 and refused it", || async {
        let mut all = true;
        for r in &f.fleet.replicas {
            let m = scrape(&r.admin()).await;
            all &= m.get("mcp_policy_latest_version") == Some(&2.0)
                && m.get("mcp_policy_version") == Some(&1.0)
                && m.get("mcp_policy_load_failures_total{reason=\"invalid\"}").copied().unwrap_or(0.0) >= 1.0;
        }
        all
    })
    .await;
    // Still version 1: alice is on free, 3 a minute.
    let mut alice = f.client("alice");
    alice.initialize(&f.url(0)).await;
    for i in 0..4 {
        let r = call(&alice, &f.url(usize::try_from(i).unwrap() % 3), i, "test_simple_text", json!({})).await;
        assert_eq!(is_error(&r), i == 3, "{r}");
    }
    // The next good version is taken.
    let (code, out, err) = policy("apply", &f.redis.url(), PLANS, &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("applied as version 3 by "), "{out}");
    converged(&f, 3.0, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_without_redis_serves_a_policy_file_and_reads_it_again_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, PLANS.replace("limit: 3,", "limit: 1,")).unwrap();
    let path = file.to_str().unwrap().to_owned();
    // With Redis, the flag is refused: a fleet follows what was applied.
    let out = Command::new(server_bin())
        .args(["serve", "--redis-url", "redis://127.0.0.1:1/", "--policy", &path])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--policy FILE is for one process without Redis"));
    // A file the server refuses stops it at start.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "plans: {}\n").unwrap();
    let out = Command::new(server_bin()).args(["serve", "--policy", bad.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));

    let fleet =
        mcpfleet_fleetkit::Fleet::builder().arg("--policy").arg(&path).arg("--policy-poll").arg("1s").start().await;
    let url = fleet.urls()[0].clone();
    let mut c = McpClient::new();
    c.initialize(&url).await;
    assert!(!is_error(&call(&c, &url, 1, "test_simple_text", json!({})).await));
    assert!(is_error(&call(&c, &url, 2, "test_simple_text", json!({})).await), "1 a minute");
    // The file changes: the new version is in force within the poll.
    std::fs::write(&file, PLANS.replace("limit: 3,", "limit: 5,")).unwrap();
    eventually(5, "the file's new version is in force", || async {
        scrape(&fleet.replicas[0].admin()).await.get("mcp_policy_version") == Some(&2.0)
    })
    .await;
    assert!(!is_error(&call(&c, &url, 3, "test_simple_text", json!({})).await));
    // A bad edit is refused: the last good version stays.
    std::fs::write(&file, "plans: { free: { ratee: 1 } }\ndefault: free\n").unwrap();
    eventually(5, "the bad edit is counted", || async {
        scrape(&fleet.replicas[0].admin()).await.get("mcp_policy_load_failures_total{reason=\"invalid\"}") == Some(&1.0)
    })
    .await;
    assert_eq!(scrape(&fleet.replicas[0].admin()).await.get("mcp_policy_version"), Some(&2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_says_who_and_when_rollback_restores_a_version_everywhere_and_audit_verify_covers_the_changes() {
    let pg = mcpfleet_fleetkit::PostgresServer::start();
    let db = pg.url();
    let out = Command::new(server_bin()).args(["migrate", "--database-url", &db]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let f = JwtFleet::start(3, &["--policy-poll", "60s"]).await;
    let with_db = |by: &'static str| ["--database-url", db.as_str(), "--by", by];
    let (code, out, err) = policy("apply", &f.redis.url(), PLANS, &with_db("alice@ops"));
    assert_eq!(code, Some(0), "{out}{err}");
    let v2 = PLANS.replace("assign:\n", "assign:\n  - when: 'principal.subject == \"dave\"'\n    plan: pro\n");
    let (code, out, err) = policy("apply", &f.redis.url(), &v2, &with_db("bob@ops"));
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("applied as version 2 by bob@ops: assignment rules changed (1 → 2)"), "{out}");
    converged(&f, 2.0, 5).await;
    // dave is on pro: more than 3 calls.
    let mut dave = f.client("dave");
    dave.initialize(&f.url(0)).await;
    for i in 0..4 {
        assert!(!is_error(&call(&dave, &f.url(0), i, "test_simple_text", json!({})).await));
    }

    // The history: newest first, each with who, when (UTC), the document's digest and what it changed.
    let history = || {
        let out = Command::new(server_bin()).args(["policy", "history", "--database-url", &db]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let lines: Vec<Vec<String>> = history().lines().map(|l| l.split('\t').map(str::to_owned).collect()).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!((lines[0][0].as_str(), lines[0][2].as_str()), ("2", "bob@ops"));
    assert_eq!((lines[1][0].as_str(), lines[1][2].as_str()), ("1", "alice@ops"));
    assert!(lines[0][1].ends_with('Z') && lines[0][1] >= lines[1][1], "{lines:?}");
    assert_eq!(lines[0][4], "assignment rules changed (1 → 2)");
    assert!(lines[1][4].starts_with("first version: plans free, pro"), "{lines:?}");

    // Rolling back to version 1 makes it version 3, on every replica: dave is on free again.
    let rollback = |v: &str, by: &str| {
        Command::new(server_bin())
            .args(["policy", "rollback", v, "--redis-url", &f.redis.url(), "--database-url", &db, "--by", by])
            .output()
            .unwrap()
    };
    let out = rollback("1", "carol@ops");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "policy: version 1 applied again as version 3 by carol@ops: rollback to version 1: assignment rules changed (2 → 1)"
    );
    converged(&f, 3.0, 5).await;
    let r = call(&dave, &f.url(1), 10, "test_simple_text", json!({})).await;
    assert!(is_error(&r) && text_of(&r).starts_with("Quota exhausted"), "back on free, its 3 used: {r}");
    assert_eq!(history().lines().next().unwrap().split('\t').nth(2), Some("carol@ops"));
    let out = rollback("9", "carol@ops");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no version 9 in the history"));

    // Each change is in the audit trail, chained: verify passes, and a change edited afterwards is caught.
    let rows =
        pg.psql("postgres", "SELECT principal, outcome, detail FROM audit_events WHERE kind = 'policy' ORDER BY at");
    let rows: Vec<&str> = rows.lines().collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows[0].starts_with("alice@ops|applied|version 1: first version"), "{rows:?}");
    assert!(rows[2].starts_with("carol@ops|rolled_back|version 3: rollback to version 1"), "{rows:?}");
    let verify = || Command::new(server_bin()).args(["audit", "verify", "--database-url", &db]).output().unwrap();
    let out = verify();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("verified 3 chains") && text.contains("3 ended, 0 open, 0 tampered"), "{text}");
    pg.psql(
        "postgres",
        "UPDATE audit_events SET principal = 'mallory@ops' WHERE kind = 'policy' AND principal = 'bob@ops'",
    );
    let out = verify();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("row 1 was altered"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_shared_quota_refuses_its_second_user_once_the_first_spent_it_while_another_tenant_goes_on() {
    let f = JwtFleet::start(3, &["--tenant-claim", "org"]).await;
    let proxy = RoundRobinProxy::start(f.fleet.bases()).await;
    apply(
        &f,
        "plans: { free: {} }\ndefault: free\ntenants:\n  quotas:\n    test_simple_text: { limit: 6, window: 60s }\n  overrides:\n    bigco:\n      quotas:\n        test_simple_text: { limit: 100, window: 60s }\n",
    );
    converged(&f, 1.0, 10).await;
    let member = |sub: &str, org: &str| McpClient::new().with_token(&f.token_for(sub).claim("org", json!(org)).sign());
    let (mut alice, mut bob, mut carol, mut dan) =
        (member("alice", "acme"), member("bob", "acme"), member("carol", "globex"), member("dan", "bigco"));
    for c in [&mut alice, &mut bob, &mut carol, &mut dan] {
        c.initialize(&proxy.url()).await;
    }
    // alice spends acme's 6 (across the three replicas); her 7th is refused, naming the shared quota.
    let mut spent = 0;
    for i in 0..10 {
        let r = call(&alice, &proxy.url(), 10 + i, "test_simple_text", json!({})).await;
        if is_error(&r) {
            assert!(text_of(&r).contains("by this user's organization (a quota its users share)"), "{r}");
            break;
        }
        spent += 1;
    }
    // The documented bound: units leased and unspent on other replicas, at most one slice each (slice(6, 3) = 1).
    let bound = 3 * mcpfleet_limits::slice(6, 3);
    assert!((6 - bound..=6).contains(&spent), "alice spent {spent} of 6");
    // bob, of the same tenant, gets at most what is left unspent on the replicas; then refused everywhere.
    let mut bobs = 0;
    for i in 0..6 {
        if !is_error(&call(&bob, &proxy.url(), 20 + i, "test_simple_text", json!({})).await) {
            bobs += 1;
        }
    }
    assert_eq!(spent + bobs, 6, "the tenant's 6, never more: alice {spent}, bob {bobs}");
    for url in f.fleet.urls() {
        assert!(is_error(&call(&bob, &url, 30, "test_simple_text", json!({})).await), "{url}");
    }
    // Another tenant goes on, and an override is its own number.
    for i in 0..6 {
        assert!(!is_error(&call(&carol, &proxy.url(), 40 + i, "test_simple_text", json!({})).await));
    }
    for i in 0..10 {
        assert!(!is_error(&call(&dan, &proxy.url(), 50 + i, "test_simple_text", json!({})).await), "bigco has 100");
    }
    assert!(f.metric("mcp_limit_decisions_total{kind=\"tenant\",outcome=\"denied\"}").await >= 4.0);
}
