//! The registry in a SQL table (SQLite, PostgreSQL or MySQL), shared by every process that uses
//! the table.

use std::fmt;

use super::schema::{check_subject, fingerprint, same_format, Schema, SchemaRegistry};
use crate::error::{Error, Result};
use crate::sql::{self, Connect, Dialect, Sql, Table, Value};

const COLUMNS: &str = "id, subject, version, format, definition, fingerprint";

/// How many times a registration re-reads and retries after losing a race.
const ATTEMPTS: usize = 50;

#[derive(Debug)]
struct Statements {
    by_fingerprint: String,
    next_version: String,
    insert: String,
    by_id: String,
    latest: String,
    versions: String,
}

impl Statements {
    fn new(t: &str, dialect: Dialect) -> Statements {
        let p = |s: String| dialect.placeholders(&s);
        Statements {
            by_fingerprint: p(format!(
                "SELECT {COLUMNS} FROM {t} WHERE subject = $1 AND fingerprint = $2"
            )),
            next_version: p(format!(
                "SELECT COALESCE(MAX(version), 0) + 1 FROM {t} WHERE subject = $1"
            )),
            // On MySQL a conflict changes nothing and nothing is returned: the next lookup by
            // fingerprint finds the schema, this registration's or a concurrent one's.
            insert: p(format!(
                "INSERT INTO {t} (subject, version, format, definition, fingerprint, \
                 created_ms) VALUES ($1, $2, $3, $4, $5, $6) {}",
                match dialect {
                    Dialect::Mysql => "ON DUPLICATE KEY UPDATE id = id",
                    Dialect::Sqlite | Dialect::Postgres => "ON CONFLICT DO NOTHING RETURNING id",
                }
            )),
            by_id: p(format!("SELECT {COLUMNS} FROM {t} WHERE id = $1")),
            latest: p(format!(
                "SELECT {COLUMNS} FROM {t} WHERE subject = $1 ORDER BY version DESC LIMIT 1"
            )),
            versions: p(format!(
                "SELECT {COLUMNS} FROM {t} WHERE subject = $1 ORDER BY version"
            )),
        }
    }
}

/// A schema registry in a SQL table (SQLite, PostgreSQL or MySQL), shared by every process
/// that uses the table.
///
/// Each operation gets a connection from the connections factory given to
/// [`new`](Self::new) and runs in autocommit mode.
pub struct SqlSchemaRegistry {
    connect: Connect,
    table: String,
    statements: sql::PerDialect<Statements>,
}

/// How a [`SqlSchemaRegistry`] names its table. Validated by [`SqlSchemaRegistry::new`].
#[derive(Clone, Debug)]
pub struct SqlSchemaRegistryOptions {
    table: String,
}

impl Default for SqlSchemaRegistryOptions {
    fn default() -> Self {
        SqlSchemaRegistryOptions {
            table: sql::DEFAULT_SCHEMAS_TABLE.to_owned(),
        }
    }
}

impl SqlSchemaRegistryOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table's name, a plain identifier. Defaults to `acemq_schemas`.
    #[must_use]
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }
}

impl fmt::Debug for SqlSchemaRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlSchemaRegistry")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

fn schema(row: &[Value]) -> Result<Schema> {
    Ok(Schema {
        id: sql::col_i64(row, 0)?,
        subject: sql::col_text(row, 1)?,
        version: sql::col_i64(row, 2)?,
        format: sql::col_text(row, 3)?,
        definition: sql::col_text(row, 4)?,
        fingerprint: sql::col_text(row, 5)?,
    })
}

impl SqlSchemaRegistry {
    /// A registry using `connect` as the connections factory, called once per operation.
    /// Checks the table name; does not touch the database.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a table name that is not a plain identifier.
    pub fn new<F, C>(connect: F, options: SqlSchemaRegistryOptions) -> Result<SqlSchemaRegistry>
    where
        F: Fn() -> Result<C> + Send + Sync + 'static,
        C: Sql + 'static,
    {
        sql::check_identifier(&options.table)?;
        Ok(SqlSchemaRegistry {
            statements: sql::PerDialect::new(),
            connect: sql::erase(connect),
            table: options.table,
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table if it does not exist (development and tests).
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] if the statements fail.
    pub fn create_table(&self) -> Result<()> {
        let mut conn = (self.connect)()?;
        sql::create_schema(&mut *conn, &[Table::Schemas(self.table.clone())])
    }

    fn statements(&self, conn: &dyn Sql) -> &Statements {
        self.statements
            .get(conn.dialect(), |d| Statements::new(&self.table, d))
    }

    fn context(&self, e: Error, what: &str) -> Error {
        sql::rewrap(e, || format!("{what} in table {}", self.table))
    }

    fn one(&self, pick: fn(&Statements) -> &str, params: &[Value]) -> Result<Option<Schema>> {
        let mut conn = (self.connect)()?;
        let s = self.statements(&*conn);
        let rows = conn
            .query(pick(s), params)
            .map_err(|e| self.context(e, "reading a schema"))?;
        rows.first().map(|r| schema(r)).transpose()
    }
}

impl SchemaRegistry for SqlSchemaRegistry {
    fn register(&self, subject: &str, format: &str, definition: &str) -> Result<Schema> {
        check_subject(subject)?;
        let fp = fingerprint(definition);
        let mut conn = (self.connect)()?;
        let s = self.statements(&*conn);
        let key = [Value::Text(subject.to_owned()), Value::Text(fp.clone())];
        for _ in 0..ATTEMPTS {
            let rows = conn
                .query(&s.by_fingerprint, &key)
                .map_err(|e| self.context(e, "looking up a schema"))?;
            if let Some(row) = rows.first() {
                return same_format(schema(row)?, format);
            }
            let rows = conn
                .query(&s.next_version, &key[..1])
                .map_err(|e| self.context(e, "reading the next version"))?;
            let version = match rows.first() {
                Some(row) => sql::col_i64(row, 0)?,
                None => 1,
            };
            let params = [
                Value::Text(subject.to_owned()),
                Value::Integer(version),
                Value::Text(format.to_owned()),
                Value::Text(definition.to_owned()),
                Value::Text(fp.clone()),
                Value::Integer(sql::now_ms()),
            ];
            if conn.dialect() == Dialect::Mysql {
                conn.execute(&s.insert, &params)
                    .map_err(|e| self.context(e, "registering a schema"))?;
                let rows = conn
                    .query(&s.by_fingerprint, &key)
                    .map_err(|e| self.context(e, "looking up a schema"))?;
                if let Some(row) = rows.first() {
                    return same_format(schema(row)?, format);
                }
                continue;
            }
            let inserted = conn
                .query(&s.insert, &params)
                .map_err(|e| self.context(e, "registering a schema"))?;
            if let Some(row) = inserted.first() {
                return Ok(Schema {
                    id: sql::col_i64(row, 0)?,
                    subject: subject.to_owned(),
                    version,
                    format: format.to_owned(),
                    definition: definition.to_owned(),
                    fingerprint: fp,
                });
            }
            // Lost a race for this version or these bytes: read again.
        }
        Err(Error::sql(
            format!("registering a schema in table {}", self.table),
            format!("gave up after {ATTEMPTS} conflicting registrations on {subject:?}"),
        ))
    }

    fn by_id(&self, id: i64) -> Result<Schema> {
        self.one(|s| &s.by_id, &[Value::Integer(id)])?
            .ok_or_else(|| Error::SchemaNotFound {
                what: format!("id {id}"),
            })
    }

    fn latest(&self, subject: &str) -> Result<Schema> {
        self.one(|s| &s.latest, &[Value::Text(subject.to_owned())])?
            .ok_or_else(|| Error::SchemaNotFound {
                what: format!("subject {subject:?}"),
            })
    }

    fn versions(&self, subject: &str) -> Result<Vec<Schema>> {
        let mut conn = (self.connect)()?;
        let s = self.statements(&*conn);
        let rows = conn
            .query(&s.versions, &[Value::Text(subject.to_owned())])
            .map_err(|e| self.context(e, "listing versions"))?;
        rows.iter().map(|r| schema(r)).collect()
    }
}
