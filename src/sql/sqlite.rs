//! [`Sql`] for `rusqlite::Connection` and `rusqlite::Transaction`.
//!
//! Statements are prepared through rusqlite's statement cache, so a store's statements are
//! parsed once per connection.

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::dialect::Dialect;
use super::seam::{Sql, SqlTransaction, Transactional};
use super::value::Value;
use crate::error::{Error, Result};

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Bytes(b) => ValueRef::Blob(b),
        }))
    }
}

fn execute(conn: &Connection, sql: &str, params: &[Value]) -> Result<u64> {
    let mut stmt = conn
        .prepare_cached(sql)
        .map_err(|e| Error::sql("preparing a statement", e))?;
    let n = stmt
        .execute(rusqlite::params_from_iter(params.iter()))
        .map_err(|e| Error::sql("executing a statement", e))?;
    Ok(n as u64)
}

fn query(conn: &Connection, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
    let mut stmt = conn
        .prepare_cached(sql)
        .map_err(|e| Error::sql("preparing a query", e))?;
    let width = stmt.column_count();
    let mut rows = stmt
        .query(rusqlite::params_from_iter(params.iter()))
        .map_err(|e| Error::sql("running a query", e))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(|e| Error::sql("reading a row", e))? {
        let mut values = Vec::with_capacity(width);
        for i in 0..width {
            let v = row
                .get_ref(i)
                .map_err(|e| Error::sql("reading a column", e))?;
            values.push(match v {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(i) => Value::Integer(i),
                ValueRef::Real(f) => Value::Text(f.to_string()),
                ValueRef::Text(t) => Value::Text(
                    String::from_utf8(t.to_vec())
                        .map_err(|e| Error::sql("reading a text column", e))?,
                ),
                ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
            });
        }
        out.push(values);
    }
    Ok(out)
}

impl Sql for Connection {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        execute(self, sql, params)
    }
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
        query(self, sql, params)
    }
    /// `Some(false)` in autocommit mode, `Some(true)` after `BEGIN`.
    fn in_transaction(&self) -> Option<bool> {
        Some(!self.is_autocommit())
    }
}

impl Sql for Transaction<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        execute(self, sql, params)
    }
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
        query(self, sql, params)
    }
    fn in_transaction(&self) -> Option<bool> {
        Some(true)
    }
}

impl Transactional for Connection {
    type Transaction<'c> = Transaction<'c>;

    /// `BEGIN IMMEDIATE`: the transaction holds the write lock from its first statement, so
    /// two transactions claiming one key serialise instead of failing on the lock upgrade.
    fn begin(&mut self) -> Result<Transaction<'_>> {
        self.transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| Error::sql("beginning a transaction", e))
    }
}

impl SqlTransaction for Transaction<'_> {
    fn commit(self) -> Result<()> {
        Transaction::commit(self).map_err(|e| Error::sql("committing a transaction", e))
    }
    fn rollback(self) -> Result<()> {
        Transaction::rollback(self).map_err(|e| Error::sql("rolling back a transaction", e))
    }
}
