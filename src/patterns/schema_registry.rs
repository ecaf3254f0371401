//! A schema registry: versioned schema definitions per subject, identified by id.
//!
//! # Guarantees
//!
//! - [`fingerprint`] is the lowercase hex SHA-256 of the definition's exact bytes, with no
//!   normalisation (`{"a":1}` and `{ "a": 1 }` are different schemas), as in every AceMQ
//!   library.
//! - [`SchemaRegistry::register`] gives a new definition the subject's next version (1, 2, …)
//!   and a new id; registering the same bytes under the same subject again returns the existing
//!   schema. Concurrent registrations of one definition (threads, processes, hosts sharing the
//!   table) agree on one id and version: the table is unique on `(subject, version)` and on
//!   `(subject, fingerprint)`, and a registration that loses the race re-reads the winner.
//! - Lookups of an unknown id or subject fail with [`Error::SchemaNotFound`].
//!
//! [`InMemorySchemaRegistry`] keeps schemas in one process; it is for tests, **not for
//! production** (ids are not shared between processes and vanish on restart).

use std::fmt;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::sql::{self, Connect, Dialect, Sql, Table, Value};

/// The fingerprint of a schema definition: lowercase hex SHA-256 of its exact bytes.
///
/// ```
/// use acemq_amqp::patterns::schema_registry::fingerprint;
/// assert_eq!(
///     fingerprint(""),
///     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
/// );
/// ```
pub fn fingerprint(definition: impl AsRef<[u8]>) -> String {
    let digest = Sha256::digest(definition.as_ref());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A registered schema.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schema {
    /// The registry-wide id.
    pub id: i64,
    /// The subject it is registered under.
    pub subject: String,
    /// Its version within the subject, from 1.
    pub version: i64,
    /// The schema language, e.g. `json-schema`, `avro`, `protobuf`.
    pub format: String,
    /// The definition, exactly as registered.
    pub definition: String,
    /// [`fingerprint`] of the definition.
    pub fingerprint: String,
}

/// Registers and looks up schemas.
pub trait SchemaRegistry: Send + Sync {
    /// Registers `definition` under `subject`, or returns the existing schema with the same
    /// bytes under that subject.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty subject or when the same bytes are registered
    /// under the subject with another format; a store error such as [`Error::Sql`].
    fn register(&self, subject: &str, format: &str, definition: &str) -> Result<Schema>;

    /// The schema with this id.
    ///
    /// # Errors
    ///
    /// [`Error::SchemaNotFound`] if there is none; a store error.
    fn by_id(&self, id: i64) -> Result<Schema>;

    /// The subject's latest version.
    ///
    /// # Errors
    ///
    /// [`Error::SchemaNotFound`] if the subject has none; a store error.
    fn latest(&self, subject: &str) -> Result<Schema>;

    /// The subject's schemas, by version ascending (empty for an unknown subject).
    ///
    /// # Errors
    ///
    /// A store error.
    fn versions(&self, subject: &str) -> Result<Vec<Schema>>;
}

fn check_subject(subject: &str) -> Result<()> {
    if subject.is_empty() {
        return Err(Error::invalid("a schema subject must not be empty"));
    }
    Ok(())
}

fn same_format(existing: Schema, format: &str) -> Result<Schema> {
    if existing.format == format {
        Ok(existing)
    } else {
        Err(Error::invalid(format!(
            "subject {:?} already has these exact bytes as version {} with format {:?}, not {:?}",
            existing.subject, existing.version, existing.format, format
        )))
    }
}

// ---------------------------------------------------------------------------------------------
// In memory

/// A schema registry in one process, for tests. **Not for production**: see the
/// [module docs](self).
#[derive(Default)]
pub struct InMemorySchemaRegistry {
    schemas: Mutex<Vec<Schema>>,
}

impl InMemorySchemaRegistry {
    /// An empty registry.
    pub fn new() -> InMemorySchemaRegistry {
        InMemorySchemaRegistry::default()
    }
}

impl fmt::Debug for InMemorySchemaRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemorySchemaRegistry")
            .field("schemas", &self.schemas.lock().len())
            .finish()
    }
}

impl SchemaRegistry for InMemorySchemaRegistry {
    fn register(&self, subject: &str, format: &str, definition: &str) -> Result<Schema> {
        check_subject(subject)?;
        let fp = fingerprint(definition);
        let mut schemas = self.schemas.lock();
        if let Some(s) = schemas
            .iter()
            .find(|s| s.subject == subject && s.fingerprint == fp)
        {
            return same_format(s.clone(), format);
        }
        let version = schemas
            .iter()
            .filter(|s| s.subject == subject)
            .map(|s| s.version)
            .max()
            .unwrap_or(0)
            + 1;
        let schema = Schema {
            id: i64::try_from(schemas.len()).unwrap_or(i64::MAX - 1) + 1,
            subject: subject.to_owned(),
            version,
            format: format.to_owned(),
            definition: definition.to_owned(),
            fingerprint: fp,
        };
        schemas.push(schema.clone());
        Ok(schema)
    }

    fn by_id(&self, id: i64) -> Result<Schema> {
        self.schemas
            .lock()
            .iter()
            .find(|s| s.id == id)
            .cloned()
            .ok_or_else(|| Error::SchemaNotFound {
                what: format!("id {id}"),
            })
    }

    fn latest(&self, subject: &str) -> Result<Schema> {
        self.schemas
            .lock()
            .iter()
            .filter(|s| s.subject == subject)
            .max_by_key(|s| s.version)
            .cloned()
            .ok_or_else(|| Error::SchemaNotFound {
                what: format!("subject {subject:?}"),
            })
    }

    fn versions(&self, subject: &str) -> Result<Vec<Schema>> {
        let mut out: Vec<Schema> = self
            .schemas
            .lock()
            .iter()
            .filter(|s| s.subject == subject)
            .cloned()
            .collect();
        out.sort_by_key(|s| s.version);
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// SQL

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::sql_store::{SqlSchemaRegistry, SqlSchemaRegistryBuilder};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql_store {
    use super::*;

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
                insert: p(format!(
                    "INSERT INTO {t} (subject, version, format, definition, fingerprint, \
                     created_ms) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING \
                     RETURNING id"
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

    /// A schema registry in a SQL table (SQLite or PostgreSQL), shared by every process that
    /// uses the table.
    ///
    /// Each operation gets a connection from the connections factory given to
    /// [`builder`](Self::builder) and runs in autocommit mode.
    pub struct SqlSchemaRegistry {
        connect: Connect,
        table: String,
        statements: sql::PerDialect<Statements>,
    }

    /// Builds a [`SqlSchemaRegistry`].
    pub struct SqlSchemaRegistryBuilder {
        connect: Connect,
        table: String,
    }

    impl SqlSchemaRegistryBuilder {
        /// The table's name, a plain identifier. Defaults to `acemq_schemas`.
        pub fn table(mut self, name: impl Into<String>) -> Self {
            self.table = name.into();
            self
        }

        /// Checks the table name and builds the registry. Does not touch the database.
        ///
        /// # Errors
        ///
        /// [`Error::InvalidName`] for a table name that is not a plain identifier.
        pub fn build(self) -> Result<SqlSchemaRegistry> {
            sql::check_identifier(&self.table)?;
            Ok(SqlSchemaRegistry {
                statements: sql::PerDialect::new(),
                connect: self.connect,
                table: self.table,
            })
        }
    }

    impl fmt::Debug for SqlSchemaRegistryBuilder {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("SqlSchemaRegistryBuilder")
                .field("table", &self.table)
                .finish_non_exhaustive()
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
        /// A builder using `connect` as the connections factory, called once per operation.
        pub fn builder<F, C>(connect: F) -> SqlSchemaRegistryBuilder
        where
            F: Fn() -> Result<C> + Send + Sync + 'static,
            C: Sql + 'static,
        {
            SqlSchemaRegistryBuilder {
                connect: sql::erase(connect),
                table: sql::DEFAULT_SCHEMAS_TABLE.to_owned(),
            }
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
                let inserted = conn
                    .query(
                        &s.insert,
                        &[
                            Value::Text(subject.to_owned()),
                            Value::Integer(version),
                            Value::Text(format.to_owned()),
                            Value::Text(definition.to_owned()),
                            Value::Text(fp.clone()),
                            Value::Integer(sql::now_ms()),
                        ],
                    )
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
}
