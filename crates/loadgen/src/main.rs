//! mcpfleet-bench: a closed-loop load generator for an MCP endpoint (Streamable HTTP, 2025-11-25 or 2026-07-28).
//!
//! It opens `--sessions` sessions (each with `initialize` and `notifications/initialized`; with `--generation
//! 2026` each "session" is only a client loop, and every request carries its `_meta` and standard headers), then
//! every session sends `tools/call` after `tools/call` for `--secs`, each request to the next of the `--url`s in
//! turn (as a round-robin balancer would). With `--op tasks-get` (2026 only) each session first queues one task (a
//! `tools/call` of a tool the server always runs as a task, the tasks extension declared), then polls it with
//! `tasks/get` instead, and cancels it at the end. The realistic work of `--op progress`, `blob`, `resume` and
//! `task` (the module `realistic`) checks what each answer is about, and one op may take several requests. It reads
//! JSON and SSE answers, and reports throughput, latency quantiles, errors by kind and 429s. Given the servers' pids it reports server CPU per call (from
//! `/proc/<pid>/stat`); given the Redis URL, Redis commands and Redis CPU per call (from `INFO commandstats` and
//! `INFO cpu`: the server's own time, over the measured window only).
//!
//! It is a client: it must not depend on any mcpfleet crate, so that it measures the server from the outside.

mod dpop;
mod growth;
mod realistic;

use clap::Parser;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The tasks extension's identifier, declared in `_meta` by `--op tasks-get`.
const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// Every session's `initialize`, byte for byte as the official TypeScript SDK (1.32.2) sends it from a client that
/// declares sampling and elicitation (recorded from `new Client({name, version}, {capabilities: {sampling: {},
/// elicitation: {}}})`; the name is the interop suite's), so that the memory a session costs is a real client's.
const INITIALIZE: &str = r#"{"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{},"elicitation":{}},"clientInfo":{"name":"mcpfleet-interop-sdk1","version":"1.0.0"}},"jsonrpc":"2.0","id":0}"#;
/// How long the tasks of `--op tasks-get` may take to be cancelled at the end, all together.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(10);

/// What every session sends in its loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Op {
    /// `tools/call` of `--tool` with `--args`.
    ToolsCall,
    /// `tasks/get` of a task the session queued first: a `tools/call` of `--tool` with `--args`, which must be a
    /// tool the server always runs as a task (e.g. the conformance fixture `slow_job` with `{"seconds":600}`).
    /// The tasks are cancelled at the end. `--generation 2026` only.
    TasksGet,
    /// `tools/call` of `bench_progress` with a `progressToken`, read over SSE: 5 progress notifications, then the
    /// answer.
    Progress,
    /// `tools/call` of `bench_blob`: 65 536 bytes of text.
    Blob,
    /// The `progress` call read to its end, then a GET with `Last-Event-ID` set to its priming event's id, read to
    /// its end: the same messages, replayed. One op is both requests. `--generation 2025` only.
    Resume,
    /// A task created (`slow_job` with `{"seconds":0}`, the tasks extension declared), then polled with
    /// `tasks/get` until `completed`, whose answer carries the result. One op is the creation and the polls
    /// (`requests_per_op` in the report). `--generation 2026` only.
    Task,
}

impl Op {
    /// The realistic work this op is, if it is.
    fn work(self) -> Option<realistic::Work> {
        match self {
            Self::ToolsCall | Self::TasksGet => None,
            Self::Progress => Some(realistic::Work::Progress),
            Self::Blob => Some(realistic::Work::Blob),
            Self::Resume => Some(realistic::Work::Resume),
            Self::Task => Some(realistic::Work::Task),
        }
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "mcpfleet-bench",
    about = "Closed-loop tools/call (or tasks/get) load against one or more MCP endpoints"
)]
struct Args {
    /// An MCP endpoint (http://host:port/mcp); repeat to spread requests round-robin.
    #[arg(long = "url", required = true)]
    urls: Vec<String>,
    /// Concurrent sessions, each a closed loop.
    #[arg(long, default_value_t = 16)]
    sessions: usize,
    /// Measured duration, in seconds.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Unmeasured warm-up, in seconds.
    #[arg(long, default_value_t = 1)]
    warmup_secs: u64,
    /// The tool to call (by default `test_simple_text`; `bench_progress` for `--op progress` and `resume`,
    /// `bench_blob` for `blob`, `slow_job` for `task`).
    #[arg(long)]
    tool: Option<String>,
    /// The tool's arguments, as JSON (by default `{}`; `{"seconds":0}` for `--op task`).
    #[arg(long)]
    args: Option<String>,
    /// A bearer token to send. Repeat it to spread the sessions over several principals: session n uses the
    /// n-th token, round-robin (e.g. `--idle-sessions` under a per-user session cap).
    #[arg(long = "token")]
    tokens: Vec<String>,
    /// Send every token as `DPoP` with a fresh proof per request, signed with this ES256 key (PKCS#8 PEM); the token
    /// must be bound to it (`mcpfleet token --dpop-jkt`).
    #[arg(long, requires = "dpop_jwk")]
    dpop_key: Option<std::path::PathBuf>,
    /// The public JWK of `--dpop-key` (a JSON file), for the proofs' header.
    #[arg(long)]
    dpop_jwk: Option<std::path::PathBuf>,
    /// The `htu` of the proofs, when not the URL requested (the server's `--resource-url`).
    #[arg(long)]
    dpop_htu: Option<String>,
    /// The `Host` header to send instead of the URL's, e.g. a Kubernetes Service's name reached through a
    /// port-forward or a proxy (the server answers only the hosts of `--allowed-hosts`).
    #[arg(long)]
    host: Option<String>,
    /// Server process ids, for CPU per call (Linux).
    #[arg(long = "pid")]
    pids: Vec<u32>,
    /// Redis URL, for Redis commands and CPU per call (INFO commandstats: commands run inside scripts count too;
    /// INFO cpu).
    /// Repeatable: on a cluster, give every master (the counts are summed).
    #[arg(long = "redis-url")]
    redis_urls: Vec<String>,
    /// A server's Prometheus endpoint (http://admin/metrics), repeatable: Redis round trips per call, from the
    /// servers' own `mcp_redis_command_duration_seconds_count`.
    #[arg(long = "metrics")]
    metrics: Vec<String>,
    /// A label for the report row.
    #[arg(long, default_value = "run")]
    label: String,
    /// Print the Markdown table header before the row.
    #[arg(long)]
    header: bool,
    /// Print the report as one line of JSON instead of a Markdown row (for scripts: `tests/cost.sh`). Its fields:
    /// `label`, `calls`, `secs`, `calls_per_sec`, `ok`, `p50_ms`, `p95_ms`, `p99_ms`, `max_ms`,
    /// `server_cpu_ms_per_call`, `redis_round_trips_per_call`, `redis_cmds_per_call`, `redis_cpu_ms_per_call` (each
    /// `null` when not measured), `requests_per_op` (HTTP requests per op: more than 1 for `--op resume` and
    /// `task`), `too_many` (429s) and `errors` (by kind). Every "per call" figure is per op.
    #[arg(long)]
    json: bool,
    /// The protocol generation: `2025` (sessions, 2025-11-25) or `2026` (stateless, 2026-07-28).
    #[arg(long, default_value = "2025", value_parser = ["2025", "2026"])]
    generation: String,
    /// Give every call a fresh idempotency key (`io.mcpfleet/idempotencyKey`), to measure what the record costs.
    #[arg(long)]
    idempotency_keys: bool,
    /// What every session sends in its loop.
    #[arg(long, value_enum, default_value_t = Op::ToolsCall)]
    op: Op,
    /// Instead of the load: open this many sessions (`initialize` and `notifications/initialized`, 16 at a
    /// time), leave them idle, and report how much Redis's `used_memory` grew per session (needs `--redis-url`;
    /// the server must allow that many sessions per user).
    #[arg(long, default_value_t = 0)]
    idle_sessions: usize,
    /// Before the load: open this many idle sessions and keep them through it (issue 32's growth curves; prints
    /// the population's figures first, see `--idle-secs`; needs `--redis-url`).
    #[arg(long, default_value_t = 0)]
    background_sessions: usize,
    /// Before the load: open this many sessions each holding its GET stream open, through the load.
    #[arg(long, default_value_t = 0)]
    background_streams: usize,
    /// With a background population: seconds at rest (no other traffic) once it is open, over which its CPU per
    /// second is measured (Redis's and the `--pid`s'), per stream.
    #[arg(long, default_value_t = 0)]
    idle_secs: u64,
}

impl Args {
    /// The DPoP prover of `--dpop-key`, if any (made once).
    fn prover(&self) -> Option<Arc<dpop::Prover>> {
        static PROVER: std::sync::OnceLock<Option<Arc<dpop::Prover>>> = std::sync::OnceLock::new();
        PROVER
            .get_or_init(|| {
                let (key, jwk) = (self.dpop_key.as_ref()?, self.dpop_jwk.as_ref()?);
                let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
                let made = read(key).and_then(|pem| {
                    let jwk = String::from_utf8(read(jwk)?).map_err(|e| e.to_string())?;
                    dpop::Prover::new(&pem, &jwk, self.dpop_htu.clone())
                });
                match made {
                    Ok(p) => Some(Arc::new(p)),
                    Err(e) => {
                        eprintln!("mcpfleet-bench: {e}");
                        std::process::exit(64);
                    }
                }
            })
            .clone()
    }

    /// The token of session `n`: the tokens given, round-robin.
    fn token(&self, n: usize) -> Option<String> {
        (!self.tokens.is_empty()).then(|| self.tokens[n % self.tokens.len()].clone())
    }
}

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("initialize failed: HTTP {0}")]
    Initialize(u16),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("bad --args: {0}")]
    Args(#[from] serde_json::Error),
    #[error("{0}")]
    Usage(&'static str),
    #[error("no task created: {0}")]
    NoTask(String),
    #[error("GET stream refused: HTTP {0}")]
    Stream(u16),
}

/// How one call ended.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Ok,
    IsError,
    RpcError(i64),
    Http(u16),
    Transport,
    /// A `tasks/get` that found its task ended (the poll no longer measures a live task), or a task of
    /// `--op task` that ended otherwise than `completed`.
    TaskEnded(String),
    /// An answer that is not what the op expects (realistic work: a count or a size).
    Wrong(String),
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ok => write!(f, "ok"),
            Self::IsError => write!(f, "isError"),
            Self::RpcError(c) => write!(f, "rpc {c}"),
            Self::Http(s) => write!(f, "http {s}"),
            Self::Transport => write!(f, "transport"),
            Self::TaskEnded(status) => write!(f, "task {status}"),
            Self::Wrong(what) => write!(f, "wrong: {what}"),
        }
    }
}

struct Session {
    http: reqwest::Client,
    urls: Arc<Vec<String>>,
    token: Option<String>,
    /// Signs a DPoP proof per request (`--dpop-key`).
    prover: Option<Arc<dpop::Prover>>,
    id: String,
    /// Speaks 2026-07-28: no session, the version and method in headers.
    stateless: bool,
}

impl Session {
    fn post(&self, url: &str, body: &Value) -> reqwest::RequestBuilder {
        let version = if self.stateless { "2026-07-28" } else { "2025-11-25" };
        let mut rb = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", version)
            .body(body.to_string());
        if self.stateless {
            rb = rb.header("mcp-method", body["method"].as_str().unwrap_or_default());
            // The tool's name, or the task id of the tasks extension's methods.
            let params = &body["params"];
            if let Some(name) = params["name"].as_str().or_else(|| params["taskId"].as_str()) {
                rb = rb.header("mcp-name", name);
            }
        }
        if !self.id.is_empty() {
            rb = rb.header("mcp-session-id", &self.id);
        }
        match (&self.token, &self.prover) {
            (Some(t), Some(p)) => {
                rb = rb.header("authorization", format!("DPoP {t}")).header("dpop", p.proof(url, t));
            }
            (Some(t), None) => rb = rb.header("authorization", format!("Bearer {t}")),
            _ => {}
        }
        rb
    }

    async fn open(
        http: reqwest::Client,
        urls: Arc<Vec<String>>,
        token: Option<String>,
        prover: Option<Arc<dpop::Prover>>,
        n: usize,
        stateless: bool,
    ) -> Result<Self, BenchError> {
        let mut s = Self { http, urls, token, prover, id: String::new(), stateless };
        if stateless {
            return Ok(s);
        }
        let url = s.urls[n % s.urls.len()].clone();
        let resp = s.post(&url, &serde_json::from_str::<Value>(INITIALIZE)?).send().await?;
        if !resp.status().is_success() {
            return Err(BenchError::Initialize(resp.status().as_u16()));
        }
        s.id = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let _ = resp.bytes().await?;
        let _ = s.post(&url, &json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).send().await?;
        Ok(s)
    }

    /// One call; its outcome.
    async fn call(&self, url: &str, body: &Value) -> Kind {
        match self.exchange(url, body).await {
            Err(k) => k,
            Ok(m) if m.get("error").is_some() => Kind::RpcError(m["error"]["code"].as_i64().unwrap_or(0)),
            Ok(m) if m["result"]["isError"] == true => Kind::IsError,
            Ok(m) if body["method"] == "tasks/get" => match m["result"]["status"].as_str() {
                Some(s @ ("completed" | "failed" | "cancelled")) => Kind::TaskEnded(s.to_owned()),
                _ => Kind::Ok,
            },
            Ok(_) => Kind::Ok,
        }
    }

    /// One request; the answer (a JSON-RPC response), or how it failed before one.
    async fn exchange(&self, url: &str, body: &Value) -> Result<Value, Kind> {
        let (sse, bytes) = receive(self.post(url, body)).await?;
        let message = if sse {
            // The answer is the last `data:` line that carries a result or an error.
            String::from_utf8_lossy(&bytes)
                .lines()
                .rev()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .find(|m| m.get("result").is_some() || m.get("error").is_some())
        } else {
            serde_json::from_slice::<Value>(&bytes).ok()
        };
        message.ok_or(Kind::Transport)
    }

    /// Queues a task (`call` is a `tools/call` of a tool the server always runs as a task); its id.
    async fn create_task(&self, url: &str, call: &Value) -> Result<String, BenchError> {
        let m = self.exchange(url, call).await.map_err(|k| BenchError::NoTask(k.to_string()))?;
        if m["result"]["resultType"] == "task"
            && let Some(id) = m["result"]["taskId"].as_str()
        {
            return Ok(id.to_owned());
        }
        let got: String = m.to_string().chars().take(200).collect();
        Err(BenchError::NoTask(format!("the answer was {got}")))
    }
}

/// Sends a request and reads its whole answer: whether it is SSE, and its bytes. A broken connection, or a status
/// other than 200, is how the request ended.
async fn receive(rb: reqwest::RequestBuilder) -> Result<(bool, bytes::Bytes), Kind> {
    let Ok(resp) = rb.send().await else { return Err(Kind::Transport) };
    let status = resp.status().as_u16();
    let sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    let Ok(bytes) = resp.bytes().await else { return Err(Kind::Transport) };
    if status != 200 {
        return Err(Kind::Http(status));
    }
    Ok((sse, bytes))
}

/// The `_meta` every 2026-07-28 request carries; with `tasks`, the tasks extension declared.
fn stateless_meta(tasks: bool) -> Value {
    let capabilities = if tasks { json!({ "extensions": { TASKS_EXTENSION: {} } }) } else { json!({}) };
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": { "name": "mcpfleet-bench", "version": "1" },
    })
}

/// A `tasks/get` or `tasks/cancel` of task `id`.
fn task_request(method: &str, id: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": { "taskId": id, "_meta": stateless_meta(true) } })
}

/// Cancels the tasks (`ids[n]` belongs to `sessions[n]`), within [`CANCEL_TIMEOUT`]; how many were not.
async fn cancel_tasks(sessions: &[Arc<Session>], ids: &[Option<String>]) -> usize {
    let cancels = sessions.iter().zip(ids).enumerate().filter_map(|(n, (s, id))| {
        let body = task_request("tasks/cancel", id.as_deref()?);
        Some(async move { s.call(&s.urls[n % s.urls.len()], &body).await == Kind::Ok })
    });
    let wanted = ids.iter().flatten().count();
    match tokio::time::timeout(CANCEL_TIMEOUT, futures::future::join_all(cancels)).await {
        Ok(done) => done.into_iter().filter(|ok| !ok).count(),
        Err(_) => wanted,
    }
}

/// utime + stime of a process, in seconds (USER_HZ is 100 on Linux).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Commands run and CPU spent so far by every node in `urls`, summed (`None` without any).
async fn redis_counters(urls: &[String]) -> Result<Option<RedisCounters>, BenchError> {
    if urls.is_empty() {
        return Ok(None);
    }
    let mut sum = RedisCounters::default();
    for url in urls {
        let client = redis::Client::open(url.as_str())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO").arg("commandstats").arg("cpu").query_async(&mut conn).await?;
        // cmdstat_evalsha:calls=12,usec=...; the INFO itself is not counted.
        sum.commands += info
            .lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
            .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
            .sum::<u64>();
        // used_cpu_sys:1.23 and used_cpu_user:4.56: the server's own CPU time, in seconds.
        sum.cpu_seconds += info
            .lines()
            .filter_map(|l| l.strip_prefix("used_cpu_sys:").or_else(|| l.strip_prefix("used_cpu_user:")))
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(Some(sum))
}

/// What `INFO` says of the Redis servers, summed.
#[derive(Clone, Copy, Debug, Default)]
struct RedisCounters {
    /// Commands run, scripts' own commands included.
    commands: u64,
    /// The servers' CPU time (user + system), in seconds.
    cpu_seconds: f64,
}

/// The sum of `mcp_redis_command_duration_seconds_count` over the given endpoints.
async fn round_trips(http: &reqwest::Client, urls: &[String]) -> Result<Option<f64>, BenchError> {
    if urls.is_empty() {
        return Ok(None);
    }
    let mut sum = 0.0;
    for u in urls {
        let text = http.get(u).send().await?.text().await?;
        sum += text
            .lines()
            .filter(|l| l.starts_with("mcp_redis_command_duration_seconds_count"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(Some(sum))
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an index"
    )]
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

async fn run(a: Args) -> Result<(), BenchError> {
    // Built together with the server, reqwest gets `rustls-no-provider` by feature unification: name ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let work = a.op.work();
    let (tool, args) = work.map_or(("test_simple_text", "{}"), realistic::Work::default_tool);
    let tool = a.tool.as_deref().unwrap_or(tool);
    let args: Value = serde_json::from_str(a.args.as_deref().unwrap_or(args))?;
    let stateless = a.generation == "2026";
    let polls = a.op == Op::TasksGet;
    if matches!(a.op, Op::TasksGet | Op::Task) && !stateless {
        return Err(BenchError::Usage("--op tasks-get and task need --generation 2026"));
    }
    if a.op == Op::Resume && stateless {
        return Err(BenchError::Usage("--op resume needs --generation 2025 (a 2026-07-28 call is not resumable)"));
    }
    if a.op != Op::ToolsCall && a.idempotency_keys {
        return Err(BenchError::Usage("--idempotency-keys applies to --op tools-call only"));
    }
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(h) = &a.host {
        let value =
            reqwest::header::HeaderValue::from_str(h).map_err(|_| BenchError::Usage("--host is not a header value"))?;
        headers.insert(reqwest::header::HOST, value);
    }
    let http = reqwest::Client::builder().pool_max_idle_per_host(a.sessions.max(1)).default_headers(headers).build()?;
    let urls = Arc::new(a.urls.clone());
    if a.idle_sessions > 0 {
        return idle_memory(&a, http, urls).await;
    }
    growth::check(&a)?;
    // Held open through the load, closed when it is dropped at the end.
    let _population = if a.background_sessions + a.background_streams > 0 || a.idle_secs > 0 {
        Some(growth::populate(&a, &http, &urls).await?)
    } else {
        None
    };
    let mut sessions = Vec::new();
    for n in 0..a.sessions {
        sessions.push(Arc::new(Session::open(http.clone(), urls.clone(), a.token(n), a.prover(), n, stateless).await?));
    }
    let mut call =
        json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": tool, "arguments": args } });
    if stateless {
        call["params"]["_meta"] = stateless_meta(matches!(a.op, Op::TasksGet | Op::Task));
    }
    // What each session sends in its loop: the call, or `tasks/get` of the task it queued (before the warm-up).
    let (bodies, task_ids) = if polls {
        let created = futures::future::join_all(
            sessions.iter().enumerate().map(|(n, s)| s.create_task(&s.urls[n % s.urls.len()], &call)),
        )
        .await;
        let ids: Vec<Option<String>> = created.iter().map(|r| r.as_ref().ok().cloned()).collect();
        if let Some(Err(e)) = created.into_iter().find(Result::is_err) {
            let _ = cancel_tasks(&sessions, &ids).await;
            return Err(e);
        }
        let bodies = ids.iter().flatten().map(|id| Arc::new(task_request("tasks/get", id))).collect();
        (bodies, ids)
    } else if let Some(work) = work {
        // The realistic work: each session's own body (its own progress token).
        ((0..sessions.len()).map(|n| Arc::new(work.body(&call, n))).collect(), Vec::new())
    } else {
        // One body, shared by every session.
        let call = Arc::new(call);
        (vec![call; sessions.len()], Vec::new())
    };
    let measured = measure(&a, &http, &sessions, bodies).await;
    // Whatever the measure did: the tasks are not left to run (a replica that stops would hand them back to the
    // queue, for the next fleet on this Redis to run).
    let not_cancelled = cancel_tasks(&sessions, &task_ids).await;
    if not_cancelled > 0 {
        eprintln!("mcpfleet-bench: {not_cancelled} of {} tasks not cancelled", task_ids.len());
    }
    measured
}

/// `--idle-sessions`: Redis memory per idle session, from `used_memory` before and after opening them.
async fn idle_memory(a: &Args, http: reqwest::Client, urls: Arc<Vec<String>>) -> Result<(), BenchError> {
    use futures::StreamExt as _;
    let [url] = a.redis_urls.as_slice() else {
        return Err(BenchError::Usage("--idle-sessions needs one --redis-url"));
    };
    let mut conn = redis::Client::open(url.as_str())?.get_multiplexed_async_connection().await?;
    let used = async |conn: &mut redis::aio::MultiplexedConnection| -> Result<u64, BenchError> {
        let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
        Ok(info.lines().find_map(|l| l.strip_prefix("used_memory:")?.trim().parse().ok()).unwrap_or(0))
    };
    let before = used(&mut conn).await?;
    let opened: Vec<Result<Session, BenchError>> = futures::stream::iter(0..a.idle_sessions)
        .map(|n| Session::open(http.clone(), urls.clone(), a.token(n), a.prover(), n, false))
        .buffer_unordered(16)
        .collect()
        .await;
    let failed = opened.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = opened.into_iter().find(Result::is_err) {
        eprintln!("mcpfleet-bench: {failed} of {} sessions not opened", a.idle_sessions);
        return Err(e);
    }
    let after = used(&mut conn).await?;
    #[expect(clippy::cast_precision_loss, reason = "byte counts")]
    let per = (after.saturating_sub(before)) as f64 / a.idle_sessions as f64;
    println!("{}: {per:.0} bytes ({} sessions; used_memory {before} -> {after})", a.label, a.idle_sessions);
    Ok(())
}

/// Runs every session's loop (`bodies[n]` is what session n sends), then prints the report row.
async fn measure(
    a: &Args,
    http: &reqwest::Client,
    sessions: &[Arc<Session>],
    bodies: Vec<Arc<Value>>,
) -> Result<(), BenchError> {
    let keyed = a.idempotency_keys;
    let work = a.op.work();
    let warmup_end = Instant::now() + Duration::from_secs(a.warmup_secs);
    let end = warmup_end + Duration::from_secs(a.secs);
    let mut tasks = Vec::new();
    for (n, (s, body)) in sessions.iter().zip(bodies).enumerate() {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut kinds: BTreeMap<Kind, u64> = BTreeMap::new();
            let mut requests = 0_u64;
            let mut i = n;
            loop {
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let url = &s.urls[i % s.urls.len()];
                i += 1;
                let (k, sent) = if let Some(work) = work {
                    let o = realistic::iteration(work, &s, url, &body).await;
                    (o.kind, o.requests)
                } else if keyed {
                    let mut b = (*body).clone();
                    b["params"]["_meta"]["io.mcpfleet/idempotencyKey"] = json!(format!("bench-{n}-{i}"));
                    (s.call(url, &b).await, 1)
                } else {
                    (s.call(url, &body).await, 1)
                };
                if now >= warmup_end {
                    lat.push(now.elapsed());
                    *kinds.entry(k).or_default() += 1;
                    requests += sent;
                }
            }
            (lat, kinds, requests)
        }));
    }
    // Counters are read at the end of the warm-up, when every session is in its loop.
    tokio::time::sleep_until(warmup_end.into()).await;
    let cpu0: Vec<Option<f64>> = a.pids.iter().map(|p| cpu_seconds(*p)).collect();
    let redis0 = redis_counters(&a.redis_urls).await?;
    let trips0 = round_trips(http, &a.metrics).await?;
    let started = Instant::now();
    let mut lat = Vec::new();
    let mut kinds: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut requests = 0_u64;
    for t in futures::future::join_all(tasks).await {
        let Ok((l, k, r)) = t else { continue };
        lat.extend(l);
        requests += r;
        for (kind, n) in k {
            *kinds.entry(kind).or_default() += n;
        }
    }
    let elapsed = started.elapsed();
    let cpu1: Vec<Option<f64>> = a.pids.iter().map(|p| cpu_seconds(*p)).collect();
    let redis1 = redis_counters(&a.redis_urls).await?;
    let trips1 = round_trips(http, &a.metrics).await?;
    lat.sort_unstable();
    let total = lat.len() as f64;
    let ok = kinds.get(&Kind::Ok).copied().unwrap_or(0) as f64;
    let ms = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e3);
    let cpu: Option<f64> = cpu0.iter().zip(&cpu1).map(|(a, b)| Some(b.as_ref()? - a.as_ref()?)).sum();
    let cpu_ms = cpu.filter(|_| total > 0.0).map(|c| c / total * 1e3);
    let (redis_cmds, redis_cpu_ms) = match (redis0, redis1) {
        (Some(a), Some(b)) if total > 0.0 => {
            (Some((b.commands - a.commands) as f64 / total), Some((b.cpu_seconds - a.cpu_seconds) / total * 1e3))
        }
        _ => (None, None),
    };
    let trips = match (trips0, trips1) {
        (Some(a), Some(b)) if total > 0.0 => Some((b - a) / total),
        _ => None,
    };
    let fixed = |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
    let (cpu_per_call, redis_per_call, redis_cpu_per_call, trips_per_call) =
        (fixed(cpu_ms, 3), fixed(redis_cmds, 2), fixed(redis_cpu_ms, 4), fixed(trips, 2));
    let errors: Vec<String> = kinds.iter().filter(|(k, _)| **k != Kind::Ok).map(|(k, n)| format!("{k}: {n}")).collect();
    let too_many = kinds.get(&Kind::Http(429)).copied().unwrap_or(0);
    if a.json {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let errors: BTreeMap<String, u64> =
            kinds.iter().filter(|(k, _)| **k != Kind::Ok).map(|(k, n)| (k.to_string(), *n)).collect();
        let row = json!({
            "label": a.label,
            "calls": total,
            "secs": elapsed.as_secs_f64(),
            "calls_per_sec": total / elapsed.as_secs_f64(),
            "ok": ok,
            "p50_ms": ms(quantile(&lat, 0.50)),
            "p95_ms": ms(quantile(&lat, 0.95)),
            "p99_ms": ms(quantile(&lat, 0.99)),
            "max_ms": ms(lat.last().copied().unwrap_or_default()),
            "server_cpu_ms_per_call": cpu_ms,
            "redis_round_trips_per_call": trips,
            "redis_cmds_per_call": redis_cmds,
            "redis_cpu_ms_per_call": redis_cpu_ms,
            "requests_per_op": if total > 0.0 { Some(requests as f64 / total) } else { None },
            "too_many": too_many,
            "errors": errors,
        });
        println!("{row}");
        return Ok(());
    }
    if a.header {
        println!(
            "| setup | calls/s | ok | p50 ms | p95 ms | p99 ms | max ms | server CPU ms/call | Redis round trips/call | Redis cmds/call | Redis CPU ms/call | 429 | errors |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
    println!(
        "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        a.label,
        total / elapsed.as_secs_f64(),
        ok,
        ms(quantile(&lat, 0.50)),
        ms(quantile(&lat, 0.95)),
        ms(quantile(&lat, 0.99)),
        ms(lat.last().copied().unwrap_or_default()),
        cpu_per_call,
        trips_per_call,
        redis_per_call,
        redis_cpu_per_call,
        too_many,
        if errors.is_empty() { "none".to_owned() } else { errors.join(", ") },
    );
    Ok(())
}

fn main() {
    let a = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mcpfleet-bench: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(a)) {
        eprintln!("mcpfleet-bench: {e}");
        std::process::exit(1);
    }
}
