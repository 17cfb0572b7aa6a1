//! mcpfleet-core is the shared vocabulary of every other crate: who is calling ([`UserKey`], [`Principal`],
//! [`Scopes`]), what a tool may cost ([`Quota`], and the flag syntax of quotas and durations), which protocol
//! revision a request speaks ([`ProtocolVersion`]), JSON-RPC error [`code`]s, and JSON as requests carry it
//! ([`JsonObject`], [`parse_strict`]), the audit records of a call and of a downstream token ([`AuditRecord`],
//! [`DownstreamRecord`], [`AuditSink`]), and how bytes
//! are spelled in hex ([`hex`]), and how text goes into markup ([`escape_markup`]).
//!
//! It owns no behaviour that needs a runtime: it must not depend on tokio, axum, Redis or any other mcpfleet
//! crate, so that auth, limits and the tools framework can share these types without depending on each other or
//! compiling a store.

mod audit;
pub mod code;
mod hex;
mod json;
mod markup;
mod principal;
mod quota;
pub mod time;
mod user;
mod version;

pub use audit::{AuditRecord, AuditSink, DownstreamEvent, DownstreamRecord};
pub use hex::hex;
pub use json::{JsonObject, parse_strict};
pub use markup::escape_markup;
pub use principal::{Assigner, PlanTag, Principal, Proof, Scopes, user_key};
pub use quota::{HumanDuration, Quota, SyntaxError, parse_duration};
pub use user::{UserKey, is_token_char};
pub use version::{ProtocolVersion, UnknownVersion};
