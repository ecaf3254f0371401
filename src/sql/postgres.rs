//! [`Sql`] for `postgres::Client` and `postgres::Transaction`.
//!
//! A statement whose parameters are all non-null is sent with typed parameters (`bigint`,
//! `text`, `bytea`) in one round trip, without a named prepared statement. A statement with a
//! `NULL` parameter is prepared first and each parameter is converted to the type the server
//! inferred for it.

use postgres::types::{ToSql, Type};
use postgres::{Client, Row, Statement, Transaction};

use super::dialect::Dialect;
use super::seam::{Sql, SqlTransaction, Transactional};
use super::value::Value;
use crate::error::{Error, Result};

/// The part of the postgres client API both `Client` and `Transaction` offer.
trait Pg {
    fn execute_typed(&mut self, sql: &str, p: &[(&(dyn ToSql + Sync), Type)]) -> PgResult<u64>;
    fn query_typed(&mut self, sql: &str, p: &[(&(dyn ToSql + Sync), Type)]) -> PgResult<Vec<Row>>;
    fn prepare(&mut self, sql: &str) -> PgResult<Statement>;
    fn execute_stmt(&mut self, s: &Statement, p: &[&(dyn ToSql + Sync)]) -> PgResult<u64>;
    fn query_stmt(&mut self, s: &Statement, p: &[&(dyn ToSql + Sync)]) -> PgResult<Vec<Row>>;
}

type PgResult<T> = std::result::Result<T, postgres::Error>;

macro_rules! impl_pg {
    ($t:ty) => {
        impl Pg for $t {
            fn execute_typed(
                &mut self,
                sql: &str,
                p: &[(&(dyn ToSql + Sync), Type)],
            ) -> PgResult<u64> {
                <$t>::execute_typed(self, sql, p)
            }
            fn query_typed(
                &mut self,
                sql: &str,
                p: &[(&(dyn ToSql + Sync), Type)],
            ) -> PgResult<Vec<Row>> {
                <$t>::query_typed(self, sql, p)
            }
            fn prepare(&mut self, sql: &str) -> PgResult<Statement> {
                <$t>::prepare(self, sql)
            }
            fn execute_stmt(&mut self, s: &Statement, p: &[&(dyn ToSql + Sync)]) -> PgResult<u64> {
                <$t>::execute(self, s, p)
            }
            fn query_stmt(
                &mut self,
                s: &Statement,
                p: &[&(dyn ToSql + Sync)],
            ) -> PgResult<Vec<Row>> {
                <$t>::query(self, s, p)
            }
        }
    };
}

impl_pg!(Client);
impl_pg!(Transaction<'_>);

/// A parameter converted to a native type the driver can send.
enum Native {
    I64(Option<i64>),
    I32(Option<i32>),
    I16(Option<i16>),
    Bool(Option<bool>),
    Text(Option<String>),
    Bytes(Option<Vec<u8>>),
}

impl Native {
    fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Native::I64(v) => v,
            Native::I32(v) => v,
            Native::I16(v) => v,
            Native::Bool(v) => v,
            Native::Text(v) => v,
            Native::Bytes(v) => v,
        }
    }

    /// `value` as the type the server inferred for its parameter.
    fn for_type(value: &Value, ty: &Type) -> Result<Native> {
        let wrong = || {
            Error::sql(
                "binding a parameter",
                format!("cannot send {value:?} as a parameter of type {ty}"),
            )
        };
        let int = |i: i64| -> Result<Native> {
            Ok(match *ty {
                Type::INT8 => Native::I64(Some(i)),
                Type::INT4 => Native::I32(Some(i32::try_from(i).map_err(|_| wrong())?)),
                Type::INT2 => Native::I16(Some(i16::try_from(i).map_err(|_| wrong())?)),
                Type::BOOL => Native::Bool(Some(i != 0)),
                _ => return Err(wrong()),
            })
        };
        match value {
            Value::Integer(i) => int(*i),
            Value::Text(s) => Ok(Native::Text(Some(s.clone()))),
            Value::Bytes(b) if *ty == Type::BYTEA => Ok(Native::Bytes(Some(b.clone()))),
            Value::Bytes(_) => Err(wrong()),
            Value::Null => Ok(match *ty {
                Type::INT8 => Native::I64(None),
                Type::INT4 => Native::I32(None),
                Type::INT2 => Native::I16(None),
                Type::BOOL => Native::Bool(None),
                Type::BYTEA => Native::Bytes(None),
                _ => Native::Text(None),
            }),
        }
    }
}

fn has_null(params: &[Value]) -> bool {
    params.iter().any(Value::is_null)
}

/// Non-null parameters with their types, for the one-round-trip path.
fn typed(params: &[Value]) -> Vec<(&(dyn ToSql + Sync), Type)> {
    params
        .iter()
        .map(|v| -> (&(dyn ToSql + Sync), Type) {
            match v {
                Value::Integer(i) => (i, Type::INT8),
                Value::Text(s) => (s, Type::TEXT),
                Value::Bytes(b) => (b, Type::BYTEA),
                // `typed` is only called when there is no null; text is a harmless stand-in.
                Value::Null => (&None::<String>, Type::TEXT),
            }
        })
        .collect()
}

fn natives(stmt: &Statement, params: &[Value]) -> Result<Vec<Native>> {
    if stmt.params().len() != params.len() {
        return Err(Error::sql(
            "binding parameters",
            format!(
                "the statement has {} parameters, {} were given",
                stmt.params().len(),
                params.len()
            ),
        ));
    }
    params
        .iter()
        .zip(stmt.params())
        .map(|(v, ty)| Native::for_type(v, ty))
        .collect()
}

fn execute(pg: &mut impl Pg, sql: &str, params: &[Value]) -> Result<u64> {
    if !has_null(params) {
        return pg
            .execute_typed(sql, &typed(params))
            .map_err(|e| Error::sql("executing a statement", e));
    }
    let stmt = pg
        .prepare(sql)
        .map_err(|e| Error::sql("preparing a statement", e))?;
    let natives = natives(&stmt, params)?;
    let refs: Vec<_> = natives.iter().map(Native::as_sql).collect();
    pg.execute_stmt(&stmt, &refs)
        .map_err(|e| Error::sql("executing a statement", e))
}

fn query(pg: &mut impl Pg, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
    let rows = if !has_null(params) {
        pg.query_typed(sql, &typed(params))
            .map_err(|e| Error::sql("running a query", e))?
    } else {
        let stmt = pg
            .prepare(sql)
            .map_err(|e| Error::sql("preparing a query", e))?;
        let natives = natives(&stmt, params)?;
        let refs: Vec<_> = natives.iter().map(Native::as_sql).collect();
        pg.query_stmt(&stmt, &refs)
            .map_err(|e| Error::sql("running a query", e))?
    };
    rows.iter().map(row_values).collect()
}

fn row_values(row: &Row) -> Result<Vec<Value>> {
    (0..row.len())
        .map(|i| {
            let ty = row.columns()[i].type_().clone();
            let read = |e: postgres::Error| Error::sql(format!("reading column {i}"), e);
            Ok(match ty {
                Type::INT8 => row.try_get::<_, Option<i64>>(i).map_err(read)?.into(),
                Type::INT4 => row
                    .try_get::<_, Option<i32>>(i)
                    .map_err(read)?
                    .map(i64::from)
                    .into(),
                Type::INT2 => row
                    .try_get::<_, Option<i16>>(i)
                    .map_err(read)?
                    .map(i64::from)
                    .into(),
                Type::BOOL => row
                    .try_get::<_, Option<bool>>(i)
                    .map_err(read)?
                    .map(i64::from)
                    .into(),
                Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(i).map_err(read)?.into(),
                _ => row.try_get::<_, Option<String>>(i).map_err(read)?.into(),
            })
        })
        .collect()
}

impl Sql for Client {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        execute(self, sql, params)
    }
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
        query(self, sql, params)
    }
    /// `Some(false)`: a `Client` runs each statement in its own transaction. (A transaction
    /// begun with a raw `BEGIN` is not tracked; use `Client::transaction`, or
    /// [`Transactional::begin`].)
    fn in_transaction(&self) -> Option<bool> {
        Some(false)
    }
}

impl Sql for Transaction<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
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

impl Transactional for Client {
    type Transaction<'c> = Transaction<'c>;

    fn begin(&mut self) -> Result<Transaction<'_>> {
        self.transaction()
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
