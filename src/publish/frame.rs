//! The size of a message's content header frame, checked against the connection's frame limit
//! before anything is sent.
//!
//! amiquip splits a body across as many frames as it needs, but writes the **content header
//! frame** (AMQP 0-9-1 §4.2.6.1: class id, weight, body size, property flags, the properties,
//! the header table among them) as one frame, whatever its size. RabbitMQ answers a frame over
//! the agreed `frame_max` by closing the whole connection (`FRAME_ERROR`, `frame_too_large`):
//! every channel on it, every consumer's unacknowledged deliveries. So the size is computed
//! here, exactly as amq-protocol (amiquip's encoder) writes it, and a message that cannot fit
//! is refused as [`Error::FrameTooLarge`], a fault of the message.
//!
//! The limit is AMQP's: the whole frame, its 8 bytes of framing included, at most `frame_max`.
//! RabbitMQ itself takes 8 bytes more (it does not count the framing against `frame_max`), so
//! the check is 8 bytes stricter than the broker, never looser
//! (`tests/frame_limit.rs::the_computed_header_frame_size_is_the_one_the_broker_measures`).

use crate::transport::{AmqpProperties, AmqpValue, FieldTable};

use crate::envelope::{HeaderValue, Message};
use crate::error::{Error, Result};

/// A frame's own bytes around its payload: type (1), channel (2), payload size (4), frame end
/// (1). RabbitMQ refuses a frame whose payload is over `frame_max` minus these.
const FRAME_OVERHEAD: usize = 8;

/// A content header's fixed part: class id (2), weight (2), body size (8), property flags (2;
/// the basic class has 14 properties, so one flags word).
const CONTENT_HEADER_FIXED: usize = 14;

/// The encoded size, in bytes, of the content header frame a publish with `properties` sends:
/// the whole frame, its 8 bytes of framing included, to compare with `frame_max`.
pub(crate) fn header_frame_size(properties: &AmqpProperties) -> usize {
    let p = properties;
    let short = |s: &Option<String>| s.as_ref().map_or(0, |s| 1 + s.len());
    let octet = |o: &Option<u8>| o.map_or(0, |_| 1);
    [
        FRAME_OVERHEAD,
        CONTENT_HEADER_FIXED,
        short(p.content_type()),
        short(p.content_encoding()),
        p.headers().as_ref().map_or(0, table_size),
        octet(p.delivery_mode()),
        octet(p.priority()),
        short(p.correlation_id()),
        short(p.reply_to()),
        short(p.expiration()),
        short(p.message_id()),
        p.timestamp().map_or(0, |_| 8),
        short(p.type_()),
        short(p.user_id()),
        short(p.app_id()),
        short(p.cluster_id()),
    ]
    .into_iter()
    .fold(0usize, usize::saturating_add)
}

/// A field table: its 4-byte length, then per entry the name as a short string and the value
/// with its type octet.
pub(crate) fn table_size(table: &FieldTable) -> usize {
    table.iter().fold(4usize, |n, (name, value)| {
        n.saturating_add(1 + name.len())
            .saturating_add(value_size(value))
    })
}

/// One value with its type octet.
fn value_size(value: &AmqpValue) -> usize {
    1usize.saturating_add(raw_size(value))
}

/// One value without its type octet.
fn raw_size(value: &AmqpValue) -> usize {
    match value {
        AmqpValue::Boolean(_) | AmqpValue::ShortShortInt(_) | AmqpValue::ShortShortUInt(_) => 1,
        AmqpValue::ShortInt(_) | AmqpValue::ShortUInt(_) => 2,
        AmqpValue::LongInt(_) | AmqpValue::LongUInt(_) | AmqpValue::Float(_) => 4,
        AmqpValue::LongLongInt(_) | AmqpValue::Double(_) | AmqpValue::Timestamp(_) => 8,
        AmqpValue::DecimalValue(_) => 5,
        AmqpValue::LongString(s) => 4usize.saturating_add(s.len()),
        AmqpValue::ByteArray(b) => 4usize.saturating_add(b.len()),
        AmqpValue::FieldArray(values) => values
            .iter()
            .fold(4usize, |n, v| n.saturating_add(value_size(v))),
        AmqpValue::FieldTable(t) => table_size(t),
        AmqpValue::Void => 0,
    }
}

/// Refuses a publish of `message` with `routing_key` (its properties written with `origin`)
/// whose header frame would not fit in a frame of `limit` bytes. The properties are built only
/// when [`header_frame_bound`] says the message might not fit: a publish of ordinary headers
/// pays for a sum over them, not for building its table twice.
pub(crate) fn check_message_fits(
    message: &Message,
    routing_key: &str,
    origin: &str,
    limit: usize,
) -> Result<()> {
    if header_frame_bound(message, routing_key, origin) <= limit {
        return Ok(());
    }
    check_fits(&message.to_properties(routing_key, Some(origin)), limit)
}

/// The most a publish's trace stamp ([`crate::trace::stamp`]) adds to a message that carries
/// no `traceparent`: that header (55 characters) and a `tracestate` of up to the W3C limit of
/// 512.
const TRACE_RESERVE: usize = (1 + 11 + 1 + 4 + 55) + (1 + 10 + 1 + 4 + 512);

/// [`check_message_fits`] for a copy held now and published later, from another thread (a
/// retry waiting in the consumer): with room for the trace context that publish may stamp.
pub(crate) fn check_held_copy_fits(
    copy: &Message,
    routing_key: &str,
    origin: &str,
    limit: usize,
) -> Result<()> {
    let reserve = if copy
        .headers
        .contains_key(crate::envelope::headers::TRACEPARENT)
    {
        0
    } else {
        TRACE_RESERVE
    };
    match check_message_fits(copy, routing_key, origin, limit.saturating_sub(reserve)) {
        Err(Error::FrameTooLarge {
            message_id, size, ..
        }) => Err(Error::FrameTooLarge {
            message_id,
            size: size.saturating_add(reserve),
            limit,
        }),
        fits => fits,
    }
}

/// The most bytes entry `name` of the envelope, whose value is text of `len` bytes or a
/// number, can take: name, type octet, and a long string's 4-byte length or an 8-byte number.
fn envelope_entry(name: &str, len: usize) -> usize {
    (1 + name.len() + 1 + 8).saturating_add(len)
}

/// An upper bound of [`header_frame_size`] for `message` published with `routing_key` through
/// a connection whose origin is `origin`, computed from the message without building its
/// properties: every envelope header at its largest (all of them present, texts as long
/// strings, numbers as 8 bytes), every header at the larger of its own encoding and the AMQP
/// value it arrived with (a copy re-sends that one), every property at its largest.
pub(crate) fn header_frame_bound(message: &Message, routing_key: &str, origin: &str) -> usize {
    use crate::envelope::headers as h;
    let e = &message.envelope;
    let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    let kind = text(&e.message_type).max(routing_key.len()).max(8);
    let envelope = [
        envelope_entry(h::ID, e.id.len()),
        envelope_entry(h::TYPE, kind),
        envelope_entry(h::VERSION, 0),
        envelope_entry(h::CORRELATION, text(&e.correlation_id).max(e.id.len())),
        envelope_entry(h::ATTEMPT, 0),
        envelope_entry(h::FIRST_SEEN, 0),
        envelope_entry(h::CAUSATION, text(&e.causation_id)),
        envelope_entry(h::ORIGIN, text(&e.origin).max(origin.len())),
        envelope_entry(h::ERROR, text(&e.error)),
        envelope_entry(h::CLAIM, text(&e.claim)),
    ];
    let received = message.received_headers.as_deref().or_else(|| {
        message
            .properties
            .as_ref()
            .and_then(|p| p.headers().as_ref())
    });
    let headers = message
        .headers
        .iter()
        .chain(&message.engine_headers)
        .map(|(name, value)| {
            let raw = received.and_then(|r| r.get(name)).map_or(0, value_size);
            (1 + name.len()).saturating_add(header_value_size(value).max(raw))
        });
    let short = |s: &Option<String>| s.as_ref().map_or(0, |s| 1 + s.len());
    let properties = [
        FRAME_OVERHEAD,
        CONTENT_HEADER_FIXED,
        4, // the header table's length
        1 + e.id.len(),
        1, // delivery mode
        1, // priority
        short(&message.content_type),
        short(&message.reply_to),
        short(&message.amqp_correlation_id),
        1 + 20, // expiration: a u64 in decimal
    ];
    envelope
        .into_iter()
        .chain(headers)
        .chain(properties)
        .fold(0usize, usize::saturating_add)
}

/// The largest encoding of a header value with its type octet (an integer as 8 bytes, whatever
/// width it goes as).
fn header_value_size(value: &HeaderValue) -> usize {
    let raw = match value {
        HeaderValue::Bool(_) => 1,
        HeaderValue::Int(_) | HeaderValue::Float(_) | HeaderValue::Timestamp(_) => 8,
        HeaderValue::Text(s) => 4usize.saturating_add(s.len()),
        HeaderValue::Bytes(b) => 4usize.saturating_add(b.len()),
        HeaderValue::Table(t) => t.iter().fold(4usize, |n, (k, v)| {
            n.saturating_add(1 + k.len())
                .saturating_add(header_value_size(v))
        }),
        HeaderValue::Array(a) => a
            .iter()
            .fold(4usize, |n, v| n.saturating_add(header_value_size(v))),
        HeaderValue::Void => 0,
    };
    1usize.saturating_add(raw)
}

/// Refuses a publish whose header frame would not fit in a frame of `limit` bytes.
pub(crate) fn check_fits(properties: &AmqpProperties, limit: usize) -> Result<()> {
    let size = header_frame_size(properties);
    if size <= limit {
        return Ok(());
    }
    Err(Error::FrameTooLarge {
        message_id: properties.message_id().clone().unwrap_or_default(),
        size,
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What amq-protocol, amiquip's encoder, writes for these properties (as the AMQP
    /// transport hands them over).
    fn encoded(properties: &AmqpProperties, body_len: u64) -> usize {
        let properties = &crate::transport::amqp_convert::properties_out(properties.clone());
        let mut buf = vec![0u8; 1 << 20];
        let (_, n) = amq_protocol::frame::generation::gen_content_header_frame(
            (&mut buf, 0),
            1,
            60,
            body_len,
            properties,
        )
        .expect("encodes");
        n
    }

    fn every_value() -> FieldTable {
        let mut inner = FieldTable::new();
        inner.insert("nested".into(), AmqpValue::LongString("deep".into()));
        let mut t = FieldTable::new();
        t.insert("b".into(), AmqpValue::Boolean(true));
        t.insert("i8".into(), AmqpValue::ShortShortInt(-1));
        t.insert("u8".into(), AmqpValue::ShortShortUInt(1));
        t.insert("i16".into(), AmqpValue::ShortInt(-2));
        t.insert("u16".into(), AmqpValue::ShortUInt(2));
        t.insert("i32".into(), AmqpValue::LongInt(-3));
        t.insert("u32".into(), AmqpValue::LongUInt(3));
        t.insert("i64".into(), AmqpValue::LongLongInt(-4));
        t.insert("f32".into(), AmqpValue::Float(1.5));
        t.insert("f64".into(), AmqpValue::Double(2.5));
        t.insert("ts".into(), AmqpValue::Timestamp(1_700_000_000));
        t.insert("text".into(), AmqpValue::LongString("héllo".into()));
        t.insert("bytes".into(), AmqpValue::ByteArray(vec![0, 1, 2, 255]));
        t.insert(
            "array".into(),
            AmqpValue::FieldArray(vec![
                AmqpValue::LongInt(1),
                AmqpValue::LongString("x".into()),
                AmqpValue::FieldTable(inner.clone()),
                AmqpValue::Void,
            ]),
        );
        t.insert("table".into(), AmqpValue::FieldTable(inner));
        t.insert("void".into(), AmqpValue::Void);
        t
    }

    #[test]
    fn the_header_frame_size_is_what_amiquips_encoder_writes() {
        let none = AmqpProperties::default();
        assert_eq!(header_frame_size(&none), encoded(&none, 0));
        assert_eq!(header_frame_size(&none), 22, "8 of framing, 14 fixed");

        let every = AmqpProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_headers(every_value())
            .with_delivery_mode(2)
            .with_priority(5)
            .with_correlation_id("corr".into())
            .with_reply_to("replies".into())
            .with_expiration("60000".into())
            .with_message_id("0d4c6f1e-9a7b-4c1e-8f00-2f5d3c1a9b77".into())
            .with_timestamp(1_700_000_000)
            .with_type("order.placed".into())
            .with_user_id("guest".into())
            .with_app_id("billing".into())
            .with_cluster_id("c1".into());
        assert_eq!(header_frame_size(&every), encoded(&every, 12_345));

        let mut big = FieldTable::new();
        big.insert("pad".into(), AmqpValue::LongString("x".repeat(200_000)));
        let big = AmqpProperties::default().with_headers(big);
        assert_eq!(header_frame_size(&big), encoded(&big, 1));
    }

    #[test]
    fn the_bound_is_never_below_the_size_and_close_to_it_for_big_headers() {
        use crate::envelope::Received;
        let received = Received {
            exchange: "ex".into(),
            routing_key: "orders.created".into(),
            redelivered: false,
            delivery_tag: 1,
        };
        let mut raw = every_value();
        raw.insert("x-acemq-id".into(), AmqpValue::LongString("id-1".into()));
        raw.insert("x-acemq-attempt".into(), AmqpValue::ShortShortInt(2));
        raw.insert(
            "x-acemq-route".into(),
            AmqpValue::ByteArray(b"[1]".to_vec()),
        );
        raw.insert(
            "dec".into(),
            AmqpValue::DecimalValue(crate::wire::Decimal {
                scale: 2,
                value: 12345,
            }),
        );
        let props = AmqpProperties::default()
            .with_headers(raw)
            .with_message_id("id-1".into())
            .with_content_type("text/plain".into())
            .with_timestamp(5)
            .with_app_id("someone".into());
        let foreign = Message::from_delivery(b"x".to_vec(), props, received);
        let mut copy = crate::consume::copy_of(&foreign);
        copy.envelope.error = Some("exhausted 3 attempts: nope".into());
        copy.envelope.attempt = 3;
        let mut ours = Message::new("body")
            .with_header("text", "x".repeat(1000))
            .with_header("n", 7)
            .with_header("f", 1.5)
            .with_header("b", true)
            .with_header("bytes", HeaderValue::Bytes(vec![1, 2, 3]))
            .with_content_type("application/json");
        ours.reply_to = Some("replies".into());
        ours.amqp_correlation_id = Some("c".into());
        ours.expiration_ms = Some(u64::MAX);
        ours.priority = Some(9);
        ours.envelope.causation_id = Some("cause".into());
        let big = Message::new("b").with_header("pad", "y".repeat(130_000));
        for (m, rk) in [
            (&foreign, "orders.created"),
            (&copy, "orders.created.retry"),
            (&ours, ""),
            (&ours, "a-long-routing-key-used-as-the-type"),
            (&big, "q"),
        ] {
            let exact = header_frame_size(&m.to_properties(rk, Some("svc@host")));
            let bound = header_frame_bound(m, rk, "svc@host");
            assert!(bound >= exact, "{bound} < {exact} for {m:?}");
            assert!(bound - exact < 1024, "{bound} is far above {exact}");
        }
    }

    #[test]
    fn a_header_frame_over_the_limit_is_refused_naming_size_and_limit() {
        let mut t = FieldTable::new();
        t.insert("pad".into(), AmqpValue::LongString("x".repeat(5000)));
        let p = AmqpProperties::default()
            .with_message_id("m-1".into())
            .with_headers(t);
        let size = header_frame_size(&p);
        assert!(check_fits(&p, size).is_ok(), "exactly the limit fits");
        let e = check_fits(&p, size - 1).unwrap_err();
        assert!(e.is_message_fault() && !e.is_retriable(), "{e:?}");
        let text = e.to_string();
        assert!(text.contains(&size.to_string()), "{text}");
        assert!(text.contains(&(size - 1).to_string()), "{text}");
        assert!(text.contains("\"m-1\""), "{text}");
    }
}
