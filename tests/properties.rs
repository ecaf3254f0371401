//! Property tests (proptest): for any valid envelope and application headers, what is written
//! on the wire reads back as the same envelope and headers; for any header table, a read never
//! lets a reserved name through and a copy always validates.
//! A message's partition is stable and in range for any key and count.

use std::collections::BTreeMap;

use acemq_amqp::fuzzing::{copy_properties, read_delivery};
use acemq_amqp::patterns::ordering::{partition, partitioned_routing_key};
use acemq_amqp::{Envelope, HeaderValue, Message};
use proptest::prelude::*;

/// Non-empty text; short enough for an AMQP short string when `short`.
fn text(short: bool) -> impl Strategy<Value = String> {
    let max = if short { 60 } else { 300 };
    proptest::string::string_regex(&format!(".{{1,{max}}}"))
        .unwrap()
        .prop_filter("a short string is at most 255 bytes", move |s| {
            !s.is_empty() && (!short || s.len() <= 255)
        })
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (
        text(true),
        proptest::option::of(text(false)),
        1u32..=i32::MAX as u32,
        proptest::option::of(text(false)),
        proptest::option::of(text(false)),
        1u32..=i32::MAX as u32,
        any::<i64>(),
        (
            proptest::option::of(text(false)),
            proptest::option::of(text(false)),
            proptest::option::of(text(false)),
        ),
    )
        .prop_map(
            |(id, ty, version, corr, cause, attempt, first_seen_ms, (origin, error, claim))| {
                Envelope {
                    id,
                    message_type: ty,
                    version,
                    correlation_id: corr,
                    causation_id: cause,
                    attempt,
                    first_seen_ms,
                    origin,
                    error,
                    claim,
                }
            },
        )
}

fn leaf() -> impl Strategy<Value = HeaderValue> {
    prop_oneof![
        ".{0,40}".prop_map(HeaderValue::Text),
        any::<i64>().prop_map(HeaderValue::Int),
        any::<bool>().prop_map(HeaderValue::Bool),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(HeaderValue::Float),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(HeaderValue::Bytes),
        any::<u64>().prop_map(HeaderValue::Timestamp),
        Just(HeaderValue::Void),
    ]
}

fn value() -> impl Strategy<Value = HeaderValue> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(HeaderValue::Array),
            proptest::collection::btree_map("[a-z][a-z0-9._-]{0,20}", inner, 0..4)
                .prop_map(HeaderValue::Table),
        ]
    })
}

fn app_headers() -> impl Strategy<Value = BTreeMap<String, HeaderValue>> {
    proptest::collection::btree_map(
        "[a-zA-Z][a-zA-Z0-9._-]{0,30}".prop_filter("not reserved", |k| {
            !k.to_ascii_lowercase().starts_with("x-acemq-") && !k.starts_with("acemq-")
        }),
        value(),
        0..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Envelope → AMQP headers → envelope: the same, field for field, and every application
    /// header back with its value.
    #[test]
    fn envelope_and_headers_round_trip(
        envelope in envelope(),
        headers in app_headers(),
        routing_key in "[a-z.]{0,30}",
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut m = Message::new(body.clone());
        m.envelope = envelope.clone();
        m.headers = headers.clone();
        prop_assert!(m.validate().is_ok(), "generated a message that does not validate");
        let props = m.to_properties_for_bench(&routing_key, "prop@host");
        let back = read_delivery(body.clone(), props, "", &routing_key);
        let e = &back.envelope;
        prop_assert_eq!(&e.id, &envelope.id);
        prop_assert_eq!(e.version, envelope.version);
        prop_assert_eq!(e.attempt, envelope.attempt);
        prop_assert_eq!(e.first_seen_ms, envelope.first_seen_ms);
        prop_assert_eq!(&e.causation_id, &envelope.causation_id);
        prop_assert_eq!(&e.error, &envelope.error);
        prop_assert_eq!(&e.claim, &envelope.claim);
        // Defaults on write: type from the routing key, correlation from the id, origin from
        // the connection.
        let ty = envelope.message_type.clone().or_else(|| {
            Some(if routing_key.is_empty() { "message".into() } else { routing_key.clone() })
        });
        prop_assert_eq!(&e.message_type, &ty);
        let corr = envelope.correlation_id.clone().unwrap_or_else(|| envelope.id.clone());
        prop_assert_eq!(e.correlation_id.as_deref(), Some(corr.as_str()));
        let origin = envelope.origin.clone().unwrap_or_else(|| "prop@host".into());
        prop_assert_eq!(e.origin.as_deref(), Some(origin.as_str()));
        prop_assert_eq!(&back.headers, &headers);
        prop_assert_eq!(&back.body, &body);
    }

    /// A received message re-sent as a copy (retry, dead letter) carries the same envelope and
    /// headers again.
    #[test]
    fn a_copy_carries_the_envelope_and_headers_unchanged(
        envelope in envelope(),
        headers in app_headers(),
    ) {
        let mut m = Message::new(b"x".to_vec());
        m.envelope = envelope;
        m.headers = headers;
        let first = read_delivery(b"x".to_vec(), m.to_properties_for_bench("q", "o@h"), "", "q");
        let copy = copy_properties(&first, "q.retry").expect("a copy validates");
        let second = read_delivery(b"x".to_vec(), copy, "", "q.retry");
        prop_assert_eq!(&second.envelope, &first.envelope);
        prop_assert_eq!(&second.headers, &first.headers);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// FNV-1a 32-bit modulo the count: the same key always lands on the same partition, always
    /// below the count (0 for a count of 0 or 1), and the routing key says so.
    #[test]
    fn a_partition_is_stable_and_in_range(key in ".{0,80}", count in 0u32..10_000) {
        let p = partition(&key, count);
        prop_assert_eq!(p, partition(&key, count));
        if count <= 1 {
            prop_assert_eq!(p, 0);
        } else {
            prop_assert!(p < count);
        }
        prop_assert_eq!(partitioned_routing_key("orders", &key, count), format!("orders.{p}"));
    }
}
