//! `--db`: SQLite (`sqlite:PATH`) or PostgreSQL (a connection string), and `acemq schema`.

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
        if url.starts_with("postgres://") || url.starts_with("postgresql://") || url.contains('=') {
            return Ok(Db::Postgres(url.to_string()));
        }
        Err(Failure {
            code: 2,
            message: "--db takes sqlite:PATH or a PostgreSQL connection string (postgres://… \
                      or host=… user=… dbname=…)"
                .into(),
        })
    }

    fn describe(&self) -> String {
        match self {
            Db::Sqlite(p) => format!("the SQLite database {}", p.display()),
            Db::Postgres(_) => "the PostgreSQL database".into(),
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
        }
    }

    /// One connection, or exit 3 with one line.
    pub fn connect(&self, create: bool) -> Result<Box<dyn Sql + Send>, Failure> {
        self.open(create)
            .map_err(|e| Failure::connect(format!("cannot connect to {}: {}", self.describe(), e)))
    }
}

pub fn ddl(dialect: DialectArg, out: &mut Out) -> Outcome {
    let dialect = match dialect {
        DialectArg::Sqlite => Dialect::Sqlite,
        DialectArg::Postgres => Dialect::Postgres,
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
