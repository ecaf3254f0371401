//! Dead-lettering (`x-dead-letter-exchange`, `-routing-key`) on reject or nack without
//! requeue (`rejected`), expiry (`expired`) and `x-max-length` (`maxlen`), with `x-death` as
//! RabbitMQ 3.10 writes it (`rabbit_dead_letter`): an array of tables, newest first, an entry
//! for the same queue and reason counted up and moved to the front, `x-first-death-*` set
//! once; the `expiration` property removed (kept as `original-expiration`). A cycle with no
//! `rejected` in it is dropped; a missing dead-letter exchange drops the message.

use std::time::{SystemTime, UNIX_EPOCH};

use super::state::Msg;
use super::state::State;
use crate::transport::{AmqpProperties, AmqpValue, FieldTable};

fn text(s: &str) -> AmqpValue {
    AmqpValue::LongString(s.to_string())
}

fn entry_is(entry: &AmqpValue, key: &str, value: &str) -> bool {
    matches!(entry, AmqpValue::FieldTable(t)
        if matches!(t.get(key), Some(AmqpValue::LongString(v)) if v == value))
}

/// The properties with `expiration` removed and `headers` replaced.
fn without_expiration(p: &AmqpProperties, headers: FieldTable) -> AmqpProperties {
    let mut out = AmqpProperties::default().with_headers(headers);
    if let Some(v) = p.content_type() {
        out = out.with_content_type(v.clone());
    }
    if let Some(v) = p.content_encoding() {
        out = out.with_content_encoding(v.clone());
    }
    if let Some(v) = p.delivery_mode() {
        out = out.with_delivery_mode(*v);
    }
    if let Some(v) = p.priority() {
        out = out.with_priority(*v);
    }
    if let Some(v) = p.correlation_id() {
        out = out.with_correlation_id(v.clone());
    }
    if let Some(v) = p.reply_to() {
        out = out.with_reply_to(v.clone());
    }
    if let Some(v) = p.message_id() {
        out = out.with_message_id(v.clone());
    }
    if let Some(v) = p.timestamp() {
        out = out.with_timestamp(*v);
    }
    if let Some(v) = p.type_() {
        out = out.with_type_(v.clone());
    }
    if let Some(v) = p.user_id() {
        out = out.with_user_id(v.clone());
    }
    if let Some(v) = p.app_id() {
        out = out.with_app_id(v.clone());
    }
    if let Some(v) = p.cluster_id() {
        out = out.with_cluster_id(v.clone());
    }
    out
}

/// The headers with this death recorded.
fn record_death(
    st: &State,
    headers: &FieldTable,
    queue: &str,
    msg: &Msg,
    reason: &str,
) -> FieldTable {
    let mut headers = headers.clone();
    let seconds = (SystemTime::now() + st.offset)
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut info = FieldTable::new();
    info.insert("count".into(), AmqpValue::LongLongInt(1));
    info.insert("reason".into(), text(reason));
    info.insert("queue".into(), text(queue));
    info.insert("time".into(), AmqpValue::Timestamp(seconds));
    info.insert("exchange".into(), text(&msg.exchange));
    info.insert(
        "routing-keys".into(),
        AmqpValue::FieldArray(vec![text(&msg.routing_key)]),
    );
    if let Some(e) = msg.properties.expiration() {
        info.insert("original-expiration".into(), text(e));
    }
    let deaths = match headers.get("x-death") {
        Some(AmqpValue::FieldArray(entries)) => {
            let (mut same, others): (Vec<AmqpValue>, Vec<AmqpValue>) = entries
                .iter()
                .cloned()
                .partition(|e| entry_is(e, "queue", queue) && entry_is(e, "reason", reason));
            let front = match same.pop() {
                Some(AmqpValue::FieldTable(mut t)) => {
                    let n = t.get("count").and_then(super::reply::integer).unwrap_or(0);
                    t.insert(
                        "count".into(),
                        AmqpValue::LongLongInt(i64::try_from(n + 1).unwrap_or(i64::MAX)),
                    );
                    t
                }
                _ => info,
            };
            let mut all = vec![AmqpValue::FieldTable(front)];
            all.extend(others);
            all
        }
        _ => {
            headers.insert("x-first-death-reason".into(), text(reason));
            headers.insert("x-first-death-queue".into(), text(queue));
            headers.insert("x-first-death-exchange".into(), text(&msg.exchange));
            vec![AmqpValue::FieldTable(info)]
        }
    };
    headers.insert("x-death".into(), AmqpValue::FieldArray(deaths));
    headers
}

/// RabbitMQ's cycle check: `target` is already in the deaths and no `rejected` death lies
/// between (the entry for `target` included).
fn is_cycle(deaths: &[AmqpValue], target: &str) -> bool {
    let Some(at) = deaths.iter().position(|e| entry_is(e, "queue", target)) else {
        return false;
    };
    deaths[..=at]
        .iter()
        .all(|e| !entry_is(e, "reason", "rejected"))
}

impl State {
    /// Dead-letters `msg`, which left `queue` for `reason`, if the queue has a dead-letter
    /// exchange (that exists).
    pub(super) fn dead_letter(&mut self, queue: &str, msg: Msg, reason: &str) {
        let Some(q) = self.queues.get(queue) else {
            return;
        };
        let Some(dlx) = q.dlx.clone() else {
            return;
        };
        let key = q.dlrk.clone().unwrap_or_else(|| msg.routing_key.clone());
        if !self.exchange_exists(&dlx) {
            return;
        }
        let empty = FieldTable::new();
        let old = msg.properties.headers().as_ref().unwrap_or(&empty);
        let headers = record_death(self, old, queue, &msg, reason);
        let deaths = match headers.get("x-death") {
            Some(AmqpValue::FieldArray(d)) => d.clone(),
            _ => Vec::new(),
        };
        let targets = self.route(&dlx, &key, Some(&headers));
        let properties = without_expiration(&msg.properties, headers);
        let seq = self.next_seq();
        for target in targets {
            if reason != "rejected" && is_cycle(&deaths, &target) {
                continue;
            }
            let copy = Msg {
                seq,
                exchange: dlx.clone(),
                routing_key: key.clone(),
                body: msg.body.clone(),
                properties: properties.clone(),
                redelivered: false,
                expiration: None,
                deadline: None,
            };
            self.enqueue(&target, copy);
        }
    }
}
