//! Dead-lettering (`x-dead-letter-exchange`, `-routing-key`) on reject or nack without
//! requeue (`rejected`), expiry (`expired`), `x-max-length` (`maxlen`) and a quorum queue's
//! delivery limit (`delivery_limit`), with `x-death` as RabbitMQ writes it: an array of tables,
//! newest first, an entry for the same queue and reason counted up and moved to the front; the
//! `expiration` property removed (kept as `original-expiration`). RabbitMQ 3.10 counts in the
//! `x-death` header the message carries (a client's republished copy included) and sets
//! `x-first-death-*` once; RabbitMQ 4.x counts in its own record of the message's deaths only
//! (a client's `x-death` is replaced, never counted up) and writes `x-first-death-*` and
//! `x-last-death-*` at each death. A cycle with no `rejected` in it is dropped; a missing
//! dead-letter exchange drops the message.

use std::time::{SystemTime, UNIX_EPOCH};

use super::state::{Deaths, Msg, State};
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
        out = out.with_type(v.clone());
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

/// A new `x-death` entry for this death.
fn entry(st: &State, queue: &str, msg: &Msg, reason: &str) -> FieldTable {
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
    info
}

/// The entries with this death counted: the entry for the same queue and reason counted up
/// and moved to the front, else `info` in front.
fn counted(entries: &[AmqpValue], info: FieldTable, queue: &str, reason: &str) -> Vec<AmqpValue> {
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

/// RabbitMQ 3.x: the headers with this death recorded in the `x-death` they carry (a client's
/// included), `x-first-death-*` set when there was none.
fn record_in_headers(
    headers: &FieldTable,
    info: FieldTable,
    queue: &str,
    msg: &Msg,
    reason: &str,
) -> FieldTable {
    let mut headers = headers.clone();
    let deaths = match headers.get("x-death") {
        Some(AmqpValue::FieldArray(entries)) => counted(entries, info, queue, reason),
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

/// RabbitMQ 4.x: this death recorded in the broker's own record of the message (a client's
/// `x-death` header is not read), which then replaces `x-death`, `x-first-death-*` and
/// `x-last-death-*` in the headers.
fn record_beside_headers(
    headers: &FieldTable,
    info: FieldTable,
    queue: &str,
    msg: &Msg,
    reason: &str,
) -> (FieldTable, Deaths) {
    let mut deaths = msg.deaths.clone().unwrap_or_default();
    deaths.entries = counted(&deaths.entries, info, queue, reason);
    let this = [msg.exchange.clone(), queue.to_string(), reason.to_string()];
    let first = deaths.first.get_or_insert_with(|| this.clone()).clone();
    let mut headers = headers.clone();
    headers.insert(
        "x-death".into(),
        AmqpValue::FieldArray(deaths.entries.clone()),
    );
    for (which, [exchange, queue, reason]) in [("first", first), ("last", this)] {
        headers.insert(format!("x-{which}-death-exchange"), text(&exchange));
        headers.insert(format!("x-{which}-death-queue"), text(&queue));
        headers.insert(format!("x-{which}-death-reason"), text(&reason));
    }
    (headers, deaths)
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
        let info = entry(self, queue, &msg, reason);
        let (headers, record) = if self.major >= 4 {
            let (headers, record) = record_beside_headers(old, info, queue, &msg, reason);
            (headers, Some(record))
        } else {
            (record_in_headers(old, info, queue, &msg, reason), None)
        };
        let deaths = match (&record, headers.get("x-death")) {
            (Some(r), _) => r.entries.clone(),
            (None, Some(AmqpValue::FieldArray(d))) => d.clone(),
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
                returns: 0,
                deaths: record.clone(),
            };
            self.enqueue(&target, copy);
        }
    }
}
