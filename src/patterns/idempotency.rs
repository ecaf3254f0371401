//! Idempotency stores: remember which messages were already handled.
//!
//! # The protocol
//!
//! [`IdempotencyStore::first_time`] answers "have I seen this key?" and records it in one step.
//! A store that [supports claims](IdempotencyStore::supports_claims) offers the safer two-step
//! form: [`claim`](IdempotencyStore::claim) before the work, [`confirm`](IdempotencyStore::confirm)
//! after it, [`release`](IdempotencyStore::release) when the work failed and should run again.
//!
//! - A claim is a **lease**: it holds for `claim_timeout`. While it holds, other claims of the
//!   same key get [`Claim::InProgress`]; once its deadline has passed, the next claim takes it
//!   over and gets [`Claim::Claimed`] (the first worker is presumed dead).
//! - A claim is **fenced**: [`Claim::Claimed`] carries a fresh [`ClaimToken`], written with the
//!   claim. `release` deletes the claim only while that token still holds it, so a worker whose
//!   lease was taken over cannot give back its successor's claim, and a confirmed key is never
//!   deleted by `release`. `confirm` turns the holder's claim into a receipt; a holder whose
//!   lease was taken over still records the receipt when it confirms (its work *is* done, and a
//!   receipt is what stops the key from running a third time), with a warning in the log.
//! - A confirmed key is a **receipt**: claims get [`Claim::Duplicate`] until `retention` has
//!   passed; after that the key counts as new again, whether or not it was purged.
//! - In [`SqlIdempotencyStore`] the insert *is* the claim: one `INSERT … ON CONFLICT DO UPDATE …
//!   WHERE deadline_ms <= now` statement (`now` being the database's clock, see
//!   [Clocks](#clocks)), atomic by the primary key across threads, processes
//!   and hosts. Nothing on the message path deletes a receipt: `release` deletes only the
//!   caller's own claim (`WHERE key = ? AND state = 'CLAIMED' AND token = ?`),
//!   [`SqlIdempotencyStore::purge_expired`] deletes what has expired, and
//!   [`forget`](IdempotencyStore::forget) (by key alone, whatever its state) is for operators.
//!
//! The table has a `token` column (since 0.1: tables created before it need
//! `ALTER TABLE acemq_idempotency ADD COLUMN token TEXT`).
//! - [`SqlIdempotencyStore::claim_in`] and [`SqlIdempotencyStore::confirm_in`] run on the
//!   caller's transaction so the receipt commits (or rolls back) with the work. On PostgreSQL a
//!   second claim of a key whose claim is not yet committed waits for that transaction. On
//!   SQLite begin such a transaction with `BEGIN IMMEDIATE` (`TransactionBehavior::Immediate`)
//!   so the claim does not fail with `SQLITE_BUSY` when it upgrades a read to a write.
//!
//! - With [`group_commit`](SqlIdempotencyStoreBuilder::group_commit), the claims, confirms and
//!   releases that concurrent threads ask for at the same moment run in one transaction (one
//!   commit), each answered only after that commit, with the answer it would have had alone.
//!
//! # Clocks
//!
//! In [`SqlIdempotencyStore`] **the database's clock decides** every deadline: a claim's
//! `deadline_ms` is written as the database's now plus `claim_timeout` (a receipt's as its now
//! plus `retention`), and "has it expired" compares it with the database's now, in the same
//! statement ([`Dialect::now_ms_sql`](crate::sql::Dialect::now_ms_sql)). The clocks of the
//! hosts running the store may disagree by any amount: a host whose clock runs behind cannot
//! take over a live claim, nor write one that is already expired, and a host whose clock runs
//! ahead does not hold a claim longer than its lease. On PostgreSQL that is the server's clock
//! (`clock_timestamp()`); SQLite runs in the process, so there it is the host's own clock,
//! which the processes sharing a database file share. A claim can still outlive its holder's
//! work if the holder's process stalls for longer than `claim_timeout`: that is what the token
//! fences.
//!
//! [`InMemoryIdempotencyStore`] keeps keys in a map for one process; it is for tests and
//! examples, **not for production**: it forgets everything on restart and does not coordinate
//! processes.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

// `Error` is named by the docs everywhere and used by the SQL store when it is built.
#[allow(unused_imports)]
use crate::error::{Error, Result};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::sql::{self, Connect, Dialect, Sql, Table, Value};

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
/// `release` must present (see the [module docs](self)).
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

// ---------------------------------------------------------------------------------------------
// In memory

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

// ---------------------------------------------------------------------------------------------
// SQL

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::sql_store::{SqlIdempotencyStore, SqlIdempotencyStoreBuilder};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql_store {
    use super::*;

    const CLAIMED: &str = "CLAIMED";
    const CONFIRMED: &str = "CONFIRMED";

    /// The store's statements in one dialect.
    #[derive(Debug)]
    struct Statements {
        claim: String,
        first_time: String,
        confirm: String,
        confirm_claimed: String,
        state: String,
        release: String,
        forget: String,
        purge: String,
    }

    impl Statements {
        fn new(t: &str, dialect: Dialect) -> Statements {
            let p = |s: String| dialect.placeholders(&s);
            // Every deadline is written, and compared, with the database's clock.
            let now = dialect.now_ms_sql();
            // $1 key, $2 the lease or retention in ms, then the statement's own.
            let upsert = |state: &str, token: &str, condition: &str| {
                p(format!(
                    "INSERT INTO {t} (key, state, deadline_ms, token) \
                     VALUES ($1, '{state}', {now} + $2, {token}) \
                     ON CONFLICT (key) DO UPDATE SET state = excluded.state, \
                     deadline_ms = excluded.deadline_ms, token = excluded.token{condition}"
                ))
            };
            let expired = format!(" WHERE {t}.deadline_ms <= {now}");
            // A claim also takes a key its own token holds: a group commit run again op by op
            // after its statement committed finds its own claims (fenced by the token).
            let expired_or_own =
                format!("{expired} OR ({t}.state = '{CLAIMED}' AND {t}.token = excluded.token)");
            Statements {
                // $3 the claim's token
                claim: upsert(CLAIMED, "$3", &expired_or_own),
                first_time: upsert(CONFIRMED, "NULL", &expired),
                confirm: upsert(CONFIRMED, "NULL", ""),
                // The holder's confirm, fenced by its token ($3). When it changes nothing (the
                // claim was taken over, or expired and was purged) the upsert records the
                // receipt all the same: the work is done.
                confirm_claimed: p(format!(
                    "UPDATE {t} SET state = '{CONFIRMED}', deadline_ms = {now} + $2, \
                     token = NULL WHERE key = $1 AND state = '{CLAIMED}' AND token = $3"
                )),
                state: p(format!("SELECT state FROM {t} WHERE key = $1")),
                // Fenced: only the holder's own claim, never a receipt.
                release: p(format!(
                    "DELETE FROM {t} WHERE key = $1 AND state = '{CLAIMED}' AND token = $2"
                )),
                forget: p(format!("DELETE FROM {t} WHERE key = $1")),
                purge: format!("DELETE FROM {t} WHERE deadline_ms <= {now}"),
            }
        }
    }

    /// An idempotency store in a SQL table (SQLite or PostgreSQL), safe across processes.
    ///
    /// See the [module docs](super) for the lease and retention rules. Each of the store's own
    /// operations gets a connection from the connections factory given to
    /// [`builder`](Self::builder) and drops it at the end; `claim_in` / `confirm_in` use the
    /// caller's transaction instead.
    ///
    /// # Example
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> acemq_amqp::Result<()> {
    /// use acemq_amqp::patterns::idempotency::{Claim, IdempotencyStore, SqlIdempotencyStore};
    /// use std::time::Duration;
    /// let path = std::env::temp_dir().join(format!("acemq-idem-{}.db", std::process::id()));
    /// let store = SqlIdempotencyStore::builder(move || {
    ///     rusqlite::Connection::open(&path).map_err(|e| acemq_amqp::Error::Sql {
    ///         context: "opening".into(),
    ///         source: e.into(),
    ///     })
    /// })
    /// .table("doc_idempotency")
    /// .claim_timeout(Duration::from_secs(30))
    /// .build()?;
    /// store.create_table()?;
    /// # store.forget("order-1")?;
    /// let Claim::Claimed(token) = store.claim("order-1")? else {
    ///     panic!("order-1 is new");
    /// };
    /// // … the work …
    /// store.confirm("order-1", &token)?;
    /// assert_eq!(store.claim("order-1")?, Claim::Duplicate);
    /// # Ok(())
    /// # }
    /// # #[cfg(not(feature = "sqlite"))]
    /// # fn main() {}
    /// ```
    pub struct SqlIdempotencyStore {
        connect: Connect,
        table: String,
        claim_timeout: Duration,
        retention: Duration,
        statements: sql::PerDialect<Statements>,
        /// Set by [`SqlIdempotencyStoreBuilder::group_commit`].
        group: Option<group::Group>,
    }

    /// Builds a [`SqlIdempotencyStore`].
    pub struct SqlIdempotencyStoreBuilder {
        connect: Connect,
        table: String,
        claim_timeout: Duration,
        retention: Duration,
        group_commit: bool,
    }

    impl SqlIdempotencyStoreBuilder {
        /// The table's name, a plain identifier. Defaults to `acemq_idempotency`.
        pub fn table(mut self, name: impl Into<String>) -> Self {
            self.table = name.into();
            self
        }

        /// How long a claim holds before another claim may take it over. Defaults to 60 s.
        pub fn claim_timeout(mut self, lease: Duration) -> Self {
            self.claim_timeout = lease;
            self
        }

        /// How long a confirmed key is remembered. Defaults to 24 hours.
        pub fn retention(mut self, retention: Duration) -> Self {
            self.retention = retention;
            self
        }

        /// Commits the claims, confirms and releases that threads ask for at the same time in
        /// **one** transaction (group commit): while one group commits, the next gathers, so
        /// that concurrent workers share each commit (each `fsync`) instead of paying one
        /// each. Each call still returns only after its own work is committed, with the same
        /// answer as alone: claims are atomic by the key and fenced by tokens as before (a
        /// group's claims share one fresh token). A group whose transaction fails is run
        /// again one operation at a time, so that one bad operation does not fail the others.
        /// Nothing waits to fill a group: a lone call commits at once. One group runs at a
        /// time; on PostgreSQL a group of claims and confirms is a single statement (its own
        /// transaction), one round trip. Defaults to false.
        pub fn group_commit(mut self, on: bool) -> Self {
            self.group_commit = on;
            self
        }

        /// Checks the settings and builds the store. Does not touch the database.
        ///
        /// # Errors
        ///
        /// [`Error::InvalidName`] for a table name that is not a plain identifier,
        /// [`Error::InvalidArgument`] for a zero claim timeout or retention.
        pub fn build(self) -> Result<SqlIdempotencyStore> {
            sql::check_identifier(&self.table)?;
            if self.claim_timeout.as_millis() == 0 || self.retention.as_millis() == 0 {
                return Err(Error::invalid(
                    "claim_timeout and retention must be at least 1 ms",
                ));
            }
            Ok(SqlIdempotencyStore {
                group: self.group_commit.then(group::Group::default),
                statements: sql::PerDialect::new(),
                connect: self.connect,
                table: self.table,
                claim_timeout: self.claim_timeout,
                retention: self.retention,
            })
        }
    }

    impl fmt::Debug for SqlIdempotencyStoreBuilder {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("SqlIdempotencyStoreBuilder")
                .field("table", &self.table)
                .field("claim_timeout", &self.claim_timeout)
                .field("retention", &self.retention)
                .finish_non_exhaustive()
        }
    }

    impl fmt::Debug for SqlIdempotencyStore {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("SqlIdempotencyStore")
                .field("table", &self.table)
                .field("claim_timeout", &self.claim_timeout)
                .field("retention", &self.retention)
                .finish_non_exhaustive()
        }
    }

    impl SqlIdempotencyStore {
        /// A builder using `connect` as the connections factory: it is called once for each of
        /// the store's own operations (a closure that opens a connection, or a pool checkout).
        pub fn builder<F, C>(connect: F) -> SqlIdempotencyStoreBuilder
        where
            F: Fn() -> Result<C> + Send + Sync + 'static,
            C: Sql + 'static,
        {
            SqlIdempotencyStoreBuilder {
                connect: sql::erase(connect),
                table: sql::DEFAULT_IDEMPOTENCY_TABLE.to_owned(),
                claim_timeout: Duration::from_secs(60),
                retention: Duration::from_secs(24 * 3600),
                group_commit: false,
            }
        }

        /// The table's name.
        pub fn table(&self) -> &str {
            &self.table
        }

        /// The claim lease.
        pub fn claim_timeout(&self) -> Duration {
            self.claim_timeout
        }

        /// The receipt retention.
        pub fn retention(&self) -> Duration {
            self.retention
        }

        /// Creates the table if it does not exist (development and tests; see
        /// [`schema_ddl`](crate::sql::schema_ddl) for migrations).
        ///
        /// # Errors
        ///
        /// [`Error::Sql`] if the statements fail.
        pub fn create_table(&self) -> Result<()> {
            let mut conn = (self.connect)()?;
            sql::create_schema(&mut *conn, &[Table::Idempotency(self.table.clone())])
        }

        /// Deletes confirmed keys past their retention and claims past their lease; returns
        /// how many rows were deleted.
        ///
        /// # Errors
        ///
        /// [`Error::Sql`] if the statement fails.
        pub fn purge_expired(&self) -> Result<u64> {
            let mut conn = (self.connect)()?;
            let s = self.statements(&*conn);
            conn.execute(&s.purge, &[])
                .map_err(|e| self.context(e, "purging expired keys"))
        }

        /// [`claim`](IdempotencyStore::claim) on the caller's transaction: the claim commits
        /// or rolls back with it.
        ///
        /// # Errors
        ///
        /// [`Error::Sql`] if a statement fails (on PostgreSQL the transaction is then aborted).
        pub fn claim_in(&self, tx: &mut dyn Sql, key: &str) -> Result<Claim> {
            self.claim_on(tx, key)
        }

        /// [`confirm`](IdempotencyStore::confirm) on the caller's transaction: the receipt
        /// commits with the work done in it.
        ///
        /// # Errors
        ///
        /// [`Error::Sql`] if the statement fails.
        pub fn confirm_in(&self, tx: &mut dyn Sql, key: &str, token: &ClaimToken) -> Result<()> {
            self.confirm_on(tx, key, token)
        }

        /// Claims every key of `keys` (distinct) on the caller's transaction in one statement,
        /// all under `token`; the claim of each, in order. A batch of claims is fenced by its
        /// one token exactly as a single claim is by its own.
        pub(crate) fn claim_many_in(
            &self,
            tx: &mut dyn Sql,
            keys: &[&str],
            token: &ClaimToken,
        ) -> Result<Vec<Claim>> {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            let dialect = tx.dialect();
            let t = &self.table;
            let sql = dialect.placeholders(&self.claim_sql(dialect, 3, keys.len()));
            // The rows in key order: concurrent batches (other groups, other consumers) then
            // lock the keys they share in the same order, so they wait for each other instead
            // of deadlocking on PostgreSQL. The answers below go by key, in `keys`' order.
            let mut ordered: Vec<&str> = keys.to_vec();
            ordered.sort_unstable();
            let mut params = Vec::with_capacity(keys.len() + 2);
            params.push(Value::Integer(sql::duration_ms(self.claim_timeout)));
            params.push(Value::Text(token.as_str().to_owned()));
            params.extend(ordered.iter().map(|k| Value::Text((*k).to_owned())));
            let claimed = self.returned_keys(tx, &sql, &params, "claiming a batch of keys")?;
            let others: Vec<&str> = keys
                .iter()
                .copied()
                .filter(|k| !claimed.contains(*k))
                .collect();
            let mut states = HashMap::new();
            if !others.is_empty() {
                let sql = dialect.placeholders(&format!(
                    "SELECT key, state FROM {t} WHERE key IN ({})",
                    (1..=others.len())
                        .map(|i| format!("${i}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                let params: Vec<Value> = others.iter().map(|k| Value::Text((*k).into())).collect();
                for row in tx
                    .query(&sql, &params)
                    .map_err(|e| self.context(e, "reading the batch's keys"))?
                {
                    states.insert(sql::col_text(&row, 0)?, sql::col_text(&row, 1)?);
                }
            }
            Ok(keys
                .iter()
                .map(|k| claim_answer(claimed.contains(*k), states.get(*k), token))
                .collect())
        }

        /// Confirms the claims `token` holds on `keys` on the caller's transaction (one
        /// statement; a key no longer held is confirmed on its own, as `confirm_in` does).
        pub(crate) fn confirm_many_in(
            &self,
            tx: &mut dyn Sql,
            keys: &[&str],
            token: &ClaimToken,
        ) -> Result<()> {
            let pairs: Vec<(&str, &ClaimToken)> = keys.iter().map(|k| (*k, token)).collect();
            self.confirm_pairs_in(tx, &pairs)
        }

        /// `INSERT … ON CONFLICT … RETURNING key` claiming `n` keys, numbered from `$first`;
        /// `$1` is the lease in milliseconds, `$2` the token. A key is taken when it is new or
        /// its deadline (a lease or a receipt's retention) has passed.
        fn claim_sql(&self, dialect: Dialect, first: usize, n: usize) -> String {
            let (t, now) = (&self.table, dialect.now_ms_sql());
            let rows: Vec<String> = (first..first + n)
                .map(|i| format!("(${i}, '{CLAIMED}', {now} + $1, $2)"))
                .collect();
            format!(
                "INSERT INTO {t} (key, state, deadline_ms, token) VALUES {} \
                 ON CONFLICT (key) DO UPDATE SET state = excluded.state, \
                 deadline_ms = excluded.deadline_ms, token = excluded.token \
                 WHERE {t}.deadline_ms <= {now} RETURNING key",
                rows.join(", ")
            )
        }

        /// `UPDATE … RETURNING key` confirming `n` (key, token) pairs, numbered from `$first`
        /// (key, then token); `$retention` is the receipt's retention in milliseconds. `key IN`
        /// as well as the pairs: SQLite finds rows by the key's index only from a plain `IN`
        /// list (for `(key, token) IN` alone it scans the table).
        fn confirm_sql(
            &self,
            dialect: Dialect,
            retention: usize,
            first: usize,
            n: usize,
        ) -> String {
            let keys: Vec<String> = (0..n).map(|i| format!("${}", first + 2 * i)).collect();
            let pairs: Vec<String> = (0..n)
                .map(|i| format!("(${}, ${})", first + 2 * i, first + 2 * i + 1))
                .collect();
            format!(
                "UPDATE {t} SET state = '{CONFIRMED}', deadline_ms = {now} + ${retention}, \
                 token = NULL WHERE state = '{CLAIMED}' AND key IN ({}) AND (key, token) IN ({}) \
                 RETURNING key",
                keys.join(", "),
                pairs.join(", "),
                t = self.table,
                now = dialect.now_ms_sql(),
            )
        }

        /// Runs `sql` (a statement `… RETURNING key`) and returns the keys it returned.
        fn returned_keys(
            &self,
            tx: &mut dyn Sql,
            sql: &str,
            params: &[Value],
            what: &str,
        ) -> Result<std::collections::HashSet<String>> {
            tx.query(sql, params)
                .map_err(|e| self.context(e, what))?
                .iter()
                .map(|row| sql::col_text(row, 0))
                .collect()
        }

        /// Confirms claims held by different tokens in one statement (a group commit's
        /// confirms: each comes from the group that claimed it). A pair whose token no longer
        /// holds its key is confirmed on its own, as `confirm_in` does.
        fn confirm_pairs_in(&self, tx: &mut dyn Sql, pairs: &[(&str, &ClaimToken)]) -> Result<()> {
            if pairs.is_empty() {
                return Ok(());
            }
            let dialect = tx.dialect();
            // Keys in order, as the claims insert them: concurrent groups lock shared rows in
            // the same order.
            let mut ordered = pairs.to_vec();
            ordered.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let sql = dialect.placeholders(&self.confirm_sql(dialect, 1, 2, ordered.len()));
            let mut params = Vec::with_capacity(2 * ordered.len() + 1);
            params.push(Value::Integer(sql::duration_ms(self.retention)));
            for (key, token) in &ordered {
                params.push(Value::Text((*key).to_owned()));
                params.push(Value::Text(token.as_str().to_owned()));
            }
            let confirmed = self.returned_keys(tx, &sql, &params, "confirming a group's keys")?;
            for (key, token) in &ordered {
                if !confirmed.contains(*key) {
                    self.confirm_on(tx, key, token)?;
                }
            }
            Ok(())
        }

        /// Gives back the claims `token` holds on `keys` on the caller's transaction.
        pub(crate) fn release_many_in(
            &self,
            tx: &mut dyn Sql,
            keys: &[&str],
            token: &ClaimToken,
        ) -> Result<()> {
            if keys.is_empty() {
                return Ok(());
            }
            let dialect = tx.dialect();
            let sql = dialect.placeholders(&format!(
                "DELETE FROM {} WHERE state = '{CLAIMED}' AND token = $1 AND key IN ({})",
                self.table,
                (2..keys.len() + 2)
                    .map(|i| format!("${i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            let mut params = Vec::with_capacity(keys.len() + 1);
            params.push(Value::Text(token.as_str().to_owned()));
            params.extend(keys.iter().map(|k| Value::Text((*k).to_owned())));
            tx.execute(&sql, &params)
                .map_err(|e| self.context(e, "releasing a batch of claims"))?;
            Ok(())
        }

        fn statements(&self, conn: &dyn Sql) -> &Statements {
            self.statements
                .get(conn.dialect(), |d| Statements::new(&self.table, d))
        }

        fn context(&self, e: Error, what: &str) -> Error {
            sql::rewrap(e, || format!("{what} in table {}", self.table))
        }

        fn claim_on(&self, conn: &mut dyn Sql, key: &str) -> Result<Claim> {
            self.claim_as(conn, key, ClaimToken::new())
        }

        /// Claims `key` under `token`: taken when it is new, expired, or already held by
        /// `token` itself.
        fn claim_as(&self, conn: &mut dyn Sql, key: &str, token: ClaimToken) -> Result<Claim> {
            let s = self.statements(conn);
            let lease = sql::duration_ms(self.claim_timeout);
            // The row may be deleted (forget, purge) between the failed upsert and the read:
            // then try again.
            let params = [
                Value::Text(key.to_owned()),
                Value::Integer(lease),
                Value::Text(token.as_str().to_owned()),
            ];
            for _ in 0..8 {
                let changed = conn
                    .execute(&s.claim, &params)
                    .map_err(|e| self.context(e, "claiming a key"))?;
                if changed > 0 {
                    return Ok(Claim::Claimed(token));
                }
                let rows = conn
                    .query(&s.state, &params[..1])
                    .map_err(|e| self.context(e, "reading a key's state"))?;
                if let Some(row) = rows.first() {
                    return Ok(if sql::col_text(row, 0)? == CONFIRMED {
                        Claim::Duplicate
                    } else {
                        Claim::InProgress
                    });
                }
            }
            Ok(Claim::InProgress)
        }

        fn confirm_on(&self, conn: &mut dyn Sql, key: &str, token: &ClaimToken) -> Result<()> {
            let s = self.statements(conn);
            let params = [
                Value::Text(key.to_owned()),
                Value::Integer(sql::duration_ms(self.retention)),
                Value::Text(token.as_str().to_owned()),
            ];
            let updated = conn
                .execute(&s.confirm_claimed, &params)
                .map_err(|e| self.context(e, "confirming a key"))?;
            if updated == 0 {
                log::warn!(
                    "acemq: the claim on {key:?} in table {} was no longer held by its token \
                     (taken over after its lease ran out, or expired) when it was confirmed; \
                     recording the receipt (the work may have run twice)",
                    self.table
                );
                conn.execute(&s.confirm, &params[..2])
                    .map_err(|e| self.context(e, "confirming a key"))?;
            }
            Ok(())
        }
    }

    impl IdempotencyStore for SqlIdempotencyStore {
        fn first_time(&self, key: &str) -> Result<bool> {
            let mut conn = (self.connect)()?;
            let s = self.statements(&*conn);
            let changed = conn
                .execute(
                    &s.first_time,
                    &[
                        Value::Text(key.to_owned()),
                        Value::Integer(sql::duration_ms(self.retention)),
                    ],
                )
                .map_err(|e| self.context(e, "recording a key"))?;
            Ok(changed > 0)
        }

        fn forget(&self, key: &str) -> Result<()> {
            let mut conn = (self.connect)()?;
            let s = self.statements(&*conn);
            conn.execute(&s.forget, &[Value::Text(key.to_owned())])
                .map_err(|e| self.context(e, "forgetting a key"))?;
            Ok(())
        }

        fn claim(&self, key: &str) -> Result<Claim> {
            if let Some(group) = &self.group {
                return group
                    .run(self, group::Op::Claim(key.to_owned()))
                    .map(|d| d.claim);
            }
            let mut conn = (self.connect)()?;
            self.claim_on(&mut *conn, key)
        }

        fn confirm(&self, key: &str, token: &ClaimToken) -> Result<()> {
            if let Some(group) = &self.group {
                return group
                    .run(self, group::Op::Confirm(key.to_owned(), token.clone()))
                    .map(drop);
            }
            let mut conn = (self.connect)()?;
            self.confirm_on(&mut *conn, key, token)
        }

        fn release(&self, key: &str, token: &ClaimToken) -> Result<()> {
            if let Some(group) = &self.group {
                return group
                    .run(self, group::Op::Release(key.to_owned(), token.clone()))
                    .map(drop);
            }
            self.release_alone(key, token)
        }

        fn supports_claims(&self) -> bool {
            true
        }
    }

    impl SqlIdempotencyStore {
        fn release_alone(&self, key: &str, token: &ClaimToken) -> Result<()> {
            let mut conn = (self.connect)()?;
            let s = self.statements(&*conn);
            conn.execute(
                &s.release,
                &[
                    Value::Text(key.to_owned()),
                    Value::Text(token.as_str().to_owned()),
                ],
            )
            .map_err(|e| self.context(e, "releasing a claim"))?;
            Ok(())
        }

        /// One group's operations on one transaction (see [`group`]): each one's answer, or
        /// the error that failed the transaction. On PostgreSQL a group of claims and confirms
        /// is one statement ([`group_statement`](Self::group_statement)).
        /// The group's claims are made under `token`.
        fn run_group(&self, ops: &[group::Op], token: &ClaimToken) -> Result<Vec<group::Done>> {
            let mut conn = (self.connect)()?;
            if conn.dialect() == Dialect::Postgres && one_statement_will_do(ops) {
                return self.group_statement(&mut *conn, ops, token);
            }
            sql::in_one_transaction(
                &mut *conn,
                "a group commit",
                |e, what| self.context(e, what),
                |tx| self.group_ops(tx, ops, token),
            )
        }

        fn group_ops(
            &self,
            conn: &mut dyn Sql,
            ops: &[group::Op],
            token: &ClaimToken,
        ) -> Result<Vec<group::Done>> {
            let claims: Vec<&str> = ops
                .iter()
                .filter_map(|op| match op {
                    group::Op::Claim(key) => Some(key.as_str()),
                    _ => None,
                })
                .collect();
            // Distinct keys claimed together; a key asked for twice: the second is in progress.
            let mut distinct: Vec<&str> = Vec::new();
            for k in &claims {
                if !distinct.contains(k) {
                    distinct.push(k);
                }
            }
            let answers = self.claim_many_in(conn, &distinct, token)?;
            let mut answer_of: HashMap<&str, Claim> = distinct.into_iter().zip(answers).collect();
            // Confirms, one statement for all of them (each holds the token of the group that
            // claimed it).
            let confirms: Vec<(&str, &ClaimToken)> = ops
                .iter()
                .filter_map(|op| match op {
                    group::Op::Confirm(key, token) => Some((key.as_str(), token)),
                    _ => None,
                })
                .collect();
            self.confirm_pairs_in(conn, &confirms)?;
            let mut done = Vec::with_capacity(ops.len());
            for op in ops {
                done.push(group::Done {
                    claim: match op {
                        group::Op::Claim(key) => answer_of
                            .insert(key.as_str(), Claim::InProgress)
                            .unwrap_or(Claim::InProgress),
                        group::Op::Confirm(..) => Claim::Duplicate,
                        group::Op::Release(key, token) => {
                            let s = self.statements(conn);
                            conn.execute(
                                &s.release,
                                &[
                                    Value::Text(key.to_owned()),
                                    Value::Text(token.as_str().to_owned()),
                                ],
                            )
                            .map_err(|e| self.context(e, "releasing a claim"))?;
                            Claim::InProgress
                        }
                    },
                });
            }
            Ok(done)
        }

        /// A group of claims and confirms as **one statement** on PostgreSQL (its own
        /// transaction: atomic as the group's transaction is, in one round trip instead of
        /// five — `BEGIN`, the claims, the states of the keys not claimed, the confirms,
        /// `COMMIT`). Two data-modifying `WITH` parts: the claims (`INSERT … ON CONFLICT`, keys
        /// in order, as [`claim_many_in`](Self::claim_many_in) writes them) and the confirms
        /// (one `UPDATE` for every key and token), and the state the claimed keys had before
        /// the statement, which tells a receipt (duplicate) from a live claim (in progress).
        /// [`one_statement_will_do`] keeps out the groups it cannot run: a release, or a key
        /// both claimed and confirmed (PostgreSQL cannot modify one row twice in a statement).
        /// A confirm whose token no longer holds its key is then confirmed on its own, as
        /// `confirm_in` does.
        fn group_statement(
            &self,
            conn: &mut dyn Sql,
            ops: &[group::Op],
            token: &ClaimToken,
        ) -> Result<Vec<group::Done>> {
            let dialect = Dialect::Postgres;
            let t = &self.table;
            let mut claims: Vec<&str> = Vec::new();
            let mut confirms: Vec<(&str, &ClaimToken)> = Vec::new();
            for op in ops {
                match op {
                    group::Op::Claim(key) if !claims.contains(&key.as_str()) => claims.push(key),
                    group::Op::Confirm(key, token) => confirms.push((key, token)),
                    _ => {}
                }
            }
            claims.sort_unstable();
            confirms.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let mut params = vec![
                Value::Integer(sql::duration_ms(self.claim_timeout)),
                Value::Text(token.as_str().to_owned()),
                Value::Integer(sql::duration_ms(self.retention)),
            ];
            let mut parts = Vec::new();
            let mut selects = Vec::new();
            if !claims.is_empty() {
                let first = params.len() + 1;
                params.extend(claims.iter().map(|k| Value::Text((*k).to_owned())));
                parts.push(format!(
                    "claimed AS ({})",
                    self.claim_sql(dialect, first, claims.len())
                ));
                selects.push("SELECT 'claimed', key FROM claimed".to_owned());
                selects.push(format!(
                    "SELECT state, key FROM {t} WHERE key IN ({})",
                    (first..first + claims.len())
                        .map(|i| format!("${i}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            if !confirms.is_empty() {
                let first = params.len() + 1;
                for (key, token) in &confirms {
                    params.push(Value::Text((*key).to_owned()));
                    params.push(Value::Text(token.as_str().to_owned()));
                }
                parts.push(format!(
                    "confirmed AS ({})",
                    self.confirm_sql(dialect, 3, first, confirms.len())
                ));
                selects.push("SELECT 'confirmed', key FROM confirmed".to_owned());
            }
            let sql = format!("WITH {} {}", parts.join(", "), selects.join(" UNION ALL "));
            let mut claimed = std::collections::HashSet::new();
            let mut confirmed = std::collections::HashSet::new();
            let mut before = HashMap::new();
            for row in conn
                .query(&sql, &params)
                .map_err(|e| self.context(e, "a group commit"))?
            {
                let (what, key) = (sql::col_text(&row, 0)?, sql::col_text(&row, 1)?);
                match what.as_str() {
                    "claimed" => {
                        claimed.insert(key);
                    }
                    "confirmed" => {
                        confirmed.insert(key);
                    }
                    _ => {
                        before.insert(key, what);
                    }
                }
            }
            for (key, token) in &confirms {
                if !confirmed.contains(*key) {
                    self.confirm_on(conn, key, token)?;
                }
            }
            let mut answered: std::collections::HashSet<&str> = std::collections::HashSet::new();
            Ok(ops
                .iter()
                .map(|op| group::Done {
                    claim: match op {
                        // A key asked for twice in one group: the second is in progress.
                        group::Op::Claim(key) if !answered.insert(key.as_str()) => {
                            Claim::InProgress
                        }
                        group::Op::Claim(key) => {
                            claim_answer(claimed.contains(key), before.get(key), token)
                        }
                        _ => Claim::Duplicate,
                    },
                })
                .collect())
        }

        /// One operation alone, on a connection of its own (a failed group's fallback). A claim
        /// is made under `own`, the failed group's token, when given: the group's statement may
        /// have committed before the group failed (on PostgreSQL it commits on its own, and a
        /// confirm's fallback after it can still fail), and then the key is already held by
        /// that token — the caller's own claim, not one in progress elsewhere.
        fn run_alone(&self, op: &group::Op, own: Option<&ClaimToken>) -> Result<group::Done> {
            let claim = match op {
                group::Op::Claim(key) => {
                    let mut conn = (self.connect)()?;
                    let token = own.cloned().unwrap_or_default();
                    self.claim_as(&mut *conn, key, token)?
                }
                group::Op::Confirm(key, token) => {
                    let mut conn = (self.connect)()?;
                    self.confirm_on(&mut *conn, key, token)?;
                    Claim::Duplicate
                }
                group::Op::Release(key, token) => {
                    self.release_alone(key, token)?;
                    Claim::InProgress
                }
            };
            Ok(group::Done { claim })
        }
    }

    /// A claim's answer from whether the statement took the key and, if not, the state the key
    /// was found in: a receipt is a duplicate; a live claim (or a row deleted meanwhile) is in
    /// progress, and the message comes back later.
    fn claim_answer(taken: bool, state: Option<&String>, token: &ClaimToken) -> Claim {
        if taken {
            Claim::Claimed(token.clone())
        } else if state.map(String::as_str) == Some(CONFIRMED) {
            Claim::Duplicate
        } else {
            Claim::InProgress
        }
    }

    /// Whether [`SqlIdempotencyStore::group_statement`] can run `ops`: claims and confirms
    /// only, no key both claimed and confirmed.
    fn one_statement_will_do(ops: &[group::Op]) -> bool {
        let mut claimed = Vec::new();
        let mut confirmed = Vec::new();
        for op in ops {
            match op {
                group::Op::Claim(key) => claimed.push(key.as_str()),
                group::Op::Confirm(key, _) => confirmed.push(key.as_str()),
                group::Op::Release(..) => return false,
            }
        }
        confirmed.iter().all(|k| !claimed.contains(k))
    }

    /// Group commit: callers queue their operation; one group runs at a time, led by a caller:
    /// the first to find no group running leads (takes everything queued, runs it as one
    /// transaction, hands out the answers) and the others wait for their answer, each in its
    /// own mailbox (a slot and a condition variable), so a finished group wakes only the
    /// callers it answered and, when more are queued, the one it hands the lead to — never
    /// every waiting thread. One group at a time on PostgreSQL too: measured here (two cores
    /// shared with the broker), four concurrent groups each committed a third as many
    /// operations in about the same time, and two no more than one.
    mod group {
        use super::*;
        use std::collections::VecDeque;

        use parking_lot::Condvar;

        pub(super) enum Op {
            Claim(String),
            Confirm(String, ClaimToken),
            Release(String, ClaimToken),
        }

        pub(super) struct Done {
            pub(super) claim: Claim,
        }

        /// What a waiting caller is told.
        enum Wake {
            /// Its operation's answer.
            Done(Result<Done>),
            /// The lead was handed to it: run the next group.
            Lead,
            /// Its operation was taken into a group that will not answer (the thread running
            /// it panicked).
            Gone,
        }

        /// Where one waiting caller is woken: a slot and a condition variable, no channel. A
        /// caller waits here about a commit's length (a database round trip); the waiting
        /// parks the thread at once instead of spinning and yielding first as a channel's
        /// receive does, which with dozens of workers waiting took the CPU the database and
        /// the broker needed (measured: `sched_yield` and the channel's receive were the
        /// workers' largest cost in the plain idempotent consumer at concurrency 32).
        #[derive(Default)]
        struct Mailbox {
            slot: Mutex<VecDeque<Wake>>,
            ready: Condvar,
        }

        impl Mailbox {
            fn put(&self, wake: Wake) {
                self.slot.lock().push_back(wake);
                self.ready.notify_one();
            }

            fn take(&self) -> Wake {
                let mut slot = self.slot.lock();
                loop {
                    if let Some(wake) = slot.pop_front() {
                        return wake;
                    }
                    self.ready.wait(&mut slot);
                }
            }
        }

        /// The right to answer one queued operation: answered once, or, when dropped
        /// unanswered (a group that panicked), its caller is told [`Wake::Gone`].
        struct Answer(Option<Arc<Mailbox>>);

        impl Answer {
            /// The caller's mailbox, while it is not answered (to hand it the lead).
            fn mailbox(&self) -> Option<&Arc<Mailbox>> {
                self.0.as_ref()
            }

            fn send(mut self, done: Result<Done>) {
                if let Some(to) = self.0.take() {
                    to.put(Wake::Done(done));
                }
            }
        }

        impl Drop for Answer {
            fn drop(&mut self) {
                if let Some(to) = self.0.take() {
                    to.put(Wake::Gone);
                }
            }
        }

        #[derive(Default)]
        struct State {
            /// Each operation with the right to answer it (which holds its caller's mailbox).
            queue: Vec<(Op, Answer)>,
            /// A group is running, or the lead was handed to a caller not yet awake.
            running: bool,
        }

        #[derive(Default)]
        pub(crate) struct Group {
            state: Mutex<State>,
        }

        /// The lead: when dropped (also when a group panics) it is handed to the first caller
        /// still queued, or, with nobody queued, given up.
        struct Lead<'g>(&'g Group);

        impl Drop for Lead<'_> {
            fn drop(&mut self) {
                let mut state = self.0.state.lock();
                // A queued answer is always unanswered, so it has its mailbox.
                match state.queue.first().and_then(|(_, a)| a.mailbox().cloned()) {
                    Some(next) => {
                        drop(state);
                        // Its caller waits in its mailbox (it is still queued).
                        next.put(Wake::Lead);
                    }
                    None => state.running = false,
                }
            }
        }

        impl Group {
            /// How many operations wait for a group (for tests).
            #[cfg(test)]
            pub(super) fn queued(&self) -> usize {
                self.state.lock().queue.len()
            }

            pub(super) fn run(&self, store: &SqlIdempotencyStore, op: Op) -> Result<Done> {
                let mailbox = Arc::new(Mailbox::default());
                {
                    let mut state = self.state.lock();
                    state.queue.push((op, Answer(Some(mailbox.clone()))));
                    if !state.running {
                        state.running = true;
                        drop(state);
                        self.lead(store);
                    }
                }
                loop {
                    match mailbox.take() {
                        Wake::Done(done) => return done,
                        Wake::Lead => self.lead(store),
                        Wake::Gone => {
                            return Err(Error::sql(
                                "a group commit of the idempotency store",
                                "the thread running the group panicked; its transaction did \
                                 not commit",
                            ))
                        }
                    }
                }
            }

            /// Runs what is queued as one group (the caller holds the lead).
            fn lead(&self, store: &SqlIdempotencyStore) {
                let lead = Lead(self);
                let queued = std::mem::take(&mut self.state.lock().queue);
                if queued.is_empty() {
                    return;
                }
                let (ops, answer_to): (Vec<Op>, Vec<Answer>) = queued.into_iter().unzip();
                let token = ClaimToken::new();
                let answers: Vec<Result<Done>> = match store.run_group(&ops, &token) {
                    Ok(done) => done.into_iter().map(Ok).collect(),
                    Err(e) if ops.len() > 1 => {
                        log::debug!(
                            "acemq: a group commit of {} operations failed ({e}); running them \
                             one by one",
                            ops.len()
                        );
                        // Each key's first claim under the group's token (the group may have
                        // claimed it already); a key asked for again is in progress, as in
                        // the group.
                        let mut claimed = std::collections::HashSet::new();
                        ops.iter()
                            .map(|op| {
                                let own = match op {
                                    Op::Claim(key) if claimed.insert(key.as_str()) => Some(&token),
                                    _ => None,
                                };
                                store.run_alone(op, own)
                            })
                            .collect()
                    }
                    Err(e) => vec![Err(e)],
                };
                // The next group starts (what queued meanwhile) before these answers go out.
                drop(lead);
                for (to, answer) in answer_to.into_iter().zip(answers) {
                    to.send(answer);
                }
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::group::Op;
        use super::*;

        /// Waits up to 30 s for `done` (a hang fails the test).
        #[cfg(feature = "testing")]
        fn wait_for(what: &str, done: &dyn Fn() -> bool) {
            crate::testing::wait_until(Duration::from_secs(30), done)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }

        /// Waits until `n` operations are queued for the store's next group.
        #[cfg(feature = "testing")]
        fn queued_in(store: &SqlIdempotencyStore, n: usize) {
            wait_for(&format!("{n} queued"), &|| {
                store.group.as_ref().is_some_and(|g| g.queued() == n)
            })
        }

        /// The first group's connection waits at a gate until two more callers are queued;
        /// the second group (those two) panics while opening its connection. The caller that
        /// led it panics; the other is answered with an error instead of waiting for ever; and
        /// the store goes on committing groups.
        #[cfg(all(feature = "sqlite", feature = "testing"))]
        #[test]
        fn a_group_that_panics_answers_its_other_caller_with_an_error_and_the_next_group_runs() {
            use std::sync::atomic::{AtomicUsize, Ordering};
            let path = std::env::temp_dir().join(format!(
                "acemq-group-panic-{}-{}.db",
                std::process::id(),
                ClaimToken::new().as_str()
            ));
            let gate = Arc::new((Mutex::new(false), parking_lot::Condvar::new()));
            let calls = Arc::new(AtomicUsize::new(0));
            let (g, c, file) = (gate.clone(), calls.clone(), path.clone());
            let store = Arc::new(
                SqlIdempotencyStore::builder(move || {
                    match c.fetch_add(1, Ordering::SeqCst) {
                        // create_table
                        0 => {}
                        1 => {
                            let (open, opened) = &*g;
                            let mut open = open.lock();
                            let deadline = Instant::now() + Duration::from_secs(30);
                            while !*open {
                                if opened.wait_until(&mut open, deadline).timed_out() {
                                    panic!("the test never opened the gate");
                                }
                            }
                        }
                        2 => panic!("opening this group's connection panicked on purpose"),
                        _ => {}
                    }
                    rusqlite::Connection::open(&file).map_err(|e| Error::sql("opening", e))
                })
                .group_commit(true)
                .build()
                .unwrap(),
            );
            store.create_table().unwrap();
            let queued = |n: usize| queued_in(&store, n);
            // Threads of their own, not scoped: a caller that is never answered must fail the
            // test, not hang it.
            let claim = |key: &'static str| {
                let store = store.clone();
                std::thread::spawn(move || store.claim(key))
            };
            let first = claim("a");
            // The first caller leads and waits at the gate with an empty queue.
            wait_for("the first group", &|| calls.load(Ordering::SeqCst) >= 2);
            let second = claim("b");
            queued(1);
            let third = claim("c");
            queued(2);
            *gate.0.lock() = true;
            gate.1.notify_all();
            wait_for("every caller's answer", &|| {
                first.is_finished() && second.is_finished() && third.is_finished()
            });
            assert!(matches!(first.join().unwrap(), Ok(Claim::Claimed(_))));
            // The second caller led the panicking group; the third was answered.
            assert!(second.join().is_err());
            let e = third.join().unwrap().unwrap_err();
            assert!(e.to_string().contains("panicked"), "{e}");
            // Nothing of the panicked group was committed; the store goes on.
            assert!(matches!(store.claim("b"), Ok(Claim::Claimed(_))));
            assert!(matches!(store.claim("c"), Ok(Claim::Claimed(_))));
            assert_eq!(store.claim("a").unwrap(), Claim::InProgress);
            let _ = std::fs::remove_file(&path);
        }

        /// Issue 35 item 10, on PostgreSQL. One group holds a claim of `k1` and the confirm of
        /// a claim whose token no longer holds its key (taken over): the group statement
        /// commits the claim, then the confirm's fallback fails once (a trigger on the real
        /// table raises on the receipt it inserts, the first time only), so the group is run
        /// again op by op. The rerun must recognise the claim of `k1` as the group's own —
        /// `Claimed`, not `InProgress` (which would leave the message waiting out the lease).
        #[cfg(all(feature = "postgres", feature = "testing"))]
        #[test]
        fn a_group_rerun_after_its_statement_committed_recognises_its_own_claims() {
            use std::sync::atomic::{AtomicBool, Ordering};
            const URL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";
            let pg = || {
                postgres::Client::connect(URL, postgres::NoTls)
                    .map_err(|e| Error::sql("connecting to the test database", e))
            };
            let table = format!(
                "acemq_group_rerun_{}_{}",
                std::process::id(),
                ClaimToken::new().as_str().replace('-', "")
            );
            // The next connection opened waits at the gate while `armed`.
            let gate = Arc::new((Mutex::new(false), parking_lot::Condvar::new()));
            let armed = Arc::new(AtomicBool::new(false));
            let (g, a) = (gate.clone(), armed.clone());
            let store = Arc::new(
                SqlIdempotencyStore::builder(move || {
                    if a.swap(false, Ordering::SeqCst) {
                        let (open, opened) = &*g;
                        let mut open = open.lock();
                        let deadline = Instant::now() + Duration::from_secs(30);
                        while !*open {
                            if opened.wait_until(&mut open, deadline).timed_out() {
                                panic!("the test never opened the gate");
                            }
                        }
                    }
                    pg()
                })
                .table(table.clone())
                .claim_timeout(Duration::from_secs(60))
                .group_commit(true)
                .build()
                .unwrap(),
            );
            store.create_table().unwrap();
            let mut admin = pg().unwrap();
            // A receipt inserted fails the first time (a sequence is not rolled back).
            admin
                .batch_execute(&format!(
                    "CREATE SEQUENCE {table}_fail; \
                     CREATE FUNCTION {table}_fail() RETURNS trigger AS $$ BEGIN \
                       IF NEW.state = 'CONFIRMED' AND nextval('{table}_fail') = 1 THEN \
                         RAISE EXCEPTION 'the confirm fallback fails once, on purpose'; \
                       END IF; RETURN NEW; END $$ LANGUAGE plpgsql; \
                     CREATE TRIGGER {table}_fail BEFORE INSERT ON {table} \
                       FOR EACH ROW EXECUTE FUNCTION {table}_fail();"
                ))
                .unwrap();
            // A claim whose lease was taken over: its holder's token no longer holds the key.
            let stale = match store.claim("taken").unwrap() {
                Claim::Claimed(t) => t,
                other => panic!("a new key is claimed: {other:?}"),
            };
            admin
                .execute(
                    &format!("UPDATE {table} SET token = 'successor' WHERE key = 'taken'"),
                    &[],
                )
                .unwrap();
            let queued = |n: usize| queued_in(&store, n);
            // A first group waits at the gate while the confirm and the claim queue behind it:
            // they make the next group together.
            armed.store(true, Ordering::SeqCst);
            let first = {
                let store = store.clone();
                std::thread::spawn(move || store.claim("warm"))
            };
            wait_for("the first group", &|| !armed.load(Ordering::SeqCst));
            let confirm = {
                let (store, stale) = (store.clone(), stale.clone());
                std::thread::spawn(move || store.confirm("taken", &stale))
            };
            queued(1);
            let claim = {
                let store = store.clone();
                std::thread::spawn(move || store.claim("k1"))
            };
            queued(2);
            *gate.0.lock() = true;
            gate.1.notify_all();
            wait_for("every caller's answer", &|| {
                first.is_finished() && confirm.is_finished() && claim.is_finished()
            });
            assert!(first.join().unwrap().unwrap().is_claimed());
            confirm.join().unwrap().unwrap();
            let failed_once: i64 = admin
                .query_one(&format!("SELECT last_value FROM {table}_fail"), &[])
                .unwrap()
                .get(0);
            assert_eq!(
                failed_once, 2,
                "the fallback failed once, then the rerun confirmed"
            );
            let k1 = claim.join().unwrap().unwrap();
            let cleanup = |admin: &mut postgres::Client| {
                let _ = admin.batch_execute(&format!(
                    "DROP TABLE IF EXISTS {table}; DROP FUNCTION IF EXISTS {table}_fail(); \
                     DROP SEQUENCE IF EXISTS {table}_fail;"
                ));
            };
            let Claim::Claimed(token) = k1 else {
                cleanup(&mut admin);
                panic!("the group's own committed claim of k1 was answered {k1:?}");
            };
            // The claim is the caller's, fenced by the token it was given.
            store.confirm("k1", &token).unwrap();
            assert_eq!(store.claim("k1").unwrap(), Claim::Duplicate);
            assert_eq!(store.claim("taken").unwrap(), Claim::Duplicate);
            cleanup(&mut admin);
        }

        #[test]
        fn a_group_with_a_release_or_a_key_claimed_and_confirmed_is_not_one_statement() {
            let t = ClaimToken::new();
            let claim = |k: &str| Op::Claim(k.into());
            let confirm = |k: &str| Op::Confirm(k.into(), t.clone());
            assert!(one_statement_will_do(&[
                claim("a"),
                confirm("b"),
                claim("a")
            ]));
            assert!(!one_statement_will_do(&[claim("a"), confirm("a")]));
            assert!(!one_statement_will_do(&[
                claim("a"),
                Op::Release("b".into(), t.clone())
            ]));
        }
    }
}
