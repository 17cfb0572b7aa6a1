//! The chart boots the binary: the Deployment that `helm/mcpfleet` renders with its production values, run as it is.
//!
//! Each test renders the chart with the Helm SDK (`tests/deploy/check.py render`, in the venv `tests/run-all.sh`
//! makes), takes the rendered container's command, args and env, and starts the real binary with exactly those:
//! only the secrets (the `secretKeyRef`s and secret volumes, filled with the test's values), the addresses of
//! what the test runs itself (its Redis Sentinel with TLS and an ACL user, its PostgreSQL with TLS required and
//! the URL naming the CA the chart mounts, nothing at the OTLP endpoint), the listen ports (`0.0.0.0:<containerPort>`
//! becomes `127.0.0.1:0`, since three replicas share one host) and the mount paths (under a temp dir, in args and
//! env; secrets and ConfigMaps written there) are replaced. The migration hook Job runs first, the same way.
//!
//! - `the_chart_boots_the_binary`: three replicas pass readiness at the rendered probes, a `tools/call` goes
//!   through the round-robin proxy with the Service's DNS name as `Host`, and one replica SIGTERMed with a call
//!   running drains within the rendered `terminationGracePeriodSeconds`, the call answered; then the audit
//!   verification CronJob's command finds every chain of the trail intact.
//! - `every_metric_the_chart_reads_is_exported`: every metric named by the rules, the dashboard, the
//!   prometheus-adapter rule and the KEDA trigger is in a live replica's `/metrics` before any traffic.
//! - `the_autoscaling_signal_follows_load`: the HPA's per-pod metric (`mcp_tool_calls_in_flight`) under the load
//!   generator at two levels and after, with what the HPA's formula asks for at each.
//! - `the_charts_policy_job_applies_its_document_to_every_pod`: with `policy.document`, the hook Job's command
//!   applies the ConfigMap's document to the fleet's Redis and the database's history; every running pod has it in
//!   force within 2 s, and its plans decide.

#![expect(clippy::expect_used, reason = "test helpers fail loudly")]

use mcpfleet_fleetkit::{
    Issuer, McpClient, PostgresServer, RedisOptions, RedisSentinel, RoundRobinProxy, TEST_STATE_KEY, TestKey,
    server_bin,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The chart's objects, rendered by the Helm SDK with these values files (later ones win) and `--set-json`s, for a
/// cluster that serves the metrics APIs.
fn render(values: &[&str], set: &[(&str, Value)]) -> Vec<Value> {
    let python = root().join(".tools/venv-deploy/bin/python");
    assert!(python.exists(), "{} is missing: run tests/deploy/install.sh (tests/run-all.sh does)", python.display());
    let mut cmd = Command::new(python);
    cmd.current_dir(root()).arg("tests/deploy/check.py").arg("render");
    // The cluster the production values are for runs prometheus-adapter (deploy/prometheus-adapter-values.yaml),
    // which serves both metrics APIs: the HPA scales on calls in flight and on the task demand, not on CPU alone.
    cmd.args(["--api-versions", "custom.metrics.k8s.io/v1beta1", "--api-versions", "external.metrics.k8s.io/v1beta1"]);
    for v in values {
        cmd.args(["-f", v]);
    }
    for (path, value) in set {
        cmd.args(["--set-json", &format!("{path}={value}")]);
    }
    let out = cmd.output().expect("run check.py render");
    assert!(out.status.success(), "render failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the rendered objects as JSON")
}

fn object<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind} rendered"))
}

/// Where the rendered Deployment mounts PostgreSQL's CA (`database.caSecret`): its mount's path and the key's file.
fn database_ca_file(objects: &[Value]) -> String {
    let spec = &object(objects, "Deployment")["spec"]["template"]["spec"];
    let mount = spec["containers"][0]["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == "database-ca"))
        .expect("the database CA's mount");
    let volume = spec["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "database-ca"))
        .expect("the database CA's volume");
    let file = volume["secret"]["items"][0]["path"].as_str().expect("the CA's file");
    format!("{}/{file}", mount["mountPath"].as_str().expect("mountPath"))
}

/// What the test runs in place of the cluster's services, and the values of the Secrets the chart references.
struct World {
    _redis: RedisSentinel,
    _pg: PostgresServer,
    key: TestKey,
    issuer: Issuer,
    dir: tempfile::TempDir,
    /// (Secret, key) → value.
    secrets: BTreeMap<(String, String), String>,
    /// Flag → the value it takes here (addresses of what the test runs).
    addresses: BTreeMap<&'static str, String>,
    objects: Vec<Value>,
}

const PRODUCTION: &str = "helm/mcpfleet/ci/production-values.yaml";
const BOOT: &str = "tests/deploy/boot-values.yaml";

impl World {
    /// Redis behind Sentinel with TLS and the ACL user the production values name, PostgreSQL, an issuer, and the
    /// chart rendered with the production values, the test's overrides and `set`.
    async fn start(set: &[(&str, Value)]) -> Self {
        let redis = RedisSentinel::start_with(&RedisOptions::default().with_tls().with_acl("mcpfleet", "s3cret-pw"));
        // TLS required, its CA in the Secret the production values name (database.caSecret).
        let pg = PostgresServer::start_tls();
        let key = TestKey::load("ed-1", "ed", jsonwebtoken::Algorithm::EdDSA);
        let issuer = Issuer::start(&[&key]).await;
        let mut sets =
            vec![("auth.issuer", json!(issuer.id())), ("auth.audience", json!(mcpfleet_fleetkit::issuer::AUDIENCE))];
        sets.extend(set.iter().cloned());
        let objects = render(&[PRODUCTION, BOOT], &sets);
        let ca = std::fs::read_to_string(redis.ca_file().expect("a TLS topology")).expect("read the CA");
        let pg_ca = std::fs::read_to_string(pg.ca_file().expect("a TLS server")).expect("read the CA");
        // The URL names the CA where the chart mounts it (the server takes a database CA in the URL, as libpq).
        let pg_url = format!("{}?sslmode=verify-full&sslrootcert={}", pg.url(), database_ca_file(&objects));
        let dir = tempfile::tempdir().expect("tempdir");
        let jwks = dir.path().join("jwks.json");
        issuer.write_jwks(&jwks);
        let secrets = [
            (("mcpfleet-redis", "password"), "s3cret-pw".to_owned()),
            (("mcpfleet-redis", "ca.crt"), ca),
            (("mcpfleet-request-state", "keys"), TEST_STATE_KEY.to_owned()),
            (("mcpfleet-database", "url"), pg_url),
            (("mcpfleet-database", "ca.crt"), pg_ca),
            (("mcpfleet-jwks", "jwks.json"), std::fs::read_to_string(&jwks).expect("jwks")),
        ]
        .into_iter()
        .map(|((s, k), v)| ((s.to_owned(), k.to_owned()), v))
        .collect();
        let addresses = [
            ("--redis-nodes", redis.sentinels().join(",")),
            ("--redis-sentinel-master", redis.master_name().to_owned()),
            // Nothing listens there: spans are dropped at once.
            ("--otlp-endpoint", "http://127.0.0.1:9".to_owned()),
        ]
        .into_iter()
        .collect();
        Self { _redis: redis, _pg: pg, key, issuer, dir, secrets, addresses, objects }
    }

    fn deployment(&self) -> &Value {
        object(&self.objects, "Deployment")
    }

    /// The rendered pod spec of `kind` as a command: the binary for the image's entrypoint, the args and env as
    /// rendered with the substitutions the module doc lists, and secret volumes written under the temp dir.
    fn command(&self, kind: &str, pod: usize) -> Command {
        self.command_of(object(&self.objects, kind), pod)
    }

    /// The rendered Job of `component` (`migrate`, `policy`) as a command.
    fn job(&self, component: &str) -> Command {
        let o = self
            .objects
            .iter()
            .find(|o| o["kind"] == "Job" && o["metadata"]["labels"]["app.kubernetes.io/component"] == component)
            .unwrap_or_else(|| panic!("no {component} Job rendered"));
        self.command_of(o, 0)
    }

    fn command_of(&self, o: &Value, pod: usize) -> Command {
        let kind = o["kind"].as_str().expect("kind");
        let name = o["metadata"]["name"].as_str().expect("name");
        let spec = if kind == "CronJob" { &o["spec"]["jobTemplate"]["spec"] } else { &o["spec"] };
        let spec = &spec["template"]["spec"];
        let c = &spec["containers"][0];
        assert_eq!(c["command"], json!(["/usr/local/bin/mcpfleet"]), "the image's binary");
        let root = self.dir.path().join(format!("{kind}-{name}-{pod}"));
        let mounts: Vec<(String, String)> = c["volumeMounts"]
            .as_array()
            .map(|m| {
                m.iter()
                    .map(|m| {
                        (
                            m["name"].as_str().expect("name").to_owned(),
                            m["mountPath"].as_str().expect("path").to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (name, path) in &mounts {
            let dir = root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).expect("mount dir");
            let volume = spec["volumes"]
                .as_array()
                .expect("volumes")
                .iter()
                .find(|v| v["name"] == name.as_str())
                .expect("volume");
            if let Some(secret) = volume.get("secret") {
                let name = secret["secretName"].as_str().expect("secretName");
                for item in secret["items"].as_array().expect("items") {
                    let key = item["key"].as_str().expect("key");
                    std::fs::write(dir.join(item["path"].as_str().expect("path")), self.secret(name, key))
                        .expect("write");
                }
            }
            if let Some(cm) = volume.get("configMap") {
                let name = cm["name"].as_str().expect("configMap name");
                let map = self
                    .objects
                    .iter()
                    .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == name)
                    .unwrap_or_else(|| panic!("the chart mounts ConfigMap {name}, which it does not render"));
                for (file, text) in map["data"].as_object().expect("data") {
                    std::fs::write(dir.join(file), text.as_str().expect("text")).expect("write");
                }
            }
        }
        let args: Vec<String> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| {
                let a = a.as_str().expect("an arg is a string");
                let Some((flag, value)) = a.split_once('=') else {
                    // A path under a mount, as a positional argument (the policy Job's document).
                    return match mounts.iter().find(|(_, p)| a.starts_with(p.as_str())) {
                        Some(_) => root.join(a.trim_start_matches('/')).display().to_string(),
                        None => a.to_owned(),
                    };
                };
                if let Some(v) = self.addresses.get(flag) {
                    return format!("{flag}={v}");
                }
                if (flag == "--listen" || flag == "--admin-listen") && value.starts_with("0.0.0.0:") {
                    return format!("{flag}=127.0.0.1:0");
                }
                match mounts.iter().find(|(_, p)| value.starts_with(p.as_str())) {
                    Some(_) => format!("{flag}={}", root.join(value.trim_start_matches('/')).display()),
                    None => a.to_owned(),
                }
            })
            .collect();
        let mut cmd = Command::new(server_bin());
        cmd.args(&args).env_clear();
        for e in c["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().expect("env name");
            let mut value = match (&e["value"], &e["valueFrom"]["secretKeyRef"]) {
                (Value::String(v), _) => v.clone(),
                (_, Value::Object(r)) => {
                    self.secret(r["name"].as_str().expect("name"), r["key"].as_str().expect("key"))
                }
                _ => panic!("env {name}: neither a value nor a secretKeyRef"),
            };
            // A file of a mount named in a value (the database URL's sslrootcert) is under the pod's directory.
            for (_, path) in &mounts {
                let under = root.join(path.trim_start_matches('/'));
                value = value.replace(&format!("{path}/"), &format!("{}/", under.display()));
            }
            cmd.env(name, value);
        }
        cmd
    }

    fn secret(&self, name: &str, key: &str) -> String {
        self.secrets
            .get(&(name.to_owned(), key.to_owned()))
            .unwrap_or_else(|| panic!("the chart references Secret {name} key {key}, which the test does not have"))
            .clone()
    }

    /// A token as the production values want it: the issuer's, with the tenant claim.
    fn token(&self, sub: &str) -> String {
        self.key.token(&self.issuer.id(), sub).claim("org_id", json!("acme")).sign()
    }

    /// The Host a client in the cluster sends: the Service's DNS name.
    fn service_host(&self) -> String {
        let svc = object(&self.objects, "Service");
        format!(
            "{}.{}.svc.cluster.local",
            svc["metadata"]["name"].as_str().expect("name"),
            svc["metadata"]["namespace"].as_str().expect("ns")
        )
    }
}

/// A running pod: the process, and its listeners by the names of the rendered container ports.
struct Pod {
    child: Child,
    ports: BTreeMap<String, String>,
}

impl Pod {
    /// Starts the pod's process; its log (stderr) goes to `log`.
    fn start(mut cmd: Command, log: &Path) -> Self {
        let log = std::fs::File::create(log).expect("create the pod's log");
        let mut child = cmd.stdout(Stdio::piped()).stderr(log).spawn().expect("spawn mcpfleet");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = |prefix: &str| {
            let mut l = String::new();
            stdout.read_line(&mut l).expect("read stdout");
            l.trim().strip_prefix(prefix).unwrap_or_else(|| panic!("expected {prefix:?}, got {l:?}")).to_owned()
        };
        let mcp = line("listening on ");
        let admin = line("admin listening on ");
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        Self { child, ports: [("mcp".to_owned(), mcp), ("admin".to_owned(), admin)].into() }
    }

    /// `http://<address>` of the rendered probe's port (a container port's name).
    fn probe_url(&self, probe: &Value) -> String {
        let port = probe["httpGet"]["port"].as_str().expect("a named port");
        format!("http://{}{}", self.ports[port], probe["httpGet"]["path"].as_str().expect("path"))
    }

    fn base(&self) -> String {
        format!("http://{}", self.ports["mcp"])
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `tools/call` answered with content and without `isError`.
fn answered(v: &Value) -> bool {
    v["result"]["content"].is_array() && v["result"]["isError"] != json!(true)
}

async fn status(url: &str) -> Option<u16> {
    reqwest::Client::new().get(url).timeout(Duration::from_secs(2)).send().await.ok().map(|r| r.status().as_u16())
}

/// Runs the migration hook Job's command to its end, then starts `n` pods and waits, as the kubelet would, until
/// each passes its startup probe and then its readiness probe.
async fn boot(world: &World, n: usize) -> Vec<Pod> {
    let job = world.job("migrate").output().expect("run the migration Job");
    assert!(job.status.success(), "the migration hook Job failed: {}", String::from_utf8_lossy(&job.stderr));
    let c = &world.deployment()["spec"]["template"]["spec"]["containers"][0];
    let pods: Vec<Pod> = (0..n)
        .map(|i| Pod::start(world.command("Deployment", i), &world.dir.path().join(format!("pod-{i}.log"))))
        .collect();
    for pod in &pods {
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
            let p = &c[probe];
            let budget =
                p["periodSeconds"].as_u64().expect("period") * p["failureThreshold"].as_u64().expect("threshold");
            let url = pod.probe_url(p);
            let deadline = Instant::now() + Duration::from_secs(budget.max(5));
            while status(&url).await != Some(200) {
                assert!(Instant::now() < deadline, "{probe} at {url} did not pass within {budget} s");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    pods
}

/// A 2025-generation client that talks to the fleet as a pod in the cluster would: with the Service's name.
fn client(world: &World, sub: &str) -> McpClient {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::HOST, world.service_host().parse().expect("a header value"));
    let mut c = McpClient::new().with_token(&world.token(sub));
    c.http = reqwest::Client::builder().no_proxy().default_headers(headers).build().expect("client");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chart_boots_the_binary() {
    let world = World::start(&[]).await;
    let mut pods = boot(&world, 3).await;
    let spec = &world.deployment()["spec"]["template"]["spec"];
    let grace = spec["terminationGracePeriodSeconds"].as_u64().expect("terminationGracePeriodSeconds");

    // A call through the round-robin proxy, as through the Service.
    let proxy = RoundRobinProxy::start(pods.iter().map(Pod::base).collect()).await;
    let mut c = client(&world, "alice");
    c.initialize(&proxy.url()).await;
    for id in 1..=3 {
        let v = c.request(&proxy.url(), id, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
        assert!(answered(&v), "tools/call through the proxy: {v}");
    }

    // SIGTERM pod 0 with a call running on it: readiness turns 503 at once, it keeps serving through the drain
    // delay, the running call is answered, and the process exits 0 within the rendered grace.
    let direct = format!("{}/mcp", pods[0].base());
    let mut slow = client(&world, "bob");
    slow.initialize(&direct).await;
    let running = {
        let slow = slow.clone();
        let url = direct.clone();
        tokio::spawn(async move {
            slow.request(
                &url,
                7,
                "tools/call",
                json!({ "name": "slow_compute", "arguments": { "seconds": 3, "label": "drain" } }),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    Command::new("kill").args(["-TERM", &pods[0].child.id().to_string()]).status().expect("kill -TERM");
    let ready = pods[0].probe_url(&spec["containers"][0]["readinessProbe"]);
    mcpfleet_fleetkit::eventually(2, "readiness to fail once draining", || async { status(&ready).await == Some(503) })
        .await;
    let v = slow.request(&direct, 8, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await;
    assert!(answered(&v), "a call during the drain delay: {v}");
    let v = running.await.expect("the running call");
    assert!(answered(&v), "the call running at SIGTERM: {v}");
    let code = loop {
        if let Some(s) = pods[0].child.try_wait().expect("wait") {
            break s.code();
        }
        assert!(started.elapsed() < Duration::from_secs(grace), "pod 0 did not exit within its grace of {grace} s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, Some(0), "a drained pod exits 0");
    // The audit verification CronJob's command, on the trail the calls above wrote: every chain intact.
    let verify = world.command("CronJob", 0).output().expect("run the audit verification CronJob");
    let report = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "the audit CronJob failed: {report}{}", String::from_utf8_lossy(&verify.stderr));
    println!("deploy: the audit CronJob: {}", report.lines().last().unwrap_or_default());
    println!(
        "deploy: SIGTERM to exit {:.1} s (drain delay {}, grace {grace} s); readiness 503 at once; the running call answered",
        started.elapsed().as_secs_f64(),
        flag_secs(spec, "--drain-delay"),
    );
    // The other two still serve through the proxy's targets.
    let v = c
        .request(
            &format!("{}/mcp", pods[1].base()),
            9,
            "tools/call",
            json!({ "name": "test_simple_text", "arguments": {} }),
        )
        .await;
    assert!(answered(&v));
}

/// A duration flag's whole seconds (`--drain-delay=10s` → 10).
fn flag_secs(spec: &Value, flag: &str) -> u64 {
    spec["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix(&format!("{flag}=")))
        .and_then(|v| v.strip_suffix('s'))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{flag} in whole seconds"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_charts_policy_job_applies_its_document_to_every_pod() {
    let document = "plans:\n  free:\n    quotas:\n      test_simple_text: { limit: 2, window: 60s }\n  pro: {}\n\
                    assign:\n  - when: 'principal.claims.plan == \"pro\"'\n    plan: pro\ndefault: free\n";
    let world = World::start(&[("policy.document", json!(document))]).await;
    let pods = boot(&world, 3).await;
    let job = world.job("policy").output().expect("run the policy Job");
    let out = String::from_utf8_lossy(&job.stdout).into_owned();
    assert!(job.status.success(), "the policy hook Job failed: {out}{}", String::from_utf8_lossy(&job.stderr));
    assert!(out.contains("applied as version 1 by helm: first version: plans free, pro"), "{out}");
    let applied = Instant::now();
    for pod in &pods {
        let admin = format!("http://{}", pod.ports["admin"]);
        mcpfleet_fleetkit::eventually(2, "every pod has the chart's policy in force", || async {
            mcpfleet_fleetkit::scrape(&admin).await.get("mcp_policy_version") == Some(&1.0)
        })
        .await;
    }
    println!(
        "deploy: the chart's policy in force on 3 pods {:.0} ms after its Job",
        applied.elapsed().as_secs_f64() * 1e3
    );
    let proxy = RoundRobinProxy::start(pods.iter().map(Pod::base).collect()).await;
    let mut c = client(&world, "alice");
    c.initialize(&proxy.url()).await;
    let calls: Vec<Value> = {
        let mut v = Vec::new();
        for id in 1..=3 {
            v.push(
                c.request(&proxy.url(), id, "tools/call", json!({ "name": "test_simple_text", "arguments": {} })).await,
            );
        }
        v
    };
    assert!(answered(&calls[0]) && answered(&calls[1]), "{calls:?}");
    assert_eq!(calls[2]["result"]["isError"], json!(true), "the free plan's 2 a minute: {}", calls[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_metric_the_chart_reads_is_exported() {
    let out = Command::new(root().join(".tools/venv-deploy/bin/python"))
        .current_dir(root())
        .args(["tests/deploy/check.py", "promql"])
        .output()
        .expect("run check.py promql");
    assert!(out.status.success(), "check.py promql: {}", String::from_utf8_lossy(&out.stderr));
    let exprs: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    let world = World::start(&[]).await;
    let pods = boot(&world, 1).await;
    let text = reqwest::get(format!("http://{}/metrics", pods[0].ports["admin"]))
        .await
        .expect("GET")
        .text()
        .await
        .expect("body");
    let exported: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().expect("a name"))
        .collect();
    let mut missing = Vec::new();
    let mut named = std::collections::BTreeSet::new();
    for e in &exprs {
        for m in e["metrics"].as_array().expect("metrics") {
            let m = m.as_str().expect("a name");
            named.insert(m.to_owned());
            if !exported.contains(m) {
                missing.push(format!("{m} (in {}: {})", e["where"], e["expr"]));
            }
        }
    }
    assert!(missing.is_empty(), "named by the chart but not in a live replica's /metrics:\n{}", missing.join("\n"));
    println!(
        "deploy: {} expressions name {} metrics; every one is in a fresh replica's /metrics",
        exprs.len(),
        named.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_autoscaling_signal_follows_load() {
    // A per-pod target of 2 (production's is 8), so that two levels a laptop can drive sit on either side of it.
    let world = World::start(&[("autoscaling.inFlightPerPod", json!(2))]).await;
    let pods = boot(&world, 3).await;
    let hpa = object(&world.objects, "HorizontalPodAutoscaler");
    let target: f64 = hpa["spec"]["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .find(|m| m["pods"]["metric"]["name"] == "mcp_tool_calls_in_flight")
        .and_then(|m| m["pods"]["target"]["averageValue"].as_str())
        .and_then(|v| v.parse().ok())
        .expect("the HPA's per-pod target of mcp_tool_calls_in_flight");
    let (min, max) =
        (hpa["spec"]["minReplicas"].as_f64().expect("min"), hpa["spec"]["maxReplicas"].as_f64().expect("max"));
    let admins: Vec<String> = pods.iter().map(|p| format!("http://{}", p.ports["admin"])).collect();
    let proxy = RoundRobinProxy::start(pods.iter().map(Pod::base).collect()).await;
    // The signal as the HPA reads it: the metric's average over the pods, sampled while the load runs.
    let average = || async {
        let mut sum = 0.0;
        for a in &admins {
            sum += mcpfleet_fleetkit::scrape(a).await.get("mcp_tool_calls_in_flight").copied().expect("the gauge");
        }
        sum / admins.len() as f64
    };
    let bench = server_bin().with_file_name("mcpfleet-bench");
    assert!(
        bench.exists(),
        "{} is missing: cargo build -p mcpfleet-loadgen (cargo test --workspace builds it)",
        bench.display()
    );
    let mut rows = Vec::new();
    for sessions in [3usize, 12] {
        let load = Command::new(&bench)
            .args(["--url", &proxy.url(), "--sessions", &sessions.to_string(), "--secs", "6", "--warmup-secs", "1"])
            .args(["--tool", "slow_compute", "--args", r#"{"seconds":1,"label":"load"}"#])
            .args(["--token", &world.token("loadgen"), "--host", &world.service_host()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mcpfleet-bench");
        // Sample through the measured seconds, after the sessions opened and the warm-up.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut samples = Vec::new();
        for _ in 0..10 {
            samples.push(average().await);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let out = tokio::task::spawn_blocking(move || load.wait_with_output()).await.expect("join").expect("bench");
        assert!(out.status.success(), "mcpfleet-bench: {}", String::from_utf8_lossy(&out.stderr));
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        let desired = (pods.len() as f64 * mean / target).ceil().clamp(min, max);
        rows.push((sessions, mean, desired));
        println!(
            "deploy: {sessions} sessions: mean in flight per pod {mean:.2} (target {target}): the HPA asks for ceil(3 × {mean:.2} / {target}) = {desired} replicas (min {min}, max {max})"
        );
        println!("{}", String::from_utf8_lossy(&out.stdout).trim());
    }
    // After the load the signal falls back to 0.
    mcpfleet_fleetkit::eventually(10, "in flight to fall to 0 after the load", || async { average().await == 0.0 })
        .await;
    let (low, high) = (rows[0], rows[1]);
    // Closed loops of one-second calls: the sessions are the calls in flight, spread over 3 pods.
    assert!((0.6..=1.2).contains(&low.1), "3 sessions should keep about 1 call per pod in flight, saw {}", low.1);
    assert!(high.1 > 3.0 * low.1 && high.1 <= 4.2, "12 sessions should keep about 4 per pod in flight, saw {}", high.1);
    assert!(low.2 <= min, "at the low level the HPA stays at its minimum, it asks for {}", low.2);
    assert!(high.2 > min, "at the high level the HPA scales out, it asks for {}", high.2);
}
