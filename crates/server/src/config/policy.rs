//! Policy as data (docs/POLICY.md): the `mcpfleet policy …` commands and where `serve` takes its document from
//! (the store every replica shares, or `--policy FILE` for one process without Redis).

use super::cli::{config_error, duration};
use super::database::DbArgs;
use super::store::StoreArgs;
use crate::ServerError;
use clap::Subcommand;
use mcpfleet_db::DbSettings;
use mcpfleet_state::RedisConfig;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Policy")]
pub(super) struct ServePolicyArgs {
    /// A policy document to serve (docs/POLICY.md), read again when the file changes: for one process without
    /// Redis. With Redis, the fleet follows the document applied with `mcpfleet policy apply` instead, and this
    /// flag is refused.
    #[arg(long, env = "MCPFLEET_POLICY", value_name = "FILE")]
    policy: Option<PathBuf>,
    /// How often each replica reads the version in force without an announcement (and the file, with --policy),
    /// like 10s (1s to 10m).
    #[arg(long, env = "MCPFLEET_POLICY_POLL", default_value = "10s", value_parser = duration("1s", "10m"))]
    policy_poll: Duration,
}

/// Where `serve` takes its policy from.
#[derive(Clone, Debug)]
pub struct PolicyFollow {
    /// `--policy FILE`; `None`: the store's version (with Redis), or none (the flags).
    pub file: Option<PathBuf>,
    /// `--policy-poll`.
    pub poll: Duration,
}

impl ServePolicyArgs {
    pub(super) fn into_config(self, redis: bool) -> Result<PolicyFollow, ServerError> {
        if redis && self.policy.is_some() {
            return Err(config_error(
                "--policy FILE is for one process without Redis; a fleet on Redis follows `mcpfleet policy apply`",
            ));
        }
        Ok(PolicyFollow { file: self.policy, poll: self.policy_poll })
    }
}

#[derive(Debug, Subcommand)]
pub(super) enum PolicyCommand {
    /// Check a policy document offline (for CI): exit 0 if it would be accepted, 64 with the JSON pointer of the
    /// first place refused.
    Check {
        /// The document (YAML or JSON).
        file: PathBuf,
    },
    /// Check a document, store it as the fleet's next version and announce it: every replica swaps it in. With
    /// --database-url, the version is recorded in its history and the change in the audit trail.
    Apply(ApplyArgs),
    /// What applying a document would change against the version in force.
    Diff(DiffArgs),
    /// Every version applied, newest first: who, when, what it changed (needs --database-url).
    History {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Apply an earlier version again, as the next version (needs the fleet's Redis and --database-url).
    Rollback(RollbackArgs),
    /// Which plan a principal gets from a document, its limits, and whether a call would go through.
    Explain(ExplainArgs),
}

#[derive(Debug, clap::Args)]
pub(super) struct ApplyArgs {
    /// The document (YAML or JSON).
    file: PathBuf,
    #[command(flatten)]
    change: ChangeArgs,
}

/// What every command that changes the fleet's policy or revocations takes: who, the fleet's Redis, the database.
#[derive(Debug, clap::Args)]
pub(super) struct ChangeArgs {
    #[command(flatten)]
    who: WhoArgs,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    db: DbArgs,
}

/// Who makes a change, as the history and the audit trail record it.
#[derive(Debug, clap::Args)]
pub(super) struct WhoArgs {
    /// Who makes the change, as the history and the audit trail record it (default: the OS user @ the host).
    #[arg(long, env = "MCPFLEET_POLICY_BY")]
    by: Option<String>,
    /// The OS user, for --by's default.
    #[arg(long, env = "USER", hide = true)]
    os_user: Option<String>,
}

impl WhoArgs {
    /// `--by`, or the OS user and the host; at most 200 characters.
    fn name(self) -> String {
        let by = self.by.filter(|b| !b.trim().is_empty()).unwrap_or_else(|| default_by(self.os_user.as_deref()));
        by.chars().take(200).collect()
    }
}

#[derive(Debug, clap::Args)]
pub(super) struct RollbackArgs {
    /// The version to apply again (as `policy history` lists it).
    #[arg(value_parser = clap::value_parser!(i64).range(1..))]
    version: i64,
    #[command(flatten)]
    change: ChangeArgs,
}

#[derive(Debug, clap::Args)]
pub(super) struct DiffArgs {
    /// The document (YAML or JSON).
    file: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
}

#[derive(Debug, clap::Args)]
pub(super) struct ExplainArgs {
    /// The document (YAML or JSON) to explain; without it, the version in force in the fleet's Redis.
    #[arg(long)]
    file: Option<PathBuf>,
    /// The principal's subject (`sub`).
    #[arg(long)]
    sub: String,
    /// The principal's issuer (`iss`).
    #[arg(long, default_value = "")]
    iss: String,
    /// A claim of the principal's token, NAME=VALUE (the value is JSON if it parses as JSON, else a string);
    /// repeat for more.
    #[arg(long = "claim", value_name = "NAME=VALUE")]
    claims: Vec<String>,
    /// A tool to check a call of.
    #[arg(long)]
    tool: Option<String>,
    /// The call's arguments, a JSON object (with --tool).
    #[arg(long, default_value = "{}", requires = "tool")]
    args: String,
    #[command(flatten)]
    store: StoreArgs,
}

/// `mcpfleet revoke`: a principal (or one of its tokens) refused by every replica until a time; `--lift` ends it,
/// `--list` shows the revocations in force.
#[derive(Debug, clap::Args)]
pub(super) struct RevokeArgs {
    /// The principal's subject (`sub`).
    #[arg(long, required_unless_present = "list")]
    sub: Option<String>,
    /// The principal's issuer (`iss`); default: the configured issuer (`--jwt-issuer`).
    #[arg(long, env = "MCPFLEET_JWT_ISSUER")]
    iss: Option<String>,
    /// One token's id (`jti`) instead of the whole principal.
    #[arg(long)]
    jti: Option<String>,
    /// How long, like 2h; default --max-token-lifetime (every token the principal holds has ended by then).
    #[arg(long = "for", value_parser = duration("1s", "30d"), conflicts_with_all = ["lift", "list"])]
    duration: Option<Duration>,
    /// The longest a token may live, as `serve` refuses longer ones: a revocation's default length.
    #[arg(long, env = "MCPFLEET_MAX_TOKEN_LIFETIME", default_value = "24h", value_parser = super::cli::duration_or_zero("1m", "30d"))]
    max_token_lifetime: Duration,
    /// End the revocation of --sub (or of its token --jti).
    #[arg(long, conflicts_with = "list")]
    lift: bool,
    /// List the revocations in force.
    #[arg(long)]
    list: bool,
    #[command(flatten)]
    change: ChangeArgs,
}

/// `mcpfleet revoke`'s question.
#[derive(Debug)]
pub enum RevokeAction {
    /// `--list`.
    List,
    /// A revocation for `for_` (`--lift`: `None`).
    Revoke {
        iss: String,
        sub: String,
        jti: Option<String>,
        for_: Duration,
    },
    Lift {
        iss: String,
        sub: String,
        jti: Option<String>,
    },
}

/// `mcpfleet revoke`.
#[derive(Debug)]
pub struct Revoke {
    pub action: RevokeAction,
    pub redis: RedisConfig,
    pub by: String,
    pub database: Option<DbSettings>,
}

impl RevokeArgs {
    pub(super) fn into_request(self) -> Result<PolicyRequest, ServerError> {
        let redis = redis_of(self.change.store, "revoke")?;
        let who = || -> Result<(String, String), ServerError> {
            let iss = self.iss.clone().filter(|i| !i.is_empty()).ok_or_else(|| {
                config_error("revoke: give --iss (or MCPFLEET_JWT_ISSUER): a subject is one issuer's")
            })?;
            Ok((iss, self.sub.clone().unwrap_or_default()))
        };
        let action = if self.list {
            RevokeAction::List
        } else if self.lift {
            let (iss, sub) = who()?;
            RevokeAction::Lift { iss, sub, jti: self.jti.clone() }
        } else {
            let (iss, sub) = who()?;
            let for_ = match (self.duration, self.max_token_lifetime.is_zero()) {
                (Some(d), _) => d,
                (None, false) => self.max_token_lifetime,
                (None, true) => {
                    return Err(config_error(
                        "revoke: give --for: with no --max-token-lifetime, no length covers every token",
                    ));
                }
            };
            RevokeAction::Revoke { iss, sub, jti: self.jti.clone(), for_ }
        };
        Ok(PolicyRequest::Revoke(Revoke {
            action,
            redis,
            by: self.change.who.name(),
            database: self.change.db.settings()?,
        }))
    }
}

/// What `mcpfleet policy …` was asked.
#[derive(Debug)]
pub enum PolicyRequest {
    /// `policy check FILE`.
    Check(PathBuf),
    /// `policy apply FILE`.
    Apply(Apply),
    /// `policy diff FILE`: the same question as apply, without storing.
    Diff(Apply),
    /// `policy history`.
    History(DbSettings),
    /// `policy rollback VERSION`.
    Rollback(Rollback),
    /// `policy explain --file FILE --sub S …`.
    Explain(Explain),
    /// `revoke …`.
    Revoke(Revoke),
}

/// `policy apply` and `policy diff`: the document, the store, who, and the database that keeps the history.
#[derive(Debug)]
pub struct Apply {
    pub file: PathBuf,
    pub redis: RedisConfig,
    pub by: String,
    pub database: Option<DbSettings>,
}

/// `policy rollback VERSION`.
#[derive(Debug)]
pub struct Rollback {
    pub version: i64,
    pub redis: RedisConfig,
    pub by: String,
    pub database: DbSettings,
}

/// `policy explain`'s question: the document, the principal, and optionally a call.
#[derive(Debug)]
pub struct Explain {
    /// `--file`; `None`: the version in force in `redis`.
    pub file: Option<PathBuf>,
    pub redis: Option<RedisConfig>,
    pub sub: String,
    pub iss: String,
    pub claims: serde_json::Map<String, serde_json::Value>,
    pub tool: Option<String>,
    pub args: serde_json::Map<String, serde_json::Value>,
}

impl PolicyCommand {
    pub(super) fn into_request(self) -> Result<PolicyRequest, ServerError> {
        Ok(match self {
            Self::Check { file } => PolicyRequest::Check(file),
            Self::Apply(a) => PolicyRequest::Apply(Apply {
                redis: redis_of(a.change.store, "apply")?,
                by: a.change.who.name(),
                database: a.change.db.settings()?,
                file: a.file,
            }),
            Self::Diff(d) => PolicyRequest::Diff(Apply {
                redis: redis_of(d.store, "diff")?,
                by: String::new(),
                database: None,
                file: d.file,
            }),
            Self::History { db } => PolicyRequest::History(db.required()?),
            Self::Rollback(r) => PolicyRequest::Rollback(Rollback {
                version: r.version,
                redis: redis_of(r.change.store, "rollback")?,
                by: r.change.who.name(),
                database: r.change.db.required()?,
            }),
            Self::Explain(e) => PolicyRequest::Explain(e.into_request()?),
        })
    }
}

/// The Redis the fleet reads its policy from: required.
fn redis_of(store: StoreArgs, command: &str) -> Result<RedisConfig, ServerError> {
    store.into_config()?.redis.ok_or_else(|| {
        config_error(format!(
            "policy {command}: give the fleet's Redis (--redis-url, or --redis-nodes): the version in force lives there"
        ))
    })
}

/// The OS user and the host: `$USER@hostname`.
fn default_by(user: Option<&str>) -> String {
    let user = user.filter(|u| !u.is_empty()).unwrap_or("unknown");
    match super::cli::hostname() {
        Some(host) => format!("{user}@{host}"),
        None => user.to_owned(),
    }
}

impl ExplainArgs {
    fn into_request(self) -> Result<Explain, ServerError> {
        let mut claims = serde_json::Map::new();
        for c in &self.claims {
            let (name, value) = c
                .split_once('=')
                .filter(|(n, _)| !n.is_empty())
                .ok_or_else(|| config_error(format!("policy explain: --claim {c:?} is not NAME=VALUE")))?;
            let value = serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.to_owned()));
            claims.insert(name.to_owned(), value);
        }
        let args = match serde_json::from_str(&self.args) {
            Ok(serde_json::Value::Object(args)) => args,
            _ => return Err(config_error("policy explain: --args is not a JSON object")),
        };
        let redis = self.store.into_config()?.redis;
        if self.file.is_none() && redis.is_none() {
            return Err(config_error(
                "policy explain: give --file, or the fleet's Redis (--redis-url) for the version in force",
            ));
        }
        Ok(Explain { file: self.file, redis, sub: self.sub, iss: self.iss, claims, tool: self.tool, args })
    }
}
