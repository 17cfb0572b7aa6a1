//! The `requestState` of multi round-trip requests (MRTR, 2026-07-28). A tool that needs input from the client
//! (elicitation, sampling, roots) ends its round with an `InputRequiredResult`; the client retries the request,
//! on any replica, with the answers and the state. The state carries the answers of the earlier rounds and what
//! this round asked for, and it is bound to the principal, the method, the tool and its arguments, and an expiry.
//! It is signed with HMAC-SHA256 under a key the whole fleet shares (`--request-state-key`); every key listed
//! verifies, the first one signs, so keys rotate without refusing the states in flight.
//!
//! Wire form: `<kid>.<base64url(payload JSON)>.<base64url(HMAC(kid "." payload))>`. Nothing in it is secret from
//! its own client (the answers are the client's own), but nothing in it can be changed or moved to another caller.

use crate::TransportError;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{KeyInit, Mac};
use mcpfleet_core::time::epoch_ms;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The fleet's signing keys for `requestState`, and how long a state stays valid.
#[derive(Clone)]
pub struct RequestStateKeys {
    /// `(kid, HMAC keyed with its secret)`; the first signs, all verify.
    keys: Vec<(String, HmacSha256)>,
    ttl: Duration,
}

impl std::fmt::Debug for RequestStateKeys {
    // Never print a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kids: Vec<&str> = self.keys.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("RequestStateKeys").field("kids", &kids).field("ttl", &self.ttl).finish()
    }
}

impl RequestStateKeys {
    /// A key ring: `keys[0]` signs, every key verifies.
    ///
    /// # Errors
    /// [`TransportError::Config`]: no key, a malformed or repeated key id, or a secret shorter than 32 bytes.
    pub fn new(keys: Vec<(String, Vec<u8>)>, ttl: Duration) -> Result<Self, TransportError> {
        let bad = |m: String| Err(TransportError::Config(m));
        if keys.is_empty() {
            return bad("at least one request-state key is needed".to_owned());
        }
        for (i, (kid, secret)) in keys.iter().enumerate() {
            let ok = !kid.is_empty()
                && kid.len() <= 32
                && kid.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b));
            if !ok {
                return bad(format!("request-state key id {kid:?} must be 1 to 32 characters of [A-Za-z0-9_-]"));
            }
            if secret.len() < 32 {
                return bad(format!("request-state key {kid:?} must be at least 32 bytes"));
            }
            if keys[..i].iter().any(|(k, _)| k == kid) {
                return bad(format!("request-state key id {kid:?} is given twice"));
            }
        }
        let mut ring = Vec::new();
        for (kid, secret) in keys {
            let mac = <HmacSha256 as KeyInit>::new_from_slice(&secret)
                .map_err(|_| TransportError::Config(format!("request-state key {kid:?} cannot key HMAC-SHA256")))?;
            ring.push((kid, mac));
        }
        Ok(Self { keys: ring, ttl })
    }

    /// A ring of one random key, for a single process (`serve` without Redis and without a configured key).
    #[must_use]
    pub fn random(ttl: Duration) -> Self {
        // A key of HMAC-SHA256's block size (64 bytes) keys it as is.
        let secret: [u8; 64] = rand::random();
        let mac = <HmacSha256 as KeyInit>::new(&secret.into());
        Self { keys: vec![("local".to_owned(), mac)], ttl }
    }

    fn mac(keyed: &HmacSha256, signed: &str) -> HmacSha256 {
        let mut mac = keyed.clone();
        mac.update(signed.as_bytes());
        mac
    }

    /// Signs `state`, with an expiry of now + ttl.
    pub(crate) fn seal(&self, mut state: RequestState) -> String {
        state.e = epoch_ms().saturating_add(u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX / 2));
        let Some((kid, secret)) = self.keys.first() else { return String::new() };
        let payload = B64.encode(serde_json::to_vec(&state).unwrap_or_default());
        let signed = format!("{kid}.{payload}");
        let tag = B64.encode(Self::mac(secret, &signed).finalize().into_bytes());
        format!("{signed}.{tag}")
    }

    /// Verifies a state presented by `user` on a retry of `method` with arguments digesting to `digest`.
    pub(crate) fn open(
        &self,
        token: &str,
        user: &str,
        method: &str,
        digest: &str,
    ) -> Result<RequestState, StateRefusal> {
        let mut parts = token.split('.');
        let (Some(kid), Some(payload), Some(tag), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(StateRefusal::Malformed);
        };
        let Some((_, secret)) = self.keys.iter().find(|(k, _)| k == kid) else {
            return Err(StateRefusal::UnknownKey);
        };
        let tag = B64.decode(tag).map_err(|_| StateRefusal::Malformed)?;
        Self::mac(secret, &format!("{kid}.{payload}")).verify_slice(&tag).map_err(|_| StateRefusal::BadSignature)?;
        let state: RequestState =
            B64.decode(payload).ok().and_then(|b| serde_json::from_slice(&b).ok()).ok_or(StateRefusal::Malformed)?;
        if state.v != 1 {
            return Err(StateRefusal::Malformed);
        }
        if state.e <= epoch_ms() {
            return Err(StateRefusal::Expired);
        }
        if state.p != user {
            return Err(StateRefusal::WrongPrincipal);
        }
        if state.m != method || state.d != digest {
            return Err(StateRefusal::WrongRequest);
        }
        Ok(state)
    }
}

/// What a `requestState` carries.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct RequestState {
    /// Format version.
    pub(crate) v: u8,
    /// The principal (its opaque user key).
    pub(crate) p: String,
    /// The method.
    pub(crate) m: String,
    /// A digest of the request's salient parameters (the tool and its arguments).
    pub(crate) d: String,
    /// Expiry, Unix milliseconds.
    pub(crate) e: u64,
    /// The answers of the earlier rounds, by input request key.
    pub(crate) a: serde_json::Map<String, Value>,
    /// The keys this round asked for: only their answers are taken from `inputResponses`.
    pub(crate) q: Vec<String>,
}

impl RequestState {
    pub(crate) fn new(user: &str, method: &str, digest: &str) -> Self {
        Self { v: 1, p: user.to_owned(), m: method.to_owned(), d: digest.to_owned(), ..Self::default() }
    }
}

/// Why a presented `requestState` was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StateRefusal {
    Malformed,
    UnknownKey,
    BadSignature,
    Expired,
    WrongPrincipal,
    WrongRequest,
}

impl StateRefusal {
    /// What the caller reads: what is wrong, and what to do.
    pub(crate) fn message(self) -> &'static str {
        match self {
            Self::Malformed => "requestState is malformed: send it back exactly as the server returned it",
            Self::UnknownKey => {
                "requestState was signed with a key this server no longer trusts: re-issue the request without \
                 requestState and inputResponses"
            }
            Self::BadSignature => {
                "requestState failed verification (it was altered): re-issue the request without requestState and \
                 inputResponses"
            }
            Self::Expired => "requestState has expired: re-issue the request without requestState and inputResponses",
            Self::WrongPrincipal => "requestState was issued to another principal",
            Self::WrongRequest => {
                "requestState belongs to another request (the method, tool or arguments differ): retry the original \
                 request unchanged"
            }
        }
    }

    /// A label for metrics and logs.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::UnknownKey => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::WrongPrincipal => "wrong_principal",
            Self::WrongRequest => "wrong_request",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(kids: &[&str], ttl: Duration) -> RequestStateKeys {
        let keys =
            kids.iter().map(|k| ((*k).to_owned(), format!("{k}-secret-0123456789abcdef0123456789").into_bytes()));
        RequestStateKeys::new(keys.collect(), ttl).unwrap()
    }

    #[test]
    fn sealed_states_open_only_for_their_principal_request_and_time() {
        let keys = ring(&["k1"], Duration::from_secs(60));
        let mut s = RequestState::new("alice", "tools/call", "d1");
        s.a.insert("elicitation-1".into(), serde_json::json!({ "action": "accept" }));
        let token = keys.seal(s.clone());
        let opened = keys.open(&token, "alice", "tools/call", "d1").unwrap();
        assert_eq!(opened.a, s.a);
        assert_eq!(keys.open(&token, "bob", "tools/call", "d1"), Err(StateRefusal::WrongPrincipal));
        assert_eq!(keys.open(&token, "alice", "tools/call", "d2"), Err(StateRefusal::WrongRequest));
        assert_eq!(keys.open(&token, "alice", "prompts/get", "d1"), Err(StateRefusal::WrongRequest));
        // One changed character anywhere: refused.
        let mut bytes = token.clone().into_bytes();
        let i = token.find('.').unwrap() + 5;
        bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8(bytes).unwrap();
        assert_eq!(keys.open(&forged, "alice", "tools/call", "d1"), Err(StateRefusal::BadSignature));
        assert_eq!(keys.open("garbage", "alice", "tools/call", "d1"), Err(StateRefusal::Malformed));
        let expired = ring(&["k1"], Duration::ZERO).seal(RequestState::new("alice", "tools/call", "d1"));
        assert_eq!(keys.open(&expired, "alice", "tools/call", "d1"), Err(StateRefusal::Expired));
    }

    #[test]
    fn rotation_verifies_old_keys_and_forgets_dropped_ones() {
        let old = ring(&["k1"], Duration::from_secs(60));
        let token = old.seal(RequestState::new("alice", "tools/call", "d"));
        let rotated = ring(&["k2", "k1"], Duration::from_secs(60));
        assert!(rotated.open(&token, "alice", "tools/call", "d").is_ok());
        assert!(rotated.seal(RequestState::new("a", "m", "d")).starts_with("k2."));
        let dropped = ring(&["k2"], Duration::from_secs(60));
        assert_eq!(dropped.open(&token, "alice", "tools/call", "d"), Err(StateRefusal::UnknownKey));
    }

    #[test]
    fn key_rings_refuse_weak_or_ambiguous_keys() {
        let t = Duration::from_secs(1);
        let err = |keys| RequestStateKeys::new(keys, t).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err(vec![]).contains("at least one"));
        assert!(err(vec![("k".into(), vec![0; 31])]).contains("at least 32 bytes"));
        assert!(err(vec![("k.1".into(), vec![0; 32])]).contains("must be 1 to 32 characters"));
        assert!(err(vec![("k".into(), vec![0; 32]), ("k".into(), vec![1; 32])]).contains("given twice"));
    }
}
