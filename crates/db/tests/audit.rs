//! The audit trail against a real PostgreSQL: chains written by the writer verify; retention drops whole months
//! after checkpointing each chain, and verify continues from the checkpoint; a full queue drops and counts, and
//! the chain says how many went.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use mcpfleet_core::{AuditRecord, AuditSink as _};
use mcpfleet_db::audit::{self, DbMetrics, Writer, WriterConfig, partitions};
use mcpfleet_db::{Database, DbSettings, Month, migrate};
use mcpfleet_testkit::PostgresServer;
use std::time::{Duration, SystemTime};

fn record(at: SystemTime, n: u64) -> AuditRecord {
    AuditRecord {
        at,
        tool: "search_docs".to_owned(),
        outcome: "ok",
        principal: "p".repeat(24),
        client_id: Some("cli".to_owned()),
        duration: Duration::from_micros(1234),
        trace_id: format!("{n:032x}"),
        args_sha256: "0".repeat(64),
        result_bytes: Some(n),
        generation: "2026",
    }
}

async fn database(pg: &PostgresServer, name: &str) -> Database {
    pg.create_database(name);
    let db =
        Database::new(&DbSettings { url: pg.url_for(name), pool_size: 4, timeout: Duration::from_secs(2) }).unwrap();
    assert_eq!(migrate::apply(&db).await.unwrap().len(), migrate::MIGRATIONS.len());
    db
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_old_months_and_verify_resumes_from_the_checkpoint() {
    let pg = PostgresServer::start();
    let db = database(&pg, "retention").await;
    let now = SystemTime::now();
    let old = Month::of(now).plus(-14).start() + Duration::from_secs(3600);
    partitions::ensure(&db, old, 0).await.unwrap();
    partitions::ensure(&db, now, 1).await.unwrap();
    let cfg =
        WriterConfig { replica: "r1".to_owned(), buffer: 10_000, batch: 50, interval: Duration::from_millis(100) };
    let w = Writer::start(db.clone(), cfg, DbMetrics::detached().unwrap());
    // Old calls (the chain's first rows), then current ones, on one chain.
    for n in 0..30 {
        w.record(record(old + Duration::from_secs(n), n));
    }
    for n in 30..60 {
        w.record(record(now, n));
    }
    assert_eq!(w.close(Duration::from_secs(10)).await.dropped, 0);
    let report = audit::verify(&db).await.unwrap();
    assert_eq!(report.chains.len(), 1);
    assert!(report.chains[0].ended && report.chains[0].finding.is_none(), "{report:?}");
    assert_eq!(report.rows(), 61);

    let dropped = partitions::prune(&db, now, 12).await.unwrap();
    assert_eq!(dropped, vec![Month::of(old)]);
    assert_eq!(pg.psql("retention", "SELECT count(*) FROM audit_events").trim(), "31");
    assert_eq!(pg.psql("retention", "SELECT seq FROM audit_checkpoints").trim(), "30");
    let report = audit::verify(&db).await.unwrap();
    let c = &report.chains[0];
    assert_eq!((c.from_checkpoint, c.rows, c.ended, &c.finding), (30, 31, true, &None), "{report:?}");
    // Again: nothing older is left.
    assert!(partitions::prune(&db, now, 12).await.unwrap().is_empty());
    // Deleting the first row after the checkpoint is still caught.
    let id = c.chain_id.clone();
    pg.psql("retention", &format!("DELETE FROM audit_events WHERE chain_id = '{id}' AND seq = 31"));
    let report = audit::verify(&db).await.unwrap();
    let finding = report.chains[0].finding.as_ref().map(|f| f.0.clone());
    assert_eq!(finding, Some(audit::Finding::Missing { from: 31, to: 31 }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_counts_and_marks_the_gap_in_the_chain() {
    let pg = PostgresServer::start();
    let db = database(&pg, "drops").await;
    partitions::ensure(&db, SystemTime::now(), 1).await.unwrap();
    let cfg = WriterConfig { replica: "r2".to_owned(), buffer: 20, batch: 50, interval: Duration::from_millis(100) };
    let w = Writer::start(db.clone(), cfg, DbMetrics::detached().unwrap());
    pg.stop();
    let now = SystemTime::now();
    for n in 0..50 {
        w.record(record(now, n));
    }
    assert_eq!(w.pending(), 20);
    pg.start_again();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while w.pending() > 0 {
        assert!(std::time::Instant::now() < deadline, "the queue did not drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w.record(record(now, 50));
    assert_eq!(w.close(Duration::from_secs(10)).await.dropped, 0);
    let rows = pg.psql("drops", "SELECT kind, coalesce(dropped, 0) FROM audit_events ORDER BY seq");
    let kinds: Vec<&str> = rows.lines().collect();
    assert_eq!(kinds.len(), 20 + 1 + 1 + 1, "{rows}");
    assert_eq!(kinds[20], "dropped|30");
    assert_eq!(kinds[21], "call|0");
    assert_eq!(kinds[22], "end|0");
    let report = audit::verify(&db).await.unwrap();
    assert!(report.chains[0].finding.is_none() && report.chains[0].ended, "{report:?}");
}
