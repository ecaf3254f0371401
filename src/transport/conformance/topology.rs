//! Contract tests of topology on both transports (`contract.rs` runs them): routing per
//! exchange type, declare conflicts and refusals, 404s, exclusive queues, deletes.

use std::time::{Duration, Instant};

use super::{args, body_of, both, declare, seen, send, wait_depth, Attempt};
use crate::transport::{
    AmqpProperties, AmqpValue, ConsumerMessage, ConsumerOptions, ExchangeDeclareOptions,
    ExchangeType, FieldTable, Publish, QueueDeclareOptions, QueueDeleteOptions,
};

#[test]
fn routing_per_exchange_type() {
    both("routing", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let kinds = [
            ("direct", ExchangeType::Direct, "k.a"),
            ("fanout", ExchangeType::Fanout, "ignored"),
            ("topic", ExchangeType::Topic, "k.*"),
            ("headers", ExchangeType::Headers, ""),
        ];
        let mut out = Vec::new();
        for (name, kind, key) in kinds {
            let x = s.exchange(name);
            ch.exchange_declare(kind, &x, ExchangeDeclareOptions::default())
                .unwrap();
            let q1 = s.queue(&format!("{name}1"));
            let q2 = s.queue(&format!("{name}2"));
            declare(&ch, &q1, FieldTable::new());
            declare(&ch, &q2, FieldTable::new());
            let hargs = args(&[
                ("x-match", AmqpValue::LongString("any".into())),
                ("a", AmqpValue::LongString("1".into())),
                ("b", AmqpValue::LongInt(2)),
            ]);
            let bind_args = if name == "headers" {
                hargs
            } else {
                FieldTable::new()
            };
            ch.queue_bind(&q1, &x, key, bind_args).unwrap();
            let other = if name == "topic" { "#.z" } else { "k.b" };
            let other_args = if name == "headers" {
                args(&[("c", AmqpValue::Void)])
            } else {
                FieldTable::new()
            };
            ch.queue_bind(&q2, &x, other, other_args).unwrap();
            for (i, rk) in ["k.a", "k.b", "k.a.z", "y.z"].iter().enumerate() {
                let headers = match i {
                    0 => args(&[("b", AmqpValue::LongLongInt(2))]),
                    1 => args(&[("c", AmqpValue::LongString("x".into()))]),
                    2 => args(&[
                        ("a", AmqpValue::LongString("1".into())),
                        ("c", AmqpValue::Boolean(true)),
                    ]),
                    _ => FieldTable::new(),
                };
                send(
                    &ch,
                    &x,
                    rk,
                    &format!("m{i}"),
                    AmqpProperties::default().with_headers(headers),
                );
            }
            // The default exchange routes by queue name.
            send(&ch, "", &q2, "direct-to-q2", AmqpProperties::default());
            for q in [&q1, &q2] {
                let mut got = Vec::new();
                // Published on this channel before this get: already routed on both.
                while let Some(g) = ch.basic_get(q, true).unwrap() {
                    got.push(body_of(&g.delivery));
                }
                out.push(format!("{name} {}: {got:?}", s.plain(q)));
            }
        }
        out
    });
}

#[test]
fn queue_declare_conflicts_name_the_argument() {
    both("qconflict", |s| {
        let mut t = s.connect();
        let mut out = Vec::new();
        let q = s.queue("q");
        let ch = t.open_channel().unwrap();
        declare(
            &ch,
            &q,
            args(&[("x-message-ttl", AmqpValue::LongInt(1000))]),
        );
        let tries = [
            (false, false, FieldTable::new()),
            (
                false,
                false,
                args(&[("x-message-ttl", AmqpValue::LongInt(2000))]),
            ),
            (
                false,
                false,
                args(&[("x-message-ttl", AmqpValue::LongLongInt(1000))]),
            ),
            (
                true,
                false,
                args(&[("x-message-ttl", AmqpValue::LongInt(1000))]),
            ),
            (
                false,
                true,
                args(&[("x-message-ttl", AmqpValue::LongInt(1000))]),
            ),
            (
                false,
                false,
                args(&[
                    ("x-message-ttl", AmqpValue::LongInt(1000)),
                    ("x-max-length", AmqpValue::LongInt(3)),
                ]),
            ),
        ];
        for (durable, auto_delete, arguments) in tries {
            let ch = t.open_channel().unwrap();
            let r = ch.queue_declare(
                &q,
                QueueDeclareOptions {
                    durable,
                    auto_delete,
                    exclusive: false,
                    arguments,
                },
            );
            out.push(match r {
                Ok(state) => format!("ok {}", state.message_count()),
                Err(e) => seen(s, e),
            });
        }
        let fresh = s.queue("fresh");
        let ch = t.open_channel().unwrap();
        let r = ch.queue_declare(
            &fresh,
            QueueDeclareOptions {
                arguments: args(&[("x-message-ttl", AmqpValue::LongInt(-1))]),
                ..Default::default()
            },
        );
        out.push(r.map(|_| "ok".to_string()).unwrap_or_else(|e| seen(s, e)));
        let ch = t.open_channel().unwrap();
        let r = ch.queue_declare("amq.reserved.test.mem", QueueDeclareOptions::default());
        out.push(r.map(|_| "ok".to_string()).unwrap_or_else(|e| seen(s, e)));
        out
    });
}

#[test]
fn exchange_declare_conflicts_and_refusals() {
    both("xconflict", |s| {
        let mut t = s.connect();
        let mut out = Vec::new();
        let x = s.exchange("x");
        let q = s.queue("q");
        let ch = t.open_channel().unwrap();
        ch.exchange_declare(ExchangeType::Direct, &x, ExchangeDeclareOptions::default())
            .unwrap();
        declare(&ch, &q, FieldTable::new());
        let attempts: Vec<Attempt<'_, ()>> = vec![
            Box::new(|ch| {
                ch.exchange_declare(ExchangeType::Fanout, &x, ExchangeDeclareOptions::default())
            }),
            Box::new(|ch| {
                ch.exchange_declare(
                    ExchangeType::Direct,
                    &x,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                )
            }),
            Box::new(|ch| {
                ch.exchange_declare(
                    ExchangeType::Direct,
                    &x,
                    ExchangeDeclareOptions {
                        auto_delete: true,
                        ..Default::default()
                    },
                )
            }),
            Box::new(|ch| {
                ch.exchange_declare(
                    ExchangeType::Direct,
                    "amq.test.mem.reserved",
                    ExchangeDeclareOptions::default(),
                )
            }),
            Box::new(|ch| {
                ch.exchange_declare(
                    ExchangeType::Direct,
                    "amq.direct",
                    ExchangeDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                )
            }),
            Box::new(|ch| ch.queue_bind(&q, "", "k", FieldTable::new())),
            Box::new(|ch| ch.exchange_delete(&x, false)),
            Box::new(|ch| ch.exchange_delete(&x, false)),
        ];
        for f in attempts {
            let ch = t.open_channel().unwrap();
            out.push(
                f(&ch)
                    .map(|()| "ok".to_string())
                    .unwrap_or_else(|e| seen(s, e)),
            );
        }
        out
    });
}

#[test]
fn missing_things_are_404_and_publish_closes_the_channel_after() {
    both("notfound", |s| {
        let mut t = s.connect();
        let mut out = Vec::new();
        let q = s.queue("missing");
        let x = s.exchange("missing");
        let real_q = s.queue("q");
        let ch = t.open_channel().unwrap();
        declare(&ch, &real_q, FieldTable::new());
        let attempts: Vec<Attempt<'_, String>> = vec![
            Box::new(|ch| ch.queue_declare_passive(&q).map(|_| "ok".into())),
            Box::new(|ch| ch.exchange_declare_passive(&x).map(|_| "ok".into())),
            Box::new(|ch| {
                ch.queue_bind(&real_q, &x, "k", FieldTable::new())
                    .map(|_| "ok".into())
            }),
            Box::new(|ch| {
                ch.queue_bind(&q, "amq.direct", "k", FieldTable::new())
                    .map(|_| "ok".into())
            }),
            Box::new(|ch| {
                ch.basic_consume(&q, ConsumerOptions::default())
                    .map(|_| "ok".into())
            }),
            Box::new(|ch| ch.basic_get(&q, false).map(|_| "ok".into())),
            Box::new(|ch| ch.queue_purge(&q).map(|n| format!("ok {n}"))),
            Box::new(|ch| {
                ch.queue_delete(&q, QueueDeleteOptions::default())
                    .map(|n| format!("ok {n}"))
            }),
        ];
        for f in attempts {
            let ch = t.open_channel().unwrap();
            out.push(f(&ch).unwrap_or_else(|e| seen(s, e)));
        }
        let ch = t.open_channel().unwrap();
        let r = ch.basic_publish(&x, Publish::new(b"x", "k"));
        out.push(format!("publish: {:?}", r.map_err(|e| seen(s, e))));
        let r = ch.queue_declare_passive(&real_q);
        out.push(format!(
            "then: {}",
            r.map(|_| "ok".to_string()).unwrap_or_else(|e| seen(s, e))
        ));
        let ch = t.open_channel().unwrap();
        let p = AmqpProperties::default().with_expiration("soon".into());
        ch.basic_publish("", Publish::with_properties(b"x", real_q.clone(), p))
            .unwrap();
        let r = ch.queue_declare_passive(&real_q);
        out.push(format!(
            "bad expiration: {}",
            r.map(|_| "ok".to_string()).unwrap_or_else(|e| seen(s, e))
        ));
        out
    });
}

#[test]
fn exclusive_queues_are_locked_and_go_with_their_connection() {
    both("exclusive", |s| {
        let mut owner = s.connect();
        let mut other = s.connect();
        let q = s.queue("q");
        let ch = owner.open_channel().unwrap();
        ch.queue_declare(
            &q,
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
        )
        .unwrap();
        let mut out = Vec::new();
        let attempts: Vec<Attempt<'_, String>> = vec![
            Box::new(|c| c.queue_declare_passive(&q).map(|_| "ok".into())),
            Box::new(|c| {
                c.queue_declare(
                    &q,
                    QueueDeclareOptions {
                        exclusive: true,
                        ..Default::default()
                    },
                )
                .map(|_| "ok".into())
            }),
            Box::new(|c| {
                c.basic_consume(&q, ConsumerOptions::default())
                    .map(|_| "ok".into())
            }),
            Box::new(|c| {
                c.queue_delete(&q, QueueDeleteOptions::default())
                    .map(|n| format!("ok {n}"))
            }),
        ];
        for f in &attempts {
            let c = other.open_channel().unwrap();
            out.push(f(&c).unwrap_or_else(|e| seen(s, e)));
        }
        let r = ch
            .queue_declare(&q, QueueDeclareOptions::default())
            .map(|_| "ok".to_string());
        out.push(format!(
            "owner, not exclusive: {}",
            r.unwrap_or_else(|e| seen(s, e))
        ));
        drop(ch);
        owner.close().unwrap();
        let c = other.open_channel().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let r = loop {
            let c = other.open_channel().unwrap();
            match c.queue_declare_passive(&q) {
                Ok(_) if Instant::now() < deadline => continue,
                r => break r,
            }
        };
        drop(c);
        out.push(format!(
            "after close: {}",
            r.map(|_| "ok".to_string()).unwrap_or_else(|e| seen(s, e))
        ));
        out
    });
}

#[test]
fn delete_if_unused_if_empty_and_exclusive_consume() {
    both("delete", |s| {
        let mut t = s.connect();
        let q = s.queue("q");
        let ch = t.open_channel().unwrap();
        declare(&ch, &q, FieldTable::new());
        send(&ch, "", &q, "a", AmqpProperties::default());
        wait_depth(&ch, &q, 1);
        let mut out = Vec::new();
        let c = t.open_channel().unwrap();
        out.push(format!(
            "{:?}",
            c.queue_delete(
                &q,
                QueueDeleteOptions {
                    if_empty: true,
                    if_unused: false
                }
            )
            .map_err(|e| seen(s, e))
        ));
        let holder = t.open_channel().unwrap();
        let consumer = holder
            .basic_consume(
                &q,
                ConsumerOptions {
                    no_ack: true,
                    ..Default::default()
                },
            )
            .unwrap();
        let mut said = Vec::new();
        match consumer
            .receiver()
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
        {
            ConsumerMessage::Delivery(d) => said.push(body_of(&d)),
            other => panic!("{other:?}"),
        }
        let c = t.open_channel().unwrap();
        out.push(format!(
            "{:?}",
            c.basic_consume(
                &q,
                ConsumerOptions {
                    exclusive: true,
                    ..Default::default()
                }
            )
            .map(|_| ())
            .map_err(|e| seen(s, e))
        ));
        let c = t.open_channel().unwrap();
        out.push(format!(
            "{:?}",
            c.queue_delete(
                &q,
                QueueDeleteOptions {
                    if_empty: false,
                    if_unused: true
                }
            )
            .map_err(|e| seen(s, e))
        ));
        let c = t.open_channel().unwrap();
        out.push(format!(
            "{:?}",
            c.queue_delete(&q, QueueDeleteOptions::default())
                .map_err(|e| seen(s, e))
        ));
        while let Ok(m) = consumer.receiver().recv_timeout(Duration::from_secs(5)) {
            let ended = !matches!(m, ConsumerMessage::Delivery(_));
            said.push(match m {
                ConsumerMessage::Delivery(d) => body_of(&d),
                other => format!("{other:?}"),
            });
            if ended {
                break;
            }
        }
        out.push(format!("consumer saw {said:?}"));
        out
    });
}

#[test]
fn queue_type_classic_and_headers_match_all() {
    both("qtype", |s| {
        let mut t = s.connect();
        let mut out = Vec::new();
        let q = s.queue("q");
        let ch = t.open_channel().unwrap();
        declare(&ch, &q, FieldTable::new());
        let classic = args(&[("x-queue-type", AmqpValue::LongString("classic".into()))]);
        let ch = t.open_channel().unwrap();
        let o = QueueDeclareOptions {
            arguments: classic.clone(),
            ..Default::default()
        };
        let r = ch.queue_declare(&q, o).map(|_| "ok".to_string());
        out.push(format!(
            "classic over none: {}",
            r.unwrap_or_else(|e| seen(s, e))
        ));
        let c = s.queue("c");
        let ch = t.open_channel().unwrap();
        declare(&ch, &c, classic.clone());
        let r = ch
            .queue_declare(&c, QueueDeclareOptions::default())
            .map(|_| "ok".to_string());
        out.push(format!(
            "none over classic: {}",
            r.unwrap_or_else(|e| seen(s, e))
        ));
        let x = s.exchange("h");
        let hq = s.queue("hq");
        let ch = t.open_channel().unwrap();
        ch.exchange_declare(ExchangeType::Headers, &x, ExchangeDeclareOptions::default())
            .unwrap();
        declare(&ch, &hq, FieldTable::new());
        let all = args(&[
            ("a", AmqpValue::LongString("1".into())),
            ("n", AmqpValue::LongInt(5)),
        ]);
        ch.queue_bind(&hq, &x, "", all).unwrap();
        for (i, h) in [
            args(&[("a", AmqpValue::LongString("1".into()))]),
            args(&[
                ("a", AmqpValue::LongString("1".into())),
                ("n", AmqpValue::ShortInt(5)),
                ("extra", AmqpValue::Boolean(true)),
            ]),
            args(&[("n", AmqpValue::LongInt(5))]),
        ]
        .into_iter()
        .enumerate()
        {
            send(
                &ch,
                &x,
                "",
                &format!("m{i}"),
                AmqpProperties::default().with_headers(h),
            );
        }
        let mut got = Vec::new();
        while let Some(g) = ch.basic_get(&hq, true).unwrap() {
            got.push(body_of(&g.delivery));
        }
        out.push(format!("all: {got:?}"));
        out
    });
}

#[test]
fn invalid_queue_arguments_are_refused_as_rabbitmq_words_them() {
    both("badargs", |s| {
        let mut t = s.connect();
        let mut out = Vec::new();
        let text = |v: &str| AmqpValue::LongString(v.into());
        let cases = [
            ("x-message-ttl", text("soon")),
            ("x-max-length", AmqpValue::LongInt(-2)),
            ("x-overflow", text("sideways")),
            ("x-dead-letter-routing-key", text("k")),
            ("x-dead-letter-exchange", AmqpValue::LongInt(1)),
        ];
        for (i, (k, v)) in cases.into_iter().enumerate() {
            let q = s.queue(&format!("q{i}"));
            let ch = t.open_channel().unwrap();
            let o = QueueDeclareOptions {
                arguments: args(&[(k, v)]),
                ..Default::default()
            };
            let r = ch.queue_declare(&q, o).map(|_| "ok".to_string());
            out.push(r.unwrap_or_else(|e| seen(s, e)));
        }
        out
    });
}
