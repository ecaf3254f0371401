//! Routing slips on the real broker, where RabbitMQ alone can show it: a literal JSON slip as
//! another library writes it (raw AMQP), the declared form refused for a slip it cannot say, an
//! unroutable next stop, and the forwarded message's type. The scenarios that hold on both
//! transports — a three-step route in each wire form, a malformed slip, the forwarded slip's done
//! steps, a route resumed after dead-letter and replay — are written once, in
//! `tests/equivalence_patterns.rs`, and run on RabbitMQ and on `memory://`.

mod support;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::routing_slip::{
    follow_slip, slip_from, FollowSlipOptions, RoutingSlip, SlipForm,
};
use acemq_amqp::{
    dead_letter_queue, headers, BoxError, ConsumerOptions, Message, QueueSpec, RetryPolicy,
};
use amiquip::{AmqpProperties, AmqpValue, FieldTable};
use support::raw::Raw;
use support::slip::{queues, step, Seen};
use support::{connect, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

/// The family's rule for the forwarded message's type (Go's `FollowSlip` and Python's
/// `follow_slip` publish the next hop with `x-acemq-type` = that hop's routing key): a step that
/// returns a message without a type sends it on typed with the next stop's routing key, not with
/// the type it received; a step that sets one keeps it.
#[test]
fn a_forwarded_message_is_typed_with_the_next_stops_routing_key_unless_the_step_set_one() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let names: Vec<String> = (0..3).map(|i| unique(&format!("slip-type-{i}"))).collect();
    queues(&conn, &mut clean, &names);
    let publisher = conn.publisher().unwrap();
    // Per step run: the step's name, the type it received.
    type Types = Vec<(String, Option<String>)>;
    let types: Arc<Mutex<Types>> = Arc::default();
    let consumers: Vec<_> = ["a", "b", "c"]
        .iter()
        .zip(&names)
        .map(|(name, q)| {
            let (types, name) = (types.clone(), name.to_string());
            let handler = follow_slip(
                &publisher,
                move |m: &Message| {
                    types
                        .lock()
                        .unwrap()
                        .push((name.clone(), m.envelope.message_type.clone()));
                    // Step b names what it sends on; step a does not.
                    let onward = Message::new(m.body.clone());
                    Ok::<_, BoxError>(Some(if name == "b" {
                        onward.with_type("order.charged")
                    } else {
                        onward
                    }))
                },
                FollowSlipOptions::new(),
            );
            conn.consumer(q, ConsumerOptions::new().retry(RetryPolicy::none()))
                .unwrap()
                .start(handler)
                .unwrap()
        })
        .collect();
    let slip = RoutingSlip::new()
        .then("", &names[0], "a")
        .then("", &names[1], "b")
        .then("", &names[2], "c");
    slip.send(&publisher, Message::new("order").with_type("order.placed"))
        .unwrap();
    assert!(eventually(WAIT, || types.lock().unwrap().len() == 3));
    for c in consumers {
        c.close().unwrap();
    }
    let types = types.lock().unwrap().clone();
    assert_eq!(
        types,
        [
            ("a".to_string(), Some("order.placed".to_string())),
            ("b".to_string(), Some(names[1].clone())),
            ("c".to_string(), Some("order.charged".to_string())),
        ]
    );
}

#[test]
fn the_declared_form_is_refused_for_a_slip_it_cannot_say() {
    let conn = connect();
    let publisher = conn.publisher().unwrap();
    let two_exchanges = RoutingSlip::new().then("a", "s", "s").then("b", "t", "t");
    let e = two_exchanges
        .with_form(SlipForm::StepNames)
        .and_then(|slip| slip.send(&publisher, Message::new("x")))
        .unwrap_err();
    assert!(
        matches!(e, acemq_amqp::Error::InvalidArgument { .. }),
        "{e}"
    );
}

#[test]
fn a_literal_json_slip_written_by_another_library_is_followed() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let names: Vec<String> = (0..2).map(|i| unique(&format!("slip-lit-{i}"))).collect();
    queues(&conn, &mut clean, &names);
    let publisher = conn.publisher().unwrap();
    let seen: Seen = Arc::default();
    let consumer = step(&conn, &publisher, &names[0], "first", &seen);
    // Exactly what Python's json.dumps writes (spaces after separators), with a done step.
    let literal = format!(
        r#"{{"steps": [{{"exchange": "", "routingKey": "{}", "name": "first"}}, {{"exchange": "", "routingKey": "{}", "name": "second"}}], "done": [{{"exchange": "", "routingKey": "intake", "name": "intake", "completedAt": "2026-01-02T03:04:05.123456+00:00"}}]}}"#,
        names[0], names[1]
    );
    let mut table = FieldTable::new();
    table.insert("x-acemq-id".into(), AmqpValue::LongString("py-1".into()));
    table.insert(headers::ROUTING_SLIP.into(), AmqpValue::LongString(literal));
    let raw = Raw::open();
    raw.publish(
        "",
        &names[0],
        b"{}",
        AmqpProperties::default()
            .with_message_id("py-1".into())
            .with_content_type("application/json".into())
            .with_headers(table),
    );
    assert!(eventually(WAIT, || {
        conn.queue_info(&names[1]).unwrap().message_count == 1
    }));
    consumer.close().unwrap();
    let next = conn.get(&names[1]).unwrap().unwrap();
    assert_eq!(next.envelope.causation_id.as_deref(), Some("py-1"));
    assert_eq!(next.envelope.correlation_id.as_deref(), Some("py-1"));
    let slip = slip_from(&next).unwrap().unwrap();
    assert_eq!(slip.form(), SlipForm::Json);
    let done: Vec<_> = slip.done().iter().map(|s| s.to_string()).collect();
    assert_eq!(done, ["intake", "first"]);
    assert!(slip.done()[1]
        .completed_at
        .as_deref()
        .unwrap()
        .ends_with('Z'));
    assert_eq!(slip.next().unwrap().routing_key, names[1]);
    // The header is the family's JSON shape, readable by any library.
    let json = next.headers[headers::ROUTING_SLIP]
        .as_str()
        .unwrap()
        .to_string();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["steps"][0]["routingKey"], names[1].as_str());
    assert_eq!(
        v["done"][0]["completedAt"],
        "2026-01-02T03:04:05.123456+00:00"
    );
}

#[test]
fn an_unroutable_next_stop_is_retried_until_it_exists() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let first = unique("slip-unroutable-1");
    let second = clean.queue(&unique("slip-unroutable-2"));
    queues(&conn, &mut clean, std::slice::from_ref(&first));
    let publisher = conn.publisher().unwrap();
    let policy = RetryPolicy::exponential()
        .max_attempts(50)
        .initial_delay(Duration::from_millis(50))
        .max_delay(Duration::from_millis(200));
    let (consumer, ran) = support::slip::counting_step(&conn, &publisher, &first, policy);
    let slip = RoutingSlip::new()
        .then("", &first, "one")
        .then("", &second, "two");
    slip.send(&publisher, Message::new("x")).unwrap();
    assert!(
        eventually(WAIT, || ran.load(Ordering::SeqCst) >= 2),
        "the step ran again after its hop was unroutable"
    );
    conn.declare_queue(&QueueSpec::new(&second).classic())
        .unwrap();
    support::wait_for_count(&conn, &second, 1, WAIT);
    consumer.close().unwrap();
    assert_eq!(conn.queue_info(&first).unwrap().message_count, 0);
    assert_eq!(
        conn.queue_info(&dead_letter_queue(&first))
            .unwrap()
            .message_count,
        0
    );
    let arrived = conn.get(&second).unwrap().unwrap();
    assert!(
        arrived.envelope.attempt == 1,
        "a fresh message at the next stop"
    );
}
