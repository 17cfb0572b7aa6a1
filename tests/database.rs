//! End-to-end PostgreSQL: `migrate` under its lock, `serve` refusing a schema that is behind, the reference tools
//! on one shared database behind a round-robin proxy (a draft made through one replica is confirmed through
//! another, exactly once under a race, by its creator only), the database killed under load (tools that need it
//! say so in time, the others keep answering, and every call is in the audit trail or counted as dropped), the
//! audit chains verified and then caught when a row is deleted or edited, exports, and TLS. Real replicas, a real
//! Redis and a real PostgreSQL of the suite's own.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{JwtFleet, McpClient, PostgresServer, RoundRobinProxy, StatelessClient, server_bin};
use serde_json::{Value, json};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `mcpfleet ARGS` to its end.
fn mcpfleet(args: &[&str]) -> Output {
    Command::new(server_bin()).args(args).env("MCPFLEET_LOG", "warn").output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A database of its own on `pg`, migrated and loaded with the demo data.
fn demo_database(pg: &PostgresServer, name: &str) -> String {
    pg.create_database(name);
    let url = pg.url_for(name);
    let o = mcpfleet(&["migrate", "--database-url", &url]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = mcpfleet(&["demo-data", "--database-url", &url]);
    assert!(o.status.success(), "{:?}", text(&o));
    url
}

/// The text of a tool result, and whether it is an error.
async fn call_tool(c: &McpClient, url: &str, id: i64, tool: &str, args: Value) -> (String, bool) {
    let v = c.request(url, id, "tools/call", json!({ "name": tool, "arguments": args })).await;
    let r = &v["result"];
    assert!(r.is_object(), "{v}");
    (r["content"][0]["text"].as_str().unwrap_or_default().to_owned(), r["isError"] == true)
}

fn draft_id(text: &str) -> String {
    let at = text.find("drf_").unwrap_or_else(|| panic!("no draft id in {text}"));
    text[at..at + 28].to_owned()
}

#[test]
fn migrate_takes_its_lock_and_serve_refuses_a_schema_behind() {
    let pg = PostgresServer::start();
    pg.create_database("fresh");
    let url = pg.url_for("fresh");
    // An empty database: serve refuses, with one line saying what to do, and exit 78.
    let o = mcpfleet(&["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--database-url", &url]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert_eq!(err.trim().lines().filter(|l| l.starts_with("mcpfleet:")).count(), 1, "{err}");
    assert!(err.contains("schema is at version 0") && err.contains("run `mcpfleet migrate`"), "{err}");

    // Demo data needs the schema too.
    let o = mcpfleet(&["demo-data", "--database-url", &url]);
    assert_eq!(o.status.code(), Some(78), "{:?}", text(&o));

    // Two migrations racing: each one is applied once; the loser waits, then finds nothing to do.
    let spawn = || {
        Command::new(server_bin())
            .args(["migrate", "--database-url", &url])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success() && b.status.success(), "{:?} {:?}", text(&a), text(&b));
    let both = format!("{}{}", text(&a).0, text(&b).0);
    assert_eq!(both.matches("applied 0001 reference").count(), 1, "{both}");
    assert_eq!(both.matches("applied 0002 audit").count(), 1, "{both}");
    assert_eq!(both.matches("applied 0003 policy").count(), 1, "{both}");
    assert_eq!(both.matches("applied 0004 downstream").count(), 1, "{both}");
    assert_eq!(both.matches("nothing to apply").count(), 1, "{both}");
    assert_eq!(pg.psql("fresh", "SELECT count(*) FROM mcpfleet_migrations").trim(), "4");
    // A month ahead exists for the audit trail.
    let parts = pg.psql("fresh", "SELECT count(*) FROM pg_inherits WHERE inhparent = 'audit_events'::regclass");
    assert_eq!(parts.trim(), "3");
    // Current: a no-op.
    let o = mcpfleet(&["migrate", "--database-url", &url]);
    assert_eq!(text(&o).0.trim(), "nothing to apply: the schema is at version 4");

    // --migrate-on-start migrates an empty database and serves.
    pg.create_database("auto");
    let auto = pg.url_for("auto");
    let mut child = serve(&["--fixtures", "reference", "--database-url", &auto, "--migrate-on-start"]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(pg.psql("auto", "SELECT count(*) FROM mcpfleet_migrations").trim(), "4");

    // Retention: a replica with --audit-retention-months drops a month that is too old, after its checkpoint...
    old_month(&pg, "fresh", 2020, 1);
    let mut child = serve(&["--database-url", &url, "--audit-retention-months", "12"]);
    let gone =
        |m: &str| pg.psql("fresh", &format!("SELECT to_regclass('audit_events_y2020m{m}') IS NULL")).trim() == "t";
    let deadline = Instant::now() + Duration::from_secs(20);
    while !gone("01") {
        assert!(Instant::now() < deadline, "the replica did not apply retention");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    // ... and so does `audit prune`, once.
    old_month(&pg, "fresh", 2020, 2);
    let o = mcpfleet(&["audit", "prune", "--database-url", &url, "--keep-months", "12"]);
    assert_eq!(text(&o).0.trim(), "dropped the audit partition of 2020-02 (checkpoints kept)", "{:?}", text(&o));
    assert!(gone("02"));
    let o = mcpfleet(&["audit", "prune", "--database-url", &url, "--keep-months", "12"]);
    assert_eq!(text(&o).0.trim(), "nothing to drop: no audit partition is older than 12 months");
    let cps = pg.psql("fresh", "SELECT chain_id, seq, partition FROM audit_checkpoints ORDER BY partition");
    assert_eq!(cps.trim(), "old-2020-01|7|audit_events_y2020m01\nold-2020-02|7|audit_events_y2020m02");

    // Unreachable for `migrate`, and refused for good for `serve` (no such role: waiting never fixes it): 69, and
    // the password is nowhere. (A database that is merely away does not stop `serve`: see the outage test.)
    let closed = format!("postgres://app:hunter2-secret@127.0.0.1:{}/x", free_port());
    let refused = format!("postgres://nobody:hunter2-secret@127.0.0.1:{}/fresh", pg.port());
    for args in [
        vec!["migrate", "--database-url", &closed, "--database-timeout", "1s"],
        vec!["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--database-url", &refused],
    ] {
        let o = mcpfleet(&args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(69), "{args:?}: {err}");
        assert!(!format!("{out}{err}").contains("hunter2"), "{err}");
    }
    // The password is not in --help either (only the variable's name).
    let (help, _) = text(&mcpfleet(&["serve", "--help"]));
    assert!(help.contains("--database-url") && help.contains("MCPFLEET_DATABASE_URL"), "{help}");
}

/// Starts `mcpfleet serve ARGS` (on free ports) and waits until it listens.
fn serve(args: &[&str]) -> std::process::Child {
    let mut child = Command::new(server_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    assert!(line.starts_with("listening on "), "{line}");
    child
}

/// The audit partition of an old month, holding the rows 1 to 7 of a chain `old-YYYY-MM`.
fn old_month(pg: &PostgresServer, db: &str, year: u32, month: u32) {
    let (name, from, to) = (
        format!("audit_events_y{year:04}m{month:02}"),
        format!("{year:04}-{month:02}-01 00:00:00+00"),
        format!("{year:04}-{:02}-01 00:00:00+00", month + 1),
    );
    pg.psql(db, &format!("CREATE TABLE {name} PARTITION OF audit_events FOR VALUES FROM ('{from}') TO ('{to}')"));
    pg.psql(
        db,
        &format!(
            "INSERT INTO audit_events (chain_id, seq, at, kind, replica, prev_hash, hash) \
             SELECT 'old-{year:04}-{month:02}', n, '{from}'::timestamptz + n * interval '1 s', 'call', 'old', \
                    decode(repeat('00', 32), 'hex'), decode(repeat('11', 32), 'hex') FROM generate_series(1, 7) n"
        ),
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn tls_to_the_database_follows_sslmode() {
    let pg = PostgresServer::start_tls();
    let ca = pg.ca_file().unwrap();
    let ca = ca.to_str().unwrap();
    let base = format!("postgres://postgres@localhost:{}/postgres", pg.port());
    let run = |query: &str| {
        let o = mcpfleet(&["migrate", "--database-url", &format!("{base}?{query}"), "--database-timeout", "3s"]);
        (o.status.code(), text(&o).1)
    };
    // The CA and the host name checked: it works.
    let (code, err) = run(&format!("sslmode=verify-full&sslrootcert={ca}"));
    assert_eq!(code, Some(0), "{err}");
    // The system's roots do not know the test CA: refused, 69.
    let (code, err) = run("sslmode=verify-full");
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("the database refuses the connection") && err.contains("TLS"), "{err}");
    // A TLS failure is not an outage: `serve` does not wait for it either.
    let o = mcpfleet(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--database-url",
        &format!("{base}?sslmode=verify-full"),
        "--database-timeout",
        "3s",
    ]);
    assert_eq!(o.status.code(), Some(69), "{:?}", text(&o));
    // The server refuses connections without TLS.
    let (code, _) = run("sslmode=disable");
    assert_eq!(code, Some(69));
    // require: encrypted, not verified (libpq's meaning).
    let (code, err) = run("sslmode=require");
    assert_eq!(code, Some(0), "{err}");
    // verify-ca checks the chain: the system's roots do not know the test CA either.
    let (code, _) = run("sslmode=verify-ca");
    assert_eq!(code, Some(69));
    let (code, err) = run(&format!("sslmode=verify-ca&sslrootcert={ca}"));
    assert_eq!(code, Some(0), "{err}");
}

/// Three replicas with JWT, `--tenant-claim org`, the reference tools on one database, behind a round-robin proxy.
struct Bed {
    pg: PostgresServer,
    fleet: JwtFleet,
    proxy: RoundRobinProxy,
    db: &'static str,
}

impl Bed {
    async fn start(extra: &[&str]) -> Self {
        let pg = PostgresServer::start();
        let url = demo_database(&pg, "app");
        let mut args = vec!["--fixtures", "reference", "--database-url", &url, "--tenant-claim", "org"];
        args.extend_from_slice(extra);
        let fleet = JwtFleet::start(3, &args).await;
        let proxy = RoundRobinProxy::start(fleet.fleet.bases()).await;
        Self { pg, fleet, proxy, db: "app" }
    }

    async fn client(&self, sub: &str, org: &str) -> McpClient {
        let token = self
            .fleet
            .token_for(sub)
            .claim("org", json!(org))
            .claim("scope", json!("mcp:access tools:read tools:write"))
            .sign();
        let mut c = McpClient::new().with_token(&token);
        c.initialize(&self.proxy.url()).await;
        c
    }

    fn sql(&self, q: &str) -> String {
        self.pg.psql(self.db, q).trim().to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reference_tools_share_one_database_across_replicas() {
    let bed = Bed::start(&[]).await;
    let url = bed.proxy.url();
    let alice = bed.client("alice", "demo-0001").await;
    let bob = bed.client("bob", "demo-0001").await;
    let carol = bed.client("carol", "demo-0002").await;
    let order = bed.sql("SELECT id FROM orders WHERE tenant = 'demo-0001' AND refunded_cents = 0 ORDER BY id LIMIT 1");
    let customer = bed.sql(&format!("SELECT customer_id FROM orders WHERE tenant = 'demo-0001' AND id = '{order}'"));

    // Drafted through one replica, confirmed through the next, repeated through the third.
    let (t, err) = call_tool(&alice, &url, 1, "create_refund_draft", json!({ "order_id": order })).await;
    assert!(!err, "{t}");
    let draft = draft_id(&t);
    let (t, err) = call_tool(&alice, &url, 2, "confirm_refund_draft", json!({ "draft_id": draft })).await;
    assert!(!err && t.contains("confirmed for order"), "{t}");
    let (t, err) = call_tool(&alice, &url, 3, "confirm_refund_draft", json!({ "draft_id": draft })).await;
    assert!(!err && t.contains("already confirmed"), "{t}");
    // The order is refunded once; nothing more to refund.
    let refunded = bed.sql(&format!(
        "SELECT refunded_cents = amount_cents FROM orders WHERE tenant = 'demo-0001' AND id = '{order}'"
    ));
    assert_eq!(refunded, "t");
    let (t, err) = call_tool(&alice, &url, 4, "create_refund_draft", json!({ "order_id": order })).await;
    assert!(err && t.contains("already fully refunded"), "{t}");

    // Bob shares the tenant: he sees its customers, not Alice's drafts.
    let (t, err) = call_tool(&bob, &url, 5, "get_customer_summary", json!({ "customer_id": customer })).await;
    assert!(!err, "{t}");
    let order2 =
        bed.sql("SELECT id FROM orders WHERE tenant = 'demo-0001' AND refunded_cents = 0 ORDER BY id LIMIT 1 OFFSET 1");
    let (t, _) = call_tool(&alice, &url, 6, "create_refund_draft", json!({ "order_id": order2 })).await;
    let draft2 = draft_id(&t);
    let (t_bob, err) = call_tool(&bob, &url, 7, "confirm_refund_draft", json!({ "draft_id": draft2 })).await;
    assert!(err && t_bob.contains("no refund draft"), "{t_bob}");
    let unknown = "drf_000000000000000000000000";
    let (t_none, _) = call_tool(&bob, &url, 8, "confirm_refund_draft", json!({ "draft_id": unknown })).await;
    assert_eq!(
        t_bob.replace(&draft2, "X").split(". Trace id").next(),
        t_none.replace(unknown, "X").split(". Trace id").next()
    );
    // Carol's tenant is another: Alice's customer does not exist for her.
    let (t, err) = call_tool(&carol, &url, 9, "get_customer_summary", json!({ "customer_id": customer })).await;
    assert!(err && t.contains("no customer"), "{t}");

    // Two replicas confirm the same draft at the same instant: one confirmation, one idempotent repeat.
    let urls = bed.fleet.fleet.urls();
    let mut a2 = McpClient::new().with_token(
        &bed.fleet
            .token_for("alice")
            .claim("org", json!("demo-0001"))
            .claim("scope", json!("mcp:access tools:read tools:write"))
            .sign(),
    );
    a2.initialize(&urls[0]).await;
    let mut a3 = a2.clone();
    a3.initialize(&urls[1]).await;
    for round in 0..5 {
        let o = bed.sql(&format!(
            "SELECT id FROM orders WHERE tenant = 'demo-0001' AND refunded_cents = 0 ORDER BY id LIMIT 1 OFFSET {}",
            round + 5
        ));
        let (t, _) = call_tool(&a2, &urls[0], 100 + round, "create_refund_draft", json!({ "order_id": o })).await;
        let d = draft_id(&t);
        let args = json!({ "draft_id": d });
        let (x, y) = tokio::join!(
            call_tool(&a2, &urls[0], 200 + round, "confirm_refund_draft", args.clone()),
            call_tool(&a3, &urls[1], 300 + round, "confirm_refund_draft", args.clone()),
        );
        let now = [&x.0, &y.0].iter().filter(|t| t.contains("confirmed for order") && !t.contains("already")).count();
        let again = [&x.0, &y.0].iter().filter(|t| t.contains("already confirmed")).count();
        assert_eq!((now, again), (1, 1), "{x:?} {y:?}");
        let cents = bed.sql(&format!(
            "SELECT o.refunded_cents = d.amount_cents FROM orders o JOIN refund_drafts d ON d.tenant = o.tenant AND d.order_id = o.id WHERE d.id = '{d}'"
        ));
        assert_eq!(cents, "t", "refunded once");
    }

    // Full-text search: ranked, bounded by the tool's limit, the tenant's documents only.
    let v = alice
        .request(
            &url,
            10,
            "tools/call",
            json!({ "name": "search_docs", "arguments": { "query": "refund", "limit": 3 } }),
        )
        .await;
    let t = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(v["result"]["isError"] != true, "{v}");
    assert!(t.matches("<item").count() <= 3 && t.contains("<item"), "{t}");

    // The 2026-07-28 generation works on the same data, and is audited as such.
    let token = bed
        .fleet
        .token_for("alice")
        .claim("org", json!("demo-0001"))
        .claim("scope", json!("mcp:access tools:read"))
        .sign();
    let stateless = StatelessClient::new().with_token(&token);
    let v = stateless.call(&url, 11, "get_customer_summary", json!({ "customer_id": customer }), json!({})).await;
    assert_eq!(v["result"]["structuredContent"]["customer_id"], json!(customer), "{v}");

    // The audit trail: every call of the run is a row, with the principal's key and the outcome. The replicas
    // drain, ending their chains; verify finds three intact, ended chains.
    let calls: u64 = 10 + 5 * 3 + 1;
    let issuer = bed.fleet.issuer.id();
    let Bed { pg, fleet, proxy, db } = bed;
    drop(proxy);
    let JwtFleet { fleet, .. } = fleet;
    let codes = fleet.stop_gracefully().await;
    assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?}");
    let rows: u64 = pg.psql(db, "SELECT count(*) FROM audit_events WHERE kind = 'call'").trim().parse().unwrap();
    assert_eq!(rows, calls);
    let url = pg.url_for(db);
    let textfile = tempfile::NamedTempFile::new().unwrap();
    let tf = textfile.path().to_str().unwrap();
    let o = mcpfleet(&["audit", "verify", "--database-url", &url, "--textfile", tf]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("verified 3 chains") && out.contains("3 ended, 0 open, 0 tampered"), "{out}");
    let prom = std::fs::read_to_string(textfile.path()).unwrap();
    for line in [
        "mcp_audit_verify_chains{result=\"ended\"} 3",
        "mcp_audit_verify_chains{result=\"tampered\"} 0",
        &format!("mcp_audit_verify_rows {}", calls + 3),
    ] {
        assert!(prom.lines().any(|l| l == line), "{line:?} in {prom}");
    }

    // Export: Alice's calls, by issuer and subject.
    let o = mcpfleet(&["audit", "export", "--database-url", &url, "--since", "1h", "--iss", &issuer, "--sub", "alice"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len() as u64, calls - 4, "bob made 3 calls and carol 1");
    assert!(lines.iter().all(|l| l["trace_id"].as_str().is_some_and(|t| t.len() == 32)), "{out}");
    let stateless_rows = lines.iter().filter(|l| l["generation"] == "2026").count();
    assert_eq!(stateless_rows, 1, "{out}");
    assert!(lines.iter().all(|l| l["principal"] == lines[0]["principal"] && l["client_id"] == "test-client"));
    assert!(lines.iter().any(|l| l["tool"] == "confirm_refund_draft" && l["outcome"] == "ok"));
    assert!(lines.iter().any(|l| l["outcome"] == "is_error"));

    // Tampering: one row edited in one chain, one row deleted in another; the third stays intact.
    let chains: Vec<String> =
        pg.psql(db, "SELECT DISTINCT chain_id FROM audit_events ORDER BY 1").lines().map(str::to_owned).collect();
    assert_eq!(chains.len(), 3);
    pg.psql(db, &format!("UPDATE audit_events SET outcome = 'ok' WHERE chain_id = '{}' AND seq = 2", chains[0]));
    pg.psql(db, &format!("DELETE FROM audit_events WHERE chain_id = '{}' AND seq = 1", chains[1]));
    let o = mcpfleet(&["audit", "verify", "--database-url", &url]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains(&format!("TAMPERED {}: row 2 was altered", chains[0])), "{out}");
    assert!(out.contains(&format!("TAMPERED {}: row 1 is missing", chains[1])), "{out}");
    assert!(out.contains(&format!("ok       {}", chains[2])), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_is_an_answer_in_time_and_loses_no_audit_row_uncounted() {
    let pg = PostgresServer::start();
    let url = demo_database(&pg, "app");
    let common = ["--database-url", url.as_str(), "--database-timeout", "1s"];
    // The reference tools need the database; the conformance tools do not, but their calls are audited there
    // (through a queue of 100 records, so that an outage overflows it).
    let reference = JwtFleet::start(2, &[&["--fixtures", "reference"][..], &common].concat()).await;
    let other =
        JwtFleet::start(1, &[&["--fixtures", "conformance", "--audit-buffer", "100"][..], &common].concat()).await;
    let token = reference.token_for("dave").claim("scope", json!("mcp:access tools:read tools:write")).sign();
    let mut r = McpClient::new().with_token(&token);
    r.initialize(&reference.url(0)).await;
    let mut o = other.client("erin");
    o.initialize(&other.url(0)).await;
    let mut made = 0_u64;
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    // Dev-less JWT without a tenant claim: dave is his own tenant, with no data; the calls still reach the database.
    for _ in 0..10 {
        let (t, err) =
            call_tool(&r, &reference.url(0), next(), "get_customer_summary", json!({ "customer_id": "cus_1" })).await;
        assert!(err && t.contains("no customer"), "{t}");
        let (_, err) = call_tool(&o, &other.url(0), next(), "test_simple_text", json!({})).await;
        assert!(!err);
        made += 2;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    pg.kill();
    for i in 0..150 {
        let (t, err) = call_tool(&o, &other.url(0), next(), "test_simple_text", json!({})).await;
        assert!(!err, "{t}");
        made += 1;
        if i % 15 == 0 {
            let started = Instant::now();
            let (t, err) =
                call_tool(&r, &reference.url(i % 2), next(), "search_docs", json!({ "query": "refund" })).await;
            made += 1;
            assert!(started.elapsed() < Duration::from_secs(5), "answered in {:?}", started.elapsed());
            assert!(err, "{t}");
            assert!(t.contains("the reference database is unavailable right now"), "{t}");
            for secret in ["postgres", "127.0.0.1", "SELECT", "connection", "password", &pg.port().to_string()] {
                assert!(!t.contains(secret), "{secret:?} in {t}");
            }
        }
    }
    // A keyed call that met the outage did not happen: its key is released, and its retry runs later.
    let keyed = json!({ "name": "search_docs", "arguments": { "query": "refund" },
                        "_meta": { "io.mcpfleet/idempotencyKey": "outage-1" } });
    let v = r.request(&reference.url(0), next(), "tools/call", keyed.clone()).await;
    assert_eq!(v["result"]["isError"], true, "{v}");
    made += 1;
    assert!(other.metric("mcp_audit_dropped_total").await > 0.0, "the queue of 100 overflowed");

    pg.start_again();
    // Once the queue is written, the next record goes in after a row saying how many were dropped.
    let deadline = Instant::now() + Duration::from_secs(30);
    while other.metric("mcp_audit_queue_depth").await > 0.0 {
        assert!(Instant::now() < deadline, "the audit queue did not drain");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let v = r.request(&reference.url(1), next(), "tools/call", keyed).await;
    assert!(v["result"].is_object() && v["result"]["isError"] != true, "the retry ran: {v}");
    made += 1;
    for _ in 0..5 {
        let (_, err) = call_tool(&o, &other.url(0), next(), "test_simple_text", json!({})).await;
        assert!(!err);
        let (t, err) =
            call_tool(&r, &reference.url(1), next(), "get_customer_summary", json!({ "customer_id": "cus_1" })).await;
        assert!(err && t.contains("no customer"), "the pool reconnects: {t}");
        made += 2;
    }
    // Every call is a row, or counted as dropped: exactly.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows: f64 = pg.psql("app", "SELECT count(*) FROM audit_events WHERE kind = 'call'").trim().parse().unwrap();
        let dropped = reference.metric("mcp_audit_dropped_total").await + other.metric("mcp_audit_dropped_total").await;
        if rows + dropped == made as f64 {
            let gap: f64 = pg
                .psql("app", "SELECT coalesce(sum(dropped), 0) FROM audit_events WHERE kind = 'dropped'")
                .trim()
                .parse()
                .unwrap();
            assert_eq!(gap, dropped, "the chain says how many went");
            break;
        }
        assert!(Instant::now() < deadline, "rows {rows} + dropped {dropped} != calls {made}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The chains are intact (open: the replicas are still running).
    let o = mcpfleet(&["audit", "verify", "--database-url", &url]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(out.contains("verified 3 chains") && out.contains("0 ended, 3 open, 0 tampered"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_during_a_database_outage_serves_and_checks_the_schema_when_it_answers() {
    let pg = PostgresServer::start();
    let url = demo_database(&pg, "app");
    pg.create_database("empty");
    let empty = pg.url_for("empty");
    pg.stop();
    // A migrated database, away: the replica is ready (readiness never depends on the database), serves, and
    // queues its audit.
    let fleet =
        JwtFleet::start(1, &["--fixtures", "conformance", "--database-url", &url, "--database-timeout", "1s"]).await;
    let admin = fleet.fleet.replicas[0].admin();
    let status = reqwest::get(format!("{admin}/readyz")).await.unwrap().status();
    assert_eq!(status, 200, "ready without the database");
    let mut c = fleet.client("erin");
    c.initialize(&fleet.url(0)).await;
    for id in 1..=3 {
        let (_, err) = call_tool(&c, &fleet.url(0), id, "test_simple_text", json!({})).await;
        assert!(!err);
    }
    // An empty database, away: the replica serves too, until it sees the schema behind.
    let mut behind = serve(&["--database-url", &empty, "--database-timeout", "1s"]);
    std::thread::sleep(Duration::from_secs(2));
    if let Some(status) = behind.try_wait().unwrap() {
        panic!("it exits ({status}) instead of waiting for the database");
    }
    // The database returns: the schema is checked, the queued audit is written, and the replica with the schema
    // behind stops with 78, as it would have at start.
    pg.start_again();
    let deadline = Instant::now() + Duration::from_secs(30);
    let audited = || pg.psql("app", "SELECT count(*) FROM audit_events WHERE tool = 'test_simple_text'");
    while audited().trim() != "3" {
        assert!(Instant::now() < deadline, "the queued audit was not written: {}", audited());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let code = loop {
        if let Some(s) = behind.try_wait().unwrap() {
            break s.code();
        }
        assert!(Instant::now() < deadline, "the replica with the schema behind did not stop");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(code, Some(78));
}
