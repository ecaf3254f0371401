//! `Consumer::start` returns why its thread could not start (issue 37, item 16), never a bare
//! `Error::Closed`: the broker's refusal of `basic.consume`, or a panic on the consumer's thread
//! before it subscribed. On the real broker. (A queue that does not exist, the broker's 404, is
//! `consuming_a_missing_queue_fails_at_start` in tests/consume.rs.)

mod support;

use acemq_amqp::{ConsumerOptions, Error, Handler, HandlerResult, Message, OrderBy, Outcome};
use support::{connect, unique, Cleanup};

#[test]
fn starting_a_consumer_on_an_exclusive_queue_of_another_connection_returns_the_brokers_refusal() {
    let owner = connect();
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("start-locked"));
    owner
        .declare_queue(
            &acemq_amqp::QueueSpec::new(&q)
                .classic()
                .durable(false)
                .exclusive(true),
        )
        .unwrap();
    // `declare(false)`: nothing is declared before `start`, so the refusal comes on the
    // consumer's own thread, at `basic.consume`.
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().declare(false))
        .expect("nothing is checked on the broker before start");
    let e = consumer
        .start(|_: &Message| Ok(Outcome::Accept))
        .unwrap_err();
    assert!(!matches!(e, Error::Closed { .. }), "{e:?}");
    let text = format!("{e} {:?}", e);
    assert!(text.contains("RESOURCE_LOCKED"), "{text}");
    assert!(text.contains(&q), "{text}");
    assert!(conn.is_connected());
}

/// A hand-written handler whose `ordering` — asked first on the consumer's thread, before it
/// subscribes — panics.
struct OrderingPanics;

impl Handler for OrderingPanics {
    fn handle(&self, _: &Message) -> HandlerResult {
        Ok(Outcome::Accept)
    }

    fn ordering(&self) -> Option<&OrderBy> {
        panic!("the ordering is not ready");
    }
}

#[test]
fn a_panic_on_the_consumers_thread_before_it_subscribed_is_returned_by_start_not_closed() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("start-panics"), &[]);
    conn.declare_queue(&acemq_amqp::QueueSpec::new(&q).classic())
        .unwrap();
    let e = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(OrderingPanics)
        .unwrap_err();
    assert!(!matches!(e, Error::Closed { .. }), "{e:?}");
    assert!(e.to_string().contains("the ordering is not ready"), "{e}");
    assert!(e.to_string().contains("panicked"), "{e}");
    assert!(conn.is_connected());
}
