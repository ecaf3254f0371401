//! The database kinds behind the seam: [`Dialect`], and what is kept per dialect.

use std::fmt;

/// The SQL dialect of a connection: it decides placeholders, upserts and DDL.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// SQLite 3.35 or later (`?N` placeholders).
    Sqlite,
    /// PostgreSQL 11 or later (`$N` placeholders).
    Postgres,
    /// MySQL 8.0 or later, or MariaDB 10.6 or later, on InnoDB (`?` placeholders; the seam
    /// also takes `$N`, see [`placeholders`](Self::placeholders)). Feature `mysql`.
    Mysql,
}

impl Dialect {
    /// The placeholder for the `n`th parameter, counting from 1: `?1` on SQLite, `$1` on
    /// PostgreSQL and on MySQL (where the seam sends it as `?`, see
    /// [`placeholders`](Self::placeholders)).
    pub fn placeholder(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres | Dialect::Mysql => format!("${n}"),
        }
    }

    /// `sql` written with PostgreSQL's numbered placeholders (`$1`, `$2`, …) in this dialect: as
    /// it is on PostgreSQL, with SQLite's numbered form (`?1`, `?2`, …) on SQLite. The stores
    /// write each statement once, this way.
    ///
    /// MySQL has only positional `?` placeholders. There the statement stays as it is, and the
    /// seam's MySQL connections (`mysql::Conn`, `mysql::PooledConn`, `mysql::Transaction`)
    /// send each `$N` — not inside quotes or comments, not right after a letter, digit, `_` or
    /// `$` — as `?` with the `N`th parameter bound in its place, so one parameter may be used
    /// more than once. A statement without `$N` goes as written, with its own `?`s.
    pub fn placeholders(self, sql: &str) -> String {
        match self {
            Dialect::Postgres | Dialect::Mysql => sql.to_string(),
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
    /// - MySQL and MariaDB: `TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(3)) DIV 1000`,
    ///   the server's clock when the statement starts, in UTC. Not
    ///   `UNIX_TIMESTAMP(NOW(3)) * 1000`: that reads the time in the session's time zone and back,
    ///   which is an hour off for the hour a daylight saving zone repeats each autumn.
    ///
    /// [`SqlIdempotencyStore`]: crate::patterns::idempotency::SqlIdempotencyStore
    /// [`SqlOutboxStore`]: crate::patterns::outbox::SqlOutboxStore
    pub fn now_ms_sql(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
            Dialect::Postgres => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
            Dialect::Mysql => {
                "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)"
            }
        }
    }

    /// The column `name` as a statement names it: MySQL reserves some of the family's column
    /// names (`key`), so there they are quoted with backticks; elsewhere the name is as it is.
    pub(crate) fn column(self, name: &str) -> String {
        match self {
            Dialect::Mysql => format!("`{name}`"),
            Dialect::Sqlite | Dialect::Postgres => name.to_owned(),
        }
    }

    /// The statement that begins a transaction on an autocommit connection: `BEGIN IMMEDIATE`
    /// on SQLite (the write lock from the first statement, so no lock upgrade can fail),
    /// `BEGIN` on PostgreSQL, `START TRANSACTION` on MySQL.
    pub(crate) fn begin(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BEGIN IMMEDIATE",
            Dialect::Postgres => "BEGIN",
            Dialect::Mysql => "START TRANSACTION",
        }
    }

    /// The column type of an auto-incrementing 64-bit primary key.
    pub(super) fn serial_key(self) -> &'static str {
        match self {
            Dialect::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
            Dialect::Postgres => "BIGSERIAL PRIMARY KEY",
            Dialect::Mysql => "BIGINT AUTO_INCREMENT PRIMARY KEY",
        }
    }

    /// The column type for bytes (on MySQL `LONGBLOB`: a `BLOB` holds at most 64 KiB).
    pub(super) fn bytes(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BLOB",
            Dialect::Postgres => "BYTEA",
            Dialect::Mysql => "LONGBLOB",
        }
    }

    /// The column type for text that may be long (on MySQL `LONGTEXT`: a `TEXT` holds at most
    /// 64 KiB).
    pub(crate) fn long_text(self) -> &'static str {
        match self {
            Dialect::Sqlite | Dialect::Postgres => "TEXT",
            Dialect::Mysql => "LONGTEXT",
        }
    }

    /// The column type for text in a primary key or a unique index: `TEXT`, or on MySQL
    /// `VARCHAR(255)` (an index there needs a length; the tables' binary collation, see
    /// [`table_options`](Self::table_options), compares it byte for byte).
    pub(crate) fn key_text(self) -> &'static str {
        match self {
            Dialect::Sqlite | Dialect::Postgres => "TEXT",
            Dialect::Mysql => "VARCHAR(255)",
        }
    }

    /// What follows a `CREATE TABLE (…)`: on MySQL the InnoDB engine (transactions, row locks),
    /// `utf8mb4` and its binary collation, so that keys `Order-1` and `order-1` stay two keys.
    pub(crate) fn table_options(self) -> &'static str {
        match self {
            Dialect::Sqlite | Dialect::Postgres => "",
            Dialect::Mysql => " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgresql",
            Dialect::Mysql => "mysql",
        })
    }
}

/// A store's statements, built for a dialect the first time one of its connections of that
/// dialect is used (a store sees one dialect in practice, so it builds one set).
pub(crate) struct PerDialect<T> {
    sqlite: std::sync::OnceLock<T>,
    postgres: std::sync::OnceLock<T>,
    mysql: std::sync::OnceLock<T>,
}

impl<T> PerDialect<T> {
    pub(crate) fn new() -> PerDialect<T> {
        PerDialect {
            sqlite: std::sync::OnceLock::new(),
            postgres: std::sync::OnceLock::new(),
            mysql: std::sync::OnceLock::new(),
        }
    }

    /// The statements for `dialect`, built by `build` on first use.
    pub(crate) fn get(&self, dialect: Dialect, build: impl FnOnce(Dialect) -> T) -> &T {
        let cell = match dialect {
            Dialect::Sqlite => &self.sqlite,
            Dialect::Postgres => &self.postgres,
            Dialect::Mysql => &self.mysql,
        };
        cell.get_or_init(|| build(dialect))
    }
}
