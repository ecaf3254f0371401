//! [`InMemoryIdempotencyStore`]: keys in a map, for one process.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::store::{Claim, ClaimToken, IdempotencyStore};
use crate::error::Result;

/// An in-process idempotency store with one TTL that is both the claim lease and the receipt
/// retention.
///
/// **Not for production**: it lives and dies with the process and does not coordinate several
/// processes. Expired entries are dropped from time to time as new keys arrive, or by
/// [`purge_expired`](Self::purge_expired).
pub struct InMemoryIdempotencyStore {
    ttl: Duration,
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    map: HashMap<String, Entry>,
    inserts: u64,
}

struct Entry {
    confirmed: bool,
    deadline: Instant,
    /// The holder of a claim; `None` for a receipt.
    token: Option<ClaimToken>,
}

impl InMemoryIdempotencyStore {
    /// A store whose claims and receipts expire after `ttl`.
    pub fn new(ttl: Duration) -> InMemoryIdempotencyStore {
        InMemoryIdempotencyStore {
            ttl,
            entries: Mutex::new(Entries::default()),
        }
    }

    /// The TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The number of keys held, expired ones included until they are purged.
    pub fn len(&self) -> usize {
        self.entries.lock().map.len()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops expired claims and receipts; returns how many.
    pub fn purge_expired(&self) -> usize {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        let before = entries.map.len();
        entries.map.retain(|_, e| e.deadline > now);
        before - entries.map.len()
    }

    /// Inserts or takes over `key` unless a live entry holds it; returns the live entry's state.
    fn take(&self, key: &str, token: Option<&ClaimToken>) -> Option<bool> {
        let now = Instant::now();
        let deadline = now + self.ttl;
        let fresh = Entry {
            confirmed: token.is_none(),
            deadline,
            token: token.cloned(),
        };
        let mut entries = self.entries.lock();
        if let Some(e) = entries.map.get_mut(key) {
            if e.deadline > now {
                return Some(e.confirmed);
            }
            *e = fresh;
            return None;
        }
        entries.inserts += 1;
        if entries.inserts.is_multiple_of(1024) {
            entries.map.retain(|_, e| e.deadline > now);
        }
        entries.map.insert(key.to_owned(), fresh);
        None
    }
}

impl Default for InMemoryIdempotencyStore {
    /// A store with a TTL of 24 hours.
    fn default() -> Self {
        InMemoryIdempotencyStore::new(Duration::from_secs(24 * 3600))
    }
}

impl fmt::Debug for InMemoryIdempotencyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryIdempotencyStore")
            .field("ttl", &self.ttl)
            .field("len", &self.len())
            .finish()
    }
}

impl IdempotencyStore for InMemoryIdempotencyStore {
    fn first_time(&self, key: &str) -> Result<bool> {
        Ok(self.take(key, None).is_none())
    }

    fn forget(&self, key: &str) -> Result<()> {
        self.entries.lock().map.remove(key);
        Ok(())
    }

    fn claim(&self, key: &str) -> Result<Claim> {
        let token = ClaimToken::new();
        Ok(match self.take(key, Some(&token)) {
            None => Claim::Claimed(token),
            Some(true) => Claim::Duplicate,
            Some(false) => Claim::InProgress,
        })
    }

    fn confirm(&self, key: &str, token: &ClaimToken) -> Result<()> {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        let receipt = Entry {
            confirmed: true,
            deadline: now + self.ttl,
            token: None,
        };
        if let Some(e) = entries.map.get(key) {
            if !e.confirmed && e.deadline > now && e.token.as_ref() != Some(token) {
                log::warn!(
                    "acemq: the claim on {key:?} was taken over before it was confirmed; \
                     recording the receipt (the work may have run twice)"
                );
            }
        }
        entries.map.insert(key.to_owned(), receipt);
        Ok(())
    }

    fn release(&self, key: &str, token: &ClaimToken) -> Result<()> {
        let mut entries = self.entries.lock();
        if entries
            .map
            .get(key)
            .is_some_and(|e| !e.confirmed && e.token.as_ref() == Some(token))
        {
            entries.map.remove(key);
        }
        Ok(())
    }

    fn supports_claims(&self) -> bool {
        true
    }
}
