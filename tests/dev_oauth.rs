//! End-to-end sign-in of `--auth dev` (docs/DEV-SIGN-IN.md): a real replica process, driven the way an OAuth
//! client of the MCP SDKs drives it, with plain HTTP and no redirect following. A token-less request, the
//! challenge, the RFC 9728 and RFC 8414 metadata (named after the host the client used), dynamic registration,
//! the authorization code with PKCE, the token, the MCP calls, step-up to a tool's scope, refresh (for a grant
//! with `offline_access` only); then every refusal a client can meet, and the modes that have no sign-in.

#![expect(clippy::unwrap_used, reason = "test helpers fail loudly")]

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use mcpfleet_auth::ProtectedResource;
use mcpfleet_auth::dev::DevIssuer;
use mcpfleet_auth::dev_oauth::{AuthorizeOutcome, DevAuthServer};
use mcpfleet_core::time::epoch_secs;
use mcpfleet_fleetkit::{Fleet, Issuer, McpClient, TestKey, server_bin};
use reqwest::Url;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;

const REDIRECT: &str = "http://127.0.0.1:9/callback";
/// What Chromium sends with a navigation.
const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,\
                              */*;q=0.8,application/signed-exchange;v=b3;q=0.7";

/// A `--auth dev` replica with a key file of its own.
struct Dev {
    fleet: Fleet,
    key_file: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Dev {
    async fn start(name: &str) -> Self {
        Self::start_with(name, &[]).await
    }

    async fn start_with(name: &str, extra: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("mcpfleet-dev-oauth-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key_file = dir.join("dev-key.pem");
        let fleet = Fleet::builder().replicas(1).dev_auth(&key_file).args(extra.iter().copied()).start().await;
        let port = fleet.bases()[0].rsplit(':').next().unwrap().parse().unwrap();
        Self { fleet, key_file, dir, port }
    }

    fn localhost(&self) -> String {
        format!("http://localhost:{}", self.port)
    }

    fn ip(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn http() -> reqwest::Client {
    mcpfleet_fleetkit::init_tls();
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).no_proxy().build().unwrap()
}

/// What the client saw.
#[derive(Debug)]
struct Seen {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Seen {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map_or("", |v| v.to_str().unwrap())
    }

    /// The query parameters of the `Location` of a redirect to [`REDIRECT`].
    fn redirected(&self) -> BTreeMap<String, String> {
        assert_eq!(self.status, 302, "{self:?}");
        let location = Url::parse(self.header("location")).unwrap();
        assert_eq!(format!("{}{}", location.origin().ascii_serialization(), location.path()), REDIRECT);
        location.query_pairs().into_owned().collect()
    }

    /// An OAuth error body.
    fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or_else(|| panic!("not an OAuth error: {self:?}"))
    }
}

async fn send(rb: reqwest::RequestBuilder) -> Seen {
    let resp = rb.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Seen { status, headers, body }
}

fn form(pairs: &[(&str, &str)]) -> String {
    let mut u = Url::parse("http://x/").unwrap();
    u.query_pairs_mut().extend_pairs(pairs);
    u.query().unwrap_or("").to_owned()
}

/// A PKCE verifier and its S256 challenge.
fn pkce() -> (String, String) {
    let verifier = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
    let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    (verifier, challenge)
}

async fn register(base: &str, metadata: Value) -> Seen {
    send(
        http()
            .post(format!("{base}/oauth/register"))
            .header("content-type", "application/json")
            .body(metadata.to_string()),
    )
    .await
}

async fn public_client(base: &str) -> String {
    let r = register(
        base,
        json!({ "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none", "client_name": "dev-oauth-tests",
                "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"] }),
    )
    .await;
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.header("cache-control"), "no-store");
    assert!(r.body.get("client_secret").is_none(), "{r:?}");
    assert_eq!(r.body["redirect_uris"], json!([REDIRECT]));
    r.body["client_id"].as_str().unwrap().to_owned()
}

async fn authorize(base: &str, pairs: &[(&str, &str)]) -> Seen {
    send(http().get(format!("{base}/oauth/authorize?{}", form(pairs)))).await
}

fn code_request<'a>(client_id: &'a str, challenge: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut pairs = vec![
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", REDIRECT),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256"),
        ("state", "st-1"),
    ];
    pairs.extend_from_slice(extra);
    pairs
}

/// Authorizes and returns the code (checking `state` and `iss`).
async fn code(base: &str, client_id: &str, challenge: &str, extra: &[(&str, &str)]) -> String {
    let seen = authorize(base, &code_request(client_id, challenge, extra)).await;
    assert_eq!(seen.header("cache-control"), "no-store");
    let p = seen.redirected();
    assert_eq!(p.get("state").map(String::as_str), Some("st-1"), "{p:?}");
    assert_eq!(p.get("iss").map(String::as_str), Some(base), "{p:?}");
    p.get("code").unwrap_or_else(|| panic!("no code: {p:?}")).clone()
}

async fn token(base: &str, pairs: &[(&str, &str)]) -> Seen {
    send(
        http()
            .post(format!("{base}/oauth/token"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(pairs)),
    )
    .await
}

async fn exchange(base: &str, client_id: &str, code: &str, verifier: &str) -> Seen {
    token(
        base,
        &[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", REDIRECT),
            ("client_id", client_id),
            ("code_verifier", verifier),
            ("resource", &format!("{base}/mcp")),
        ],
    )
    .await
}

fn call_body(tool: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": { "name": tool, "arguments": {} } })
}

/// `test_whoami` as `access_token` sees it: the 200 answer's identity, or the refusal.
async fn whoami(url: &str, access_token: &str) -> Result<Value, Seen> {
    let mut c = McpClient::new().with_token(access_token);
    c.initialize(url).await;
    let resp = c.post(url, &call_body("test_whoami")).await;
    if resp.status() != 200 {
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        return Err(Seen { status, headers, body: resp.json().await.unwrap_or(Value::Null) });
    }
    let r: Value = mcpfleet_fleetkit::response_of(resp).await;
    Ok(serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap())
}

fn run_cli(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(server_bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_signs_in_steps_up_and_refreshes() {
    let mut dev = Dev::start("flow").await;
    let printed = dev.fleet.replicas[0].stdout_line();
    let printed = printed.trim().rsplit(' ').next().unwrap().to_owned();

    // Discovery, once per spelling of the host: each names itself, so a client that connected to `localhost`
    // is never told about `127.0.0.1`.
    for base in [dev.localhost(), dev.ip()] {
        let mcp = format!("{base}/mcp");
        let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } } });
        let seen = send(
            http()
                .post(&mcp)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(init.to_string()),
        )
        .await;
        assert_eq!(seen.status, 401, "{seen:?}");
        let prm_url = format!("{base}/.well-known/oauth-protected-resource/mcp");
        let challenge = seen.header("www-authenticate");
        assert!(challenge.contains(&format!("resource_metadata=\"{prm_url}\"")), "{challenge}");
        assert!(challenge.contains("scope=\"mcp:access\""), "{challenge}");

        let prm = send(http().get(&prm_url)).await;
        assert_eq!(prm.status, 200);
        assert_eq!(prm.body["resource"], mcp.as_str(), "{prm:?}");
        assert_eq!(prm.body["authorization_servers"], json!([base.as_str()]));
        let scopes = prm.body["scopes_supported"].as_array().unwrap();
        assert!(scopes.contains(&json!("mcp:access")) && scopes.contains(&json!("fixtures:whoami")), "{prm:?}");
        // offline_access is the authorization server's business: the resource does not name it.
        assert!(!scopes.contains(&json!("offline_access")), "{prm:?}");
        let mut grantable = scopes.clone();
        grantable.push(json!("offline_access"));

        for path in ["/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"] {
            let meta = send(http().get(format!("{base}{path}"))).await;
            assert_eq!(meta.status, 200, "{path}: {meta:?}");
            assert_eq!(meta.header("access-control-allow-origin"), "*");
            let m = &meta.body;
            assert_eq!(m["issuer"], base.as_str());
            assert_eq!(m["authorization_endpoint"], format!("{base}/oauth/authorize"));
            assert_eq!(m["token_endpoint"], format!("{base}/oauth/token"));
            assert_eq!(m["registration_endpoint"], format!("{base}/oauth/register"));
            assert_eq!(m["jwks_uri"], format!("{base}/.well-known/jwks.json"));
            assert_eq!(m["code_challenge_methods_supported"], json!(["S256"]));
            assert_eq!(m["response_types_supported"], json!(["code"]));
            assert_eq!(m["grant_types_supported"], json!(["authorization_code", "refresh_token"]));
            assert_eq!(m["scopes_supported"], json!(grantable), "{m}");
            let methods = m["token_endpoint_auth_methods_supported"].as_array().unwrap();
            for method in ["none", "client_secret_post", "client_secret_basic"] {
                assert!(methods.contains(&json!(method)), "{m}");
            }
        }
    }

    // From here on the client uses `localhost`, as the SDKs would after reading the metadata.
    let base = dev.localhost();
    let mcp = format!("{base}/mcp");
    let client_id = public_client(&base).await;
    let (verifier, challenge) = pkce();
    let resource = format!("{base}/mcp");
    let c = code(&base, &client_id, &challenge, &[("resource", &resource), ("login_hint", "alice")]).await;
    let t = exchange(&base, &client_id, &c, &verifier).await;
    assert_eq!(t.status, 200, "{t:?}");
    assert_eq!(t.header("cache-control"), "no-store");
    assert_eq!(t.body["token_type"], "Bearer");
    assert_eq!(t.body["scope"], "mcp:access");
    assert_eq!(t.body["expires_in"], 3600);
    let access = t.body["access_token"].as_str().unwrap();
    // No offline_access asked, no refresh token: the client authorizes again when it needs more.
    assert!(t.body.get("refresh_token").is_none(), "{t:?}");

    // The MCP session works; the tool that needs more is not listed, and calling it asks for the step-up.
    let mut mcp_client = McpClient::new().with_token(access);
    mcp_client.initialize(&mcp).await;
    let tools = mcp_client.request(&mcp, 1, "tools/list", json!({})).await;
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(!names.is_empty() && !names.contains(&"test_whoami"), "{names:?}");
    let refused = whoami(&mcp, access).await.unwrap_err();
    assert_eq!(refused.status, 403, "{refused:?}");
    let challenge = refused.header("www-authenticate");
    assert!(challenge.contains("error=\"insufficient_scope\""), "{challenge}");
    assert!(challenge.contains("scope=\"mcp:access fixtures:whoami\""), "{challenge}");
    assert!(
        challenge.contains(&format!("resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\"")),
        "{challenge}"
    );

    // Step-up: authorize again with the challenge's scope, and (as a client that wants to refresh) offline_access.
    let (verifier, challenge) = pkce();
    let scope = "mcp:access fixtures:whoami offline_access";
    let c = code(&base, &client_id, &challenge, &[("scope", scope), ("login_hint", "alice")]).await;
    let t = exchange(&base, &client_id, &c, &verifier).await;
    assert_eq!(t.status, 200, "{t:?}");
    assert_eq!(t.body["scope"], "fixtures:whoami mcp:access offline_access");
    let who = whoami(&mcp, t.body["access_token"].as_str().unwrap()).await.unwrap();
    assert_eq!(who["sub"], "alice");
    assert_eq!(who["iss"], "urn:mcpfleet:dev");
    assert_eq!(who["client_id"], client_id.as_str());

    // Refresh: the same grant again (with a new refresh token), then narrower ones.
    let rt = t.body["refresh_token"].as_str().unwrap();
    let refresh = |scope: Option<&'static str>| {
        let mut pairs = vec![("grant_type", "refresh_token"), ("refresh_token", rt), ("client_id", client_id.as_str())];
        pairs.extend(scope.map(|s| ("scope", s)));
        pairs
    };
    let r = token(&base, &refresh(None)).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["scope"], "fixtures:whoami mcp:access offline_access");
    assert!(r.body["refresh_token"].is_string() && r.body["refresh_token"] != t.body["refresh_token"], "{r:?}");
    assert_eq!(whoami(&mcp, r.body["access_token"].as_str().unwrap()).await.unwrap()["sub"], "alice");
    let narrow = token(&base, &refresh(Some("mcp:access offline_access"))).await;
    assert_eq!(narrow.status, 200, "{narrow:?}");
    assert!(narrow.body["refresh_token"].is_string(), "{narrow:?}");
    assert_eq!(whoami(&mcp, narrow.body["access_token"].as_str().unwrap()).await.unwrap_err().status, 403);
    // Narrowed without offline_access: an access token and no new refresh token.
    let online = token(&base, &refresh(Some("mcp:access"))).await;
    assert_eq!((online.status, online.body["scope"].as_str()), (200, Some("mcp:access")), "{online:?}");
    assert!(online.body.get("refresh_token").is_none(), "{online:?}");

    // The tokens of `mcpfleet token`, and the one printed at start, work next to them.
    let key = dev.key_file.to_str().unwrap();
    let (status, out, err) =
        run_cli(&["token", "--sub", "bob", "--scope", "mcp:access fixtures:whoami", "--dev-key-file", key]);
    assert_eq!(status, 0, "{err}");
    assert_eq!(whoami(&mcp, out.trim()).await.unwrap()["sub"], "bob");
    assert_eq!(whoami(&format!("{}/mcp", dev.ip()), &printed).await.unwrap()["sub"], "dev");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sign_in_refuses_what_it_must() {
    let dev = Dev::start("refusals").await;
    let base = dev.localhost();
    let (verifier, challenge) = pkce();

    // Registration: loopback redirect URIs only.
    for uri in ["https://evil.example/callback", "http://localhost.evil.example/cb", "myapp://callback"] {
        let r = register(&base, json!({ "redirect_uris": [uri], "token_endpoint_auth_method": "none" })).await;
        assert_eq!((r.status, r.error()), (400, "invalid_redirect_uri"), "{uri}: {r:?}");
    }
    let r = register(&base, json!({ "client_name": "no redirect" })).await;
    assert_eq!((r.status, r.error()), (400, "invalid_redirect_uri"));
    let client_id = public_client(&base).await;

    // Before the redirect URI is trusted: a page, no redirect.
    let unregistered = authorize(
        &base,
        &[
            ("response_type", "code"),
            ("client_id", &client_id),
            ("redirect_uri", "http://127.0.0.1:9/elsewhere"),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
        ],
    )
    .await;
    assert_eq!((unregistered.status, unregistered.error()), (400, "invalid_request"), "{unregistered:?}");
    assert!(unregistered.headers.get("location").is_none());
    let forged =
        authorize(&base, &[("response_type", "code"), ("client_id", "mcpdev-c1.e30.AAAAAAAAAAAAAAAAAAAAAA")]).await;
    assert_eq!((forged.status, forged.error()), (400, "invalid_client"), "{forged:?}");
    // The same refusals, to a browser's navigation (which prefers HTML): a page a person can read, with what it
    // shows of the request escaped. A client that asks for JSON, or for anything, keeps the JSON.
    let page = |query: String, host: Option<&str>| {
        let mut rb = http().get(format!("{base}/oauth/authorize?{query}")).header("accept", BROWSER_ACCEPT);
        if let Some(h) = host {
            rb = rb.header("host", h);
        }
        send(rb)
    };
    let twice = form(&[("<b>x</b>", "1"), ("<b>x</b>", "2")]);
    for (seen, status, error, why) in [
        (
            page(twice.clone(), None).await,
            400,
            "invalid_request",
            "the parameter &lt;b&gt;x&lt;/b&gt; is given more than once",
        ),
        (
            page(form(&[("client_id", "mcpdev-c1.e30.AAAAAAAAAAAAAAAAAAAAAA")]), None).await,
            400,
            "invalid_client",
            "unknown client_id: register the client first (POST /oauth/register)",
        ),
        (page(String::new(), Some("evil.example")).await, 403, "invalid_request", "origin or host not allowed"),
    ] {
        assert_eq!(seen.status, status, "{seen:?}");
        assert_eq!(seen.header("content-type"), "text/html; charset=utf-8", "{seen:?}");
        assert!(seen.header("content-security-policy").starts_with("default-src 'none'"), "{seen:?}");
        assert_eq!(seen.header("cache-control"), "no-store", "{seen:?}");
        assert!(seen.headers.get_all("vary").iter().any(|v| v.to_str().unwrap().contains("Accept")), "{seen:?}");
        let html = seen.body.as_str().unwrap();
        assert!(html.starts_with("<!doctype html>"), "{html}");
        assert!(html.contains(&format!("<title>Sign-in refused: {error}</title>")), "{html}");
        assert!(html.contains(&format!("<strong>{why}</strong>")), "{html}");
        assert!(!html.contains("<b>"), "{html}");
    }
    for accept in ["application/json", "*/*"] {
        let json = send(http().get(format!("{base}/oauth/authorize?{twice}")).header("accept", accept)).await;
        assert_eq!((json.status, json.error()), (400, "invalid_request"), "{accept}: {json:?}");
        assert!(json.body["error_description"].as_str().unwrap().contains("<b>x</b>"), "{json:?}");
    }

    // After: back to the client with the error, its state and our issuer.
    let back = |seen: Seen| {
        let p = seen.redirected();
        assert_eq!(p.get("state").map(String::as_str), Some("st-1"), "{p:?}");
        assert_eq!(p.get("iss").map(String::as_str), Some(base.as_str()), "{p:?}");
        assert!(!p.contains_key("code"), "{p:?}");
        (p["error"].clone(), p.get("error_description").cloned().unwrap_or_default())
    };
    let mut plain = code_request(&client_id, &verifier, &[]);
    plain.retain(|(k, _)| *k != "code_challenge_method");
    plain.push(("code_challenge_method", "plain"));
    assert_eq!(back(authorize(&base, &plain).await).0, "invalid_request");
    let mut missing = code_request(&client_id, &challenge, &[]);
    missing.retain(|(k, _)| !k.starts_with("code_challenge"));
    assert_eq!(back(authorize(&base, &missing).await).0, "invalid_request");
    let other_port = format!("http://localhost:{}/mcp", dev.port.wrapping_add(1));
    let (e, _) = back(authorize(&base, &code_request(&client_id, &challenge, &[("resource", &other_port)])).await);
    assert_eq!(e, "invalid_target");
    let (e, d) =
        back(authorize(&base, &code_request(&client_id, &challenge, &[("scope", "mcp:access admin:all")])).await);
    assert_eq!(e, "invalid_scope");
    assert!(d.contains("admin:all"), "{d}");

    // The token endpoint.
    let c = code(&base, &client_id, &challenge, &[]).await;
    let wrong = exchange(&base, &client_id, &c, &pkce().0).await;
    assert_eq!((wrong.status, wrong.error()), (400, "invalid_grant"), "{wrong:?}");
    assert_eq!(wrong.header("cache-control"), "no-store");
    let mut tampered = c.clone().into_bytes();
    let i = tampered.len() / 2;
    tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let t = exchange(&base, &client_id, &tampered, &verifier).await;
    assert_eq!((t.status, t.error()), (400, "invalid_grant"), "{t:?}");
    // A code minted 2 minutes ago by the same key (as another replica sharing the key file would have).
    let issuer = DevIssuer::load_or_create(&dev.key_file).unwrap();
    let scopes = vec!["mcp:access".to_owned()];
    let pr = ProtectedResource {
        resource: String::new(),
        authorization_servers: vec![],
        scopes_supported: scopes.clone(),
        required_scopes: scopes,
        resource_name: "mcpfleet".to_owned(),
    };
    let twin = DevAuthServer::new(&issuer, &pr);
    let host = format!("localhost:{}", dev.port);
    let AuthorizeOutcome::Redirect(old) =
        twin.authorize(&host, &form(&code_request(&client_id, &challenge, &[])), epoch_secs() - 120)
    else {
        panic!("no redirect");
    };
    let old: BTreeMap<String, String> = Url::parse(&old).unwrap().query_pairs().into_owned().collect();
    let expired = exchange(&base, &client_id, &old["code"], &verifier).await;
    assert_eq!((expired.status, expired.error()), (400, "invalid_grant"), "{expired:?}");
    assert!(expired.body["error_description"].as_str().unwrap().contains("expired"), "{expired:?}");
    // The good verifier still works with the fresh code (stateless: a code is not consumed).
    assert_eq!(exchange(&base, &client_id, &c, &verifier).await.status, 200);
    let unknown = token(&base, &[("grant_type", "password"), ("client_id", &client_id)]).await;
    assert_eq!((unknown.status, unknown.error()), (400, "unsupported_grant_type"));

    // A confidential client (client_secret_post) with a wrong secret: 401.
    let conf =
        register(&base, json!({ "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "client_secret_post" }))
            .await;
    assert_eq!(conf.status, 201, "{conf:?}");
    assert_eq!(conf.body["client_secret_expires_at"], 0);
    let (conf_id, secret) = (conf.body["client_id"].as_str().unwrap(), conf.body["client_secret"].as_str().unwrap());
    let c = code(&base, conf_id, &challenge, &[]).await;
    let post_secret = [
        ("grant_type", "authorization_code"),
        ("code", c.as_str()),
        ("redirect_uri", REDIRECT),
        ("client_id", conf_id),
        ("client_secret", "not-the-secret"),
        ("code_verifier", verifier.as_str()),
    ];
    let bad = token(&base, &post_secret).await;
    assert_eq!((bad.status, bad.error()), (401, "invalid_client"), "{bad:?}");
    assert!(bad.header("www-authenticate").starts_with("Basic"), "{bad:?}");
    let no_secret = exchange(&base, conf_id, &c, &verifier).await;
    assert_eq!((no_secret.status, no_secret.error()), (401, "invalid_client"));
    let basic = send(
        http()
            .post(format!("{base}/oauth/token"))
            .basic_auth(conf_id, Some(secret))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[
                ("grant_type", "authorization_code"),
                ("code", &c),
                ("redirect_uri", REDIRECT),
                ("code_verifier", &verifier),
            ])),
    )
    .await;
    assert_eq!(basic.status, 200, "{basic:?}");

    // DNS rebinding: a foreign Host or Origin is refused.
    let evil_host =
        send(http().get(format!("{base}/.well-known/oauth-authorization-server")).header("host", "evil.example")).await;
    assert_eq!(evil_host.status, 403, "{evil_host:?}");
    let evil_prm =
        send(http().get(format!("{base}/.well-known/oauth-protected-resource/mcp")).header("host", "evil.example"))
            .await;
    assert_eq!(evil_prm.status, 403, "{evil_prm:?}");
    let evil_origin = send(
        http()
            .post(format!("{base}/oauth/token"))
            .header("origin", "https://evil.example")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("grant_type", "refresh_token")])),
    )
    .await;
    assert_eq!(evil_origin.status, 403, "{evil_origin:?}");
    // A browser client on a loopback page gets CORS.
    let inspector = send(
        http()
            .post(format!("{base}/oauth/register"))
            .header("origin", "http://localhost:6274")
            .header("content-type", "application/json")
            .body(json!({ "redirect_uris": ["http://localhost:6274/oauth/callback"] }).to_string()),
    )
    .await;
    assert_eq!(inspector.status, 201, "{inspector:?}");
    assert_eq!(inspector.header("access-control-allow-origin"), "http://localhost:6274");
    for path in ["/oauth/register", "/oauth/token"] {
        let preflight = |origin: &'static str| {
            http()
                .request(reqwest::Method::OPTIONS, format!("{base}{path}"))
                .header("origin", origin)
                .header("access-control-request-method", "POST")
                .header("access-control-request-headers", "content-type, authorization")
        };
        let ok = send(preflight("http://localhost:6274")).await;
        assert_eq!(ok.status, 204, "{path}: {ok:?}");
        assert_eq!(ok.header("access-control-allow-origin"), "http://localhost:6274", "{path}");
        assert_eq!(ok.header("access-control-allow-methods"), "POST", "{path}");
        assert!(ok.header("access-control-allow-headers").contains("authorization"), "{path}");
        let evil = send(preflight("https://evil.example")).await;
        assert_eq!(evil.status, 403, "{path}: {evil:?}");
        assert_eq!(evil.header("access-control-allow-origin"), "", "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_dev_mode_has_a_sign_in() {
    let none = Fleet::builder().replicas(1).arg("--auth").arg("none").start().await;
    let key = TestKey::load("ed-1", "ed", Algorithm::EdDSA);
    let issuer = Issuer::start(&[&key]).await;
    let jwt = Fleet::builder().replicas(1).jwt(&issuer).start().await;
    for base in [none.bases()[0].clone(), jwt.bases()[0].clone()] {
        for path in ["/.well-known/oauth-authorization-server", "/.well-known/openid-configuration", "/oauth/authorize"]
        {
            assert_eq!(send(http().get(format!("{base}{path}"))).await.status, 404, "{base}{path}");
        }
        for path in ["/oauth/register", "/oauth/token"] {
            assert_eq!(send(http().post(format!("{base}{path}"))).await.status, 404, "{base}{path}");
        }
    }
    // Production keeps its configured URLs, whatever the Host.
    let base = jwt.bases()[0].replace("127.0.0.1", "localhost");
    let prm = send(http().get(format!("{base}/.well-known/oauth-protected-resource/mcp"))).await;
    assert_eq!(prm.body["resource"], "https://mcp.test/mcp", "{prm:?}");
    assert_eq!(prm.body["authorization_servers"], json!([issuer.id()]));
    let seen = send(
        http()
            .post(format!("{base}/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(call_body("test_whoami").to_string()),
    )
    .await;
    assert_eq!(seen.status, 401);
    let challenge = seen.header("www-authenticate");
    assert!(
        challenge.contains("resource_metadata=\"https://mcp.test/.well-known/oauth-protected-resource/mcp\""),
        "{challenge}"
    );
}

/// With `--dpop allow`, a client that sends a `DPoP` proof with its token request gets a token bound to its key
/// (RFC 9449 §5: `cnf.jkt`, `token_type: DPoP`), which it then uses with a fresh proof per request; the same token
/// as a bearer token is refused, a proof of another key is refused, and a token request whose proof does not verify
/// gets `invalid_dpop_proof`. The metadata of both servers names the algorithms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dpop_client_gets_a_bound_token_and_uses_it_with_proofs() {
    let dev = Dev::start_with("dpop", &["--dpop", "allow"]).await;
    let base = dev.localhost();
    let meta = send(http().get(format!("{base}/.well-known/oauth-authorization-server"))).await;
    assert_eq!(meta.body["dpop_signing_alg_values_supported"][0], "ES256", "{meta:?}");
    let client_id = public_client(&base).await;
    let key = TestKey::load("ec-1", "client", Algorithm::ES256);
    let token_url = format!("{base}/oauth/token");
    let ask = |proof: String, code: String, verifier: String| {
        let pairs = [
            ("grant_type", "authorization_code".to_owned()),
            ("code", code),
            ("redirect_uri", REDIRECT.to_owned()),
            ("client_id", client_id.clone()),
            ("code_verifier", verifier),
            ("resource", format!("{base}/mcp")),
        ];
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        http()
            .post(&token_url)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("dpop", proof)
            .body(form(&pairs))
    };
    // A proof for another URL: refused, and the code is not spent by it.
    let (verifier, challenge) = pkce();
    let c = code(&base, &client_id, &challenge, &[]).await;
    let wrong =
        send(ask(key.dpop_proof("POST", "http://elsewhere/oauth/token", None).sign(), c.clone(), verifier.clone()))
            .await;
    assert_eq!((wrong.status, wrong.error()), (400, "invalid_dpop_proof"), "{wrong:?}");
    let issued = send(ask(key.dpop_proof("POST", &token_url, None).sign(), c, verifier)).await;
    assert_eq!(issued.status, 200, "{issued:?}");
    assert_eq!(issued.body["token_type"], "DPoP");
    let at = issued.body["access_token"].as_str().unwrap().to_owned();
    let claims: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(at.split('.').nth(1).unwrap()).unwrap()).unwrap();
    assert_eq!(claims["cnf"]["jkt"], key.thumbprint(), "bound to the client's key");

    // Used with a proof per request, in the dev mode's URL (the host the client used).
    let mcp = format!("{base}/mcp");
    let call = |proof: String, scheme: &str| {
        let c = mcpfleet_fleetkit::StatelessClient::new();
        let body = c.body(1, "tools/call", json!({ "name": "test_simple_text", "arguments": {} }));
        let auth = format!("{scheme} {at}");
        let mcp = mcp.clone();
        async move { c.send(&mcp, &body, &[("authorization", &auth), ("dpop", &proof)]).await }
    };
    for _ in 0..2 {
        let r = call(key.dpop_proof("POST", &mcp, Some(&at)).sign(), "DPoP").await;
        assert_eq!(r.status(), 200);
    }
    let as_bearer = call(key.dpop_proof("POST", &mcp, Some(&at)).sign(), "Bearer").await;
    assert_eq!(as_bearer.status(), 401);
    let other = TestKey::load("ed-1", "other", Algorithm::EdDSA);
    let foreign = call(other.dpop_proof("POST", &mcp, Some(&at)).sign(), "DPoP").await;
    assert_eq!(foreign.status(), 401);
    let challenge = foreign.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert!(challenge.starts_with("DPoP ") && challenge.contains("invalid_dpop_proof"), "{challenge}");
}
