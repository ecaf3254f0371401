//! [`SqlIdempotencyStore`] and its options: one operation at a time, or through the group
//! commit.

use std::fmt;
use std::time::Duration;

use super::statements::{Statements, CONFIRMED};
use crate::error::{Error, Result};
use crate::patterns::idempotency::group_commit::{Group, Op};
use crate::patterns::idempotency::store::{Claim, ClaimToken, IdempotencyStore};
use crate::sql::{self, Connect, Sql, Table, Value};

/// An idempotency store in a SQL table (SQLite, PostgreSQL or MySQL), safe across processes.
///
/// See the [module docs](crate::patterns::idempotency) for the lease and retention rules. Each of the store's own
/// operations gets a connection from the connections factory given to
/// [`open`](Self::open) and drops it at the end; `claim_in` / `confirm_in` use the
/// caller's transaction instead.
///
/// # Example
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> acemq_amqp::Result<()> {
/// use acemq_amqp::patterns::idempotency::{
///     Claim, IdempotencyStore, SqlIdempotencyStore, SqlIdempotencyStoreOptions,
/// };
/// use std::time::Duration;
/// let path = std::env::temp_dir().join(format!("acemq-idem-{}.db", std::process::id()));
/// let store = SqlIdempotencyStore::open(
///     move || {
///         rusqlite::Connection::open(&path).map_err(|e| acemq_amqp::Error::Sql {
///             context: "opening".into(),
///             source: e.into(),
///         })
///     },
///     SqlIdempotencyStoreOptions::default()
///         .table("doc_idempotency")
///         .claim_timeout(Duration::from_secs(30)),
/// )?;
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
    pub(super) connect: Connect,
    pub(super) table: String,
    pub(super) claim_timeout: Duration,
    pub(super) retention: Duration,
    statements: sql::PerDialect<Statements>,
    /// Set by [`SqlIdempotencyStoreOptions::group_commit`].
    pub(super) group: Option<Group>,
}

/// How a [`SqlIdempotencyStore`] is set up: given to [`SqlIdempotencyStore::open`], which
/// checks it.
#[derive(Clone, Debug)]
pub struct SqlIdempotencyStoreOptions {
    table: String,
    claim_timeout: Duration,
    retention: Duration,
    group_commit: bool,
}

impl Default for SqlIdempotencyStoreOptions {
    fn default() -> Self {
        SqlIdempotencyStoreOptions {
            table: sql::DEFAULT_IDEMPOTENCY_TABLE.to_owned(),
            claim_timeout: Duration::from_secs(60),
            retention: Duration::from_secs(24 * 3600),
            group_commit: false,
        }
    }
}

impl SqlIdempotencyStoreOptions {
    /// Every check of these options, in one place (run by the store's constructors).
    fn validate(&self) -> Result<()> {
        sql::check_identifier(&self.table)?;
        for (name, value) in [
            ("claim_timeout", self.claim_timeout),
            ("retention", self.retention),
        ] {
            if value.as_millis() == 0 {
                return Err(Error::invalid(format!(
                    "{name} must be at least 1 ms (got {value:?})"
                )));
            }
        }
        Ok(())
    }

    /// The table's name, a plain identifier. Defaults to `acemq_idempotency`.
    #[must_use]
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// How long a claim holds before another claim may take it over (at least 1 ms).
    /// Defaults to 60 s.
    #[must_use]
    pub fn claim_timeout(mut self, lease: Duration) -> Self {
        self.claim_timeout = lease;
        self
    }

    /// How long a confirmed key is remembered (at least 1 ms). Defaults to 24 hours.
    #[must_use]
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
    #[must_use]
    pub fn group_commit(mut self, on: bool) -> Self {
        self.group_commit = on;
        self
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
    /// The store described by `options`, using `connect` as the connections factory: it is
    /// called once for each of the store's own operations (a closure that opens a connection,
    /// or a pool checkout). Checks the options; does not touch the database.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a table name that is not a plain identifier,
    /// [`Error::InvalidArgument`] for a claim timeout or retention under 1 ms.
    pub fn open<F, C>(
        connect: F,
        options: SqlIdempotencyStoreOptions,
    ) -> Result<SqlIdempotencyStore>
    where
        F: Fn() -> Result<C> + Send + Sync + 'static,
        C: Sql + 'static,
    {
        options.validate()?;
        Ok(SqlIdempotencyStore {
            group: options.group_commit.then(Group::default),
            statements: sql::PerDialect::new(),
            connect: sql::erase(connect),
            table: options.table,
            claim_timeout: options.claim_timeout,
            retention: options.retention,
        })
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

    pub(super) fn statements(&self, conn: &dyn Sql) -> &Statements {
        self.statements
            .get(conn.dialect(), |d| Statements::new(&self.table, d))
    }

    pub(super) fn context(&self, e: Error, what: &str) -> Error {
        sql::rewrap(e, || format!("{what} in table {}", self.table))
    }

    pub(super) fn claim_on(&self, conn: &mut dyn Sql, key: &str) -> Result<Claim> {
        self.claim_as(conn, key, ClaimToken::new())
    }

    /// Claims `key` under `token`: taken when it is new, expired, or already held by
    /// `token` itself.
    pub(super) fn claim_as(
        &self,
        conn: &mut dyn Sql,
        key: &str,
        token: ClaimToken,
    ) -> Result<Claim> {
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
                // Held by this token: a claim made again by its own holder (a group's rerun)
                // within the millisecond of the first changes nothing, and MySQL counts no row.
                if sql::col_opt_text(row, 1)?.as_deref() == Some(token.as_str()) {
                    return Ok(Claim::Claimed(token));
                }
                return Ok(if sql::col_text(row, 0)? == CONFIRMED {
                    Claim::Duplicate
                } else {
                    Claim::InProgress
                });
            }
        }
        Ok(Claim::InProgress)
    }

    pub(super) fn confirm_on(
        &self,
        conn: &mut dyn Sql,
        key: &str,
        token: &ClaimToken,
    ) -> Result<()> {
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
            return group.run(self, Op::Claim(key.to_owned())).map(|d| d.claim);
        }
        let mut conn = (self.connect)()?;
        self.claim_on(&mut *conn, key)
    }

    fn confirm(&self, key: &str, token: &ClaimToken) -> Result<()> {
        if let Some(group) = &self.group {
            return group
                .run(self, Op::Confirm(key.to_owned(), token.clone()))
                .map(drop);
        }
        let mut conn = (self.connect)()?;
        self.confirm_on(&mut *conn, key, token)
    }

    fn release(&self, key: &str, token: &ClaimToken) -> Result<()> {
        if let Some(group) = &self.group {
            return group
                .run(self, Op::Release(key.to_owned(), token.clone()))
                .map(drop);
        }
        self.release_alone(key, token)
    }

    fn supports_claims(&self) -> bool {
        true
    }
}

impl SqlIdempotencyStore {
    pub(super) fn release_alone(&self, key: &str, token: &ClaimToken) -> Result<()> {
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
}
