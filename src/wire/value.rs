//! [`AmqpValue`]: one AMQP 0-9-1 field value, as RabbitMQ reads and writes them.

use std::collections::BTreeMap;

/// A header table: field names to values, in name order.
pub type FieldTable = BTreeMap<String, AmqpValue>;

/// A decimal: `value` × 10^-`scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decimal {
    /// How many digits follow the point.
    pub scale: u8,
    /// The digits.
    pub value: u32,
}

/// One field value, in the type it has on the wire (RabbitMQ's table of field types: short
/// strings only name fields, so text is always a long string).
#[derive(Clone, Debug, PartialEq)]
pub enum AmqpValue {
    /// `t`
    Boolean(bool),
    /// `b`
    ShortShortInt(i8),
    /// `B`
    ShortShortUInt(u8),
    /// `s`
    ShortInt(i16),
    /// `u`
    ShortUInt(u16),
    /// `I`
    LongInt(i32),
    /// `i`
    LongUInt(u32),
    /// `l`
    LongLongInt(i64),
    /// `f`
    Float(f32),
    /// `d`
    Double(f64),
    /// `D`
    DecimalValue(Decimal),
    /// `S`: text (amiquip reads only UTF-8 into it).
    LongString(String),
    /// `A`
    FieldArray(Vec<AmqpValue>),
    /// `T`: seconds since the epoch.
    Timestamp(u64),
    /// `F`
    FieldTable(FieldTable),
    /// `x`: bytes (RabbitMQ's).
    ByteArray(Vec<u8>),
    /// `V`
    Void,
}
