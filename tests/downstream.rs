//! Downstream tokens (issue 35, docs/DOWNSTREAM.md), through three replicas behind round-robin on a real Redis,
//! against a real authorization server (`oidc-provider` with RFC 8693 token exchange registered) and a downstream
//! API that checks every token's issuer, audience and subject: the reference tool `upcoming_events` gets an
//! exchanged token for the `calendar` downstream, for the caller and never anyone else; each replica exchanges at
//! most once per subject token while the token lives, again when it has expired and when the downstream answers
//! 401; with the authorization server down the model gets a clear `isError` and each replica tries at most once per
//! key per negative-cache interval; every exchange is audited in PostgreSQL (never the token); the three client
//! authentications work (client_secret_basic with an actor token, client_secret_post, private_key_jwt); and a
//! document the server cannot use exits 64.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{
    AuthServer, AuthServerSetup, DownstreamApi, Fleet, Issuer, McpClient, PostgresServer, RedisServer, RoundRobinProxy,
    StatelessClient, TestKey, server_bin,
};
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

const AUDIENCE: &str = "https://calendar.test";
const SECRET: &str = "s3cret-of-the-fleet";

/// The parts every test here runs against: the fleet's issuer, the authorization server, the calendar API.
struct Parts {
    key: TestKey,
    issuer: Issuer,
    auth: AuthServer,
    api: DownstreamApi,
    dir: tempfile::TempDir,
}

impl Parts {
    async fn start(ttl: Duration) -> Self {
        let key = TestKey::load("ed-1", "ed", jsonwebtoken::Algorithm::EdDSA);
        let issuer = Issuer::start(&[&key]).await;
        let client_key = TestKey::load("ec-1", "fleet-jwt-1", jsonwebtoken::Algorithm::ES256);
        let auth = AuthServer::start(&AuthServerSetup {
            subject_issuer: &issuer,
            subject_audience: mcpfleet_fleetkit::issuer::AUDIENCE,
            audience: AUDIENCE,
            scope: "calendar.read",
            ttl,
            secret: SECRET,
            client_jwk: client_key.jwk(true),
        });
        let api = DownstreamApi::start(&auth.issuer(), AUDIENCE);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), format!("{SECRET}\n")).unwrap();
        std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../testkit/keys/ec-1.pem"), dir.path().join("client.pem"))
            .unwrap();
        Self { key, issuer, auth, api, dir }
    }

    /// A downstreams document for `calendar` with `client` (one of the authorization server's three clients) and
    /// `extra` lines under the downstream; written to a file, its path.
    fn document(&self, client: &str, extra: &str) -> String {
        let dir = self.dir.path().display();
        let client = match client {
            "fleet-basic" => {
                format!("{{ id: fleet-basic, auth: client_secret_basic, secret: {{ file: {dir}/secret }} }}")
            }
            "fleet-post" => format!("{{ id: fleet-post, auth: client_secret_post, secret: {{ file: {dir}/secret }} }}"),
            _ => format!(
                "{{ id: fleet-jwt, auth: private_key_jwt, private_key: {{ file: {dir}/client.pem }}, key_alg: ES256, \
                 key_id: fleet-jwt-1 }}"
            ),
        };
        let doc = format!(
            "downstreams:\n  calendar:\n    base_url: {api}/\n    exchange:\n      token_endpoint: {token}\n      \
             client: {client}\n      audience: {AUDIENCE}\n      scope: [calendar.read]\n{extra}",
            api = self.api.url(),
            token = self.auth.token_endpoint(),
        );
        let path = self.dir.path().join(format!("downstreams-{}.yaml", rand_suffix()));
        std::fs::write(&path, doc).unwrap();
        path.display().to_string()
    }

    fn token(&self, sub: &str) -> String {
        self.key.token(&self.issuer.id(), sub).claim("scope", json!("mcp:access tools:read")).sign()
    }

    async fn fleet(&self, n: usize, redis: &RedisServer, document: &str, extra: &[&str]) -> Fleet {
        let mut b = Fleet::builder()
            .replicas(n)
            .redis(redis.url())
            .jwt(&self.issuer)
            .arg("--fixtures")
            .arg("reference")
            .arg("--downstreams")
            .arg(document);
        for a in extra {
            b = b.arg(*a);
        }
        b.start().await
    }

    async fn exchanges(&self) -> Value {
        self.auth.0.stats().await
    }
}

fn rand_suffix() -> u64 {
    rand::random()
}

/// `upcoming_events` for `days`, as a 2026-07-28 call.
async fn events(c: &StatelessClient, url: &str, id: i64) -> Value {
    c.call(url, id, "upcoming_events", json!({ "days": 3 }), json!({})).await["result"].clone()
}

/// A metric summed over the fleet, for one downstream label set (`name{labels}`).
async fn metric(f: &Fleet, series: &str) -> f64 {
    let mut sum = 0.0;
    for r in &f.replicas {
        sum += mcpfleet_fleetkit::scrape(&r.admin()).await.get(series).copied().unwrap_or(0.0);
    }
    sum
}

/// The model's text of a result.
fn text(r: &Value) -> String {
    r["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_gets_an_exchanged_token_for_its_caller_once_per_replica_and_every_exchange_is_audited() {
    let pg = PostgresServer::start();
    let db = pg.url();
    assert!(Command::new(server_bin()).args(["migrate", "--database-url", &db]).status().unwrap().success());
    let parts = Parts::start(Duration::from_secs(300)).await;
    let redis = RedisServer::start();
    let doc = parts.document("fleet-basic", "      actor_token: { scope: [calendar.read] }\n");
    let f = parts.fleet(3, &redis, &doc, &["--database-url", &db]).await;
    let proxy = RoundRobinProxy::start(f.bases()).await;

    // alice, 2026-07-28, six calls through round-robin: two on each replica.
    let alice = StatelessClient::new().with_token(&parts.token("alice"));
    for id in 1..=6 {
        let r = events(&alice, &proxy.url(), id).await;
        assert_ne!(r["isError"], true, "{r}");
        assert_eq!(r["structuredContent"]["subject"], "alice", "the calendar saw the caller: {r}");
        assert_eq!(r["structuredContent"]["audience"], AUDIENCE, "{r}");
        let t = text(&r);
        assert!(t.contains("<untrusted-data-") && t.contains("Standup &lt;b&gt;for&lt;/b&gt; alice"), "{t}");
    }
    let stats = parts.exchanges().await;
    assert_eq!(stats["by_subject"]["alice"], 3, "one exchange per replica for alice's token: {stats}");
    assert_eq!(stats["actor"], 3, "each exchange carried the server's own actor token: {stats}");
    assert_eq!(stats["client_credentials"], 3, "one actor token per replica, cached: {stats}");

    // bob, 2025-11-25 session, on the same replicas: his own exchange, never alice's token.
    let mut bob = McpClient::new().with_token(&parts.token("bob"));
    bob.initialize(&proxy.url()).await;
    for id in 1..=3 {
        let r = bob
            .request(&proxy.url(), id, "tools/call", json!({ "name": "upcoming_events", "arguments": { "days": 1 } }))
            .await;
        assert_eq!(r["result"]["structuredContent"]["subject"], "bob", "{r}");
    }
    let stats = parts.exchanges().await;
    assert_eq!(stats["by_subject"]["bob"], 3, "{stats}");
    let api = parts.api.0.stats().await;
    assert_eq!(api["by_subject"]["alice"], 6, "{api}");
    assert_eq!(api["by_subject"]["bob"], 3, "{api}");
    assert_eq!(api["rejected"], 0, "no token was refused: {api}");

    let series = |s: &str| format!("mcp_downstream_{s}");
    assert_eq!(metric(&f, &series("exchanges_total{downstream=\"calendar\",outcome=\"issued\"}")).await, 6.0);
    assert_eq!(metric(&f, &series("tokens_total{downstream=\"calendar\",source=\"cache\"}")).await, 3.0);
    assert_eq!(metric(&f, &series("tokens_total{downstream=\"calendar\",source=\"exchange\"}")).await, 6.0);
    assert_eq!(metric(&f, &series("requests_total{downstream=\"calendar\",status=\"2xx\"}")).await, 9.0);
    assert_eq!(metric(&f, &series("exchange_duration_seconds_count{downstream=\"calendar\"}")).await, 6.0);

    // Every exchange audited: who, which downstream, the outcome, the lifetime; never a token.
    let deadline = Instant::now() + Duration::from_secs(15);
    let rows = loop {
        let out = pg.psql(
            "postgres",
            "SELECT principal, client_id, tool, outcome, detail, trace_id FROM audit_events WHERE kind = 'exchange' \
             ORDER BY at",
        );
        let rows: Vec<String> = out.lines().map(str::to_owned).filter(|l| !l.is_empty()).collect();
        if rows.len() >= 6 || Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(rows.len(), 6, "{rows:?}");
    for row in &rows {
        let cols: Vec<&str> = row.split('|').collect();
        assert_eq!(cols[1..5], ["test-client", "calendar", "issued", cols[4]], "{row}");
        let secs: u64 = cols[4].strip_prefix("lifetime ").and_then(|l| l.strip_suffix('s')).unwrap().parse().unwrap();
        assert!((250..=300).contains(&secs), "about 300 s: {row}");
        assert_eq!(cols[5].len(), 32, "a trace id: {row}");
    }
    let everything = pg.psql("postgres", "SELECT * FROM audit_events");
    assert!(!everything.contains("eyJ"), "no token anywhere in the audit trail");
    let verify = Command::new(server_bin()).args(["audit", "verify", "--database-url", &db]).output().unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));

    // Nothing of it in Redis: exchanged tokens stay in the replicas' memory.
    for k in redis.keys() {
        let dump = redis.raw(&["DUMP", &k]);
        assert!(!dump.contains("eyJ"), "{k} holds a token");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_and_a_401_are_exchanged_again() {
    // Tokens live 4 s (the authorization server's bound), kept 4 s less the 2 s skew.
    let parts = Parts::start(Duration::from_secs(4)).await;
    let redis = RedisServer::start();
    let doc = parts.document("fleet-post", "    skew_seconds: 2\n");
    let f = parts.fleet(1, &redis, &doc, &[]).await;
    let url = &f.urls()[0];
    let carol = StatelessClient::new().with_token(&parts.token("carol"));
    let exchanged = || async { parts.exchanges().await["by_subject"]["carol"].as_u64().unwrap_or(0) };

    assert_eq!(events(&carol, url, 1).await["structuredContent"]["subject"], "carol");
    assert_eq!(events(&carol, url, 2).await["structuredContent"]["subject"], "carol");
    assert_eq!(exchanged().await, 1, "the second call used the cached token");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(events(&carol, url, 3).await["structuredContent"]["subject"], "carol");
    assert_eq!(exchanged().await, 2, "a token within its skew of expiry is exchanged again");

    // The calendar refuses carol's (valid) token once: the token is dropped, exchanged again, the request sent
    // again, and the tool never sees the 401.
    parts.api.reject("carol", 1).await;
    let r = events(&carol, url, 4).await;
    assert_eq!(r["structuredContent"]["subject"], "carol", "{r}");
    assert_eq!(exchanged().await, 3, "a 401 makes one exchange more");
    assert_eq!(metric(&f, "mcp_downstream_requests_total{downstream=\"calendar\",status=\"401\"}").await, 1.0);

    // Refused twice in a row: the tool gets the second 401 as an answer, which it reports without internals.
    parts.api.reject("carol", 2).await;
    let r = events(&carol, url, 5).await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(text(&r).starts_with("The tool failed."), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_authorization_server_down_each_replica_tries_once_per_interval_and_the_model_is_told_plainly() {
    let mut parts = Parts::start(Duration::from_secs(300)).await;
    let redis = RedisServer::start();
    let doc = parts.document("fleet-jwt", "    negative_cache_seconds: 3\n");
    let f = parts.fleet(3, &redis, &doc, &[]).await;
    let proxy = RoundRobinProxy::start(f.bases()).await;
    let dave = StatelessClient::new().with_token(&parts.token("dave"));

    // private_key_jwt works.
    assert_eq!(events(&dave, &proxy.url(), 1).await["structuredContent"]["subject"], "dave");
    assert_eq!(parts.exchanges().await["by_client"]["fleet-jwt"], 1);

    // A subject the authorization server will not delegate for: refused, said so, kept for the interval.
    let eve = StatelessClient::new().with_token(&parts.token("blocked-eve"));
    for id in 1..=6 {
        let r = events(&eve, &proxy.url(), id).await;
        assert_eq!(r["isError"], true, "{r}");
        assert!(text(&r).starts_with("calendar refused access for this user. Trace id: "), "{r}");
    }
    assert_eq!(parts.exchanges().await["refused"], 3, "one refusal per replica, kept");

    // The authorization server goes down: erin's calls get a plain isError, and each replica asks once.
    parts.auth.0.stop();
    let erin = StatelessClient::new().with_token(&parts.token("erin"));
    for id in 1..=9 {
        let r = events(&erin, &proxy.url(), id).await;
        assert_eq!(r["isError"], true, "{r}");
        let t = text(&r);
        assert!(
            t.starts_with("signing in to calendar is unavailable right now; try again in a minute. Trace id: "),
            "{t}"
        );
        for leak in ["127.0.0.1", "http", "token", "connect", "eyJ"] {
            assert!(!t.contains(leak), "{leak} in {t}");
        }
    }
    let unavailable = "mcp_downstream_exchanges_total{downstream=\"calendar\",outcome=\"unavailable\"}";
    assert_eq!(metric(&f, unavailable).await, 3.0, "at most one attempt per replica per interval");
    let negative = "mcp_downstream_tokens_total{downstream=\"calendar\",source=\"negative_cache\"}";
    assert_eq!(metric(&f, negative).await, 6.0 + 3.0, "eve's three and erin's six answered from the negative cache");

    // Back up; after the interval, erin's calls go through on every replica.
    parts.auth.0.start_again();
    tokio::time::sleep(Duration::from_millis(3200)).await;
    for id in 10..=12 {
        assert_eq!(events(&erin, &proxy.url(), id).await["structuredContent"]["subject"], "erin");
    }
    assert_eq!(metric(&f, unavailable).await, 3.0);
}

#[tokio::test]
async fn a_downstreams_document_the_server_cannot_use_exits_64_with_its_place() {
    let parts = Parts::start(Duration::from_secs(60)).await;
    let good = parts.document("fleet-basic", "");
    let serve = |args: &[&str]| {
        let o = Command::new(server_bin()).arg("serve").args(["--listen", "127.0.0.1:0"]).args(args).output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, err) = serve(&["--auth", "none", "--downstreams", &good]);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--downstreams needs a verified caller"), "{err}");

    let (jwks, iss) = (parts.issuer.jwks_url(), parts.issuer.id());
    let aud = mcpfleet_fleetkit::issuer::AUDIENCE;
    let jwt =
        ["--auth", "jwt", "--jwks-url", &jwks, "--jwt-issuer", &iss, "--jwt-audience", aud, "--resource-url", aud];
    let bad = parts.dir.path().join("bad.yaml");
    std::fs::write(&bad, std::fs::read_to_string(&good).unwrap().replace("audience:", "audiences:")).unwrap();
    let (code, err) = serve(&[&jwt[..], &["--downstreams", &bad.display().to_string()]].concat());
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("/downstreams/calendar/exchange/audiences: expected no such key here"), "{err}");

    let missing = parts.dir.path().join("missing.yaml");
    let text = std::fs::read_to_string(&good).unwrap();
    std::fs::write(&missing, text.replace(&format!("{}/secret", parts.dir.path().display()), "/nonexistent/s"))
        .unwrap();
    let (code, err) = serve(&[&jwt[..], &["--downstreams", &missing.display().to_string()]].concat());
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("/downstreams/calendar/exchange/client/secret: file /nonexistent/s"), "{err}");
    assert!(!err.contains(SECRET));
}

/// A tool writer's tools for the context API: `calendar_claims` reads the token `cx.downstream_token` gives (and
/// returns its claims, never the token); `calendar_digest` always runs as a task, where there is no caller's
/// request to exchange.
mod writer {
    use base64::Engine as _;
    use mcpfleet_tools::schemars::{self, JsonSchema};
    use mcpfleet_tools::{Registry, TaskMode, TaskSupport, Tool, ToolContext, ToolError, ToolInfo, ToolOutput};
    use serde::Deserialize;
    use serde_json::{Value, json};

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct NoArgs {}

    pub struct Claims;
    pub struct Digest;

    #[mcpfleet_tools::async_trait]
    impl Tool for Claims {
        type Args = NoArgs;
        fn info(&self) -> ToolInfo {
            ToolInfo::new("calendar_claims").read_only()
        }
        async fn call(&self, _: NoArgs, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
            let token = cx.downstream_token("calendar").await?;
            assert!(!format!("{token:?}").contains("eyJ"), "a token's Debug never shows it");
            let payload = token.secret().split('.').nth(1).unwrap_or_default();
            let claims: Value = serde_json::from_slice(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap_or_default(),
            )
            .unwrap_or_default();
            let unknown = cx.downstream_token("mail").await.err().map(|e| e.to_string());
            Ok(ToolOutput::text("claims").with_structured(json!({
                "sub": claims["sub"], "aud": claims["aud"], "iss": claims["iss"], "unknown": unknown,
            })))
        }
    }

    #[mcpfleet_tools::async_trait]
    impl Tool for Digest {
        type Args = NoArgs;
        fn info(&self) -> ToolInfo {
            ToolInfo::new("calendar_digest").task(TaskSupport { mode: TaskMode::Always, rerunnable: false })
        }
        async fn call(&self, _: NoArgs, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
            let events = cx.downstream("calendar").get_json("/events", &[("days", "7")]).await?;
            Ok(ToolOutput::text(events.to_string()))
        }
    }

    pub fn catalog() -> Registry {
        let mut r = Registry::new();
        r.register(Claims).unwrap().register(Digest).unwrap();
        r
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_s_context_gives_the_caller_s_downstream_token_and_a_task_run_a_typed_refusal() {
    let parts = Parts::start(Duration::from_secs(300)).await;
    let redis = RedisServer::start();
    let doc = parts.document("fleet-basic", "");
    let f = Fleet::builder()
        .replicas(2)
        .redis(redis.url())
        .jwt(&parts.issuer)
        .arg("--downstreams")
        .arg(doc)
        .catalog(std::sync::Arc::new(writer::catalog()))
        .start()
        .await;
    let urls = f.urls();
    let frank = StatelessClient::new()
        .with_token(&parts.token("frank"))
        .with_capabilities(json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } }));

    let r = frank.call(&urls[0], 1, "calendar_claims", json!({}), json!({})).await;
    let claims = &r["result"]["structuredContent"];
    assert_eq!(claims["sub"], "frank", "{r}");
    assert_eq!(claims["aud"], AUDIENCE, "{r}");
    assert_eq!(claims["iss"], json!(parts.auth.issuer()), "issued by the authorization server, not the caller's: {r}");
    assert_eq!(claims["unknown"], "mail is not a service this server is configured to reach");

    // Queued as a task, run on a worker of either replica: no caller's request there, so a typed refusal.
    let created = frank.call(&urls[1], 2, "calendar_digest", json!({}), json!({})).await;
    let task = created["result"]["taskId"].as_str().unwrap_or_else(|| panic!("a task: {created}")).to_owned();
    let done = frank.poll_task(&urls, &task, 15, |t| t["status"] == "completed").await;
    assert_eq!(done["result"]["isError"], true, "{done}");
    let t = text(&done["result"]);
    assert!(
        t.starts_with(
            "calendar can only be reached while the caller's request is open; this tool cannot use it in a task. \
             Trace id: "
        ),
        "{t}"
    );
    assert_eq!(parts.exchanges().await["by_subject"]["frank"], 1, "the task made no exchange");
}
