//! The SQL seam: a small, blocking, DB-API-like view of a database connection.
//!
//! The stores in [`patterns`](crate::patterns) (idempotency, outbox, schema registry) speak to
//! the database only through the [`Sql`] trait, which is implemented for
//! `rusqlite::Connection` and `rusqlite::Transaction` (feature `sqlite`, on by default), for
//! `postgres::Client` and `postgres::Transaction` (feature `postgres`), and for the `mysql`
//! crate's `Conn`, `PooledConn` and `Transaction` (feature `mysql`: MySQL 8.0 or later, MariaDB
//! 10.6 or later, InnoDB tables).
//!
//! # Placeholders
//!
//! Statements are written in the connection's own placeholder syntax: `?1`, `?2`, … (or `?`)
//! for SQLite, `$1`, `$2`, … for PostgreSQL, and `?` on MySQL, where the seam also takes `$1`,
//! `$2`, … and sends them as `?` (see [`Dialect::placeholders`]). [`Dialect::placeholder`] writes
//! one, so code that must run on all of them builds its statements from the connection's
//! [`Sql::dialect`].
//!
//! # Values
//!
//! Parameters and results are [`Value`]s: null, 64-bit integer, text or bytes. On PostgreSQL a
//! non-null parameter is sent typed as `bigint`, `text` or `bytea` (one round trip, no prepared
//! statement); write a cast (`$1::jsonb`) where a column needs another type. A statement with a
//! `Value::Null` parameter is prepared first so the server infers the parameter types. Results of
//! type `smallint`/`integer`/`bigint`/`boolean` come back as [`Value::Integer`], `bytea` as
//! [`Value::Bytes`], other types as [`Value::Text`] when they can be read as text. SQLite `REAL`
//! values come back as text. On MySQL a statement with parameters is prepared (the driver caches
//! it per connection) and runs with the binary protocol, one without goes as text; integers come
//! back as [`Value::Integer`] (an unsigned one past `i64::MAX` as text), strings of the binary
//! character set (`BLOB`, `VARBINARY`) as [`Value::Bytes`], the rest as text.
//!
//! # MySQL and MariaDB
//!
//! The stores read the number of rows a statement changed: open MySQL connections without
//! `CLIENT_FOUND_ROWS` (the `mysql` crate's default), which would count rows matched instead and
//! make a duplicate look new to [`first_time`](crate::patterns::idempotency::IdempotencyStore::first_time).
//! Keep the server's strict SQL mode (the default since MySQL 5.7 and MariaDB 10.2.4), so that a
//! key longer than its `VARCHAR(255)` column is an error rather than cut short. A statement that
//! changes the schema commits the transaction it runs in, as MySQL does.
//!
//! # Connections factory
//!
//! A store does its own work (a claim, a lease, a registration) on a connection it gets from a
//! *connections factory*: a closure `Fn() -> Result<C>` with `C: Sql`, called once for each of
//! the store's operations, the connection dropped at the end of it. A closure that opens a new
//! connection each time works; an [`r2d2`] pool checkout ([`checkout`], with [`SqliteManager`]
//! or `r2d2_postgres`'s [`PostgresConnectionManager`], or `MysqlManager`) is faster and replaces
//! connections the server killed. On PostgreSQL and MySQL, wrap the manager in [`CheckIdle`]:
//! r2d2's health check on checkout is otherwise a round trip before each of the store's
//! operations. Work that must
//! commit with the caller's own (outbox `add`, transactional idempotency) takes the caller's
//! transaction as `&mut dyn Sql` instead.
//!
//! # Tables
//!
//! [`create_schema`] creates the tables for development and tests; [`schema_ddl`] returns the
//! same statements for a migration tool. Times are epoch milliseconds in `BIGINT` columns. Table
//! names reach SQL by concatenation, so every name is checked by [`check_identifier`] first.

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

mod dialect;
#[cfg(feature = "mysql")]
mod mysql;
mod pool;
#[cfg(feature = "postgres")]
mod postgres;
mod seam;
#[cfg(feature = "sqlite")]
mod sqlite;
mod table;
mod value;

#[cfg(feature = "mysql")]
pub use self::mysql::{MysqlConnection, MysqlManager};
pub use dialect::Dialect;
pub(crate) use dialect::PerDialect;
#[cfg(feature = "postgres")]
pub use pool::PostgresConnectionManager;
#[cfg(feature = "sqlite")]
pub use pool::SqliteManager;
pub use pool::{checkout, CheckIdle, Idle, WithCauses};
pub(crate) use seam::{erase, in_one_transaction, rewrap, Connect};
pub use seam::{Sql, SqlTransaction, Transactional};
pub use table::{
    check_identifier, create_schema, schema_ddl, Table, DEFAULT_IDEMPOTENCY_TABLE,
    DEFAULT_OUTBOX_TABLE, DEFAULT_SCHEMAS_TABLE, MAX_IDENTIFIER_LEN,
};
pub use value::Value;
pub(crate) use value::{col_bytes, col_i64, col_opt_text, col_text, duration_ms};

/// The r2d2 this crate implements [`Sql`] for (`r2d2::PooledConnection`).
pub use r2d2;

pub(crate) use crate::envelope::now_ms;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

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
