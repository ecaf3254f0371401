//! The demonstration store: named counters on a SQLite file, incremented by messages.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::store::Effect;
use super::store::{BatchStore, BatchStoreOptions, DEFAULT_RECEIPTS_TABLE};
use super::store_apply::{ApplyBatch, Message, Receipt};
use crate::error::{Error, Result};
use crate::sql::{self, Sql, Value};

/// The default name of the counters table.
const DEFAULT_COUNTERS_TABLE: &str = "acemq_counters";
/// The longest counter name, in bytes.
const MAX_COUNTER_NAME: usize = 64;

/// What a counter message asks for: add `by` to the counter `counter`. Its payload is the JSON
/// `{"counter": "page_views", "by": 1}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CounterIncrement {
    /// The counter's name: 1 to 64 ASCII letters, digits, `_`, `-`, `.` or `:`.
    pub counter: String,
    /// How much to add (may be negative).
    pub by: i64,
}

impl CounterIncrement {
    /// Add `by` to `counter`.
    pub fn new(counter: impl Into<String>, by: i64) -> CounterIncrement {
        CounterIncrement {
            counter: counter.into(),
            by,
        }
    }

    /// The JSON payload.
    pub fn payload(&self) -> Vec<u8> {
        // Serializing a struct of a string and an integer cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A message with this payload and the given identity.
    pub fn message(&self, identifier: impl Into<String>) -> Message {
        Message::new(identifier, self.payload())
    }

    /// Reads a payload.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if it is not such a JSON object.
    pub fn from_payload(payload: &[u8]) -> Result<CounterIncrement> {
        serde_json::from_slice(payload)
            .map_err(|e| Error::invalid(format!("not a counter increment: {e}")))
    }
}

/// Named counters in a SQLite file, each message adding to one: the acknowledged consumer's
/// demonstration.
///
/// Built on [`BatchStore`]: for each batch it opens a connection to the file (WAL,
/// `synchronous=FULL`, so a commit is on disk before anything is acknowledged), and in one
/// `BEGIN IMMEDIATE` transaction checks the receipts, applies the new increments and writes their
/// receipts, commits, and closes the connection. A message is refused, and its whole batch rolled
/// back, when its payload is not a [`CounterIncrement`], its counter name is invalid, the counter
/// is not in the [allowed list](CounterStoreOptions::allow) (unauthorised), or the sum would
/// overflow an `i64`. The outcome recorded for an increment is the JSON
/// `{"counter": …, "value": …}` with the counter's value after it.
///
/// From its first batch on, the store also keeps one idle connection to the file, which never
/// runs a statement or holds a lock. SQLite checkpoints the WAL into the database (several
/// fsyncs) whenever the *last* connection to a file closes; without it, closing each batch's
/// connection would do that every batch and cost about six times the commit itself. WAL
/// checkpoints then happen as usual, every 1000 pages and when the store is dropped.
pub struct CounterStore {
    path: Arc<PathBuf>,
    busy_timeout: Duration,
    /// An idle connection kept open from the first batch on (see the type's docs).
    _keeper: Arc<Mutex<Option<rusqlite::Connection>>>,
    inner: BatchStore<CounterEffect>,
}

/// How a [`CounterStore`] names its tables and which counters it may change. Validated by
/// [`CounterStore::new`].
#[derive(Clone, Debug)]
pub struct CounterStoreOptions {
    receipts_table: String,
    counters_table: String,
    allowed: Option<HashSet<String>>,
    busy_timeout: Duration,
}

impl Default for CounterStoreOptions {
    fn default() -> Self {
        CounterStoreOptions {
            receipts_table: DEFAULT_RECEIPTS_TABLE.to_owned(),
            counters_table: DEFAULT_COUNTERS_TABLE.to_owned(),
            allowed: None,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

impl CounterStoreOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The receipt table's name, a plain identifier. Defaults to `acemq_receipts`.
    #[must_use]
    pub fn receipts_table(mut self, name: impl Into<String>) -> Self {
        self.receipts_table = name.into();
        self
    }

    /// The counters table's name, a plain identifier. Defaults to `acemq_counters`.
    #[must_use]
    pub fn counters_table(mut self, name: impl Into<String>) -> Self {
        self.counters_table = name.into();
        self
    }

    /// Only these counters may be changed; a message for another one is refused as
    /// unauthorised. Defaults to allowing every valid name.
    #[must_use]
    pub fn allow<I, S>(mut self, counters: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allowed = Some(counters.into_iter().map(Into::into).collect());
        self
    }

    /// How long a batch waits for another writer's lock on the file. Defaults to 5 s.
    #[must_use]
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }
}

impl CounterStore {
    /// A store on the SQLite file at `path` (created if missing) with these options. Checks
    /// the options; does not touch the file.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a table name that is not a plain identifier,
    /// [`Error::InvalidArgument`] for two tables of the same name or an invalid allowed counter.
    pub fn new(path: impl AsRef<Path>, options: CounterStoreOptions) -> Result<CounterStore> {
        sql::check_identifier(&options.receipts_table)?;
        sql::check_identifier(&options.counters_table)?;
        if options.receipts_table == options.counters_table {
            return Err(Error::invalid(
                "the receipts and counters tables must have different names",
            ));
        }
        if let Some(allowed) = &options.allowed {
            for name in allowed {
                check_counter_name(name)?;
            }
        }
        let path = Arc::new(path.as_ref().to_path_buf());
        let busy_timeout = options.busy_timeout;
        let open_path = Arc::clone(&path);
        let effect = CounterEffect {
            select: format!(
                "SELECT value FROM {} WHERE name = ?1",
                options.counters_table
            ),
            upsert: format!(
                "INSERT INTO {} (name, value) VALUES (?1, ?2) \
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                options.counters_table
            ),
            table: options.counters_table,
            allowed: options.allowed,
        };
        let keeper: Arc<Mutex<Option<rusqlite::Connection>>> = Arc::new(Mutex::new(None));
        let keep = Arc::clone(&keeper);
        let connect = move || {
            let conn = open(&open_path, busy_timeout)?;
            let mut kept = keep.lock();
            if kept.is_none() {
                *kept = Some(open(&open_path, busy_timeout)?);
            }
            Ok(conn)
        };
        let inner = BatchStore::new(
            connect,
            effect,
            BatchStoreOptions::new().table(options.receipts_table),
        )?;
        Ok(CounterStore {
            path,
            busy_timeout,
            _keeper: keeper,
            inner,
        })
    }
}

impl fmt::Debug for CounterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CounterStore")
            .field("path", &self.path)
            .field("receipts_table", &self.inner.table())
            .field("counters_table", &self.inner.effect().table)
            .finish_non_exhaustive()
    }
}

impl CounterStore {
    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying batch store (its receipt table, [`BatchStore::receipt`],
    /// [`BatchStore::purge`]).
    pub fn batch_store(&self) -> &BatchStore<impl Effect> {
        &self.inner
    }

    /// Creates the receipt and counters tables if they do not exist, and puts the file in WAL
    /// mode.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] if the file cannot be opened or a statement fails.
    pub fn create_tables(&self) -> Result<()> {
        let mut conn = self.open()?;
        let table = &self.inner.effect().table;
        Sql::execute(
            &mut conn,
            &format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n    \
                 name TEXT PRIMARY KEY,\n    \
                 value BIGINT NOT NULL\n)"
            ),
            &[],
        )
        .map_err(|e| sql::rewrap(e, || format!("creating table {table}")))?;
        self.inner.create_table()
    }

    /// The counter's value (0 if it was never incremented).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an invalid counter name, [`Error::Sql`] if the query fails.
    pub fn value(&self, counter: &str) -> Result<i64> {
        check_counter_name(counter)?;
        let mut conn = self.open()?;
        let rows = conn.query(&self.inner.effect().select, &[counter.into()])?;
        rows.first().map_or(Ok(0), |r| sql::col_i64(r, 0))
    }

    /// The number of receipts.
    ///
    /// # Errors
    ///
    /// [`Error::Sql`] if the query fails.
    pub fn receipt_count(&self) -> Result<u64> {
        let mut conn = self.open()?;
        let rows = conn.query(&format!("SELECT COUNT(*) FROM {}", self.inner.table()), &[])?;
        let n = rows.first().map_or(Ok(0), |r| sql::col_i64(r, 0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn open(&self) -> Result<rusqlite::Connection> {
        open(&self.path, self.busy_timeout)
    }
}

impl ApplyBatch for CounterStore {
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>> {
        self.inner.apply_batch(messages)
    }
    fn check_up(&self) -> Result<()> {
        self.inner.check_up()
    }
}

/// Opens the file in WAL mode with `synchronous=FULL`.
fn open(path: &Path, busy_timeout: Duration) -> Result<rusqlite::Connection> {
    let opening = || format!("opening the counter database {}", path.display());
    let conn = rusqlite::Connection::open(path).map_err(|e| Error::sql(opening(), e))?;
    conn.busy_timeout(busy_timeout)
        .and_then(|_| conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"))
        .map_err(|e| Error::sql(opening(), e))?;
    Ok(conn)
}

/// Checks a counter name: 1 to 64 ASCII letters, digits, `_`, `-`, `.` or `:`.
fn check_counter_name(name: &str) -> Result<()> {
    let refuse = |reason: &str| {
        Err(Error::InvalidName {
            kind: "counter",
            name: name.chars().take(80).collect(),
            reason: reason.to_owned(),
        })
    };
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.len() > MAX_COUNTER_NAME {
        return refuse("it is longer than 64 bytes");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
    {
        return refuse("only ASCII letters, digits, '_', '-', '.' and ':' are allowed");
    }
    Ok(())
}

/// Adds a message's increment to its counter.
struct CounterEffect {
    table: String,
    select: String,
    upsert: String,
    allowed: Option<HashSet<String>>,
}

#[derive(Serialize)]
struct CounterOutcome<'a> {
    counter: &'a str,
    value: i64,
}

impl Effect for CounterEffect {
    fn apply(&self, tx: &mut dyn Sql, message: &Message) -> Result<String> {
        let inc = CounterIncrement::from_payload(&message.payload)?;
        check_counter_name(&inc.counter)?;
        if let Some(allowed) = &self.allowed {
            if !allowed.contains(&inc.counter) {
                return Err(Error::invalid(format!(
                    "not authorised to change counter {:?}",
                    inc.counter
                )));
            }
        }
        let name = Value::from(inc.counter.as_str());
        let rows = tx.query(&self.select, std::slice::from_ref(&name))?;
        let current = rows.first().map_or(Ok(0), |r| sql::col_i64(r, 0))?;
        let value = current.checked_add(inc.by).ok_or_else(|| {
            Error::invalid(format!(
                "adding {} to counter {:?} (now {current}) would overflow",
                inc.by, inc.counter
            ))
        })?;
        tx.execute(&self.upsert, &[name, Value::Integer(value)])?;
        Ok(serde_json::to_string(&CounterOutcome {
            counter: &inc.counter,
            value,
        })
        .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names() {
        assert!(check_counter_name("page_views:eu-1.total").is_ok());
        for bad in ["", "a b", "x;drop", &"a".repeat(65), "é"] {
            assert!(check_counter_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn payload_round_trip() {
        let inc = CounterIncrement::new("hits", -3);
        assert_eq!(
            String::from_utf8(inc.payload()).unwrap(),
            r#"{"counter":"hits","by":-3}"#
        );
        assert_eq!(CounterIncrement::from_payload(&inc.payload()).unwrap(), inc);
        assert!(CounterIncrement::from_payload(b"{}").is_err());
    }
}
