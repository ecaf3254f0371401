//! [`Sql`] for the `mysql` crate's `Conn`, `PooledConn` and `Transaction` (MySQL 8.0+, MariaDB
//! 10.6+), and [`MysqlManager`], an r2d2 manager for it.
//!
//! A statement with parameters is prepared (the driver keeps a cache of prepared statements per
//! connection) and run with the binary protocol; one without parameters goes as text, so that
//! `START TRANSACTION`, `COMMIT` and DDL run as written. The stores' `$N` placeholders are sent
//! as `?` with the parameters in the order the statement names them (see
//! [`Dialect::placeholders`]).

use std::borrow::Cow;
use std::fmt;
use std::ops::{Deref, DerefMut};

use mysql::consts::ColumnType;
use mysql::prelude::{Protocol, Queryable};
use mysql::{Column, Conn, Opts, PooledConn, QueryResult, Transaction, TxOpts};

use super::dialect::Dialect;
use super::seam::{Sql, SqlTransaction, Transactional};
use super::value::Value;
use crate::error::{Error, Result};

/// The collation id of MySQL's `binary` character set: a string column of it holds bytes.
const BINARY: u16 = 63;

/// `sql` with its `$N` placeholders written as `?`, and the parameters in the order the
/// statement names them; `sql` and `params` as they are when it has none.
fn positional<'s>(sql: &'s str, params: &[Value]) -> Result<(Cow<'s, str>, Vec<mysql::Value>)> {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut order: Vec<usize> = Vec::new();
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'\'' | b'"' | b'`') => {
                // To the closing quote; a doubled quote or a backslash escape stays inside.
                i += 1;
                while i < bytes.len() {
                    if bytes[i] == b'\\' && quote != b'`' {
                        i += 2;
                    } else if bytes[i] == quote {
                        if bytes.get(i + 1) == Some(&quote) {
                            i += 2;
                        } else {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                i += 1;
            }
            b'#' => i = skip_to_line_end(bytes, i),
            b'-' if bytes.get(i + 1) == Some(&b'-')
                && bytes.get(i + 2).is_none_or(|b| b.is_ascii_whitespace()) =>
            {
                i = skip_to_line_end(bytes, i)
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = sql[i + 2..]
                    .find("*/")
                    .map_or(bytes.len(), |end| i + 2 + end + 2);
            }
            b'$' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
                && !(i > 0 && is_word(bytes[i - 1])) =>
            {
                let digits = bytes[i + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                let n: usize = sql[i + 1..i + 1 + digits].parse().unwrap_or(0);
                if n == 0 || n > params.len() {
                    return Err(Error::sql(
                        "binding parameters",
                        format!(
                            "the statement names parameter ${n}, {} were given",
                            params.len()
                        ),
                    ));
                }
                out.push_str(&sql[copied..i]);
                out.push('?');
                order.push(n - 1);
                i += 1 + digits;
                copied = i;
            }
            _ => i += 1,
        }
    }
    if order.is_empty() {
        return Ok((Cow::Borrowed(sql), params.iter().map(native).collect()));
    }
    out.push_str(&sql[copied..]);
    Ok((
        Cow::Owned(out),
        order.into_iter().map(|n| native(&params[n])).collect(),
    ))
}

fn skip_to_line_end(bytes: &[u8], from: usize) -> usize {
    bytes[from..]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(bytes.len(), |end| from + end)
}

/// A byte that can be part of an unquoted identifier (where a `$` is not a placeholder).
fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

fn native(value: &Value) -> mysql::Value {
    match value {
        Value::Null => mysql::Value::NULL,
        Value::Integer(i) => mysql::Value::Int(*i),
        Value::Text(s) => mysql::Value::Bytes(s.as_bytes().to_vec()),
        Value::Bytes(b) => mysql::Value::Bytes(b.clone()),
    }
}

/// Reads every result set of `result`: the rows into `rows`, and the rows changed, added up.
fn drain<P: Protocol>(
    mut result: QueryResult<'_, '_, '_, P>,
    rows: &mut Vec<Vec<Value>>,
) -> Result<u64> {
    let mut changed = 0;
    while let Some(set) = result.iter() {
        // Read before the rows: once they are read the set's end is passed.
        changed += set.affected_rows();
        for row in set {
            let row = row.map_err(|e| Error::sql("reading a row", e))?;
            rows.push(row_values(row)?);
        }
    }
    Ok(changed)
}

fn run(
    q: &mut impl Queryable,
    sql: &str,
    params: &[Value],
    rows: &mut Vec<Vec<Value>>,
) -> Result<u64> {
    let (sql, params) = positional(sql, params)?;
    if params.is_empty() {
        let result = q
            .query_iter(sql.as_ref())
            .map_err(|e| Error::sql("running a statement", e))?;
        drain(result, rows)
    } else {
        let result = q
            .exec_iter(sql.as_ref(), mysql::Params::Positional(params))
            .map_err(|e| Error::sql("running a statement", e))?;
        drain(result, rows)
    }
}

fn execute(q: &mut impl Queryable, sql: &str, params: &[Value]) -> Result<u64> {
    run(q, sql, params, &mut Vec::new())
}

fn query(q: &mut impl Queryable, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
    let mut rows = Vec::new();
    run(q, sql, params, &mut rows)?;
    Ok(rows)
}

fn row_values(row: mysql::Row) -> Result<Vec<Value>> {
    let columns = row.columns();
    row.unwrap_raw()
        .into_iter()
        .zip(columns.iter())
        .enumerate()
        .map(|(i, (v, c))| column_value(i, v.unwrap_or(mysql::Value::NULL), c))
        .collect()
}

/// A column's value: integers (from either protocol: the text protocol sends them as digits) as
/// [`Value::Integer`], strings of the binary character set (`BLOB`s, `VARBINARY`) as
/// [`Value::Bytes`], the rest as text.
fn column_value(i: usize, v: mysql::Value, column: &Column) -> Result<Value> {
    use ColumnType as T;
    let text = |b: Vec<u8>| {
        String::from_utf8(b)
            .map(Value::Text)
            .map_err(|e| Error::sql(format!("reading column {i} as text"), e))
    };
    Ok(match v {
        mysql::Value::NULL => Value::Null,
        mysql::Value::Int(n) => Value::Integer(n),
        mysql::Value::UInt(n) => {
            i64::try_from(n).map_or(Value::Text(n.to_string()), Value::Integer)
        }
        mysql::Value::Float(f) => Value::Text(f.to_string()),
        mysql::Value::Double(f) => Value::Text(f.to_string()),
        date @ (mysql::Value::Date(..) | mysql::Value::Time(..)) => {
            Value::Text(date.as_sql(false).trim_matches('\'').to_owned())
        }
        mysql::Value::Bytes(b) => match column.column_type() {
            T::MYSQL_TYPE_TINY
            | T::MYSQL_TYPE_SHORT
            | T::MYSQL_TYPE_INT24
            | T::MYSQL_TYPE_LONG
            | T::MYSQL_TYPE_LONGLONG
            | T::MYSQL_TYPE_YEAR
            | T::MYSQL_TYPE_DECIMAL
            | T::MYSQL_TYPE_NEWDECIMAL => match std::str::from_utf8(&b).ok().map(str::parse) {
                Some(Ok(n)) => Value::Integer(n),
                _ => text(b)?,
            },
            T::MYSQL_TYPE_VARCHAR
            | T::MYSQL_TYPE_VAR_STRING
            | T::MYSQL_TYPE_STRING
            | T::MYSQL_TYPE_TINY_BLOB
            | T::MYSQL_TYPE_MEDIUM_BLOB
            | T::MYSQL_TYPE_LONG_BLOB
            | T::MYSQL_TYPE_BLOB
                if column.character_set() == BINARY =>
            {
                Value::Bytes(b)
            }
            _ => text(b)?,
        },
    })
}

macro_rules! impl_mysql_sql {
    ($ty:ty, $in_transaction:expr) => {
        impl Sql for $ty {
            fn dialect(&self) -> Dialect {
                Dialect::Mysql
            }
            fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
                execute(self, sql, params)
            }
            fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
                query(self, sql, params)
            }
            fn in_transaction(&self) -> Option<bool> {
                $in_transaction
            }
        }
    };
}

// A connection runs each statement in its own transaction (autocommit, the server's
// default); a transaction begun with a raw `START TRANSACTION`, or `autocommit` turned off, is
// not tracked: use `start_transaction`, or `Transactional::begin`.
impl_mysql_sql!(Conn, Some(false));
impl_mysql_sql!(PooledConn, Some(false));
impl_mysql_sql!(Transaction<'_>, Some(true));

impl Transactional for Conn {
    type Transaction<'c> = Transaction<'c>;

    fn begin(&mut self) -> Result<Transaction<'_>> {
        self.start_transaction(TxOpts::default())
            .map_err(|e| Error::sql("beginning a transaction", e))
    }
}

impl Transactional for PooledConn {
    type Transaction<'c> = Transaction<'c>;

    fn begin(&mut self) -> Result<Transaction<'_>> {
        self.start_transaction(TxOpts::default())
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

/// An [`r2d2::ManageConnection`] opening `mysql` connections ([`MysqlConnection`]) with one set
/// of [`mysql::Opts`].
///
/// The health check on checkout is a `COM_PING`. A connection on which a statement failed
/// because the link broke (an I/O error, the server gone or the connection killed) reports
/// itself broken when it is given back, so the pool drops it at once — also under
/// [`CheckIdle`](super::CheckIdle), which skips the check for connections given back a moment
/// ago. Nothing is run on a connection as it is given back (`r2d2_mysql` pings there, a round
/// trip per checkout).
///
/// ```no_run
/// # fn main() -> acemq_amqp::Result<()> {
/// use acemq_amqp::patterns::outbox::{SqlOutboxStore, SqlOutboxStoreOptions};
/// use acemq_amqp::sql::{checkout, CheckIdle, MysqlManager};
///
/// let manager = MysqlManager::from_url("mysql://app:secret@127.0.0.1:3306/shop")?;
/// let pool = r2d2::Pool::builder().max_size(8).build(CheckIdle::new(manager))?;
/// let outbox = SqlOutboxStore::open(checkout(&pool), SqlOutboxStoreOptions::default())?;
/// # let _ = outbox;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MysqlManager {
    opts: Opts,
}

impl MysqlManager {
    /// A manager opening connections with `opts`.
    pub fn new(opts: impl Into<Opts>) -> MysqlManager {
        MysqlManager { opts: opts.into() }
    }

    /// A manager opening connections to `url` (`mysql://user:password@host:port/database`, with
    /// the driver's query options).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the URL cannot be read (the error does not repeat the
    /// URL, which may hold a password).
    pub fn from_url(url: &str) -> Result<MysqlManager> {
        let opts = Opts::from_url(url)
            .map_err(|e| Error::invalid(format!("not a MySQL URL: {}", url_error(&e))))?;
        Ok(MysqlManager { opts })
    }

    /// The options each connection is opened with.
    pub fn opts(&self) -> &Opts {
        &self.opts
    }
}

/// A URL error's kind, without the URL.
fn url_error(e: &mysql::UrlError) -> &'static str {
    match e {
        mysql::UrlError::ParseError(_) => "it does not parse as a URL",
        mysql::UrlError::UnsupportedScheme { .. } => "its scheme is not mysql",
        _ => "a parameter or feature it names is not supported",
    }
}

impl fmt::Debug for MysqlManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the options: they hold the password.
        f.debug_struct("MysqlManager")
            .field("host", &self.opts.get_ip_or_hostname())
            .field("port", &self.opts.get_tcp_port())
            .field("user", &self.opts.get_user())
            .field("database", &self.opts.get_db_name())
            .finish_non_exhaustive()
    }
}

/// A connection of a [`MysqlManager`] pool: a [`mysql::Conn`] (it dereferences to it) that
/// remembers whether a statement run through [`Sql`] found its link broken.
#[derive(Debug)]
pub struct MysqlConnection {
    conn: Conn,
    broken: bool,
}

impl MysqlConnection {
    /// The driver's connection.
    pub fn into_inner(self) -> Conn {
        self.conn
    }

    fn watch<T>(&mut self, done: Result<T>) -> Result<T> {
        if let Err(Error::Sql { source, .. }) = &done {
            if source
                .downcast_ref::<mysql::Error>()
                .is_some_and(link_broken)
            {
                self.broken = true;
            }
        }
        done
    }
}

/// Whether the error means the connection cannot be used again.
fn link_broken(e: &mysql::Error) -> bool {
    use mysql::DriverError as D;
    match e {
        mysql::Error::IoError(_) | mysql::Error::CodecError(_) => true,
        mysql::Error::DriverError(d) => matches!(
            d,
            D::PacketOutOfSync | D::UnexpectedPacket | D::Timeout | D::ConnectTimeout
        ),
        // ER_SERVER_SHUTDOWN, ER_CONNECTION_KILLED (MariaDB), ER_CLIENT_INTERACTION_TIMEOUT.
        mysql::Error::MySqlError(e) => matches!(e.code, 1053 | 1927 | 4031),
        _ => false,
    }
}

impl Deref for MysqlConnection {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl DerefMut for MysqlConnection {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }
}

impl Sql for MysqlConnection {
    fn dialect(&self) -> Dialect {
        Dialect::Mysql
    }
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        let done = execute(&mut self.conn, sql, params);
        self.watch(done)
    }
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
        let done = query(&mut self.conn, sql, params);
        self.watch(done)
    }
    fn in_transaction(&self) -> Option<bool> {
        Some(false)
    }
}

impl Transactional for MysqlConnection {
    type Transaction<'c> = Transaction<'c>;

    fn begin(&mut self) -> Result<Transaction<'_>> {
        let broken = &mut self.broken;
        self.conn.start_transaction(TxOpts::default()).map_err(|e| {
            *broken |= link_broken(&e);
            Error::sql("beginning a transaction", e)
        })
    }
}

impl r2d2::ManageConnection for MysqlManager {
    type Connection = MysqlConnection;
    type Error = mysql::Error;

    fn connect(&self) -> std::result::Result<MysqlConnection, mysql::Error> {
        Ok(MysqlConnection {
            conn: Conn::new(self.opts.clone())?,
            broken: false,
        })
    }

    fn is_valid(&self, conn: &mut MysqlConnection) -> std::result::Result<(), mysql::Error> {
        conn.conn.ping()
    }

    fn has_broken(&self, conn: &mut MysqlConnection) -> bool {
        conn.broken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(sql: &str, params: &[Value]) -> (String, Vec<mysql::Value>) {
        let (sql, params) = positional(sql, params).unwrap();
        (sql.into_owned(), params)
    }

    #[test]
    fn numbered_placeholders_go_as_question_marks_in_the_order_named() {
        let p = [Value::Integer(7), Value::from("x")];
        let (sql, params) = sent("SELECT $2, $1 + $1, '$1', `a$1`, b$1 -- $2\n, $2", &p);
        assert_eq!(sql, "SELECT ?, ? + ?, '$1', `a$1`, b$1 -- $2\n, ?");
        assert_eq!(
            params,
            [
                mysql::Value::Bytes(b"x".to_vec()),
                mysql::Value::Int(7),
                mysql::Value::Int(7),
                mysql::Value::Bytes(b"x".to_vec()),
            ]
        );
        let (sql, params) = sent("SELECT 'it''s $1', \"\\\"$1\", ? /* $1 */", &p[..1]);
        assert_eq!(sql, "SELECT 'it''s $1', \"\\\"$1\", ? /* $1 */");
        assert_eq!(params, [mysql::Value::Int(7)]);
        assert!(positional("SELECT $3", &p).is_err());
        assert!(positional("SELECT $0", &p).is_err());
    }
}
