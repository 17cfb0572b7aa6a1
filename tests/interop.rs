//! Interop with the official MCP clients, as a new user would run them: Python `mcp` 1.30.0 and 2.3.0, the
//! TypeScript `@modelcontextprotocol/sdk` 1.32.2 and `@modelcontextprotocol/client` 2.4.0, and the MCP
//! Inspector's CLI 2.12.0, each against three replicas sharing one Redis behind a round-robin proxy, with the
//! server's own default limits. Each client runs its workflow script (`tests/interop/python`,
//! `tests/interop/node`): lists, a call, resources, prompts, completion, sampling and elicitation answered by
//! its callbacks (through another replica), progress, resumption, a loop of 100 calls, the session DELETE; both
//! protocol generations where the client has them. Then each OAuth-capable client signs in against `--auth dev`
//! from a token-less start, and steps up to a tool's scope.
//!
//! `tests/run-all.sh` installs the clients into `.tools/` (npm; two Python venvs). Each run gets a fleet of its
//! own, so that the runs' requests, all one principal's, do not share a bucket.

#![expect(clippy::expect_used, clippy::unwrap_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::ProxiedFleet;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The interpreter of a client, installed by `tests/run-all.sh`.
fn interpreter(client: &str) -> PathBuf {
    let p = match client {
        "python1" => root().join(".tools/venv-mcp1/bin/python"),
        "python2" => root().join(".tools/venv-mcp2/bin/python"),
        _ => root().join(".tools/node_modules/.bin/node"),
    };
    assert!(p.exists(), "{} is missing: run tests/run-all.sh, which installs the interop clients", p.display());
    p
}

/// Runs `script` (under `tests/interop`) with `client`'s interpreter and `args`; the JSON lines it printed, one
/// per workflow run. Panics with the script's output unless it exits 0.
fn run(client: &str, script: &str, args: &[&str]) -> Vec<Value> {
    let started = Instant::now();
    let out = Command::new(interpreter(client))
        .arg(root().join("tests/interop").join(script))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run the interop script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} {args:?} failed ({:?}):\n{stdout}\n{stderr}", out.status);
    let runs: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .filter(|v| v.get("client").is_some())
        .collect();
    assert!(!runs.is_empty(), "{script}: no result line:\n{stdout}");
    for r in &runs {
        println!("[{script} {:.1} s] {}", started.elapsed().as_secs_f64(), summary(r));
    }
    runs
}

/// `client version generation: step, step, …` of one run's result line.
fn summary(r: &Value) -> String {
    let steps: Vec<String> = r["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().map_or_else(|| s["name"].as_str().unwrap_or("?").to_owned(), str::to_owned))
        .collect();
    format!(
        "{} {} {}: {}{}",
        r["client"].as_str().unwrap_or("?"),
        r["version"].as_str().unwrap_or("?"),
        r["generation"].as_str().unwrap_or("-"),
        steps.join(", "),
        r.get("skipped").map(|s| format!(" (skipped: {s})")).unwrap_or_default()
    )
}

/// The names of a run's steps.
fn steps(r: &Value) -> Vec<String> {
    r["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s.get("ok").is_none_or(|ok| ok == true))
        .map(|s| s.as_str().map_or_else(|| s["name"].as_str().unwrap_or("").to_owned(), str::to_owned))
        .collect()
}

/// Whether a run has, for each of `wanted`, a step whose name contains one of its spellings (the scripts name
/// their steps in their SDK's words: `tools/list` or `list tools`), ignoring case.
fn assert_steps(r: &Value, wanted: &[&[&str]]) {
    let have: Vec<String> = steps(r).iter().map(|s| s.to_lowercase()).collect();
    for w in wanted {
        assert!(have.iter().any(|s| w.iter().any(|w| s.contains(w))), "{}: no step {w:?} in {have:?}", summary(r));
    }
}

/// A fleet of `--auth dev` replicas sharing one dev key (as replicas on one machine do).
async fn dev_fleet() -> (ProxiedFleet, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("dev-key.pem");
    let key = key.to_str().unwrap();
    (ProxiedFleet::start(&["--auth", "dev", "--dev-key-file", key]).await, dir)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// The steps every workflow has, in either generation.
const SESSION_STEPS: [&[&str]; 8] = [
    &["tools/list", "list tools"],
    &["resources/read", "read resource"],
    &["prompts/get", "get prompt"],
    &["complet"],
    &["sampling"],
    &["elicitation"],
    &["progress"],
    &["100"],
];
/// The steps of the session generation only: resuming a stream, and ending the session.
const RESUME_AND_DELETE: [&[&str]; 2] = [&["resum"], &["delete", "terminate"]];

/// Runs a client's workflow script once per generation (`None`: the script's own, the session generation), each
/// on a fleet of its own, and checks its version and steps.
async fn workflows(client: &'static str, script: &'static str, version: &str, generations: &[Option<&'static str>]) {
    for &generation in generations {
        let f = ProxiedFleet::start(&[]).await;
        let mut args = vec!["--url".to_owned(), f.url()];
        if let Some(g) = generation {
            args.extend(["--generation".to_owned(), g.to_owned()]);
        }
        let runs = blocking(move || run(client, script, &args.iter().map(String::as_str).collect::<Vec<_>>())).await;
        assert_eq!(runs[0]["version"], version);
        if let Some(g) = generation {
            assert_eq!(runs[0]["generation"], g);
        }
        assert_steps(&runs[0], &SESSION_STEPS);
        if generation != Some("2026") {
            assert_steps(&runs[0], &RESUME_AND_DELETE);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_mcp_1_runs_its_workflow_through_the_fleet() {
    workflows("python1", "python/workflow.py", "1.30.0", &[None]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_mcp_2_runs_its_workflow_in_both_generations() {
    workflows("python2", "python/workflow.py", "2.3.0", &[Some("2025"), Some("2026")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_sdk_1_runs_its_workflow_through_the_fleet() {
    workflows("node", "node/workflow-sdk1.mjs", "1.32.2", &[None]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_client_2_runs_its_workflow_in_both_generations() {
    workflows("node", "node/workflow-client2.mjs", "2.4.0", &[Some("2025"), Some("2026")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_cli_lists_calls_and_reads_through_the_fleet() {
    let f = ProxiedFleet::start(&[]).await;
    let url = f.url();
    let script = root().join("tests/interop/node/inspector.mjs");
    assert!(Path::new(&script).exists());
    let runs = blocking(move || run("node", "node/inspector.mjs", &["--url", &url])).await;
    assert!(runs.iter().all(|r| r["client"] == "inspector-cli"));
    for r in &runs {
        assert_steps(r, &[&["tools/list"], &["tools/call"], &["resources/read"], &["prompts/get"]]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_oauth_client_signs_in_to_dev_mode_and_steps_up() {
    let (f, _key) = dev_fleet().await;
    let url = f.url();
    let runs = blocking(move || {
        let mut runs = Vec::new();
        runs.extend(run("python1", "python/oauth.py", &["--url", &url]));
        runs.extend(run("python2", "python/oauth.py", &["--url", &url]));
        runs.extend(run("python2", "python/oauth.py", &["--url", &url, "--generation", "2026"]));
        runs.extend(run("node", "node/oauth-sdk1.mjs", &["--url", &url]));
        runs.extend(run("node", "node/oauth-client2.mjs", &["--url", &url]));
        runs
    })
    .await;
    assert!(runs.len() >= 5, "{runs:?}");
    for r in &runs {
        // The step-up ended with the tool's answer: the caller's verified scopes include the tool's.
        let text = r.to_string();
        assert!(text.contains("fixtures:whoami") && text.contains("mcp:access"), "no step-up in {}", summary(r));
    }
}
