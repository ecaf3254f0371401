//! The copy a replay publishes (stamped, restarted when asked) and where it goes.

use std::sync::Arc;

use crate::envelope::{headers, HeaderValue, Message};
use crate::error::{Error, Result};

/// The copy a replay publishes: the message as received, stamped, restarted when asked.
pub(crate) fn replayed_copy(mut message: Message, source: &str, restart: bool) -> Message {
    message.received = None;
    if let Some(props) = message.properties.take() {
        // Keep the received table for the headers' AMQP types.
        message.received_headers = props.headers().clone().map(Arc::new);
    }
    let count = message
        .headers
        .get(headers::REPLAY_COUNT)
        .and_then(read_int)
        .unwrap_or(0)
        .max(0);
    message.headers.insert(
        headers::REPLAYED_FROM.into(),
        HeaderValue::Text(source.to_string()),
    );
    message.headers.insert(
        headers::REPLAYED_AT.into(),
        HeaderValue::Text(rfc3339_now()),
    );
    message.headers.insert(
        headers::REPLAY_COUNT.into(),
        HeaderValue::Int(count.saturating_add(1)),
    );
    if restart {
        message.envelope.attempt = 1;
        message.envelope.error = None;
    }
    message
}

/// Where a replayed message goes: `(exchange, routing key)`.
pub(super) fn destination(
    message: &Message,
    source: &str,
    exchange: Option<&str>,
    routing_key: Option<&str>,
) -> Result<(String, String)> {
    let origin = Origin::of(message, source);
    let (exchange, default_key) = match (exchange, origin.exchange.as_deref()) {
        (Some(e), _) => (
            e.to_string(),
            origin.routing_key.clone().or(origin.queue.clone()),
        ),
        (None, Some(e)) if !e.is_empty() => (e.to_string(), origin.routing_key.clone()),
        (None, _) => (
            String::new(),
            origin.queue.clone().or(origin.routing_key.clone()),
        ),
    };
    let Some(routing_key) = routing_key.map(str::to_string).or(default_key) else {
        return Err(Error::invalid(format!(
            "message {} on {source:?} does not say where it came from; give the replay an \
             exchange and routing key",
            message.id()
        )));
    };
    if exchange.is_empty() && routing_key == source {
        return Err(Error::invalid(format!(
            "message {} would be replayed into {source:?}, the queue it is read from; give the \
             replay another exchange or routing key",
            message.id()
        )));
    }
    Ok((exchange, routing_key))
}

/// What a message says about where it was going before it was dead-lettered.
#[derive(Debug, Default)]
struct Origin {
    exchange: Option<String>,
    routing_key: Option<String>,
    queue: Option<String>,
}

impl Origin {
    fn of(message: &Message, source: &str) -> Origin {
        let text = |name: &str| message.headers.get(name).and_then(read_text);
        // This crate's consumer's copies.
        let mut origin = Origin {
            exchange: text(headers::ORIGINAL_EXCHANGE),
            routing_key: text(headers::ORIGINAL_ROUTING_KEY),
            queue: text(headers::ORIGINAL_QUEUE),
        };
        // The broker's own dead-lettering (a queue with `x-dead-letter-exchange`).
        if origin.queue.is_none() {
            origin.queue = text("x-first-death-queue");
            if origin.exchange.is_none() && origin.queue.is_some() {
                origin.exchange = text("x-first-death-exchange").or(Some(String::new()));
            }
            if origin.routing_key.is_none() {
                origin.routing_key = first_death_routing_key(message, origin.queue.as_deref());
            }
        }
        // The family's names: `orders.dlq` and `orders.parked` hold what `orders` dead-lettered.
        if origin.queue.is_none() {
            origin.queue = source
                .strip_suffix(".dlq")
                .or_else(|| source.strip_suffix(".parked"))
                .filter(|q| !q.is_empty())
                .map(str::to_string);
        }
        origin
    }
}

/// The routing key of the broker's first dead-lettering: the `x-death` entry for the first
/// death's queue (the array is most recent first, so the last such entry).
fn first_death_routing_key(message: &Message, queue: Option<&str>) -> Option<String> {
    let Some(HeaderValue::Array(deaths)) = message.headers.get("x-death") else {
        return None;
    };
    deaths
        .iter()
        .rev()
        .filter_map(|d| match d {
            HeaderValue::Table(t) => Some(t),
            _ => None,
        })
        .find(|t| queue.is_none() || t.get("queue").and_then(read_text).as_deref() == queue)
        .and_then(|t| match t.get("routing-keys") {
            Some(HeaderValue::Array(keys)) => keys.first().and_then(read_text),
            _ => None,
        })
}

fn read_text(value: &HeaderValue) -> Option<String> {
    match value {
        HeaderValue::Text(s) if !s.is_empty() => Some(s.clone()),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok().filter(|s| !s.is_empty()),
        _ => None,
    }
}

fn read_int(value: &HeaderValue) -> Option<i64> {
    match value {
        HeaderValue::Int(i) => Some(*i),
        HeaderValue::Text(s) => s.trim().parse().ok(),
        HeaderValue::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        // Whole and well inside i64's range once checked.
        #[allow(clippy::cast_possible_truncation)]
        HeaderValue::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e18 => {
            Some(*f as i64)
        }
        _ => None,
    }
}

/// Now as RFC 3339 in UTC with whole seconds (`2026-11-30T14:12:36Z`), as the family writes
/// `acemq-replayed-at` and a slip step's `completedAt`.
pub(crate) fn rfc3339_now() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(headers: &[(&str, HeaderValue)]) -> Message {
        let mut m = Message::new("x");
        for (k, v) in headers {
            m.headers.insert(k.to_string(), v.clone());
        }
        m
    }

    #[test]
    fn rfc3339_has_the_family_shape() {
        let s = rfc3339_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.ends_with('Z') && s.as_bytes()[10] == b'T', "{s}");
    }

    #[test]
    fn the_count_is_read_forgivingly_and_incremented() {
        for (v, want) in [
            (HeaderValue::Int(2), 3),
            (HeaderValue::Text("4".into()), 5),
            (HeaderValue::Bytes(b"1".to_vec()), 2),
            (HeaderValue::Bool(true), 1),
        ] {
            let m = received(&[(headers::REPLAY_COUNT, v)]);
            let copy = replayed_copy(m, "q.dlq", true);
            assert_eq!(copy.headers[headers::REPLAY_COUNT], HeaderValue::Int(want));
        }
    }

    #[test]
    fn destinations_follow_what_the_message_says() {
        let ours = received(&[
            (
                headers::ORIGINAL_EXCHANGE,
                HeaderValue::Text("orders".into()),
            ),
            (
                headers::ORIGINAL_ROUTING_KEY,
                HeaderValue::Text("order.placed".into()),
            ),
            (headers::ORIGINAL_QUEUE, HeaderValue::Text("o".into())),
        ]);
        let d = |m: &Message, x: Option<&str>, k: Option<&str>| destination(m, "o.dlq", x, k);
        assert_eq!(
            d(&ours, None, None).unwrap(),
            ("orders".into(), "order.placed".into())
        );
        assert_eq!(
            d(&ours, Some(""), None).unwrap(),
            ("".into(), "order.placed".into())
        );
        assert_eq!(
            d(&ours, None, Some("k")).unwrap(),
            ("orders".into(), "k".into())
        );
        let direct = received(&[
            (headers::ORIGINAL_EXCHANGE, HeaderValue::Text("".into())),
            (headers::ORIGINAL_ROUTING_KEY, HeaderValue::Text("o".into())),
            (headers::ORIGINAL_QUEUE, HeaderValue::Text("o".into())),
        ]);
        assert_eq!(d(&direct, None, None).unwrap(), ("".into(), "o".into()));
        let bare = received(&[]);
        assert_eq!(d(&bare, None, None).unwrap(), ("".into(), "o".into()));
        assert!(destination(&bare, "elsewhere", None, None).is_err());
        assert!(destination(&bare, "o.dlq", Some(""), Some("o.dlq")).is_err());
    }

    #[test]
    fn broker_dead_letters_go_back_where_they_were_published() {
        let mut death = std::collections::BTreeMap::new();
        death.insert("queue".to_string(), HeaderValue::Text("work".into()));
        death.insert(
            "routing-keys".to_string(),
            HeaderValue::Array(vec![HeaderValue::Text("job.new".into())]),
        );
        let m = received(&[
            ("x-first-death-queue", HeaderValue::Text("work".into())),
            ("x-first-death-exchange", HeaderValue::Text("jobs".into())),
            (
                "x-death",
                HeaderValue::Array(vec![HeaderValue::Table(death)]),
            ),
        ]);
        assert_eq!(
            destination(&m, "dead", None, None).unwrap(),
            ("jobs".into(), "job.new".into())
        );
    }
}
