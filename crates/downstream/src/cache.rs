//! The replica's token cache: exchanged tokens (and the server's own actor tokens) in this process's memory only,
//! keyed by a SHA-256 of the exchange's inputs (never a raw token), each kept until the earlier of its own expiry
//! and the subject token's, less the downstream's skew. One exchange is in flight per key: concurrent callers wait
//! for it and share its answer. A failure is kept for the downstream's negative-cache interval, so that an
//! authorization server that is down sees at most one attempt per key per interval from each replica.

use mcpfleet_tools::downstream::{DownstreamError, DownstreamToken};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;

/// The entries one replica keeps at most; past it, the entry that expires first makes room.
const MAX_ENTRIES: usize = 50_000;

/// A cache key: SHA-256 of the inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key([u8; 32]);

impl Key {
    /// The key of `parts`, each length-prefixed.
    pub(crate) fn of(parts: &[&[u8]]) -> Self {
        let mut h = Sha256::new();
        h.update(b"mcpfleet/downstream/v1");
        for p in parts {
            h.update(u64::try_from(p.len()).unwrap_or(u64::MAX).to_be_bytes());
            h.update(p);
        }
        Self(h.finalize().into())
    }
}

/// How a token was had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Cache,
    /// This call made the exchange.
    Exchange,
    /// Another call's exchange, in flight when this one asked.
    Shared,
    NegativeCache,
}

impl Source {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Cache => "cache",
            Self::Exchange => "exchange",
            Self::Shared => "shared",
            Self::NegativeCache => "negative_cache",
        }
    }
}

/// What a fetch gives: the token and how long it may be kept, or the failure and how long it is kept.
pub(crate) type Fetched = Result<(DownstreamToken, Duration), (DownstreamError, Duration)>;
type Outcome = Result<DownstreamToken, DownstreamError>;

enum Entry {
    Ready(DownstreamToken, Instant),
    Failed(DownstreamError, Instant),
}

impl Entry {
    fn until(&self) -> Instant {
        match self {
            Self::Ready(_, t) | Self::Failed(_, t) => *t,
        }
    }
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    flights: HashMap<Key, Arc<OnceCell<Outcome>>>,
}

#[derive(Default)]
pub(crate) struct Cache {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("entries", &self.lock().entries.len()).finish()
    }
}

impl Cache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The token under `key`: from the cache, from the negative cache, from an exchange in flight, or from
    /// `fetch` (run by this caller alone; if this caller is dropped mid-way, the next waiter runs its own).
    pub(crate) async fn get<F, Fut>(&self, key: Key, fetch: F) -> (Outcome, Source)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Fetched>,
    {
        let now = Instant::now();
        let cell = {
            let mut inner = self.lock();
            match inner.entries.get(&key) {
                Some(Entry::Ready(t, until)) if *until > now => return (Ok(t.clone()), Source::Cache),
                Some(Entry::Failed(e, until)) if *until > now => return (Err(e.clone()), Source::NegativeCache),
                Some(_) => {
                    inner.entries.remove(&key);
                }
                None => {}
            }
            inner.flights.entry(key).or_insert_with(|| Arc::new(OnceCell::new())).clone()
        };
        let led = AtomicBool::new(false);
        let outcome = cell
            .get_or_init(|| async {
                led.store(true, Ordering::Relaxed);
                let fetched = fetch().await;
                let now = Instant::now();
                let mut inner = self.lock();
                inner.flights.remove(&key);
                match fetched {
                    Ok((token, keep)) => {
                        if !keep.is_zero() {
                            inner.insert(key, Entry::Ready(token.clone(), now + keep), now);
                        }
                        Ok(token)
                    }
                    Err((e, keep)) => {
                        inner.insert(key, Entry::Failed(e.clone(), now + keep), now);
                        Err(e)
                    }
                }
            })
            .await
            .clone();
        (outcome, if led.load(Ordering::Relaxed) { Source::Exchange } else { Source::Shared })
    }

    /// Drops what is kept under `key` (its token was refused downstream).
    pub(crate) fn forget(&self, key: &Key) {
        self.lock().entries.remove(key);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

impl Inner {
    fn insert(&mut self, key: Key, entry: Entry, now: Instant) {
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.retain(|_, e| e.until() > now);
        }
        if self.entries.len() >= MAX_ENTRIES
            && let Some(first) = self.entries.iter().min_by_key(|(_, e)| e.until()).map(|(k, _)| *k)
        {
            self.entries.remove(&first);
        }
        self.entries.insert(key, entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn token(s: &str) -> DownstreamToken {
        DownstreamToken::new(s.to_owned())
    }

    #[tokio::test]
    async fn one_fetch_per_key_and_its_answer_is_kept() {
        let cache = Cache::default();
        let fetches = AtomicUsize::new(0);
        let key = Key::of(&[b"calendar", b"subject-1"]);
        let fetch = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok((token("t1"), Duration::from_secs(60)))
        };
        let (a, b) = tokio::join!(cache.get(key, fetch), cache.get(key, fetch));
        assert_eq!(fetches.load(Ordering::SeqCst), 1, "concurrent callers share one exchange");
        assert_eq!(a.0.unwrap(), token("t1"));
        assert_eq!(b.0.unwrap(), token("t1"));
        assert_eq!([a.1, b.1], [Source::Exchange, Source::Shared]);
        let (c, source) = cache.get(key, fetch).await;
        assert_eq!((c.unwrap(), source), (token("t1"), Source::Cache));
        let other = Key::of(&[b"calendar", b"subject-2"]);
        assert_ne!(key, other);
        assert_eq!(cache.get(other, fetch).await.1, Source::Exchange, "another subject, another exchange");
        cache.forget(&key);
        assert_eq!(cache.get(key, fetch).await.1, Source::Exchange, "a forgotten token is exchanged again");
        assert_eq!(fetches.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_failure_is_kept_for_its_interval_and_a_zero_lifetime_is_not_kept() {
        let cache = Cache::default();
        let key = Key::of(&[b"k"]);
        let down = || async { Err((DownstreamError::Unavailable("calendar".into()), Duration::from_millis(80))) };
        assert_eq!(cache.get(key, down).await.1, Source::Exchange);
        let (e, source) = cache.get(key, || async { Ok((token("never"), Duration::from_secs(1))) }).await;
        assert_eq!((e, source), (Err(DownstreamError::Unavailable("calendar".into())), Source::NegativeCache));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (ok, source) = cache.get(key, || async { Ok((token("t"), Duration::ZERO)) }).await;
        assert_eq!((ok.unwrap(), source), (token("t"), Source::Exchange), "tried again after the interval");
        assert_eq!(cache.len(), 0, "a token with no time left is used once and not kept");
    }
}
