//! A chain's rows and their hashes: one encoding, used by the writer to chain and by `verify` to check.
//!
//! `hash = SHA-256("mcpfleet/audit/v1" ‖ prev_hash ‖ fields)`, each field length-prefixed (u32, big-endian;
//! `u32::MAX` for NULL), integers as 8 bytes big-endian, `at` in microseconds since the epoch (PostgreSQL's
//! precision). Changing any column, or moving a row, breaks its hash or the next row's link.

use sha2::{Digest as _, Sha256};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The hash before a chain's first row.
pub const GENESIS: [u8; 32] = [0; 32];

/// One row of `audit_events`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub chain_id: Arc<str>,
    pub seq: i64,
    pub at: SystemTime,
    pub kind: &'static str,
    pub replica: Arc<str>,
    pub principal: Option<String>,
    pub client_id: Option<String>,
    pub tool: Option<String>,
    pub outcome: Option<Cow<'static, str>>,
    pub duration_us: Option<i64>,
    pub trace_id: Option<String>,
    pub args_sha256: Option<String>,
    pub result_bytes: Option<i64>,
    pub generation: Option<Cow<'static, str>>,
    pub dropped: Option<i64>,
    /// What a `policy`, `revoke`, `exchange` or `authorize` row records (migrations 0003, 0004); `None` for the
    /// kinds before them.
    pub detail: Option<String>,
    pub prev_hash: [u8; 32],
    pub hash: [u8; 32],
}

/// The kinds a row may have, as stored.
pub(crate) fn kind(s: &str) -> &'static str {
    match s {
        "call" => "call",
        "dropped" => "dropped",
        "end" => "end",
        "policy" => "policy",
        "revoke" => "revoke",
        "exchange" => "exchange",
        "authorize" => "authorize",
        _ => "?",
    }
}

/// `t` to microseconds since the epoch (what PostgreSQL keeps).
pub(crate) fn micros(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
    }
}

/// `t` truncated to whole microseconds, so that what is hashed is what the database gives back.
pub(crate) fn truncate(t: SystemTime) -> SystemTime {
    let us = micros(t);
    match u64::try_from(us) {
        Ok(u) => UNIX_EPOCH + Duration::from_micros(u),
        Err(_) => UNIX_EPOCH - Duration::from_micros(us.unsigned_abs()),
    }
}

impl Row {
    /// The hash this row must carry, given its content and `prev_hash`.
    #[must_use]
    pub fn compute_hash(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"mcpfleet/audit/v1");
        h.update(self.prev_hash);
        let text = |h: &mut Sha256, s: Option<&str>| match s {
            Some(s) => {
                h.update(u32::try_from(s.len()).unwrap_or(u32::MAX - 1).to_be_bytes());
                h.update(s.as_bytes());
            }
            None => h.update(u32::MAX.to_be_bytes()),
        };
        let int = |h: &mut Sha256, n: Option<i64>| match n {
            Some(n) => {
                h.update(8_u32.to_be_bytes());
                h.update(n.to_be_bytes());
            }
            None => h.update(u32::MAX.to_be_bytes()),
        };
        text(&mut h, Some(&*self.chain_id));
        int(&mut h, Some(self.seq));
        int(&mut h, Some(micros(self.at)));
        text(&mut h, Some(self.kind));
        text(&mut h, Some(&*self.replica));
        text(&mut h, self.principal.as_deref());
        text(&mut h, self.client_id.as_deref());
        text(&mut h, self.tool.as_deref());
        text(&mut h, self.outcome.as_deref());
        int(&mut h, self.duration_us);
        text(&mut h, self.trace_id.as_deref());
        text(&mut h, self.args_sha256.as_deref());
        int(&mut h, self.result_bytes);
        text(&mut h, self.generation.as_deref());
        int(&mut h, self.dropped);
        // Hashed only when set: the rows written before the column existed keep their hashes.
        if let Some(d) = &self.detail {
            text(&mut h, Some(d));
        }
        h.finalize().into()
    }
}

/// The head of one chain: where the next row links.
#[derive(Debug)]
pub(crate) struct Chain {
    pub(crate) id: Arc<str>,
    pub(crate) replica: Arc<str>,
    seq: i64,
    prev: [u8; 32],
    last_at: SystemTime,
}

impl Chain {
    /// A new chain of `replica`, named after it, the start time and a random tag (a restarted replica starts a
    /// new chain: the old one ends with its 'end' row, or without one after a crash).
    pub(crate) fn new(replica: &str) -> Self {
        let tag: [u8; 4] = rand::random();
        let tag = mcpfleet_core::hex(&tag);
        let started = mcpfleet_core::time::epoch_ms();
        Self {
            id: format!("{replica}/{started:x}-{tag}").into(),
            replica: replica.into(),
            seq: 0,
            prev: GENESIS,
            last_at: UNIX_EPOCH,
        }
    }

    /// A blank row of `kind`, next in this chain (never earlier than the one before, whatever the clock does).
    pub(crate) fn blank(&self, kind: &'static str, at: SystemTime) -> Row {
        Row {
            chain_id: self.id.clone(),
            seq: 0,
            at: truncate(at.max(self.last_at)),
            kind,
            replica: self.replica.clone(),
            principal: None,
            client_id: None,
            tool: None,
            outcome: None,
            duration_us: None,
            trace_id: None,
            args_sha256: None,
            result_bytes: None,
            generation: None,
            dropped: None,
            detail: None,
            prev_hash: GENESIS,
            hash: GENESIS,
        }
    }

    /// Links `row` as the next one: its sequence number, its previous hash, its hash.
    pub(crate) fn link(&mut self, mut row: Row) -> Row {
        self.seq += 1;
        row.seq = self.seq;
        row.prev_hash = self.prev;
        row.hash = row.compute_hash();
        self.prev = row.hash;
        self.last_at = row.at;
        row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_and_the_link_change_the_hash() {
        let mut chain = Chain::new("r1");
        let mut first = chain.blank("call", SystemTime::now());
        first.tool = Some("search_docs".into());
        first.outcome = Some(Cow::Borrowed("ok"));
        let first = chain.link(first);
        let second = chain.link(chain.blank("end", SystemTime::now()));
        assert_eq!((first.seq, second.seq, second.prev_hash), (1, 2, first.hash));
        assert_eq!(first.compute_hash(), first.hash);
        let mut edited = first.clone();
        edited.tool = Some("export_report".into());
        assert_ne!(edited.compute_hash(), first.hash);
        let mut nulled = first.clone();
        nulled.tool = Some(String::new());
        assert_ne!(nulled.compute_hash(), first.hash, "NULL and the empty string differ");
        let mut moved = first.clone();
        moved.seq = 3;
        assert_ne!(moved.compute_hash(), first.hash);
        let mut detailed = first.clone();
        detailed.detail = Some(String::new());
        assert_ne!(detailed.compute_hash(), first.hash, "a detail, even empty, is hashed");
    }

    #[test]
    fn a_chain_never_goes_back_in_time() {
        let mut chain = Chain::new("r1");
        let now = SystemTime::now();
        let a = chain.link(chain.blank("call", now));
        let b = chain.link(chain.blank("call", now - Duration::from_secs(60)));
        assert!(b.at >= a.at);
        assert_eq!(truncate(a.at), a.at);
    }
}
