//! The generic batch store: a user-supplied effect and its receipts, one transaction per batch.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::store_apply::{ApplyBatch, Message, Receipt};
use crate::error::{Error, Result};
use crate::sql::{self, Connect, Dialect, Sql, Value};

/// The default name of the receipt table.
pub const DEFAULT_RECEIPTS_TABLE: &str = "acemq_receipts";

/// Identities looked up per query.
const LOOKUP_CHUNK: usize = 500;
/// Receipts written per statement (three parameters each).
const INSERT_CHUNK: usize = 200;

/// The effect of one new message, run inside the batch's transaction.
///
/// Implemented for closures `Fn(&mut dyn Sql, &Message) -> Result<String>`. It runs on the
/// batcher's worker thread, hence `Sync`. It must write only through `tx` (so its writes commit
/// or roll back with the receipts) and must not commit, roll back or swallow a database error:
/// an error it returns rolls back the whole batch. The string it returns is recorded with the
/// receipt and returned again, as [`Receipt::Replayed`], for every replay of the message.
pub trait Effect: Sync {
    /// Applies `message` on `tx` and returns its outcome.
    ///
    /// # Errors
    ///
    /// Any error refuses the message and rolls back its whole batch; use
    /// [`Error::InvalidArgument`] for an invalid or unauthorised item.
    fn apply(&self, tx: &mut dyn Sql, message: &Message) -> Result<String>;
}

impl<F> Effect for F
where
    F: Fn(&mut dyn Sql, &Message) -> Result<String> + Sync,
{
    fn apply(&self, tx: &mut dyn Sql, message: &Message) -> Result<String> {
        self(tx, message)
    }
}

/// Applies batches of messages through a user-supplied [`Effect`] and keeps their receipts, on
/// SQLite, PostgreSQL or MySQL.
///
/// [`apply_batch`](ApplyBatch::apply_batch) gets a connection from the connections factory,
/// begins a transaction (`BEGIN IMMEDIATE` on SQLite, so the batch holds the write lock from
/// its first statement), and in it looks up the receipts of the batch's identities, returns the
/// recorded outcome of each replay (after checking its payload's SHA-256), runs the effect for
/// each new message and writes its receipt, and commits. Any error rolls the whole batch back.
/// The connection is dropped at the end of the call; give a factory that opens one (or a
/// r2d2 pool checkout, see [`crate::sql`]).
///
/// The receipt table is `(identifier TEXT PRIMARY KEY, payload_sha256 TEXT, outcome TEXT,
/// created_ms BIGINT)`. If two consumers apply the same new identity at once, the second
/// transaction fails on the primary key and its batch is rolled back; redelivered, it is a
/// replay.
///
/// # Example
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> acemq_amqp::Result<()> {
/// use acemq_amqp::patterns::acknowledged::{
///     ApplyBatch, BatchStore, BatchStoreOptions, Message, Receipt,
/// };
/// use acemq_amqp::sql::Sql;
/// let path = std::env::temp_dir().join(format!("acemq-batch-doc-{}.db", std::process::id()));
/// # std::fs::remove_file(&path).ok();
/// let open = move || {
///     rusqlite::Connection::open(&path).map_err(|e| acemq_amqp::Error::Sql {
///         context: "opening".into(),
///         source: e.into(),
///     })
/// };
/// let mut conn = open()?;
/// Sql::execute(&mut conn, "CREATE TABLE IF NOT EXISTS doc_orders (id TEXT, body BLOB)", &[])?;
/// let effect = |tx: &mut dyn Sql, m: &Message| {
///     tx.execute(
///         "INSERT INTO doc_orders (id, body) VALUES (?1, ?2)",
///         &[m.identifier.as_str().into(), m.payload.clone().into()],
///     )?;
///     Ok("stored".to_string())
/// };
/// let store = BatchStore::new(open, effect, BatchStoreOptions::new().table("doc_receipts"))?;
/// store.create_table()?;
/// let m = Message::new("shop/order/1", b"{}".to_vec());
/// let receipts = store.apply_batch(&[&m, &m])?;
/// assert_eq!(receipts[0], Receipt::Applied { outcome: "stored".into() });
/// assert!(receipts[1].is_replay());
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
pub struct BatchStore<E> {
    connect: Connect,
    table: String,
    effect: E,
}

/// How a [`BatchStore`] names its receipt table. Validated by [`BatchStore::new`].
#[derive(Clone, Debug)]
pub struct BatchStoreOptions {
    table: String,
}

impl Default for BatchStoreOptions {
    fn default() -> Self {
        BatchStoreOptions {
            table: DEFAULT_RECEIPTS_TABLE.to_owned(),
        }
    }
}

impl BatchStoreOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The receipt table's name, a plain identifier. Defaults to `acemq_receipts`.
    #[must_use]
    pub fn table(mut self, name: impl Into<String>) -> Self {
        self.table = name.into();
        self
    }
}

impl<E> fmt::Debug for BatchStore<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl<E: Effect> BatchStore<E> {
    /// A store that gets its connections from `connect` and runs `effect` for each new
    /// message. Checks the options; does not touch the database.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a table name that is not a plain identifier.
    pub fn new<F, C>(connect: F, effect: E, options: BatchStoreOptions) -> Result<BatchStore<E>>
    where
        F: Fn() -> Result<C> + Send + Sync + 'static,
        C: Sql + 'static,
    {
        sql::check_identifier(&options.table)?;
        Ok(BatchStore {
            connect: sql::erase(connect),
            table: options.table,
            effect,
        })
    }

    /// The receipt table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The effect.
    pub fn effect(&self) -> &E {
        &self.effect
    }

    /// The statement that creates the receipt table on SQLite or PostgreSQL (idempotent: `IF
    /// NOT EXISTS`), for a migration tool; [`ddl_for`](Self::ddl_for) writes it for a dialect.
    pub fn ddl(&self) -> String {
        receipts_ddl(&self.table, Dialect::Sqlite)
    }

    /// The statement that creates the receipt table in `dialect` (idempotent: `IF NOT
    /// EXISTS`), for a migration tool. On MySQL the identifier is a `VARCHAR(255)` (a key
    /// there needs a length), the outcome a `LONGTEXT`, the table InnoDB with a binary
    /// collation.
    pub fn ddl_for(&self, dialect: Dialect) -> String {
        receipts_ddl(&self.table, dialect)
    }

    /// Creates the receipt table if it does not exist.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] if the factory or the statement fails.
    pub fn create_table(&self) -> Result<()> {
        let mut conn = (self.connect)()?;
        let ddl = self.ddl_for(conn.dialect());
        conn.execute(&ddl, &[])
            .map_err(|e| sql::rewrap(e, || format!("creating table {}", self.table)))?;
        Ok(())
    }

    /// Applies `messages` on the caller's transaction `tx`, which the caller then commits or
    /// rolls back: the batched form of the transactional idempotent consumer. Returns one
    /// receipt per message; they only hold once `tx` commits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `tx` says it is not in a transaction, or for an empty
    /// identifier, or an identifier already used with a different payload; the effect's errors;
    /// [`Error::Sql`]. After an error the caller must roll `tx` back.
    pub fn apply_batch_in(&self, tx: &mut dyn Sql, messages: &[&Message]) -> Result<Vec<Receipt>> {
        if tx.in_transaction() == Some(false) {
            return Err(Error::invalid(
                "apply_batch_in needs an open transaction, not a connection in autocommit mode",
            ));
        }
        self.apply_in(tx, messages)
    }

    /// The outcome recorded for `identifier`, if it has a receipt.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] if the factory or the query fails.
    pub fn receipt(&self, identifier: &str) -> Result<Option<String>> {
        let mut conn = (self.connect)()?;
        let d = conn.dialect();
        let rows = conn
            .query(
                &format!(
                    "SELECT outcome FROM {} WHERE identifier = {}",
                    self.table,
                    d.placeholder(1)
                ),
                &[identifier.into()],
            )
            .map_err(|e| sql::rewrap(e, || format!("reading a receipt from {}", self.table)))?;
        rows.first().map(|r| sql::col_text(r, 0)).transpose()
    }

    /// Deletes the receipts written more than `older_than` ago and returns how many. A message
    /// whose receipt was purged is applied again if it is delivered again.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] if the factory or the statement fails.
    pub fn purge(&self, older_than: Duration) -> Result<u64> {
        let mut conn = (self.connect)()?;
        let d = conn.dialect();
        // The database's clock, which also dated the receipts.
        conn.execute(
            &format!(
                "DELETE FROM {} WHERE created_ms < {} - {}",
                self.table,
                d.now_ms_sql(),
                d.placeholder(1)
            ),
            &[sql::duration_ms(older_than).into()],
        )
        .map_err(|e| sql::rewrap(e, || format!("purging receipts from {}", self.table)))
    }

    /// The batch's work, on a transaction that is open.
    fn apply_in(&self, tx: &mut dyn Sql, messages: &[&Message]) -> Result<Vec<Receipt>> {
        let t = &self.table;
        let d = tx.dialect();
        // (1) The receipts already there.
        let mut ids: Vec<&str> = Vec::with_capacity(messages.len());
        for m in messages {
            if m.identifier.is_empty() {
                return Err(Error::invalid("a message has an empty identifier"));
            }
            ids.push(&m.identifier);
        }
        ids.sort_unstable();
        ids.dedup();
        let mut known: HashMap<String, (String, String)> = HashMap::new();
        for chunk in ids.chunks(LOOKUP_CHUNK) {
            let placeholders: Vec<String> = (1..=chunk.len()).map(|i| d.placeholder(i)).collect();
            let statement = format!(
                "SELECT identifier, payload_sha256, outcome FROM {t} WHERE identifier IN ({})",
                placeholders.join(", ")
            );
            let params: Vec<Value> = chunk.iter().map(|id| Value::from(*id)).collect();
            let rows = tx
                .query(&statement, &params)
                .map_err(|e| sql::rewrap(e, || format!("reading receipts from {t}")))?;
            for row in rows {
                known.insert(
                    sql::col_text(&row, 0)?,
                    (sql::col_text(&row, 1)?, sql::col_text(&row, 2)?),
                );
            }
        }
        // (2) Replays, (3) new messages.
        let mut receipts = Vec::with_capacity(messages.len());
        let mut new: Vec<(&str, String, String)> = Vec::new();
        for m in messages {
            let sha = sha256_hex(&m.payload);
            if let Some((known_sha, outcome)) = known.get(m.identifier.as_str()) {
                if *known_sha != sha {
                    return Err(Error::invalid(format!(
                        "identifier {:?} was already used with a different payload",
                        m.identifier
                    )));
                }
                receipts.push(Receipt::Replayed {
                    outcome: outcome.clone(),
                });
                continue;
            }
            let outcome = self.effect.apply(tx, m)?;
            known.insert(m.identifier.clone(), (sha.clone(), outcome.clone()));
            new.push((&m.identifier, sha, outcome.clone()));
            receipts.push(Receipt::Applied { outcome });
        }
        if d == Dialect::Sqlite && tx.in_transaction() == Some(false) {
            // SQLite ends a transaction by itself on some errors (a full disk, I/O); a receipt
            // written now would commit without its effect.
            return Err(Error::sql(
                "applying a batch",
                "the transaction ended during the effect (a database error was swallowed?)",
            ));
        }
        // Dated by the database's clock, as `purge` compares them.
        let now = d.now_ms_sql();
        for chunk in new.chunks(INSERT_CHUNK) {
            let mut statement = format!(
                "INSERT INTO {t} (identifier, payload_sha256, outcome, created_ms) VALUES "
            );
            let mut params = Vec::with_capacity(chunk.len() * 3);
            for (i, (id, sha, outcome)) in chunk.iter().enumerate() {
                if i > 0 {
                    statement.push_str(", ");
                }
                let n = i * 3;
                statement.push_str(&format!(
                    "({}, {}, {}, {now})",
                    d.placeholder(n + 1),
                    d.placeholder(n + 2),
                    d.placeholder(n + 3),
                ));
                params.push(Value::from(*id));
                params.push(Value::from(sha.as_str()));
                params.push(Value::from(outcome.as_str()));
            }
            tx.execute(&statement, &params)
                .map_err(|e| sql::rewrap(e, || format!("writing receipts to {t}")))?;
        }
        Ok(receipts)
    }
}

impl<E: Effect> ApplyBatch for BatchStore<E> {
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let conn = (self.connect)()?;
        let mut tx = Tx::begin(conn)?;
        let receipts = self.apply_in(tx.conn(), messages)?;
        tx.commit()?;
        Ok(receipts)
    }

    /// Opens a connection and commits an empty transaction (`BEGIN IMMEDIATE` on SQLite, so
    /// the write lock is checked too).
    fn check_up(&self) -> Result<()> {
        Tx::begin((self.connect)()?)?.commit()
    }
}

/// A transaction begun with a statement on a connection; rolled back unless committed (also
/// when a panic unwinds through it, so a pooled connection never goes back mid-transaction).
struct Tx {
    conn: Box<dyn Sql>,
    open: bool,
}

impl Tx {
    fn begin(mut conn: Box<dyn Sql>) -> Result<Tx> {
        let begin = conn.dialect().begin();
        conn.execute(begin, &[])
            .map_err(|e| sql::rewrap(e, || "beginning a batch transaction".into()))?;
        Ok(Tx { conn, open: true })
    }

    fn conn(&mut self) -> &mut dyn Sql {
        &mut *self.conn
    }

    fn commit(mut self) -> Result<()> {
        let r = self
            .conn
            .execute("COMMIT", &[])
            .map_err(|e| sql::rewrap(e, || "committing a batch transaction".into()));
        // On failure `Drop` rolls back whatever is left open.
        self.open = r.is_err();
        r.map(|_| ())
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if self.open {
            if let Err(e) = self.conn.execute("ROLLBACK", &[]) {
                log::debug!("rolling back a batch transaction: {e}");
            }
        }
    }
}

/// The statement creating a receipt table named `table` (already checked).
fn receipts_ddl(table: &str, d: Dialect) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n    \
         identifier {} PRIMARY KEY,\n    \
         payload_sha256 TEXT NOT NULL,\n    \
         outcome {} NOT NULL,\n    \
         created_ms BIGINT NOT NULL\n){}",
        d.key_text(),
        d.long_text(),
        d.table_options()
    )
}

/// The SHA-256 of `bytes`, as lowercase hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_is_hex_of_the_bytes() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn ddl_names_the_columns() {
        let ddl = receipts_ddl("acemq_receipts", Dialect::Postgres);
        assert!(receipts_ddl("r", Dialect::Mysql).contains("identifier VARCHAR(255) PRIMARY KEY"));
        for c in [
            "identifier TEXT PRIMARY KEY",
            "payload_sha256",
            "created_ms BIGINT",
        ] {
            assert!(ddl.contains(c), "{ddl}");
        }
    }
}
