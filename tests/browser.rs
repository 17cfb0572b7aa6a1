//! A browser test: the official TypeScript SDK 1.x (`@modelcontextprotocol/sdk` 1.32.2, `Client` +
//! `StreamableHTTPClientTransport`) in Debian's Chromium, on a page served from another origin than the server's
//! (`http://localhost:<page port>` against the proxy's `http://127.0.0.1:<port>/mcp`), through three replicas
//! sharing one Redis behind a round-robin proxy. Web security is on, so every request the SDK makes goes through
//! CORS as a browser app's would: preflights for its headers, and only the response headers the server exposes.
//!
//! `tests/browser/driver.mjs` bundles `tests/browser/page.mjs` and the SDK with esbuild, serves the page, drives
//! Chromium with puppeteer-core, and prints what the page reported with the console and the network as Chromium
//! saw them (preflights included). This file asserts every step; a failure prints all of it.
//!
//! - The session generation: initialize, tools/list, tools/call, progress over SSE, a stream resumed with
//!   `Last-Event-ID`, the session's DELETE. A page on an origin outside `--allowed-origins` is refused.
//! - `--auth dev`: the page signs in with the SDK's `OAuthClientProvider`, navigating to the authorization
//!   endpoint and back, steps up on a 403 `insufficient_scope` the same way, and keeps its session. A refused
//!   authorization request is shown to the person as a page.
//!
//! `tests/run-all.sh` installs Chromium (apt) and the packages (`.tools/`, npm).

#![expect(clippy::expect_used, clippy::unwrap_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::ProxiedFleet;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// The page origins the fleets allow: the page's own, `http://localhost:<page port>`. The refused page is on
/// `http://127.0.0.1:<page port>`, outside it.
const PAGE_ORIGINS: &str = "http://localhost:*";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// Runs the driver against `url` with `args` (`--run scenario@host`, `--show URL`); its report.
fn drive(url: &str, args: &[&str]) -> Value {
    let node = root().join(".tools/node_modules/.bin/node");
    assert!(
        node.exists(),
        "{} is missing: run tests/run-all.sh, which installs the browser test's tools",
        node.display()
    );
    let started = Instant::now();
    let out = Command::new(node)
        .arg(root().join("tests/browser/driver.mjs"))
        .args(["--url", url])
        .args(args)
        .current_dir(root())
        .output()
        .expect("run the browser driver");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report =
        stdout.lines().filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok()).find(|v| v["driver"] == "browser");
    let Some(report) = report else {
        panic!("the browser driver reported nothing ({:?}):\n{stdout}\n{stderr}", out.status);
    };
    let runs = report["runs"].as_array().unwrap();
    println!(
        "[browser {:.1} s] {}, SDK {}, webSecurity {}: {}",
        started.elapsed().as_secs_f64(),
        report["browser"].as_str().unwrap_or("?"),
        report["sdk"].as_str().unwrap_or("?"),
        report["webSecurity"],
        runs.iter().map(summary).collect::<Vec<_>>().join("; ")
    );
    assert!(out.status.success(), "the browser driver failed ({:?}):\n{}\n{stderr}", out.status, explain_all(&report));
    assert_eq!(report["webSecurity"], true, "the test runs with web security on");
    assert_eq!(report["sdk"], "1.32.2");
    report
}

/// `scenario (origin): step, step, …`.
fn summary(run: &Value) -> String {
    let steps: Vec<String> = steps(run)
        .iter()
        .map(|s| format!("{}{}", s["name"].as_str().unwrap_or("?"), if s["ok"] == true { "" } else { " FAILED" }))
        .collect();
    format!(
        "{} ({}): {}",
        run["scenario"].as_str().unwrap_or("?"),
        run["origin"].as_str().unwrap_or("?"),
        steps.join(", ")
    )
}

fn steps(run: &Value) -> &[Value] {
    run["steps"].as_array().map_or(&[], Vec::as_slice)
}

fn explain_all(report: &Value) -> String {
    report["runs"].as_array().into_iter().flatten().map(explain).collect::<Vec<_>>().join("\n")
}

/// Everything the browser saw in a run, for a failure: the steps, the console, and every request with its CORS
/// headers (a preflight's `Origin` and `Access-Control-Request-*`, the answer's `Access-Control-*`) and the
/// reason Chromium gave when it failed.
fn explain(run: &Value) -> String {
    let mut s = format!("run {}:\n", summary(run));
    for st in steps(run) {
        let what = if st["ok"] == true { &st["detail"] } else { &st["error"] };
        let _ = writeln!(s, "  step {:?} ok={} {}", st["name"].as_str().unwrap_or("?"), st["ok"], what);
    }
    for c in run["console"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  console.{}: {}", c["type"].as_str().unwrap_or("?"), c["text"].as_str().unwrap_or(""));
    }
    for e in run["pageErrors"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  page error: {e}");
    }
    for n in network(run) {
        let _ = write!(
            s,
            "  {} {} {} → {}",
            n["type"].as_str().unwrap_or("?"),
            n["method"].as_str().unwrap_or("?"),
            n["url"].as_str().unwrap_or("?"),
            n["status"]
        );
        for h in ["origin", "access-control-request-method", "access-control-request-headers"] {
            if let Some(v) = header(&n["requestHeaders"], h) {
                let _ = write!(s, " [{h}: {v}]");
            }
        }
        for (k, v) in n["responseHeaders"].as_object().into_iter().flatten() {
            if k.to_ascii_lowercase().starts_with("access-control-") || k.eq_ignore_ascii_case("vary") {
                let _ = write!(s, " <{k}: {}>", v.as_str().unwrap_or(""));
            }
        }
        if let Some(f) = n["failed"].as_str() {
            let _ = write!(s, " FAILED {f} {}", n["cors"]);
        }
        s.push('\n');
    }
    s
}

/// The run of `scenario` in a report.
fn run<'a>(report: &'a Value, scenario: &str) -> &'a Value {
    report["runs"].as_array().unwrap().iter().find(|r| r["scenario"] == scenario).unwrap()
}

/// Asserts that the run's steps are `expected`, in order, each passed; the details of each, by name.
fn assert_steps<'a>(run: &'a Value, expected: &[&str]) -> impl Fn(&str) -> &'a Value {
    let names: Vec<&str> = steps(run).iter().map(|s| s["name"].as_str().unwrap_or("?")).collect();
    let passed = steps(run).iter().all(|s| s["ok"] == true);
    assert!(names == expected && passed && run["ok"] == true, "expected the steps {expected:?}\n{}", explain(run));
    move |name: &str| &steps(run).iter().find(|s| s["name"] == name).unwrap()["detail"]
}

/// The requests of a run, as Chromium's network saw them (not the page's own files).
fn network(run: &Value) -> Vec<&Value> {
    run["network"].as_array().into_iter().flatten().collect()
}

/// A header of a CDP header map, by name in any case.
fn header<'a>(headers: &'a Value, name: &str) -> Option<&'a str> {
    headers.as_object()?.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).and_then(|(_, v)| v.as_str())
}

fn path_of(n: &Value) -> &str {
    let url = n["url"].as_str().unwrap_or("");
    url.find("://").and_then(|i| url[i + 3..].find('/').map(|j| &url[i + 3 + j..])).unwrap_or(url)
}

/// CORS held for a page on an allowed origin: no request failed it, and every preflight was answered 2xx and
/// allowed the page's origin (or any, for the public metadata); and the preflights covered what the SDK sent. Chromium caches a preflight's answer
/// (`Access-Control-Max-Age`) and sends another only for a method or header the cached one did not allow, so each
/// request that needed one (a method other than GET, HEAD and POST, or a header that is not CORS-safelisted) must
/// be allowed by the preflights of its URL. Returns, per `METHOD path`, the headers that needed a preflight, for
/// the log.
fn assert_cors_passed(run: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let origin = run["origin"].as_str().unwrap();
    let mut allowed: BTreeMap<&str, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
    for n in network(run) {
        assert!(n.get("cors").is_none(), "a request failed CORS:\n{}", explain(run));
        if n["method"] != "OPTIONS" {
            continue;
        }
        let status = n["status"].as_u64().unwrap_or(0);
        let rh = &n["responseHeaders"];
        assert!(
            (200..300).contains(&status)
                && [Some(origin), Some("*")].contains(&header(rh, "access-control-allow-origin")),
            "a preflight was not answered 2xx with Access-Control-Allow-Origin: {origin} (or *, the public metadata):\n{}",
            explain(run)
        );
        let list = |name| -> BTreeSet<String> {
            header(rh, name).unwrap_or("").split(',').map(|h| h.trim().to_ascii_lowercase()).collect()
        };
        let e = allowed.entry(path_of(n)).or_default();
        e.0.extend(list("access-control-allow-methods"));
        e.1.extend(list("access-control-allow-headers"));
    }
    let mut needed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in run["requests"].as_array().into_iter().flatten() {
        let (path, method) = (path_of(r), r["method"].as_str().unwrap());
        let simple_type = r["sentType"].as_str().is_none_or(|t| {
            let essence = t.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            ["application/x-www-form-urlencoded", "multipart/form-data", "text/plain"].contains(&essence.as_str())
        });
        let headers: BTreeSet<String> = r["headers"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .filter(|h| !["accept", "accept-language", "content-language"].contains(h))
            .filter(|h| *h != "content-type" || !simple_type)
            .map(str::to_owned)
            .collect();
        let simple_method = ["GET", "HEAD", "POST"].contains(&method);
        if simple_method && headers.is_empty() {
            continue;
        }
        let (methods, names) = allowed.get(path).cloned().unwrap_or_default();
        assert!(
            (simple_method || methods.contains(&method.to_ascii_lowercase()))
                && headers.iter().all(|h| names.contains(h)),
            "{method} {path} with {headers:?} was not allowed by a preflight (methods {methods:?}, headers {names:?}):\n{}",
            explain(run)
        );
        needed.entry(format!("{method} {path}")).or_default().extend(headers);
    }
    needed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_origin_runs_the_sdk_through_the_fleet_and_a_foreign_origin_is_refused() {
    let f = ProxiedFleet::start(&["--allowed-origins", PAGE_ORIGINS]).await;
    let url = f.url();
    let report = blocking(move || drive(&url, &["--run", "session@localhost", "--run", "refused@127.0.0.1"])).await;

    let session = run(&report, "session");
    let detail = assert_steps(
        session,
        &[
            "initialize",
            "tools/list",
            "tools/call",
            "progress over SSE",
            "resume with Last-Event-ID",
            "DELETE the session",
        ],
    );
    // The page read the session id: the server exposes Mcp-Session-Id.
    assert_eq!(detail("initialize")["status"], 200);
    assert_eq!(detail("initialize")["protocolVersion"], "2025-11-25");
    let exposed = detail("initialize")["exposed"].as_array().unwrap();
    assert!(exposed.contains(&Value::from("mcp-session-id")), "{}", explain(session));
    assert_eq!(detail("tools/call")["text"], "This is a simple text response for testing.");
    let progress = &detail("progress over SSE")["progress"];
    assert_eq!(
        progress,
        &serde_json::json!([
            [0, 100, "Completed step 1"],
            [50, 100, "Completed step 2"],
            [100, 100, "Completed step 3"]
        ])
    );
    assert_eq!(detail("progress over SSE")["contentType"], "text/event-stream");
    let resume = detail("resume with Last-Event-ID");
    assert!(resume["lastEventId"].as_str().is_some_and(|id| !id.is_empty()), "{resume}");
    assert!(resume["resumes"].as_array().unwrap().contains(&Value::from(200)), "{resume}");
    assert_eq!(detail("DELETE the session")["afterwards"], 404);

    // Every cross-origin request went through CORS, its method and headers allowed by a preflight: the POSTs, the
    // GETs (the resuming one with Last-Event-ID) and the DELETE.
    let needed = assert_cors_passed(session);
    println!("headers of the SDK that needed a preflight: {needed:?}");
    for (request, header) in
        [("POST /mcp", "mcp-session-id"), ("GET /mcp", "last-event-id"), ("DELETE /mcp", "mcp-session-id")]
    {
        assert!(needed.get(request).is_some_and(|h| h.contains(header)), "{request} without {header}: {needed:?}");
    }

    // A page on an origin outside --allowed-origins: the browser never hands it an answer.
    let refused = run(&report, "refused");
    let detail = assert_steps(refused, &["initialize is refused"]);
    let seen = detail("initialize is refused");
    assert_eq!(seen["error"]["name"], "TypeError", "the fetch itself must fail:\n{}", explain(refused));
    assert_eq!((&seen["status"], &seen["sessionId"]), (&Value::Null, &Value::Null), "{}", explain(refused));
    let origin = refused["origin"].as_str().unwrap();
    let net = network(refused);
    let preflight = net.iter().find(|n| n["method"] == "OPTIONS").expect("a preflight");
    assert_eq!(preflight["status"], 403, "{}", explain(refused));
    assert_ne!(
        header(&preflight["responseHeaders"], "access-control-allow-origin"),
        Some(origin),
        "{}",
        explain(refused)
    );
    assert!(
        net.iter().filter(|n| n["method"] == "POST").all(|n| n["status"].is_null() && n.get("cors").is_some()),
        "the POST went out or failed for another reason than CORS:\n{}",
        explain(refused)
    );
    let console = refused["console"].to_string();
    assert!(console.contains("blocked by CORS policy"), "{}", explain(refused));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_signs_in_to_dev_mode_steps_up_and_keeps_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("dev-key.pem");
    let key = key.to_str().unwrap();
    let f = ProxiedFleet::start(&["--auth", "dev", "--dev-key-file", key, "--allowed-origins", PAGE_ORIGINS]).await;
    let url = f.url();
    let server = url.trim_end_matches("/mcp").to_owned();
    // A request the authorization endpoint refuses before it trusts the client (a parameter given twice, whose
    // name it shows): what a person sees in the browser.
    let garbled = "%3Cscript%3Ealert(1)%3C%2Fscript%3E";
    let refused = format!("{server}/oauth/authorize?response_type=code&{garbled}=1&{garbled}=2");
    let report = blocking(move || drive(&url, &["--run", "oauth@localhost", "--show", &refused])).await;

    let oauth = run(&report, "oauth");
    let detail = assert_steps(
        oauth,
        &[
            "401 → discovery → registration",
            "callback with the code",
            "token",
            "initialize",
            "tools/list",
            "tools/call",
            "403 insufficient_scope → authorize again",
            "callback with the step-up code",
            "token with the wider scope",
            "test_whoami on the same session",
            "DELETE the session",
        ],
    );
    let first = detail("401 → discovery → registration");
    assert!(first["challenge"].as_str().unwrap().contains("resource_metadata=\""), "{first}");
    let metadata = first["metadata"].to_string();
    assert!(metadata.contains("GET /.well-known/oauth-protected-resource/mcp 200"), "{first}");
    assert!(metadata.contains("GET /.well-known/oauth-authorization-server 200"), "{first}");
    assert_eq!(first["registration"], 201);
    assert_eq!(first["authorize"], format!("{server}/oauth/authorize"));
    assert_eq!(first["scope"], "mcp:access");
    assert_eq!(first["resource"], format!("{server}/mcp"));
    assert_eq!(detail("callback with the code")["iss"], server.as_str());
    assert_eq!((&detail("token")["scope"], &detail("token")["refreshToken"]), (&"mcp:access".into(), &false.into()));
    let step_up = detail("403 insufficient_scope → authorize again");
    assert!(step_up["challenge"].as_str().unwrap().contains("error=\"insufficient_scope\""), "{step_up}");
    assert_eq!(step_up["scope"], "mcp:access fixtures:whoami");
    assert_eq!(detail("token with the wider scope")["scope"], "fixtures:whoami mcp:access");
    let who = detail("test_whoami on the same session");
    assert_eq!(who["sub"], "dev");
    assert_eq!(who["scopes"], serde_json::json!(["fixtures:whoami", "mcp:access"]));
    assert_eq!(who["sameSession"], true, "the session outlived the sign-in's navigation: {who}");
    assert_eq!(detail("DELETE the session")["afterwards"], 404);

    // The browser went to the authorization endpoint twice, as a navigation, and was sent back with a code.
    let navigations: Vec<_> = network(oauth).into_iter().filter(|n| n["type"] == "Document").collect();
    assert_eq!(navigations.len(), 2, "{}", explain(oauth));
    assert!(navigations.iter().all(|n| path_of(n) == "/oauth/authorize" && n["status"] == 302), "{}", explain(oauth));
    let needed = assert_cors_passed(oauth);
    println!("headers of the SDK that needed a preflight: {needed:?}");
    for (request, header) in [
        ("POST /oauth/register", "content-type"),
        ("GET /.well-known/oauth-protected-resource/mcp", "mcp-protocol-version"),
        ("POST /mcp", "authorization"),
        ("DELETE /mcp", "authorization"),
    ] {
        assert!(needed.get(request).is_some_and(|h| h.contains(header)), "{request} without {header}: {needed:?}");
    }

    // The refused authorization request, as the person sees it: a page that says why, the name escaped.
    let shown = &report["shown"][0];
    assert_eq!(shown["status"], 400, "{shown}");
    assert_eq!(shown["contentType"], "text/html; charset=utf-8", "{shown}");
    assert_eq!(shown["title"], "Sign-in refused: invalid_request", "{shown}");
    let text = shown["text"].as_str().unwrap();
    assert!(text.contains("the parameter <script>alert(1)</script> is given more than once"), "{shown}");
    assert_eq!(shown["dialogs"], serde_json::json!([]), "the page ran a script: {shown}");
    assert_eq!(shown["scripts"], 0, "{shown}");
}
