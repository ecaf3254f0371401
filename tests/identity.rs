//! Message identity across redeliveries: a message from outside the family with neither
//! `x-acemq-id` nor `message_id` must read with the same id every time the broker delivers it,
//! or an idempotent consumer applies it twice.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::idempotency::InMemoryIdempotencyStore;
use acemq_amqp::patterns::idempotent::{idempotent, IdempotentOptions};
use acemq_amqp::{ConsumerOptions, Message, Outcome, QueueSpec};
use amiquip::{AmqpProperties, AmqpValue, FieldTable};
use support::eventually;
use support::raw::Raw;

const WAIT: Duration = Duration::from_secs(20);

/// An id-less foreign message whose handler ran (effect applied, receipt confirmed) but whose
/// ack was lost with the connection is redelivered: it must read with the same id, so the
/// idempotent wrapper recognises the duplicate and the effect is applied once.
#[test]
fn an_id_less_foreign_message_redelivered_after_a_lost_ack_is_applied_once() {
    let (direct, _clean, q) = support::declared_consumed_queue("id-less");
    let raw = Raw::open();
    let mut headers = FieldTable::new();
    headers.insert("tenant".into(), AmqpValue::LongString("acme".into()));
    raw.publish(
        "",
        &q,
        b"{\"order\":\"o-1\"}",
        AmqpProperties::default()
            .with_headers(headers)
            .with_content_type("application/json".into())
            .with_delivery_mode(2),
    );
    raw.close();

    let (proxy, conn) = support::through_proxy(Duration::from_millis(300));
    let effects: Arc<Mutex<Vec<String>>> = Arc::default();
    let ids: Arc<Mutex<Vec<String>>> = Arc::default();
    let cut = Arc::new(AtomicBool::new(false));
    let (e, i, c) = (effects.clone(), ids.clone(), cut.clone());
    let handler = idempotent(
        InMemoryIdempotencyStore::new(Duration::from_secs(600)),
        move |m: &Message| {
            e.lock().unwrap().push(m.id().to_string());
            // The first run finishes only once its connection is gone: its ack is lost.
            let deadline = std::time::Instant::now() + WAIT;
            while !c.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    let i2 = i.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(move |m: &Message| {
            i2.lock().unwrap().push(m.id().to_string());
            acemq_amqp::Handler::handle(&handler, m)
        })
        .unwrap();
    assert!(eventually(WAIT, || effects.lock().unwrap().len() == 1));
    proxy.cut();
    cut.store(true, Ordering::SeqCst);
    assert!(
        eventually(WAIT, || conn.generation() == Some(2)),
        "reconnected"
    );
    assert!(
        eventually(WAIT, || ids.lock().unwrap().len() == 2),
        "redelivered after the lost ack"
    );
    assert!(eventually(WAIT, || direct
        .queue_info(&q)
        .unwrap()
        .message_count
        == 0
        && consumer.in_flight() == 0));
    consumer.close().unwrap();
    let ids = ids.lock().unwrap().clone();
    assert_eq!(ids[0], ids[1], "the same id on both deliveries");
    assert_eq!(
        effects.lock().unwrap().len(),
        1,
        "the duplicate was absorbed, the effect applied once"
    );
}

/// Two deliveries of one id-less message read with one id; two different id-less messages read
/// with different ids.
#[test]
fn id_less_messages_get_an_id_derived_from_what_the_broker_redelivers() {
    let (_conn, _clean, q) = support::declared_queue_with("derived-id", QueueSpec::classic);
    let raw = Raw::open();
    for body in [&b"a"[..], b"b"] {
        raw.publish("", &q, body, AmqpProperties::default());
    }
    // Read both, put them back (nack with requeue, as a crash would), read the first again.
    let get = || {
        raw.channel
            .basic_get(q.as_str(), false)
            .unwrap()
            .unwrap()
            .delivery
    };
    let (a, b) = (get(), get());
    let first = acemq_amqp::fuzzing::message_from_amiquip_delivery(&a);
    let second = acemq_amqp::fuzzing::message_from_amiquip_delivery(&b);
    a.nack(&raw.channel, true).unwrap();
    b.nack(&raw.channel, true).unwrap();
    let again = get();
    assert!(again.redelivered);
    let first_again = acemq_amqp::fuzzing::message_from_amiquip_delivery(&again);
    again.ack(&raw.channel).unwrap();
    assert_ne!(first.id(), second.id(), "different messages, different ids");
    assert_eq!(
        first.id(),
        first_again.id(),
        "the same message, the same id"
    );
    assert_eq!(first.envelope.correlation_id.as_deref(), Some(first.id()));
    raw.close();
}

/// With ids derived for id-less messages, a message always has an identity; what can still be
/// empty is the key a `.key(…)` function computes — refused clearly, to `.dlq`, never run.
#[test]
fn an_empty_idempotency_key_from_a_key_function_is_refused_clearly() {
    let (conn, _clean, q) = support::declared_consumed_queue("empty-key");
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let handler = idempotent(
        InMemoryIdempotencyStore::new(Duration::from_secs(60)),
        move |_: &Message| {
            r.store(true, Ordering::SeqCst);
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default().key(|m: &Message| {
            Ok(m.headers
                .get("order-id")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string())
        }),
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(handler)
        .unwrap();
    conn.publisher()
        .unwrap()
        .publish("", &q, Message::new("no order id"))
        .unwrap();
    let mut dead = None;
    assert!(eventually(WAIT, || {
        dead = conn.get(&acemq_amqp::dead_letter_queue(&q)).unwrap();
        dead.is_some()
    }));
    consumer.close().unwrap();
    assert!(!ran.load(Ordering::SeqCst), "the handler never ran");
    let error = dead.unwrap().envelope.error.unwrap();
    assert!(
        error.contains("the key function returned an empty idempotency key"),
        "{error}"
    );
}
