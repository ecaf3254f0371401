//! Database helpers for the SQL store tests: one SQLite file (WAL), the PostgreSQL test
//! database or (feature `mysql`) the MySQL/MariaDB one of `ACEMQ_TEST_MYSQL_URL`, unique table
//! names per test, clean-up on drop.
#![allow(dead_code)] // each test file uses a different part of this module

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_amqp::sql::Sql;
use acemq_amqp::{Error, Result};

/// Where the PostgreSQL tests connect.
pub const PG_URL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";

/// A connection as the tests hand it to stores.
pub type Conn = Box<dyn Sql + Send>;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Where the MySQL tests connect: `ACEMQ_TEST_MYSQL_URL`, default MariaDB's root on the
/// `test` database here.
pub fn mysql_url() -> String {
    std::env::var("ACEMQ_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string())
}

/// Which database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    /// MySQL or MariaDB (feature `mysql`; `Db::mysql`).
    Mysql,
}

/// One test's database and table names.
pub struct Db {
    pub backend: Backend,
    path: Arc<std::path::PathBuf>,
    _dir: Option<tempfile::TempDir>,
    prefix: String,
    tables: parking_lot::Mutex<Vec<String>>,
}

impl Db {
    pub fn sqlite() -> Db {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("test.db");
        let db = Db::new(Backend::Sqlite, path, Some(dir));
        // WAL is a property of the file: set it once, and check it took.
        let mut conn = sqlite_open(&db.path).expect("open sqlite");
        let mode = conn
            .query("PRAGMA journal_mode", &[])
            .expect("read journal mode");
        assert_eq!(mode[0][0].as_str(), Some("wal"));
        db
    }

    pub fn postgres() -> Db {
        // Fail (never skip) when the server is not there.
        drop(pg_client());
        Db::new(Backend::Postgres, std::path::PathBuf::new(), None)
    }

    #[cfg(feature = "mysql")]
    pub fn mysql() -> Db {
        // Fail (never skip) when the server is not there.
        drop(my_client());
        Db::new(Backend::Mysql, std::path::PathBuf::new(), None)
    }

    fn new(backend: Backend, path: std::path::PathBuf, dir: Option<tempfile::TempDir>) -> Db {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Db {
            backend,
            path: Arc::new(path),
            _dir: dir,
            prefix: format!("t{}_{}", std::process::id(), n),
            tables: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// A table name unique to this test, dropped at the end.
    pub fn table(&self, kind: &str) -> String {
        let name = format!("{}_{kind}", self.prefix);
        self.tables.lock().push(name.clone());
        name
    }

    /// A new connection, in autocommit mode.
    pub fn connect(&self) -> Conn {
        match self.backend {
            Backend::Sqlite => Box::new(sqlite_open(&self.path).expect("open sqlite")),
            Backend::Postgres => Box::new(pg_client()),
            Backend::Mysql => my_boxed(),
        }
    }

    /// A connections factory that opens a new connection on each call.
    pub fn factory(&self) -> impl Fn() -> Result<Conn> + Send + Sync + 'static {
        let backend = self.backend;
        let path = Arc::clone(&self.path);
        move || -> Result<Conn> {
            Ok(match backend {
                Backend::Sqlite => Box::new(sqlite_open(&path)?),
                Backend::Postgres => Box::new(pg_connect()?),
                Backend::Mysql => my_connect_boxed()?,
            })
        }
    }

    /// Runs `f` on a new transaction (SQLite: `BEGIN IMMEDIATE`), then commits or rolls back.
    pub fn in_tx<R>(&self, commit: bool, f: impl FnOnce(&mut dyn Sql) -> R) -> R {
        match self.backend {
            Backend::Sqlite => {
                let mut conn = sqlite_open(&self.path).expect("open sqlite");
                let mut tx = conn
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .expect("begin");
                let r = f(&mut tx);
                if commit {
                    tx.commit().expect("commit");
                } else {
                    tx.rollback().expect("rollback");
                }
                r
            }
            Backend::Postgres => {
                let mut client = pg_client();
                let mut tx = client.transaction().expect("begin");
                let r = f(&mut tx);
                if commit {
                    tx.commit().expect("commit");
                } else {
                    tx.rollback().expect("rollback");
                }
                r
            }
            Backend::Mysql => my_in_tx(commit, f),
        }
    }

    /// The SQLite file (empty for PostgreSQL).
    pub fn sqlite_path(&self) -> &std::path::Path {
        &self.path
    }

    /// The number of rows in `table`.
    pub fn count(&self, table: &str) -> i64 {
        let rows = self
            .connect()
            .query(&format!("SELECT COUNT(*) FROM {table}"), &[])
            .expect("count");
        rows[0][0].as_i64().expect("integer count")
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if self.backend == Backend::Postgres {
            if let Ok(mut client) = pg_connect() {
                for t in self.tables.lock().iter() {
                    let _ = client.batch_execute(&format!("DROP TABLE IF EXISTS {t}"));
                }
            }
        }
        if self.backend == Backend::Mysql {
            if let Ok(mut conn) = my_connect_boxed() {
                for t in self.tables.lock().iter() {
                    let _ = conn.execute(&format!("DROP TABLE IF EXISTS {t}"), &[]);
                }
            }
        }
    }
}

pub fn sqlite_open(path: &std::path::Path) -> Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path).map_err(|e| Error::Sql {
        context: "opening the test database".into(),
        source: e.into(),
    })?;
    conn.busy_timeout(Duration::from_secs(20))
        .and_then(|_| conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"))
        .map_err(|e| Error::Sql {
            context: "setting up the test database".into(),
            source: e.into(),
        })?;
    Ok(conn)
}

pub fn pg_connect() -> Result<postgres::Client> {
    postgres::Client::connect(PG_URL, postgres::NoTls).map_err(|e| Error::Sql {
        context: format!("connecting to PostgreSQL at 127.0.0.1:5432 ({PG_URL})"),
        source: e.into(),
    })
}

pub fn pg_client() -> postgres::Client {
    match pg_connect() {
        Ok(c) => c,
        Err(e) => panic!(
            "PostgreSQL at 127.0.0.1:5432 is not reachable ({PG_URL}); start it with \
             `pg_ctlcluster --skip-systemctl-redirect <version> main start`: {e:?}"
        ),
    }
}

#[cfg(feature = "mysql")]
pub fn my_connect() -> Result<mysql::Conn> {
    let url = mysql_url();
    let opts = mysql::Opts::from_url(&url).map_err(|e| Error::Sql {
        context: format!("reading ACEMQ_TEST_MYSQL_URL ({url})"),
        source: e.into(),
    })?;
    mysql::Conn::new(opts).map_err(|e| Error::Sql {
        context: format!("connecting to MySQL at {url}"),
        source: e.into(),
    })
}

#[cfg(feature = "mysql")]
pub fn my_client() -> mysql::Conn {
    match my_connect() {
        Ok(c) => c,
        Err(e) => panic!(
            "MySQL/MariaDB is not reachable at {} (ACEMQ_TEST_MYSQL_URL); start it with \
             `service mariadb start` (scripts/test does, through scripts/services): {e:?}",
            mysql_url()
        ),
    }
}

/// A new MySQL connection, boxed as the tests' [`Conn`] (feature `mysql`).
#[cfg(feature = "mysql")]
pub fn my_connect_boxed() -> Result<Conn> {
    Ok(Box::new(my_connect()?))
}

#[cfg(feature = "mysql")]
fn my_boxed() -> Conn {
    Box::new(my_client())
}

#[cfg(feature = "mysql")]
fn my_in_tx<R>(commit: bool, f: impl FnOnce(&mut dyn Sql) -> R) -> R {
    use acemq_amqp::sql::Transactional;
    let mut conn = my_client();
    let mut tx = conn.begin().expect("begin");
    let r = f(&mut tx);
    if commit {
        tx.commit().expect("commit");
    } else {
        tx.rollback().expect("rollback");
    }
    r
}

/// Without the `mysql` feature no MySQL `Db` is ever made, so this is never called.
#[cfg(not(feature = "mysql"))]
pub fn my_connect_boxed() -> Result<Conn> {
    unreachable!("a MySQL Db is made by Db::mysql, which needs the mysql feature")
}

#[cfg(not(feature = "mysql"))]
fn my_boxed() -> Conn {
    unreachable!("a MySQL Db is made by Db::mysql, which needs the mysql feature")
}

#[cfg(not(feature = "mysql"))]
fn my_in_tx<R>(_commit: bool, _f: impl FnOnce(&mut dyn Sql) -> R) -> R {
    unreachable!("a MySQL Db is made by Db::mysql, which needs the mysql feature")
}

/// Defines `mod $name { fn sqlite(); fn postgres(); fn mysql(); }` running `$name(&Db)` on each
/// of the three databases (the test file needs the `mysql` feature).
#[macro_export]
macro_rules! on_every_database {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn sqlite() {
                    super::$name(&super::db::Db::sqlite());
                }
                #[test]
                fn postgres() {
                    super::$name(&super::db::Db::postgres());
                }
                #[test]
                fn mysql() {
                    super::$name(&super::db::Db::mysql());
                }
            }
        )*
    };
}
