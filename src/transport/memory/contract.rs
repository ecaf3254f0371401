//! Contract tests: one body run over the memory broker and over the real RabbitMQ
//! (127.0.0.1:5672, guest/guest; a test fails when it is unreachable), for what RabbitMQ shows
//! deterministically. Each body asserts what it must and returns what it saw (texts and codes
//! included); the two sides' observations must be equal.

use std::time::{Duration, Instant};

use crate::transport::{
    AmqpError, AmqpProperties, AmqpTransport, AmqpValue, Channel, Confirm, ConsumerMessage,
    ConsumerOptions, Delivery, ExchangeDeclareOptions, ExchangeType, FieldTable, Publish,
    QueueDeclareOptions, QueueDeleteOptions, Transport,
};

/// One call tried on a fresh channel.
type Attempt<'a, T> = Box<dyn Fn(&Channel) -> Result<T, AmqpError> + 'a>;

const REAL: &str = "amqp://guest:guest@127.0.0.1:5672";

/// One side of a contract test: a way to connect, and the names to delete at the end.
pub(super) struct Side {
    memory: Option<String>,
    case: String,
    stamp: String,
    queues: std::cell::RefCell<Vec<String>>,
    exchanges: std::cell::RefCell<Vec<String>>,
}

impl Side {
    fn new(memory: bool, case: &str) -> Side {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let stamp = format!("{}.{nanos}", std::process::id());
        Side {
            memory: memory.then(|| format!("contract.{case}.{stamp}")),
            case: case.to_string(),
            stamp,
            queues: Default::default(),
            exchanges: Default::default(),
        }
    }

    pub(super) fn connect(&self) -> Box<dyn Transport> {
        match &self.memory {
            Some(name) => super::connect(name, None).expect("memory connect").0,
            None => Box::new(AmqpTransport(
                amiquip::Connection::insecure_open(REAL)
                    .unwrap_or_else(|e| panic!("RabbitMQ at {REAL} is needed: {e}")),
            )),
        }
    }

    /// A unique queue name (deleted at the end); `short` is what observations show.
    pub(super) fn queue(&self, short: &str) -> String {
        let n = format!("test.mem.{}.{short}.{}", self.case, self.stamp);
        self.queues.borrow_mut().push(n.clone());
        n
    }

    pub(super) fn exchange(&self, short: &str) -> String {
        let n = format!("test.mem.{}.{short}.{}", self.case, self.stamp);
        self.exchanges.borrow_mut().push(n.clone());
        n
    }

    /// A text with this side's names shortened back (`test.mem.case.q.stamp` → `q`).
    pub(super) fn plain(&self, s: &str) -> String {
        let mut out = s.replace(&format!(".{}", self.stamp), "");
        out = out.replace(&format!("test.mem.{}.", self.case), "");
        out
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let mut t = self.connect();
        if let Ok(ch) = t.open_channel() {
            for q in self.queues.borrow().iter() {
                let _ = ch.queue_delete(q, QueueDeleteOptions::default());
            }
            for x in self.exchanges.borrow().iter() {
                let _ = ch.exchange_delete(x, false);
            }
            let _ = ch.close();
        }
        let _ = t.close();
    }
}

/// Runs `body` on both transports; their observations must be equal.
pub(super) fn both(case: &str, body: impl Fn(&Side) -> Vec<String>) {
    let memory = Side::new(true, case);
    let seen_memory = body(&memory);
    drop(memory);
    let real = Side::new(false, case);
    let seen_real = body(&real);
    drop(real);
    assert_eq!(seen_memory, seen_real, "memory (left) and RabbitMQ (right) differ");
}

/// An error as observed: a channel refusal's code and text, else the variant.
pub(super) fn seen(side: &Side, e: AmqpError) -> String {
    match e {
        AmqpError::ServerClosedChannel { code, message, .. } => {
            format!("{code} {}", side.plain(&message))
        }
        e => format!("{e:?}"),
    }
}

pub(super) fn args(pairs: &[(&str, AmqpValue)]) -> FieldTable {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

pub(super) fn declare(ch: &Channel, q: &str, arguments: FieldTable) {
    ch.queue_declare(q, QueueDeclareOptions { arguments, ..Default::default() })
        .expect("declare");
}

pub(super) fn send(ch: &Channel, exchange: &str, key: &str, body: &str, props: AmqpProperties) {
    ch.basic_publish(exchange, Publish::with_properties(body.as_bytes(), key, props))
        .expect("publish");
}

/// `basic.get` until something comes or the deadline passes (a publish is asynchronous).
pub(super) fn get_within(ch: &Channel, q: &str, no_ack: bool) -> Option<crate::transport::Get> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(g) = ch.basic_get(q, no_ack).expect("get") {
            return Some(g);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::yield_now();
    }
}

/// Waits (deadline 5 s) until the queue's depth is `n`.
pub(super) fn wait_depth(ch: &Channel, q: &str, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let depth = ch.queue_declare_passive(q).expect("passive").message_count();
        if depth == n {
            return;
        }
        assert!(Instant::now() < deadline, "{q}: depth {depth}, waited for {n}");
        std::thread::yield_now();
    }
}

fn body_of(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.body).into_owned()
}

/// A header value's shape: its type, and its value except for times.
fn shape(side: &Side, v: &AmqpValue) -> String {
    match v {
        AmqpValue::Timestamp(_) => "timestamp".into(),
        AmqpValue::LongString(s) => format!("'{}'", side.plain(s)),
        AmqpValue::FieldArray(a) => {
            let items: Vec<String> = a.iter().map(|v| shape(side, v)).collect();
            format!("[{}]", items.join(", "))
        }
        AmqpValue::FieldTable(t) => {
            let items: Vec<String> = t.iter().map(|(k, v)| format!("{k}: {}", shape(side, v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        v => format!("{v:?}"),
    }
}

fn headers_shape(side: &Side, d: &Delivery) -> Vec<String> {
    let mut out = vec![format!("expiration {:?}", d.properties.expiration())];
    if let Some(h) = d.properties.headers() {
        for (k, v) in h {
            out.push(format!("{k} = {}", shape(side, v)));
        }
    }
    out
}

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
            ch.exchange_declare(kind, &x, ExchangeDeclareOptions::default()).unwrap();
            let q1 = s.queue(&format!("{name}1"));
            let q2 = s.queue(&format!("{name}2"));
            declare(&ch, &q1, FieldTable::new());
            declare(&ch, &q2, FieldTable::new());
            let hargs = args(&[("x-match", AmqpValue::LongString("any".into())), ("a", AmqpValue::LongString("1".into())), ("b", AmqpValue::LongInt(2))]);
            let bind_args = if name == "headers" { hargs } else { FieldTable::new() };
            ch.queue_bind(&q1, &x, key, bind_args).unwrap();
            let other = if name == "topic" { "#.z" } else { "k.b" };
            let other_args = if name == "headers" { args(&[("c", AmqpValue::Void)]) } else { FieldTable::new() };
            ch.queue_bind(&q2, &x, other, other_args).unwrap();
            for (i, rk) in ["k.a", "k.b", "k.a.z", "y.z"].iter().enumerate() {
                let headers = match i {
                    0 => args(&[("b", AmqpValue::LongLongInt(2))]),
                    1 => args(&[("c", AmqpValue::LongString("x".into()))]),
                    2 => args(&[("a", AmqpValue::LongString("1".into())), ("c", AmqpValue::Boolean(true))]),
                    _ => FieldTable::new(),
                };
                send(&ch, &x, rk, &format!("m{i}"), AmqpProperties::default().with_headers(headers));
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
            let p = Publish { body: b"x", routing_key: key.into(), mandatory, immediate: false, properties: AmqpProperties::default() };
            ch.basic_publish("", p).unwrap();
            let c = confirms.recv_timeout(Duration::from_secs(5)).expect("a confirm");
            let r = returns.try_recv().ok().map(|r| format!("{} {} {:?}", r.reply_code, r.reply_text, s.plain(&r.routing_key)));
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
fn queue_declare_conflicts_name_the_argument() {
    both("qconflict", |s| {
        let mut t = s.connect();
        let mut out = Vec::new();
        let q = s.queue("q");
        let ch = t.open_channel().unwrap();
        declare(&ch, &q, args(&[("x-message-ttl", AmqpValue::LongInt(1000))]));
        let tries = [
            (false, false, FieldTable::new()),
            (false, false, args(&[("x-message-ttl", AmqpValue::LongInt(2000))])),
            (false, false, args(&[("x-message-ttl", AmqpValue::LongLongInt(1000))])),
            (true, false, args(&[("x-message-ttl", AmqpValue::LongInt(1000))])),
            (false, true, args(&[("x-message-ttl", AmqpValue::LongInt(1000))])),
            (false, false, args(&[("x-message-ttl", AmqpValue::LongInt(1000)), ("x-max-length", AmqpValue::LongInt(3))])),
        ];
        for (durable, auto_delete, arguments) in tries {
            let ch = t.open_channel().unwrap();
            let r = ch.queue_declare(&q, QueueDeclareOptions { durable, auto_delete, exclusive: false, arguments });
            out.push(match r {
                Ok(state) => format!("ok {}", state.message_count()),
                Err(e) => seen(s, e),
            });
        }
        let fresh = s.queue("fresh");
        let ch = t.open_channel().unwrap();
        let r = ch.queue_declare(&fresh, QueueDeclareOptions { arguments: args(&[("x-message-ttl", AmqpValue::LongInt(-1))]), ..Default::default() });
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
        ch.exchange_declare(ExchangeType::Direct, &x, ExchangeDeclareOptions::default()).unwrap();
        declare(&ch, &q, FieldTable::new());
        let attempts: Vec<Attempt<'_, ()>> = vec![
            Box::new(|ch| ch.exchange_declare(ExchangeType::Fanout, &x, ExchangeDeclareOptions::default())),
            Box::new(|ch| ch.exchange_declare(ExchangeType::Direct, &x, ExchangeDeclareOptions { durable: true, ..Default::default() })),
            Box::new(|ch| ch.exchange_declare(ExchangeType::Direct, &x, ExchangeDeclareOptions { auto_delete: true, ..Default::default() })),
            Box::new(|ch| ch.exchange_declare(ExchangeType::Direct, "amq.test.mem.reserved", ExchangeDeclareOptions::default())),
            Box::new(|ch| ch.exchange_declare(ExchangeType::Direct, "amq.direct", ExchangeDeclareOptions { durable: true, ..Default::default() })),
            Box::new(|ch| ch.queue_bind(&q, "", "k", FieldTable::new())),
            Box::new(|ch| ch.exchange_delete(&x, false)),
            Box::new(|ch| ch.exchange_delete(&x, false)),
        ];
        for f in attempts {
            let ch = t.open_channel().unwrap();
            out.push(f(&ch).map(|()| "ok".to_string()).unwrap_or_else(|e| seen(s, e)));
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
            Box::new(|ch| ch.queue_bind(&real_q, &x, "k", FieldTable::new()).map(|_| "ok".into())),
            Box::new(|ch| ch.queue_bind(&q, "amq.direct", "k", FieldTable::new()).map(|_| "ok".into())),
            Box::new(|ch| ch.basic_consume(&q, ConsumerOptions::default()).map(|_| "ok".into())),
            Box::new(|ch| ch.basic_get(&q, false).map(|_| "ok".into())),
            Box::new(|ch| ch.queue_purge(&q).map(|n| format!("ok {n}"))),
            Box::new(|ch| ch.queue_delete(&q, QueueDeleteOptions::default()).map(|n| format!("ok {n}"))),
        ];
        for f in attempts {
            let ch = t.open_channel().unwrap();
            out.push(f(&ch).unwrap_or_else(|e| seen(s, e)));
        }
        let ch = t.open_channel().unwrap();
        let r = ch.basic_publish(&x, Publish::new(b"x", "k"));
        out.push(format!("publish: {:?}", r.map_err(|e| seen(s, e))));
        let r = ch.queue_declare_passive(&real_q);
        out.push(format!("then: {}", r.map(|_| "ok".to_string()).unwrap_or_else(|e| seen(s, e))));
        let ch = t.open_channel().unwrap();
        let p = AmqpProperties::default().with_expiration("soon".into());
        ch.basic_publish("", Publish::with_properties(b"x", real_q.clone(), p)).unwrap();
        let r = ch.queue_declare_passive(&real_q);
        out.push(format!("bad expiration: {}", r.map(|_| "ok".to_string()).unwrap_or_else(|e| seen(s, e))));
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
        let mut got: Vec<Delivery> = (0..3).map(|_| get_within(&ch, &q, false).unwrap().delivery).collect();
        out.push(format!("tags {:?}", got.iter().map(|d| d.delivery_tag()).collect::<Vec<_>>()));
        let third = got.pop().unwrap();
        let second = got.pop().unwrap();
        second.ack_multiple(&ch).unwrap();
        let state = ch.queue_declare_passive(&q).unwrap();
        out.push(format!("ready {}", state.message_count()));
        // The consumer's deliveries continue the channel's tags.
        let consumer = ch.basic_consume(&q, ConsumerOptions::default()).unwrap();
        let mut tags = Vec::new();
        for _ in 0..2 {
            match consumer.receiver().recv_timeout(Duration::from_secs(5)).unwrap() {
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
        let d = get_within(&ch2, &q, false);
        out.push(format!("left {:?}", d.as_ref().map(|g| body_of(&g.delivery))));
        send(&ch2, "", &q, "again", AmqpProperties::default());
        let g = get_within(&ch2, &q, false).unwrap();
        let tag = g.delivery.delivery_tag();
        g.delivery.ack(&ch2).unwrap();
        // Acking tag 1 on a channel whose tag 1 is settled: 406, the channel closes.
        let again = get_within(&ch2, &q, true);
        out.push(format!("tag {tag}, then {:?}", again.map(|g| g.delivery.delivery_tag())));
        let r = ch2.nack_all(true);
        out.push(format!("nack_all with none unacked: {:?}", r.map_err(|e| seen(s, e))));
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
        out.push(format!("b again: {} tag {} redelivered {}", body_of(&b2), b2.delivery_tag(), b2.redelivered));
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
        out.push(format!("after close: {} redelivered {} left {}", body_of(&first.delivery), first.delivery.redelivered, first.message_count));
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
        let mut out = vec![format!("counts {} {} {}", a.message_count, b.message_count, c.message_count)];
        c.delivery.nack(&ch, true).unwrap();
        a.delivery.nack(&ch, true).unwrap();
        b.delivery.ack(&ch).unwrap();
        wait_depth(&ch, &q, 3);
        while let Some(g) = ch.basic_get(&q, true).unwrap() {
            out.push(format!("{} redelivered {} left {}", body_of(&g.delivery), g.delivery.redelivered, g.message_count));
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
        ch.exchange_declare(ExchangeType::Direct, &dlx, ExchangeDeclareOptions::default()).unwrap();
        declare(&ch, &dlq, FieldTable::new());
        ch.queue_bind(&dlq, &dlx, "dead", FieldTable::new()).unwrap();
        declare(&ch, &q, args(&[
            ("x-dead-letter-exchange", AmqpValue::LongString(dlx.clone())),
            ("x-dead-letter-routing-key", AmqpValue::LongString("dead".into())),
        ]));
        let props = AmqpProperties::default()
            .with_expiration("60000".into())
            .with_message_id("id-1".into())
            .with_headers(args(&[("mine", AmqpValue::LongInt(7))]));
        send(&ch, "", &q, "m", props);
        let mut out = Vec::new();
        let g = get_within(&ch, &q, false).unwrap();
        g.delivery.reject(&ch, false).unwrap();
        let d = get_within(&ch, &dlq, false).unwrap().delivery;
        out.push(format!("exchange {} key {} id {:?}", s.plain(&d.exchange), d.routing_key, d.properties.message_id()));
        out.extend(headers_shape(s, &d));
        // Round two: published back to the queue as it came, rejected again: counted up.
        let props = d.properties.clone();
        d.ack(&ch).unwrap();
        send(&ch, "", &q, "m", props);
        get_within(&ch, &q, false).unwrap().delivery.nack(&ch, false).unwrap();
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
        declare(&ch, &q, args(&[
            ("x-message-ttl", AmqpValue::LongInt(5)),
            ("x-dead-letter-exchange", AmqpValue::LongString(String::new())),
            ("x-dead-letter-routing-key", AmqpValue::LongString(dlq.clone())),
        ]));
        send(&ch, "", &held, "long", AmqpProperties::default().with_expiration("600000".into()));
        send(&ch, "", &held, "short", AmqpProperties::default().with_expiration("1".into()));
        send(&ch, "", &q, "ttl", AmqpProperties::default().with_expiration("3".into()));
        let mut out = Vec::new();
        let d = get_within(&ch, &dlq, true).expect("the expired message dead-lettered").delivery;
        out.push(body_of(&d));
        out.extend(headers_shape(s, &d));
        // `short` expired long ago but waits behind `long`: still counted, never delivered.
        out.push(format!("held depth {}", ch.queue_declare_passive(&held).unwrap().message_count()));
        let g = ch.basic_get(&held, true).unwrap().unwrap();
        out.push(format!("{} left {}", body_of(&g.delivery), g.message_count));
        out.push(format!("then {:?}", ch.basic_get(&held, true).unwrap().map(|g| body_of(&g.delivery))));
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
        ch.queue_declare(&q, QueueDeclareOptions { exclusive: true, ..Default::default() }).unwrap();
        let mut out = Vec::new();
        let attempts: Vec<Attempt<'_, String>> = vec![
            Box::new(|c| c.queue_declare_passive(&q).map(|_| "ok".into())),
            Box::new(|c| c.queue_declare(&q, QueueDeclareOptions { exclusive: true, ..Default::default() }).map(|_| "ok".into())),
            Box::new(|c| c.basic_consume(&q, ConsumerOptions::default()).map(|_| "ok".into())),
            Box::new(|c| c.queue_delete(&q, QueueDeleteOptions::default()).map(|n| format!("ok {n}"))),
        ];
        for f in &attempts {
            let c = other.open_channel().unwrap();
            out.push(f(&c).unwrap_or_else(|e| seen(s, e)));
        }
        let r = ch.queue_declare(&q, QueueDeclareOptions::default()).map(|_| "ok".to_string());
        out.push(format!("owner, not exclusive: {}", r.unwrap_or_else(|e| seen(s, e))));
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
        out.push(format!("after close: {}", r.map(|_| "ok".to_string()).unwrap_or_else(|e| seen(s, e))));
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
        out.push(format!("{:?}", c.queue_delete(&q, QueueDeleteOptions { if_empty: true, if_unused: false }).map_err(|e| seen(s, e))));
        let holder = t.open_channel().unwrap();
        let consumer = holder.basic_consume(&q, ConsumerOptions { no_ack: true, ..Default::default() }).unwrap();
        let mut said = Vec::new();
        match consumer.receiver().recv_timeout(Duration::from_secs(5)).unwrap() {
            ConsumerMessage::Delivery(d) => said.push(body_of(&d)),
            other => panic!("{other:?}"),
        }
        let c = t.open_channel().unwrap();
        out.push(format!("{:?}", c.basic_consume(&q, ConsumerOptions { exclusive: true, ..Default::default() }).map(|_| ()).map_err(|e| seen(s, e))));
        let c = t.open_channel().unwrap();
        out.push(format!("{:?}", c.queue_delete(&q, QueueDeleteOptions { if_empty: false, if_unused: true }).map_err(|e| seen(s, e))));
        let c = t.open_channel().unwrap();
        out.push(format!("{:?}", c.queue_delete(&q, QueueDeleteOptions::default()).map_err(|e| seen(s, e))));
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
