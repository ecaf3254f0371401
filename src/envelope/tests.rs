//! Unit tests of the envelope, header values and their reading rules.

use std::collections::BTreeMap;

use crate::wire::{AmqpProperties, AmqpValue, FieldTable};

use super::message::looks_truncated;
use super::*;
use crate::error::Error;

#[test]
fn a_table_with_reserved_headers_but_no_id_looks_truncated() {
    let mut t = BTreeMap::new();
    assert!(
        !looks_truncated(&t),
        "a foreign message with no reserved headers"
    );
    t.insert(headers::ATTEMPT.to_string(), HeaderValue::Int(1));
    assert!(looks_truncated(&t));
    t.insert(headers::ID.to_string(), HeaderValue::from("i"));
    assert!(!looks_truncated(&t));
}

#[test]
fn ids_are_unique_and_uuid_shaped() {
    let a = new_id();
    let b = new_id();
    assert_ne!(a, b);
    assert_eq!(a.len(), 36);
    assert_eq!(&a[14..15], "4");
}

#[test]
fn the_reserved_prefix_is_refused_and_matched_case_sensitively() {
    let m = Message::new("x").with_header("x-acemq-id", "forged");
    let e = m.validate().unwrap_err();
    assert!(e.to_string().contains("reserved"), "{e}");
    // The family's prefix match is case-sensitive: another spelling is the application's.
    assert!(Message::new("x")
        .with_header("X-AceMQ-Tenant", "t")
        .validate()
        .is_ok());
}

#[test]
fn oversize_short_strings_are_refused() {
    let long = "k".repeat(256);
    assert!(Message::new("x")
        .with_header(long.clone(), 1)
        .validate()
        .is_err());
    assert!(Message::new("x").with_id(long.clone()).validate().is_err());
    // Envelope values other than the id are long strings: no short-string limit.
    assert!(Message::new("x").with_type(long).validate().is_ok());
    assert!(Message::new("x")
        .with_header("k".repeat(255), 1)
        .validate()
        .is_ok());
}

#[test]
fn non_utf8_text_is_refused() {
    let e = HeaderValue::try_text("note", vec![b'a', 0xff, b'b']).unwrap_err();
    assert!(matches!(e, Error::InvalidHeader { .. }), "{e}");
    assert_eq!(
        HeaderValue::try_text("note", b"ok".to_vec()).unwrap(),
        HeaderValue::Text("ok".into())
    );
}

/// Whatever another client puts in the headers (reserved names with the wrong types,
/// nested tables, huge or negative attempts), reading never panics, the attempt is at least
/// 1, and a copy either validates or is refused with an error.
#[test]
fn reading_arbitrary_headers_never_panics() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let names = [
        headers::ID,
        headers::ATTEMPT,
        headers::FIRST_SEEN,
        headers::CORRELATION,
        headers::VERSION,
        headers::ORIGIN,
        headers::ERROR,
        headers::CLAIM,
        "x-acemq-route",
        "x-death",
        "tenant",
        "",
    ];
    for _ in 0..2000 {
        let mut table = FieldTable::new();
        for _ in 0..(next() % 6) {
            let name = names[(next() % names.len() as u64) as usize].to_string();
            let value = match next() % 9 {
                0 => AmqpValue::LongString("x".repeat((next() % 300) as usize)),
                1 => AmqpValue::LongLongInt(next() as i64),
                2 => AmqpValue::LongInt(next() as i32),
                3 => AmqpValue::Boolean(next() % 2 == 0),
                4 => AmqpValue::Double(f64::from_bits(next())),
                5 => AmqpValue::ByteArray(vec![0xff; (next() % 4) as usize]),
                6 => AmqpValue::FieldArray(vec![AmqpValue::Void, AmqpValue::ShortShortInt(-1)]),
                7 => AmqpValue::FieldTable(FieldTable::new()),
                _ => AmqpValue::Timestamp(next()),
            };
            table.insert(name, value);
        }
        let props = AmqpProperties::default().with_headers(table);
        let m = Message::from_delivery(
            vec![1, 2, 3],
            props,
            Received {
                exchange: String::new(),
                routing_key: "q".into(),
                redelivered: false,
                delivery_tag: 1,
            },
        );
        assert!(m.envelope.attempt >= 1);
        let _ = m.validate();
        assert!(m.envelope.version >= 1);
        assert!(!m.envelope.id.is_empty());
        let _ = m.to_properties("q", None);
        let mut copy = m.clone();
        copy.drop_invalid_headers();
        assert!(
            copy.validate().is_ok(),
            "a sanitised copy can always be sent"
        );
    }
}

#[test]
fn envelope_round_trips_through_properties() {
    let m = Message::new("b")
        .with_type("order.placed")
        .with_causation_id("c-1")
        .with_header("tenant", "t-7")
        .with_header("n", 5);
    let props = m.to_properties("q", Some("svc@h"));
    let back = Message::from_delivery(
        m.body.clone(),
        props,
        Received {
            exchange: String::new(),
            routing_key: "q".into(),
            redelivered: false,
            delivery_tag: 1,
        },
    );
    assert_eq!(back.envelope.id, m.envelope.id);
    assert_eq!(back.envelope.correlation_id.as_deref(), Some(m.id()));
    assert_eq!(back.envelope.message_type.as_deref(), Some("order.placed"));
    assert_eq!(back.envelope.attempt, 1);
    assert_eq!(back.headers.get("tenant"), Some(&HeaderValue::from("t-7")));
    assert_eq!(back.headers.get("n"), Some(&HeaderValue::Int(5)));
    assert!(!back.headers.contains_key(headers::ID));
}

/// Found by the `envelope` fuzz target: a foreign counter beyond the family's 32-bit range
/// (here 2^32 − 1 as a 64-bit integer) was read as 4294967295 and re-sent as 2147483647, so a
/// copy carried another attempt and version than the one read. It is read as the largest value
/// the family writes, and a copy carries exactly that.
#[test]
fn a_counter_beyond_32_bits_reads_as_the_largest_a_copy_can_carry() {
    for value in [
        AmqpValue::LongLongInt(4_294_967_295),
        AmqpValue::LongUInt(4_294_967_295),
        AmqpValue::LongString("9999999999".into()),
    ] {
        let mut table = FieldTable::new();
        table.insert(headers::ID.into(), AmqpValue::LongString("i".into()));
        table.insert(headers::ATTEMPT.into(), value.clone());
        table.insert(headers::VERSION.into(), value.clone());
        let received = || Received {
            exchange: String::new(),
            routing_key: "q".into(),
            redelivered: false,
            delivery_tag: 1,
        };
        let m = Message::from_delivery(
            Vec::new(),
            AmqpProperties::default().with_headers(table),
            received(),
        );
        let max = i32::MAX as u32;
        assert_eq!(
            (m.envelope.attempt, m.envelope.version),
            (max, max),
            "{value:?}"
        );
        let copy = Message::from_delivery(Vec::new(), m.to_properties("q", None), received());
        assert_eq!(copy.envelope, m.envelope, "{value:?}");
    }
}
