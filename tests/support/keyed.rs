//! Keyed messages of the ordering tests: the body is a sequence number, the header `k` the key.

use acemq_amqp::{Connection, Message, PublisherOptions};

/// Publishes one message per `(key, seq)` to `queue`, body = seq, header `k` = key (none when
/// the key is empty), confirmed; returns the ids in order.
pub fn publish_keyed(conn: &Connection, queue: &str, items: &[(String, usize)]) -> Vec<String> {
    let publisher = conn
        .publisher_with(PublisherOptions::new().window(1000))
        .unwrap();
    let mut tickets = Vec::new();
    let mut ids = Vec::new();
    for (key, seq) in items {
        let mut m = Message::new(seq.to_string());
        if !key.is_empty() {
            m = m.with_header("k", key.as_str());
        }
        ids.push(m.id().to_string());
        tickets.push(publisher.publish_deferred("", queue, m).unwrap());
        if tickets.len() >= 500 {
            for t in tickets.drain(..) {
                t.wait().unwrap();
            }
        }
    }
    for t in tickets {
        t.wait().unwrap();
    }
    publisher.close().unwrap();
    ids
}

/// The key (header `k`) of a message, empty when it has none.
pub fn key_of(m: &Message) -> String {
    m.headers
        .get("k")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string()
}

/// The sequence number (the body) of a message.
pub fn seq_of(m: &Message) -> usize {
    String::from_utf8_lossy(&m.body).parse().unwrap()
}
