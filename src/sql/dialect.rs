//! The database kinds behind the seam: [`Dialect`], and what is kept per dialect.

use std::fmt;

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
    pub(super) fn serial_key(self) -> &'static str {
        match self {
            Dialect::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
            Dialect::Postgres => "BIGSERIAL PRIMARY KEY",
        }
    }

    /// The column type for bytes.
    pub(super) fn bytes(self) -> &'static str {
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
