//! The tables: names and their checks, [`Table`], and the DDL for development and migrations.

use super::dialect::Dialect;
use super::seam::{rewrap, Sql};
use crate::error::{Error, Result};

/// The default name of the idempotency table.
pub const DEFAULT_IDEMPOTENCY_TABLE: &str = "acemq_idempotency";
/// The default name of the outbox table.
pub const DEFAULT_OUTBOX_TABLE: &str = "acemq_outbox";
/// The default name of the schema registry table.
pub const DEFAULT_SCHEMAS_TABLE: &str = "acemq_schemas";

/// The longest identifier accepted, in bytes (PostgreSQL's limit).
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// Checks that `name` is a plain SQL identifier: `[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes.
///
/// Table names reach SQL by concatenation; anything else is refused.
///
/// # Errors
///
/// [`Error::InvalidName`] with kind `"table"` and the reason.
pub fn check_identifier(name: &str) -> Result<()> {
    let refuse = |reason: &str| {
        let shown: String = name.chars().take(80).collect();
        Err(Error::InvalidName {
            kind: "table",
            name: shown,
            reason: reason.to_owned(),
        })
    };
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.len() > MAX_IDENTIFIER_LEN {
        return refuse("it is longer than 63 bytes");
    }
    let mut bytes = name.bytes();
    if let Some(first) = bytes.next() {
        if !(first.is_ascii_alphabetic() || first == b'_') {
            return refuse("it must start with an ASCII letter or '_'");
        }
    }
    if !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return refuse("only ASCII letters, digits and '_' are allowed");
    }
    Ok(())
}

/// A table to create, with its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    /// An idempotency table (`key`, `state`, `deadline_ms`, `token`: the holder of a claim).
    Idempotency(String),
    /// An outbox table.
    Outbox(String),
    /// A schema registry table.
    Schemas(String),
}

impl Table {
    /// The idempotency table under its default name, `acemq_idempotency`.
    pub fn idempotency() -> Table {
        Table::Idempotency(DEFAULT_IDEMPOTENCY_TABLE.to_owned())
    }

    /// The outbox table under its default name, `acemq_outbox`.
    pub fn outbox() -> Table {
        Table::Outbox(DEFAULT_OUTBOX_TABLE.to_owned())
    }

    /// The schema registry table under its default name, `acemq_schemas`.
    pub fn schemas() -> Table {
        Table::Schemas(DEFAULT_SCHEMAS_TABLE.to_owned())
    }

    /// All three tables under their default names.
    pub fn all() -> Vec<Table> {
        vec![Table::idempotency(), Table::outbox(), Table::schemas()]
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        match self {
            Table::Idempotency(n) | Table::Outbox(n) | Table::Schemas(n) => n,
        }
    }

    /// The statements that create this table and its indexes (idempotent: `IF NOT EXISTS`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] if the name is not a plain identifier.
    pub fn ddl(&self, dialect: Dialect) -> Result<Vec<String>> {
        let t = self.name();
        check_identifier(t)?;
        let d = dialect;
        let (key, key_text, long_text, options) = (
            d.column("key"),
            d.key_text(),
            d.long_text(),
            d.table_options(),
        );
        Ok(match self {
            Table::Idempotency(_) => {
                // MySQL has no `CREATE INDEX IF NOT EXISTS` (MariaDB has): the index goes in the
                // table's statement there.
                let (inline, index) = match d {
                    Dialect::Mysql => (format!(",\n    INDEX {t}_deadline (deadline_ms)"), None),
                    Dialect::Sqlite | Dialect::Postgres => (
                        String::new(),
                        Some(format!(
                            "CREATE INDEX IF NOT EXISTS {t}_deadline ON {t} (deadline_ms)"
                        )),
                    ),
                };
                let mut statements = vec![format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\n    \
                     {key} {key_text} PRIMARY KEY,\n    \
                     state TEXT NOT NULL CHECK (state IN ('CLAIMED', 'CONFIRMED')),\n    \
                     deadline_ms BIGINT NOT NULL,\n    \
                     token TEXT{inline}\n){options}"
                )];
                statements.extend(index);
                statements
            }
            Table::Outbox(_) => vec![format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    \
                     id {serial},\n    \
                     exchange TEXT NOT NULL,\n    \
                     routing_key TEXT NOT NULL,\n    \
                     body {bytes} NOT NULL,\n    \
                     content_type TEXT NOT NULL,\n    \
                     headers {long_text} NOT NULL,\n    \
                     created_ms BIGINT NOT NULL,\n    \
                     attempts BIGINT NOT NULL DEFAULT 0,\n    \
                     last_error {long_text},\n    \
                     lease_owner TEXT,\n    \
                     lease_until_ms BIGINT NOT NULL DEFAULT 0\n){options}",
                serial = d.serial_key(),
                bytes = d.bytes(),
            )],
            Table::Schemas(_) => vec![format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n    \
                 id {serial},\n    \
                 subject {key_text} NOT NULL,\n    \
                 version BIGINT NOT NULL,\n    \
                 format TEXT NOT NULL,\n    \
                 definition {long_text} NOT NULL,\n    \
                 fingerprint {key_text} NOT NULL,\n    \
                 created_ms BIGINT NOT NULL,\n    \
                 UNIQUE (subject, version),\n    \
                 UNIQUE (subject, fingerprint)\n){options}",
                serial = d.serial_key(),
            )],
        })
    }
}

/// Creates the given tables (and their indexes) if they do not exist, on `conn`.
///
/// For development and tests; production schemas belong to a migration tool (see
/// [`schema_ddl`]). Each statement runs on `conn` as given: in autocommit mode each commits by
/// itself, on a transaction they commit with it.
///
/// # Errors
///
/// [`Error::InvalidName`] for a name that is not a plain identifier, [`Error::Sql`] if a
/// statement fails.
///
/// # Example
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> acemq_amqp::Result<()> {
/// use acemq_amqp::sql::{create_schema, Table};
/// let mut conn = rusqlite::Connection::open_in_memory().map_err(|e| acemq_amqp::Error::Sql {
///     context: "opening".into(),
///     source: e.into(),
/// })?;
/// create_schema(&mut conn, &Table::all())?;
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
pub fn create_schema(conn: &mut dyn Sql, which: &[Table]) -> Result<()> {
    let dialect = conn.dialect();
    for table in which {
        for statement in table.ddl(dialect)? {
            conn.execute(&statement, &[])
                .map_err(|e| rewrap(e, || format!("creating table {}", table.name())))?;
        }
    }
    Ok(())
}

/// The statements that create the three tables under their default names, each ending in `;`,
/// for a migration tool.
pub fn schema_ddl(dialect: Dialect) -> String {
    let mut out = String::new();
    for table in Table::all() {
        // The default names are valid identifiers, so `ddl` cannot fail here.
        for statement in table.ddl(dialect).unwrap_or_default() {
            out.push_str(&statement);
            out.push_str(";\n");
        }
    }
    out
}
