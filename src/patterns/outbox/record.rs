//! Outbox records as messages: a payload or a message encoded into a record ([`record`],
//! [`record_message`]), and a record read back into the message the relay publishes
//! (`take_message`, with `record_id` for a row without a usable id).

use serde::Serialize;

use super::store::{NewOutboxRecord, OutboxRecord};
use crate::codec::{encode_with, CodecSource};
use crate::envelope::{headers, HeaderValue, Message};
use crate::error::{Error, Result};

/// Encodes `payload` there and then into an outbox record: bytes, content type and the
/// envelope headers (a fresh `x-acemq-id` that stays the same however often the relay
/// publishes it, told by [`NewOutboxRecord::message_id`] so a business row can point at its
/// message). A record so made survives a deploy that changes the payload's type.
///
/// `codec` is a [`Codec`](crate::Codec), a [`Connection`](crate::Connection) (its default codec) or a
/// [`Publisher`](crate::Publisher).
///
/// # Errors
///
/// [`Error::Codec`] when the payload cannot be encoded; validation errors for the names.
pub fn record<T: Serialize + ?Sized>(
    codec: &impl CodecSource,
    exchange: &str,
    routing_key: &str,
    payload: &T,
) -> Result<NewOutboxRecord> {
    let message = codec.with_codec(|c| -> Result<Message> {
        let body = encode_with(c, payload)?;
        Ok(Message::new(body).with_content_type(c.content_type()))
    })?;
    record_message(exchange, routing_key, &message)
}

/// An outbox record of a message built by hand (its id, type, correlation and headers are
/// kept; [`NewOutboxRecord::message_id`] is the message's id).
///
/// # Errors
///
/// The message's validation errors; [`Error::InvalidHeader`] for a byte-array header, which
/// the outbox's JSON `headers` column cannot hold.
pub fn record_message(
    exchange: &str,
    routing_key: &str,
    message: &Message,
) -> Result<NewOutboxRecord> {
    crate::envelope::check_name("exchange", exchange, true)?;
    crate::envelope::check_name("routing key", routing_key, true)?;
    message.validate()?;
    // The envelope as the wire will carry it (type and correlation defaults applied); the
    // origin is stamped by the relay's connection when the message has none of its own.
    let mut map = serde_json::Map::new();
    let e = &message.envelope;
    let text = |s: &str| serde_json::Value::from(s);
    map.insert(headers::ID.into(), text(&e.id));
    let message_type = e
        .message_type
        .clone()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| {
            if routing_key.is_empty() {
                "message".into()
            } else {
                routing_key.into()
            }
        });
    map.insert(headers::TYPE.into(), text(&message_type));
    map.insert(headers::VERSION.into(), e.version.max(1).into());
    let correlation = e.correlation_id.as_deref().filter(|c| !c.is_empty());
    map.insert(
        headers::CORRELATION.into(),
        text(correlation.unwrap_or(&e.id)),
    );
    map.insert(headers::ATTEMPT.into(), e.attempt.max(1).into());
    map.insert(headers::FIRST_SEEN.into(), e.first_seen_ms.into());
    for (name, value) in [
        (headers::CAUSATION, &e.causation_id),
        (headers::ORIGIN, &e.origin),
        (headers::ERROR, &e.error),
        (headers::CLAIM, &e.claim),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            map.insert(name.into(), text(v));
        }
    }
    for (k, v) in message.headers.iter().chain(&message.engine_headers) {
        map.insert(k.clone(), to_json(k, v)?);
    }
    // The trace of what caused it (the handler's message), for the relay to publish later.
    if !message.headers.contains_key(headers::TRACEPARENT) {
        if let Some(current) = crate::trace::TraceContext::current() {
            map.insert(headers::TRACEPARENT.into(), text(current.traceparent()));
            if let Some(ts) = current.tracestate() {
                map.insert(headers::TRACESTATE.into(), text(ts));
            }
        }
    }
    Ok(NewOutboxRecord {
        exchange: exchange.to_string(),
        routing_key: routing_key.to_string(),
        body: message.body.clone(),
        content_type: message.content_type.clone().unwrap_or_default(),
        headers: map,
    })
}

fn to_json(name: &str, v: &HeaderValue) -> Result<serde_json::Value> {
    use serde_json::Value as J;
    Ok(match v {
        HeaderValue::Text(s) => J::String(s.clone()),
        HeaderValue::Int(i) => J::from(*i),
        HeaderValue::Bool(b) => J::Bool(*b),
        HeaderValue::Float(f) => J::from(*f),
        HeaderValue::Void => J::Null,
        HeaderValue::Timestamp(t) => J::from(*t),
        HeaderValue::Array(a) => {
            J::Array(a.iter().map(|x| to_json(name, x)).collect::<Result<_>>()?)
        }
        HeaderValue::Table(t) => J::Object(
            t.iter()
                .map(|(k, x)| Ok((k.clone(), to_json(name, x)?)))
                .collect::<Result<_>>()?,
        ),
        HeaderValue::Bytes(_) => {
            return Err(Error::InvalidHeader {
                name: name.to_string(),
                reason: "a byte-array header cannot be stored in the outbox (JSON); \
                         encode it as text"
                    .into(),
            })
        }
    })
}

fn from_json(v: serde_json::Value) -> HeaderValue {
    use serde_json::Value as J;
    match v {
        J::Null => HeaderValue::Void,
        J::Bool(b) => HeaderValue::Bool(b),
        J::Number(n) => match n.as_i64() {
            Some(i) => HeaderValue::Int(i),
            None => HeaderValue::Float(n.as_f64().unwrap_or(0.0)),
        },
        J::String(s) => HeaderValue::Text(s),
        J::Array(a) => HeaderValue::Array(a.into_iter().map(from_json).collect()),
        J::Object(o) => HeaderValue::Table(o.into_iter().map(|(k, x)| (k, from_json(x))).collect()),
    }
}

/// The message a record stands for, read with the same forgiving rules as a delivery. The
/// record's body and headers are moved into it (left empty: the relay needs only the rest of
/// the record once its message is made).
///
/// A record without a usable `x-acemq-id` (another program wrote the row: headers `{}`, an
/// empty column, an id that is not a string) is published with [`record_id`], derived from the
/// row, the same on every publish of it — so that a row published again (after its lease,
/// by another relay) is recognised downstream as the same message.
pub(crate) fn take_message(r: &mut OutboxRecord) -> Message {
    let headers = std::mem::take(&mut r.headers);
    let first_seen_given = headers.contains_key(headers::FIRST_SEEN);
    let all = headers
        .into_iter()
        .map(|(k, v)| (k, from_json(v)))
        .collect();
    // The body is moved in after the envelope is read: the derived id reads it.
    let mut m = Message::from_headers(Vec::new(), all, None, &r.routing_key, &|| record_id(r));
    m.body = std::mem::take(&mut r.body);
    if let Some(why) = m.replaced_id {
        log::warn!(
            "acemq: outbox record {} has an {} it cannot carry as it came ({why}); it is \
             published as message {}",
            r.id,
            headers::ID,
            m.envelope.id
        );
    }
    if !first_seen_given {
        m.envelope.first_seen_ms = r.created_ms;
    }
    if !r.content_type.is_empty() {
        m.content_type = Some(r.content_type.clone());
    }
    m
}

/// The id of an outbox record without a usable `x-acemq-id`: derived from what identifies the
/// row and never changes while it waits — its id, when it was added, exchange, routing key,
/// content type and body — in the UUID form (version 8) the family's readers expect. Two rows
/// alike in all of these (two tables of one database each holding a row of the same id, added
/// in the same millisecond, with the same message) are, by this rule, one message.
fn record_id(r: &OutboxRecord) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(b"acemq-outbox-record");
    field(&r.id.to_be_bytes());
    field(&r.created_ms.to_be_bytes());
    field(r.exchange.as_bytes());
    field(r.routing_key.as_bytes());
    field(r.content_type.as_bytes());
    field(&r.body);
    crate::envelope::uuid_v8(&h.finalize())
}
