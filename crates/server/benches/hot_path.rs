//! The hot path, measured side by side in one run: `tools/call` on an existing session that answers with JSON,
//! from concurrent clients, against (a) one replica on the in-memory store, (b) one replica on Redis, and (c) three
//! replicas on one Redis, the client spreading its requests round-robin over them (as a load balancer would), and
//! (d, e, f) one replica on Redis with `--auth jwt`, every request carrying a bearer token signed RS256, ES256 or
//! EdDSA (verified on every request: signature and claims; the keys are cached).
//!
//! `cargo bench -p mcpfleet --bench hot_path` runs it, 10 s per setup (`-- --secs N` to change).
//! Under `cargo test` it runs one short pass per setup, so that it cannot rot. Figures are reported as ratios to
//! setup (a); the machine is shared and noisy, so only ratios from one run mean anything.

#![expect(clippy::unwrap_used, reason = "a benchmark fails loudly")]

use jsonwebtoken::Algorithm;
use mcpfleet_fleetkit::issuer::AUDIENCE;
use mcpfleet_fleetkit::{Fleet, Issuer, McpClient, RedisServer, TestKey};
use serde_json::json;
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;

struct Figures {
    requests: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn quantile(&self, q: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies[i]
    }
}

async fn drive(urls: Vec<String>, duration: Duration, token: Option<&str>) -> Figures {
    let mut client = McpClient::new();
    client.token = token.map(str::to_owned);
    client.initialize(&urls[0]).await;
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "test_simple_text", "arguments": {} } });
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (client, urls, body) = (client.clone(), urls.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = c;
            while Instant::now() < deadline {
                let t = Instant::now();
                let resp = client.post(&urls[i % urls.len()], &body).await;
                assert_eq!(resp.status(), 200);
                let _ = resp.bytes().await.unwrap();
                lat.push(t.elapsed());
                i += 1;
            }
            lat
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Figures { requests: latencies.len(), elapsed, latencies }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = args.iter().position(|a| a == "--secs").and_then(|i| args.get(i + 1)).and_then(|s| s.parse().ok());
    let secs = match (args.iter().any(|a| a == "--bench"), flag) {
        (_, Some(n)) => n,
        (true, None) => 10,
        (false, None) => 1,
    };
    let duration = Duration::from_secs(secs);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let redis = RedisServer::start();
        let memory = Fleet::builder().start().await;
        let one = Fleet::builder().redis(redis.url()).start().await;
        let three = Fleet::builder().replicas(3).redis(redis.url()).start().await;
        let keys = [
            TestKey::load("rsa-1", "rs", Algorithm::RS256),
            TestKey::load("ec-1", "es", Algorithm::ES256),
            TestKey::load("ed-1", "ed", Algorithm::EdDSA),
        ];
        let issuer = Issuer::start(&keys.iter().collect::<Vec<_>>()).await;
        let jwt = Fleet::builder()
            .redis(redis.url())
            .arg("--auth")
            .arg("jwt")
            .arg("--jwt-issuer")
            .arg(issuer.id())
            .arg("--jwt-audience")
            .arg(AUDIENCE)
            .arg("--jwks-url")
            .arg(issuer.jwks_url())
            .arg("--resource-url")
            .arg("https://mcp.test/mcp")
            .start()
            .await;
        // Valid for the whole run, and within the server's --max-token-lifetime (24 h).
        let exp = mcpfleet_core::time::epoch_secs() + 12 * 3600;
        let token = |k: &TestKey| Some(k.token(&issuer.id(), "bench").claim("exp", json!(exp)).sign());
        let setups = [
            ("1 replica, in-memory", memory.urls(), None),
            ("1 replica, Redis", one.urls(), None),
            ("3 replicas, one Redis", three.urls(), None),
            ("1 replica, Redis, JWT RS256", jwt.urls(), token(&keys[0])),
            ("1 replica, Redis, JWT ES256", jwt.urls(), token(&keys[1])),
            ("1 replica, Redis, JWT EdDSA", jwt.urls(), token(&keys[2])),
        ];
        let mut results = Vec::new();
        for (name, urls, token) in setups {
            // Warm up connections and the script cache.
            drive(urls.clone(), Duration::from_millis(200), token.as_deref()).await;
            results.push((name, drive(urls, duration, token.as_deref()).await));
        }
        let base = results[0].1.rate();
        println!("hot path: tools/call answering JSON, {CLIENTS} concurrent clients, {secs} s per setup");
        println!("| setup | requests/s | ratio to in-memory | p50 | p95 | p99 |");
        println!("|---|---|---|---|---|---|");
        for (name, f) in &results {
            println!(
                "| {name} | {:.0} | {:.2} | {:.2} ms | {:.2} ms | {:.2} ms |",
                f.rate(),
                f.rate() / base,
                f.quantile(0.50).as_secs_f64() * 1e3,
                f.quantile(0.95).as_secs_f64() * 1e3,
                f.quantile(0.99).as_secs_f64() * 1e3,
            );
            assert!(f.requests > 0, "{name}: no request completed");
        }
    });
}
