//! Contract tests of a queue's arguments as a redeclaration reads them back, on both transports
//! (`contract.rs` runs them, the memory broker following the real one's major): 4.x keeps
//! `x-queue-type: classic` on a queue declared without it (and declares with it where none is
//! given), 3.x takes a missing type as classic only against `classic`; `x-delivery-limit` is
//! compared as the other arguments are, taken on a quorum queue whatever its type, refused on a
//! classic one.

use super::{args, both, seen, Side};
use crate::transport::{AmqpValue, FieldTable, QueueDeclareOptions, Transport};

/// Declares `q` with `first`, then again with `then` on a fresh channel: `ok` or the refusal.
fn redeclare(
    s: &Side,
    t: &mut Box<dyn Transport>,
    q: &str,
    first: (bool, FieldTable),
    then: (bool, FieldTable),
) -> String {
    let mut declare = |(durable, arguments): (bool, FieldTable)| {
        let ch = t.open_channel().unwrap();
        let o = QueueDeclareOptions {
            durable,
            arguments,
            ..Default::default()
        };
        ch.queue_declare(q, o)
            .map(|_| "ok".to_string())
            .unwrap_or_else(|e| seen(s, e))
    };
    let made = declare(first);
    assert_eq!(made, "ok", "{}", s.plain(q));
    declare(then)
}

fn queue_type(t: &str) -> FieldTable {
    match t {
        "none" => FieldTable::new(),
        t => args(&[("x-queue-type", AmqpValue::LongString(t.into()))]),
    }
}

#[test]
fn a_queues_type_reads_back_as_the_major_keeps_it() {
    both("readback-type", |s| {
        let mut t = s.connect();
        let mut out = Vec::new();
        let types = ["none", "classic", "quorum"];
        for (i, first) in types.into_iter().enumerate() {
            for (j, then) in types.into_iter().enumerate() {
                let q = s.queue(&format!("q{i}{j}"));
                let r = redeclare(
                    s,
                    &mut t,
                    &q,
                    (true, queue_type(first)),
                    (true, queue_type(then)),
                );
                out.push(format!("{then} over {first}: {r}"));
            }
        }
        let q = s.queue("transient");
        let r = redeclare(
            s,
            &mut t,
            &q,
            (false, FieldTable::new()),
            (false, queue_type("quorum")),
        );
        out.push(format!("quorum over a transient none: {r}"));
        out
    });
}

#[test]
fn the_delivery_limit_reads_back_as_an_argument() {
    both("readback-limit", |s| {
        let mut t = s.connect();
        let mut out = Vec::new();
        let quorum = |limit: Option<AmqpValue>| {
            let mut a = queue_type("quorum");
            if let Some(v) = limit {
                a.insert("x-delivery-limit".into(), v);
            }
            (true, a)
        };
        let cases = [
            (
                "3 over 2",
                Some(AmqpValue::LongInt(2)),
                Some(AmqpValue::LongInt(3)),
            ),
            ("none over 2", Some(AmqpValue::LongInt(2)), None),
            ("20 over none", None, Some(AmqpValue::LongInt(20))),
            (
                "2 over 2",
                Some(AmqpValue::LongInt(2)),
                Some(AmqpValue::LongLongInt(2)),
            ),
            (
                "'ten' over 'ten'",
                Some(AmqpValue::LongString("ten".into())),
                Some(AmqpValue::LongString("ten".into())),
            ),
        ];
        for (i, (name, first, then)) in cases.into_iter().enumerate() {
            let q = s.queue(&format!("q{i}"));
            let r = redeclare(s, &mut t, &q, quorum(first), quorum(then));
            out.push(format!("{name}: {r}"));
        }
        let q = s.queue("classic");
        let ch = t.open_channel().unwrap();
        let o = QueueDeclareOptions {
            durable: true,
            arguments: args(&[("x-delivery-limit", AmqpValue::LongInt(3))]),
            ..Default::default()
        };
        let r = ch.queue_declare(&q, o).map(|_| "ok".to_string());
        out.push(format!("classic: {}", r.unwrap_or_else(|e| seen(s, e))));
        out
    });
}
