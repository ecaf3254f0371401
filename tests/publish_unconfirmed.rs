//! Publishing without confirms (`PublisherOptions::confirms(false)`, at most once), on both
//! transports where the publish path is the same; the byte budget through a frozen socket on
//! RabbitMQ. (Under a real memory alarm: `tests/memory_alarm.rs`.)

#[macro_use]
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::{Observer, PublishEvent, PublishOutcome};
use acemq_amqp::patterns::routing_slip::RoutingSlip;
use acemq_amqp::{
    ConnectionOptions, Error, ExchangeKind, ExchangeSpec, Message, PublisherOptions, QueueSpec,
};
use support::eventually;

const WAIT: Duration = Duration::from_secs(10);

/// Every publish outcome the observer hears, with its routing key.
#[derive(Clone, Default)]
struct Outcomes(Arc<Mutex<Vec<(PublishOutcome, String)>>>);

impl Outcomes {
    fn count(&self, outcome: PublishOutcome) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| *o == outcome)
            .count()
    }
}

impl Observer for Outcomes {
    fn publish_answered(&self, e: &PublishEvent<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((e.outcome, e.routing_key.to_string()));
    }
}

fn unconfirmed() -> PublisherOptions {
    PublisherOptions::new().confirms(false)
}

on_both! {
    /// Messages published without confirms arrive; each ticket is answered at the hand-over
    /// (`Ok`: handed over, not confirmed), each publish reported `unconfirmed`; `close` returns
    /// once the broker has read them all.
    fn unconfirmed_publishes_arrive_and_are_answered_when_handed_over(on) {
        let outcomes = Outcomes::default();
        let conn = on.connect_with(ConnectionOptions::new().observer(outcomes.clone()));
        let mut clean = on.cleanup();
        let q = clean.queue(&support::unique("unconfirmed"));
        conn.declare_queue(&QueueSpec::new(&q)).unwrap();
        let publisher = conn.publisher_with(unconfirmed().window(64)).unwrap();
        assert!(!publisher.confirms());
        for i in 0..300 {
            if i % 2 == 0 {
                publisher.publish("", &q, Message::new(format!("{i}"))).unwrap();
            } else {
                let ticket = publisher
                    .publish_deferred("", &q, Message::new(format!("{i}")))
                    .unwrap();
                assert!(
                    matches!(ticket.try_wait(), Some(Ok(()))),
                    "answered when handed over"
                );
            }
            assert!(publisher.in_flight() <= 64, "the window bounds what is outstanding");
        }
        publisher.close().unwrap();
        assert_eq!(publisher.in_flight(), 0, "close waited for the broker to read them");
        assert!(eventually(WAIT, || conn.queue_info(&q).unwrap().message_count == 300));
        assert_eq!(outcomes.count(PublishOutcome::Unconfirmed), 300);
        assert_eq!(outcomes.count(PublishOutcome::Confirmed), 0);
        assert_eq!(publisher.unroutable(), 0);
        let first = conn.get(&q).unwrap().expect("the first message");
        assert_eq!(first.body, b"0");
        let e = publisher.publish("", &q, Message::new("late")).unwrap_err();
        assert!(matches!(e, Error::Closed { .. }), "{e:?}");
    }

    /// A mandatory message no queue takes comes back with no caller left to tell: counted on
    /// the publisher and reported `unroutable` to the observer (beside its `unconfirmed`).
    fn unroutable_unconfirmed_publishes_are_counted_and_reported(on) {
        let outcomes = Outcomes::default();
        let conn = on.connect_with(ConnectionOptions::new().observer(outcomes.clone()));
        let mut clean = on.cleanup();
        let x = clean.exchange(&support::unique("unconfirmed-x"));
        conn.declare_exchange(&ExchangeSpec::new(&x, ExchangeKind::Direct)).unwrap();
        let q = clean.queue(&support::unique("unconfirmed-routed"));
        conn.declare_queue(&QueueSpec::new(&q)).unwrap();
        let publisher = conn.publisher_with(unconfirmed()).unwrap();
        for i in 0..5 {
            publisher.publish(&x, "nobody.listens", Message::new(format!("{i}"))).unwrap();
            publisher.publish("", &q, Message::new(format!("{i}"))).unwrap();
        }
        let missing = support::unique("no-such-queue");
        publisher.publish("", &missing, Message::new("lost")).unwrap();
        assert!(
            eventually(WAIT, || publisher.unroutable() == 6),
            "counted {}",
            publisher.unroutable()
        );
        let returned: Vec<String> = outcomes
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| *o == PublishOutcome::Unroutable)
            .map(|(_, k)| k.clone())
            .collect();
        assert_eq!(returned.len(), 6, "{returned:?}");
        assert_eq!(returned.iter().filter(|k| *k == "nobody.listens").count(), 5);
        assert!(returned.contains(&missing));
        assert_eq!(outcomes.count(PublishOutcome::Unconfirmed), 11);
        publisher.close().unwrap();
        // (The broker read them all; its queue may count them a moment later.)
        assert!(
            eventually(WAIT, || conn.queue_info(&q).unwrap().message_count == 5),
            "the routed ones arrived"
        );

        // Not mandatory: dropped by the broker, and nothing comes back to count.
        let fire_and_forget = conn.publisher_with(unconfirmed().mandatory(false)).unwrap();
        fire_and_forget.publish(&x, "nobody.listens", Message::new("gone")).unwrap();
        fire_and_forget.close().unwrap();
        assert_eq!(fire_and_forget.unroutable(), 0);
    }

    /// Nothing is refused silently: a bad message, a header frame over the limit, a missing
    /// exchange, a closed publisher and a closed connection are errors as with confirms.
    fn unconfirmed_publishing_still_refuses_what_cannot_be_sent(on) {
        let conn = on.connect();
        let mut clean = on.cleanup();
        let q = clean.queue(&support::unique("unconfirmed-refused"));
        conn.declare_queue(&QueueSpec::new(&q)).unwrap();
        let publisher = conn.publisher_with(unconfirmed()).unwrap();

        let e = publisher
            .publish("", &q, Message::new("x").with_header("x-acemq-attempt", 99))
            .unwrap_err();
        assert!(matches!(e, Error::InvalidHeader { .. }), "{e:?}");
        let e = publisher
            .publish("", &q, Message::new("x").with_header("big", "h".repeat(200_000)))
            .unwrap_err();
        assert!(matches!(e, Error::FrameTooLarge { .. }), "{e:?}");

        // The broker closes the channel over a missing exchange after the publish was handed
        // over: a later publish to it finds out, and the publisher goes on on a new channel.
        let missing = support::unique("missing-x");
        let mut not_found = None;
        let reported = acemq_amqp::testing::wait_until(WAIT, || {
            not_found = publisher.publish(&missing, "k", Message::new("x")).err();
            not_found.is_some()
        });
        assert!(reported.is_ok(), "the missing exchange was never reported");
        let not_found = not_found.unwrap();
        assert!(
            matches!(&not_found, Error::NotFound { kind: "exchange", name, .. } if *name == missing),
            "{not_found:?}"
        );
        publisher.publish("", &q, Message::new("after")).unwrap();
        publisher.close().unwrap();
        assert!(eventually(WAIT, || conn.queue_info(&q).unwrap().message_count == 1));
        let e = publisher.publish("", &q, Message::new("x")).unwrap_err();
        assert!(matches!(e, Error::Closed { what: "publisher" }), "{e:?}");

        let other = conn.publisher_with(unconfirmed()).unwrap();
        conn.close().unwrap();
        let e = other.publish("", &q, Message::new("x")).unwrap_err();
        assert!(matches!(e, Error::Closed { .. }), "{e:?}");
    }

    /// What must be confirmed refuses a publisher without confirms before sending anything:
    /// `publish_all` (a report of confirms) and a routing slip's hop.
    fn batches_and_pattern_hops_refuse_a_publisher_without_confirms(on) {
        let (conn, _clean, q) = on.declared_queue("unconfirmed-hops");
        let publisher = conn.publisher_with(unconfirmed()).unwrap();
        let e = publisher
            .publish_all([("", q.as_str(), Message::new("x"))])
            .unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { reason } if reason.contains("confirms(false)")), "{e:?}");
        let e = RoutingSlip::new()
            .then("", &q, "only")
            .send(&publisher, Message::new("x"))
            .unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { reason } if reason.contains("next hop")), "{e:?}");
        publisher.close().unwrap();
        assert_eq!(conn.queue_info(&q).unwrap().message_count, 0, "nothing was sent");
    }
}

/// While the broker holds publishes (a memory alarm on `memory://`; RabbitMQ stops reading the
/// socket), what an unconfirmed publisher handed over keeps its bytes in the connection's
/// budget: a confirmed publisher of the same connection finds no room (were the bytes given
/// back at the hand-over, it would hand its message over), and the unconfirmed publisher's
/// next one fails with `Blocked` within its timeout. Once the alarm ends the bytes come back.
#[test]
fn under_an_alarm_the_byte_budget_bounds_unconfirmed_publishing_on_memory() {
    let on = support::both::On::memory("unconfirmed-budget-alarm");
    let broker = on.memory_broker().unwrap();
    let conn = on.connect_with(ConnectionOptions::new().max_unconfirmed_bytes(1 << 20));
    let mut clean = on.cleanup();
    let q = clean.queue(&support::unique("unconfirmed-budget"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let timeout = Duration::from_millis(300);
    let publisher = conn.publisher_with(unconfirmed().timeout(timeout)).unwrap();
    let confirmed = conn
        .publisher_with(PublisherOptions::new().timeout(timeout))
        .unwrap();
    publisher.publish("", &q, Message::new("before")).unwrap();
    broker.block("low on memory");
    assert!(eventually(WAIT, || conn.is_blocked()));

    // One message as large as the whole budget: it goes alone, and holds it.
    publisher
        .publish("", &q, Message::new(vec![b'x'; 1 << 20]))
        .unwrap();
    assert!(eventually(WAIT, || publisher.in_flight() == 1));
    let started = Instant::now();
    let e = confirmed
        .publish_deferred("", &q, Message::new("small"))
        .unwrap_err();
    assert!(matches!(e, Error::Blocked { .. }), "{e:?}");
    let e = publisher
        .publish("", &q, Message::new("another"))
        .unwrap_err();
    assert!(matches!(e, Error::Blocked { .. }), "{e:?}");
    assert!(started.elapsed() < 2 * timeout + Duration::from_secs(2));
    assert_eq!(
        broker.queue_depth(&q),
        Some(1),
        "only `before` reached the queue"
    );

    broker.unblock();
    assert!(eventually(WAIT, || publisher.in_flight() == 0));
    confirmed.publish("", &q, Message::new("after")).unwrap();
    publisher.close().unwrap();
    assert_eq!(broker.queue_depth(&q), Some(3));
}

/// The same bound on RabbitMQ, through a socket that stops being read (a fault proxy frozen:
/// what a broker under a memory alarm does): a confirmed publisher of the same connection
/// finds no room while the unconfirmed message is outstanding, and both answer within their
/// timeout (`Timeout`: the broker did not say it blocks); once the socket is read again the
/// bytes come back.
#[test]
fn the_byte_budget_bounds_unconfirmed_publishing_when_the_broker_stops_reading() {
    let (_direct, _clean, q) = support::declared_queue("unconfirmed-budget-stall");
    let (proxy, conn) = support::through_proxy_with(
        ConnectionOptions::new()
            .heartbeat(Duration::from_secs(60))
            .max_unconfirmed_bytes(1 << 20),
    );
    let timeout = Duration::from_millis(500);
    let publisher = conn.publisher_with(unconfirmed().timeout(timeout)).unwrap();
    let confirmed = conn
        .publisher_with(PublisherOptions::new().timeout(timeout))
        .unwrap();
    publisher.publish("", &q, Message::new("before")).unwrap();
    confirmed
        .publish("", &q, Message::new("confirmed before"))
        .unwrap();
    assert!(eventually(WAIT, || publisher.in_flight() == 0));
    proxy.freeze();

    publisher
        .publish("", &q, Message::new(vec![b'x'; 1 << 20]))
        .unwrap();
    let started = Instant::now();
    let e = confirmed
        .publish_deferred("", &q, Message::new("small"))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    let e = publisher
        .publish("", &q, Message::new("another"))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(started.elapsed() < 2 * timeout + Duration::from_secs(3));
    assert_eq!(publisher.in_flight(), 1, "held until the broker reads it");

    proxy.resume();
    assert!(eventually(WAIT, || publisher.in_flight() == 0));
    confirmed.publish("", &q, Message::new("after")).unwrap();
    publisher.close().unwrap();
    support::wait_for_count(&conn, &q, 4, WAIT);
}
