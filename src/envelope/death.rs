//! Why a message is where it is: the family's `x-acemq-error`, or — for a message RabbitMQ
//! dead-lettered itself, which carries none — the broker's own reason, in words
//! ([`Message::failure_reason`]).
//!
//! RabbitMQ records its dead-lettering in `x-death` (one entry per queue and reason) and, since
//! 3.8, `x-first-death-reason` / `-queue`; RabbitMQ 4.x adds `x-last-death-reason` / `-queue`.
//! The most telling reason on 4.x is `delivery_limit`: a quorum queue dead-letters a message
//! returned to it more often than its delivery limit (20 by default) allows — a consumer that
//! crashed on it again and again — and a person reading `.dlq` must be able to tell that from
//! the family's own failures.

use super::{HeaderValue, Message};

/// The header in which RabbitMQ's quorum queues count a message's returns (4.x reads its
/// delivery limit against it).
pub(crate) const DELIVERY_COUNT: &str = "x-delivery-count";

impl Message {
    /// How many returns of this message the broker has counted (its `x-delivery-count`; 0 when
    /// it carries none).
    pub(crate) fn returns_counted(&self) -> i64 {
        self.headers
            .get(DELIVERY_COUNT)
            .and_then(HeaderValue::as_i64)
            .unwrap_or(0)
    }

    /// Why this message was set aside: its `x-acemq-error` (the family's reason) when it has
    /// one, else the reason RabbitMQ dead-lettered it for, in words, with the queue it left —
    /// e.g. `the broker dead-lettered it from "orders": it was returned to the queue more often
    /// than its delivery limit allows (delivery_limit)` — from `x-last-death-*`, then
    /// `x-first-death-*`, then the newest `x-death` entry. `None` when neither says.
    pub fn failure_reason(&self) -> Option<String> {
        if let Some(error) = &self.envelope.error {
            return Some(error.clone());
        }
        let (reason, queue) = self.broker_death()?;
        let words = match reason.as_str() {
            "delivery_limit" => {
                "it was returned to the queue more often than its delivery limit allows"
            }
            "rejected" => "a consumer rejected it without requeueing",
            "expired" => "its time to live ran out",
            "maxlen" => "the queue was over its length limit",
            _ => "for a reason of its own",
        };
        Some(match queue {
            Some(q) => format!("the broker dead-lettered it from {q:?}: {words} ({reason})"),
            None => format!("the broker dead-lettered it: {words} ({reason})"),
        })
    }

    /// The broker's last dead-lettering of this message: its reason and the queue it left.
    fn broker_death(&self) -> Option<(String, Option<String>)> {
        let text = |name: &str| {
            self.headers
                .get(name)
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        for prefix in ["x-last-death", "x-first-death"] {
            if let Some(reason) = text(&format!("{prefix}-reason")) {
                return Some((reason, text(&format!("{prefix}-queue"))));
            }
        }
        let Some(HeaderValue::Array(deaths)) = self.headers.get("x-death") else {
            return None;
        };
        let HeaderValue::Table(newest) = deaths.first()? else {
            return None;
        };
        let field = |name: &str| {
            newest
                .get(name)
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        Some((field("reason")?, field("queue")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_family_reason_comes_first_then_the_brokers_in_words() {
        let mut m = Message::new("x")
            .with_header("x-first-death-reason", "delivery_limit")
            .with_header("x-first-death-queue", "orders");
        let reason = m.failure_reason().unwrap();
        assert!(reason.contains("delivery limit"), "{reason}");
        assert!(reason.contains("\"orders\""), "{reason}");
        assert!(reason.ends_with("(delivery_limit)"), "{reason}");
        m = m.with_header("x-last-death-reason", "expired");
        assert!(m.failure_reason().unwrap().contains("(expired)"));
        m.envelope.error = Some("exhausted 3 attempts: boom".into());
        assert_eq!(m.failure_reason().unwrap(), "exhausted 3 attempts: boom");
        assert_eq!(Message::new("y").failure_reason(), None);
    }

    #[test]
    fn an_x_death_entry_alone_is_read() {
        let mut entry = std::collections::BTreeMap::new();
        entry.insert("reason".to_string(), HeaderValue::Text("rejected".into()));
        entry.insert("queue".to_string(), HeaderValue::Text("work".into()));
        let m = Message::new("x").with_header(
            "x-death",
            HeaderValue::Array(vec![HeaderValue::Table(entry)]),
        );
        let reason = m.failure_reason().unwrap();
        assert!(
            reason.contains("rejected it") && reason.contains("\"work\""),
            "{reason}"
        );
    }
}
