//! The values that cross the seam: [`Value`], and reading a result row's columns.

use crate::error::{Error, Result};

/// A parameter or a result column.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// A 64-bit signed integer (`BIGINT`).
    Integer(i64),
    /// UTF-8 text.
    Text(String),
    /// Bytes (`BLOB`, `BYTEA`).
    Bytes(Vec<u8>),
}

impl Value {
    /// The integer, if this is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// The text, if this is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes, if these are bytes (or text, as its UTF-8 bytes).
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            Value::Text(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// True for [`Value::Null`].
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Integer(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Value {
        Value::Bytes(v)
    }
}

impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Value {
        Value::Bytes(v.to_vec())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}

/// The longest duration [`duration_ms`] returns: half of `i64::MAX` ms, so that the database's
/// clock plus or minus it cannot overflow a `BIGINT`.
const MAX_DURATION_MS: i64 = i64::MAX / 2;

/// A duration in whole milliseconds, saturating at [`MAX_DURATION_MS`] (about 146 million
/// years), so that `now ± duration` in SQL cannot overflow.
pub(crate) fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).map_or(MAX_DURATION_MS, |ms| ms.min(MAX_DURATION_MS))
}

/// Reads column `i` of `row` as an integer.
pub(crate) fn col_i64(row: &[Value], i: usize) -> Result<i64> {
    match row.get(i) {
        Some(Value::Integer(v)) => Ok(*v),
        other => Err(unexpected(i, "an integer", other)),
    }
}

/// Reads column `i` of `row` as text.
pub(crate) fn col_text(row: &[Value], i: usize) -> Result<String> {
    match row.get(i) {
        Some(Value::Text(v)) => Ok(v.clone()),
        Some(Value::Bytes(b)) => String::from_utf8(b.clone())
            .map_err(|e| Error::sql(format!("reading column {i} as text"), e)),
        other => Err(unexpected(i, "text", other)),
    }
}

/// Reads column `i` of `row` as optional text.
pub(crate) fn col_opt_text(row: &[Value], i: usize) -> Result<Option<String>> {
    match row.get(i) {
        Some(Value::Null) => Ok(None),
        _ => col_text(row, i).map(Some),
    }
}

/// Reads column `i` of `row` as bytes.
pub(crate) fn col_bytes(row: &[Value], i: usize) -> Result<Vec<u8>> {
    match row.get(i) {
        Some(Value::Bytes(b)) => Ok(b.clone()),
        Some(Value::Text(s)) => Ok(s.clone().into_bytes()),
        other => Err(unexpected(i, "bytes", other)),
    }
}

fn unexpected(i: usize, wanted: &str, got: Option<&Value>) -> Error {
    Error::sql(
        format!("reading column {i}"),
        format!("expected {wanted}, found {got:?}"),
    )
}
