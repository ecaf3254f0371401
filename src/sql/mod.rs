//! The SQL seam: a small, blocking, DB-API-like view of a database connection.
//!
//! The stores in [`patterns`](crate::patterns) (idempotency, outbox, schema registry) speak to
//! the database only through the [`Sql`] trait, which is implemented for
//! `rusqlite::Connection` and `rusqlite::Transaction` (feature `sqlite`, on by default) and for
//! `postgres::Client` and `postgres::Transaction` (feature `postgres`).
//!
//! # Placeholders
//!
//! Statements are written in the connection's own placeholder syntax: `?1`, `?2`, … (or `?`)
//! for SQLite and `$1`, `$2`, … for PostgreSQL. [`Dialect::placeholder`] writes one, so code that
//! must run on both builds its statements from the connection's [`Sql::dialect`].
//!
//! # Values
//!
//! Parameters and results are [`Value`]s: null, 64-bit integer, text or bytes. On PostgreSQL a
//! non-null parameter is sent typed as `bigint`, `text` or `bytea` (one round trip, no prepared
//! statement); write a cast (`$1::jsonb`) where a column needs another type. A statement with a
//! `Value::Null` parameter is prepared first so the server infers the parameter types. Results of
//! type `smallint`/`integer`/`bigint`/`boolean` come back as [`Value::Integer`], `bytea` as
//! [`Value::Bytes`], other types as [`Value::Text`] when they can be read as text. SQLite `REAL`
//! values come back as text.
//!
//! # Connections factory
//!
//! A store does its own work (a claim, a lease, a registration) on a connection it gets from a
//! *connections factory*: a closure `Fn() -> Result<C>` with `C: Sql`, called once for each of
//! the store's operations, the connection dropped at the end of it. A closure that opens a new
//! connection each time works; an [`r2d2`] pool checkout ([`checkout`], with [`SqliteManager`]
//! or `r2d2_postgres`'s [`PostgresConnectionManager`]) is faster and replaces connections the
//! server killed. On PostgreSQL, wrap the manager in [`CheckIdle`]: r2d2's health check on
//! checkout is otherwise a round trip before each of the store's operations. Work that must
//! commit with the caller's own (outbox `add`, transactional idempotency) takes the caller's
//! transaction as `&mut dyn Sql` instead.
//!
//! # Tables
//!
//! [`create_schema`] creates the tables for development and tests; [`schema_ddl`] returns the
//! same statements for a migration tool. Times are epoch milliseconds in `BIGINT` columns. Table
//! names reach SQL by concatenation, so every name is checked by [`check_identifier`] first.

use std::fmt;

use std::sync::Arc;

use crate::error::{Error, Result};

/// `Sql` for a type that dereferences to one that is `Sql` (a `&mut`, a `Box`, a pool's
/// checkout, a [`CheckIdle`] connection): every method forwarded. The impl's generics and
/// bounds in brackets, then the type.
macro_rules! forward_sql {
    ([$($generics:tt)*] $ty:ty $(, where $($bounds:tt)+)?) => {
        impl<$($generics)*> $crate::sql::Sql for $ty $(where $($bounds)+)? {
            fn dialect(&self) -> $crate::sql::Dialect {
                (**self).dialect()
            }
            fn execute(
                &mut self,
                sql: &str,
                params: &[$crate::sql::Value],
            ) -> $crate::error::Result<u64> {
                (**self).execute(sql, params)
            }
            fn query(
                &mut self,
                sql: &str,
                params: &[$crate::sql::Value],
            ) -> $crate::error::Result<Vec<Vec<$crate::sql::Value>>> {
                (**self).query(sql, params)
            }
            fn in_transaction(&self) -> Option<bool> {
                (**self).in_transaction()
            }
        }
    };
}

mod pool;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "postgres")]
pub use pool::PostgresConnectionManager;
#[cfg(feature = "sqlite")]
pub use pool::SqliteManager;
pub use pool::{checkout, CheckIdle, Idle};
/// The r2d2 this crate implements [`Sql`] for (`r2d2::PooledConnection`).
pub use r2d2;

/// The default name of the idempotency table.
pub const DEFAULT_IDEMPOTENCY_TABLE: &str = "acemq_idempotency";
/// The default name of the outbox table.
pub const DEFAULT_OUTBOX_TABLE: &str = "acemq_outbox";
/// The default name of the schema registry table.
pub const DEFAULT_SCHEMAS_TABLE: &str = "acemq_schemas";

/// A parameter or a result column.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// A 64-bit signed integer (`BIGINT`).
    Integer(i64),
    /// UTF-8 text.
    Text(String),
    /// Bytes (`BLOB`, `BYTEA`).
    Bytes(Vec<u8>),
}

impl Value {
    /// The integer, if this is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// The text, if this is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes, if these are bytes (or text, as its UTF-8 bytes).
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            Value::Text(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// True for [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Integer(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Value {
        Value::Bytes(v)
    }
}

impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Value {
        Value::Bytes(v.to_vec())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}

/// The SQL dialect of a connection: it decides placeholders, upserts and DDL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// SQLite 3.35 or later (`?N` placeholders).
    Sqlite,
    /// PostgreSQL 11 or later (`$N` placeholders).
    Postgres,
}

impl Dialect {
    /// The placeholder for the `n`th parameter, counting from 1: `?1` or `$1`.
    pub fn placeholder(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }

    /// `sql` written with PostgreSQL's numbered placeholders (`$1`, `$2`, …) in this dialect: as
    /// it is on PostgreSQL, with SQLite's numbered form (`?1`, `?2`, …) on SQLite. The stores
    /// write each statement once, this way.
    pub fn placeholders(self, sql: &str) -> String {
        match self {
            Dialect::Postgres => sql.to_string(),
            Dialect::Sqlite => sql.replace('$', "?"),
        }
    }

    /// An SQL expression for the database's clock, now, in milliseconds since the Unix epoch
    /// (a `BIGINT`).
    ///
    /// The stores write and compare every lease, claim and retention deadline with it, so
    /// that the database's clock decides them and the clocks of the hosts running the stores
    /// may disagree (see [`SqlIdempotencyStore`] and [`SqlOutboxStore`]).
    ///
    /// - PostgreSQL: `(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT`, the server's
    ///   clock when the expression is evaluated (not the start of the transaction, as `now()`
    ///   would be: a claim made on a long transaction still gets its whole lease).
    /// - SQLite: `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`. SQLite runs in
    ///   the process, so this is the client's clock; the processes sharing a database file run
    ///   on one host and share its clock.
    ///
    /// [`SqlIdempotencyStore`]: crate::patterns::idempotency::SqlIdempotencyStore
    /// [`SqlOutboxStore`]: crate::patterns::outbox::SqlOutboxStore
    pub fn now_ms_sql(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
            Dialect::Postgres => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
        }
    }

    /// The column type of an auto-incrementing 64-bit primary key.
    fn serial_key(self) -> &'static str {
        match self {
            Dialect::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
            Dialect::Postgres => "BIGSERIAL PRIMARY KEY",
        }
    }

    /// The column type for bytes.
    fn bytes(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BLOB",
            Dialect::Postgres => "BYTEA",
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgresql",
        })
    }
}

/// A blocking database connection or transaction, as the stores see it.
///
/// Object-safe: stores take `&mut dyn Sql` where they must write on the caller's transaction.
/// Statements use the dialect's placeholders (see the [module docs](self)).
pub trait Sql {
    /// The connection's dialect.
    fn dialect(&self) -> Dialect;

    /// Runs a statement that returns no rows and returns the number of rows it changed.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] with the driver's error as its source.
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64>;

    /// Runs a statement (a `SELECT`, or a write with `RETURNING`) and returns all its rows.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] with the driver's error as its source.
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>>;

    /// Whether this is inside an open transaction: `Some(true)` for a transaction,
    /// `Some(false)` for a connection in autocommit mode, `None` when it cannot tell.
    ///
    /// Defaults to `None`. The outbox refuses to `add` on `Some(false)`.
    fn in_transaction(&self) -> Option<bool> {
        None
    }
}

forward_sql!([T: Sql + ?Sized] &mut T);
forward_sql!([T: Sql + ?Sized] Box<T>);

/// A connection that begins transactions of its driver's own type.
///
/// Implemented for `rusqlite::Connection` (its transaction is `rusqlite::Transaction`, begun
/// with `BEGIN IMMEDIATE` so that it holds the write lock from its first statement),
/// `postgres::Client` (`postgres::Transaction`) and an r2d2 [`PooledConnection`] of either.
/// [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx) runs its handler on such a transaction,
/// so the handler writes its business SQL with the driver's own API and can pass the same
/// transaction to the stores (`&mut dyn Sql`), for example to
/// [`SqlOutboxStore::add`](crate::patterns::outbox::SqlOutboxStore::add).
///
/// A method-name note for rusqlite: with [`Sql`] imported, `tx.execute(…)` on a
/// `&mut rusqlite::Transaction` calls [`Sql::execute`] (a method of the transaction itself is
/// found before rusqlite's `Connection::execute`, which it reaches through `Deref`). Handler
/// code that does not import `Sql`, or that calls through a `&rusqlite::Connection`
/// (`let conn: &rusqlite::Connection = tx;`), gets rusqlite's. `postgres::Transaction` has its
/// own `execute`, which always wins.
///
/// [`PooledConnection`]: r2d2::PooledConnection
pub trait Transactional {
    /// The driver's transaction type.
    type Transaction<'c>: SqlTransaction
    where
        Self: 'c;

    /// Begins a transaction.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] with the driver's error as its source.
    fn begin(&mut self) -> Result<Self::Transaction<'_>>;
}

/// A driver's transaction: [`Sql`], and the two ways it ends. Dropping it rolls it back.
pub trait SqlTransaction: Sql {
    /// Commits the transaction.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] with the driver's error as its source; the transaction is then over.
    fn commit(self) -> Result<()>
    where
        Self: Sized;

    /// Rolls the transaction back.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] with the driver's error as its source; the transaction is then over.
    fn rollback(self) -> Result<()>
    where
        Self: Sized;
}

/// The longest identifier accepted, in bytes (PostgreSQL's limit).
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// Checks that `name` is a plain SQL identifier: `[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes.
///
/// Table names reach SQL by concatenation; anything else is refused.
///
/// # Errors
///
/// [`Error::InvalidName`] with kind `"table"` and the reason.
pub fn check_identifier(name: &str) -> Result<()> {
    let refuse = |reason: &str| {
        let shown: String = name.chars().take(80).collect();
        Err(Error::InvalidName {
            kind: "table",
            name: shown,
            reason: reason.to_owned(),
        })
    };
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.len() > MAX_IDENTIFIER_LEN {
        return refuse("it is longer than 63 bytes");
    }
    let mut bytes = name.bytes();
    if let Some(first) = bytes.next() {
        if !(first.is_ascii_alphabetic() || first == b'_') {
            return refuse("it must start with an ASCII letter or '_'");
        }
    }
    if !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return refuse("only ASCII letters, digits and '_' are allowed");
    }
    Ok(())
}

/// A table to create, with its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    /// An idempotency table (`key`, `state`, `deadline_ms`, `token`: the holder of a claim).
    Idempotency(String),
    /// An outbox table.
    Outbox(String),
    /// A schema registry table.
    Schemas(String),
}

impl Table {
    /// The idempotency table under its default name, `acemq_idempotency`.
    pub fn idempotency() -> Table {
        Table::Idempotency(DEFAULT_IDEMPOTENCY_TABLE.to_owned())
    }

    /// The outbox table under its default name, `acemq_outbox`.
    pub fn outbox() -> Table {
        Table::Outbox(DEFAULT_OUTBOX_TABLE.to_owned())
    }

    /// The schema registry table under its default name, `acemq_schemas`.
    pub fn schemas() -> Table {
        Table::Schemas(DEFAULT_SCHEMAS_TABLE.to_owned())
    }

    /// All three tables under their default names.
    pub fn all() -> Vec<Table> {
        vec![Table::idempotency(), Table::outbox(), Table::schemas()]
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        match self {
            Table::Idempotency(n) | Table::Outbox(n) | Table::Schemas(n) => n,
        }
    }

    /// The statements that create this table and its indexes (idempotent: `IF NOT EXISTS`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] if the name is not a plain identifier.
    pub fn ddl(&self, dialect: Dialect) -> Result<Vec<String>> {
        let t = self.name();
        check_identifier(t)?;
        Ok(match self {
            Table::Idempotency(_) => vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\n    \
                     key TEXT PRIMARY KEY,\n    \
                     state TEXT NOT NULL CHECK (state IN ('CLAIMED', 'CONFIRMED')),\n    \
                     deadline_ms BIGINT NOT NULL,\n    \
                     token TEXT\n)"
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_deadline ON {t} (deadline_ms)"),
            ],
            Table::Outbox(_) => vec![format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    \
                     id {serial},\n    \
                     exchange TEXT NOT NULL,\n    \
                     routing_key TEXT NOT NULL,\n    \
                     body {bytes} NOT NULL,\n    \
                     content_type TEXT NOT NULL,\n    \
                     headers TEXT NOT NULL,\n    \
                     created_ms BIGINT NOT NULL,\n    \
                     attempts BIGINT NOT NULL DEFAULT 0,\n    \
                     last_error TEXT,\n    \
                     lease_owner TEXT,\n    \
                     lease_until_ms BIGINT NOT NULL DEFAULT 0\n)",
                serial = dialect.serial_key(),
                bytes = dialect.bytes(),
            )],
            Table::Schemas(_) => vec![format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    \
                 id {serial},\n    \
                 subject TEXT NOT NULL,\n    \
                 version BIGINT NOT NULL,\n    \
                 format TEXT NOT NULL,\n    \
                 definition TEXT NOT NULL,\n    \
                 fingerprint TEXT NOT NULL,\n    \
                 created_ms BIGINT NOT NULL,\n    \
                 UNIQUE (subject, version),\n    \
                 UNIQUE (subject, fingerprint)\n)",
                serial = dialect.serial_key(),
            )],
        })
    }
}

/// Creates the given tables (and their indexes) if they do not exist, on `conn`.
///
/// For development and tests; production schemas belong to a migration tool (see
/// [`schema_ddl`]). Each statement runs on `conn` as given: in autocommit mode each commits by
/// itself, on a transaction they commit with it.
///
/// # Errors
///
/// [`Error::InvalidName`] for a name that is not a plain identifier, [`Error::Sql`] if a
/// statement fails.
///
/// # Example
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> acemq_amqp::Result<()> {
/// use acemq_amqp::sql::{create_schema, Table};
/// let mut conn = rusqlite::Connection::open_in_memory().map_err(|e| acemq_amqp::Error::Sql {
///     context: "opening".into(),
///     source: e.into(),
/// })?;
/// create_schema(&mut conn, &Table::all())?;
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
pub fn create_schema(conn: &mut dyn Sql, which: &[Table]) -> Result<()> {
    let dialect = conn.dialect();
    for table in which {
        for statement in table.ddl(dialect)? {
            conn.execute(&statement, &[])
                .map_err(|e| rewrap(e, || format!("creating table {}", table.name())))?;
        }
    }
    Ok(())
}

/// The statements that create the three tables under their default names, each ending in `;`,
/// for a migration tool.
pub fn schema_ddl(dialect: Dialect) -> String {
    let mut out = String::new();
    for table in Table::all() {
        // The default names are valid identifiers, so `ddl` cannot fail here.
        for statement in table.ddl(dialect).unwrap_or_default() {
            out.push_str(&statement);
            out.push_str(";\n");
        }
    }
    out
}

/// Replaces the context of an [`Error::Sql`], keeping its source; other errors pass through.
pub(crate) fn rewrap(e: Error, context: impl FnOnce() -> String) -> Error {
    match e {
        Error::Sql { source, .. } => Error::Sql {
            context: context(),
            source,
        },
        other => other,
    }
}

/// Runs `f` in one transaction on an autocommit connection — `BEGIN IMMEDIATE` on SQLite (the
/// write lock from the first statement, so no lock upgrade can fail), `BEGIN` on PostgreSQL —
/// and commits when it succeeds, rolls back when it fails (its error wins) or panics. `what` names the
/// transaction in the errors of its `BEGIN` and `COMMIT` ("beginning {what}"), which `context`
/// turns into the store's error.
pub(crate) fn in_one_transaction<T>(
    conn: &mut dyn Sql,
    what: &str,
    context: impl Fn(Error, &str) -> Error,
    f: impl FnOnce(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    let begin = match conn.dialect() {
        Dialect::Sqlite => "BEGIN IMMEDIATE",
        Dialect::Postgres => "BEGIN",
    };
    conn.execute(begin, &[])
        .map_err(|e| context(e, &format!("beginning {what}")))?;
    // Rolled back on a panic too, so a pooled connection never goes back mid-transaction.
    let done = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut *conn))) {
        Ok(done) => done,
        Err(panic) => {
            let _ = conn.execute("ROLLBACK", &[]);
            std::panic::resume_unwind(panic)
        }
    };
    let end = if done.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn
        .execute(end, &[])
        .map_err(|e| context(e, &format!("ending {what}")));
    let done = done?;
    ended?;
    Ok(done)
}

pub(crate) use crate::envelope::now_ms;

/// The longest duration [`duration_ms`] returns: half of `i64::MAX` ms, so that the database's
/// clock plus or minus it cannot overflow a `BIGINT`.
const MAX_DURATION_MS: i64 = i64::MAX / 2;

/// A duration in whole milliseconds, saturating at [`MAX_DURATION_MS`] (about 146 million
/// years), so that `now ± duration` in SQL cannot overflow.
pub(crate) fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).map_or(MAX_DURATION_MS, |ms| ms.min(MAX_DURATION_MS))
}

/// A type-erased connections factory, as the stores keep it.
pub(crate) type Connect = Arc<dyn Fn() -> Result<Box<dyn Sql>> + Send + Sync>;

/// Erases a connections factory's connection type.
pub(crate) fn erase<F, C>(connect: F) -> Connect
where
    F: Fn() -> Result<C> + Send + Sync + 'static,
    C: Sql + 'static,
{
    Arc::new(move || connect().map(|c| Box::new(c) as Box<dyn Sql>))
}

/// Reads column `i` of `row` as an integer.
pub(crate) fn col_i64(row: &[Value], i: usize) -> Result<i64> {
    match row.get(i) {
        Some(Value::Integer(v)) => Ok(*v),
        other => Err(unexpected(i, "an integer", other)),
    }
}

/// Reads column `i` of `row` as text.
pub(crate) fn col_text(row: &[Value], i: usize) -> Result<String> {
    match row.get(i) {
        Some(Value::Text(v)) => Ok(v.clone()),
        Some(Value::Bytes(b)) => String::from_utf8(b.clone())
            .map_err(|e| Error::sql(format!("reading column {i} as text"), e)),
        other => Err(unexpected(i, "text", other)),
    }
}

/// Reads column `i` of `row` as optional text.
pub(crate) fn col_opt_text(row: &[Value], i: usize) -> Result<Option<String>> {
    match row.get(i) {
        Some(Value::Null) => Ok(None),
        _ => col_text(row, i).map(Some),
    }
}

/// Reads column `i` of `row` as bytes.
pub(crate) fn col_bytes(row: &[Value], i: usize) -> Result<Vec<u8>> {
    match row.get(i) {
        Some(Value::Bytes(b)) => Ok(b.clone()),
        Some(Value::Text(s)) => Ok(s.clone().into_bytes()),
        other => Err(unexpected(i, "bytes", other)),
    }
}

fn unexpected(i: usize, wanted: &str, got: Option<&Value>) -> Error {
    Error::sql(
        format!("reading column {i}"),
        format!("expected {wanted}, found {got:?}"),
    )
}

/// A store's statements, built for a dialect the first time one of its connections of that
/// dialect is used (a store sees one dialect in practice, so it builds one set).
pub(crate) struct PerDialect<T> {
    sqlite: std::sync::OnceLock<T>,
    postgres: std::sync::OnceLock<T>,
}

impl<T> PerDialect<T> {
    pub(crate) fn new() -> PerDialect<T> {
        PerDialect {
            sqlite: std::sync::OnceLock::new(),
            postgres: std::sync::OnceLock::new(),
        }
    }

    /// The statements for `dialect`, built by `build` on first use.
    pub(crate) fn get(&self, dialect: Dialect, build: impl FnOnce(Dialect) -> T) -> &T {
        let cell = match dialect {
            Dialect::Sqlite => &self.sqlite,
            Dialect::Postgres => &self.postgres,
        };
        cell.get_or_init(|| build(dialect))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(check_identifier("acemq_outbox").is_ok());
        assert!(check_identifier("_t9").is_ok());
        assert!(check_identifier(&"a".repeat(63)).is_ok());
        for bad in ["", "9t", "t-1", "t; DROP TABLE x", "tä", &"a".repeat(64)] {
            assert!(
                matches!(
                    check_identifier(bad),
                    Err(Error::InvalidName { kind: "table", .. })
                ),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn durations_leave_room_for_the_clock() {
        assert_eq!(duration_ms(std::time::Duration::from_millis(1500)), 1500);
        let longest = duration_ms(std::time::Duration::MAX);
        assert!(longest.checked_add(now_ms()).is_some());
        assert!(now_ms().checked_sub(longest).is_some());
        // The stores turn `$N` into `?N` for SQLite in whole statements, this expression included.
        for d in [Dialect::Sqlite, Dialect::Postgres] {
            assert!(!d.now_ms_sql().contains(['$', '?']), "{d}");
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_now_is_the_epoch_in_ms() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap_or_else(|e| panic!("{e}"));
        let before = now_ms();
        let rows = Sql::query(
            &mut conn,
            &format!("SELECT {}", Dialect::Sqlite.now_ms_sql()),
            &[],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let after = now_ms();
        let db = rows[0][0].as_i64().unwrap_or_default();
        // julianday('now') has millisecond precision; allow for the rounding of the double.
        assert!(
            db >= before - 2 && db <= after + 2,
            "{before} <= {db} <= {after}"
        );
    }

    #[test]
    fn ddl_names_every_table() {
        for d in [Dialect::Sqlite, Dialect::Postgres] {
            let ddl = schema_ddl(d);
            for t in ["acemq_idempotency", "acemq_outbox", "acemq_schemas"] {
                assert!(ddl.contains(&format!("CREATE TABLE IF NOT EXISTS {t} (")));
            }
            assert!(ddl.contains("deadline_ms BIGINT"));
            assert!(ddl.contains("token TEXT"));
        }
        assert!(schema_ddl(Dialect::Postgres).contains("BYTEA"));
        assert!(schema_ddl(Dialect::Sqlite).contains("BLOB"));
    }
}
