//! The fleet-wide limits of each principal: the token bucket, the per-tool quotas, the caps on sessions, streams and
//! calls in flight and open tasks, and what the rate limit does when Redis cannot answer.

use super::cli::config_error;
use crate::ServerError;
use clap::ValueEnum;
use mcpfleet_limits::{FailMode, LimitsConfig, PlanLimits, Quota, RateLimit};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Limits")]
pub(super) struct LimitsArgs {
    /// Requests a principal may make at once: the capacity of its token bucket, shared by every replica. 0 turns
    /// the rate limit off.
    #[arg(
        long,
        env = "MCPFLEET_RATE_BURST",
        default_value_t = 300,
        value_parser = clap::value_parser!(u32).range(0..=1_000_000)
    )]
    rate_burst: u32,
    /// Requests per second a principal's bucket refills.
    #[arg(long, env = "MCPFLEET_RATE_PER_SECOND", default_value_t = 20.0, value_parser = rate_per_second)]
    rate_per_second: f64,
    /// A per-principal quota on a tool, TOOL=LIMIT/WINDOW (like search=10/1h; WINDOW in ms, s, m, h or d), over
    /// the tool's own; TOOL=off lifts the tool's own. Repeatable.
    #[arg(long, env = "MCPFLEET_QUOTAS", value_delimiter = ',')]
    quota: Vec<String>,
    /// Open sessions per principal across the fleet; 0 means no cap.
    #[arg(long, env = "MCPFLEET_MAX_SESSIONS_PER_USER", default_value_t = 64)]
    max_sessions_per_user: u64,
    /// Open SSE (GET) streams per principal across the fleet; 0 means no cap.
    #[arg(long, env = "MCPFLEET_MAX_STREAMS_PER_USER", default_value_t = 16)]
    max_streams_per_user: u64,
    /// Tool calls in flight per principal across the fleet; 0 means no cap.
    #[arg(long, env = "MCPFLEET_MAX_INFLIGHT_PER_USER", default_value_t = 16)]
    max_inflight_per_user: u64,
    /// Open tasks (the 2026-07-28 tasks extension) per principal across the fleet; 0 means no cap. A task is open
    /// from its creation until it completes, fails or is cancelled.
    #[arg(long, env = "MCPFLEET_MAX_TASKS_PER_USER", default_value_t = 32)]
    max_tasks_per_user: u64,
    /// When Redis cannot answer: closed refuses with 503 (default); open decides the rate limit on a local
    /// bucket of burst ÷ the live replica count per replica (session checks, caps and quotas still fail closed),
    /// and counts every such decision in mcp_limit_fail_open_total.
    #[arg(long, env = "MCPFLEET_RATE_FAIL_MODE", value_enum, default_value = "closed")]
    rate_fail_mode: RateFailMode,
    /// A floor for the replica count that sizes the fail-open bucket (--rate-fail-mode open). The replicas count
    /// themselves (each renews a membership record in Redis); this only matters until the first count, or to
    /// keep the share small when more replicas may come than are live.
    #[arg(
        long,
        env = "MCPFLEET_REPLICAS",
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=10_000)
    )]
    replicas: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RateFailMode {
    Closed,
    Open,
}

impl LimitsArgs {
    /// The limits; `slot_ttl` is the lease of a principal's stream and in-flight slots (`--lease-ttl`).
    ///
    /// # Errors
    /// A malformed `--quota`, or a tool named twice.
    pub(super) fn into_config(self, slot_ttl: Duration) -> Result<LimitsConfig, ServerError> {
        Ok(LimitsConfig {
            plan: PlanLimits {
                rate: (self.rate_burst > 0)
                    .then_some(RateLimit { burst: self.rate_burst, per_second: self.rate_per_second }),
                quotas: quotas(&self.quota)?,
                max_sessions: self.max_sessions_per_user,
                max_streams: self.max_streams_per_user,
                max_inflight: self.max_inflight_per_user,
                max_tasks: self.max_tasks_per_user,
            },
            fail_mode: match self.rate_fail_mode {
                RateFailMode::Closed => FailMode::Closed,
                RateFailMode::Open => FailMode::Open,
            },
            replicas: self.replicas,
            // A dead replica's slots are free as soon as its stream leases run out.
            slot_ttl,
            ..LimitsConfig::default()
        })
    }
}

fn rate_per_second(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && (0.001..=1_000_000.0).contains(&r) => Ok(r),
        _ => Err("must be a number between 0.001 and 1000000".to_owned()),
    }
}

/// `TOOL=LIMIT/WINDOW` or `TOOL=off`, repeatable; a tool named twice is an error.
fn quotas(raw: &[String]) -> Result<BTreeMap<String, Option<Quota>>, ServerError> {
    let mut map = BTreeMap::new();
    for entry in raw.iter().filter(|e| !e.trim().is_empty()) {
        let (tool, q) =
            entry.split_once('=').map(|(t, q)| (t.trim(), q.trim())).filter(|(t, _)| valid_tool_name(t)).ok_or_else(
                || config_error(format!("invalid --quota {entry:?}: expected TOOL=LIMIT/WINDOW or TOOL=off")),
            )?;
        let q = if q == "off" {
            None
        } else {
            Some(q.parse::<Quota>().map_err(|e| config_error(format!("--quota {tool}: {e}")))?)
        };
        if map.insert(tool.to_owned(), q).is_some() {
            return Err(config_error(format!("--quota {tool} is given twice")));
        }
    }
    Ok(map)
}

/// An MCP tool name: `[A-Za-z0-9_.-]{1,128}`.
fn valid_tool_name(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::super::tests::serve;
    use super::*;

    #[test]
    fn the_defaults_and_the_slot_lease() {
        let l = serve(&["--lease-ttl", "1500ms"]).unwrap().limits;
        assert_eq!(l.plan.rate, Some(RateLimit { burst: 300, per_second: 20.0 }));
        assert_eq!((l.plan.max_sessions, l.plan.max_streams, l.plan.max_inflight, l.replicas), (64, 16, 16, 1));
        assert_eq!(l.fail_mode, FailMode::Closed);
        assert_eq!(l.slot_ttl, Duration::from_millis(1500));
        let off = serve(&["--rate-burst", "0", "--rate-fail-mode", "open", "--replicas", "3"]).unwrap().limits;
        assert_eq!((off.plan.rate, off.fail_mode, off.replicas), (None, FailMode::Open, 3));
    }

    #[test]
    fn quotas_parse_strictly() {
        let q = quotas(&["search=10/1h".into(), " export = off ".into(), String::new()]).unwrap();
        assert_eq!(q["search"], Some(Quota::new(10, Duration::from_secs(3600))));
        assert_eq!(q["export"], None);
        let err =
            |raw: &[&str]| quotas(&raw.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap_err().to_string();
        assert_eq!(err(&["search"]), "invalid --quota \"search\": expected TOOL=LIMIT/WINDOW or TOOL=off");
        assert_eq!(
            err(&["bad name=1/1h"]),
            "invalid --quota \"bad name=1/1h\": expected TOOL=LIMIT/WINDOW or TOOL=off"
        );
        assert_eq!(err(&["a=1/1h", "a=2/1h"]), "--quota a is given twice");
        assert!(err(&["a=10"]).starts_with("--quota a: "));
        assert!(err(&["a=0/1h"]).starts_with("--quota a: "));
    }

    #[test]
    fn the_rate_is_bounded() {
        assert!(rate_per_second("0").is_err() && rate_per_second("NaN").is_err() && rate_per_second("1e7").is_err());
        assert_eq!(rate_per_second("0.5"), Ok(0.5));
        assert!(serve(&["--rate-burst", "1000001"]).is_err());
        assert!(serve(&["--replicas", "0"]).is_err());
    }
}
