//! Contract tests of quorum queues on both transports (`contract.rs` runs them, the memory
//! broker following the real one's major): the family's default queue type (`QueueSpec::new`).
//! Each return of a delivered message — a nack with requeue (one, or all of a channel's; the seam
//! has no reject, which both count alike), its channel or connection ending — is counted in `x-delivery-count` (4.x: none on the first delivery; 3.x: 0) and held
//! against the delivery limit (4.x: 20 by default; 3.x: none); past it the message is
//! dead-lettered (`delivery_limit`) or dropped. A returned message goes to the head of a queue
//! with a delivery limit (4.x's default), to the tail of one without (3.x's default); an
//! exclusive consume is not enforced.

use super::{args, body_of, both, get_within, headers_shape, send, wait_depth, Side};
use crate::transport::{
    AmqpProperties, AmqpValue, Channel, ConsumerOptions, Delivery, QueueDeclareOptions, Transport,
};

fn declare_quorum(ch: &Channel, q: &str, more: &[(&str, AmqpValue)]) {
    let mut arguments = args(&[("x-queue-type", AmqpValue::LongString("quorum".into()))]);
    arguments.extend(args(more));
    ch.queue_declare(
        q,
        QueueDeclareOptions {
            durable: true,
            arguments,
            ..Default::default()
        },
    )
    .expect("declare a quorum queue");
}

/// The `x-delivery-count` header as received, type and value (`none` when absent).
fn delivery_count(d: &Delivery) -> String {
    d.properties
        .headers()
        .as_ref()
        .and_then(|h| h.get("x-delivery-count"))
        .map_or_else(|| "none".into(), |v| format!("{v:?}"))
}

fn seen_delivery(d: &Delivery) -> String {
    format!(
        "{} redelivered {} count {}",
        body_of(d),
        d.redelivered,
        delivery_count(d)
    )
}

/// Everything ready in `q`, in order, taken (acknowledged at once).
fn drain(ch: &Channel, q: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(g) = ch.basic_get(q, true).unwrap() {
        out.push(seen_delivery(&g.delivery));
    }
    out
}

#[test]
fn a_quorum_queue_counts_each_return_and_puts_it_back_as_the_major_does() {
    both("quorum-returns", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let mut out = Vec::new();
        // Returned c, then a: with a delivery limit (4.x's default) at the head, in that order;
        // without one (3.x's default; a negative one on 4.x) at the tail.
        for (i, limit) in [None, Some(10), Some(-1)].into_iter().enumerate() {
            let q = s.queue(&format!("p{i}"));
            let more: Vec<(&str, AmqpValue)> = limit
                .map(|n| ("x-delivery-limit", AmqpValue::LongInt(n)))
                .into_iter()
                .collect();
            declare_quorum(&ch, &q, &more);
            for b in ["a", "b", "c", "d"] {
                send(&ch, "", &q, b, AmqpProperties::default());
            }
            wait_depth(&ch, &q, 4);
            let got: Vec<Delivery> = (0..3)
                .map(|_| get_within(&ch, &q, false).unwrap().delivery)
                .collect();
            out.extend(got.iter().map(seen_delivery));
            let mut got = got.into_iter();
            let (a, b, c) = (
                got.next().unwrap(),
                got.next().unwrap(),
                got.next().unwrap(),
            );
            c.nack(&ch, true).unwrap();
            a.nack(&ch, true).unwrap();
            b.ack(&ch).unwrap();
            // 3.x drops at once a message returned past a negative limit.
            let left = if limit == Some(-1) && s.major() < 4 {
                1
            } else {
                3
            };
            wait_depth(&ch, &q, left);
            out.push(format!(
                "limit {limit:?}, nack c, nack a: {:?}",
                drain(&ch, &q)
            ));
        }
        let q = s.queue("q");
        declare_quorum(&ch, &q, &[("x-delivery-limit", AmqpValue::LongInt(10))]);
        // One message returned each way: nack, nack of all, its channel's close, its connection's.
        send(&ch, "", &q, "m", AmqpProperties::default());
        let m = get_within(&ch, &q, false).unwrap().delivery;
        out.push(format!("first: {}", seen_delivery(&m)));
        drop(m);
        ch.nack_all(true).unwrap(); // basic.nack, multiple, tag 0
        let ch2 = t.open_channel().unwrap();
        let m = get_within(&ch2, &q, false).unwrap().delivery;
        out.push(format!("after nack_all: {}", seen_delivery(&m)));
        ch2.close().unwrap();
        wait_depth(&ch, &q, 1);
        let mut t2 = s.connect();
        let ch3 = t2.open_channel().unwrap();
        let m = get_within(&ch3, &q, false).unwrap().delivery;
        out.push(format!("after its channel closed: {}", seen_delivery(&m)));
        t2.close().unwrap();
        wait_depth(&ch, &q, 1);
        out.push(format!("after its connection closed: {:?}", drain(&ch, &q)));
        // A publisher's own `x-delivery-count` on the first delivery, then the queue's.
        let mine = args(&[("x-delivery-count", AmqpValue::LongInt(5))]);
        send(
            &ch,
            "",
            &q,
            "z",
            AmqpProperties::default().with_headers(mine),
        );
        let z = get_within(&ch, &q, false).unwrap().delivery;
        out.push(format!("publisher's count: {}", seen_delivery(&z)));
        z.nack(&ch, true).unwrap();
        wait_depth(&ch, &q, 1);
        out.push(format!("then: {:?}", drain(&ch, &q)));
        out
    });
}

/// Publishes `m` to `q` (a quorum queue, empty) and returns it with a nack each time it comes
/// back, until it is gone or it was returned `cap` times. After each return a marker is
/// published: the marker delivered before `m` means `m` is gone (a returned message is ahead of
/// a later publish at the head as at the tail of an empty queue). Returns what each delivery
/// carried, then how it ended.
fn returned_until_gone(s: &Side, t: &mut Box<dyn Transport>, q: &str, cap: usize) -> Vec<String> {
    let ch = t.open_channel().unwrap();
    send(&ch, "", q, "m", AmqpProperties::default());
    let mut counts = Vec::new();
    let mut m = get_within(&ch, q, false).expect("m").delivery;
    for returns in 0..=cap {
        counts.push(delivery_count(&m));
        if returns == cap {
            m.ack(&ch).unwrap();
            return vec![format!("still there after {cap} returns")];
        }
        m.nack(&ch, true).unwrap();
        send(&ch, "", q, "marker", AmqpProperties::default());
        let next = get_within(&ch, q, false).expect("m or the marker").delivery;
        if body_of(&next) == "marker" {
            next.ack(&ch).unwrap();
            let shown = if counts.len() > 4 {
                format!("{:?} … {:?}", &counts[..2], &counts[counts.len() - 2..])
            } else {
                format!("{counts:?}")
            };
            return vec![format!(
                "gone after {} returns; counts {shown}",
                returns + 1
            )];
        }
        let marker = get_within(&ch, q, true).expect("the marker").delivery;
        assert_eq!(body_of(&marker), "marker", "{}", s.plain(q));
        m = next;
    }
    unreachable!("the loop returns at `cap`")
}

#[test]
fn the_delivery_limit_drops_a_message_returned_too_often() {
    both("quorum-limit", |s| {
        let mut t = s.connect();
        let mut out = Vec::new();
        let text = |v: &str| AmqpValue::LongString(v.into());
        let limits = [
            ("default", None),
            ("0", Some(AmqpValue::LongInt(0))),
            ("1", Some(AmqpValue::LongInt(1))),
            ("-1", Some(AmqpValue::LongInt(-1))),
            ("'ten'", Some(text("ten"))),
        ];
        for (i, (name, limit)) in limits.into_iter().enumerate() {
            let q = s.queue(&format!("q{i}"));
            let ch = t.open_channel().unwrap();
            let more: Vec<(&str, AmqpValue)> =
                limit.into_iter().map(|v| ("x-delivery-limit", v)).collect();
            declare_quorum(&ch, &q, &more);
            let seen = returned_until_gone(s, &mut t, &q, 24);
            out.push(format!("limit {name}: {}", seen.join("; ")));
        }
        out
    });
}

#[test]
fn past_the_delivery_limit_a_message_is_dead_lettered_through_the_queues_dlx() {
    both("quorum-limit-dlx", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let dlq = s.queue("dlq");
        ch.queue_declare(&dlq, QueueDeclareOptions::default())
            .unwrap();
        let dead_letters = [
            (
                "x-dead-letter-exchange",
                AmqpValue::LongString(String::new()),
            ),
            (
                "x-dead-letter-routing-key",
                AmqpValue::LongString(dlq.clone()),
            ),
        ];
        let mut out = Vec::new();
        // An explicit limit of 2, returned by nack, reject and a channel's close.
        let q = s.queue("q");
        let mut more = dead_letters.to_vec();
        more.push(("x-delivery-limit", AmqpValue::LongInt(2)));
        declare_quorum(&ch, &q, &more);
        let props = AmqpProperties::default()
            .with_expiration("60000".into())
            .with_headers(args(&[("mine", AmqpValue::LongInt(7))]));
        send(&ch, "", &q, "m", props);
        let m = get_within(&ch, &q, false).unwrap().delivery;
        out.push(seen_delivery(&m));
        m.nack(&ch, true).unwrap();
        let m = get_within(&ch, &q, false).unwrap().delivery;
        out.push(seen_delivery(&m));
        drop(m);
        ch.nack_all(true).unwrap();
        let ch2 = t.open_channel().unwrap();
        let m = get_within(&ch2, &q, false).unwrap().delivery;
        out.push(seen_delivery(&m));
        ch2.close().unwrap();
        let d = get_within(&ch, &dlq, true).expect("dead-lettered").delivery;
        out.push(format!(
            "dead-lettered: {} exchange {:?} key {} redelivered {}",
            body_of(&d),
            d.exchange,
            s.plain(&d.routing_key),
            d.redelivered
        ));
        out.extend(headers_shape(s, &d));
        out.push(format!(
            "left in q: {}",
            ch.queue_declare_passive(&q).unwrap().message_count()
        ));
        // The default limit (4.x: 20; 3.x: none).
        let q = s.queue("default");
        declare_quorum(&ch, &q, &dead_letters);
        let seen = returned_until_gone(s, &mut t, &q, 24);
        out.push(format!("default: {}", seen.join("; ")));
        let d = ch.basic_get(&dlq, true).unwrap();
        out.push(format!(
            "dead-lettered: {:?}",
            d.map(|g| headers_shape(s, &g.delivery)
                .into_iter()
                .filter(|h| h.starts_with("x-first-death-reason"))
                .collect::<Vec<_>>())
        ));
        out
    });
}

#[test]
fn an_exclusive_consume_on_a_quorum_queue_is_not_enforced() {
    both("quorum-exclusive", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        declare_quorum(&ch, &q, &[]);
        let exclusive = ConsumerOptions {
            exclusive: true,
            ..Default::default()
        };
        let held = ch.basic_consume(&q, exclusive);
        let first = if held.is_ok() { "ok" } else { "refused" };
        let ch2 = t.open_channel().unwrap();
        let second = ch2
            .basic_consume(&q, ConsumerOptions::default())
            .map(|_| "ok".to_string())
            .unwrap_or_else(|e| format!("refused: {e}"));
        let out = vec![format!("first {first}, second {second}")];
        drop(held);
        out
    });
}
