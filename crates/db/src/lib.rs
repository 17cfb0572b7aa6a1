//! mcpfleet-db owns PostgreSQL, the system of record: the connection pool and its TLS ([`Database`]), the
//! migrations embedded from the top-level `migrations/` folder and their runner ([`migrate`]), and the audit trail
//! of tool calls ([`audit`]): a per-replica queue flushed in batches, hash chains, monthly partitions and their
//! retention, `verify` and `export`.
//!
//! Redis stays the fast, disposable layer; nothing here is on a call's path except a record pushed to the audit
//! queue, which never waits. This crate depends on the core vocabulary only: it must not depend on the state,
//! transport, auth, limits or tools crates, and none of them may depend on it (the server wires it in; the
//! reference catalog uses its error classification, [`unavailable`]).

pub mod audit;
mod connect;
mod error;
pub mod migrate;
mod month;
pub mod policy;

pub use connect::{Database, DbSettings};
pub use error::{DbError, unavailable};
pub use mcpfleet_core::time::rfc3339;
pub use month::Month;
