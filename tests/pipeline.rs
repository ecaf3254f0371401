//! Pipelines (`then`) on the real broker: an unroutable next hop retries the step through the
//! connection's publisher, and its dead letter's headers as they are on the wire. The scenarios
//! that run the same on the `memory://` broker (correlation and causation carried, `NOTHING`,
//! the unroutable hop retried through a publisher made without the mandatory flag, and its dead
//! letter) are written once, in the on-both `equivalence_consume.rs`.

mod support;

use std::time::Duration;

use acemq_amqp::{dead_letter_queue, Message};
use support::unique;

const WAIT: Duration = Duration::from_secs(30);

/// The next hop goes through the connection's publisher.
#[test]
fn an_unroutable_next_hop_retries_the_step_and_the_original_is_not_acknowledged_first() {
    let (conn, _clean, input) = support::declared_consumed_queue("then-unroutable");
    let nowhere = unique("then-no-such-queue");
    let (stepping, attempts) =
        support::pipe::step_to(&conn, &input, nowhere, conn.publisher().unwrap());
    let m = Message::new("{}");
    let id = m.id().to_string();
    conn.publisher().unwrap().publish("", &input, m).unwrap();
    let dlq = dead_letter_queue(&input);
    support::wait_for_count(&conn, &dlq, 1, WAIT);
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
