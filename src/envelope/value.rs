//! Header values and their conversions to and from amiquip's AMQP values.

use std::collections::BTreeMap;

use crate::wire::AmqpValue;

use super::validate::{check_header_name, truncate};
use crate::error::{Error, Result};

/// A header value.
#[derive(Clone, Debug, PartialEq)]
pub enum HeaderValue {
    /// UTF-8 text (AMQP long string).
    Text(String),
    /// A signed integer (AMQP long-long; any integer type is read into it).
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A floating point number (AMQP double).
    Float(f64),
    /// Bytes (AMQP byte array): use this for anything that may not be UTF-8.
    Bytes(Vec<u8>),
    /// A nested table.
    Table(BTreeMap<String, HeaderValue>),
    /// An array.
    Array(Vec<HeaderValue>),
    /// An AMQP timestamp (seconds since the epoch).
    Timestamp(u64),
    /// No value (AMQP void).
    Void,
}

impl HeaderValue {
    /// Text from bytes, refused with [`Error::InvalidHeader`] unless they are UTF-8.
    ///
    /// # Errors
    ///
    /// When `bytes` is not valid UTF-8; send it as [`HeaderValue::Bytes`] instead.
    pub fn try_text(name: &str, bytes: Vec<u8>) -> Result<HeaderValue> {
        String::from_utf8(bytes)
            .map(HeaderValue::Text)
            .map_err(|e| Error::InvalidHeader {
                name: truncate(name),
                reason: format!(
                    "value is not UTF-8 (invalid at byte {}); send it as HeaderValue::Bytes",
                    e.utf8_error().valid_up_to()
                ),
            })
    }

    /// The text, if this is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            HeaderValue::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is an integer.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            HeaderValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub(crate) fn to_amqp(&self) -> AmqpValue {
        match self {
            HeaderValue::Text(s) => AmqpValue::LongString(s.clone()),
            HeaderValue::Int(i) => AmqpValue::LongLongInt(*i),
            HeaderValue::Bool(b) => AmqpValue::Boolean(*b),
            HeaderValue::Float(f) => AmqpValue::Double(*f),
            HeaderValue::Bytes(b) => AmqpValue::ByteArray(b.clone()),
            HeaderValue::Table(t) => {
                AmqpValue::FieldTable(t.iter().map(|(k, v)| (k.clone(), v.to_amqp())).collect())
            }
            HeaderValue::Array(a) => AmqpValue::FieldArray(a.iter().map(|v| v.to_amqp()).collect()),
            HeaderValue::Timestamp(t) => AmqpValue::Timestamp(*t),
            HeaderValue::Void => AmqpValue::Void,
        }
    }

    pub(crate) fn from_amqp(value: &AmqpValue) -> HeaderValue {
        match value {
            AmqpValue::Boolean(b) => HeaderValue::Bool(*b),
            AmqpValue::ShortShortInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::ShortShortUInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::ShortInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::ShortUInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::LongInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::LongUInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::LongLongInt(i) => HeaderValue::Int(*i),
            AmqpValue::Float(f) => HeaderValue::Float(f64::from(*f)),
            AmqpValue::Double(f) => HeaderValue::Float(*f),
            AmqpValue::DecimalValue(d) => {
                HeaderValue::Float(f64::from(d.value) / 10f64.powi(i32::from(d.scale)))
            }
            AmqpValue::LongString(s) => HeaderValue::Text(s.clone()),
            AmqpValue::FieldArray(a) => HeaderValue::Array(a.iter().map(Self::from_amqp).collect()),
            AmqpValue::Timestamp(t) => HeaderValue::Timestamp(*t),
            AmqpValue::FieldTable(t) => HeaderValue::Table(
                t.iter()
                    .map(|(k, v)| (k.clone(), Self::from_amqp(v)))
                    .collect(),
            ),
            AmqpValue::ByteArray(b) => HeaderValue::Bytes(b.clone()),
            AmqpValue::Void => HeaderValue::Void,
        }
    }

    pub(super) fn validate(&self, name: &str) -> Result<()> {
        match self {
            HeaderValue::Table(t) => {
                for (k, v) in t {
                    check_header_name(k)?;
                    v.validate(name)?;
                }
                Ok(())
            }
            HeaderValue::Array(a) => a.iter().try_for_each(|v| v.validate(name)),
            HeaderValue::Float(f) if !f.is_finite() => Err(Error::InvalidHeader {
                name: truncate(name),
                reason: "a float must be finite".into(),
            }),
            _ => Ok(()),
        }
    }
}

impl From<&str> for HeaderValue {
    fn from(s: &str) -> Self {
        HeaderValue::Text(s.to_string())
    }
}
impl From<String> for HeaderValue {
    fn from(s: String) -> Self {
        HeaderValue::Text(s)
    }
}
impl From<i64> for HeaderValue {
    fn from(i: i64) -> Self {
        HeaderValue::Int(i)
    }
}
impl From<i32> for HeaderValue {
    fn from(i: i32) -> Self {
        HeaderValue::Int(i64::from(i))
    }
}
impl From<u32> for HeaderValue {
    fn from(i: u32) -> Self {
        HeaderValue::Int(i64::from(i))
    }
}
impl From<bool> for HeaderValue {
    fn from(b: bool) -> Self {
        HeaderValue::Bool(b)
    }
}
impl From<f64> for HeaderValue {
    fn from(f: f64) -> Self {
        HeaderValue::Float(f)
    }
}
impl From<Vec<u8>> for HeaderValue {
    fn from(b: Vec<u8>) -> Self {
        HeaderValue::Bytes(b)
    }
}
