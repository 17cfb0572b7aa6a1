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
        assert_eq!(cols[1..4], ["test-client", "calendar", "issued"], "{row}");
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
    // Tokens live 6 s (the authorization server's bound), kept 6 s less the 2 s skew: 4 s for two calls (the first
    // with the API's first key fetch), and again for the third call, the 401 and the fourth, on a loaded machine.
    let parts = Parts::start(Duration::from_secs(6)).await;
    let redis = RedisServer::start();
    let doc = parts.document("fleet-post", "    skew_seconds: 2\n");
    let f = parts.fleet(1, &redis, &doc, &[]).await;
    let url = &f.urls()[0];
    let carol = StatelessClient::new().with_token(&parts.token("carol"));
    let exchanged = || async { parts.exchanges().await["by_subject"]["carol"].as_u64().unwrap_or(0) };

    assert_eq!(events(&carol, url, 1).await["structuredContent"]["subject"], "carol");
    assert_eq!(events(&carol, url, 2).await["structuredContent"]["subject"], "carol");
    assert_eq!(exchanged().await, 1, "the second call used the cached token");
    tokio::time::sleep(Duration::from_millis(4500)).await;
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

    // A URL-mode downstream needs a key ring to seal its grants, and (with --auth jwt) the start page's sign-in.
    let url_mode = parts.dir.path().join("url-mode.yaml");
    std::fs::write(
        &url_mode,
        format!(
            "downstreams:\n  forge:\n    base_url: http://127.0.0.1:9/\n    authorization_code:\n      \
             authorization_endpoint: http://127.0.0.1:9/auth\n      token_endpoint: http://127.0.0.1:9/token\n      \
             client: {{ id: c, auth: client_secret_post, secret: {{ file: {}/secret }} }}\n",
            parts.dir.path().display()
        ),
    )
    .unwrap();
    let url_mode = url_mode.display().to_string();
    let (code, err) = serve(&[&jwt[..], &["--downstreams", &url_mode]].concat());
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("forge is a URL-mode downstream: its grants are kept sealed, which needs --downstream-key"),
        "{err}"
    );
    let key = grant_key_flag();
    let (code, err) = serve(&[&jwt[..], &["--downstreams", &url_mode, "--downstream-key", &key]].concat());
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("which needs a signin section (or --auth dev)"), "{err}");
    let dev_key = parts.dir.path().join("dev.key").display().to_string();
    let dev = ["--auth", "dev", "--dev-key-file", &dev_key, "--downstreams", &url_mode];
    let (code, err) = serve(&[&dev[..], &["--downstream-key", "k1:c2hvcnQ="]].concat());
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--downstream-key: expected key \"k1\": 32 bytes"), "{err}");
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
    pub struct ForgeDigest;

    /// `forge_digest`: always a task, reading the user's repositories at `forge` (URL mode) with the stored grant.
    #[mcpfleet_tools::async_trait]
    impl Tool for ForgeDigest {
        type Args = NoArgs;
        fn info(&self) -> ToolInfo {
            ToolInfo::new("forge_digest").task(TaskSupport { mode: TaskMode::Always, rerunnable: true })
        }
        async fn call(&self, _: NoArgs, cx: &dyn ToolContext) -> Result<ToolOutput, ToolError> {
            let repos = cx.downstream("forge").get_json("/repos", &[("limit", "5")]).await?;
            Ok(ToolOutput::text("digest").with_structured(json!({ "subject": repos["subject"] })))
        }
    }

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
        r.register(Claims).unwrap().register(Digest).unwrap().register(ForgeDigest).unwrap();
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

/// The key ring of the URL-mode tests: one key, `k1`.
const GRANT_KEY: [u8; 32] = [7; 32];

fn grant_key_flag() -> String {
    use base64::Engine as _;
    format!("k1:{}", base64::engine::general_purpose::STANDARD.encode(GRANT_KEY))
}

/// A URL-mode downstream, `forge`: a third party with its own authorization server and API.
struct Forge {
    auth: AuthServer,
    api: DownstreamApi,
}

const FORGE: &str = "https://forge.test";

impl Parts {
    /// A second authorization server and API, for `forge`; and a document with `forge` (URL mode) beside
    /// `calendar`.
    fn forge(&self) -> (Forge, String) {
        let client_key = TestKey::load("ec-1", "fleet-jwt-1", jsonwebtoken::Algorithm::ES256);
        let auth = AuthServer::start(&AuthServerSetup {
            subject_issuer: &self.issuer,
            subject_audience: mcpfleet_fleetkit::issuer::AUDIENCE,
            audience: FORGE,
            scope: "repo",
            ttl: Duration::from_secs(300),
            secret: SECRET,
            client_jwk: client_key.jwk(true),
        });
        let api = DownstreamApi::start(&auth.issuer(), FORGE);
        let dir = self.dir.path().display();
        let extra = format!(
            "  forge:\n    base_url: {api}/\n    authorization_code:\n      authorization_endpoint: {base}/auth\n      \
             token_endpoint: {base}/token\n      client: {{ id: fleet-post, auth: client_secret_post, secret: {{ file: \
             {dir}/secret }} }}\n      scope: [repo]\n",
            api = api.url(),
            base = auth.issuer(),
        );
        let doc = self.document("fleet-basic", &extra);
        // With --auth jwt a URL-mode downstream needs the start page's sign-in at the fleet's issuer (this test
        // never opens the page; the browser tests do).
        let signin = format!(
            "signin:\n  authorization_endpoint: {base}/auth\n  token_endpoint: {base}/token\n  client: {{ id: \
             fleet-post, auth: client_secret_post, secret: {{ file: {dir}/secret }} }}\n",
            base = auth.issuer(),
        );
        let text = std::fs::read_to_string(&doc).unwrap();
        std::fs::write(&doc, format!("{signin}{text}")).unwrap();
        (Forge { auth, api }, doc)
    }

    /// A real token of `forge`'s authorization server for `sub` (had by exchange, as the test's shortcut to what
    /// a user's consent would give).
    async fn forge_token(&self, forge: &Forge, sub: &str) -> (String, u64) {
        exchanged_at(&forge.auth, &self.token(sub), FORGE, None).await
    }
}

/// Stores a sealed grant for `sub` at `forge`, as the callback would.
async fn seed_grant(redis: &RedisServer, issuer: &Issuer, sub: &str, token: &str, expires_in: u64) -> Vec<u8> {
    use mcpfleet_state::GrantStore as _;
    let user = mcpfleet_core::user_key(&issuer.id(), sub);
    let vault = mcpfleet_downstream::Vault::new(vec![("k1".to_owned(), GRANT_KEY.to_vec())]).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let plain = json!({ "a": token, "e": now + expires_in * 1000 }).to_string();
    let sealed = vault.seal(user.as_str(), "forge", plain.as_bytes()).unwrap();
    let store = mcpfleet_state::RedisStore::connect(mcpfleet_state::RedisConfig::new(redis.url())).await.unwrap();
    store.put_grant(&user, "forge", &sealed, Duration::from_secs(3600)).await.unwrap();
    sealed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_mode_downstream_asks_each_client_the_way_it_can_and_uses_the_sealed_grant() {
    let parts = Parts::start(Duration::from_secs(300)).await;
    let (forge, doc) = parts.forge();
    let redis = RedisServer::start();
    let key = grant_key_flag();
    let f = parts.fleet(3, &redis, &doc, &["--downstream-key", &key]).await;
    let proxy = RoundRobinProxy::start(f.bases()).await;
    let args = json!({ "name": "list_repositories", "arguments": { "limit": 5 } });

    // 2025-11-25 with elicitation.url: the -32042 error, naming the fleet's start page by a single-use id.
    let mut alice = McpClient::new().with_token(&parts.token("alice"));
    alice.initialize_with(&proxy.url(), json!({ "elicitation": { "url": {} } })).await;
    let r = alice.request(&proxy.url(), 1, "tools/call", args.clone()).await;
    assert_eq!(r["error"]["code"], -32042, "{r}");
    let e = &r["error"]["data"]["elicitations"][0];
    assert_eq!(e["mode"], "url", "{r}");
    let id = e["elicitationId"].as_str().unwrap();
    assert_eq!(id.len(), 43, "256 random bits: {id}");
    assert_eq!(e["url"], format!("https://mcp.test/downstream/start/{id}"), "no credential, no personal data: {r}");
    assert!(e["message"].as_str().unwrap().contains("forge"));
    let stored: Value = serde_json::from_str(&redis.raw(&["GET", &format!("mcp:{{az:{id}}}")])).unwrap();
    assert_eq!(stored["subject"], "alice", "bound to the principal that asked: {stored}");
    assert_eq!(stored["issuer"], json!(parts.issuer.id()));
    assert_eq!(stored["client"], "test-client");
    assert!(stored["session"].is_string(), "the session to tell when it completes: {stored}");
    let ttl: i64 = redis.raw(&["PTTL", &format!("mcp:{{az:{id}}}")]).trim().parse().unwrap();
    assert!((1..=600_000).contains(&ttl), "expires in minutes: {ttl}");

    // A client that cannot do URL mode is told so, plainly.
    let mut plain = McpClient::new().with_token(&parts.token("alice"));
    plain.initialize(&proxy.url()).await;
    let r = plain.request(&proxy.url(), 2, "tools/call", args.clone()).await;
    let t = r["result"]["content"][0]["text"].as_str().unwrap_or_default().to_owned();
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(t.starts_with("forge needs the user's own authorization, which this client cannot ask for"), "{t}");

    // 2026-07-28 with elicitation.url: an input request, asked again while the user has not finished, up to three.
    let bob = StatelessClient::new()
        .with_token(&parts.token("bob"))
        .with_capabilities(json!({ "elicitation": { "url": {} } }));
    let mut params = json!({});
    for round in 1..=3 {
        let r = bob.call(&proxy.url(), round, "list_repositories", json!({ "limit": 5 }), params.clone()).await;
        let res = &r["result"];
        assert_eq!(res["resultType"], "input_required", "round {round}: {r}");
        let key = format!("authorize-forge-{round}");
        let ask = &res["inputRequests"][&key];
        assert_eq!(ask["method"], "elicitation/create", "{r}");
        assert_eq!(ask["params"]["mode"], "url");
        assert!(ask["params"]["url"].as_str().unwrap().starts_with("https://mcp.test/downstream/start/"));
        let mut answers = params["inputResponses"].as_object().cloned().unwrap_or_default();
        answers.insert(key, json!({ "action": "accept" }));
        params = json!({ "inputResponses": answers, "requestState": res["requestState"] });
    }
    let r = bob.call(&proxy.url(), 4, "list_repositories", json!({ "limit": 5 }), params).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text(&r["result"]).starts_with("the user has not finished authorizing forge; ask them to"), "{r}");
    let declined = bob.call(&proxy.url(), 5, "list_repositories", json!({ "limit": 5 }), json!({})).await;
    let state = declined["result"]["requestState"].clone();
    let answers = json!({ "authorize-forge-1": { "action": "decline" } });
    let r = bob
        .call(
            &proxy.url(),
            6,
            "list_repositories",
            json!({ "limit": 5 }),
            json!({ "inputResponses": answers, "requestState": state }),
        )
        .await;
    assert!(text(&r["result"]).starts_with("the user declined to authorize forge"), "{r}");

    // With a grant stored (sealed: the value in Redis is not the token), every replica uses it.
    let (token, life) = parts.forge_token(&forge, "alice").await;
    let sealed = seed_grant(&redis, &parts.issuer, "alice", &token, life).await;
    let user = mcpfleet_core::user_key(&parts.issuer.id(), "alice");
    let at_rest = redis.raw(&["GET", &format!("mcp:{{u:{}}}:dg:forge", user.as_str())]);
    assert!(!at_rest.contains(&token[..40]) && !at_rest.contains("eyJ"), "ciphertext at rest");
    assert!(sealed.starts_with(b"g1"));
    for id in 10..13 {
        let r = alice.request(&proxy.url(), id, "tools/call", args.clone()).await;
        assert_eq!(r["result"]["structuredContent"]["subject"], "alice", "{r}");
    }
    // bob has none: alice's grant is never his.
    let r = bob.call(&proxy.url(), 7, "list_repositories", json!({ "limit": 5 }), json!({})).await;
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");

    // The third party refuses alice's token: the grant is dropped and she is asked again.
    forge.api.reject("alice", 1).await;
    let r = alice.request(&proxy.url(), 20, "tools/call", args.clone()).await;
    assert_eq!(r["error"]["code"], -32042, "{r}");
    assert_eq!(redis.raw(&["EXISTS", &format!("mcp:{{u:{}}}:dg:forge", user.as_str())]).trim(), "0");
    let grants = |event: &str| format!("mcp_downstream_grants_total{{downstream=\"forge\",event=\"{event}\"}}");
    assert_eq!(metric(&f, &grants("dropped")).await, 1.0);
    assert!(metric(&f, &grants("asked")).await >= 8.0);
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Runs `tests/downstream/consent.mjs`: a person in Chromium opening `url`, signing in to the fleet as `who`, and
/// consenting at the third party; its report.
fn consent_in_browser(url: &str, who: &str) -> Value {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let node = root.join(".tools/node_modules/.bin/node");
    assert!(node.exists(), "{} is missing: run tests/run-all.sh", node.display());
    let out = Command::new(node)
        .arg(root.join("tests/downstream/consent.mjs"))
        .args(["--url", url, "--as", who])
        .current_dir(&root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["consent"] == true)
        .unwrap_or_else(|| panic!("no report: {stdout} {}", String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_authorizes_a_third_party_in_a_browser_across_replicas_and_the_retry_succeeds_on_a_third() {
    let dir = tempfile::tempdir().unwrap();
    let dev_key = dir.path().join("dev.key");
    let redis = RedisServer::start();
    // The pages are reached through a proxy that pins each step to a replica: the start page and the fleet's
    // sign-in on replica 1, the third party's callback on replica 2; the tool's call is asked on replica 0.
    let proxy = RoundRobinProxy::start(vec!["http://127.0.0.1:1".to_owned(); 3]).await;
    for (prefix, i) in
        [("/downstream/start", 1), ("/oauth/", 1), ("/downstream/signed-in", 1), ("/downstream/callback", 2)]
    {
        proxy.pin(prefix, i);
    }
    let key = TestKey::load("ed-1", "ed", jsonwebtoken::Algorithm::EdDSA);
    let issuer = Issuer::start(&[&key]).await;
    let forge_auth = AuthServer::start(&AuthServerSetup {
        subject_issuer: &issuer,
        subject_audience: "unused",
        audience: FORGE,
        scope: "repo",
        // Its access tokens live 5 s (kept 3 s, with the 2 s skew below): the retries refresh them.
        ttl: Duration::from_secs(5),
        secret: SECRET,
        client_jwk: TestKey::load("ec-1", "k", jsonwebtoken::Algorithm::ES256).jwk(true),
    })
    .with_redirect_uri(&format!("{}/downstream/callback", proxy.origin()));
    let forge_api = DownstreamApi::start(&forge_auth.issuer(), FORGE);
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let doc = dir.path().join("downstreams.yaml");
    std::fs::write(
        &doc,
        format!(
            "downstreams:\n  forge:\n    base_url: {api}/\n    authorization_code:\n      authorization_endpoint: \
             {base}/auth\n      token_endpoint: {base}/token\n      client: {{ id: fleet-post, auth: \
             client_secret_post, secret: {{ file: {dir}/secret }} }}\n      scope: [repo]\n    skew_seconds: 2\n",
            api = forge_api.url(),
            base = forge_auth.issuer(),
            dir = dir.path().display(),
        ),
    )
    .unwrap();
    let resource = format!("{}/mcp", proxy.origin());
    let f = Fleet::builder()
        .replicas(3)
        .redis(redis.url())
        .dev_auth(&dev_key)
        .arg("--resource-url")
        .arg(&resource)
        .arg("--fixtures")
        .arg("reference")
        .arg("--downstreams")
        .arg(doc.display().to_string())
        .arg("--downstream-key")
        .arg(grant_key_flag())
        .start()
        .await;
    for (i, base) in f.bases().into_iter().enumerate() {
        proxy.replace(i, base);
    }
    let dev = mcpfleet_auth::dev::DevIssuer::load_or_create(&dev_key).unwrap();
    let token = |sub: &str| dev.mint(sub, "mcp:access tools:read", None, Duration::from_secs(600)).unwrap();
    let urls = f.urls();
    let args = json!({ "name": "list_repositories", "arguments": { "limit": 5 } });

    // carol's client (2025-11-25, URL elicitation) on replica 0: asked.
    let mut carol = McpClient::new().with_token(&token("carol"));
    carol.initialize_with(&urls[0], json!({ "elicitation": { "url": {} } })).await;
    let mut listen = mcpfleet_fleetkit::SseStream::new(carol.get(&urls[0], None).await);
    listen.next(Duration::from_secs(5)).await.unwrap().expect("priming event");
    let r = carol.request(&urls[0], 1, "tools/call", args.clone()).await;
    assert_eq!(r["error"]["code"], -32042, "{r}");
    let start = r["error"]["data"]["elicitations"][0]["url"].as_str().unwrap().to_owned();
    let elicitation_id = r["error"]["data"]["elicitations"][0]["elicitationId"].as_str().unwrap().to_owned();
    assert!(start.starts_with(&format!("{}/downstream/start/", proxy.origin())), "{start}");

    // dave, another signed-in user, opens carol's link: refused, and nothing is used up.
    let report = consent_in_browser(&start, "dave");
    assert_eq!(report["status"], 403, "{report}");
    assert_eq!(report["title"], "This link is not yours", "{report}");
    assert_eq!(forge_auth.0.stats().await["codes"], Value::Null, "dave never reached the third party");

    // carol opens it: she signs in (replica 1), consents at the third party, the callback lands on replica 2.
    let report = consent_in_browser(&start, "carol");
    assert_eq!(report["title"], "Connected", "{report}");
    assert_eq!(report["message"], "forge is connected. You can close this window and go back to your client.");
    assert_eq!(forge_auth.0.stats().await["codes"], 1, "one code exchanged");
    let steps: Vec<&str> = report["steps"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(steps.first().is_some_and(|s| s.starts_with("/downstream/start/")), "{steps:?}");
    assert_eq!(steps.last(), Some(&"/downstream/callback"), "{steps:?}");
    // The link is single-use.
    let again = consent_in_browser(&start, "carol");
    assert_eq!(again["status"], 410, "{again}");

    // Her session hears that it completed, on its standalone stream (replica 0).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ev = listen.next(Duration::from_secs(5)).await.unwrap().expect("an event");
        if ev.data.contains("notifications/elicitation/complete") {
            assert!(ev.data.contains(&elicitation_id), "{}", ev.data);
            break;
        }
        assert!(Instant::now() < deadline, "no completion notice");
    }
    // The grant in Redis is ciphertext, and the retry on a third replica (1 asked nothing; 0 asked) succeeds.
    let user = mcpfleet_core::user_key(mcpfleet_auth::dev::DEV_ISSUER, "carol");
    let at_rest = redis.raw(&["GET", &format!("mcp:{{u:{}}}:dg:forge", user.as_str())]);
    assert!(at_rest.starts_with("g1") && !at_rest.contains("eyJ"), "sealed at rest");
    let r = carol.request(&urls[1], 2, "tools/call", args.clone()).await;
    assert_eq!(r["result"]["structuredContent"]["subject"], "carol", "the third party saw carol: {r}");

    // Once the access token is within its skew of expiry, calls on all three replicas at once refresh it once:
    // one replica spends the refresh token under the grant's lock, the others use what it stored.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let refreshes_before = forge_auth.0.stats().await["refreshes"].as_u64().unwrap_or(0);
    let calls = (0..3).map(|i| carol.request(&urls[i], 10 + i as i64, "tools/call", args.clone()));
    for r in futures::future::join_all(calls).await {
        assert_eq!(r["result"]["structuredContent"]["subject"], "carol", "{r}");
    }
    let refreshes = forge_auth.0.stats().await["refreshes"].as_u64().unwrap_or(0) - refreshes_before;
    assert_eq!(refreshes, 1, "one refresh for three replicas");
    // The grant is the user's, whatever the generation: carol's 2026-07-28 client uses it at once.
    let stateless =
        StatelessClient::new().with_token(&token("carol")).with_capabilities(json!({ "elicitation": { "url": {} } }));
    let r = stateless.call(&urls[2], 20, "list_repositories", json!({ "limit": 5 }), json!({})).await;
    assert_eq!(r["result"]["structuredContent"]["subject"], "carol", "{r}");
    let mut completed = Vec::new();
    for r in &f.replicas {
        let m = mcpfleet_fleetkit::scrape(&r.admin()).await;
        completed.push(m.get("mcp_downstream_grants_total{downstream=\"forge\",event=\"completed\"}").copied());
    }
    assert_eq!(completed, [Some(0.0), Some(0.0), Some(1.0)], "the callback landed on replica 2");
}

/// A token of `auth` for `audience` (and `scope`), exchanged for `subject_token`, and its `expires_in`.
async fn exchanged_at(auth: &AuthServer, subject_token: &str, audience: &str, scope: Option<&str>) -> (String, u64) {
    let mut form = vec![
        ("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange"),
        ("subject_token", subject_token),
        ("subject_token_type", "urn:ietf:params:oauth:token-type:access_token"),
        ("audience", audience),
    ];
    if let Some(scope) = scope {
        form.push(("scope", scope));
    }
    let body: String = form.iter().map(|(k, v)| format!("{k}={}", urlencode(v))).collect::<Vec<_>>().join("&");
    let r: Value = reqwest::Client::new()
        .post(auth.token_endpoint())
        .basic_auth("fleet-basic", Some(SECRET))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = r["access_token"].as_str().unwrap_or_else(|| panic!("no token: {r}")).to_owned();
    (token, r["expires_in"].as_u64().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_real_issuer_the_start_page_signs_the_user_in_there_and_refuses_anyone_else() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    let db = pg.url();
    assert!(Command::new(server_bin()).args(["migrate", "--database-url", &db]).status().unwrap().success());
    let proxy = RoundRobinProxy::start(vec!["http://127.0.0.1:1".to_owned(); 2]).await;
    let resource = format!("{}/mcp", proxy.origin());
    let key = TestKey::load("ed-1", "ed", jsonwebtoken::Algorithm::EdDSA);
    let upstream = Issuer::start(&[&key]).await;
    let client_jwk = TestKey::load("ec-1", "k", jsonwebtoken::Algorithm::ES256).jwk(true);
    // The fleet's own issuer: oidc-provider, whose login page is the user's sign-in; MCP clients hold its tokens.
    let idp = AuthServer::start(&AuthServerSetup {
        subject_issuer: &upstream,
        subject_audience: mcpfleet_fleetkit::issuer::AUDIENCE,
        audience: &resource,
        scope: "mcp:access tools:read",
        ttl: Duration::from_secs(300),
        secret: SECRET,
        client_jwk: client_jwk.clone(),
    })
    .with_redirect_uri(&format!("{}/downstream/signed-in", proxy.origin()));
    let forge_auth = AuthServer::start(&AuthServerSetup {
        subject_issuer: &upstream,
        subject_audience: "unused",
        audience: FORGE,
        scope: "repo",
        ttl: Duration::from_secs(300),
        secret: SECRET,
        client_jwk,
    })
    .with_redirect_uri(&format!("{}/downstream/callback", proxy.origin()));
    let forge_api = DownstreamApi::start(&forge_auth.issuer(), FORGE);
    std::fs::write(dir.path().join("secret"), SECRET).unwrap();
    let doc = dir.path().join("downstreams.yaml");
    let client =
        format!("{{ id: fleet-post, auth: client_secret_post, secret: {{ file: {}/secret }} }}", dir.path().display());
    std::fs::write(
        &doc,
        format!(
            "signin:\n  authorization_endpoint: {idp}/auth\n  token_endpoint: {idp}/token\n  client: {client}\n  \
             scope: [mcp:access]\ndownstreams:\n  forge:\n    base_url: {api}/\n    authorization_code:\n      \
             authorization_endpoint: {forge}/auth\n      token_endpoint: {forge}/token\n      client: {client}\n      \
             scope: [repo]\n",
            idp = idp.issuer(),
            api = forge_api.url(),
            forge = forge_auth.issuer(),
        ),
    )
    .unwrap();
    let f = Fleet::builder()
        .replicas(2)
        .redis(redis.url())
        .args([
            "--auth",
            "jwt",
            "--jwks-url",
            &format!("{}/jwks", idp.issuer()),
            "--jwt-issuer",
            &idp.issuer(),
            "--jwt-audience",
            &resource,
            "--resource-url",
            &resource,
            "--fixtures",
            "reference",
            "--downstreams",
            &doc.display().to_string(),
            "--downstream-key",
            &grant_key_flag(),
            "--database-url",
            &db,
        ])
        .start()
        .await;
    for (i, base) in f.bases().into_iter().enumerate() {
        proxy.replace(i, base);
    }
    let token = |sub: &'static str| {
        let upstream_token = key.token(&upstream.id(), sub).sign();
        let idp = &idp;
        let resource = resource.clone();
        async move { exchanged_at(idp, &upstream_token, &resource, Some("mcp:access tools:read")).await.0 }
    };
    let erin = StatelessClient::new()
        .with_token(&token("erin").await)
        .with_capabilities(json!({ "elicitation": { "url": {} } }));
    let r = erin.call(&proxy.url(), 1, "list_repositories", json!({ "limit": 5 }), json!({})).await;
    let ask = &r["result"]["inputRequests"]["authorize-forge-1"];
    let start = ask["params"]["url"].as_str().unwrap_or_else(|| panic!("asked: {r}")).to_owned();

    // frank signs in at the issuer with his own login: refused.
    let report = consent_in_browser(&start, "frank");
    assert_eq!(
        (report["status"].clone(), report["title"].clone()),
        (json!(403), json!("This link is not yours")),
        "{report}"
    );
    // erin signs in there, consents at forge, and her retry goes through.
    let report = consent_in_browser(&start, "erin");
    assert_eq!(report["title"], "Connected", "{report}");
    let r = erin.call(&proxy.url(), 2, "list_repositories", json!({ "limit": 5 }), json!({})).await;
    assert_eq!(r["result"]["structuredContent"]["subject"], "erin", "{r}");

    // The completed authorization is in the audit chain: who, which downstream, the token's lifetime; no token.
    let deadline = Instant::now() + Duration::from_secs(15);
    let rows = loop {
        let out = pg.psql("postgres", "SELECT tool, outcome, detail FROM audit_events WHERE kind = 'authorize'");
        if !out.trim().is_empty() || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(rows.trim().starts_with("forge|completed|lifetime "), "{rows}");
    assert!(!pg.psql("postgres", "SELECT * FROM audit_events").contains("eyJ"), "no token in the audit trail");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_run_uses_a_stored_url_mode_grant_and_asks_through_the_task_for_a_missing_one() {
    let parts = Parts::start(Duration::from_secs(300)).await;
    let (forge, doc) = parts.forge();
    let redis = RedisServer::start();
    let f = Fleet::builder()
        .replicas(2)
        .redis(redis.url())
        .jwt(&parts.issuer)
        .arg("--downstreams")
        .arg(doc)
        .arg("--downstream-key")
        .arg(grant_key_flag())
        .catalog(std::sync::Arc::new(writer::catalog()))
        .start()
        .await;
    let urls = f.urls();
    let caps = json!({ "elicitation": { "url": {} }, "extensions": { "io.modelcontextprotocol/tasks": {} } });

    // gina has a grant: her task, run on a worker of either replica, uses it.
    let (token, life) = parts.forge_token(&forge, "gina").await;
    seed_grant(&redis, &parts.issuer, "gina", &token, life).await;
    let gina = StatelessClient::new().with_token(&parts.token("gina")).with_capabilities(caps.clone());
    let created = gina.call(&urls[0], 1, "forge_digest", json!({}), json!({})).await;
    let task = created["result"]["taskId"].as_str().unwrap_or_else(|| panic!("a task: {created}")).to_owned();
    let done = gina.poll_task(&urls, &task, 15, |t| t["status"] == "completed").await;
    assert_eq!(done["result"]["structuredContent"]["subject"], "gina", "{done}");

    // hank has none: his task asks for the authorization through the task's input requests.
    let hank = StatelessClient::new().with_token(&parts.token("hank")).with_capabilities(caps);
    let created = hank.call(&urls[1], 2, "forge_digest", json!({}), json!({})).await;
    let task = created["result"]["taskId"].as_str().unwrap().to_owned();
    let waiting = hank.poll_task(&urls, &task, 15, |t| t["status"] == "input_required").await;
    let ask = &waiting["inputRequests"]["authorize-forge-1"];
    assert_eq!(ask["method"], "elicitation/create", "{waiting}");
    assert_eq!(ask["params"]["mode"], "url", "{waiting}");
    assert!(ask["params"]["url"].as_str().unwrap().starts_with("https://mcp.test/downstream/start/"), "{waiting}");
}
