//! The confirmed publisher against the real broker.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use acemq_amqp::{
    Binding, Error, ExchangeKind, ExchangeSpec, HeaderValue, Message, PublisherOptions, QueueSpec,
};
use support::{connect, unique, Cleanup};

#[test]
fn publish_confirmed_and_read_back_with_the_envelope_intact() {
    let (conn, _clean, q) = support::declared_queue("roundtrip");
    let publisher = conn.publisher().unwrap();

    let sent = Message::encode(conn.codec().as_ref(), &serde_json::json!({"order": 42}))
        .unwrap()
        .with_type("order.placed")
        .with_correlation_id("corr-1")
        .with_causation_id("cause-1")
        .with_header("tenant", "t-7")
        .with_header("weight", 12)
        .with_header("raw", vec![0u8, 0xff, 1])
        .with_reply_to("replies");
    let id = sent.id().to_string();
    let first_seen = sent.envelope.first_seen_ms;
    publisher.publish("", &q, sent).unwrap();

    let got = conn.get(&q).unwrap().expect("the message is in the queue");
    assert_eq!(got.envelope.id, id);
    assert_eq!(
        got.properties.as_ref().unwrap().message_id().as_deref(),
        Some(id.as_str()),
        "the id is also the AMQP message_id"
    );
    assert_eq!(got.envelope.message_type.as_deref(), Some("order.placed"));
    assert_eq!(got.envelope.correlation_id.as_deref(), Some("corr-1"));
    assert_eq!(got.envelope.causation_id.as_deref(), Some("cause-1"));
    assert_eq!(got.envelope.attempt, 1);
    assert_eq!(got.envelope.first_seen_ms, first_seen);
    assert_eq!(got.headers.get("tenant"), Some(&HeaderValue::from("t-7")));
    assert_eq!(got.headers.get("weight"), Some(&HeaderValue::Int(12)));
    assert_eq!(
        got.headers.get("raw"),
        Some(&HeaderValue::Bytes(vec![0, 0xff, 1]))
    );
    assert_eq!(got.reply_to.as_deref(), Some("replies"));
    assert_eq!(got.content_type.as_deref(), Some("application/json"));
    assert!(got.persistent);
    let body: serde_json::Value = got.decode(conn.codec().as_ref()).unwrap();
    assert_eq!(body, serde_json::json!({"order": 42}));
    assert!(conn.get(&q).unwrap().is_none(), "exactly one message");
    publisher.close().unwrap();
}

#[test]
fn unroutable_mandatory_publish_is_refused() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let x = clean.exchange(&unique("unbound-x"));
    conn.declare_exchange(&ExchangeSpec::new(&x, ExchangeKind::Direct))
        .unwrap();
    let publisher = conn.publisher().unwrap();

    let e = publisher
        .publish(&x, "nobody.listens", Message::new("lost?"))
        .unwrap_err();
    assert!(e.is_unroutable(), "{e}");
    assert!(!e.is_retriable());
    assert!(e.to_string().contains("nobody.listens"), "{e}");

    // The default exchange with a queue that does not exist, several at once, each answered.
    let tickets: Vec<_> = (0..20)
        .map(|i| {
            publisher
                .publish_deferred("", &unique("no-such-queue"), Message::new(format!("{i}")))
                .unwrap()
        })
        .collect();
    for t in tickets {
        assert!(t.wait().unwrap_err().is_unroutable());
    }

    // A routable one after them still goes through on the same publisher.
    let q = clean.queue(&unique("routable"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    publisher.publish("", &q, Message::new("ok")).unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 1);
}

#[test]
fn publishing_to_a_missing_exchange_is_not_found_and_the_publisher_goes_on() {
    let (conn, _clean, q) = support::declared_queue("after-404");
    let publisher = conn.publisher().unwrap();
    let missing = unique("missing-x");
    let e = publisher
        .publish(&missing, "k", Message::new("x"))
        .unwrap_err();
    assert!(
        matches!(&e, Error::NotFound { kind: "exchange", name, .. } if *name == missing),
        "{e:?}"
    );
    publisher.publish("", &q, Message::new("next")).unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 1);
}

#[test]
fn eight_threads_publish_ten_thousand_and_all_arrive() {
    let (conn, _clean, q) = support::declared_queue("tenk");
    let publisher = conn
        .publisher_with(PublisherOptions::new().window(256))
        .unwrap();

    let ids: Vec<Vec<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let publisher = publisher.clone();
                let q = q.clone();
                s.spawn(move || {
                    let mut ids = Vec::new();
                    for chunk in 0..25 {
                        let tickets: Vec<_> = (0..50)
                            .map(|i| {
                                let m = Message::new(format!("{t}-{chunk}-{i}"));
                                ids.push(m.id().to_string());
                                publisher.publish_deferred("", &q, m).unwrap()
                            })
                            .collect();
                        for ticket in tickets {
                            ticket.wait().expect("every publish is confirmed");
                        }
                    }
                    ids
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: HashSet<String> = ids.into_iter().flatten().collect();
    assert_eq!(all.len(), 10_000, "ids are unique");
    assert_eq!(publisher.in_flight(), 0);
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 10_000);
}

#[test]
fn refused_headers_are_refused_before_anything_is_sent() {
    let (conn, _clean, q) = support::declared_queue("refused");
    let publisher = conn.publisher().unwrap();

    let reserved = publisher
        .publish("", &q, Message::new("x").with_header("x-acemq-attempt", 99))
        .unwrap_err();
    assert!(
        matches!(&reserved, Error::InvalidHeader { name, reason } if name == "x-acemq-attempt" && reason.contains("reserved")),
        "{reserved:?}"
    );

    let long_name = "h".repeat(256);
    let e = publisher
        .publish("", &q, Message::new("x").with_header(long_name, "v"))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidHeader { .. }), "{e:?}");
    assert!(e.to_string().contains("256 bytes"), "{e}");

    let e = publisher
        .publish("", &"k".repeat(256), Message::new("x"))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidName {
                kind: "routing key",
                ..
            }
        ),
        "{e:?}"
    );

    let e = publisher
        .publish("", &q, Message::new("x").with_id("i".repeat(256)))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidHeader { .. }), "{e:?}");

    let bad = HeaderValue::try_text("note", vec![0x66, 0x6f, 0xff]).unwrap_err();
    assert!(matches!(bad, Error::InvalidHeader { .. }), "{bad:?}");

    // Nothing reached the queue, and the publisher is still usable.
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    publisher
        .publish("", &q, Message::new("x").with_header("note", "fine"))
        .unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 1);
}

#[test]
fn window_bounds_in_flight_publishes() {
    let (conn, _clean, q) = support::declared_queue("window");
    let publisher = conn
        .publisher_with(PublisherOptions::new().window(4))
        .unwrap();
    let mut max_seen = 0;
    let mut tickets = Vec::new();
    for i in 0..200 {
        tickets.push(
            publisher
                .publish_deferred("", &q, Message::new(format!("{i}")))
                .unwrap(),
        );
        max_seen = max_seen.max(publisher.in_flight());
    }
    for t in tickets {
        t.wait().unwrap();
    }
    assert!(max_seen <= 4, "in flight reached {max_seen}");
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 200);
}

#[test]
fn publishing_on_a_closed_connection_fails_at_once() {
    // The connection is closed under the publisher: the publish fails, it does not wait.
    let conn = connect();
    let publisher = conn
        .publisher_with(PublisherOptions::new().timeout(Duration::from_millis(500)))
        .unwrap();
    conn.close().unwrap();
    let e = publisher
        .publish("", "anything", Message::new("x"))
        .unwrap_err();
    assert!(matches!(e, Error::Closed { .. }), "{e:?}");
}

/// The same message (one id) published to two routing keys, the second unroutable: each caller
/// hears about its own publish — the first is confirmed, the second is refused as unroutable —
/// not the first told "unroutable" and the second "ok" for a message the broker dropped.
#[test]
fn one_message_to_two_routing_keys_the_second_unroutable_answers_each_caller_truly() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let x = clean.exchange(&unique("two-keys-x"));
    let q = clean.queue(&unique("two-keys-q"));
    conn.declare_exchange(&ExchangeSpec::new(&x, ExchangeKind::Direct))
        .unwrap();
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    conn.bind(&Binding::new().queue(&q).exchange(&x).routing_key("routed"))
        .unwrap();
    let publisher = conn.publisher().unwrap();
    for _ in 0..20 {
        let m = Message::new("same message, two keys");
        let routed = publisher.publish_deferred(&x, "routed", m.clone()).unwrap();
        let dropped = publisher.publish_deferred(&x, "nobody", m).unwrap();
        assert!(routed.wait().is_ok(), "the routed publish is confirmed");
        let e = dropped.wait().unwrap_err();
        assert!(e.is_unroutable(), "the unroutable one is refused: {e}");
    }
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 20);
}

/// The broker stops reading (a stalled socket; the same happens under a broker memory alarm):
/// every publish still answers within its timeout — none blocks inside amiquip — and the
/// publisher's bookkeeping (`Debug`, close) stays responsive.
#[test]
fn publishes_answer_within_their_timeout_when_the_broker_stops_reading() {
    let (_direct, _clean, q) = support::declared_queue("stalled-publish");
    let (proxy, conn) = support::through_proxy_with(
        acemq_amqp::ConnectionOptions::new().heartbeat(Duration::from_secs(60)),
    );
    let timeout = Duration::from_secs(2);
    let publisher = conn
        .publisher_with(PublisherOptions::new().timeout(timeout))
        .unwrap();
    publisher.publish("", &q, Message::new("warm-up")).unwrap();
    proxy.freeze();
    let body = vec![b'x'; 1 << 20];
    let (tx, rx) = std::sync::mpsc::channel();
    let p = publisher.clone();
    let q2 = q.clone();
    std::thread::spawn(move || {
        // 40 MiB: more than amiquip buffers before it stops taking frames (16 MiB).
        for _ in 0..40 {
            let started = std::time::Instant::now();
            let result = p.publish_deferred("", &q2, Message::new(body.clone()));
            let _ = tx.send((started.elapsed(), result.is_ok()));
        }
    });
    for i in 0..40 {
        let (took, _) = rx
            .recv_timeout(timeout + Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("publish {i} did not answer: blocked inside amiquip"));
        assert!(
            took < timeout + Duration::from_secs(5),
            "publish {i} took {took:?}"
        );
    }
    let _ = format!("{publisher:?}");
    assert!(
        publisher.in_flight() > 0,
        "answered within the timeout, still unconfirmed"
    );
    // Let the frozen connection go, so that closing it does not wait for heartbeats.
    proxy.cut();
}
