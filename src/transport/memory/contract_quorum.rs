//! Contract tests of quorum queues on both transports (`contract.rs` runs them): the family's
//! default queue type (`QueueSpec::new`), accepted by the memory broker with RabbitMQ 3.10's
//! behaviour where the patterns can tell — a requeued message goes to the back and carries
//! `x-delivery-count`, an exclusive consume is not enforced.

use super::contract::{args, body_of, both, get_within, wait_depth};
use crate::transport::{AmqpValue, Channel, ConsumerOptions, Delivery, QueueDeclareOptions};

fn declare_quorum(ch: &Channel, q: &str) {
    ch.queue_declare(
        q,
        QueueDeclareOptions {
            durable: true,
            arguments: args(&[("x-queue-type", AmqpValue::LongString("quorum".into()))]),
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

#[test]
fn a_quorum_queue_requeues_at_the_back_with_a_delivery_count() {
    both("quorum-requeue", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        declare_quorum(&ch, &q);
        for b in ["a", "b", "c"] {
            super::contract::send(&ch, "", &q, b, Default::default());
        }
        wait_depth(&ch, &q, 3);
        let a = get_within(&ch, &q, false).unwrap();
        let mut out = vec![format!("first a: count {}", delivery_count(&a.delivery))];
        a.delivery.nack(&ch, true).unwrap();
        wait_depth(&ch, &q, 3);
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let g = get_within(&ch, &q, false).expect("a message");
            seen.push(format!(
                "{} redelivered {} count {}",
                body_of(&g.delivery),
                g.delivery.redelivered,
                delivery_count(&g.delivery)
            ));
            if body_of(&g.delivery) == "a" && seen.len() < 3 {
                g.delivery.nack(&ch, true).unwrap();
            } else {
                g.delivery.ack(&ch).unwrap();
            }
        }
        out.extend(seen);
        out
    });
}

#[test]
fn an_exclusive_consume_on_a_quorum_queue_is_not_enforced() {
    both("quorum-exclusive", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        declare_quorum(&ch, &q);
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
