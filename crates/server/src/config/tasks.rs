//! Tasks (the 2026-07-28 `io.modelcontextprotocol/tasks` extension): how many queued tasks this replica runs at
//! once, the shards of the shared work queue, the lease a run holds, and what clients are told about a task's
//! lifetime and polling.

use super::cli::{config_error, duration};
use crate::ServerError;
use mcpfleet_transport::TaskConfig;
use std::time::Duration;

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Tasks")]
pub(super) struct TaskArgs {
    /// Queued tasks this replica runs at once (1 to 1024). Calls that became tasks where they ran are not counted:
    /// they hold an in-flight slot instead.
    #[arg(
        long,
        env = "MCPFLEET_TASK_WORKERS",
        default_value_t = 8,
        value_parser = clap::value_parser!(u16).range(1..=1024)
    )]
    task_workers: u16,
    /// Streams of the shared work queue, each on its own Redis hash slot (1 to 256). Every replica of a fleet must
    /// use the same number; change it only with no task open.
    #[arg(
        long,
        env = "MCPFLEET_TASK_QUEUE_SHARDS",
        default_value_t = 4,
        value_parser = clap::value_parser!(u16).range(1..=256)
    )]
    task_queue_shards: u16,
    /// How long a task run's lease lasts without renewal, like 10s (1s to 10m): a dead replica's tasks are taken
    /// over (run again, or failed) this long after it died.
    #[arg(long, env = "MCPFLEET_TASK_LEASE", default_value = "10s", value_parser = duration("1s", "10m"))]
    task_lease: Duration,
    /// How long a task and its result are kept from its creation (its ttlMs), like 1h; 10s to 7d.
    #[arg(long, env = "MCPFLEET_TASK_TTL", default_value = "1h", value_parser = duration("10s", "7d"))]
    task_ttl: Duration,
    /// The pollIntervalMs suggested to clients, like 2s (100ms to 10m). Each poll takes a token from the
    /// principal's bucket: a client polling n tasks spends n ÷ interval tokens a second, and one polling faster
    /// than this is slowed by its bucket. The default lets a principal poll 32 tasks (--max-tasks-per-user) under
    /// the default refill of 20 a second.
    #[arg(long, env = "MCPFLEET_TASK_POLL_INTERVAL", default_value = "2s", value_parser = duration("100ms", "10m"))]
    task_poll_interval: Duration,
}

impl TaskArgs {
    /// The tasks' configuration; `tool_timeout` bounds how long a run may take, so the TTL must outlast it;
    /// `redis_timeout` bounds a lease renewal, so the lease must hold three.
    ///
    /// # Errors
    /// A TTL shorter than the tool timeout (a task could expire while it still runs), or a lease shorter than three
    /// Redis timeouts.
    pub(super) fn into_config(
        self,
        tool_timeout: Duration,
        redis_timeout: Option<Duration>,
    ) -> Result<TaskConfig, ServerError> {
        if let Some(timeout) = redis_timeout.filter(|t| self.task_lease < 3 * *t) {
            // A lease is renewed every third of its life; a renewal that may take a whole Redis timeout must fit.
            return Err(config_error(format!(
                "--task-lease ({}) must be at least 3 × --redis-timeout ({})",
                super::cli::human(self.task_lease),
                super::cli::human(timeout)
            )));
        }
        if self.task_ttl < tool_timeout {
            return Err(config_error(format!(
                "--task-ttl ({}) must be at least --tool-timeout ({}): a task could expire while it runs",
                super::cli::human(self.task_ttl),
                super::cli::human(tool_timeout)
            )));
        }
        Ok(TaskConfig {
            workers: usize::from(self.task_workers),
            shards: self.task_queue_shards,
            lease: self.task_lease,
            ttl: self.task_ttl,
            poll_interval: self.task_poll_interval,
        })
    }
}
