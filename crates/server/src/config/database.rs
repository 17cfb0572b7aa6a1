//! The system of record: where PostgreSQL is (its URL, deadline and pool), whether `serve` migrates it, and the
//! audit trail's settings; and the flags of the commands that work on the database alone (`migrate`,
//! `demo-data`, `audit verify|export|prune`).

use super::cli::{config_error, duration};
use super::secret::Secret;
use crate::ServerError;
use mcpfleet_db::DbSettings;
use std::path::PathBuf;
use std::time::Duration;

/// The connection flags, shared by `serve` and the database commands.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Database")]
pub(super) struct DbArgs {
    /// PostgreSQL URL: postgres://user:password@host:port/db, with libpq's sslmode (disable, prefer, require,
    /// verify-ca, verify-full) and sslrootcert=<PEM file> in the query. Never printed or logged.
    #[arg(long, env = "MCPFLEET_DATABASE_URL", hide_env_values = true)]
    database_url: Option<Secret>,
    /// Deadline of connecting, of waiting for a pooled connection, and of each tool's database work, like 2s;
    /// 10ms to 60s. A tool past it answers that the database is unavailable.
    #[arg(long, env = "MCPFLEET_DATABASE_TIMEOUT", default_value = "2s", value_parser = duration("10ms", "60s"))]
    database_timeout: Duration,
    /// Connections per replica.
    #[arg(
        long,
        env = "MCPFLEET_DATABASE_POOL_SIZE",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    database_pool_size: u32,
}

impl DbArgs {
    /// The settings, when a URL was given.
    pub(super) fn settings(self) -> Result<Option<DbSettings>, ServerError> {
        let Some(url) = self.database_url else { return Ok(None) };
        let url = url.expose().to_owned();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(config_error("--database-url must start with postgres:// or postgresql://"));
        }
        Ok(Some(DbSettings {
            url,
            pool_size: usize::try_from(self.database_pool_size).unwrap_or(16),
            timeout: self.database_timeout,
        }))
    }

    /// The settings of a command that needs the database.
    pub(super) fn required(self) -> Result<DbSettings, ServerError> {
        self.settings()?.ok_or_else(|| config_error("--database-url (MCPFLEET_DATABASE_URL) is required"))
    }
}

/// Whether calls are written to the audit trail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuditTrail {
    /// Every tools/call outcome becomes a row in the database (with --database-url).
    On,
    /// The audit log line only.
    Off,
}

/// `serve`'s database flags.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Database")]
pub(super) struct ServeDbArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Apply pending migrations at start (under the same lock as `mcpfleet migrate`) instead of refusing to
    /// start on a schema that is behind.
    #[arg(long, env = "MCPFLEET_MIGRATE_ON_START")]
    migrate_on_start: bool,
    /// The audit trail in the database (with --database-url).
    #[arg(long, env = "MCPFLEET_AUDIT_TRAIL", value_enum, default_value = "on")]
    audit_trail: AuditTrail,
    /// Audit records a replica holds while the database is down or slow; past it, records are dropped and
    /// counted (mcp_audit_dropped_total).
    #[arg(
        long,
        env = "MCPFLEET_AUDIT_BUFFER",
        default_value_t = 100_000,
        value_parser = clap::value_parser!(u32).range(100..=10_000_000)
    )]
    audit_buffer: u32,
    /// Months of audit trail kept: older monthly partitions are dropped (after a checkpoint of each chain).
    /// 0 keeps everything.
    #[arg(
        long,
        env = "MCPFLEET_AUDIT_RETENTION_MONTHS",
        default_value_t = 0,
        value_parser = clap::value_parser!(u32).range(0..=1200)
    )]
    audit_retention_months: u32,
    /// This replica's name in the audit trail [default: the host name, which is the pod's name in Kubernetes]
    #[arg(long, env = "MCPFLEET_REPLICA_ID")]
    replica_id: Option<String>,
}

/// The database part of a [`super::Config`].
#[derive(Clone, Debug)]
pub struct DatabaseConfig {
    pub settings: DbSettings,
    pub migrate_on_start: bool,
    /// `None` with `--audit-trail off`.
    pub audit: Option<AuditConfig>,
}

/// The audit trail's settings.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    pub replica: String,
    pub buffer: usize,
    /// `None`: keep everything.
    pub retention_months: Option<u32>,
}

impl ServeDbArgs {
    /// # Errors
    /// A URL that is not `postgres://`, or a replica id that is not 1 to 100 visible ASCII characters.
    pub(super) fn into_config(self) -> Result<Option<DatabaseConfig>, ServerError> {
        let Some(settings) = self.db.settings()? else { return Ok(None) };
        let replica = match self.replica_id {
            Some(r) => r,
            None => super::cli::hostname().unwrap_or_else(|| "replica".to_owned()),
        };
        if replica.is_empty() || replica.len() > 100 || !replica.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(config_error("--replica-id must be 1 to 100 visible ASCII characters"));
        }
        let audit = (self.audit_trail == AuditTrail::On).then(|| AuditConfig {
            replica,
            buffer: usize::try_from(self.audit_buffer).unwrap_or(100_000),
            retention_months: (self.audit_retention_months > 0).then_some(self.audit_retention_months),
        });
        Ok(Some(DatabaseConfig { settings, migrate_on_start: self.migrate_on_start, audit }))
    }
}

/// `mcpfleet migrate`.
#[derive(Debug, clap::Args)]
pub(super) struct MigrateArgs {
    #[command(flatten)]
    pub db: DbArgs,
}

/// `mcpfleet demo-data`.
#[derive(Debug, clap::Args)]
#[cfg(feature = "reference")]
pub(super) struct DemoArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Size: 10 tenants, 10k customers, 50k orders, 20k tickets and 5k documents per unit.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub scale: u32,
}

/// `mcpfleet audit …`.
#[derive(Debug, clap::Subcommand)]
pub(super) enum AuditCommand {
    /// Walk every chain of the audit trail: exit 0 when intact, 1 naming the first missing, altered or reordered
    /// row of each broken chain.
    Verify {
        #[command(flatten)]
        db: DbArgs,
        /// Also write the result as Prometheus metrics to this file (node-exporter textfile collector).
        #[arg(long)]
        textfile: Option<PathBuf>,
    },
    /// Write the audited calls of a time range as JSON lines, oldest first.
    Export {
        #[command(flatten)]
        db: DbArgs,
        /// From (inclusive): a time like 2026-12-01 or 2026-12-01T10:00:00Z, or a duration ago like 24h.
        #[arg(long)]
        since: String,
        /// Until (exclusive), the same way [default: now]
        #[arg(long)]
        until: Option<String>,
        /// Only this principal: its key as the server computes it (the `principal` of the rows).
        #[arg(long, conflicts_with_all = ["iss", "sub"])]
        principal: Option<String>,
        /// Only the principal with this token issuer (with --sub).
        #[arg(long, requires = "sub")]
        iss: Option<String>,
        /// Only the principal with this token subject (with --iss).
        #[arg(long, requires = "iss")]
        sub: Option<String>,
        /// Write here instead of stdout.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Apply retention now: drop the monthly partitions older than --keep-months, after a checkpoint of each
    /// chain (`serve --audit-retention-months` does this every hour).
    Prune {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1200))]
        keep_months: u32,
    },
}

/// What a database command asks for.
#[derive(Debug)]
pub enum DbCommand {
    Migrate,
    #[cfg(feature = "reference")]
    DemoData {
        scale: u32,
    },
    Verify {
        textfile: Option<PathBuf>,
    },
    Export {
        filter: mcpfleet_db::audit::ExportFilter,
        output: Option<PathBuf>,
    },
    Prune {
        keep_months: u32,
    },
}

/// A database command and its connection.
#[derive(Debug)]
pub struct DbRequest {
    pub settings: DbSettings,
    pub command: DbCommand,
}

/// `24h` ago, or the time as given (PostgreSQL reads it).
fn instant(s: &str) -> Result<String, ServerError> {
    if s.is_empty() || s.len() > 64 {
        return Err(config_error("--since and --until take a time like 2026-12-01T10:00:00Z or a duration like 24h"));
    }
    if s.starts_with(|c: char| c.is_ascii_digit()) && s.ends_with(|c: char| c.is_ascii_alphabetic()) && !s.contains('-')
    {
        let ago = mcpfleet_core::parse_duration(s).map_err(|e| config_error(format!("--since/--until {s:?}: {e}")))?;
        return Ok(mcpfleet_db::rfc3339(std::time::SystemTime::now() - ago));
    }
    Ok(s.to_owned())
}

impl AuditCommand {
    pub(super) fn into_request(self) -> Result<DbRequest, ServerError> {
        Ok(match self {
            Self::Verify { db, textfile } => {
                DbRequest { settings: db.required()?, command: DbCommand::Verify { textfile } }
            }
            Self::Prune { db, keep_months } => {
                DbRequest { settings: db.required()?, command: DbCommand::Prune { keep_months } }
            }
            Self::Export { db, since, until, principal, iss, sub, output } => {
                let principal = match (principal, iss, sub) {
                    (Some(p), _, _) => Some(p),
                    (None, Some(iss), Some(sub)) => Some(mcpfleet_core::user_key(&iss, &sub).as_str().to_owned()),
                    _ => None,
                };
                let filter = mcpfleet_db::audit::ExportFilter {
                    since: instant(&since)?,
                    until: match until {
                        Some(u) => instant(&u)?,
                        None => "now".to_owned(),
                    },
                    principal,
                };
                DbRequest { settings: db.required()?, command: DbCommand::Export { filter, output } }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::serve;
    use std::time::Duration;

    #[test]
    fn database_settings_keep_the_password_out_of_debug() {
        let c = serve(&["--database-url", "postgres://app:hunter2@db:5432/app", "--replica-id", "api-1"]).unwrap();
        let d = c.database.as_ref().unwrap();
        assert_eq!(d.settings.url, "postgres://app:hunter2@db:5432/app");
        assert_eq!((d.settings.pool_size, d.settings.timeout, d.migrate_on_start), (16, Duration::from_secs(2), false));
        let a = d.audit.as_ref().unwrap();
        assert_eq!((a.replica.as_str(), a.buffer, a.retention_months), ("api-1", 100_000, None));
        assert!(!format!("{c:?}").contains("hunter2"));
        let off = serve(&["--database-url", "postgres://db/app", "--audit-trail", "off"]).unwrap();
        assert!(off.database.unwrap().audit.is_none());
        assert!(serve(&[]).unwrap().database.is_none());
    }

    #[test]
    fn bad_database_settings_are_refused() {
        let err = |args: &[&str]| serve(args).unwrap_err().to_string();
        assert_eq!(
            err(&["--database-url", "mysql://db/app"]),
            "--database-url must start with postgres:// or postgresql://"
        );
        assert!(err(&["--database-url", "postgres://db/a", "--database-pool-size", "0"]).contains("0"));
        assert!(err(&["--database-url", "postgres://db/a", "--replica-id", "a b"]).contains("--replica-id"));
        assert!(err(&["--database-timeout", "5"]).contains("needs a number and a unit"));
        assert_eq!(err(&["--tenant-claim", "org"]), "--tenant-claim needs --auth jwt");
    }
}
