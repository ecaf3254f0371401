//! Connection pooling with [`r2d2`], the ecosystem's synchronous pool.
//!
//! r2d2 gives a pool with a maximum size, a checkout timeout, a health check on checkout
//! (`test_on_check_out`, on by default: a connection the server killed, for example in a
//! restart, is discarded and replaced instead of being handed out) and idle reaping. This
//! module adds what the stores need from it:
//!
//! - [`SqliteManager`], an [`r2d2::ManageConnection`] for `rusqlite` (feature `sqlite`); for
//!   PostgreSQL use [`PostgresConnectionManager`] from `r2d2_postgres` (feature `postgres`);
//! - [`Sql`] and [`Transactional`] for [`r2d2::PooledConnection`], so a checkout is a
//!   connection like any other;
//! - [`checkout`], a connections factory over a pool for the stores' builders and
//!   [`idempotent_tx`](crate::patterns::idempotent_tx);
//! - `From<r2d2::Error>` for [`Error`], so `pool.get()?` works in a factory of your own.
//!
//! # Example
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> acemq_amqp::Result<()> {
//! use acemq_amqp::patterns::SqlIdempotencyStore;
//! use acemq_amqp::sql::{checkout, SqliteManager};
//! let path = std::env::temp_dir().join(format!("acemq-pool-{}.db", std::process::id()));
//! let pool = r2d2::Pool::builder()
//!     .max_size(4)
//!     .build(SqliteManager::file(&path))?;
//! let store = SqlIdempotencyStore::builder(checkout(&pool)).build()?;
//! store.create_table()?;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

use r2d2::{ManageConnection, Pool, PooledConnection};

use super::{Dialect, Sql, Transactional, Value};
use crate::error::{Error, Result};

#[cfg(feature = "postgres")]
pub use r2d2_postgres::PostgresConnectionManager;

impl From<r2d2::Error> for Error {
    /// [`Error::Sql`]: no connection could be checked out before the pool's timeout (the
    /// source says why the last attempt to open one failed).
    fn from(e: r2d2::Error) -> Error {
        Error::sql("checking out a pooled connection", e)
    }
}

/// A connections factory over `pool`: each call checks a connection out (waiting up to the
/// pool's `connection_timeout`), and dropping it gives it back.
pub fn checkout<M>(
    pool: &Pool<M>,
) -> impl Fn() -> Result<PooledConnection<M>> + Send + Sync + 'static
where
    M: ManageConnection,
{
    let pool = pool.clone();
    move || Ok(pool.get()?)
}

impl<M> Sql for PooledConnection<M>
where
    M: ManageConnection,
    M::Connection: Sql,
{
    fn dialect(&self) -> Dialect {
        (**self).dialect()
    }
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        (**self).execute(sql, params)
    }
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
        (**self).query(sql, params)
    }
    fn in_transaction(&self) -> Option<bool> {
        (**self).in_transaction()
    }
}

impl<M> Transactional for PooledConnection<M>
where
    M: ManageConnection,
    M::Connection: Transactional,
{
    type Transaction<'c> = <M::Connection as Transactional>::Transaction<'c>;

    fn begin(&mut self) -> Result<Self::Transaction<'_>> {
        (**self).begin()
    }
}

#[cfg(feature = "sqlite")]
pub use self::sqlite::SqliteManager;

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::fmt;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use rusqlite::{Connection, OpenFlags};

    type Init = Arc<dyn Fn(&mut Connection) -> rusqlite::Result<()> + Send + Sync>;

    /// An [`r2d2::ManageConnection`] opening `rusqlite` connections to one database file.
    ///
    /// Each connection is opened with [`flags`](Self::flags) (rusqlite's defaults: read-write,
    /// create, URI names, no mutex) and then passed to the [`init`](Self::init) closure, the
    /// place for `PRAGMA`s and a busy timeout. The health check on checkout runs `SELECT 1`.
    #[derive(Clone)]
    pub struct SqliteManager {
        path: PathBuf,
        flags: OpenFlags,
        init: Option<Init>,
    }

    impl SqliteManager {
        /// A manager for the database file at `path`.
        pub fn file(path: impl AsRef<Path>) -> SqliteManager {
            SqliteManager {
                path: path.as_ref().to_owned(),
                flags: OpenFlags::default(),
                init: None,
            }
        }

        /// The flags each connection is opened with. Defaults to `OpenFlags::default()`.
        pub fn flags(mut self, flags: OpenFlags) -> Self {
            self.flags = flags;
            self
        }

        /// Runs `init` on each new connection before the pool hands it out (for example
        /// `busy_timeout` and `PRAGMA journal_mode=WAL`). Defaults to nothing.
        pub fn init<F>(mut self, init: F) -> Self
        where
            F: Fn(&mut Connection) -> rusqlite::Result<()> + Send + Sync + 'static,
        {
            self.init = Some(Arc::new(init));
            self
        }

        /// The database file.
        pub fn path(&self) -> &Path {
            &self.path
        }
    }

    impl fmt::Debug for SqliteManager {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("SqliteManager")
                .field("path", &self.path)
                .field("flags", &self.flags)
                .field("init", &self.init.is_some())
                .finish()
        }
    }

    impl r2d2::ManageConnection for SqliteManager {
        type Connection = Connection;
        type Error = rusqlite::Error;

        fn connect(&self) -> rusqlite::Result<Connection> {
            let mut conn = Connection::open_with_flags(&self.path, self.flags)?;
            if let Some(init) = &self.init {
                init(&mut conn)?;
            }
            Ok(conn)
        }

        fn is_valid(&self, conn: &mut Connection) -> rusqlite::Result<()> {
            conn.query_row("SELECT 1", [], |_| Ok(()))
        }

        fn has_broken(&self, _conn: &mut Connection) -> bool {
            false
        }
    }
}
