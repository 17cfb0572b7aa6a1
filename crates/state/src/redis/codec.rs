//! What crosses to Redis and back: durations as a script's milliseconds, keys built end to end, and the typed
//! reading of replies (integers, strings, arrays, a script's `{status, ...}`, event ids, counts and durations).

use crate::types::EventId;
use crate::{Result, StateError};
use redis::Value;
use std::time::Duration;

/// `parts` end to end, in one allocation (keys are built on every request; `format!` costs more).
pub(super) fn cat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

/// `d` as a script's milliseconds argument: at least 1, saturating.
pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

pub(super) fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => {
            std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).ok_or(StateError::Protocol("expected an integer"))
        }
        _ => Err(StateError::Protocol("expected an integer")),
    }
}

pub(super) fn string(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| StateError::Protocol("expected utf-8")),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(i) => Ok(i.to_string()),
        _ => Err(StateError::Protocol("expected a string")),
    }
}

pub(super) fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(a) => Ok(a),
        _ => Err(StateError::Protocol("expected an array")),
    }
}

/// Splits a script's `{status, ...}` reply.
pub(super) fn status(v: Value) -> Result<(i64, Vec<Value>)> {
    let mut a = array(v)?;
    if a.is_empty() {
        return Err(StateError::Protocol("empty reply"));
    }
    let rest = a.split_off(1);
    Ok((int(&a[0])?, rest))
}

pub(super) fn event_id(stream: u64, v: &Value) -> Result<EventId> {
    EventId::from_position(stream, &string(v)?).ok_or(StateError::Protocol("bad stream id"))
}

/// A reply field that is empty when absent.
pub(super) fn opt_u64(v: &Value) -> Result<Option<u64>> {
    let s = string(v)?;
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| StateError::Protocol("expected a count"))
}

pub(super) fn millis(v: &Value) -> Result<Duration> {
    Ok(Duration::from_millis(u64::try_from(int(v)?.max(0)).unwrap_or(0)))
}
