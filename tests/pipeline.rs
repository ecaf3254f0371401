//! Pipelines (`then`) on the real broker: an unroutable next hop retries the step, through the
//! connection's publisher or one made without the mandatory flag, and its dead letter's headers
//! as they are on the wire. The scenarios that run the same on the `memory://` broker
//! (correlation and causation carried, `NOTHING`, the unroutable hop's dead letter) are written
//! once, in the on-both `equivalence_consume.rs`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::pipeline::{then, Next};
use acemq_amqp::{dead_letter_queue, ConsumerOptions, Message, QueueSpec, RetryPolicy};
use serde_json::json;
use support::{connect, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn an_unroutable_next_hop_retries_the_step_and_the_original_is_not_acknowledged_first() {
    let conn = connect();
    unroutable_next_hop(&conn, conn.publisher().unwrap());
}

/// The step's publisher was made without the mandatory flag: the next hop is published
/// mandatory all the same, so an unroutable one is retried, never accepted and lost.
#[test]
fn an_unroutable_next_hop_is_retried_even_through_a_publisher_that_is_not_mandatory() {
    let conn = connect();
    let publisher = conn
        .publisher_with(acemq_amqp::PublisherOptions::new().mandatory(false))
        .unwrap();
    unroutable_next_hop(&conn, publisher);
}

fn unroutable_next_hop(conn: &acemq_amqp::Connection, publisher: acemq_amqp::Publisher) {
    let mut clean = Cleanup::new(conn);
    let input = clean.consumed_queue(&unique("then-unroutable"), &[]);
    conn.declare_queue(&QueueSpec::new(&input)).unwrap();
    let nowhere = unique("then-no-such-queue");
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let a = attempts.clone();
    let step = then(publisher, "", nowhere, move |m: &Message| {
        a.lock().unwrap().push(m.envelope.attempt);
        Ok(Next::Publish(json!({"next": true})))
    });
    let stepping = conn
        .consumer(
            &input,
            ConsumerOptions::new()
                .retry(RetryPolicy::fixed(3, Duration::from_millis(100)).jitter(0.0)),
        )
        .unwrap()
        .start(step)
        .unwrap();
    let m = Message::new("{}");
    let id = m.id().to_string();
    conn.publisher().unwrap().publish("", &input, m).unwrap();
    let dlq = dead_letter_queue(&input);
    assert!(eventually(WAIT, || conn
        .queue_info(&dlq)
        .unwrap()
        .message_count
        == 1));
    stepping.close().unwrap();
    assert_eq!(
        *attempts.lock().unwrap(),
        vec![1, 2, 3],
        "the step ran again for each failed publish, the original kept until its copy was out"
    );
    assert_eq!(conn.queue_info(&input).unwrap().message_count, 0);
    let raw = support::raw::Raw::open();
    let (props, _, _) = raw.get(&dlq).expect("the dead letter");
    raw.close();
    let headers = props.headers().clone().unwrap_or_default();
    let text = |name: &str| match headers.get(name) {
        Some(amiquip::AmqpValue::LongString(s)) => s.clone(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(text("x-acemq-id"), id);
    let error = text("x-acemq-error");
    assert!(
        error.starts_with("exhausted 3 attempts: acemq: the work for message")
            && error.contains("did not go out"),
        "{error}"
    );
}
