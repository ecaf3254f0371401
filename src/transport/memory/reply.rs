//! RabbitMQ's reply codes and texts, as RabbitMQ 3.10 and 4.0 word them alike (checked against
//! both by the contract tests), and the protocol errors amiquip builds from them.

use crate::transport::{AmqpError, AmqpValue};

/// A channel-level refusal: the reply code and text RabbitMQ closes the channel with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) code: u16,
    pub(super) text: String,
}

pub(super) type Refused<T> = Result<T, Refusal>;

/// A refusal; its text as RabbitMQ sends it (a short string: past 255 bytes, cut to 252 and
/// `...`).
pub(super) fn refusal(code: u16, mut text: String) -> Refusal {
    if text.len() > 255 {
        let mut end = 252;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    Refusal { code, text }
}

impl Refusal {
    /// The error a transport answers with for it.
    pub(super) fn error(&self) -> AmqpError {
        AmqpError::ServerClosedChannel {
            code: self.code,
            message: self.text.clone(),
        }
    }
}

pub(super) fn no_queue(queue: &str) -> Refusal {
    refusal(404, format!("NOT_FOUND - no queue '{queue}' in vhost '/'"))
}

pub(super) fn no_exchange(exchange: &str) -> Refusal {
    refusal(
        404,
        format!("NOT_FOUND - no exchange '{exchange}' in vhost '/'"),
    )
}

pub(super) fn locked(queue: &str) -> Refusal {
    refusal(
        405,
        format!(
            "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{queue}' in vhost \
             '/'. It could be originally declared on another connection or the exclusive \
             property value does not match that of the original declaration."
        ),
    )
}

pub(super) fn precondition(text: String) -> Refusal {
    refusal(406, format!("PRECONDITION_FAILED - {text}"))
}

pub(super) fn access_refused(text: String) -> Refusal {
    refusal(403, format!("ACCESS_REFUSED - {text}"))
}

/// A feature the memory broker does not emulate: 540, never accepted and ignored.
pub(super) fn not_emulated(what: &str) -> Refusal {
    refusal(
        540,
        format!(
            "NOT_IMPLEMENTED - {what} is not emulated by the memory broker (memory://); use a \
             real RabbitMQ"
        ),
    )
}

pub(super) fn default_exchange() -> Refusal {
    access_refused("operation not permitted on the default exchange".into())
}

/// `inequivalent arg` with both sides already worded (`'true'`, `the value '5' of type 'long'`,
/// `none`).
pub(super) fn inequivalent(arg: &str, what: &str, received: &str, current: &str) -> Refusal {
    precondition(format!(
        "inequivalent arg '{arg}' for {what} in vhost '/': received {received} but current is \
         {current}"
    ))
}

/// RabbitMQ's name for a field value's type.
pub(super) fn type_name(v: &AmqpValue) -> &'static str {
    match v {
        AmqpValue::Boolean(_) => "bool",
        AmqpValue::ShortShortInt(_) => "byte",
        AmqpValue::ShortShortUInt(_) => "unsignedbyte",
        AmqpValue::ShortInt(_) => "short",
        AmqpValue::ShortUInt(_) => "unsignedshort",
        AmqpValue::LongInt(_) => "signedint",
        AmqpValue::LongUInt(_) => "unsignedint",
        AmqpValue::LongLongInt(_) => "long",
        AmqpValue::Float(_) => "float",
        AmqpValue::Double(_) => "double",
        AmqpValue::DecimalValue(_) => "decimal",
        AmqpValue::LongString(_) => "longstr",
        AmqpValue::FieldArray(_) => "array",
        AmqpValue::Timestamp(_) => "timestamp",
        AmqpValue::FieldTable(_) => "table",
        AmqpValue::ByteArray(_) => "binary",
        AmqpValue::Void => "void",
    }
}

/// An integer field value, whichever width it came in.
pub(super) fn integer(v: &AmqpValue) -> Option<i128> {
    Some(match v {
        AmqpValue::ShortShortInt(i) => i128::from(*i),
        AmqpValue::ShortShortUInt(i) => i128::from(*i),
        AmqpValue::ShortInt(i) => i128::from(*i),
        AmqpValue::ShortUInt(i) => i128::from(*i),
        AmqpValue::LongInt(i) => i128::from(*i),
        AmqpValue::LongUInt(i) => i128::from(*i),
        AmqpValue::LongLongInt(i) => i128::from(*i),
        AmqpValue::Timestamp(i) => i128::from(*i),
        _ => return None,
    })
}

/// A value as RabbitMQ prints it in `inequivalent arg` (`the value '2000' of type 'signedint'`).
pub(super) fn value_text(v: Option<&AmqpValue>) -> String {
    let Some(v) = v else {
        return "none".into();
    };
    let shown = match v {
        AmqpValue::LongString(s) => s.clone(),
        AmqpValue::Boolean(b) => b.to_string(),
        AmqpValue::Float(f) => f.to_string(),
        AmqpValue::Double(f) => f.to_string(),
        v => match integer(v) {
            Some(i) => i.to_string(),
            None => format!("{v:?}"),
        },
    };
    format!("the value '{shown}' of type '{}'", type_name(v))
}

/// A value as RabbitMQ prints it when both sides of a comparison have one (`'2000'`).
pub(super) fn bare_value(v: &AmqpValue) -> String {
    let shown = match v {
        AmqpValue::LongString(s) => s.clone(),
        AmqpValue::Boolean(b) => b.to_string(),
        v => match integer(v) {
            Some(i) => i.to_string(),
            None => format!("{v:?}"),
        },
    };
    format!("'{shown}'")
}

/// Two argument values equal as RabbitMQ compares them: integers of any width by value.
pub(super) fn same_value(a: &AmqpValue, b: &AmqpValue) -> bool {
    match (integer(a), integer(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// What a call on a connection that has ended answers: the link is gone.
pub(super) fn closed() -> AmqpError {
    AmqpError::link_lost("the connection has ended")
}
