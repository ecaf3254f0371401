//! The idempotency store's trait and its claim types.

use std::fmt;
use std::sync::Arc;

// `Error` is named by the docs.
#[allow(unused_imports)]
use crate::error::{Error, Result};

/// The outcome of [`IdempotencyStore::claim`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Claim {
    /// The caller holds the key now, fenced by this token: do the work, then
    /// [`confirm`](IdempotencyStore::confirm) it (or [`release`](IdempotencyStore::release) it
    /// on failure) with the token.
    Claimed(ClaimToken),
    /// Another worker holds an unexpired claim on the key: the work may be under way.
    InProgress,
    /// The key was confirmed (within the retention period): the work is done.
    Duplicate,
}

impl Claim {
    /// True for [`Claim::Claimed`].
    pub fn is_claimed(&self) -> bool {
        matches!(self, Claim::Claimed(_))
    }

    /// The token of a [`Claim::Claimed`].
    pub fn token(&self) -> Option<&ClaimToken> {
        match self {
            Claim::Claimed(token) => Some(token),
            _ => None,
        }
    }
}

/// Who holds a claim: a fresh random value written with the claim, which `confirm` and
/// `release` must present (see the [module docs](crate::patterns::idempotency)).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClaimToken(String);

impl ClaimToken {
    /// A fresh token (122 random bits, as text).
    pub fn new() -> ClaimToken {
        ClaimToken(crate::envelope::new_id())
    }

    /// The token as text, as stored in the `token` column.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for ClaimToken {
    /// A fresh token.
    fn default() -> Self {
        ClaimToken::new()
    }
}

impl fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ClaimToken").field(&self.0).finish()
    }
}

/// Records which message keys were handled.
///
/// Stores are shared across worker threads (`Send + Sync`), typically behind an `Arc`.
pub trait IdempotencyStore: Send + Sync {
    /// Records `key` and returns `true` if it was not recorded before (or its record expired).
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn first_time(&self, key: &str) -> Result<bool>;

    /// Forgets `key` by its name alone, claimed or confirmed, so that the next claim of it runs.
    ///
    /// Not fenced: it deletes a receipt, or a claim someone else holds. It is for operators and
    /// for stores without claims; the message path of a store with claims uses
    /// [`release`](Self::release).
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn forget(&self, key: &str) -> Result<()>;

    /// Claims `key` for processing.
    ///
    /// The default, for stores that only have `first_time`, answers [`Claim::Claimed`] (with a
    /// fresh token the store does not keep) when `first_time` is true and [`Claim::Duplicate`]
    /// otherwise.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn claim(&self, key: &str) -> Result<Claim> {
        Ok(if self.first_time(key)? {
            Claim::Claimed(ClaimToken::new())
        } else {
            Claim::Duplicate
        })
    }

    /// Confirms the claim `token` holds on `key`: the work is done, the key becomes a receipt.
    /// If the claim was taken over (or has expired) meanwhile the receipt is recorded all the
    /// same. The default does nothing.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn confirm(&self, key: &str, token: &ClaimToken) -> Result<()> {
        let _ = (key, token);
        Ok(())
    }

    /// Gives back the claim `token` holds on `key` (the work failed and should run again).
    /// Does nothing when the key is confirmed or claimed under another token.
    ///
    /// The default, for stores without claims, is [`forget`](Self::forget).
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn release(&self, key: &str, token: &ClaimToken) -> Result<()> {
        let _ = token;
        self.forget(key)
    }

    /// True when `claim` and `confirm` are real (a lease and a receipt), false when they are
    /// derived from `first_time`. Defaults to false.
    fn supports_claims(&self) -> bool {
        false
    }
}

impl<T: IdempotencyStore + ?Sized> IdempotencyStore for Arc<T> {
    fn first_time(&self, key: &str) -> Result<bool> {
        (**self).first_time(key)
    }
    fn forget(&self, key: &str) -> Result<()> {
        (**self).forget(key)
    }
    fn claim(&self, key: &str) -> Result<Claim> {
        (**self).claim(key)
    }
    fn confirm(&self, key: &str, token: &ClaimToken) -> Result<()> {
        (**self).confirm(key, token)
    }
    fn release(&self, key: &str, token: &ClaimToken) -> Result<()> {
        (**self).release(key, token)
    }
    fn supports_claims(&self) -> bool {
        (**self).supports_claims()
    }
}
