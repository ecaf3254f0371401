//! Reading an envelope from an arbitrary AMQP header table (as amiquip parses it off the
//! wire), then the copy a consumer would publish (retry, dead letter): the read never panics,
//! no reserved name reaches the application, the copy always validates, goes through the
//! wire unchanged, and reads back with the same envelope and headers.
#![no_main]

use acemq_amqp::fuzzing::{copy_properties, read_delivery};
use acemq_amqp::{Codec, JsonCodec};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Some(wire) = common::parse(data) else {
        return;
    };
    let m = read_delivery(wire.body.clone(), common::properties(&wire), "", &wire.routing_key);
    assert!(!m.envelope.id.is_empty(), "every message has an id");
    assert!(m.envelope.attempt >= 1 && m.envelope.version >= 1);
    assert!(
        m.headers.keys().all(|k| !k.starts_with("x-acemq-")),
        "a reserved name reached the application: {:?}",
        m.headers.keys().collect::<Vec<_>>()
    );
    let _ = JsonCodec.decode(&m.body);

    let props = copy_properties(&m, "retry").expect("a copy always validates");
    let table = props.headers().clone().expect("a copy carries headers");
    let back = common::through_the_wire(&table);
    assert_eq!(back, table, "the copy's table changes on the wire");

    let again = read_delivery(wire.body.clone(), props, "", "retry");
    let (a, b) = (&m.envelope, &again.envelope);
    if a.id.len() <= 255 {
        assert_eq!(a.id, b.id);
    } else {
        assert_eq!(b.id.len(), 64, "an over-long id becomes its SHA-256 hex");
    }
    assert_eq!(a.version, b.version);
    assert_eq!(a.attempt, b.attempt);
    assert_eq!(a.first_seen_ms, b.first_seen_ms);
    assert_eq!(a.causation_id, b.causation_id);
    assert_eq!(a.error, b.error);
    assert_eq!(a.claim, b.claim);
    if a.message_type.is_some() {
        assert_eq!(a.message_type, b.message_type);
    }
    if a.origin.is_some() {
        assert_eq!(a.origin, b.origin);
    }
    // What the first read kept and a copy can carry reads back the same (a header the copy
    // had to drop — a non-finite float, a name over 255 bytes — is absent, never altered).
    for (k, v) in &again.headers {
        if let Some(orig) = m.headers.get(k) {
            assert_eq!(format!("{orig:?}"), format!("{v:?}"), "header {k:?} changed");
        }
    }
});
