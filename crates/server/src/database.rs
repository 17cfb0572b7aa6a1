//! PostgreSQL in the server: the schema check at start (or `--migrate-on-start`), the audit writer and the
//! background work (partitions ahead, retention, the pool's health), and the commands that work on the database
//! alone (`migrate`, `demo-data`, `audit verify|export|prune`).

use crate::ServerError;
use crate::config::{Config, DatabaseConfig, DbCommand, DbRequest, EXIT_CONFIG, EXIT_SCHEMA, EXIT_UNAVAILABLE};
use mcpfleet_db::audit::{self, DbMetrics, Writer, WriterConfig, partitions};
use mcpfleet_db::migrate::{self, Status};
use mcpfleet_db::{Database, DbError};
use prometheus::Registry;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// The pool of `--database-url`, if given (nothing connects yet).
///
/// # Errors
/// A URL the driver cannot take, or TLS roots that cannot be read.
pub(crate) fn open(cfg: &Config) -> Result<Option<Database>, ServerError> {
    cfg.database
        .as_ref()
        .map(|d| Database::new(&d.settings).map_err(|e| ServerError::Config(e.to_string())))
        .transpose()
}

/// The one line a schema behind this binary gets; `name` is the server's (its `migrate` subcommand).
pub(crate) fn behind(name: &str, status: &Status) -> String {
    format!(
        "the database schema is at version {} but this binary needs version {}: run `{name} migrate` first (or serve \
         with --migrate-on-start)",
        status.current(),
        Status::needed()
    )
}

fn schema_error(e: DbError) -> ServerError {
    match e {
        e @ DbError::Checksum { .. } => ServerError::Schema(e.to_string()),
        e => ServerError::Database(e),
    }
}

/// Checks the schema (or migrates it), creates the audit partitions ahead, and starts the audit writer and the
/// background work, which stop with `shutdown`.
///
/// A database that is away at start (refused, timed out) does not stop the start: readiness never depends on it.
/// The audit writer then queues what it may (`--audit-buffer`, dropping and counting past it, as during any outage),
/// and a background task retries (1 s, doubling to 10 s) until the database answers; then it checks the schema as
/// the start would have, and opens the writer. A schema found behind then is fatal as it is at start: `fatal`
/// gets the error (exit 78) and `stop` fires (the drain).
///
/// # Errors
/// The database refusing the connection for good ([`ServerError::Database`], exit 69: a wrong password, a TLS
/// failure), or its schema behind without `--migrate-on-start` ([`ServerError::Schema`], exit 78).
pub(crate) async fn start(
    name: &str,
    db: &Database,
    dc: &DatabaseConfig,
    registry: &Registry,
    shutdown: &CancellationToken,
    fatal: &Fatal,
) -> Result<Option<Arc<Writer>>, ServerError> {
    let metrics = DbMetrics::register(registry).map_err(|e| ServerError::Config(format!("metrics: {e}")))?;
    tokio::spawn(audit::watch_pool(db.clone(), metrics.clone(), shutdown.clone()));
    let writer = dc.audit.as_ref().map(|ac| {
        let cfg = WriterConfig {
            replica: ac.replica.clone(),
            buffer: ac.buffer,
            batch: 1000,
            interval: Duration::from_secs(1),
        };
        Writer::start_held(db.clone(), cfg, metrics.clone())
    });
    match check_schema(name, db, dc).await {
        Ok(()) => {
            begin_work(db, dc, writer.as_ref(), shutdown);
            Ok(writer)
        }
        Err(ServerError::Database(DbError::Unavailable(e))) => {
            tracing::warn!(
                error = %e,
                "cannot reach the database yet: serving without it (readiness does not depend on it); the audit is \
                 queued, and the schema is checked when it answers"
            );
            let (name, db, dc, w, stop, fatal) =
                (name.to_owned(), db.clone(), dc.clone(), writer.clone(), shutdown.clone(), fatal.clone());
            tokio::spawn(async move {
                let mut wait = Duration::from_secs(1);
                loop {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = stop.cancelled() => return,
                    }
                    match check_schema(&name, &db, &dc).await {
                        Ok(()) => {
                            tracing::info!("the database answers: the schema is checked, the audit is written");
                            return begin_work(&db, &dc, w.as_ref(), &stop);
                        }
                        Err(ServerError::Database(DbError::Unavailable(e))) => {
                            tracing::debug!(error = %e, "the database is still away");
                            wait = (wait * 2).min(Duration::from_secs(10));
                        }
                        Err(e) => return fatal.fail(e),
                    }
                }
            });
            Ok(writer)
        }
        Err(e) => Err(e),
    }
}

/// The schema at this binary's version: checked, or migrated with `--migrate-on-start`.
///
/// # Errors
/// [`ServerError::Database`] (unreachable: `DbError::Unavailable`, worth a retry; or refused), or
/// [`ServerError::Schema`] (behind, or a migration changed after it was applied).
async fn check_schema(name: &str, db: &Database, dc: &DatabaseConfig) -> Result<(), ServerError> {
    let status = migrate::status(db).await.map_err(schema_error)?;
    if !status.pending.is_empty() {
        if !dc.migrate_on_start {
            return Err(ServerError::Schema(behind(name, &status)));
        }
        for m in migrate::apply(db).await.map_err(schema_error)? {
            tracing::info!(version = m.version, name = m.name, "migrated at start");
        }
    }
    if !status.ahead.is_empty() {
        tracing::info!(ahead = ?status.ahead, "the database schema is ahead of this binary (a newer release migrated)");
    }
    tracing::info!(database = %db.target(), version = status.current().max(Status::needed()), "using PostgreSQL");
    Ok(())
}

/// The background work on a checked database: partitions ahead and retention, and the audit writer opened.
fn begin_work(db: &Database, dc: &DatabaseConfig, writer: Option<&Arc<Writer>>, shutdown: &CancellationToken) {
    if let Some(ac) = &dc.audit {
        tokio::spawn(partitions::maintain(db.clone(), ac.retention_months, shutdown.clone()));
    }
    if let Some(w) = writer {
        w.open();
    }
}

/// Where a background check that finds the database unusable (a schema behind, or changed) sends its error: the
/// process ends with its exit code, through the drain.
#[derive(Clone, Debug, Default)]
pub(crate) struct Fatal {
    error: Arc<std::sync::Mutex<Option<ServerError>>>,
    fired: CancellationToken,
}

impl Fatal {
    fn fail(&self, e: ServerError) {
        tracing::error!(error = %e, "cannot go on");
        *self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
        self.fired.cancel();
    }

    /// Cancels `stop` (the drain, or an embedder's shutdown) when a background check fails for good.
    pub(crate) fn cancels(&self, stop: CancellationToken) {
        let fired = self.fired.clone();
        tokio::spawn(async move {
            fired.cancelled().await;
            stop.cancel();
        });
    }

    /// The error that fired it, once.
    pub(crate) fn take(&self) -> Option<ServerError> {
        self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// Runs a database command of the server named `name` (the prefix of its error lines); returns the exit code.
/// The exit code of a database command that failed with `e`.
pub(crate) fn exit_of(e: &DbError) -> i32 {
    match e {
        DbError::Checksum { .. } => EXIT_SCHEMA,
        DbError::Unavailable(_) | DbError::Refused(_) => EXIT_UNAVAILABLE,
        DbError::Url(_) | DbError::Tls(_) => EXIT_CONFIG,
        DbError::Query(_) => 1,
    }
}

pub(crate) async fn command(name: &str, req: DbRequest) -> i32 {
    let db = match Database::new(&req.settings) {
        Ok(db) => db,
        Err(e) => {
            eprintln!("{name}: {e}");
            return EXIT_CONFIG;
        }
    };
    let fail = |e: DbError| {
        eprintln!("{name}: {e}");
        exit_of(&e)
    };
    match req.command {
        DbCommand::Migrate => {
            let applied = match migrate::apply(&db).await {
                Ok(a) => a,
                Err(e) => return fail(e),
            };
            for m in &applied {
                println!("applied {:04} {}", m.version, m.name);
            }
            if let Err(e) = partitions::ensure(&db, SystemTime::now(), 2).await {
                return fail(e);
            }
            match migrate::status(&db).await {
                Ok(s) if applied.is_empty() => println!("nothing to apply: the schema is at version {}", s.current()),
                Ok(s) => println!("the schema is at version {}", s.current()),
                Err(e) => return fail(e),
            }
            0
        }
        #[cfg(feature = "reference")]
        DbCommand::DemoData { scale } => {
            match migrate::status(&db).await {
                Ok(s) if !s.pending.is_empty() => {
                    eprintln!("{name}: {}", behind(name, &s));
                    return EXIT_SCHEMA;
                }
                Ok(_) => {}
                Err(e) => return fail(e),
            }
            match mcpfleet_reference::demo_data(db.pool(), scale).await {
                Ok(summary) => {
                    println!("{summary}");
                    0
                }
                Err(e) => {
                    eprintln!("{name}: demo data: {e}");
                    if matches!(e, mcpfleet_reference::RepoError::Unavailable(_)) { EXIT_UNAVAILABLE } else { 1 }
                }
            }
        }
        DbCommand::Verify { textfile } => match audit::verify(&db).await {
            Ok(report) => {
                print_report(&report);
                if let Some(path) = textfile
                    && let Err(e) = std::fs::write(&path, verify_metrics(&report))
                {
                    eprintln!("{name}: cannot write {}: {e}", path.display());
                    return 1;
                }
                i32::from(report.tampered().next().is_some())
            }
            Err(e) => fail(e),
        },
        DbCommand::Export { filter, output } => {
            let mut out: Box<dyn std::io::Write> = match &output {
                Some(path) => match std::fs::File::create(path) {
                    Ok(f) => Box::new(std::io::BufWriter::new(f)),
                    Err(e) => {
                        eprintln!("{name}: cannot create {}: {e}", path.display());
                        return 1;
                    }
                },
                None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
            };
            match audit::export(&db, &filter, &mut out).await {
                Ok(n) => {
                    if let Err(e) = out.flush() {
                        eprintln!("{name}: cannot write the export: {e}");
                        return 1;
                    }
                    eprintln!("exported {n} rows");
                    0
                }
                Err(DbError::Query(msg)) if msg.contains("22007") || msg.contains("22008") => {
                    eprintln!("{name}: --since/--until: not a time PostgreSQL can read ({msg})");
                    EXIT_CONFIG
                }
                Err(e) => fail(e),
            }
        }
        DbCommand::Prune { keep_months } => match partitions::prune(&db, SystemTime::now(), keep_months).await {
            Ok(dropped) if dropped.is_empty() => {
                println!("nothing to drop: no audit partition is older than {keep_months} months");
                0
            }
            Ok(dropped) => {
                for m in dropped {
                    println!("dropped the audit partition of {m} (checkpoints kept)");
                }
                0
            }
            Err(e) => fail(e),
        },
    }
}

fn print_report(report: &audit::Report) {
    for c in &report.chains {
        match &c.finding {
            Some((f, at, trace)) => {
                let at = at.map(mcpfleet_db::rfc3339).unwrap_or_default();
                let trace = trace.as_deref().unwrap_or("-");
                println!("TAMPERED {}: {f} (at {at}, trace id {trace})", c.chain_id);
            }
            None if c.ended => println!("ok       {}: {} rows, ended", c.chain_id, c.rows),
            None => println!(
                "open     {}: {} rows, no end row (the replica is running, crashed, or the chain's tail was cut)",
                c.chain_id, c.rows
            ),
        }
    }
    let tampered = report.tampered().count();
    let open = report.open().count();
    println!(
        "verified {} chains, {} rows: {} ended, {open} open, {tampered} tampered",
        report.chains.len(),
        report.rows(),
        report.chains.len() - open - tampered
    );
}

/// The verify result for node-exporter's textfile collector.
fn verify_metrics(report: &audit::Report) -> String {
    let tampered = report.tampered().count();
    let open = report.open().count();
    let ended = report.chains.len() - open - tampered;
    let now = mcpfleet_core::time::epoch_secs();
    format!(
        "# HELP mcp_audit_verify_chains Audit chains by the result of the last `mcpfleet audit verify`.\n\
         # TYPE mcp_audit_verify_chains gauge\n\
         mcp_audit_verify_chains{{result=\"ended\"}} {ended}\n\
         mcp_audit_verify_chains{{result=\"open\"}} {open}\n\
         mcp_audit_verify_chains{{result=\"tampered\"}} {tampered}\n\
         # HELP mcp_audit_verify_rows Audit rows checked by the last `mcpfleet audit verify`.\n\
         # TYPE mcp_audit_verify_rows gauge\n\
         mcp_audit_verify_rows {}\n\
         # HELP mcp_audit_verify_timestamp_seconds When the last `mcpfleet audit verify` finished.\n\
         # TYPE mcp_audit_verify_timestamp_seconds gauge\n\
         mcp_audit_verify_timestamp_seconds {now}\n",
        report.rows()
    )
}
