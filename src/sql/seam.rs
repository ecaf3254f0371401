//! The seam itself: the [`Sql`] trait (statements on a connection or a transaction), the
//! transaction traits, and the type-erased connections factory the stores keep.

use std::sync::Arc;

use super::dialect::Dialect;
use super::value::Value;
use crate::error::{Error, Result};

/// A blocking database connection or transaction, as the stores see it.
///
/// Object-safe: stores take `&mut dyn Sql` where they must write on the caller's transaction.
/// Statements use the dialect's placeholders (see the [module docs](super)).
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
/// write lock from the first statement, so no lock upgrade can fail), `BEGIN` on PostgreSQL,
/// `START TRANSACTION` on MySQL —
/// and commits when it succeeds, rolls back when it fails (its error wins) or panics. `what` names the
/// transaction in the errors of its `BEGIN` and `COMMIT` ("beginning {what}"), which `context`
/// turns into the store's error.
pub(crate) fn in_one_transaction<T>(
    conn: &mut dyn Sql,
    what: &str,
    context: impl Fn(Error, &str) -> Error,
    f: impl FnOnce(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    let begin = conn.dialect().begin();
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
