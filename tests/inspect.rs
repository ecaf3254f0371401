//! Looking without touching: `patterns::peek` and `Connection::compare_queue` /
//! `compare_exchange`, on the real broker.

mod support;

use std::time::Duration;

use acemq_amqp::patterns::peek::{peek, peek_unordered, PEEK_MAX};
use acemq_amqp::{Error, ExchangeKind, ExchangeSpec, Message, QueueSpec};
use support::Cleanup;

#[test]
fn peek_returns_the_head_unchanged_and_in_order_and_the_queue_keeps_it() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = cleanup.queue(&support::unique("peek"));
    connection
        .declare_queue(&QueueSpec::new(&q).classic())
        .unwrap();
    assert!(peek(&connection, &q, 5).unwrap().is_empty(), "empty queue");
    let ids = support::publish_n(&connection, &q, 20, true);

    // Peek a few times, more than the queue holds too.
    for limit in [1, 7, 20, 50] {
        let seen = peek(&connection, &q, limit).unwrap();
        let seen_ids: Vec<&str> = seen.iter().map(|m| m.envelope.id.as_str()).collect();
        let want: Vec<&str> = ids.iter().take(limit).map(String::as_str).collect();
        assert_eq!(seen_ids, want, "limit {limit}");
        assert_eq!(connection.queue_info(&q).unwrap().message_count, 20);
    }

    // Consuming now reads every message, in the original order, with its body.
    for (i, id) in ids.iter().enumerate() {
        let m = connection.get(&q).unwrap().expect("still there");
        assert_eq!(&m.envelope.id, id);
        assert_eq!(m.body, i.to_string().as_bytes());
        assert_eq!(m.envelope.attempt, 1);
    }
    assert!(connection.get(&q).unwrap().is_none());
}

#[test]
fn peek_refuses_bad_limits_and_reports_a_missing_queue() {
    let connection = support::connect();
    assert!(matches!(
        peek(&connection, "whatever", 0),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        peek(&connection, "whatever", PEEK_MAX + 1),
        Err(Error::InvalidArgument { .. })
    ));
    let missing = support::unique("peek.missing");
    assert!(matches!(
        peek(&connection, &missing, 3),
        Err(Error::NotFound { .. })
    ));
    // The connection is still usable after the 404.
    let mut cleanup = Cleanup::new(&connection);
    let q = cleanup.queue(&support::unique("peek.after"));
    connection
        .declare_queue(&QueueSpec::new(&q).classic())
        .unwrap();
    connection
        .publisher()
        .unwrap()
        .publish("", &q, Message::new("x"))
        .unwrap();
    assert_eq!(peek(&connection, &q, 3).unwrap().len(), 1);
}

#[test]
fn peek_refuses_a_quorum_queue_whose_order_it_cannot_keep_unless_asked() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = cleanup.queue(&support::unique("peek.quorum"));
    connection
        .declare_queue(&QueueSpec::new(&q).quorum())
        .unwrap();
    let ids = support::publish_n(&connection, &q, 3, true);
    match peek(&connection, &q, 2) {
        Err(Error::InvalidArgument { reason }) => {
            assert!(reason.contains("quorum"), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Refused before anything was read: the head is still the first message.
    let seen = peek_unordered(&connection, &q, 1).unwrap();
    assert_eq!(seen[0].envelope.id, ids[0]);
    // What the refusal is about. RabbitMQ 3.x: the message read went back behind the others.
    // RabbitMQ 4.x returns it to the head (one more read shows it first again).
    if support::broker_major() >= 4 {
        let again = peek_unordered(&connection, &q, 1).unwrap();
        assert_eq!(again[0].envelope.id, ids[0], "4.x: back at the head");
    } else {
        assert!(support::eventually(Duration::from_secs(5), || {
            peek_unordered(&connection, &q, 1).unwrap()[0].envelope.id == ids[1]
        }));
    }
    // (A quorum queue counts a returned message as ready again a moment after the nack.)
    assert!(support::eventually(Duration::from_secs(5), || {
        connection.queue_info(&q).unwrap().message_count == 3
    }));
}

#[test]
fn compare_queue_lists_each_difference_and_changes_nothing() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let q = cleanup.queue(&support::unique("compare"));
    let wanted = QueueSpec::new(&q)
        .classic()
        .message_ttl(Duration::from_secs(60))
        .dead_letter_exchange("acemq.dlx")
        .max_length(100);
    // Missing: reported, not created.
    let found = connection.compare_queue(&wanted).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].what, "existence");
    assert!(matches!(
        connection.queue_info(&q),
        Err(Error::NotFound { .. })
    ));

    // Three differences: the TTL, a missing max length, an extra dead-letter routing key.
    connection
        .declare_queue(
            &QueueSpec::new(&q)
                .classic()
                .message_ttl(Duration::from_secs(5))
                .dead_letter_exchange("acemq.dlx")
                .dead_letter_routing_key("elsewhere"),
        )
        .unwrap();
    let found = connection.compare_queue(&wanted).unwrap();
    let mut seen: Vec<(String, String, String)> = found
        .iter()
        .map(|d| (d.what.clone(), d.expected.clone(), d.actual.clone()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "x-dead-letter-routing-key".into(),
                "none".into(),
                "elsewhere".into()
            ),
            ("x-max-length".into(), "100".into(), "none".into()),
            ("x-message-ttl".into(), "60000".into(), "5000".into()),
        ]
    );
    assert!(found[0].to_string().contains(&q));
    // Asking again gives the same answer: nothing was changed.
    assert_eq!(connection.compare_queue(&wanted).unwrap(), found);

    // Equivalent: no difference.
    let same = QueueSpec::new(&q)
        .classic()
        .message_ttl(Duration::from_secs(5))
        .dead_letter_exchange("acemq.dlx")
        .dead_letter_routing_key("elsewhere");
    assert!(connection.compare_queue(&same).unwrap().is_empty());
    // A durable flag differs too.
    let transient = same.clone().durable(false);
    let found = connection.compare_queue(&transient).unwrap();
    assert_eq!(
        (found[0].what.as_str(), found[0].actual.as_str()),
        ("durable", "true")
    );
}

#[test]
fn compare_exchange_reports_its_type() {
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let x = cleanup.exchange(&support::unique("compare.x"));
    let direct = ExchangeSpec::direct(&x);
    assert_eq!(
        connection.compare_exchange(&direct).unwrap()[0].what,
        "existence"
    );
    assert!(matches!(
        connection.check_exchange(&x),
        Err(Error::NotFound { .. })
    ));
    connection
        .declare_exchange(&ExchangeSpec::new(&x, ExchangeKind::Fanout))
        .unwrap();
    let found = connection.compare_exchange(&direct).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (
            found[0].what.as_str(),
            found[0].expected.as_str(),
            found[0].actual.as_str()
        ),
        ("type", "direct", "fanout")
    );
    assert!(connection
        .compare_exchange(&ExchangeSpec::new(&x, ExchangeKind::Fanout))
        .unwrap()
        .is_empty());
}
