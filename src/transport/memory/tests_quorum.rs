//! Seam-level tests of the memory broker's quorum queues in each major it follows, alone:
//! what a real broker cannot be made to do on demand (a cut) and a whole run of returns.

use std::time::Duration;

use crate::transport::conformance::{args, declare, send};
use crate::transport::{
    AmqpProperties, AmqpValue, ConsumerMessage, ConsumerOptions, Delivery, FieldTable,
    QueueDeclareOptions, Transport,
};

const WAIT: Duration = Duration::from_secs(5);

fn unique(case: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("test.mem.{case}.{}.{nanos}", std::process::id())
}

fn open(name: &str) -> Box<dyn Transport> {
    super::connect(name, Some("test")).expect("connect").0
}

fn text(s: &str) -> AmqpValue {
    AmqpValue::LongString(s.into())
}

/// Queue `q`, quorum, with `more` arguments, on the memory broker `name` made to follow `major`.
fn quorum_on(name: &str, major: u8, more: &[(&str, AmqpValue)]) -> Box<dyn Transport> {
    super::broker(name).set_major(major);
    let mut t = open(name);
    let ch = t.open_channel().unwrap();
    let mut arguments = args(&[("x-queue-type", text("quorum"))]);
    arguments.extend(args(more));
    let o = QueueDeclareOptions {
        durable: true,
        arguments,
        ..Default::default()
    };
    ch.queue_declare("q", o).unwrap();
    t
}

fn delivery_count(d: &Delivery) -> Option<AmqpValue> {
    d.properties
        .headers()
        .as_ref()
        .and_then(|h| h.get("x-delivery-count").cloned())
}

#[test]
fn a_cut_counts_as_a_return_against_the_delivery_limit() {
    let name = unique("cut-limit");
    let broker = super::broker(&name);
    let more = [
        ("x-delivery-limit", AmqpValue::LongInt(1)),
        ("x-dead-letter-exchange", text("")),
        ("x-dead-letter-routing-key", text("dlq")),
    ];
    let mut t = quorum_on(&name, 4, &more);
    let ch = t.open_channel().unwrap();
    declare(&ch, "dlq", FieldTable::new());
    send(&ch, "", "q", "m", AmqpProperties::default());
    for round in 0..2 {
        let mut t = open(&name);
        let ch = t.open_channel().unwrap();
        let consumer = ch.basic_consume("q", ConsumerOptions::default()).unwrap();
        let ConsumerMessage::Delivery(d) = consumer.receiver().recv_timeout(WAIT).unwrap() else {
            panic!("a delivery")
        };
        let expected = (round > 0).then_some(AmqpValue::LongLongInt(round));
        assert_eq!(delivery_count(&d), expected, "round {round}");
        drop(consumer);
        // The cut ends the connection (its handles, dropped after, find it gone).
        broker.cut_connections();
    }
    assert_eq!(broker.queue_depth("q"), Some(0));
    assert_eq!(
        broker.queue_depth("dlq"),
        Some(1),
        "the second cut passed the limit"
    );
}

#[test]
fn a_broker_follows_the_major_it_is_asked_for() {
    // 3.x: `x-delivery-count` 0 on the first delivery, returns at the tail, no default limit.
    let name = unique("major-3");
    let mut t = quorum_on(&name, 3, &[]);
    let ch = t.open_channel().unwrap();
    for b in ["a", "b"] {
        send(&ch, "", "q", b, AmqpProperties::default());
    }
    let mut seen = Vec::new();
    for _ in 0..30 {
        let g = ch.basic_get("q", false).unwrap().expect("a message");
        seen.push(String::from_utf8_lossy(&g.delivery.body).into_owned());
        if seen.len() == 1 {
            assert_eq!(delivery_count(&g.delivery), Some(AmqpValue::LongLongInt(0)));
        }
        g.delivery.nack(&ch, true).unwrap();
    }
    assert_eq!(seen[..4], ["a", "b", "a", "b"], "a return goes to the tail");
    assert_eq!(
        super::broker(&name).queue_depth("q"),
        Some(2),
        "never dropped"
    );
    // 4.x (the default): no header on the first delivery, returns at the head, 21st dropped.
    let name = unique("major-4");
    assert_eq!(super::broker(&name).major(), 4);
    let mut t = quorum_on(&name, 4, &[]);
    let ch = t.open_channel().unwrap();
    for b in ["a", "b"] {
        send(&ch, "", "q", b, AmqpProperties::default());
    }
    let mut returns = 0;
    while let Some(g) = ch.basic_get("q", false).unwrap() {
        if String::from_utf8_lossy(&g.delivery.body) == "b" {
            break;
        }
        let expected = (returns > 0).then_some(AmqpValue::LongLongInt(returns));
        assert_eq!(delivery_count(&g.delivery), expected);
        g.delivery.nack(&ch, true).unwrap();
        returns += 1;
    }
    assert_eq!(
        returns, 21,
        "a is returned to the head until its 21st return drops it"
    );
}
