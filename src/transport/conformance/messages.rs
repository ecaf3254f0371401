//! Contract tests of messages on both transports (`contract.rs` runs them): returns before
//! confirms, delivery tags and `multiple`, unknown tags, requeue, x-death, expiry at the head,
//! a maximum length (the head dead-lettered, or the publish nacked), a round trip's answer
//! after every publish before it.

use std::time::Duration;

use super::{args, body_of, both, declare, get_within, headers_shape, seen, send, wait_depth};
use crate::transport::{
    AmqpProperties, AmqpValue, Confirm, ConsumerMessage, ConsumerOptions, Delivery,
    ExchangeDeclareOptions, ExchangeType, FieldTable, Publish,
};

#[test]
fn returns_come_before_confirms() {
    both("returns", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        declare(&ch, &q, FieldTable::new());
        ch.enable_publisher_confirms().unwrap();
        let confirms = ch.listen_for_publisher_confirms().unwrap();
        let returns = ch.listen_for_returns().unwrap();
        let mut out = Vec::new();
        for (key, mandatory) in [("nowhere", true), (q.as_str(), true), ("nowhere", false)] {
            let p = Publish {
                body: b"x",
                routing_key: key.into(),
                mandatory,
                properties: AmqpProperties::default(),
            };
            ch.basic_publish("", p).unwrap();
            let c = confirms
                .recv_timeout(Duration::from_secs(5))
                .expect("a confirm");
            let r = returns.try_recv().ok().map(|r| {
                format!(
                    "{} {} {:?}",
                    r.reply_code,
                    r.reply_text,
                    s.plain(&r.routing_key)
                )
            });
            let c = match c {
                Confirm::Ack(p) => format!("ack {} {}", p.delivery_tag, p.multiple),
                Confirm::Nack(p) => format!("nack {}", p.delivery_tag),
            };
            out.push(format!("{}: {c}, returned {r:?}", s.plain(key)));
        }
        out
    });
}

#[test]
fn tags_multiple_acks_and_unknown_tags() {
    both("tags", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        declare(&ch, &q, FieldTable::new());
        for i in 0..5 {
            send(&ch, "", &q, &format!("m{i}"), AmqpProperties::default());
        }
        let mut out = Vec::new();
        let mut got: Vec<Delivery> = (0..3)
            .map(|_| get_within(&ch, &q, false).unwrap().delivery)
            .collect();
        out.push(format!(
            "tags {:?}",
            got.iter().map(|d| d.delivery_tag()).collect::<Vec<_>>()
        ));
        let third = got.pop().unwrap();
        let second = got.pop().unwrap();
        second.ack_multiple(&ch).unwrap();
        let state = ch.queue_declare_passive(&q).unwrap();
        out.push(format!("ready {}", state.message_count()));
        // The consumer's deliveries continue the channel's tags.
        let consumer = ch.basic_consume(&q, ConsumerOptions::default()).unwrap();
        let mut tags = Vec::new();
        for _ in 0..2 {
            match consumer
                .receiver()
                .recv_timeout(Duration::from_secs(5))
                .unwrap()
            {
                ConsumerMessage::Delivery(d) => {
                    tags.push(d.delivery_tag());
                    d.ack(&ch).unwrap();
                }
                other => panic!("{other:?}"),
            }
        }
        out.push(format!("consumed tags {tags:?}"));
        third.ack(&ch).unwrap();
        drop(consumer);
        let ch2 = t.open_channel().unwrap();
        let d = ch2.basic_get(&q, false).unwrap();
        out.push(format!(
            "left {:?}",
            d.as_ref().map(|g| body_of(&g.delivery))
        ));
        send(&ch2, "", &q, "again", AmqpProperties::default());
        let g = get_within(&ch2, &q, false).unwrap();
        let tag = g.delivery.delivery_tag();
        g.delivery.ack(&ch2).unwrap();
        // Acking tag 1 on a channel whose tag 1 is settled: 406, the channel closes.
        let again = ch2.basic_get(&q, true).unwrap();
        out.push(format!(
            "tag {tag}, then {:?}",
            again.map(|g| g.delivery.delivery_tag())
        ));
        let r = ch2.nack_all(true);
        out.push(format!(
            "nack_all with none unacked: {:?}",
            r.map_err(|e| seen(s, e))
        ));
        out
    });
}

#[test]
fn unknown_delivery_tag_closes_the_channel_after() {
    both("unknown", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        declare(&ch, &q, FieldTable::new());
        send(&ch, "", &q, "a", AmqpProperties::default());
        send(&ch, "", &q, "b", AmqpProperties::default());
        let a = get_within(&ch, &q, false).unwrap().delivery;
        let b = get_within(&ch, &q, false).unwrap().delivery;
        let mut out = vec![format!("tags {} {}", a.delivery_tag(), b.delivery_tag())];
        b.nack(&ch, true).unwrap();
        let b2 = get_within(&ch, &q, false).unwrap().delivery;
        out.push(format!(
            "b again: {} tag {} redelivered {}",
            body_of(&b2),
            b2.delivery_tag(),
            b2.redelivered
        ));
        // nack_all settles tags 1 and 3 (requeued): tag 1 is unknown after it.
        ch.nack_all(true).unwrap();
        drop(b2);
        let r = a.ack(&ch);
        out.push(format!("ack: {:?}", r.map_err(|e| seen(s, e))));
        let r = ch.queue_declare_passive(&q).map(|st| st.message_count());
        out.push(format!("then: {:?}", r.map_err(|e| seen(s, e))));
        let r = ch.close();
        out.push(format!("close: {:?}", r.map_err(|e| seen(s, e))));
        let ch = t.open_channel().unwrap();
        wait_depth(&ch, &q, 2);
        let first = get_within(&ch, &q, true).unwrap();
        out.push(format!(
            "after close: {} redelivered {} left {}",
            body_of(&first.delivery),
            first.delivery.redelivered,
            first.message_count
        ));
        out
    });
}

#[test]
fn requeued_messages_go_back_to_their_place() {
    both("requeue", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        declare(&ch, &q, FieldTable::new());
        for b in ["a", "b", "c", "d"] {
            send(&ch, "", &q, b, AmqpProperties::default());
        }
        let a = get_within(&ch, &q, false).unwrap();
        let b = get_within(&ch, &q, false).unwrap();
        let c = get_within(&ch, &q, false).unwrap();
        let mut out = vec![format!(
            "counts {} {} {}",
            a.message_count, b.message_count, c.message_count
        )];
        c.delivery.nack(&ch, true).unwrap();
        a.delivery.nack(&ch, true).unwrap();
        b.delivery.ack(&ch).unwrap();
        wait_depth(&ch, &q, 3);
        while let Some(g) = ch.basic_get(&q, true).unwrap() {
            out.push(format!(
                "{} redelivered {} left {}",
                body_of(&g.delivery),
                g.delivery.redelivered,
                g.message_count
            ));
        }
        out
    });
}

#[test]
fn dead_lettering_writes_x_death_as_rabbitmq() {
    both("xdeath", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        let dlq = s.queue("dlq");
        let dlx = s.exchange("dlx");
        ch.exchange_declare(
            ExchangeType::Direct,
            &dlx,
            ExchangeDeclareOptions::default(),
        )
        .unwrap();
        declare(&ch, &dlq, FieldTable::new());
        ch.queue_bind(&dlq, &dlx, "dead", FieldTable::new())
            .unwrap();
        declare(
            &ch,
            &q,
            args(&[
                ("x-dead-letter-exchange", AmqpValue::LongString(dlx.clone())),
                (
                    "x-dead-letter-routing-key",
                    AmqpValue::LongString("dead".into()),
                ),
            ]),
        );
        let props = AmqpProperties::default()
            .with_expiration("60000".into())
            .with_message_id("id-1".into())
            .with_headers(args(&[("mine", AmqpValue::LongInt(7))]));
        send(&ch, "", &q, "m", props);
        let mut out = Vec::new();
        let g = get_within(&ch, &q, false).unwrap();
        g.delivery.nack(&ch, false).unwrap();
        let d = get_within(&ch, &dlq, false).unwrap().delivery;
        out.push(format!(
            "exchange {} key {} id {:?}",
            s.plain(&d.exchange),
            d.routing_key,
            d.properties.message_id()
        ));
        out.extend(headers_shape(s, &d));
        // Round two: published back to the queue as it came, rejected again: counted up.
        let props = d.properties.clone();
        d.ack(&ch).unwrap();
        send(&ch, "", &q, "m", props);
        get_within(&ch, &q, false)
            .unwrap()
            .delivery
            .nack(&ch, false)
            .unwrap();
        let d = get_within(&ch, &dlq, true).unwrap().delivery;
        out.extend(headers_shape(s, &d));
        out
    });
}

#[test]
fn expiry_dead_letters_and_holds_at_the_head() {
    both("expiry", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        let dlq = s.queue("dlq");
        let held = s.queue("held");
        declare(&ch, &dlq, FieldTable::new());
        declare(&ch, &held, FieldTable::new());
        declare(
            &ch,
            &q,
            args(&[
                ("x-message-ttl", AmqpValue::LongInt(5)),
                (
                    "x-dead-letter-exchange",
                    AmqpValue::LongString(String::new()),
                ),
                (
                    "x-dead-letter-routing-key",
                    AmqpValue::LongString(dlq.clone()),
                ),
            ]),
        );
        send(
            &ch,
            "",
            &held,
            "long",
            AmqpProperties::default().with_expiration("600000".into()),
        );
        send(
            &ch,
            "",
            &held,
            "short",
            AmqpProperties::default().with_expiration("1".into()),
        );
        send(
            &ch,
            "",
            &q,
            "ttl",
            AmqpProperties::default().with_expiration("3".into()),
        );
        let mut out = Vec::new();
        let d = get_within(&ch, &dlq, true)
            .expect("the expired message dead-lettered")
            .delivery;
        out.push(body_of(&d));
        out.extend(headers_shape(s, &d));
        // `short` expired long ago but waits behind `long`: still counted, never delivered.
        out.push(format!(
            "held depth {}",
            ch.queue_declare_passive(&held).unwrap().message_count()
        ));
        let g = ch.basic_get(&held, true).unwrap().unwrap();
        out.push(format!("{} left {}", body_of(&g.delivery), g.message_count));
        out.push(format!(
            "then {:?}",
            ch.basic_get(&held, true)
                .unwrap()
                .map(|g| body_of(&g.delivery))
        ));
        out
    });
}

#[test]
fn x_death_counts_the_deaths_the_broker_recorded() {
    both("xdeath-cycle", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        // c1 dead-letters to c2; c2 expires its messages back to c1.
        let c1 = s.queue("c1");
        let c2 = s.queue("c2");
        let to = |q: &str| {
            vec![
                (
                    "x-dead-letter-exchange",
                    AmqpValue::LongString(String::new()),
                ),
                ("x-dead-letter-routing-key", AmqpValue::LongString(q.into())),
            ]
        };
        declare(&ch, &c1, args(&to(&c2)));
        let mut c2_args = to(&c1);
        c2_args.push(("x-message-ttl", AmqpValue::LongInt(1)));
        declare(&ch, &c2, args(&c2_args));
        // A client's own `x-death`, naming c1: 3.x counts it up, 4.x replaces it.
        let mut entry = FieldTable::new();
        entry.insert("count".into(), AmqpValue::LongInt(9));
        entry.insert("queue".into(), AmqpValue::LongString(c1.clone()));
        entry.insert("reason".into(), AmqpValue::LongString("rejected".into()));
        let mine = args(&[(
            "x-death",
            AmqpValue::FieldArray(vec![AmqpValue::FieldTable(entry)]),
        )]);
        send(
            &ch,
            "",
            &c1,
            "m",
            AmqpProperties::default().with_headers(mine),
        );
        let mut out = Vec::new();
        for round in 0..3 {
            let d = get_within(&ch, &c1, false).expect("m, back in c1").delivery;
            out.push(format!("round {round}"));
            out.extend(headers_shape(s, &d));
            d.nack(&ch, false).unwrap();
        }
        out
    });
}

#[test]
fn max_length_drops_the_head_to_the_dlx_or_nacks_the_publish() {
    both("maxlen", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let (q, r, dlq) = (s.queue("q"), s.queue("r"), s.queue("dlq"));
        declare(&ch, &dlq, FieldTable::new());
        declare(
            &ch,
            &q,
            args(&[
                ("x-max-length", AmqpValue::LongInt(2)),
                ("x-dead-letter-exchange", AmqpValue::LongString("".into())),
                (
                    "x-dead-letter-routing-key",
                    AmqpValue::LongString(dlq.clone()),
                ),
            ]),
        );
        declare(
            &ch,
            &r,
            args(&[
                ("x-max-length", AmqpValue::LongInt(1)),
                ("x-overflow", AmqpValue::LongString("reject-publish".into())),
            ]),
        );
        ch.enable_publisher_confirms().unwrap();
        let confirms = ch.listen_for_publisher_confirms().unwrap();
        let mut out = Vec::new();
        for (queue, body) in [(&q, "a"), (&q, "b"), (&q, "c"), (&r, "1"), (&r, "2")] {
            send(&ch, "", queue, body, AmqpProperties::default());
            let c = confirms
                .recv_timeout(Duration::from_secs(5))
                .expect("a confirm");
            out.push(match c {
                Confirm::Ack(p) => format!("{body}: ack {}", p.delivery_tag),
                Confirm::Nack(p) => format!("{body}: nack {}", p.delivery_tag),
            });
        }
        wait_depth(&ch, &dlq, 1);
        let head = get_within(&ch, &dlq, true).expect("the dropped head");
        out.push(format!("dead-lettered {}", body_of(&head.delivery)));
        let reason =
            head.delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| match h.get("x-death") {
                    Some(AmqpValue::FieldArray(deaths)) => match deaths.first() {
                        Some(AmqpValue::FieldTable(d)) => d.get("reason").cloned(),
                        _ => None,
                    },
                    _ => None,
                });
        out.push(format!("x-death reason {reason:?}"));
        let kept: Vec<String> = std::iter::from_fn(|| ch.basic_get(&q, true).unwrap())
            .map(|g| body_of(&g.delivery))
            .collect();
        out.push(format!("kept {kept:?}"));
        out
    });
}

#[test]
fn a_round_trip_answers_after_every_publish_before_it() {
    both("round-trip", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        declare(&ch, &q, FieldTable::new());
        let returns = ch.listen_for_returns().unwrap();
        for i in 0..200 {
            send(&ch, "", &q, &format!("m{i}"), AmqpProperties::default());
        }
        let lost = Publish {
            body: b"x",
            routing_key: "nowhere".into(),
            mandatory: true,
            properties: AmqpProperties::default(),
        };
        ch.basic_publish("", lost).unwrap();
        ch.round_trip().unwrap();
        // Answered: the broker has read all of it, so the return (sent before the answer) is
        // already here — taken without waiting. The queue's count is not part of the promise
        // (RabbitMQ 4.x enqueues after the channel has answered), so it is only waited for.
        let returned = returns
            .try_recv()
            .map(|r| format!("{} {}", r.reply_code, s.plain(&r.routing_key)));
        wait_depth(&ch, &q, 200);
        vec![format!("returned at the answer {returned:?}")]
    });
}
