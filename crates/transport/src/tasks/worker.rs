//! A replica's task loops: the dispatcher takes queued work while a worker is free, and the keeper renews the
//! leases of the runs held here, sweeps the shards for leases that ran out (a dead replica's tasks), and reads the
//! queue for the metrics.

use super::link::TaskLink;
use super::notice::{announce_end, notify};
use super::principal::principal_from;
use crate::AppState;
use crate::call::Admitted;
use mcpfleet_state::{AfterTake, Queued, Requeue, TaskEnd, TaskKey, TaskStatus};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long an idle dispatcher waits before looking at the queue again. Work queued anywhere rings the queue's bell
/// and wakes it at once; this catches a ring missed across a reconnect, and entries another replica took and never
/// started.
const IDLE_POLL: Duration = Duration::from_secs(2);
/// The same, while the bell cannot be heard (the subscription failed).
const DEAF_POLL: Duration = Duration::from_millis(200);
/// How often the queue is read for the metrics.
const STATS_EVERY: Duration = Duration::from_secs(5);
/// Most expired leases one sweep of one shard takes.
const SWEEP_BATCH: usize = 32;
/// A queue consumer (a replica) idle this long, holding nothing, is removed from the group.
const CONSUMER_IDLE: Duration = Duration::from_secs(3600);
/// How often the keeper removes such consumers.
const TIDY_EVERY: Duration = Duration::from_secs(300);

/// Starts this replica's task loops, once (a second call does nothing). They stop taking work when the tasks'
/// stop fires (the drain), and end with the process.
pub fn start(app: &AppState) {
    if app.tasks.started.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    tokio::spawn(dispatch(app.clone()));
    tokio::spawn(keep(app.clone()));
}

async fn dispatch(app: AppState) {
    let tasks = app.tasks.clone();
    let shards = tasks.config().shards.max(1);
    let mut next_shard = 0u16;
    let mut bell = app.store.subscribe_queue(shards).await.ok();
    loop {
        let idle = if bell.is_some() { IDLE_POLL } else { DEAF_POLL };
        let rung = async {
            match bell.as_mut() {
                Some(b) => b.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tasks.stop.cancelled() => {
                // Leaving the queue: this replica's consumer goes (unless it still holds entries).
                for shard in 0..shards {
                    let _ = app.store.tidy_consumers(shard, Some(tasks.replica()), CONSUMER_IDLE).await;
                }
                return;
            }
            () = tasks.wake.notified() => {}
            ring = rung => {
                if ring.is_none() {
                    bell = app.store.subscribe_queue(shards).await.ok();
                }
            }
            () = tokio::time::sleep(idle) => {}
        }
        // Take work while there is some and a worker is free, a shard after the other.
        let mut empty = 0;
        while empty < shards && !tasks.stop.is_cancelled() {
            let free = tasks.config().workers.saturating_sub(tasks.busy_workers());
            if free == 0 {
                break;
            }
            let shard = next_shard;
            next_shard = (next_shard + 1) % shards;
            match app.store.dequeue(shard, tasks.replica(), free, tasks.config().lease).await {
                Ok(entries) if entries.is_empty() => empty += 1,
                Ok(entries) => {
                    empty = 0;
                    for q in entries {
                        take(&app, shard, q).await;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, shard, "task queue: dequeue failed");
                    empty += 1;
                }
            }
        }
    }
}

/// Starts a taken entry's run, or drops a stale entry.
async fn take(app: &AppState, shard: u16, q: Queued) {
    let tasks = &app.tasks;
    let lease = tasks.config().lease;
    let work = match app.store.start_task(&q.key, q.generation, tasks.replica()).await {
        Ok(w) => w,
        Err(e) => {
            // Left taken: another replica (or this one) claims it once it has been taken for a lease.
            tracing::debug!(error = %e, "task start failed");
            return;
        }
    };
    let Some(work) = work else {
        // Stale: the task ended, was cancelled, or runs under a newer generation.
        let then = match app.store.get_task(&q.key).await {
            Ok(Some(v)) if !v.status.is_terminal() => AfterTake::Keep,
            _ => AfterTake::Release,
        };
        let _ = app.store.settle(shard, &q, then).await;
        return;
    };
    if let Err(e) = app.store.settle(shard, &q, AfterTake::Lease(lease)).await {
        tracing::debug!(error = %e, "task entry not settled; the run goes on");
    }
    let key = q.key.clone();
    let link = TaskLink::hold(app, key.clone(), q.generation, work.rerunnable, true);
    let principal = principal_from(&key.user, &work.principal);
    let args = match serde_json::from_str::<Value>(&work.args) {
        Ok(Value::Object(a)) => Some(a),
        _ => None,
    };
    let (Some(principal), Some(args)) = (principal, args) else {
        let damaged = (crate::code::INTERNAL_ERROR, "the task's record is damaged".to_owned());
        link.end(crate::call::Finished::Answer(Err(damaged))).await;
        return;
    };
    let capabilities = serde_json::from_str(&work.capabilities).unwrap_or_else(|_| json!({}));
    let run = Arc::new(super::run::TaskRun {
        app: app.clone(),
        principal,
        trace_id: work.trace_id.clone(),
        span: opentelemetry::Context::new(),
        capabilities,
        link,
        cancel: tokio_util::sync::CancellationToken::new(),
        counts: Mutex::default(),
    });
    tracing::info!(task = ?key.id, tool.name = %work.tool, generation = q.generation, trace_id = %work.trace_id, "task run started");
    let admitted = Admitted { name: work.tool, args, slot: None, quota_charged: false, idem: None };
    app.calls.spawn(crate::call::drive(run, admitted));
}

async fn keep(app: AppState) {
    let tasks = app.tasks.clone();
    let lease = tasks.config().lease;
    let renew_every = (lease / 3).max(Duration::from_millis(100));
    let mut renew = tokio::time::interval(renew_every);
    // A dead replica's tasks are taken over within a lease and a quarter.
    let mut sweep = tokio::time::interval((lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(5)));
    let mut stats = tokio::time::interval(STATS_EVERY);
    let mut tidy = tokio::time::interval(TIDY_EVERY);
    for t in [&mut renew, &mut sweep, &mut stats, &mut tidy] {
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    loop {
        tokio::select! {
            _ = renew.tick() => renew_leases(&app, lease).await,
            _ = sweep.tick() => {
                // A replica that is shutting down leaves the sweeping to the others.
                if !tasks.stop.is_cancelled() {
                    sweep_shards(&app).await;
                }
            }
            _ = stats.tick() => read_stats(&app).await,
            _ = tidy.tick() => {
                for shard in 0..tasks.config().shards.max(1) {
                    if let Err(e) = app.store.tidy_consumers(shard, None, CONSUMER_IDLE).await {
                        tracing::debug!(error = %e, shard, "task queue: consumers not tidied");
                    }
                }
            }
        }
    }
}

async fn renew_leases(app: &AppState, lease: Duration) {
    for (shard, runs) in app.tasks.held_by_shard() {
        match app.store.renew_task_leases(shard, &runs, lease).await {
            Ok(lost) => {
                for (key, generation) in lost {
                    app.tasks.lost(&key, generation);
                }
            }
            Err(e) => tracing::debug!(error = %e, shard, "task leases not renewed; retrying"),
        }
    }
}

async fn sweep_shards(app: &AppState) {
    let tasks = &app.tasks;
    let grace = tasks.config().lease;
    for shard in 0..tasks.config().shards.max(1) {
        let due = match app.store.expired_task_leases(shard, grace, SWEEP_BATCH).await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, shard, "task sweep failed");
                continue;
            }
        };
        for (key, generation) in due {
            if let Err(e) = reclaim(app, shard, &key, generation).await {
                // Its lease is held for the grace: a sweep after that tries again.
                tracing::warn!(error = %e, "task reclaim failed; retrying later");
            }
        }
    }
}

/// What becomes of a task whose lease ran out: its replica died (or could not reach the store for a whole lease).
async fn reclaim(app: &AppState, shard: u16, key: &TaskKey, generation: u64) -> Result<(), mcpfleet_state::StateError> {
    let tasks = &app.tasks;
    let store = &app.store;
    let lease = tasks.config().lease;
    if tasks.holds(key, generation) {
        // Ours, and alive: the renewal was late.
        let _ = store.renew_task_leases(shard, &[(key.clone(), generation)], lease).await?;
        return Ok(());
    }
    let Some(v) = store.get_task(key).await? else {
        return store.release_task_lease(shard, key, generation).await;
    };
    if v.status.is_terminal() {
        return store.release_task_lease(shard, key, generation).await;
    }
    if v.generation != generation {
        // A newer run owns the task. If it is queued, make sure it has its entry (its enqueue may have been lost
        // with the replica that requeued it); a duplicate entry is dropped when taken.
        if v.status == TaskStatus::Queued {
            store.enqueue(shard, key, v.generation, lease).await?;
        }
        return store.release_task_lease(shard, key, generation).await;
    }
    if v.status == TaskStatus::Queued {
        // Queued, but its entry is gone (lost, or never written): queue it again.
        store.enqueue(shard, key, generation, lease).await?;
        tasks.metrics().reclaims.with_label_values(&["requeued"]).inc();
        tasks.wake.notify_one();
        return Ok(());
    }
    if v.rerunnable {
        match store.requeue_task(key, generation).await? {
            Requeue::Queued(next) => {
                store.enqueue(shard, key, next, lease).await?;
                tasks.metrics().reclaims.with_label_values(&["rerun"]).inc();
                tracing::warn!(task = ?key.id, tool.name = %v.tool, generation = next, "task's replica lost: running it again");
                tasks.wake.notify_one();
            }
            // A cancellation asked of the dead run ends it cancelled.
            Requeue::Cancelled => announce_end(app, key).await,
            Requeue::Refused => {}
        }
        return store.release_task_lease(shard, key, generation).await;
    }
    if v.cancel_requested {
        // Its client asked to cancel it before its replica died: it is cancelled, not failed.
        if let Some(v) = store.finish_task(key, generation, &TaskEnd::Cancelled).await? {
            tasks.metrics().ended.with_label_values(&["cancelled"]).inc();
            notify(app, key, &v).await;
        }
        return store.release_task_lease(shard, key, generation).await;
    }
    let message = format!(
        "The replica running this task stopped before the tool {} finished, and the tool is not safe to run twice, \
         so it was not run again. Its work may be half done: check its effects before you call it again.",
        v.tool
    );
    let error = json!({ "code": crate::code::INTERNAL_ERROR, "message": message }).to_string();
    if let Some(v) = store.finish_task(key, generation, &TaskEnd::Failed { error, message }).await? {
        tasks.metrics().ended.with_label_values(&["failed"]).inc();
        tasks.metrics().reclaims.with_label_values(&["failed_replica_lost"]).inc();
        tracing::warn!(task = ?key.id, tool.name = %v.tool, "task's replica lost: the task failed (not re-runnable)");
        notify(app, key, &v).await;
    }
    store.release_task_lease(shard, key, generation).await
}

async fn read_stats(app: &AppState) {
    let (mut waiting, mut taken, mut leased, mut oldest) = (0u64, 0u64, 0u64, Duration::ZERO);
    for shard in 0..app.tasks.config().shards.max(1) {
        match app.store.queue_stats(shard).await {
            Ok(s) => {
                waiting += s.waiting;
                taken += s.taken;
                leased += s.leased;
                oldest = oldest.max(s.oldest.unwrap_or_default());
            }
            Err(e) => {
                tracing::debug!(error = %e, shard, "task queue stats failed");
                return;
            }
        }
    }
    let m = app.tasks.metrics();
    m.queue_depth.set(i64::try_from(waiting).unwrap_or(i64::MAX));
    m.queue_taken.set(i64::try_from(taken).unwrap_or(i64::MAX));
    m.leased.set(i64::try_from(leased).unwrap_or(i64::MAX));
    m.queue_oldest.set(oldest.as_secs_f64());
}
