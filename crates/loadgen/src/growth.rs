//! How cost grows (issue 32, target 5): a population of idle sessions and open SSE streams, opened before the
//! load and held through it, and what it costs at rest.
//!
//! `--background-sessions N` opens N idle sessions (`initialize` and `notifications/initialized`, nothing more);
//! `--background-streams M` opens M more sessions, each holding its standalone GET stream open (read to the end
//! in the background, as a client waiting for server messages would). Once they are all open, an idle window of
//! `--idle-secs` (no other traffic) measures what the population costs at rest: Redis's and the replicas' CPU per
//! second (the streams' lease renewals), in all and per stream (with no population, what an empty fleet costs at
//! rest: the baseline to take off). Then the load runs as usual, with the population still open.
//! With `--json`, the population's figures are one JSON line before the load's row (`"phase": "population"`).

use crate::{BenchError, Session, cpu_seconds, redis_counters};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Sessions (and streams) opened at once.
const OPENING: usize = 32;

/// What stays open through the load: dropping it closes the streams.
pub(crate) struct Population {
    streams: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Population {
    fn drop(&mut self) {
        for s in &self.streams {
            s.abort();
        }
    }
}

/// The resident set of a process, in bytes (Linux `VmRSS`).
fn rss_bytes(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024.0)
}

/// Redis's `used_memory`, summed over the nodes.
async fn used_memory(urls: &[String]) -> Result<f64, BenchError> {
    let mut sum = 0.0;
    for url in urls {
        let mut conn = redis::Client::open(url.as_str())?.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO").arg("memory").query_async(&mut conn).await?;
        sum += info.lines().find_map(|l| l.strip_prefix("used_memory:")?.trim().parse::<f64>().ok()).unwrap_or(0.0);
    }
    Ok(sum)
}

/// Opens session `n` and, with `stream`, its GET stream, kept open by a task that reads it.
async fn open_one(
    a: &crate::Args,
    http: &reqwest::Client,
    urls: &Arc<Vec<String>>,
    n: usize,
    stream: bool,
) -> Result<Option<tokio::task::JoinHandle<()>>, BenchError> {
    let s = Session::open(http.clone(), urls.clone(), a.token(n), a.prover(), n, false).await?;
    if !stream {
        return Ok(None);
    }
    let url = &s.urls[n % s.urls.len()];
    let mut rb = s
        .http
        .get(url)
        .header("accept", "text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", &s.id);
    if let Some(t) = &s.token {
        rb = rb.bearer_auth(t);
    }
    let resp = rb.send().await?;
    if resp.status() != 200 {
        return Err(BenchError::Stream(resp.status().as_u16()));
    }
    let mut body = resp.bytes_stream();
    Ok(Some(tokio::spawn(async move {
        use futures::StreamExt as _;
        while let Some(Ok(_)) = body.next().await {}
    })))
}

/// Opens the population, measures it at rest, and prints its figures; what must stay open through the load.
pub(crate) async fn populate(
    a: &crate::Args,
    http: &reqwest::Client,
    urls: &Arc<Vec<String>>,
) -> Result<Population, BenchError> {
    use futures::StreamExt as _;
    let (n_idle, n_streams) = (a.background_sessions, a.background_streams);
    let rss0: Option<f64> = a.pids.iter().map(|p| rss_bytes(*p)).sum();
    let mem0 = used_memory(&a.redis_urls).await?;
    let started = Instant::now();
    // Session numbers past the load's own, so that the tokens go round from where the load's leave off.
    let first = a.sessions;
    let opened: Vec<Result<Option<tokio::task::JoinHandle<()>>, BenchError>> =
        futures::stream::iter(0..n_idle + n_streams)
            .map(|k| open_one(a, http, urls, first + k, k >= n_idle))
            .buffer_unordered(OPENING)
            .collect()
            .await;
    let opening_secs = started.elapsed().as_secs_f64();
    let mut population = Population { streams: Vec::with_capacity(n_streams) };
    let mut failed = 0;
    let mut first_error = None;
    for r in opened {
        match r {
            Ok(Some(h)) => population.streams.push(h),
            Ok(None) => {}
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        eprintln!("mcpfleet-bench: {failed} of {} sessions or streams not opened", n_idle + n_streams);
        return Err(e);
    }
    // Let the replicas settle (the streams' first lease renewals, Redis's rehashing) before reading.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mem1 = used_memory(&a.redis_urls).await?;
    let rss1: Option<f64> = a.pids.iter().map(|p| rss_bytes(*p)).sum();
    // At rest: no traffic but the population's own.
    let idle = Duration::from_secs(a.idle_secs);
    let cpu0: Option<f64> = a.pids.iter().map(|p| cpu_seconds(*p)).sum();
    let redis0 = redis_counters(&a.redis_urls).await?;
    let t0 = Instant::now();
    tokio::time::sleep(idle).await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu1: Option<f64> = a.pids.iter().map(|p| cpu_seconds(*p)).sum();
    let redis1 = redis_counters(&a.redis_urls).await?;
    #[expect(clippy::cast_precision_loss, reason = "counts")]
    let (all, streams) = ((n_idle + n_streams) as f64, n_streams as f64);
    let at_rest = |d: Option<f64>| d.filter(|_| idle > Duration::ZERO).map(|d| d / secs);
    let per_stream_per_sec = |d: Option<f64>| at_rest(d).filter(|_| n_streams > 0).map(|d| d / streams * 1e6);
    let replica_idle = match (cpu0, cpu1) {
        (Some(x), Some(y)) => Some(y - x),
        _ => None,
    };
    let (redis_idle, redis_cmds) = match (redis0, redis1) {
        (Some(x), Some(y)) => (Some(y.cpu_seconds - x.cpu_seconds), Some(y.commands - x.commands)),
        _ => (None, None),
    };
    #[expect(clippy::cast_precision_loss, reason = "counts")]
    let row = json!({
        "label": a.label,
        "phase": "population",
        "idle_sessions": n_idle,
        "streams": n_streams,
        "opening_secs": opening_secs,
        "redis_used_memory": mem1,
        "redis_bytes_per_session": (all > 0.0).then(|| (mem1 - mem0) / all),
        "replica_rss_bytes": rss1,
        "replica_rss_bytes_per_session": match (rss0, rss1) {
            (Some(x), Some(y)) if all > 0.0 => Some((y - x) / all),
            _ => None,
        },
        "idle_secs": secs,
        // At rest, in all (the replicas' and Redis's own background included): CPU ms and commands a second.
        "redis_cpu_ms_per_sec_at_rest": at_rest(redis_idle).map(|c| c * 1e3),
        "replica_cpu_ms_per_sec_at_rest": at_rest(replica_idle).map(|c| c * 1e3),
        "redis_cmds_per_sec_at_rest": at_rest(redis_cmds.map(|c| c as f64)),
        // The same divided by the streams (the background of an empty fleet not taken off: the report does that).
        "redis_cpu_us_per_stream_per_sec": per_stream_per_sec(redis_idle),
        "replica_cpu_us_per_stream_per_sec": per_stream_per_sec(replica_idle),
        "redis_cmds_per_stream_per_sec": per_stream_per_sec(redis_cmds.map(|c| c as f64 / 1e6)),
    });
    if a.json {
        println!("{row}");
    } else {
        eprintln!("population: {row}");
    }
    Ok(population)
}

/// Whether the population's figures can be read: Redis is needed for its memory.
pub(crate) fn check(a: &crate::Args) -> Result<(), BenchError> {
    if a.background_sessions + a.background_streams > 0 && a.redis_urls.is_empty() {
        return Err(BenchError::Usage("--background-sessions and --background-streams need --redis-url"));
    }
    if a.background_streams > 0 && a.generation == "2026" {
        return Err(BenchError::Usage("--background-streams are 2025-11-25 GET streams: not with --generation 2026"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn rss_of_this_process_is_read() {
        assert!(super::rss_bytes(std::process::id()).is_some_and(|b| b > 0.0));
    }
}
