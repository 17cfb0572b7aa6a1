//! Policy as data (docs/POLICY.md) in the server: where `serve` takes its document from ([`follow`]: the store's
//! version, followed by every replica; `--policy FILE`, read again when it changes; or none, the flags), and the
//! commands around a document. `check` reads a document offline and says whether it would be accepted, as a CI
//! step before it is applied; `apply` checks it, stores it as the fleet's next version and announces it; `diff`
//! says what applying it would change; `explain` says which plan a principal gets from it, with what limits, and
//! whether a call would go through.

use crate::ServerError;
use crate::config::{Apply, Config, EXIT_CONFIG, EXIT_UNAVAILABLE, Explain, PolicyRequest, Rollback};
use mcpfleet_db::{Database, DbSettings};
use mcpfleet_limits::Limiter;
use mcpfleet_policy::{CallVerdict, MAX_BYTES, Plan, Policy, Subject, ToolView};
use mcpfleet_state::{NewPolicy, PolicyStore as _, PutPolicy, RedisStore, Store};
use mcpfleet_transport::policy::{Policies, watch};
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Starts following the policy `cfg` names: with Redis, the store's version (every replica the same; the replica
/// is not ready until it has read it); with `--policy FILE`, that file, read now (a document it refuses exits 64)
/// and again whenever it changes; else the flags alone.
///
/// # Errors
/// `--policy FILE` unreadable, or refused.
pub(crate) fn follow(
    cfg: &Config,
    store: &Arc<dyn Store>,
    policies: &Arc<Policies>,
    limits: &Arc<Limiter>,
    streams: &Arc<mcpfleet_transport::OpenStreams>,
    shutdown: &CancellationToken,
) -> Result<(), ServerError> {
    let poll = cfg.policy.poll;
    match (&cfg.redis, &cfg.policy.file) {
        (Some(_), _) => {
            tokio::spawn(watch::follow(watch::Follower {
                store: store.clone(),
                policies: policies.clone(),
                limits: limits.clone(),
                streams: streams.clone(),
                poll,
                shutdown: shutdown.clone(),
            }));
        }
        (None, Some(path)) => {
            let text = read(path).map_err(|e| ServerError::Config(format!("--policy {}: {e}", path.display())))?;
            let policy =
                Policy::parse(&text).map_err(|e| ServerError::Config(format!("--policy {}: {e}", path.display())))?;
            policies.install(1, policy);
            let file = FileFollower {
                path: path.clone(),
                seen: stamp(path),
                policies: policies.clone(),
                limits: limits.clone(),
            };
            tokio::spawn(file.run(poll, shutdown.clone()));
        }
        (None, None) => policies.loaded_without(),
    }
    Ok(())
}

/// `--policy FILE`, read again when its modification time or size changes; a version it refuses is counted and
/// logged, and the last good one stays in force.
struct FileFollower {
    path: PathBuf,
    seen: Option<(SystemTime, u64)>,
    policies: Arc<Policies>,
    limits: Arc<Limiter>,
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl FileFollower {
    async fn run(mut self, poll: Duration, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(poll) => {}
            }
            let now = stamp(&self.path);
            if now == self.seen {
                continue;
            }
            self.seen = now;
            let shown = self.path.display();
            let metrics = self.policies.metrics();
            match read(&self.path).map_err(|e| e.to_string()).and_then(|t| Policy::parse(&t).map_err(|e| e.to_string()))
            {
                Ok(policy) => {
                    let version = self.policies.current().version + 1;
                    self.policies.install(version, policy);
                    self.limits.clear_refusals();
                    #[expect(clippy::cast_possible_wrap, reason = "a version number far below i64::MAX")]
                    metrics.latest.set(version as i64);
                    tracing::info!(file = %shown, version, "policy file read again: version in force");
                }
                Err(e) => {
                    metrics.load_failures.with_label_values(&["invalid"]).inc();
                    tracing::error!(file = %shown, error = %e, "policy file refused; keeping the version in force");
                }
            }
        }
    }
}

/// Runs a `policy` command; its exit code.
pub(crate) fn command(name: &str, req: &PolicyRequest) -> i32 {
    match req {
        PolicyRequest::Apply(a) => with_runtime(name, apply(name, a, true)),
        PolicyRequest::Diff(a) => with_runtime(name, apply(name, a, false)),
        PolicyRequest::History(settings) => with_runtime(name, history(name, settings)),
        PolicyRequest::Rollback(r) => with_runtime(name, rollback(name, r)),
        PolicyRequest::Revoke(r) => with_runtime(name, crate::revoke::run(name, r)),
        PolicyRequest::Explain(e) => with_runtime(name, explain_command(name, e)),
        PolicyRequest::Check(path) => {
            let shown = path.display();
            match load(name, path) {
                Some(p) => {
                    let plans: Vec<&str> = p.plans.keys().map(String::as_str).collect();
                    println!(
                        "policy {shown}: accepted: {} plans ({}), {} assignment rules, default {}",
                        plans.len(),
                        plans.join(", "),
                        p.assign.len(),
                        p.default
                    );
                    0
                }
                None => EXIT_CONFIG,
            }
        }
    }
}

fn with_runtime(name: &str, f: impl std::future::Future<Output = i32>) -> i32 {
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(f),
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            1
        }
    }
}

/// `policy apply` (`store`) and `policy diff`: checks the document, compares it with the version in force, and
/// stores and announces it as the next version. Exit 64 for a document refused, 69 for a store that does not
/// answer, 75 when another version was applied meanwhile (run it again).
async fn apply(name: &str, a: &Apply, store: bool) -> i32 {
    let shown = a.file.display();
    let Some((text, new)) = load_text(name, &a.file) else { return EXIT_CONFIG };
    let (redis, current, old) = match in_force(name, &a.redis, &format!("policy {shown}")).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let expected = current.as_ref().map_or(0, |c| c.version);
    let changes = new.changes(old.as_ref());
    if !store {
        match &current {
            Some(c) => println!("against version {} (applied by {}):", c.version, c.by),
            None => println!("against no version (the flags):"),
        }
        if changes.is_empty() {
            println!("  no change");
        }
        for c in &changes {
            println!("  {c}");
        }
        return 0;
    }
    let summary = new.summary(old.as_ref());
    let change = Change { text: &text, by: &a.by, summary: &summary, expected, rollback_of: None };
    match put(name, &redis, a.database.as_ref(), &change).await {
        Ok(v) => {
            println!("policy {shown}: applied as version {v} by {}: {summary}", a.by);
            0
        }
        Err(code) => code,
    }
}

/// The store, the version in force there, and that version checked by this build (`None` if none, or refused).
/// Exit 69, the reason printed after `what`, when the store does not answer.
async fn in_force(
    name: &str,
    redis: &mcpfleet_state::RedisConfig,
    what: &str,
) -> Result<(RedisStore, Option<mcpfleet_state::StoredPolicy>, Option<Policy>), i32> {
    let store = RedisStore::connect(redis.clone()).await.map_err(|e| {
        eprintln!("{name}: {what}: the store does not answer: {e}");
        EXIT_UNAVAILABLE
    })?;
    let current = store.policy().await.map_err(|e| {
        eprintln!("{name}: {what}: cannot read the version in force: {e}");
        EXIT_UNAVAILABLE
    })?;
    let checked = current.as_ref().and_then(|c| Policy::parse(&c.text).ok());
    Ok((store, current, checked))
}

/// A version to put in force.
struct Change<'a> {
    text: &'a str,
    by: &'a str,
    summary: &'a str,
    /// The version in force it was compared against.
    expected: u64,
    rollback_of: Option<i64>,
}

/// Why the store did not take a version.
enum NotStored {
    Moved(u64),
    Store(mcpfleet_state::StateError),
}

/// Puts `c` in force: in the store, and with a database in its history and the audit trail too, in one
/// transaction around the store write. Returns the version, or the exit code once the reason is printed.
async fn put(name: &str, redis: &RedisStore, db: Option<&DbSettings>, c: &Change<'_>) -> Result<u64, i32> {
    let store = |version: Option<u64>| async move {
        let new = NewPolicy { expected: c.expected, version, text: c.text, by: c.by, summary: c.summary };
        match redis.put_policy(&new).await {
            Ok(PutPolicy::Stored(v)) => Ok(v),
            Ok(PutPolicy::Moved(v)) => Err(NotStored::Moved(v)),
            Err(e) => Err(NotStored::Store(e)),
        }
    };
    let stored = match db {
        None => store(None).await,
        Some(settings) => {
            let db = open_db(name, settings).await?;
            let new = mcpfleet_db::policy::NewVersion {
                document: c.text,
                by: c.by,
                summary: c.summary,
                rollback_of: c.rollback_of,
                in_force: i64::try_from(c.expected).unwrap_or(i64::MAX),
                writer: "policy-cli",
            };
            let publish = |v: i64| async move { store(Some(u64::try_from(v).unwrap_or(0))).await.map(|_| ()) };
            match mcpfleet_db::policy::record(&db, &new, publish).await {
                Ok(Ok(v)) => Ok(u64::try_from(v).unwrap_or(0)),
                Ok(Err(e)) => Err(e),
                Err(e) => {
                    eprintln!("{name}: policy: cannot record the version: {e}");
                    return Err(crate::database::exit_of(&e));
                }
            }
        }
    };
    stored.map_err(|e| match e {
        NotStored::Moved(v) => {
            eprintln!("{name}: policy: version {v} was applied meanwhile; nothing stored: run it again");
            EXIT_TEMPFAIL
        }
        NotStored::Store(e) => {
            eprintln!("{name}: policy: cannot store it: {e}");
            EXIT_UNAVAILABLE
        }
    })
}

/// The database, at this binary's schema (the policy history is migration 0003's).
async fn open_db(name: &str, settings: &DbSettings) -> Result<Database, i32> {
    let db = Database::new(settings).map_err(|e| {
        eprintln!("{name}: {e}");
        EXIT_CONFIG
    })?;
    match mcpfleet_db::migrate::status(&db).await {
        Ok(s) if !s.pending.is_empty() => {
            eprintln!("{name}: {}", crate::database::behind(name, &s));
            Err(crate::config::EXIT_SCHEMA)
        }
        Ok(_) => Ok(db),
        Err(e) => {
            eprintln!("{name}: {e}");
            Err(crate::database::exit_of(&e))
        }
    }
}

/// `policy history`: every version, newest first, one line each.
async fn history(name: &str, settings: &DbSettings) -> i32 {
    let db = match open_db(name, settings).await {
        Ok(db) => db,
        Err(code) => return code,
    };
    match mcpfleet_db::policy::history(&db).await {
        Ok(versions) => {
            if versions.is_empty() {
                println!("no version applied");
            }
            for v in versions {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    v.version,
                    mcpfleet_db::rfc3339(v.applied_at),
                    v.applied_by,
                    &v.sha256[..12],
                    v.summary
                );
            }
            0
        }
        Err(e) => {
            eprintln!("{name}: policy history: {e}");
            crate::database::exit_of(&e)
        }
    }
}

/// `policy rollback VERSION`: that version's document, checked by this build, applied again as the next version.
async fn rollback(name: &str, r: &Rollback) -> i32 {
    let db = match open_db(name, &r.database).await {
        Ok(db) => db,
        Err(code) => return code,
    };
    let (_, text) = match mcpfleet_db::policy::version(&db, r.version).await {
        Ok(Some(v)) => v,
        Ok(None) => {
            eprintln!("{name}: policy rollback: no version {} in the history (see `{name} policy history`)", r.version);
            return EXIT_CONFIG;
        }
        Err(e) => {
            eprintln!("{name}: policy rollback: {e}");
            return crate::database::exit_of(&e);
        }
    };
    let target = match Policy::parse(&text) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{name}: policy rollback: version {} is refused by this build: {e}", r.version);
            return EXIT_CONFIG;
        }
    };
    let (redis, current, old) = match in_force(name, &r.redis, "policy rollback").await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let summary = format!("rollback to version {}: {}", r.version, target.summary(old.as_ref()));
    let summary: String = summary.chars().take(400).collect();
    let expected = current.as_ref().map_or(0, |c| c.version);
    let change = Change { text: &text, by: &r.by, summary: &summary, expected, rollback_of: Some(r.version) };
    match put(name, &redis, Some(&r.database), &change).await {
        Ok(v) => {
            println!("policy: version {} applied again as version {v} by {}: {summary}", r.version, r.by);
            0
        }
        Err(code) => code,
    }
}

/// Exit code of an apply that lost a race with another (sysexits `EX_TEMPFAIL`): run it again.
const EXIT_TEMPFAIL: i32 = 75;

/// The checked document in `path`, or `None` once the refusal is printed (one line on stderr).
fn load(name: &str, path: &Path) -> Option<Policy> {
    load_text(name, path).map(|(_, p)| p)
}

/// The text of `path` and its checked document, or `None` once the refusal is printed.
fn load_text(name: &str, path: &Path) -> Option<(String, Policy)> {
    let shown = path.display();
    let text = read(path).map_err(|e| eprintln!("{name}: policy {shown}: cannot read it: {e}")).ok()?;
    let policy = Policy::parse(&text).map_err(|e| eprintln!("{name}: policy {shown}: {e}")).ok()?;
    Some((text, policy))
}

/// `policy explain`: of `--file`, or of the version in force in the fleet's Redis.
async fn explain_command(name: &str, e: &Explain) -> i32 {
    let policy = match (&e.file, &e.redis) {
        (Some(file), _) => match load(name, file) {
            Some(p) => p,
            None => return EXIT_CONFIG,
        },
        (None, Some(redis)) => {
            let stored = match RedisStore::connect(redis.clone()).await {
                Ok(r) => r.policy().await,
                Err(err) => Err(err),
            };
            match stored {
                Ok(Some(s)) => match Policy::parse(&s.text) {
                    Ok(p) => {
                        println!("version {} (applied by {})", s.version, s.by);
                        p
                    }
                    Err(err) => {
                        eprintln!("{name}: policy explain: version {} is refused by this build: {err}", s.version);
                        return EXIT_CONFIG;
                    }
                },
                Ok(None) => {
                    println!("no version applied: the flags are the one plan");
                    return 0;
                }
                Err(err) => {
                    eprintln!("{name}: policy explain: cannot read the version in force: {err}");
                    return EXIT_UNAVAILABLE;
                }
            }
        }
        (None, None) => return EXIT_CONFIG,
    };
    print!("{}", explain(&policy, e));
    0
}

/// What `policy explain` prints: the plan and the rule that picked it, the plan's limits, and a call's verdict.
fn explain(p: &Policy, e: &Explain) -> String {
    let who = Subject { issuer: &e.iss, subject: &e.sub, claims: &e.claims };
    let assigned = p.assign(&who);
    let mut out = String::new();
    let _ = match assigned.rule {
        Some(i) => writeln!(out, "plan: {} (/assign/{i}: {})", assigned.plan, p.assign[i].when.source),
        None => writeln!(out, "plan: {} (the default: no rule holds)", assigned.plan),
    };
    for (i, plan) in &assigned.would {
        let _ = writeln!(out, "  dry run: /assign/{i} would pick {plan}");
    }
    if let Some(plan) = p.plans.get(assigned.plan) {
        let _ = writeln!(out, "limits: {}", limits(plan));
    }
    if let Some(line) = tenants(p) {
        let _ = writeln!(out, "{line}");
    }
    if let Some(tool) = &e.tool {
        let view = ToolView { name: tool, annotations: &serde_json::Value::Null };
        let _ = match p.check_call(assigned.plan, &who, &view, &e.args, &[]) {
            CallVerdict::Allowed { would_refuse } => {
                let mut line = format!("call {tool}: allowed");
                for i in would_refuse {
                    let _ = write!(line, "; dry run: /plans/{}/tools/conditions/{i} would refuse it", assigned.plan);
                }
                writeln!(out, "{line}")
            }
            CallVerdict::NotAllowed => {
                writeln!(out, "call {tool}: refused: not in plan {}'s tools.allow", assigned.plan)
            }
            CallVerdict::Refused { condition, message } => writeln!(
                out,
                "call {tool}: refused by /plans/{}/tools/conditions/{condition}: {message}",
                assigned.plan
            ),
        };
    }
    out
}

/// The tenant quotas in one line, with the bound of their leases: each replica leases a slice of a tenant's window
/// and spends it locally, so a tenant may be refused early by the units other replicas hold unspent.
fn tenants(p: &Policy) -> Option<String> {
    let t = &p.tenants;
    if t.quotas.is_empty() && t.overrides.is_empty() {
        return None;
    }
    let quotas: Vec<String> = t.quotas.iter().map(|(tool, q)| format!("{tool} {q}")).collect();
    let overrides: Vec<&str> = t.overrides.keys().map(String::as_str).collect();
    let example = t.quotas.values().next().map(|q| {
        let slice = mcpfleet_limits::slice(q.limit, 3);
        format!(" (with 3 replicas and a limit of {}: slices of {slice}, at most {} held unspent)", q.limit, 3 * slice)
    });
    Some(format!(
        "tenant quotas: {}{}; shared by a tenant's users beside each one's own; leased to each replica in slices of \
         max(1, limit / (8 × replicas)): a tenant may be refused up to one slice per replica early{}",
        if quotas.is_empty() { "none by default".to_owned() } else { quotas.join(", ") },
        if overrides.is_empty() { String::new() } else { format!(" (overridden for {})", overrides.join(", ")) },
        example.unwrap_or_default()
    ))
}

/// A plan's limits in one line; what it leaves out is the flag's value, named.
fn limits(plan: &Plan) -> String {
    let count = |v: Option<u64>, flag: &str| match v {
        None => flag.to_owned(),
        Some(0) => "no cap".to_owned(),
        Some(n) => n.to_string(),
    };
    let per_second = plan.rate_per_second.map_or_else(|| "--rate-per-second".to_owned(), |r| format!("{r}/s"));
    let burst = plan.rate_burst.map_or_else(|| "--rate-burst".to_owned(), |b| b.to_string());
    let quotas: Vec<String> = plan.quotas.iter().map(|(t, q)| format!("{t} {q}")).collect();
    format!(
        "rate {per_second}, burst {burst}; in flight {}; sessions {}; streams {}; tasks {}; quotas {}",
        count(plan.inflight, "--max-inflight-per-user"),
        count(plan.sessions, "--max-sessions-per-user"),
        count(plan.streams, "--max-streams-per-user"),
        count(plan.tasks, "--max-tasks-per-user"),
        if quotas.is_empty() { "--quota".to_owned() } else { quotas.join(", ") }
    )
}

/// The file's text, at most [`MAX_BYTES`] and one more (which the parser refuses with the size).
fn read(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_BYTES as u64 + 1).read_to_string(&mut text)?;
    Ok(text)
}
