//! What never changes within a session, kept on the replica: its protocol version and the client's capabilities,
//! which `admit.lua` would otherwise read from the session's hash and send back on every touch (issue 32: the
//! touch then reads two small fields, not four). A session's id is never reused and nothing rewrites those two
//! fields, so an entry is never stale; the touch still checks in Redis that the session exists, under its owner's
//! key, on every request. Bounded: past [`CAPACITY`] sessions, an arbitrary entry makes room (a later touch of that
//! session reads the fields again).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Sessions remembered per replica: about 1 MB with a real SDK's capabilities.
const CAPACITY: usize = 4096;

/// A session's fixed fields: its protocol version and the client's capabilities (JSON).
pub(super) type Fixed = Arc<(String, String)>;

/// Fixed fields by session key (`<p>{u:<user>}:s:<sid>`).
#[derive(Default)]
pub(super) struct Known {
    map: Mutex<HashMap<String, Fixed>>,
}

impl Known {
    pub(super) fn get(&self, session_key: &str) -> Option<Fixed> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).get(session_key).cloned()
    }

    pub(super) fn put(&self, session_key: &str, protocol_version: &str, capabilities: &str) {
        let fixed = Arc::new((protocol_version.to_owned(), capabilities.to_owned()));
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= CAPACITY && !map.contains_key(session_key) {
            let some = map.keys().next().cloned();
            if let Some(k) = some {
                map.remove(&k);
            }
        }
        map.insert(session_key.to_owned(), fixed);
    }

    pub(super) fn forget(&self, session_key: &str) {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).remove(session_key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_forgets_and_stays_bounded() {
        let k = Known::default();
        k.put("s:a", "2025-11-25", "{}");
        assert_eq!(k.get("s:a").map(|f| f.0.clone()).as_deref(), Some("2025-11-25"));
        k.forget("s:a");
        assert!(k.get("s:a").is_none());
        for i in 0..CAPACITY + 10 {
            k.put(&format!("s:{i}"), "v", "{}");
        }
        assert_eq!(k.map.lock().unwrap().len(), CAPACITY);
        assert!(k.get(&format!("s:{}", CAPACITY + 9)).is_some(), "the newest is kept");
    }
}
