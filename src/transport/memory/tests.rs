//! Seam-level tests of the memory broker alone: what RabbitMQ does not show deterministically
//! (dispatch, prefetch), what it has and this broker refuses (540), and the faults on demand.
//! Everything RabbitMQ shows deterministically is a case of `transport/conformance/`, run on
//! RabbitMQ and this broker alike.

use std::time::Duration;

use crate::transport::conformance::{args, declare, send};
use crate::transport::{
    AmqpError, AmqpProperties, AmqpValue, Blocked, Channel, Confirm, ConsumerMessage,
    ConsumerOptions, ExchangeDeclareOptions, ExchangeType, FieldTable, QueueDeclareOptions,
    QueueDeleteOptions, Transport,
};

const WAIT: Duration = Duration::from_secs(5);

fn unique(case: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test.mem.{case}.{}.{nanos}", std::process::id())
}

fn open(name: &str) -> (Box<dyn Transport>, crate::transport::Feed<Blocked>) {
    super::connect(name, Some("test")).expect("connect")
}

fn code(e: AmqpError) -> (u16, String) {
    match e {
        AmqpError::ServerClosedChannel { code, message, .. } => (code, message),
        e => panic!("not a channel refusal: {e:?}"),
    }
}

fn body(m: ConsumerMessage) -> String {
    match m {
        ConsumerMessage::Delivery(d) => String::from_utf8(d.body).unwrap(),
        other => panic!("not a delivery: {other:?}"),
    }
}

fn text(s: &str) -> AmqpValue {
    AmqpValue::LongString(s.into())
}

#[test]
fn unemulated_features_are_refused_with_540_naming_them() {
    let name = unique("refused");
    let (mut t, _) = open(&name);
    let queue_args = [
        ("x-queue-type", text("stream")),
        ("x-dead-letter-strategy", text("at-least-once")),
        ("x-max-length-bytes", AmqpValue::LongInt(10)),
        ("x-max-priority", AmqpValue::LongInt(10)),
        ("x-expires", AmqpValue::LongInt(1000)),
        ("x-single-active-consumer", AmqpValue::Boolean(true)),
        ("x-overflow", text("reject-publish-dlx")),
        ("x-queue-mode", text("lazy")),
    ];
    for (k, v) in queue_args {
        let ch = t.open_channel().unwrap();
        let o = QueueDeclareOptions {
            arguments: args(&[(k, v)]),
            ..Default::default()
        };
        let (c, m) = code(ch.queue_declare("q", o).unwrap_err());
        assert_eq!(c, 540, "{k}: {m}");
        assert!(m.contains(k) && m.contains("use a real RabbitMQ"), "{m}");
    }
    let ch = t.open_channel().unwrap();
    let o = ExchangeDeclareOptions {
        arguments: args(&[("alternate-exchange", text("ae"))]),
        ..Default::default()
    };
    let (c, m) = code(
        ch.exchange_declare(ExchangeType::Direct, "x", o)
            .unwrap_err(),
    );
    assert_eq!((c, m.contains("alternate-exchange")), (540, true), "{m}");
    let ch = t.open_channel().unwrap();
    declare(&ch, "q", FieldTable::new());
    for k in ["x-stream-offset", "x-priority"] {
        let ch = t.open_channel().unwrap();
        let o = ConsumerOptions {
            arguments: args(&[(k, AmqpValue::LongInt(1))]),
            ..Default::default()
        };
        let (c, m) = code(ch.basic_consume("q", o).map(drop).unwrap_err());
        assert_eq!((c, m.contains(k)), (540, true), "{m}");
    }
    let ch = t.open_channel().unwrap();
    let custom = ExchangeType::Custom("x-delayed-message".into());
    let (c, _) = code(
        ch.exchange_declare(custom, "d", Default::default())
            .unwrap_err(),
    );
    assert_eq!(c, 540);
    let ch = t.open_channel().unwrap();
    // `prefetch_size` is a connection error on RabbitMQ (540, its text).
    assert!(matches!(
        ch.qos(10, 1, false),
        Err(AmqpError::ServerClosedConnection { code: 540, .. })
    ));
}

#[test]
fn round_robin_within_each_consumers_prefetch() {
    let name = unique("prefetch");
    let (mut t, _) = open(&name);
    let ch = t.open_channel().unwrap();
    declare(&ch, "q", FieldTable::new());
    ch.qos(0, 2, false).unwrap();
    let a = ch.basic_consume("q", ConsumerOptions::default()).unwrap();
    ch.qos(0, 1, false).unwrap();
    let b = ch.basic_consume("q", ConsumerOptions::default()).unwrap();
    for i in 0..6 {
        send(&ch, "", "q", &format!("m{i}"), AmqpProperties::default());
    }
    let broker = super::broker(&name);
    assert_eq!(broker.queue_depth("q"), Some(3));
    assert_eq!(broker.unacked("q"), Some(3));
    assert_eq!((a.receiver().len(), b.receiver().len()), (2, 1));
    assert_eq!(
        body(
            a.receiver()
                .recv_timeout(std::time::Duration::from_secs(10))
                .unwrap()
        ),
        "m0"
    );
    assert_eq!(
        body(
            b.receiver()
                .recv_timeout(std::time::Duration::from_secs(10))
                .unwrap()
        ),
        "m1"
    );
    let ConsumerMessage::Delivery(d) = a
        .receiver()
        .recv_timeout(std::time::Duration::from_secs(10))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(
        (
            d.delivery_tag(),
            String::from_utf8_lossy(&d.body).to_string()
        ),
        (3, "m2".into())
    );
    // Tag 3 multiple covers tags 1-3 (b's tag 2 too): a takes two more, b one.
    d.ack_multiple(&ch).unwrap();
    assert_eq!(broker.unacked("q"), Some(3));
    assert_eq!((a.receiver().len(), b.receiver().len()), (2, 1));
    // Cancelling stops deliveries; its unacked stay unacked.
    a.cancel().unwrap();
    let mut tail = Vec::new();
    while let Ok(m) = a.receiver().try_recv() {
        tail.push(format!("{m:?}").split('(').next().unwrap().to_string());
    }
    assert_eq!(tail, ["Delivery", "Delivery", "ClientCancelled"]);
    assert_eq!(broker.unacked("q"), Some(3));
    assert_eq!(broker.consumer_count("q"), Some(1));
    drop(b);
    drop(a);
    assert_eq!(broker.consumer_count("q"), Some(0));
    ch.close().unwrap();
    assert_eq!(
        (broker.unacked("q"), broker.queue_depth("q")),
        (Some(0), Some(3))
    );
}

#[test]
fn a_dead_letter_cycle_without_rejection_is_dropped() {
    let name = unique("cycle");
    let (mut t, _) = open(&name);
    let ch = t.open_channel().unwrap();
    // q expires to itself: the copy would cycle (expired, no rejected in between) → dropped.
    declare(
        &ch,
        "q",
        args(&[
            ("x-message-ttl", AmqpValue::LongInt(30_000)),
            ("x-dead-letter-exchange", text("")),
        ]),
    );
    send(&ch, "", "q", "m", AmqpProperties::default());
    let broker = super::broker(&name);
    broker.advance_clock(Duration::from_secs(31));
    assert_eq!(broker.queue_depth("q"), Some(0));
    // Rejected to itself: not a cycle (a rejection is in it), the copy comes back.
    send(&ch, "", "q", "n", AmqpProperties::default());
    let g = ch.basic_get("q", false).unwrap().unwrap();
    g.delivery.nack(&ch, false).unwrap();
    assert_eq!(broker.queue_depth("q"), Some(1));
}

#[test]
fn the_clock_thread_expires_heads_and_advance_clock_skips_time() {
    let name = unique("clock");
    let (mut t, _) = open(&name);
    let ch = t.open_channel().unwrap();
    declare(
        &ch,
        "rung",
        args(&[
            ("x-message-ttl", AmqpValue::LongInt(30_000)),
            ("x-dead-letter-exchange", text("")),
            ("x-dead-letter-routing-key", text("work")),
        ]),
    );
    declare(&ch, "work", FieldTable::new());
    let consumer = ch
        .basic_consume(
            "work",
            ConsumerOptions {
                no_ack: true,
                ..Default::default()
            },
        )
        .unwrap();
    send(&ch, "", "rung", "retry", AmqpProperties::default());
    assert!(consumer.receiver().try_recv().is_err());
    super::broker(&name).advance_clock(Duration::from_secs(30));
    assert_eq!(
        body(consumer.receiver().recv_timeout(WAIT).unwrap()),
        "retry"
    );
    // A real short expiration: the clock thread wakes for it.
    send(
        &ch,
        "",
        "rung",
        "soon",
        AmqpProperties::default().with_expiration("5".into()),
    );
    assert_eq!(
        body(consumer.receiver().recv_timeout(WAIT).unwrap()),
        "soon"
    );
}

#[test]
fn cut_connections_requeues_disconnects_and_deletes_exclusive_queues() {
    let name = unique("cut");
    let broker = super::broker(&name);
    let (mut t, blocked) = open(&name);
    let ch = t.open_channel().unwrap();
    declare(&ch, "q", FieldTable::new());
    ch.queue_declare(
        "mine",
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
    )
    .unwrap();
    send(&ch, "", "q", "m", AmqpProperties::default());
    let consumer = ch.basic_consume("q", ConsumerOptions::default()).unwrap();
    let ConsumerMessage::Delivery(d) = consumer.receiver().recv_timeout(WAIT).unwrap() else {
        panic!()
    };
    assert_eq!(broker.unacked("q"), Some(1));
    assert_eq!(broker.cut_connections(), 1);
    assert!(
        consumer.receiver().recv_timeout(WAIT).is_err(),
        "the buffer disconnects"
    );
    assert!(
        blocked.recv_timeout(WAIT).is_err(),
        "the blocked receiver disconnects"
    );
    assert_eq!(
        (broker.queue_depth("q"), broker.queue_depth("mine")),
        (Some(1), None)
    );
    assert!(matches!(d.ack(&ch), Err(AmqpError::LinkLost { .. })));
    assert!(matches!(
        t.open_channel().map(drop),
        Err(AmqpError::LinkLost { .. })
    ));
    assert_eq!(broker.connection_count(), 0);
    broker.refuse_connections(true);
    assert!(super::connect(&name, None).is_err());
    broker.refuse_connections(false);
    let (mut t2, _) = open(&name);
    let ch2 = t2.open_channel().unwrap();
    let g = ch2.basic_get("q", true).unwrap().unwrap();
    assert!(g.delivery.redelivered);
}

#[test]
fn an_alarm_holds_publishes_in_order_until_unblocked() {
    let name = unique("alarm");
    let broker = super::broker(&name);
    let (mut t, blocked) = open(&name);
    let ch = t.open_channel().unwrap();
    declare(&ch, "q", FieldTable::new());
    ch.enable_publisher_confirms().unwrap();
    let confirms = ch.listen_for_publisher_confirms().unwrap();
    broker.block("low on memory");
    assert!(
        matches!(blocked.recv_timeout(WAIT).unwrap(), Blocked::Blocked(r) if r == "low on memory")
    );
    let (_late, late_blocked) = open(&name);
    assert!(matches!(
        late_blocked.try_recv().unwrap(),
        Blocked::Blocked(_)
    ));
    send(&ch, "", "q", "1", AmqpProperties::default());
    send(&ch, "", "q", "2", AmqpProperties::default());
    assert!(confirms.try_recv().is_err());
    assert_eq!(broker.queue_depth("q"), Some(0));
    broker.unblock();
    assert!(matches!(
        blocked.recv_timeout(WAIT).unwrap(),
        Blocked::Unblocked
    ));
    let tags: Vec<u64> = confirms
        .try_iter()
        .map(|c| match c {
            Confirm::Ack(p) => p.delivery_tag,
            c => panic!("{c:?}"),
        })
        .collect();
    assert_eq!(tags, [1, 2]);
    assert_eq!(
        ch.basic_get("q", true).unwrap().unwrap().delivery.body,
        b"1"
    );
    // Held on a connection that is cut: lost, never confirmed.
    broker.block("disk");
    send(&ch, "", "q", "lost", AmqpProperties::default());
    broker.cut_connections();
    broker.unblock();
    assert_eq!(broker.queue_depth("q"), Some(1));
    assert!(confirms.recv_timeout(Duration::from_millis(1)).is_err());
}

#[test]
fn nacked_publishes_and_held_deliveries() {
    let name = unique("nack");
    let broker = super::broker(&name);
    let (mut t, _) = open(&name);
    let ch = t.open_channel().unwrap();
    declare(&ch, "q", FieldTable::new());
    ch.enable_publisher_confirms().unwrap();
    let confirms = ch.listen_for_publisher_confirms().unwrap();
    broker.nack_next_publishes(1);
    send(&ch, "", "q", "no", AmqpProperties::default());
    send(&ch, "", "q", "yes", AmqpProperties::default());
    let got: Vec<Confirm> = confirms.try_iter().collect();
    assert!(
        matches!(got[..], [Confirm::Nack(a), Confirm::Ack(b)] if a.delivery_tag == 1 && b.delivery_tag == 2)
    );
    broker.hold_deliveries("q");
    let consumer = ch
        .basic_consume(
            "q",
            ConsumerOptions {
                no_ack: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(consumer.receiver().try_recv().is_err());
    assert_eq!(broker.consumer_count("q"), Some(1));
    broker.release_deliveries("q");
    assert_eq!(body(consumer.receiver().recv_timeout(WAIT).unwrap()), "yes");
}

#[test]
fn auto_delete_server_named_and_deleted_queues_cancel_consumers() {
    let name = unique("lifecycle");
    let broker = super::broker(&name);
    let (mut t, _) = open(&name);
    let ch = t.open_channel().unwrap();
    let q = ch
        .queue_declare(
            "",
            QueueDeclareOptions {
                auto_delete: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(
        q.name().starts_with("amq.gen-") && q.name().len() == 30,
        "{}",
        q.name()
    );
    let c = ch
        .basic_consume(q.name(), ConsumerOptions::default())
        .unwrap();
    assert_eq!(broker.consumer_count(q.name()), Some(1));
    c.cancel().unwrap();
    assert_eq!(
        broker.queue_depth(q.name()),
        None,
        "auto-delete: gone with its last consumer"
    );
    declare(&ch, "d", FieldTable::new());
    let c = ch.basic_consume("d", ConsumerOptions::default()).unwrap();
    let other = t.open_channel().unwrap();
    assert_eq!(
        other
            .queue_delete("d", QueueDeleteOptions::default())
            .unwrap(),
        0
    );
    assert!(matches!(
        c.receiver().recv_timeout(WAIT).unwrap(),
        ConsumerMessage::ServerCancelled
    ));
    let x = ExchangeDeclareOptions {
        auto_delete: true,
        ..Default::default()
    };
    ch.exchange_declare(ExchangeType::Fanout, "ax", x).unwrap();
    declare(&ch, "b", FieldTable::new());
    ch.queue_bind("b", "ax", "", FieldTable::new()).unwrap();
    ch.queue_unbind("b", "ax", "", FieldTable::new()).unwrap();
    let (code, _) = code(ch.exchange_declare_passive("ax").unwrap_err());
    assert_eq!(
        code, 404,
        "auto-delete exchange: gone with its last binding"
    );
}

#[test]
fn a_channel_error_closes_the_channel_for_its_consumers() {
    let name = unique("chanerr");
    let (mut t, _) = open(&name);
    let ch: Channel = t.open_channel().unwrap();
    declare(&ch, "q", FieldTable::new());
    send(&ch, "", "q", "m", AmqpProperties::default());
    let c = ch.basic_consume("q", ConsumerOptions::default()).unwrap();
    let ConsumerMessage::Delivery(_d) = c.receiver().recv_timeout(WAIT).unwrap() else {
        panic!()
    };
    let (code, _) = code(ch.queue_declare_passive("missing").unwrap_err());
    assert_eq!(code, 404);
    match c.receiver().recv_timeout(WAIT).unwrap() {
        ConsumerMessage::ServerClosedChannel(AmqpError::ServerClosedChannel {
            code: 404, ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let broker = super::broker(&name);
    assert_eq!(
        (broker.queue_depth("q"), broker.unacked("q")),
        (Some(1), Some(0))
    );
    assert!(ch.basic_get("q", true).is_err());
}
