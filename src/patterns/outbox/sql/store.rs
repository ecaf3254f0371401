//! The SQL outbox store: its options, `add` on the caller's transaction, and the
//! [`OutboxStore`] operations on connections of its own.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::mysql;
use super::row::{record, record_lossy};
use super::statements::Statements;
use crate::error::{Error, Result};
use crate::patterns::outbox::store::{
    check_limits, headers_json, NewOutboxRecord, OutboxRecord, OutboxStats, OutboxStore,
};
use crate::sql::{self, Connect, Dialect, Sql, Table, Value};

static OWNERS: AtomicU64 = AtomicU64::new(0);

/// An outbox in a SQL table (SQLite, PostgreSQL or MySQL).
///
/// See the [module docs](crate::patterns::outbox) for the transaction and lease rules. `add` runs on the
/// caller's transaction; every other operation gets a connection from the connections
/// factory given to [`open`](Self::open), one per call, in autocommit mode.
///
/// Open it once and share it: keep it in an `Arc`, [`add`](Self::add) in the handlers and give
/// the relay a clone of the `Arc` (`OutboxStore` is implemented for `Arc<S>`). Each instance has
/// its own lease owner id, so two instances on one table are two relays — which is what a
/// second process is, not what a second handle in one process needs.
///
/// # Example
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> acemq_amqp::Result<()> {
/// use acemq_amqp::patterns::outbox::{
///     NewOutboxRecord, OutboxStore, SqlOutboxStore, SqlOutboxStoreOptions,
/// };
/// let path = std::env::temp_dir().join(format!("acemq-outbox-{}.db", std::process::id()));
/// let open = move || {
///     rusqlite::Connection::open(&path).map_err(|e| acemq_amqp::Error::Sql {
///         context: "opening".into(),
///         source: e.into(),
///     })
/// };
/// let mut conn = open()?;
/// let outbox = SqlOutboxStore::open(open, SqlOutboxStoreOptions::default().table("doc_outbox"))?;
/// outbox.create_table()?;
///
/// let mut tx = conn.transaction().map_err(|e| acemq_amqp::Error::Sql {
///     context: "begin".into(),
///     source: e.into(),
/// })?;
/// // … the business write on `tx` …
/// let id = outbox.add(&mut tx, &NewOutboxRecord {
///     exchange: "orders".into(),
///     routing_key: "order.created".into(),
///     body: br#"{"id":1}"#.to_vec(),
///     content_type: "application/json".into(),
///     ..Default::default()
/// })?;
/// tx.commit().map_err(|e| acemq_amqp::Error::Sql { context: "commit".into(), source: e.into() })?;
///
/// for record in outbox.pending(100)? {
///     // publish with confirms, then:
///     outbox.mark_published(record.id)?;
/// }
/// # let _ = id;
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
pub struct SqlOutboxStore {
    pub(super) connect: Connect,
    pub(super) table: String,
    pub(super) max_attempts: u32,
    lease: Duration,
    owner: String,
    statements: sql::PerDialect<Statements>,
}

/// Options for a [`SqlOutboxStore`], checked by [`SqlOutboxStore::open`].
///
/// ```
/// use acemq_amqp::patterns::outbox::SqlOutboxStoreOptions;
/// use std::time::Duration;
/// let options = SqlOutboxStoreOptions::default()
///     .table("orders_outbox")
///     .max_attempts(5)
///     .lease(Duration::from_secs(10));
/// # let _ = options;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlOutboxStoreOptions {
    table: String,
    max_attempts: u32,
    lease: Duration,
}

impl Default for SqlOutboxStoreOptions {
    fn default() -> Self {
        SqlOutboxStoreOptions {
            table: sql::DEFAULT_OUTBOX_TABLE.to_owned(),
            max_attempts: 10,
            lease: Duration::from_secs(30),
        }
    }
}

impl SqlOutboxStoreOptions {
    /// The table's name, a plain identifier. Defaults to `acemq_outbox`.
    #[must_use]
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }

    /// Failed attempts after which a record is retired (at least 1). Defaults to 10.
    #[must_use]
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// How long `pending` leases the records it returns (at least 1 ms). Defaults to 30 s.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
}

impl fmt::Debug for SqlOutboxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlOutboxStore")
            .field("table", &self.table)
            .field("max_attempts", &self.max_attempts)
            .field("lease", &self.lease)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl SqlOutboxStore {
    /// A store with these options, using `connect` as the connections factory for its own
    /// operations (`pending`, `mark_published`, …): called once per operation. Checks the
    /// options; does not touch the database.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a table name that is not a plain identifier,
    /// [`Error::InvalidArgument`] for zero `max_attempts` or a lease under 1 ms.
    pub fn open<F, C>(connect: F, options: SqlOutboxStoreOptions) -> Result<SqlOutboxStore>
    where
        F: Fn() -> Result<C> + Send + Sync + 'static,
        C: Sql + 'static,
    {
        let SqlOutboxStoreOptions {
            table,
            max_attempts,
            lease,
        } = options;
        sql::check_identifier(&table)?;
        check_limits(max_attempts, lease)?;
        let n = OWNERS.fetch_add(1, Ordering::Relaxed);
        let owner = format!("{}-{}-{}", std::process::id(), n, crate::envelope::now_ms());
        Ok(SqlOutboxStore {
            statements: sql::PerDialect::new(),
            connect: sql::erase(connect),
            table,
            max_attempts,
            lease,
            owner,
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Failed attempts after which a record is retired.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// This instance's lease owner id.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Creates the table if it does not exist (development and tests).
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] if the statements fail.
    pub fn create_table(&self) -> Result<()> {
        let mut conn = (self.connect)()?;
        sql::create_schema(&mut *conn, &[Table::Outbox(self.table.clone())])
    }

    /// Inserts `record` on the caller's transaction and returns its id. Never commits,
    /// rolls back or begins anything: the record becomes visible when `tx` commits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `tx` is a connection in autocommit mode (no open
    /// transaction), [`Error::Sql`] if the insert fails.
    pub fn add(&self, tx: &mut dyn Sql, record: &NewOutboxRecord) -> Result<i64> {
        if tx.in_transaction() == Some(false) {
            return Err(Error::invalid(format!(
                "outbox add on table {} needs the caller's open transaction, \
                 got a connection in autocommit mode",
                self.table
            )));
        }
        let s = self.statements(tx);
        let params = [
            Value::Text(record.exchange.clone()),
            Value::Text(record.routing_key.clone()),
            Value::Bytes(record.body.clone()),
            Value::Text(record.content_type.clone()),
            Value::Text(headers_json(&record.headers)?),
            Value::Integer(sql::now_ms()),
        ];
        let rows = match s.dialect {
            // The id the insert generated, kept per connection by the server.
            Dialect::Mysql => tx
                .execute(&s.add, &params)
                .and_then(|_| tx.query("SELECT LAST_INSERT_ID()", &[])),
            Dialect::Sqlite | Dialect::Postgres => tx.query(&s.add, &params),
        }
        .map_err(|e| self.context(e, "adding a record"))?;
        match rows.first() {
            Some(row) => sql::col_i64(row, 0),
            None => Err(Error::sql(
                format!("adding a record to table {}", self.table),
                "the insert returned no id",
            )),
        }
    }

    fn statements(&self, conn: &dyn Sql) -> &Statements {
        self.statements
            .get(conn.dialect(), |d| Statements::new(&self.table, d))
    }

    fn context(&self, e: Error, what: &str) -> Error {
        sql::rewrap(e, || format!("{what} in table {}", self.table))
    }

    /// Leased rows as records, in id order. A row that cannot be read (another program wrote
    /// it: headers that are not a JSON object, a column of the wrong type) can never be
    /// published: it is retired at once — its attempts set to the limit, `last_error` saying
    /// what could not be read — and left out, so it never blocks the records behind it and
    /// stays in the table for an operator ([`OutboxStore::retired`], `acemq outbox`).
    fn readable(&self, rows: &[Vec<Value>]) -> Result<Vec<OutboxRecord>> {
        let mut records = Vec::with_capacity(rows.len());
        for row in rows {
            match record(row) {
                Ok(r) => records.push(r),
                Err(e) => {
                    let id = sql::col_i64(row, 0)?;
                    let reason = format!("acemq: the row cannot be read: {e}");
                    log::error!(
                        "acemq: outbox record {id} in {} cannot be read ({e}); it is retired",
                        self.table
                    );
                    self.by_id(
                        "retiring a record that cannot be read",
                        |s| &s.retire,
                        &[
                            Value::Integer(id),
                            Value::Text(reason),
                            Value::Integer(i64::from(self.max_attempts)),
                        ],
                    )?;
                }
            }
        }
        records.sort_by_key(|r| r.id);
        Ok(records)
    }

    /// What a lease of `limit` records is made of: this store's owner, lease and attempts limit.
    fn lease_of(&self, limit: usize) -> (&str, Duration, u32, usize) {
        (&self.owner, self.lease, self.max_attempts, limit)
    }

    fn by_id(&self, what: &str, pick: fn(&Statements) -> &str, params: &[Value]) -> Result<()> {
        let mut conn = (self.connect)()?;
        let s = self.statements(&*conn);
        conn.execute(pick(s), params)
            .map_err(|e| self.context(e, what))?;
        Ok(())
    }
}

impl OutboxStore for SqlOutboxStore {
    fn lease(&self) -> Duration {
        self.lease
    }

    fn pending(&self, limit: usize) -> Result<Vec<OutboxRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = (self.connect)()?;
        let s = self.statements(&*conn);
        let rows = if s.dialect == Dialect::Mysql {
            mysql::lease(&mut *conn, s, &[], self.lease_of(limit), |e, what| {
                self.context(e, what)
            })?
        } else {
            let (lease_sql, params) = s.lease(&self.owner, self.lease, self.max_attempts, limit);
            conn.query(&lease_sql, &params)
                .map_err(|e| self.context(e, "leasing pending records"))?
        };
        drop(conn);
        self.readable(&rows)
    }

    fn mark_published(&self, id: i64) -> Result<()> {
        self.by_id(
            "deleting a published record",
            |s| &s.delete,
            &[Value::Integer(id)],
        )
    }

    fn record_failure(&self, id: i64, error: &str) -> Result<()> {
        self.by_id(
            "recording a failure",
            |s| &s.failure,
            &[Value::Integer(id), Value::Text(error.to_owned())],
        )
    }

    fn retired(&self) -> Result<Vec<OutboxRecord>> {
        let mut conn = (self.connect)()?;
        let s = self.statements(&*conn);
        let rows = conn
            .query(&s.retired, &[Value::Integer(i64::from(self.max_attempts))])
            .map_err(|e| self.context(e, "listing retired records"))?;
        // A row retired because it could not be read is listed with what can be read of it.
        rows.iter()
            .map(|r| record(r).or_else(|_| record_lossy(r)))
            .collect()
    }

    fn release(&self, id: i64) -> Result<()> {
        self.by_id("releasing a record", |s| &s.release, &[Value::Integer(id)])
    }

    fn mark_published_many(&self, ids: &[i64]) -> Result<()> {
        for chunk in ids.chunks(500) {
            let mut conn = (self.connect)()?;
            let s = self.statements(&*conn);
            let sql = s.delete_many(chunk.len());
            conn.execute(&sql, &s.id_params(chunk))
                .map_err(|e| self.context(e, "deleting published records"))?;
        }
        Ok(())
    }

    /// One commit: a single statement on PostgreSQL, `BEGIN IMMEDIATE` … `COMMIT` on SQLite, a
    /// transaction of a delete, a locking read and an update on MySQL.
    fn mark_published_and_lease(
        &self,
        published: &[i64],
        limit: usize,
    ) -> Result<Vec<OutboxRecord>> {
        if published.is_empty() || published.len() > 500 || limit == 0 {
            self.mark_published_many(published)?;
            return self.pending(limit);
        }
        let mut conn = (self.connect)()?;
        let s = self.statements(&*conn);
        let (lease_sql, lease) = s.lease(&self.owner, self.lease, self.max_attempts, limit);
        let ids = s.id_params(published);
        let rows = match s.dialect {
            Dialect::Postgres => {
                let params: Vec<Value> = lease.into_iter().chain(ids).collect();
                conn.query(&s.delete_and_lease, &params)
                    .map_err(|e| self.context(e, "deleting published records and leasing"))?
            }
            Dialect::Mysql => {
                mysql::lease(&mut *conn, s, published, self.lease_of(limit), |e, what| {
                    self.context(e, what)
                })?
            }
            Dialect::Sqlite => {
                let delete = s.delete_many(published.len());
                let params = ids;
                sql::in_one_transaction(
                    &mut *conn,
                    "a delete and lease",
                    |e, what| self.context(e, what),
                    |tx| {
                        tx.execute(&delete, &params)
                            .and_then(|_| tx.query(&lease_sql, &lease))
                            .map_err(|e| self.context(e, "deleting published records and leasing"))
                    },
                )?
            }
        };
        drop(conn);
        self.readable(&rows)
    }

    fn unlease(&self, ids: &[i64]) -> Result<()> {
        for chunk in ids.chunks(500) {
            let mut conn = (self.connect)()?;
            let s = self.statements(&*conn);
            let sql = s.unlease_many(chunk.len());
            let mut params = vec![Value::Text(self.owner.clone())];
            params.extend(s.id_params(chunk));
            conn.execute(&sql, &params)
                .map_err(|e| self.context(e, "ending leases"))?;
        }
        Ok(())
    }

    fn renew(&self, ids: &[i64]) -> Result<Vec<i64>> {
        let mut renewed = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let mut conn = (self.connect)()?;
            let s = self.statements(&*conn);
            if s.dialect == Dialect::Mysql {
                renewed.extend(mysql::renew(
                    &mut *conn,
                    s,
                    &self.owner,
                    self.lease,
                    chunk,
                    |e, what| self.context(e, what),
                )?);
                continue;
            }
            let sql = s.renew_many(chunk.len());
            let mut params = vec![
                Value::Text(self.owner.clone()),
                Value::Integer(sql::duration_ms(self.lease)),
            ];
            params.extend(s.id_params(chunk));
            let rows = conn
                .query(&sql, &params)
                .map_err(|e| self.context(e, "renewing leases"))?;
            for row in &rows {
                renewed.push(sql::col_i64(row, 0)?);
            }
        }
        Ok(renewed)
    }

    fn stats(&self) -> Result<OutboxStats> {
        let mut conn = (self.connect)()?;
        let s = self.statements(&*conn);
        let rows = conn
            .query(&s.stats, &[Value::Integer(i64::from(self.max_attempts))])
            .map_err(|e| self.context(e, "counting pending records"))?;
        let row = rows.first().map(Vec::as_slice).unwrap_or(&[]);
        Ok(OutboxStats {
            pending: row
                .first()
                .and_then(Value::as_i64)
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or(0),
            oldest_created_ms: row.get(1).and_then(Value::as_i64),
        })
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::{SqlOutboxStore, SqlOutboxStoreOptions};
    use crate::patterns::outbox::store::{NewOutboxRecord, OutboxStore};
    use crate::sql::{checkout, SqliteManager};
    use rusqlite::StatementStatus;

    type Pool = r2d2::Pool<SqliteManager>;

    /// A SQLite outbox `table` over a pool of one connection (its statement cache is the one
    /// the store used), holding `n` records; the directory goes with the first value.
    fn one_connection_outbox(table: &str, n: usize) -> (tempfile::TempDir, Pool, SqlOutboxStore) {
        let dir = tempfile::tempdir().unwrap();
        let pool = r2d2::Pool::builder()
            .max_size(1)
            .build(SqliteManager::file(dir.path().join("outbox.db")))
            .unwrap();
        let store = SqlOutboxStore::open(
            checkout(&pool),
            SqlOutboxStoreOptions::default().table(table),
        )
        .unwrap();
        store.create_table().unwrap();
        let mut conn = pool.get().unwrap();
        let mut tx = conn.transaction().unwrap();
        for i in 0..n {
            let record = NewOutboxRecord {
                routing_key: "q".into(),
                body: i.to_string().into_bytes(),
                content_type: "text/plain".into(),
                ..Default::default()
            };
            store.add(&mut tx, &record).unwrap();
        }
        tx.commit().unwrap();
        drop(conn);
        (dir, pool, store)
    }

    /// rusqlite clears a cached statement's parameters when it goes back to the cache; SQLite
    /// marks a statement whose plan used a bound value (a `LIMIT ?`) stale when that parameter
    /// is cleared or bound again, and then compiles it anew at its next step. The lease ran
    /// every sweep through such a statement: a full re-prepare per batch.
    #[test]
    fn a_sqlite_lease_is_not_prepared_again_on_every_sweep() {
        let (_dir, pool, store) = one_connection_outbox("lease_prepared_once", 40);
        let mut leased = store.pending(5).unwrap();
        for batch in 1..=5 {
            let ids: Vec<i64> = leased.iter().map(|r| r.id).collect();
            leased = store.mark_published_and_lease(&ids, 5).unwrap();
            let next: Vec<i64> = leased.iter().map(|r| r.id).collect();
            assert_eq!(next, (batch * 5 + 1..=batch * 5 + 5).collect::<Vec<i64>>());
        }
        let conn = pool.get().unwrap();
        let (sql, _) =
            store
                .statements(&*conn)
                .lease(store.owner(), store.lease, store.max_attempts, 5);
        let stmt = conn.prepare_cached(&sql).unwrap();
        // The cached statement is the one the six leases ran (else this test proves nothing).
        assert_eq!(stmt.get_status(StatementStatus::Run), 6);
        assert_eq!(
            stmt.get_status(StatementStatus::RePrepare),
            0,
            "the lease statement was compiled again after being prepared: {sql}"
        );
    }

    /// The limit is written into SQLite's statement: one past `i64::MAX` (a `usize` can be)
    /// would read as a real number there and fail the lease.
    #[test]
    fn a_sqlite_lease_of_usize_max_records_leases_them_all() {
        let (_dir, _pool, store) = one_connection_outbox("lease_without_bound", 3);
        assert_eq!(store.pending(usize::MAX).unwrap().len(), 3);
    }
}
