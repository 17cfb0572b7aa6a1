//! The official MCP conformance suite against the fleet. `@modelcontextprotocol/conformance` 0.1.16 (`--suite all`,
//! the 2025 generation) runs against two setups: one replica on the in-memory store, and three replicas sharing
//! one Redis behind a round-robin proxy. The newest 0.2.0 alpha (0.2.0-alpha.12, installed as `conformance-2026`)
//! runs its 2026-07-28 requirements (`--requirements 2026-07-28`) against the three replicas, with the baseline
//! `tests/conformance-2026-expected-failures.yml`, in which a warning counts as a failure too.
//! Both suites also run through three replicas on a 6-node Redis Cluster and on a Sentinel setup (one master, one
//! replica, three sentinels), where every doorbell is a sharded channel (cluster) or follows the master (Sentinel).
//! The fleets serve the skills of `tests/skills` (two to a page), so the alpha's Skills extension scenarios
//! (`sep-2640-skills-*`, which `--requirements` does not select) run one by one after it, every request on the
//! next replica. `tests/run-all.sh` installs Node 22 and both suites into `.tools/` when they are missing.

#![expect(clippy::expect_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{Fleet, RedisCluster, RedisSentinel, RedisServer, RedisTopology, RoundRobinProxy};
use std::path::{Path, PathBuf};
use std::process::Command;

fn tools_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools")
}

/// Runs the 0.1.16 suite against `url`; returns its summary lines, panicking if any check failed.
fn run_suite(url: &str, label: &str) -> String {
    run_cli("@modelcontextprotocol/conformance", &["--suite", "all"], url, label)
}

/// Runs the suite installed as `package` against `url` with `args`; returns its summary lines, panicking unless
/// it exits 0.
fn run_cli(package: &str, args: &[&str], url: &str, label: &str) -> String {
    let tools = tools_dir();
    let node = tools.join("node_modules/.bin/node");
    let cli = tools.join(format!("node_modules/{package}/dist/index.js"));
    assert!(
        node.exists() && cli.exists(),
        "conformance suite not installed in {}: run tests/run-all.sh",
        tools.display()
    );
    let out_dir = tempfile_dir(label);
    let out = Command::new(&node)
        .arg(&cli)
        .args(["server", "--url", url])
        .args(args)
        .arg("-o")
        .arg(&out_dir)
        .output()
        .expect("run conformance");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let summary: String = stdout.lines().skip_while(|l| !l.contains("=== SUMMARY ===")).collect::<Vec<_>>().join("\n");
    println!("[{label}]\n{summary}");
    assert!(
        out.status.success(),
        "conformance failed for {label}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(summary.contains("Total:"), "no summary for {label}:\n{stdout}");
    summary
}

/// Runs one scenario of the 0.2.0 alpha against `url`; panics unless every check passed, with no warning.
fn run_scenario(scenario: &str, url: &str, label: &str) -> String {
    let tools = tools_dir();
    let node = tools.join("node_modules/.bin/node");
    let cli = tools.join("node_modules/conformance-2026/dist/index.js");
    let out = Command::new(&node)
        .arg(&cli)
        .args(["server", "--url", url, "--scenario", scenario, "-o"])
        .arg(tempfile_dir(label))
        .output()
        .expect("run conformance");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let result = stdout.lines().find(|l| l.starts_with("Passed: ")).unwrap_or_default().to_owned();
    println!("[{label}] {scenario}: {result}");
    assert!(
        out.status.success() && result.contains(", 0 failed, 0 warnings"),
        "{scenario} failed for {label}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    result
}

/// The skills every fleet here serves, two to a page, so that `skills/list` has pages.
fn skills_args() -> [String; 4] {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/skills");
    ["--skills".into(), dir.to_string_lossy().into_owned(), "--skills-page-size".into(), "2".into()]
}

fn tempfile_dir(label: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mcpfleet-conformance-{label}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_one_replica_in_memory() {
    // The yardstick: `mcpfleet serve --fixtures conformance` with the server's own defaults (the testkit adds only
    // the listen and admin addresses and a drain delay of 0).
    let fleet = Fleet::builder().replicas(1).server_limits().start().await;
    let url = fleet.urls()[0].clone();
    let summary = tokio::task::spawn_blocking(move || run_suite(&url, "memory-1")).await.unwrap();
    assert!(summary.contains(", 0 failed") && summary.contains("tools-call-sampling: 1 passed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_three_replicas_on_redis_behind_round_robin() {
    let redis = RedisServer::start();
    let fleet = Fleet::builder().replicas(3).redis(redis.url()).args(skills_args()).start().await;
    let proxy = RoundRobinProxy::start(fleet.bases()).await;
    run_session(proxy.url(), "redis-3").await;
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_stateless_three_replicas_on_redis_behind_round_robin() {
    let redis = RedisServer::start();
    let fleet = Fleet::builder().replicas(3).redis(redis.url()).args(skills_args()).start().await;
    let proxy = RoundRobinProxy::start(fleet.bases()).await;
    run_stateless(proxy.url(), "2026-redis-3").await;
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_both_generations_three_replicas_on_a_redis_cluster() {
    both_generations_on(&RedisCluster::start(), "cluster-3", "2026-cluster-3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_both_generations_three_replicas_behind_sentinel() {
    both_generations_on(&RedisSentinel::start(), "sentinel-3", "2026-sentinel-3").await;
}

/// Both suites through 3 replicas on `topology`, behind the round-robin proxy.
async fn both_generations_on(
    topology: &impl RedisTopology,
    label_session: &'static str,
    label_stateless: &'static str,
) {
    let fleet = Fleet::builder().replicas(3).redis_topology(topology).args(skills_args()).start().await;
    let proxy = RoundRobinProxy::start(fleet.bases()).await;
    run_session(proxy.url(), label_session).await;
    run_stateless(proxy.url(), label_stateless).await;
    drop(proxy);
}

/// The 0.1.16 suite, `--suite all`, through a fleet at `url`: every check passes, those that cross replicas too.
async fn run_session(url: String, label: &'static str) {
    let summary = tokio::task::spawn_blocking(move || run_suite(&url, label)).await.expect("the suite ran");
    assert!(summary.contains(", 0 failed") && summary.contains("tools-call-elicitation: 1 passed"));
    assert!(summary.contains("server-sse-polling: 3 passed"));
}

/// The 0.2.0 alpha's 2026-07-28 requirements through a fleet at `url`, with the baseline.
async fn run_stateless(url: String, label: &'static str) {
    let baseline = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance-2026-expected-failures.yml");
    let baseline = baseline.to_string_lossy().into_owned();
    let suite_url = url.clone();
    let summary = tokio::task::spawn_blocking(move || {
        let args = ["--requirements", "2026-07-28", "--expected-failures", baseline.as_str()];
        run_cli("conformance-2026", &args, &suite_url, label)
    })
    .await
    .expect("the suite ran");
    // The scored scenarios the fleet must pass whole, across replicas: the stateless core, a retry with its
    // requestState landing on another replica, and list changes fanned out to listen streams on any replica.
    for scenario in [
        "server-stateless: 30 passed, 0 failed",
        "caching: 8 passed, 0 failed",
        "input-required-result-multi-round: 4 passed, 0 failed",
        "input-required-result-tampered-state: 2 passed, 0 failed",
        "input-required-result-non-tool-request: 3 passed, 0 failed",
        "tools-list: 4 passed, 0 failed",
        // Not scored for 2026-07-28 (pending in the alpha), but passing, and kept that way.
        "json-schema-2020-12: 8 passed, 0 failed",
        "http-header-validation: 14 passed, 0 failed",
        "http-custom-header-server-validation: 10 passed, 0 failed",
        // The tasks extension (io.modelcontextprotocol/tasks): run but not scored by the alpha, so each scenario's
        // own line is the proof. Every request lands on the next replica: a task created on one is polled,
        // updated and cancelled on the others, and runs on whichever replica took it from the queue.
        "tasks-lifecycle: 9 passed, 0 failed",
        "tasks-capability-negotiation: 5 passed, 0 failed",
        "tasks-wire-fields: 4 passed, 0 failed",
        "tasks-request-state-removal: 3 passed, 0 failed",
        "tasks-mrtr-input: 4 passed, 0 failed",
        "tasks-request-headers: 5 passed, 0 failed",
        "tasks-dispatch-and-envelope: 9 passed, 0 failed",
        "tasks-required-task-error: 3 passed, 0 failed",
        "tasks-mrtr-composition: 2 passed, 0 failed",
    ] {
        assert!(summary.contains(scenario), "{scenario}:\n{summary}");
    }
    // The Skills extension (io.modelcontextprotocol/skills): pages of skills/list, skills/get, the SKILL.md
    // resources and resources/directory/read, each request on the next replica.
    for (scenario, checks) in [
        ("sep-2640-skills-enumeration", "Passed: 32/32"),
        ("sep-2640-skills-directory", "Passed: 7/7"),
        ("sep-2640-skills-manifest", "Passed: 6/6"),
    ] {
        let url = url.clone();
        let result = tokio::task::spawn_blocking(move || run_scenario(scenario, &url, label)).await.expect("ran");
        assert!(result.starts_with(checks), "{scenario}: {result}");
    }
}

/// A witness, not a gate: the scenarios the conformance repository is adding in its pull requests (not in any
/// package, so CI cannot fetch them), through three replicas on one Redis behind round-robin. Assemble them first
/// with `tests/conformance-prs/assemble.sh GIT_DIR`, then run
/// `cargo test -p mcpfleet --test e2e -- --ignored conformance::pull_request_scenarios`. The results and the
/// commits are recorded in docs/TESTING.md; the project's own tests cover the same behaviour (fleet.rs,
/// stateless.rs, tools.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs .tools/conformance-prs/conformance.mjs (tests/conformance-prs/assemble.sh): see docs/TESTING.md"]
async fn pull_request_scenarios_through_three_replicas() {
    let bundle = tools_dir().join("conformance-prs/conformance.mjs");
    assert!(bundle.exists(), "run tests/conformance-prs/assemble.sh first");
    let redis = RedisServer::start();
    let fleet = Fleet::builder().replicas(3).redis(redis.url()).args(["--fixtures", "conformance-draft"]).start().await;
    let proxy = RoundRobinProxy::start(fleet.bases()).await;
    let url = proxy.url();
    let none: &[&str] = &[];
    for (scenario, extra) in
        [("cancellation", none), ("http-stream-cancellation", none), ("sep-2106-structured-content", none)]
    {
        run_pull_request_scenario(&bundle, &url, scenario, extra, &[]).await;
    }
    drop(proxy);
}

/// A witness, like [`pull_request_scenarios_through_three_replicas`]: `auth/dpop-server-validation` (PR #395)
/// through three replicas with `--dpop require` and the fleet's nonce. The scenario signs its own access tokens (no `kid`, no scope,
/// `aud` the URL it was given) with a P-256 key this test makes with jose; the replicas trust its public half
/// (`--jwks-file`). Run at the scenario's own version (2026-07-28: `server/discover`) and at 2025-11-25
/// (`initialize`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs .tools/conformance-prs/conformance.mjs (tests/conformance-prs/assemble.sh): see docs/TESTING.md"]
async fn pull_request_dpop_scenario_through_three_replicas() {
    let bundle = tools_dir().join("conformance-prs/conformance.mjs");
    assert!(bundle.exists(), "run tests/conformance-prs/assemble.sh first");
    let dir = tempfile_dir("dpop-witness");
    let (jwks, private) = (dir.join("issuer.jwks.json"), dir.join("issuer.private.jwk"));
    let jose = tools_dir().join("node_modules/jose/dist/webapi/index.js");
    let script = format!(
        "import * as jose from '{}'; import {{ writeFileSync }} from 'node:fs';\n\
         const {{ publicKey, privateKey }} = await jose.generateKeyPair('ES256', {{ extractable: true }});\n\
         writeFileSync('{}', JSON.stringify({{ keys: [{{ ...(await jose.exportJWK(publicKey)), alg: 'ES256', use: 'sig' }}] }}));\n\
         writeFileSync('{}', JSON.stringify({{ ...(await jose.exportJWK(privateKey)), alg: 'ES256' }}));",
        jose.display(),
        jwks.display(),
        private.display()
    );
    let made = Command::new(tools_dir().join("node_modules/.bin/node"))
        .args(["--input-type=module", "-e", &script])
        .status()
        .expect("node");
    assert!(made.success(), "the issuer's keys");
    let issuer = "https://conformance-dpop-issuer.example.com";
    // The proxy first: its URL is the audience and the resource the replicas need.
    let proxy = RoundRobinProxy::start(vec!["http://127.0.0.1:9".to_owned(); 3]).await;
    let url = proxy.url();
    let redis = RedisServer::start();
    let jwks_file = jwks.to_string_lossy().into_owned();
    let fleet = Fleet::builder()
        .replicas(3)
        .redis(redis.url())
        .args(["--auth", "jwt", "--jwt-issuer", issuer, "--jwt-audience", &url, "--jwks-file", &jwks_file])
        .args(["--resource-url", &url, "--required-scope", "", "--dpop", "require"])
        .args(["--dpop-nonce-key", "witness:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="])
        .start()
        .await;
    for (i, base) in fleet.bases().into_iter().enumerate() {
        proxy.replace(i, base);
    }
    let private_jwk = std::fs::read_to_string(&private).expect("private jwk");
    let none: &[&str] = &[];
    for flags in [none, &["--spec-version", "2025-11-25", "--force"][..]] {
        let env = [("DPOP_ISSUER_PRIVATE_JWK", private_jwk.as_str()), ("DPOP_ISSUER", issuer)];
        run_pull_request_scenario(&bundle, &url, "auth/dpop-server-validation", flags, &env).await;
    }
    drop(proxy);
}

/// Runs `scenario` of the pull requests' bundle against `url` with `extra` flags and `env`; panics unless every
/// check passed.
async fn run_pull_request_scenario(bundle: &Path, url: &str, scenario: &str, extra: &[&str], env: &[(&str, &str)]) {
    let mut cmd = Command::new(tools_dir().join("node_modules/.bin/node"));
    cmd.arg(bundle).args(["server", "--url", url, "--scenario", scenario]).args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run")).await.expect("ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result = stdout.lines().find(|l| l.starts_with("Passed: ")).unwrap_or_default();
    println!("[pull requests] {scenario} {extra:?}: {result}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && result.contains(" 0 failed"), "{scenario}:\n{stdout}\n{stderr}");
}
