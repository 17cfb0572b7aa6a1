//! [`PgRepo`]: the reference tools' domain on a shared PostgreSQL (`migrations/0001_reference.sql`), so that any
//! replica serves any call: a draft minted on one replica is confirmed on another, once.
//!
//! Every statement is parameterized and prepared at run time (`prepare_cached`), never built from input. Each
//! method runs under one deadline ([`PgOptions::timeout`]) covering the wait for a pooled connection and every
//! statement; past it the method gives up with [`RepoError::Unavailable`] and the connection is closed rather than
//! returned to the pool, so a statement still running cannot hold up the next caller.

use crate::repo::{
    Confirmed, Customer, Doc, Draft, DraftStatus, Drafted, Order, RepoError, Report, Repository, Ticket, mint_draft_id,
};
use deadpool_postgres::{GenericClient, Object, Pool, PoolError};
use mcpfleet_core::Principal;
use mcpfleet_tools::async_trait;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::time::{Instant, timeout_at};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::FromSql;

/// How a [`PgRepo`] behaves.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// The budget of each repository call: the wait for a pooled connection plus every statement. Past it, the
    /// call fails with [`RepoError::Unavailable`].
    pub timeout: Duration,
    /// Development only: a tenant with no row in `tenants` acts on one of the demo tenants (`tenants.demo`),
    /// chosen by a stable hash of its name. Without it, such a tenant simply finds nothing.
    pub assign_demo_tenant: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(5), assign_demo_tenant: false }
    }
}

/// How long a resolution of tenants to demo tenants is trusted before the list is read again.
const DEMO_CACHE_TTL: Duration = Duration::from_secs(60);
/// At most this many resolutions are cached; then the cache starts over.
const DEMO_CACHE_MAX: usize = 10_000;

/// The demo tenants and the tenants assigned to them.
#[derive(Debug, Default)]
struct DemoCache {
    fetched: Option<Instant>,
    demo: Vec<String>,
    resolved: HashMap<String, String>,
}

/// The reference repository on PostgreSQL.
pub struct PgRepo {
    pool: Pool,
    options: PgOptions,
    demo: Mutex<DemoCache>,
}

impl std::fmt::Debug for PgRepo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgRepo").field("options", &self.options).field("pool", &self.pool.status()).finish()
    }
}

/// The index of `tenant` among `n` demo tenants: the first 8 bytes of a domain-separated SHA-256 of its name,
/// big-endian, modulo `n`. Stable across processes, versions and platforms (unlike a `HashMap` hasher).
pub(crate) fn demo_index(tenant: &str, n: usize) -> usize {
    let digest = Sha256::new().chain_update(b"mcpfleet/demo-tenant/v1\0").chain_update(tenant.as_bytes()).finalize();
    let mut head = [0_u8; 8];
    head.copy_from_slice(&digest[..8]);
    let n = n.max(1) as u64;
    usize::try_from(u64::from_be_bytes(head) % n).unwrap_or(0)
}

/// A pool error: a wait or connect timeout, a closed pool or a connection that failed is [`RepoError::Unavailable`].
pub(crate) fn pool_error(e: PoolError) -> RepoError {
    match e {
        PoolError::Timeout(t) => RepoError::Unavailable(format!("no database connection in time ({t:?})")),
        PoolError::Closed => RepoError::Unavailable("the connection pool is closed".to_owned()),
        PoolError::Backend(e) => db_error(e),
        e @ (PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_)) => RepoError::Internal(e.to_string()),
    }
}

/// A statement's error: [`RepoError::Unavailable`] when the database cannot serve now ([`mcpfleet_db::unavailable`]),
/// else [`RepoError::Internal`] (a bug or a broken schema).
pub(crate) fn db_error(e: tokio_postgres::Error) -> RepoError {
    let text = match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    };
    if mcpfleet_db::unavailable(&e) { RepoError::Unavailable(text) } else { RepoError::Internal(text) }
}

/// Whether `e` is the check violation named `constraint`.
fn violates(e: &tokio_postgres::Error, constraint: &str) -> bool {
    e.as_db_error().is_some_and(|db| *db.code() == SqlState::CHECK_VIOLATION && db.constraint() == Some(constraint))
}

fn get<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T, RepoError> {
    row.try_get(i).map_err(|e| RepoError::Internal(format!("column {i}: {e}")))
}

fn cents(v: i64) -> Result<u64, RepoError> {
    u64::try_from(v).map_err(|_| RepoError::Internal(format!("a negative amount: {v}")))
}

const DEMO_RESOLVE: &str = "SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1), \
                            ARRAY(SELECT id FROM tenants WHERE demo ORDER BY id)";

const SEARCH: &str = "SELECT d.id, d.title, d.body \
                        FROM documents d, websearch_to_tsquery('english', $2) AS q \
                       WHERE d.tenant = $1 AND d.search @@ q \
                       ORDER BY ts_rank(d.search, q) DESC, d.id \
                       LIMIT $3";

const CUSTOMER: &str = "SELECT c.id, c.name, c.plan, c.note, \
                               (SELECT count(*) FROM tickets t \
                                 WHERE t.tenant = c.tenant AND t.customer_id = c.id AND t.status = 'open') \
                          FROM customers c WHERE c.tenant = $1 AND c.id = $2";

const ORDER: &str = "SELECT id, customer_id, amount_cents, refunded_cents FROM orders WHERE tenant = $1 AND id = $2";

/// Drafts the order's whole remainder in one statement. The order row is locked (FOR SHARE) from the read of its
/// remainder to the end of the statement, so a confirmation of another draft cannot slip in between. Returns the
/// remainder (NULL: no such order) and the drafted amount (NULL: nothing was drafted).
const CREATE_DRAFT: &str = "WITH o AS ( \
                                SELECT tenant, id, amount_cents - refunded_cents AS remaining \
                                  FROM orders WHERE tenant = $2 AND id = $3 FOR SHARE \
                            ), d AS ( \
                                INSERT INTO refund_drafts (id, tenant, order_id, owner, amount_cents) \
                                SELECT $1, tenant, id, $4, remaining FROM o WHERE remaining > 0 \
                                RETURNING amount_cents \
                            ) \
                            SELECT (SELECT remaining FROM o), (SELECT amount_cents FROM d)";

/// Claims a live draft. Under READ COMMITTED, a concurrent claim of the same row waits for the winner's commit,
/// then re-evaluates the WHERE on the new row version and matches nothing.
const CLAIM_DRAFT: &str = "UPDATE refund_drafts SET status = 'confirmed', confirmed_at = now() \
                            WHERE id = $1 AND tenant = $2 AND owner = $3 AND status = 'draft' AND expires_at > now() \
                           RETURNING order_id, amount_cents";

/// Refunds a claimed draft's amount; the orders CHECK refuses to go past the order's amount.
const REFUND_ORDER: &str = "UPDATE orders SET refunded_cents = refunded_cents + $3 WHERE tenant = $1 AND id = $2";

const READ_DRAFT: &str = "SELECT order_id, amount_cents, status, expires_at <= now() \
                            FROM refund_drafts WHERE id = $1 AND tenant = $2 AND owner = $3";

const EXPIRE_DRAFT: &str = "UPDATE refund_drafts SET status = 'expired' WHERE id = $1 AND status = 'draft'";

const REPORT: &str = "SELECT id, ready, rows FROM exports WHERE tenant = $1 AND id = $2";

const TICKET_BY_ID: &str = "SELECT id, project, number, title, body FROM tickets WHERE tenant = $1 AND id = $2";

const TICKET_BY_REFERENCE: &str = "SELECT id, project, number, title, body FROM tickets \
                                    WHERE tenant = $1 AND project = $2 AND number = $3";

impl PgRepo {
    /// A repository over `pool` (connected to a database migrated with `migrations/0001_reference.sql`).
    #[must_use]
    pub fn new(pool: Pool, options: PgOptions) -> Self {
        Self { pool, options, demo: Mutex::default() }
    }

    fn unavailable(&self) -> RepoError {
        RepoError::Unavailable(format!("no answer within {:?}", self.options.timeout))
    }

    /// A pooled connection and the tenant `owner` acts on, before `deadline`.
    async fn begin(&self, owner: &Principal, deadline: Instant) -> Result<(Object, String), RepoError> {
        let client = match timeout_at(deadline, self.pool.get()).await {
            Ok(client) => client.map_err(pool_error)?,
            Err(_) => return Err(self.unavailable()),
        };
        let tenant = match timeout_at(deadline, self.tenant(&client, owner)).await {
            Ok(tenant) => tenant,
            Err(_) => {
                drop(Object::take(client));
                return Err(self.unavailable());
            }
        }?;
        Ok((client, tenant))
    }

    /// The outcome of a method's statements on `client`. On a timeout the connection is closed, not pooled: its
    /// statement may still be running.
    fn settle<T>(
        &self,
        client: Object,
        outcome: Result<Result<T, RepoError>, tokio::time::error::Elapsed>,
    ) -> Result<T, RepoError> {
        match outcome {
            Ok(result) => result,
            Err(_) => {
                drop(Object::take(client));
                Err(self.unavailable())
            }
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.options.timeout
    }

    /// The tenant `owner` acts on: `owner.tenant()`, or with [`PgOptions::assign_demo_tenant`] and no row of its
    /// own in `tenants`, a demo tenant ([`demo_index`]).
    async fn tenant(&self, client: &Object, owner: &Principal) -> Result<String, RepoError> {
        let tenant = owner.tenant();
        if !self.options.assign_demo_tenant {
            return Ok(tenant.to_owned());
        }
        {
            let cache = self.demo.lock().unwrap_or_else(PoisonError::into_inner);
            let fresh = cache.fetched.is_some_and(|at| at.elapsed() < DEMO_CACHE_TTL);
            if let Some(resolved) = cache.resolved.get(tenant).filter(|_| fresh) {
                return Ok(resolved.clone());
            }
        }
        let stmt = client.prepare_cached(DEMO_RESOLVE).await.map_err(db_error)?;
        let row = client.query_one(&stmt, &[&tenant]).await.map_err(db_error)?;
        let (exists, demo): (bool, Vec<String>) = (get(&row, 0)?, get(&row, 1)?);
        let resolved = match demo.get(demo_index(tenant, demo.len())) {
            Some(d) if !exists => d.clone(),
            _ => tenant.to_owned(),
        };
        let mut cache = self.demo.lock().unwrap_or_else(PoisonError::into_inner);
        let fresh = cache.fetched.is_some_and(|at| at.elapsed() < DEMO_CACHE_TTL);
        if !fresh || cache.demo != demo || cache.resolved.len() >= DEMO_CACHE_MAX {
            *cache = DemoCache { fetched: Some(Instant::now()), demo, resolved: HashMap::new() };
        }
        cache.resolved.insert(tenant.to_owned(), resolved.clone());
        Ok(resolved)
    }
}

async fn query_opt(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Option<Row>, RepoError> {
    let stmt = client.prepare_cached(sql).await.map_err(db_error)?;
    client.query_opt(&stmt, params).await.map_err(db_error)
}

fn ticket_of(row: &Row) -> Result<Ticket, RepoError> {
    let number: i32 = get(row, 2)?;
    Ok(Ticket {
        id: get(row, 0)?,
        project: get(row, 1)?,
        number: u32::try_from(number).map_err(|_| RepoError::Internal(format!("ticket number {number}")))?,
        title: get(row, 3)?,
        body: get(row, 4)?,
    })
}

/// `exports.rows`: `[{"metric": "refunds", "value": 14}, ...]`.
fn report_rows(rows: &Value) -> Result<Vec<(String, u64)>, RepoError> {
    let bad = || RepoError::Internal("exports.rows is not an array of {metric, value}".to_owned());
    rows.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|r| Some((r.get("metric")?.as_str()?.to_owned(), r.get("value")?.as_u64()?)))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)
}

async fn confirm(client: &mut Object, tenant: &str, owner: &str, id: &str) -> Result<Confirmed, RepoError> {
    let draft = |order_id: String, amount_cents: u64, status: DraftStatus| Draft {
        id: id.to_owned(),
        order_id,
        amount_cents,
        status,
    };
    // A draft still in 'draft' that the claim did not match must have changed in between: look again (twice).
    // A transaction dropped on an early return rolls back (tokio-postgres sends the ROLLBACK before any next
    // statement on the connection).
    for _ in 0..3 {
        let tx = client.transaction().await.map_err(db_error)?;
        if let Some(row) = query_opt(&tx, CLAIM_DRAFT, &[&id, &tenant, &owner]).await? {
            let (order_id, amount): (String, i64) = (get(&row, 0)?, get(&row, 1)?);
            let refund = tx.prepare_cached(REFUND_ORDER).await.map_err(db_error)?;
            return match tx.execute(&refund, &[&tenant, &order_id, &amount]).await {
                Ok(1) => {
                    tx.commit().await.map_err(db_error)?;
                    Ok(Confirmed::Now(draft(order_id, cents(amount)?, DraftStatus::Confirmed)))
                }
                Ok(n) => Err(RepoError::Internal(format!("refunding draft {id} updated {n} orders"))),
                Err(e) if violates(&e, "orders_refunded_within_amount") => {
                    tx.rollback().await.map_err(db_error)?;
                    Ok(Confirmed::Exceeds(draft(order_id, cents(amount)?, DraftStatus::Draft)))
                }
                Err(e) => Err(db_error(e)),
            };
        }
        let Some(row) = query_opt(&tx, READ_DRAFT, &[&id, &tenant, &owner]).await? else {
            tx.rollback().await.map_err(db_error)?;
            return Ok(Confirmed::NotFound);
        };
        let (order_id, amount, status, lapsed): (String, i64, String, bool) =
            (get(&row, 0)?, get(&row, 1)?, get(&row, 2)?, get(&row, 3)?);
        let status =
            DraftStatus::parse(&status).ok_or_else(|| RepoError::Internal(format!("draft status {status}")))?;
        let d = |status| cents(amount).map(|a| draft(order_id.clone(), a, status));
        match status {
            DraftStatus::Confirmed => return Ok(Confirmed::Already(d(status)?)),
            DraftStatus::Cancelled => return Ok(Confirmed::Cancelled(d(status)?)),
            DraftStatus::Expired => return Ok(Confirmed::Expired(d(status)?)),
            DraftStatus::Draft if lapsed => {
                let expire = tx.prepare_cached(EXPIRE_DRAFT).await.map_err(db_error)?;
                tx.execute(&expire, &[&id]).await.map_err(db_error)?;
                tx.commit().await.map_err(db_error)?;
                return Ok(Confirmed::Expired(d(DraftStatus::Expired)?));
            }
            DraftStatus::Draft => tx.rollback().await.map_err(db_error)?,
        }
    }
    Err(RepoError::Internal(format!("refund draft {id} neither confirmed nor settled")))
}

#[async_trait]
impl Repository for PgRepo {
    async fn search_docs(&self, owner: &Principal, query: &str, limit: usize) -> Result<Vec<Doc>, RepoError> {
        let deadline = self.deadline();
        let (client, tenant) = self.begin(owner, deadline).await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // PostgreSQL text cannot hold NUL, which JSON can: a NUL separates words like a space does.
        let query = query.replace('\0', " ");
        let outcome = timeout_at(deadline, async {
            let stmt = client.prepare_cached(SEARCH).await.map_err(db_error)?;
            let rows = client.query(&stmt, &[&tenant, &query, &limit]).await.map_err(db_error)?;
            rows.iter().map(|r| Ok(Doc { id: get(r, 0)?, title: get(r, 1)?, body: get(r, 2)? })).collect()
        })
        .await;
        self.settle(client, outcome)
    }

    async fn customer(&self, owner: &Principal, id: &str) -> Result<Option<Customer>, RepoError> {
        let deadline = self.deadline();
        let (client, tenant) = self.begin(owner, deadline).await?;
        let outcome = timeout_at(deadline, async {
            let Some(r) = query_opt(&client, CUSTOMER, &[&tenant, &id]).await? else { return Ok(None) };
            let open: i64 = get(&r, 4)?;
            Ok(Some(Customer {
                id: get(&r, 0)?,
                name: get(&r, 1)?,
                plan: get(&r, 2)?,
                note: get(&r, 3)?,
                open_tickets: u32::try_from(open).unwrap_or(u32::MAX),
            }))
        })
        .await;
        self.settle(client, outcome)
    }

    async fn order(&self, owner: &Principal, id: &str) -> Result<Option<Order>, RepoError> {
        let deadline = self.deadline();
        let (client, tenant) = self.begin(owner, deadline).await?;
        let outcome = timeout_at(deadline, async {
            let Some(r) = query_opt(&client, ORDER, &[&tenant, &id]).await? else { return Ok(None) };
            Ok(Some(Order {
                id: get(&r, 0)?,
                customer_id: get(&r, 1)?,
                amount_cents: cents(get(&r, 2)?)?,
                refunded_cents: cents(get(&r, 3)?)?,
            }))
        })
        .await;
        self.settle(client, outcome)
    }

    async fn create_draft(&self, owner: &Principal, order: &Order) -> Result<Drafted, RepoError> {
        let deadline = self.deadline();
        let (client, tenant) = self.begin(owner, deadline).await?;
        let outcome = timeout_at(deadline, async {
            let id = mint_draft_id();
            let user = owner.user.as_str();
            let Some(r) = query_opt(&client, CREATE_DRAFT, &[&id, &tenant, &order.id, &user]).await? else {
                return Err(RepoError::Internal("drafting returned no row".to_owned()));
            };
            let (remaining, drafted): (Option<i64>, Option<i64>) = (get(&r, 0)?, get(&r, 1)?);
            match (remaining, drafted) {
                (None, _) => Err(RepoError::Internal(format!("order {} vanished while drafting", order.id))),
                (Some(_), None) => Ok(Drafted::NothingToRefund),
                (Some(_), Some(amount)) => Ok(Drafted::Draft(Draft {
                    id,
                    order_id: order.id.clone(),
                    amount_cents: cents(amount)?,
                    status: DraftStatus::Draft,
                })),
            }
        })
        .await;
        self.settle(client, outcome)
    }

    async fn confirm_draft(&self, owner: &Principal, draft_id: &str) -> Result<Confirmed, RepoError> {
        let deadline = self.deadline();
        let (mut client, tenant) = self.begin(owner, deadline).await?;
        let outcome = timeout_at(deadline, confirm(&mut client, &tenant, owner.user.as_str(), draft_id)).await;
        self.settle(client, outcome)
    }

    async fn report(&self, owner: &Principal, id: &str) -> Result<Option<Report>, RepoError> {
        let deadline = self.deadline();
        let (client, tenant) = self.begin(owner, deadline).await?;
        let outcome = timeout_at(deadline, async {
            let Some(r) = query_opt(&client, REPORT, &[&tenant, &id]).await? else { return Ok(None) };
            let rows: Value = get(&r, 2)?;
            Ok(Some(Report { id: get(&r, 0)?, ready: get(&r, 1)?, rows: report_rows(&rows)? }))
        })
        .await;
        self.settle(client, outcome)
    }

    async fn ticket(
        &self,
        owner: &Principal,
        id: Option<&str>,
        by: Option<(&str, u32)>,
    ) -> Result<Option<Ticket>, RepoError> {
        let deadline = self.deadline();
        let (client, tenant) = self.begin(owner, deadline).await?;
        let outcome = timeout_at(deadline, async {
            let row = match (id, by) {
                (Some(id), _) => query_opt(&client, TICKET_BY_ID, &[&tenant, &id]).await?,
                (None, Some((project, number))) => match i32::try_from(number) {
                    Ok(n) => query_opt(&client, TICKET_BY_REFERENCE, &[&tenant, &project, &n]).await?,
                    Err(_) => None,
                },
                (None, None) => None,
            };
            row.as_ref().map(ticket_of).transpose()
        })
        .await;
        self.settle(client, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_index_is_stable_and_spread() {
        // Pinned (computed independently: SHA-256 of b"mcpfleet/demo-tenant/v1\0" + name): the assignment must not
        // change between builds, or tenants would move between demo data sets.
        let of = |n| ["alice", "bob", "acme", ""].map(|t| demo_index(t, n));
        assert_eq!(of(10), [8, 6, 0, 5]);
        assert_eq!(of(7), [2, 5, 2, 3]);
        let mut hits = [0_u32; 10];
        for i in 0..10_000 {
            hits[demo_index(&format!("tenant-{i}"), 10)] += 1;
        }
        assert!(hits.iter().all(|h| (800..1200).contains(h)), "{hits:?}");
        assert_eq!(demo_index("anyone", 1), 0);
        assert_eq!(demo_index("anyone", 0), 0);
    }

    #[test]
    fn report_rows_keep_their_order_and_refuse_other_shapes() {
        let rows = serde_json::json!([{ "metric": "tickets", "value": 230 }, { "metric": "refunds", "value": 14 }]);
        assert_eq!(report_rows(&rows).unwrap(), vec![("tickets".to_owned(), 230), ("refunds".to_owned(), 14)]);
        assert!(report_rows(&serde_json::json!({ "tickets": 1 })).is_err());
        assert!(report_rows(&serde_json::json!([{ "metric": "x", "value": -1 }])).is_err());
    }
}
