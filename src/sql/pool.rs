//! Connection pooling with [`r2d2`], the ecosystem's synchronous pool.
//!
//! r2d2 gives a pool with a maximum size, a checkout timeout, a health check on checkout
//! (`test_on_check_out`, on by default: a connection the server killed, for example in a
//! restart, is discarded and replaced instead of being handed out) and idle reaping. This
//! module adds what the stores need from it:
//!
//! - [`SqliteManager`], an [`r2d2::ManageConnection`] for `rusqlite` (feature `sqlite`); for
//!   PostgreSQL use [`PostgresConnectionManager`] from `r2d2_postgres` (feature `postgres`);
//! - [`CheckIdle`], a manager around either that runs the health check on checkout only for a
//!   connection idle longer than a window (500 ms by default, HikariCP's): a connection given
//!   back a moment ago is handed out again without a round trip to the server;
//! - [`Sql`] and [`Transactional`] for [`r2d2::PooledConnection`], so a checkout is a
//!   connection like any other;
//! - [`checkout`], a connections factory over a pool for the stores' builders and
//!   [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx);
//! - `From<r2d2::Error>` for [`Error`], so `pool.get()?` works in a factory of your own.
//!
//! # Example
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> acemq_amqp::Result<()> {
//! use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
//! use acemq_amqp::sql::{checkout, SqliteManager};
//! let path = std::env::temp_dir().join(format!("acemq-pool-{}.db", std::process::id()));
//! let pool = r2d2::Pool::builder()
//!     .max_size(4)
//!     .build(SqliteManager::file(&path))?;
//! let store = SqlIdempotencyStore::open(checkout(&pool), SqlIdempotencyStoreOptions::default())?;
//! store.create_table()?;
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use r2d2::{ManageConnection, Pool, PooledConnection};

use super::seam::{Sql, Transactional};
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

forward_sql!([M] PooledConnection<M>, where M: ManageConnection, M::Connection: Sql);

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

/// An [`r2d2::ManageConnection`] around another that runs the other's health check on checkout
/// only for a connection idle longer than [`window`](Self::window): a connection given back
/// within the window is handed out again at once, unless the inner manager reports it broken
/// (for PostgreSQL: the client saw the connection close).
///
/// r2d2's check (`test_on_check_out`, on by default) is a query before every checkout — for
/// PostgreSQL an empty one, a round trip to the server. A store checks a connection out for
/// each of its operations, so on PostgreSQL the check doubles the round trips of a claim, a
/// confirm, a group commit or the relay's delete-and-lease. `CheckIdle` keeps it for what it
/// is for (a connection that sat idle while the server restarted or a firewall dropped it) and
/// skips it for one in steady use. The price, as with HikariCP's `aliveBypassWindowMs`: a
/// connection the server kills within the window after its last use fails the one operation
/// that next gets it (the operation returns the driver's error: a consumer retries its message,
/// the relay its sweep), and the pool then drops it, as the driver reports it closed.
///
/// Its connections are [`Idle`]`<C>`, which dereference to the inner connection and are [`Sql`]
/// and [`Transactional`] as it is, so a store, [`checkout`] and a handler of
/// [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx) use them unchanged.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # fn main() -> acemq_amqp::Result<()> {
/// use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
/// use acemq_amqp::sql::{checkout, CheckIdle, PostgresConnectionManager};
///
/// let config: postgres::Config = "host=127.0.0.1 user=postgres dbname=shop".parse()?;
/// let pool = r2d2::Pool::builder()
///     .max_size(8)
///     .build(CheckIdle::new(PostgresConnectionManager::new(config, postgres::NoTls)))?;
/// let store = SqlIdempotencyStore::open(checkout(&pool), SqlIdempotencyStoreOptions::default())?;
/// # let _ = store;
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "postgres"))]
/// # fn main() {}
/// ```
#[derive(Debug, Clone)]
pub struct CheckIdle<M> {
    inner: M,
    window: Duration,
}

impl<M> CheckIdle<M> {
    /// The window HikariCP uses (`aliveBypassWindowMs`).
    pub const DEFAULT_WINDOW: Duration = Duration::from_millis(500);

    /// `inner`, its health check skipped for connections given back within the last
    /// [`DEFAULT_WINDOW`](Self::DEFAULT_WINDOW).
    pub fn new(inner: M) -> CheckIdle<M> {
        CheckIdle {
            inner,
            window: Self::DEFAULT_WINDOW,
        }
    }

    /// How long after a connection is given back it is handed out again without the health
    /// check. `Duration::ZERO` checks every checkout, as the inner manager alone does. Defaults
    /// to 500 ms.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// The manager this one wraps.
    pub fn inner(&self) -> &M {
        &self.inner
    }
}

/// A connection of a [`CheckIdle`] pool: the inner manager's connection and when it was last
/// given back (or opened). Dereferences to the connection.
#[derive(Debug)]
pub struct Idle<C> {
    conn: C,
    since: Instant,
}

impl<C> Idle<C> {
    /// The connection.
    pub fn into_inner(self) -> C {
        self.conn
    }
}

impl<C> Deref for Idle<C> {
    type Target = C;
    fn deref(&self) -> &C {
        &self.conn
    }
}

impl<C> DerefMut for Idle<C> {
    fn deref_mut(&mut self) -> &mut C {
        &mut self.conn
    }
}

/// The inner manager's error, its causes written into its text. r2d2 keeps only the text of the
/// last error (`pool.get()` then says "timed out waiting for connection: …"), and a driver's own
/// text can leave its cause out (PostgreSQL's "error connecting to server", without
/// "Connection refused"): this text has each cause after it, so the pool's error says why.
#[derive(Debug)]
pub struct WithCauses<E>(pub E);

impl<E: std::error::Error + 'static> std::fmt::Display for WithCauses<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let more = c.to_string();
            if !text.contains(&more) {
                text.push_str(": ");
                text.push_str(&more);
            }
            cause = c.source();
        }
        f.write_str(&text)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for WithCauses<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl<M: ManageConnection> ManageConnection for CheckIdle<M> {
    type Connection = Idle<M::Connection>;
    type Error = WithCauses<M::Error>;

    fn connect(&self) -> std::result::Result<Self::Connection, Self::Error> {
        Ok(Idle {
            conn: self.inner.connect().map_err(WithCauses)?,
            since: Instant::now(),
        })
    }

    /// The inner check, unless the connection was given back (or opened) within the window
    /// and the inner manager does not report it broken.
    fn is_valid(&self, conn: &mut Self::Connection) -> std::result::Result<(), Self::Error> {
        if conn.since.elapsed() < self.window && !self.inner.has_broken(&mut conn.conn) {
            return Ok(());
        }
        self.inner.is_valid(&mut conn.conn).map_err(WithCauses)
    }

    /// The inner manager's answer; r2d2 asks it as the connection is given back, so the
    /// connection's idle time starts here.
    fn has_broken(&self, conn: &mut Self::Connection) -> bool {
        conn.since = Instant::now();
        self.inner.has_broken(&mut conn.conn)
    }
}

forward_sql!([C: Sql] Idle<C>);

impl<C: Transactional> Transactional for Idle<C> {
    type Transaction<'c>
        = C::Transaction<'c>
    where
        C: 'c;

    fn begin(&mut self) -> Result<Self::Transaction<'_>> {
        self.conn.begin()
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
