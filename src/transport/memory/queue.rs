//! Queues: declare (server-named, exclusive, auto-delete, the arguments implemented and the
//! equivalence of a redeclare, `x-queue-type` read back as the major does), passive, purge,
//! delete; ready messages in order, a return to its place (a classic queue) or, counted against
//! the delivery limit, to the head (a quorum queue with a limit: 4.x's default) or the tail (one
//! without: 3.x's default); expiry at the head, `x-max-length` with `x-overflow`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::reply::{
    access_refused, bare_value, inequivalent, integer, locked, no_queue, not_emulated,
    precondition, same_value, type_name, value_text, Refusal, Refused,
};
use super::state::{Msg, Queue, State};
use crate::transport::{
    AmqpProperties, AmqpValue, ConsumerMessage, QueueDeclareOptions, QueueDeleteOptions, QueueState,
};

/// The arguments RabbitMQ compares on a redeclare, in its order, that this broker implements
/// (the others are refused before any comparison).
const COMPARED: &[&str] = &[
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-overflow",
    "x-queue-type",
    "x-delivery-limit",
];

/// A quorum queue's delivery limit when `x-delivery-limit` is not given: 20 on RabbitMQ 4.x,
/// none on 3.x.
const DEFAULT_DELIVERY_LIMIT: u64 = 20;

/// What a feature RabbitMQ has and this broker does not is called in its refusal.
fn unemulated_argument(key: &str, value: &AmqpValue) -> String {
    let feature = match key {
        "x-queue-type" => match value {
            AmqpValue::LongString(t) => return format!("x-queue-type '{t}' ({t} queues)"),
            _ => "queue types",
        },
        "x-max-length-bytes" => "a queue's length limit in bytes",
        "x-max-priority" => "priority queues",
        "x-expires" => "queue expiry",
        "x-single-active-consumer" => "single active consumer",
        "x-overflow" => "x-overflow 'reject-publish-dlx'",
        _ => "",
    };
    if feature.is_empty() {
        format!("the queue argument '{key}'")
    } else {
        format!("the queue argument '{key}' ({feature})")
    }
}

fn invalid(key: &str, queue: &str, why: String) -> Refusal {
    precondition(format!(
        "invalid arg '{key}' for queue '{queue}' in vhost '/': {why}"
    ))
}

fn non_negative(key: &str, queue: &str, v: &AmqpValue) -> Refused<u64> {
    match integer(v) {
        None => Err(invalid(
            key,
            queue,
            format!("\"expected integer, got {}\"", type_name(v)),
        )),
        Some(n) if n < 0 => Err(invalid(key, queue, format!("{{value_negative,{n}}}"))),
        Some(n) => Ok(u64::try_from(n).unwrap_or(u64::MAX)),
    }
}

/// A string argument; another type is refused in RabbitMQ's other form.
fn text(key: &str, queue: &str, v: &AmqpValue) -> Refused<String> {
    match v {
        AmqpValue::LongString(s) => Ok(s.clone()),
        v => Err(precondition(format!(
            "invalid type '{}' for arg '{key}' in queue '{queue}' in vhost '/'",
            type_name(v)
        ))),
    }
}

impl Queue {
    /// A new queue from its declare, its arguments checked: the implemented ones parsed,
    /// every other `x-` argument refused (540). On 4.x a queue declared without `x-queue-type`
    /// keeps `x-queue-type: classic` among its arguments, and a quorum queue has a delivery
    /// limit of 20 unless `x-delivery-limit` says otherwise.
    fn new(name: &str, o: &QueueDeclareOptions, owner: Option<u64>, major: u8) -> Refused<Queue> {
        let mut q = Queue {
            durable: o.durable,
            owner,
            auto_delete: o.auto_delete,
            arguments: o.arguments.clone(),
            ttl: None,
            dlx: None,
            dlrk: None,
            max_len: None,
            reject_publish: false,
            ready: VecDeque::new(),
            consumers: Vec::new(),
            rr: 0,
            had_consumer: false,
            quorum: false,
            delivery_limit: None,
        };
        let mut limit = None;
        for (key, v) in &o.arguments {
            match key.as_str() {
                "x-message-ttl" => q.ttl = Some(non_negative(key, name, v)?),
                "x-dead-letter-exchange" => q.dlx = Some(text(key, name, v)?),
                "x-dead-letter-routing-key" => q.dlrk = Some(text(key, name, v)?),
                "x-max-length" => {
                    q.max_len =
                        Some(usize::try_from(non_negative(key, name, v)?).unwrap_or(usize::MAX))
                }
                "x-overflow" => match text(key, name, v)?.as_str() {
                    "drop-head" => {}
                    "reject-publish" => q.reject_publish = true,
                    "reject-publish-dlx" => return Err(not_emulated(&unemulated_argument(key, v))),
                    _ => return Err(invalid(key, name, "invalid_overflow".into())),
                },
                "x-queue-type" => match text(key, name, v)?.as_str() {
                    "classic" => {}
                    "quorum" => q.quorum = true,
                    "stream" => return Err(not_emulated(&unemulated_argument(key, v))),
                    other => {
                        return Err(invalid(
                            key,
                            name,
                            format!("{{unsupported_queue_type,{other}}}"),
                        ))
                    }
                },
                // Any value is taken; only an integer limits (RabbitMQ checks no type).
                "x-delivery-limit" => limit = Some(integer(v)),
                k if k.starts_with("x-") => return Err(not_emulated(&unemulated_argument(k, v))),
                _ => {}
            }
        }
        q.delivery_limit = match limit {
            Some(_) if !q.quorum => {
                return Err(precondition(format!(
                    "invalid arg 'x-delivery-limit' for queue '{name}' in vhost '/' of queue \
                     type rabbit_classic_queue"
                )))
            }
            // 4.x: a negative limit is none; 3.x counts a first return past it.
            Some(Some(n)) if n < 0 => (major < 4).then_some(0),
            Some(Some(n)) => Some(u64::try_from(n).unwrap_or(u64::MAX)),
            // Taken as a limit (so returns go to the head) that a count never passes.
            Some(None) => Some(u64::MAX),
            None => (q.quorum && major >= 4).then_some(DEFAULT_DELIVERY_LIMIT),
        };
        if major >= 4 && !q.arguments.contains_key("x-queue-type") {
            q.arguments.insert(
                "x-queue-type".into(),
                AmqpValue::LongString("classic".into()),
            );
        }
        if q.dlrk.is_some() && q.dlx.is_none() {
            return Err(invalid(
                "x-dead-letter-routing-key",
                name,
                "routing_key_but_no_dlx_defined".into(),
            ));
        }
        Ok(q)
    }

    /// A new quorum queue's properties: exclusive, auto-delete and transient ones refused
    /// (checked when it is made, not on a redeclaration, which is compared first).
    fn check_properties(&self, name: &str, o: &QueueDeclareOptions) -> Refused<()> {
        if !self.quorum {
            return Ok(());
        }
        for (property, set) in [("exclusive", o.exclusive), ("auto-delete", o.auto_delete)] {
            if set {
                return Err(invalid_property(property, name));
            }
        }
        if !o.durable {
            return Err(invalid_property("non-durable", name));
        }
        Ok(())
    }

    /// Refuses another connection's exclusive queue (405).
    pub(super) fn check_owner(&self, conn: u64, name: &str) -> Refused<()> {
        match self.owner {
            Some(owner) if owner != conn => Err(locked(name)),
            _ => Ok(()),
        }
    }

    fn state(&self, name: &str) -> QueueState {
        QueueState {
            name: name.to_string(),
            message_count: u32::try_from(self.ready.len()).unwrap_or(u32::MAX),
            consumer_count: u32::try_from(self.consumers.len()).unwrap_or(u32::MAX),
        }
    }

    /// A redeclare against this queue: exclusivity, durable, auto_delete, then the arguments.
    fn equivalent(&self, name: &str, conn: u64, o: &QueueDeclareOptions, major: u8) -> Refused<()> {
        let what = format!("queue '{name}'");
        match self.owner {
            Some(owner) if owner != conn || !o.exclusive => return Err(locked(name)),
            None if o.exclusive => return Err(locked(name)),
            _ => {}
        }
        for (arg, now, was) in [
            ("durable", o.durable, self.durable),
            ("auto_delete", o.auto_delete, self.auto_delete),
        ] {
            if now != was {
                return Err(inequivalent(
                    arg,
                    &what,
                    &format!("'{now}'"),
                    &format!("'{was}'"),
                ));
            }
        }
        let classic = AmqpValue::LongString("classic".into());
        for key in COMPARED {
            let (mut new, mut old) = (o.arguments.get(*key), self.arguments.get(*key));
            if *key == "x-queue-type" {
                if major >= 4 {
                    // 4.x declares with the default type, classic, where none is given (the
                    // queue kept it among its arguments when it was made).
                    new = new.or(Some(&classic));
                } else if new.or(old).is_some_and(|v| same_value(v, &classic)) {
                    // 3.x takes a missing type and `classic` as the same, and words any other
                    // difference as it does for an argument missing on one side.
                    new = new.or(Some(&classic));
                    old = old.or(Some(&classic));
                }
            }
            let same = match (new, old) {
                (None, None) => true,
                (Some(a), Some(b)) => same_value(a, b),
                _ => false,
            };
            if let (false, Some(a), Some(b)) = (same, new, old) {
                return Err(inequivalent(key, &what, &bare_value(a), &bare_value(b)));
            }
            if !same {
                return Err(inequivalent(key, &what, &value_text(new), &value_text(old)));
            }
        }
        Ok(())
    }
}

impl State {
    /// The queue, if it exists and `conn` may use it (404, 405).
    pub(super) fn owned(&mut self, conn: u64, name: &str) -> Refused<&mut Queue> {
        match self.queues.get_mut(name) {
            None => Err(no_queue(name)),
            Some(q) => q.check_owner(conn, name).map(|()| q),
        }
    }

    pub(super) fn queue_declare(
        &mut self,
        conn: u64,
        name: &str,
        o: &QueueDeclareOptions,
    ) -> Refused<QueueState> {
        let name = if name.is_empty() {
            self.generated_name()
        } else {
            name.to_string()
        };
        if let Some(q) = self.queues.get(&name) {
            // The arguments are checked as a new declare would (a refusal before a comparison).
            Queue::new(&name, o, None, self.major)?;
            q.equivalent(&name, conn, o, self.major)?;
            return Ok(q.state(&name));
        }
        if name.starts_with("amq.") && !name.starts_with("amq.gen-") {
            return Err(access_refused(format!(
                "queue name '{name}' contains reserved prefix 'amq.*'"
            )));
        }
        let q = Queue::new(&name, o, o.exclusive.then_some(conn), self.major)?;
        q.check_properties(&name, o)?;
        let state = q.state(&name);
        self.queues.insert(name, q);
        Ok(state)
    }

    fn generated_name(&mut self) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut x = nanos ^ (u128::from(self.fresh_id()) << 64) ^ 0x9e37_79b9_7f4a_7c15;
        let mut s = String::from("amq.gen-");
        for _ in 0..22 {
            x = x
                .wrapping_mul(0x2545_f491_4f6c_dd1d)
                .wrapping_add(1_442_695_040_888_963_407);
            s.push(ALPHABET[(x >> 100) as usize & 63] as char);
        }
        s
    }

    pub(super) fn queue_passive(&mut self, conn: u64, name: &str) -> Refused<QueueState> {
        self.expire(name);
        Ok(self.owned(conn, name)?.state(name))
    }

    pub(super) fn queue_purge(&mut self, conn: u64, name: &str) -> Refused<u32> {
        let q = self.owned(conn, name)?;
        let n = q.ready.len();
        q.ready.clear();
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    pub(super) fn queue_delete(
        &mut self,
        conn: u64,
        name: &str,
        o: &QueueDeleteOptions,
    ) -> Refused<u32> {
        if !self.queues.contains_key(name) {
            return Ok(0);
        }
        let q = self.owned(conn, name)?;
        if o.if_unused && !q.consumers.is_empty() {
            return Err(precondition(format!("queue '{name}' in vhost '/' in use")));
        }
        if o.if_empty && !q.ready.is_empty() {
            return Err(precondition(format!(
                "queue '{name}' in vhost '/' not empty"
            )));
        }
        Ok(self.delete_queue(name))
    }

    /// Deletes the queue: its consumers are cancelled by the server, its bindings go, its
    /// ready messages are dropped; its ready count.
    pub(super) fn delete_queue(&mut self, name: &str) -> u32 {
        let Some(q) = self.queues.remove(name) else {
            return 0;
        };
        for c in q.consumers {
            let _ = c.tx.send(ConsumerMessage::ServerCancelled);
            if let Some(ch) = self
                .conns
                .get_mut(&c.conn)
                .and_then(|x| x.channels.get_mut(&c.chan))
            {
                ch.consumers.remove(&c.tag);
            }
        }
        self.unbind_queue(name);
        u32::try_from(q.ready.len()).unwrap_or(u32::MAX)
    }

    /// Puts a message into a queue (its deadline from the queue's TTL and its expiration);
    /// false when `x-overflow reject-publish` refuses it. A `drop-head` overflow dead-letters
    /// the head (`maxlen`).
    pub(super) fn enqueue(&mut self, name: &str, mut msg: Msg) -> bool {
        let now = self.now();
        let Some(q) = self.queues.get_mut(name) else {
            return false;
        };
        if let Some(max) = q.max_len {
            if q.reject_publish && q.ready.len() >= max {
                return false;
            }
        }
        let ttl = match (q.ttl, msg.expiration) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        msg.deadline = ttl.map(|ms| now + Duration::from_millis(ms));
        // A queue counts a message's returns from 0 on entry.
        msg.returns = 0;
        q.ready.push_back(msg);
        let mut dropped = Vec::new();
        if let Some(max) = q.max_len {
            while q.ready.len() > max {
                dropped.extend(q.ready.pop_front());
            }
        }
        for m in dropped {
            self.dead_letter(name, m, "maxlen");
        }
        self.mark(name);
        true
    }

    /// A delivered message returned to its queue (gone with its queue otherwise): a classic
    /// queue puts it back in its place; a quorum queue counts the return and dead-letters it
    /// (`delivery_limit`) past its limit, else, when it has a limit (always on 4.x unless a
    /// negative one was given), puts it after the other returns at the head (they are delivered
    /// first, in the order they came back), and without one at the tail (both majors).
    pub(super) fn requeue(&mut self, name: &str, mut msg: Msg) {
        let Some(q) = self.queues.get_mut(name) else {
            return;
        };
        msg.redelivered = true;
        if q.quorum {
            msg.returns += 1;
            if q.delivery_limit.is_some_and(|limit| msg.returns > limit) {
                self.dead_letter(name, msg, "delivery_limit");
                return;
            }
            if q.delivery_limit.is_some() {
                let at = q.ready.partition_point(|m| m.redelivered);
                q.ready.insert(at, msg);
            } else {
                q.ready.push_back(msg);
            }
        } else {
            let at = q.ready.partition_point(|m| m.seq < msg.seq);
            q.ready.insert(at, msg);
        }
        self.mark(name);
    }

    /// The properties a delivery of `msg` from `queue` carries: from a quorum queue, its
    /// returns in `x-delivery-count` (a long) — on 4.x only once returned (the publisher's own
    /// header, if any, before), on 3.x from the first delivery (0).
    pub(super) fn delivered(&self, queue: &str, msg: &Msg) -> AmqpProperties {
        delivered_properties(self.major, self.queues.get(queue), msg)
    }

    /// Expires (and dead-letters, `expired`) the messages at the head whose deadline passed.
    pub(super) fn expire(&mut self, name: &str) {
        let now = self.now();
        let mut gone = Vec::new();
        if let Some(q) = self.queues.get_mut(name) {
            while q
                .ready
                .front()
                .is_some_and(|m| m.deadline.is_some_and(|d| d <= now))
            {
                gone.extend(q.ready.pop_front());
            }
        }
        for m in gone {
            self.dead_letter(name, m, "expired");
        }
    }

    /// The earliest deadline of a queue's head, over every queue.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.queues
            .values()
            .filter_map(|q| q.ready.front().and_then(|m| m.deadline))
            .min()
    }
}

/// [`State::delivered`], for a caller that holds the queue borrowed apart from the state.
pub(super) fn delivered_properties(major: u8, queue: Option<&Queue>, msg: &Msg) -> AmqpProperties {
    let quorum = queue.is_some_and(|q| q.quorum);
    if !quorum || (msg.returns == 0 && major >= 4) {
        return msg.properties.clone();
    }
    let mut headers = msg.properties.headers().clone().unwrap_or_default();
    let n = i64::try_from(msg.returns).unwrap_or(i64::MAX);
    headers.insert("x-delivery-count".into(), AmqpValue::LongLongInt(n));
    msg.properties.clone().with_headers(headers)
}

/// RabbitMQ's refusal of a quorum queue declared exclusive, auto-delete or transient.
fn invalid_property(property: &str, queue: &str) -> Refusal {
    precondition(format!(
        "invalid property '{property}' for queue '{queue}' in vhost '/'"
    ))
}
