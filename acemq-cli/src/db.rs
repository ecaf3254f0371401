//! `--db`: SQLite (`sqlite:PATH`), PostgreSQL (a connection string) or MySQL/MariaDB
//! (`mysql://…`), and `acemq schema`.

use std::path::PathBuf;

use acemq_amqp::sql::{create_schema, schema_ddl, Dialect, Sql, Table};
use serde_json::json;

use crate::out::Out;
use crate::{DialectArg, Failure, Outcome};

/// A database named on the command line.
#[derive(Clone, Debug)]
pub enum Db {
    Sqlite(PathBuf),
    Postgres(String),
    Mysql(String),
}

impl Db {
    pub fn parse(url: &str) -> Result<Db, Failure> {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(Failure {
                    code: 2,
                    message: "--db sqlite: needs a path (sqlite:PATH)".into(),
                });
            }
            return Ok(Db::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("mysql://") {
            return Ok(Db::Mysql(url.to_string()));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") || url.contains('=') {
            return Ok(Db::Postgres(url.to_string()));
        }
        Err(Failure {
            code: 2,
            message: "--db takes sqlite:PATH, a PostgreSQL connection string (postgres://… \
                      or host=… user=… dbname=…) or a MySQL URL (mysql://user@host:port/database)"
                .into(),
        })
    }

    fn describe(&self) -> String {
        match self {
            Db::Sqlite(p) => format!("the SQLite database {}", p.display()),
            Db::Postgres(_) => "the PostgreSQL database".into(),
            Db::Mysql(_) => "the MySQL database".into(),
        }
    }

    /// One connection. `create`: a SQLite file that does not exist is created.
    pub fn open(&self, create: bool) -> acemq_amqp::Result<Box<dyn Sql + Send>> {
        match self {
            Db::Sqlite(path) => {
                use rusqlite::OpenFlags;
                let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE
                    | OpenFlags::SQLITE_OPEN_URI
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX;
                if create {
                    flags |= OpenFlags::SQLITE_OPEN_CREATE;
                }
                let conn = rusqlite::Connection::open_with_flags(path, flags)?;
                conn.busy_timeout(std::time::Duration::from_secs(5))?;
                Ok(Box::new(conn))
            }
            Db::Postgres(url) => {
                let client = postgres::Client::connect(url, postgres::NoTls)?;
                Ok(Box::new(client))
            }
            Db::Mysql(url) => {
                // The driver's URL error repeats the URL, which may hold a password: not it.
                let opts = mysql::Opts::from_url(url).map_err(|_| acemq_amqp::Error::Sql {
                    context: "reading the MySQL URL".into(),
                    source: "it is not mysql://user:password@host:port/database".into(),
                })?;
                Ok(Box::new(mysql::Conn::new(opts)?))
            }
        }
    }

    /// One connection, or exit 3 with one line. A SQLite file that is not there (and is not
    /// to be created) is named, with the command that creates it.
    pub fn connect(&self, create: bool) -> Result<Box<dyn Sql + Send>, Failure> {
        if let Db::Sqlite(path) = self {
            if !create && !path.exists() {
                return Err(Failure::connect(format!(
                    "{} does not exist: create it and its tables with {}",
                    self.describe(),
                    self.schema_create()
                )));
            }
        }
        self.open(create)
            .map_err(|e| Failure::connect(format!("cannot connect to {}: {}", self.describe(), e)))
    }

    /// The command that creates the tables in this database (the PostgreSQL connection string
    /// or MySQL URL is not repeated: it may hold a password).
    fn schema_create(&self) -> String {
        match self {
            Db::Sqlite(p) => format!("`acemq schema create --db sqlite:{}`", p.display()),
            Db::Postgres(_) | Db::Mysql(_) => "`acemq schema create` with the same --db".into(),
        }
    }

    /// A library error while `what` on `table` (exit 1, or 3 when it is about reaching the
    /// database); a table that does not exist gets the command that creates it (`schema create`
    /// creates the default names only).
    pub fn failure(&self, what: &str, table: &str, e: acemq_amqp::Error) -> Failure {
        let missing = missing_table(&e);
        let mut f = Failure::from_error(what, e);
        if missing {
            let defaults = Table::all();
            f.message = if defaults.iter().any(|t| t.name() == table) {
                format!(
                    "{}; create the tables with {}",
                    f.message,
                    self.schema_create()
                )
            } else {
                format!(
                    "{}; {} creates the tables under their default names, `acemq schema ddl` \
                     prints their DDL to adapt for {table}",
                    f.message,
                    self.schema_create()
                )
            };
        }
        f
    }
}

/// Whether `e` is the database saying a table does not exist (SQLite's `no such table`,
/// PostgreSQL's SQLSTATE 42P01, MySQL's error 1146).
fn missing_table(e: &acemq_amqp::Error) -> bool {
    let acemq_amqp::Error::Sql { source, .. } = e else {
        return false;
    };
    if let Some(pg) = source.downcast_ref::<postgres::Error>() {
        return pg.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE);
    }
    if let Some(mysql::Error::MySqlError(e)) = source.downcast_ref::<mysql::Error>() {
        return e.code == 1146;
    }
    matches!(
        source.downcast_ref::<rusqlite::Error>(),
        Some(rusqlite::Error::SqliteFailure(_, Some(m))) if m.starts_with("no such table")
    )
}

pub fn ddl(dialect: DialectArg, out: &mut Out) -> Outcome {
    let dialect = match dialect {
        DialectArg::Sqlite => Dialect::Sqlite,
        DialectArg::Postgres => Dialect::Postgres,
        DialectArg::Mysql => Dialect::Mysql,
    };
    let text = schema_ddl(dialect);
    if out.json() {
        for statement in text.split(";\n").filter(|s| !s.trim().is_empty()) {
            out.record(json!({ "statement": format!("{statement};") }));
        }
    } else {
        out.raw(&text);
    }
    Ok(0)
}

pub fn create(url: &str, out: &mut Out) -> Outcome {
    let db = Db::parse(url)?;
    let mut conn = db.connect(true)?;
    let tables = Table::all();
    create_schema(&mut *conn, &tables)
        .map_err(|e| Failure::from_error("creating the schema failed", e))?;
    for t in &tables {
        out.text(format!("table {} ready", t.name()));
        out.record(json!({ "table": t.name(), "ready": true }));
    }
    Ok(0)
}
