//! The AceMQ wire contract on the real broker, driven by `tests/fixtures/envelope.json` (the
//! family's facts: header names, AMQP types, defaults, reading rules, retry names, arguments,
//! bindings and error texts). A raw amiquip client plays the foreign library: it writes exactly
//! what the family writes and reads exactly what we write.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::{
    dead_letter_queue, headers, parked_queue, retry_queue, Binding, ConnectionOptions,
    ConsumerOptions, ExchangeKind, ExchangeSpec, Message, Outcome, QueueSpec, RetryPolicy,
};
use amiquip::{AmqpProperties, AmqpValue, FieldTable};
use serde_json::Value;
use support::raw::{kind_of, text, typed, Raw};
use support::{connect, connect_with, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/envelope.json")).expect("envelope.json parses")
}

fn now_ms() -> i64 {
    acemq_amqp::now_ms()
}

/// A direct exchange `x` and a classic queue bound to it with each of `keys`.
fn exchange_and_queue(
    conn: &acemq_amqp::Connection,
    clean: &mut Cleanup,
    keys: &[&str],
) -> (String, String) {
    let x = clean.exchange(&unique("contract-x"));
    let q = clean.queue(&unique("contract-q"));
    conn.declare_exchange(&ExchangeSpec::direct(&x)).unwrap();
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    for k in keys {
        conn.bind(&Binding::new().queue(&q).exchange(&x).routing_key(*k))
            .unwrap();
    }
    (x, q)
}

fn message_from_case(publish: &Value) -> Message {
    let e = &publish["envelope"];
    let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
    let mut m = Message::new("{}").with_content_type("application/json");
    if let Some(id) = s("id") {
        m = m.with_id(id);
    }
    m.envelope.message_type = s("type");
    m.envelope.correlation_id = s("correlation_id");
    m.envelope.causation_id = s("causation_id");
    m.envelope.origin = s("origin");
    m.envelope.error = s("error");
    m.envelope.claim = s("claim");
    if let Some(v) = e.get("version").and_then(Value::as_u64) {
        m.envelope.version = v as u32;
    }
    if let Some(a) = e.get("attempt").and_then(Value::as_u64) {
        m.envelope.attempt = a as u32;
    }
    if let Some(f) = e.get("first_seen_ms").and_then(Value::as_i64) {
        m.envelope.first_seen_ms = f;
    }
    if let Some(h) = publish.get("app_headers").and_then(Value::as_object) {
        for (k, v) in h {
            m = m.with_header(k.clone(), v.as_str().unwrap());
        }
    }
    m
}

fn assert_header(table: &FieldTable, name: &str, spec: &Value, case: &str, window: (i64, i64)) {
    let got = table
        .get(name)
        .unwrap_or_else(|| panic!("{case}: header {name} is missing: {table:?}"));
    let kind = spec["type"].as_str().unwrap();
    assert_eq!(
        kind_of(got),
        kind,
        "{case}: {name} has the wrong AMQP type: {got:?}"
    );
    match &spec["value"] {
        Value::String(s) if s.starts_with("<now") => {
            let AmqpValue::LongLongInt(ms) = got else {
                unreachable!()
            };
            assert!(
                (window.0..=window.1).contains(ms),
                "{case}: {name} = {ms} is not the publish time"
            );
        }
        v => assert_eq!(got, &typed(kind, v), "{case}: {name}"),
    }
}

/// Every `write` case (but the declared route, which no public API writes yet): what our
/// publisher puts on the wire is exactly the family's header set, names and AMQP types.
#[test]
fn what_we_publish_carries_the_family_header_names_and_types() {
    let fx = fixture();
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .service("orders"),
    );
    let mut clean = Cleanup::new(&conn);
    let cases: Vec<&Value> = fx["write"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["publish"].get("route").is_none())
        .collect();
    let keys: Vec<&str> = cases
        .iter()
        .map(|c| c["publish"]["routing_key"].as_str().unwrap())
        .collect();
    let (x, q) = exchange_and_queue(&conn, &mut clean, &keys);
    let publisher = conn.publisher().unwrap();
    let raw = Raw::open();
    let host = gethostname();
    assert_eq!(conn.origin(), format!("orders@{host}"));
    for case in cases {
        let name = case["case"].as_str().unwrap();
        let key = case["publish"]["routing_key"].as_str().unwrap();
        let before = now_ms();
        publisher
            .publish(&x, key, message_from_case(&case["publish"]))
            .unwrap();
        let after = now_ms();
        let (props, _, _) = raw.get(&q).expect("the message arrived");
        let table = props.headers().clone().unwrap_or_default();
        let expected = case
            .get("headers")
            .or_else(|| case.get("headers_include"))
            .and_then(Value::as_object);
        for (h, spec) in expected.into_iter().flatten() {
            assert_header(&table, h, spec, name, (before, after));
        }
        if case.get("headers").is_some() {
            // The exact set: nothing more than the case's headers and the origin we stamp.
            for k in table.keys() {
                assert!(
                    expected.unwrap().contains_key(k) || k == headers::ORIGIN,
                    "{name}: unexpected header {k}"
                );
            }
        }
        for h in case
            .get("absent")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let h = h.as_str().unwrap();
            if h == headers::ORIGIN {
                // An envelope without an origin (empty is none) is stamped with the
                // publisher's own, as every family publisher does; checked below.
                continue;
            }
            assert!(
                !table.contains_key(h),
                "{name}: {h} must be absent: {table:?}"
            );
        }
        if !table.contains_key(headers::ORIGIN) {
            panic!("{name}: we always stamp an origin");
        }
        let own_origin = case["publish"]["envelope"]["origin"].as_str();
        if own_origin.is_none_or(str::is_empty) {
            assert_eq!(
                table.get(headers::ORIGIN),
                Some(&text(conn.origin())),
                "{name}"
            );
        }
        assert_eq!(
            props.message_id().as_deref(),
            Some(case["publish"]["envelope"]["id"].as_str().unwrap()),
            "{name}: message_id is the envelope id"
        );
        if let Some(p) = case.get("properties") {
            assert_eq!(
                props.content_type().as_deref(),
                p["content_type"].as_str(),
                "{name}"
            );
        }
        assert_eq!(props.delivery_mode(), &Some(2), "{name}: persistent");
    }
    // Java's fallback: no type and an empty routing key give the type `message`.
    let fanout = clean.exchange(&unique("contract-fanout"));
    conn.declare_exchange(&ExchangeSpec::new(&fanout, ExchangeKind::Fanout))
        .unwrap();
    conn.bind(&Binding::new().queue(&q).exchange(&fanout).routing_key(""))
        .unwrap();
    publisher.publish(&fanout, "", Message::new("{}")).unwrap();
    let (props, _, _) = raw.get(&q).expect("the message arrived");
    let table = props.headers().clone().unwrap();
    assert_eq!(table.get(headers::TYPE), Some(&text("message")));
    publisher.close().unwrap();
    raw.close();
}

fn gethostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Every `read` case: a foreign writer publishes exactly the case's headers (strings as byte
/// arrays, integers as 8-, 16-, 32- and 64-bit, decimal text) and our consumer reads the
/// envelope the family's readers read, with no reserved name among the application headers.
#[test]
fn what_the_family_writes_our_consumer_reads() {
    let fx = fixture();
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let cases = fx["read"].as_array().unwrap();
    let keys: Vec<&str> = cases
        .iter()
        .map(|c| c["routing_key"].as_str().unwrap())
        .collect();
    let (x, q) = exchange_and_queue(&conn, &mut clean, &keys);
    clean.queue(&dead_letter_queue(&q));
    clean.queue(&parked_queue(&q));
    let raw = Raw::open();
    let before = now_ms();
    for (i, case) in cases.iter().enumerate() {
        let mut table = FieldTable::new();
        for (name, spec) in case["headers"].as_object().unwrap() {
            table.insert(
                name.clone(),
                typed(spec["type"].as_str().unwrap(), &spec["value"]),
            );
        }
        table.insert("case".into(), AmqpValue::LongLongInt(i as i64));
        let mut props = AmqpProperties::default().with_headers(table);
        if let Some(id) = case.get("message_id").and_then(Value::as_str) {
            props = props.with_message_id(id.to_string());
        }
        raw.publish(&x, case["routing_key"].as_str().unwrap(), b"{}", props);
    }
    let got: Arc<Mutex<BTreeMap<i64, Message>>> = Arc::default();
    let g = got.clone();
    // Enough attempts for the cases that arrive at attempt 5 (a message past the policy's last
    // attempt is dead-lettered unhandled).
    let policy = RetryPolicy::fixed(10, Duration::from_secs(1));
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(policy))
        .unwrap()
        .start(move |m: &Message| {
            let i = m.headers["case"].as_i64().unwrap();
            g.lock().unwrap().insert(i, m.clone());
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(eventually(WAIT, || got.lock().unwrap().len() == cases.len()));
    consumer.close().unwrap();
    let after = now_ms();
    let got = got.lock().unwrap();
    for (i, case) in cases.iter().enumerate() {
        let name = case["case"].as_str().unwrap();
        let m = &got[&(i as i64)];
        let e = &m.envelope;
        for (field, want) in case["envelope"].as_object().into_iter().flatten() {
            let s = |v: &Option<String>| v.clone().map(Value::from).unwrap_or(Value::Null);
            let have = match field.as_str() {
                "id" => Value::from(e.id.clone()),
                "type" => s(&e.message_type),
                "version" => Value::from(e.version),
                "correlation_id" => s(&e.correlation_id),
                "causation_id" => s(&e.causation_id),
                "attempt" => Value::from(e.attempt),
                "origin" => s(&e.origin),
                "error" => s(&e.error),
                "claim" => s(&e.claim),
                "first_seen_ms" => Value::from(e.first_seen_ms),
                other => panic!("{name}: unknown envelope field {other}"),
            };
            match want.as_str() {
                Some("<fresh UUID>") => {
                    let id = have.as_str().unwrap();
                    assert_eq!(id.len(), 36, "{name}: a UUID: {id}");
                    // The family reads a fresh v4; ours is derived from the delivery (v8) so
                    // that a redelivery reads with the same id (tests/identity.rs).
                    assert_eq!(&id[14..15], "8", "{name}: derived: {id}");
                }
                Some("<same as id>") => assert_eq!(have, Value::from(e.id.clone()), "{name}"),
                _ => assert_eq!(&have, want, "{name}: {field}"),
            }
        }
        if case["envelope"].get("first_seen_ms").is_none() {
            // Missing first-seen reads as now (Java and Python).
            assert!(
                (before..=after).contains(&e.first_seen_ms),
                "{name}: first seen now"
            );
        }
        for k in m.headers.keys() {
            assert!(
                !k.starts_with(headers::RESERVED_PREFIX),
                "{name}: reserved {k} reached the application"
            );
        }
        if let Some(app) = case.get("application_headers").and_then(Value::as_object) {
            let mut names: Vec<&String> = m.headers.keys().filter(|k| *k != "case").collect();
            names.sort();
            let mut want: Vec<&String> = app.keys().collect();
            want.sort();
            assert_eq!(names, want, "{name}: application headers");
        }
        for h in case
            .get("application_headers_include")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            assert!(m.headers.contains_key(h.as_str().unwrap()), "{name}: {h}");
        }
        if name == "pattern headers are application headers" {
            // The constants later patterns write with are the fixture's names.
            for h in [
                headers::REPLY_TO,
                headers::ROUTING_SLIP,
                headers::REPLAYED_FROM,
                headers::REPLAYED_AT,
                headers::REPLAY_COUNT,
            ] {
                assert!(m.headers.contains_key(h), "{name}: {h}");
            }
        }
    }
    raw.close();
}

/// A foreign message with family-typed headers (32-bit integers, byte-array strings, a declared
/// route) goes through a retry held in the consumer and on to `.dlq`: the dead-letter copy has
/// every header the original had, same names, same AMQP types — only the attempt moved, the
/// error was added, and where the message was first going (`acemq-original-exchange`,
/// `-routing-key`, `-queue`, for a replay) was recorded. No other header gained, none lost, none
/// renamed, no type changed.
#[test]
fn a_foreign_message_round_trips_through_retry_and_dead_letter_unchanged_in_name_and_type() {
    let (conn, _clean, q) = support::declared_consumed_queue("contract-roundtrip");
    let raw = Raw::open();
    let mut table = FieldTable::new();
    table.insert(
        headers::ID.into(),
        text("11111111-2222-3333-4444-555555555555"),
    );
    table.insert(headers::TYPE.into(), text("order.placed"));
    table.insert(headers::VERSION.into(), AmqpValue::LongInt(3));
    table.insert(headers::CORRELATION.into(), text("corr-1"));
    table.insert(headers::CAUSATION.into(), text("cause-1"));
    table.insert(headers::ATTEMPT.into(), AmqpValue::LongInt(1));
    table.insert(headers::FIRST_SEEN.into(), AmqpValue::LongLongInt(now_ms()));
    table.insert(headers::ORIGIN.into(), text("orders@host-7"));
    table.insert(headers::ROUTE.into(), text("validate,enrich,dispatch"));
    table.insert(headers::ROUTE_POSITION.into(), AmqpValue::LongInt(1));
    table.insert(headers::ROUTE_ID.into(), text("run-1"));
    table.insert("x-tenant".into(), text("acme"));
    table.insert("x-bytes".into(), AmqpValue::ByteArray(b"raw".to_vec()));
    table.insert("x-small".into(), AmqpValue::ShortInt(7));
    table.insert("x-flag".into(), AmqpValue::Boolean(true));
    // Not reserved: the family's prefix match is case-sensitive.
    table.insert("X-AceMQ-Tenant".into(), text("acme"));
    // Types the envelope does not model go back as they came, not widened or made lossy.
    table.insert(
        "x-decimal".into(),
        AmqpValue::DecimalValue(amq_protocol_types::DecimalValue {
            scale: 2,
            value: 12345,
        }),
    );
    table.insert("x-tiny".into(), AmqpValue::ShortShortInt(-3));
    table.insert("x-u32".into(), AmqpValue::LongUInt(7));
    table.insert("x-f32".into(), AmqpValue::Float(1.5));
    table.insert("x-when".into(), AmqpValue::Timestamp(1_767_323_045));
    let props = AmqpProperties::default()
        .with_headers(table.clone())
        .with_message_id("11111111-2222-3333-4444-555555555555".into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    raw.publish("", &q, b"{\"order\":1}", props);
    let policy = RetryPolicy::fixed(2, Duration::from_millis(50));
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(policy))
        .unwrap()
        .start(|_: &Message| Err("the warehouse is not answering".into()))
        .unwrap();
    let dlq = dead_letter_queue(&q);
    let mut dead = None;
    assert!(eventually(WAIT, || {
        dead = raw.get(&dlq);
        dead.is_some()
    }));
    consumer.close().unwrap();
    let (props, key, body) = dead.unwrap();
    assert_eq!(key, dlq, "through the default exchange to {{queue}}.dlq");
    assert_eq!(body, b"{\"order\":1}");
    assert_eq!(props.content_type().as_deref(), Some("application/json"));
    assert_eq!(
        props.message_id().as_deref(),
        Some("11111111-2222-3333-4444-555555555555")
    );
    let copy = props.headers().clone().unwrap();
    let mut expected = table;
    expected.insert(headers::ATTEMPT.into(), AmqpValue::LongInt(2));
    expected.insert(
        headers::ERROR.into(),
        text("exhausted 2 attempts: Error: the warehouse is not answering"),
    );
    // Recorded by the first (retry) copy, kept by the dead-letter copy.
    expected.insert(headers::ORIGINAL_EXCHANGE.into(), text(""));
    expected.insert(headers::ORIGINAL_ROUTING_KEY.into(), text(&q));
    expected.insert(headers::ORIGINAL_QUEUE.into(), text(&q));
    assert_eq!(
        copy, expected,
        "the copy is the original, attempt, error and the replay's origin aside"
    );
    raw.close();
}

/// The family's retry topology, declared first by another library exactly as its
/// `RetryTopology` does (a one-minute rung through `acemq.retry`, `.dlq`/`.parked` on
/// `acemq.dlx`, the work queue quorum with its dead-letter arguments): our consumer with the same
/// policy starts on it without a conflict — and the other way round, what we declare first
/// takes the family's declarations without PRECONDITION_FAILED.
#[test]
fn our_consumer_and_the_family_share_one_retry_topology_without_conflict() {
    let fx = fixture();
    let retry = &fx["retry"];
    assert_eq!(retry["threshold_ms"], 30000);
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let policy = RetryPolicy::fixed(3, Duration::from_secs(60));
    for family_first in [true, false] {
        let q = clean.consumed_queue(
            &unique(if family_first {
                "family-first"
            } else {
                "rust-first"
            }),
            &[Duration::from_secs(60)],
        );
        let family = |raw: &Raw| {
            raw.declare_exchange("acemq.retry");
            raw.declare_exchange("acemq.dlx");
            let mut source = FieldTable::new();
            source.insert("x-queue-type".into(), text("quorum"));
            source.insert("x-dead-letter-exchange".into(), text("acemq.dlx"));
            source.insert(
                "x-dead-letter-routing-key".into(),
                text(&dead_letter_queue(&q)),
            );
            raw.declare_queue(&q, source)
                .expect("the work queue, as the family declares it");
            let mut rung = FieldTable::new();
            rung.insert("x-message-ttl".into(), AmqpValue::LongLongInt(60_000));
            rung.insert("x-dead-letter-exchange".into(), text("acemq.retry"));
            rung.insert("x-dead-letter-routing-key".into(), text(&q));
            let rung_name = retry_queue(&q, Duration::from_secs(60));
            assert!(rung_name.ends_with(".retry.1m"));
            raw.declare_queue(&rung_name, rung)
                .expect("the rung, as the family declares it");
            raw.declare_queue(&dead_letter_queue(&q), FieldTable::new())
                .expect("the dlq");
            raw.declare_queue(&parked_queue(&q), FieldTable::new())
                .expect("the parked queue");
            raw.bind(&q, "acemq.retry", &q);
            raw.bind(&dead_letter_queue(&q), "acemq.dlx", &dead_letter_queue(&q));
            raw.bind(&parked_queue(&q), "acemq.dlx", &parked_queue(&q));
        };
        let raw = Raw::open();
        if family_first {
            family(&raw);
            let running = conn
                .consumer(&q, ConsumerOptions::new().retry(policy.clone()))
                .expect("no conflict with the family's topology")
                .start(|_: &Message| Ok(Outcome::Accept))
                .unwrap();
            running.close().unwrap();
        } else {
            conn.declare_queue(&QueueSpec::new(&q).with_dead_letter())
                .unwrap();
            let running = conn
                .consumer(&q, ConsumerOptions::new().retry(policy.clone()))
                .unwrap()
                .start(|_: &Message| Ok(Outcome::Accept))
                .unwrap();
            running.close().unwrap();
            family(&raw);
        }
        raw.close();
    }
}

/// A wait at or over the threshold is spent on a rung: the copy goes to `{queue}.retry.{N}`
/// (attempt + 1), waits out the rung's TTL and comes home through `acemq.retry`.
#[test]
fn a_wait_at_the_threshold_goes_through_a_rung_and_comes_home_through_acemq_retry() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("rung"), &[Duration::from_secs(1)]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let policy =
        RetryPolicy::fixed(2, Duration::from_secs(1)).broker_wait_threshold(Duration::from_secs(1));
    assert_eq!(policy.broker_rungs(), vec![Duration::from_secs(1)]);
    let seen: Arc<Mutex<Vec<(Instant, u32, String)>>> = Arc::default();
    let s = seen.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(policy))
        .unwrap()
        .start(move |m: &Message| {
            let exchange = m.received.as_ref().unwrap().exchange.clone();
            s.lock()
                .unwrap()
                .push((Instant::now(), m.envelope.attempt, exchange));
            if m.envelope.attempt == 1 {
                Err("not yet".into())
            } else {
                Ok(Outcome::Accept)
            }
        })
        .unwrap();
    let rung = retry_queue(&q, Duration::from_secs(1));
    assert!(rung.ends_with(".retry.1s"));
    conn.publisher()
        .unwrap()
        .publish("", &q, Message::new("x"))
        .unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().len() == 2));
    consumer.close().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[1].1, 2, "attempt + 1");
    assert_eq!(
        seen[1].2, "acemq.retry",
        "dead-lettered home through acemq.retry"
    );
    assert!(
        seen[1].0 - seen[0].0 >= Duration::from_secs(1),
        "waited the rung's TTL"
    );
    assert_eq!(conn.queue_info(&rung).unwrap().message_count, 0);
}

/// A retry waiting in the consumer holds its delivery but not a worker: with one worker, a
/// message published after the failing one is handled while the retry waits.
#[test]
fn a_retry_waiting_in_the_consumer_does_not_hold_the_only_worker() {
    let (conn, _clean, q) = support::declared_consumed_queue("held-retry");
    let policy = RetryPolicy::fixed(2, Duration::from_secs(3));
    let order: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let o = order.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(1).retry(policy))
        .unwrap()
        .start(move |m: &Message| {
            let body = String::from_utf8_lossy(&m.body).to_string();
            o.lock().unwrap().push((body.clone(), m.envelope.attempt));
            if body == "slow" && m.envelope.attempt == 1 {
                Err("try again in 3 s".into())
            } else {
                Ok(Outcome::Accept)
            }
        })
        .unwrap();
    let p = conn.publisher().unwrap();
    p.publish("", &q, Message::new("slow")).unwrap();
    assert!(eventually(WAIT, || order.lock().unwrap().len() == 1));
    assert_eq!(
        consumer.in_flight(),
        1,
        "the failed delivery is held, unacknowledged"
    );
    p.publish("", &q, Message::new("fast")).unwrap();
    assert!(eventually(WAIT, || order.lock().unwrap().len() == 3));
    consumer.close().unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        vec![("slow".into(), 1), ("fast".into(), 1), ("slow".into(), 2)]
    );
}

/// Closing while a retry waits in the consumer puts the original back unchanged (same attempt),
/// as a family consumer's held delivery goes back when its channel closes; nothing is lost.
#[test]
fn closing_while_a_retry_waits_requeues_the_original_with_its_attempt() {
    let (conn, _clean, q) = support::declared_consumed_queue("held-close");
    let (calls, after) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(0)));
    let (c, a) = (calls.clone(), after.clone());
    // One worker: it takes "after" only once it has handed "x"'s retry to the timer, so seeing
    // "after" handled means "x" is waiting in the consumer (not still in its handler).
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .concurrency(1)
                .retry(RetryPolicy::fixed(3, Duration::from_secs(25))),
        )
        .unwrap()
        .start(move |m: &Message| {
            if m.body == b"after" {
                *a.lock().unwrap() += 1;
                return Ok(Outcome::Accept);
            }
            *c.lock().unwrap() += 1;
            Err("later".into())
        })
        .unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("x")).unwrap();
    assert!(eventually(WAIT, || *calls.lock().unwrap() == 1));
    publisher.publish("", &q, Message::new("after")).unwrap();
    assert!(eventually(WAIT, || *after.lock().unwrap() == 1));
    let started = Instant::now();
    let report = consumer.close().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "close does not wait out the retry"
    );
    assert_eq!(report.requeued, 1, "{report:?}");
    assert_eq!(*calls.lock().unwrap(), 1, "the retry did not run");
    let back = conn
        .get(&q)
        .unwrap()
        .expect("the original is back on the queue");
    assert_eq!(back.body, b"x");
    assert_eq!(back.envelope.attempt, 1);
}

/// The family's error texts on the real broker: one attempt is singular, an old message
/// names the age limit, a body that cannot be decoded is parked.
#[test]
fn dead_letter_and_park_texts_are_the_familys() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let cases: [(&str, RetryPolicy, &str, &str); 3] = [
        (
            "one-attempt",
            RetryPolicy::none(),
            "dlq",
            "exhausted 1 attempt: Error: boom",
        ),
        (
            "too-old",
            RetryPolicy::fixed(5, Duration::from_millis(10))
                .max_message_age(Duration::from_secs(120)),
            "dlq",
            "exceeded the maximum message age of 2m0s: Error: boom",
        ),
        (
            "undecodable",
            RetryPolicy::none(),
            "parked",
            "could not be decoded: ",
        ),
    ];
    for (name, policy, target, text) in cases {
        let q = clean.consumed_queue(&unique(name), &[]);
        conn.declare_queue(&QueueSpec::new(&q)).unwrap();
        let undecodable = name == "undecodable";
        let consumer = conn
            .consumer(&q, ConsumerOptions::new().retry(policy))
            .unwrap()
            .start(move |m: &Message| {
                if undecodable {
                    let _: serde_json::Value = m.payload()?;
                    return Ok(Outcome::Accept);
                }
                Err("boom".into())
            })
            .unwrap();
        let mut m = Message::new("not json {");
        if name == "too-old" {
            m.envelope.first_seen_ms = now_ms() - 3_600_000;
        }
        conn.publisher().unwrap().publish("", &q, m).unwrap();
        let from = if target == "dlq" {
            dead_letter_queue(&q)
        } else {
            parked_queue(&q)
        };
        let mut got = None;
        assert!(eventually(WAIT, || {
            got = conn.get(&from).unwrap();
            got.is_some()
        }));
        consumer.close().unwrap();
        let error = got.unwrap().envelope.error.unwrap();
        assert!(error.starts_with(text), "{name}: {error}");
    }
}

/// Under `declare(false)` a rung that nobody declared does not exist: the retry waits in the
/// consumer instead (as the Python library falls back), it is not requeued in a loop.
#[test]
fn a_missing_rung_falls_back_to_waiting_in_the_consumer() {
    let (conn, _clean, q) = support::declared_consumed_queue("no-rung");
    let policy =
        RetryPolicy::fixed(2, Duration::from_secs(1)).broker_wait_threshold(Duration::from_secs(1));
    let seen: Arc<Mutex<Vec<(Instant, u32)>>> = Arc::default();
    let s = seen.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(policy).declare(false))
        .unwrap()
        .start(move |m: &Message| {
            s.lock().unwrap().push((Instant::now(), m.envelope.attempt));
            if m.envelope.attempt == 1 {
                Err("later".into())
            } else {
                Ok(Outcome::Accept)
            }
        })
        .unwrap();
    conn.publisher()
        .unwrap()
        .publish("", &q, Message::new("x"))
        .unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().len() == 2));
    consumer.close().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "handled twice, not in a loop: {seen:?}");
    assert_eq!(seen[1].1, 2);
    assert!(seen[1].0 - seen[0].0 >= Duration::from_secs(1));
}

/// Rung names and the policies' schedules and rungs from the fixture.
#[test]
fn retry_names_and_policy_schedules_match_the_fixture() {
    let fx = fixture();
    for r in fx["retry"]["rung_name"].as_array().unwrap() {
        let ms = r["delay_ms"].as_u64().unwrap();
        let want = r["name"].as_str().unwrap();
        let got = retry_queue("orders.new", Duration::from_millis(ms));
        if ms < 1000 {
            // Recorded disagreement: Java `500ms`, Go/Python/Ruby `0s`; we follow the majority.
            assert_eq!(got, "orders.new.retry.0s");
        } else {
            assert_eq!(got, want);
        }
    }
    let ms = |v: &Value| -> Vec<Duration> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|d| Duration::from_millis(d.as_u64().unwrap()))
            .collect()
    };
    let s = Duration::from_secs;
    let policies = [
        RetryPolicy::exponential()
            .max_attempts(5)
            .initial_delay(s(1))
            .max_delay(s(60)),
        RetryPolicy::exponential()
            .max_attempts(6)
            .initial_delay(s(10))
            .max_delay(s(300)),
        RetryPolicy::fixed(4, s(60)),
        RetryPolicy::none(),
    ];
    for (p, want) in policies
        .iter()
        .zip(fx["retry"]["policies"].as_array().unwrap())
    {
        assert_eq!(p.schedule(), ms(&want["schedule_ms"]), "{}", want["how"]);
        assert_eq!(
            p.broker_rungs(),
            ms(&want["broker_rungs_ms"]),
            "{}",
            want["how"]
        );
    }
}

/// A retry held in the consumer when the connection drops: its delivery is the broker's again
/// (redelivered, same attempt), and the held copy from before the cut is dropped, not published
/// — the message is tried a second time exactly once.
#[test]
fn a_held_retry_from_before_a_reconnect_is_dropped_and_the_redelivery_retried_once() {
    let (direct, _clean, q) = support::declared_consumed_queue("held-cut");
    let (proxy, conn) = support::through_proxy(Duration::from_millis(300));
    let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
    let s = seen.clone();
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new().retry(RetryPolicy::fixed(3, Duration::from_secs(2))),
        )
        .unwrap()
        .start(move |m: &Message| {
            s.lock().unwrap().push(m.envelope.attempt);
            if m.envelope.attempt == 1 {
                Err("later".into())
            } else {
                Ok(Outcome::Accept)
            }
        })
        .unwrap();
    direct
        .publisher()
        .unwrap()
        .publish("", &q, Message::new("x"))
        .unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().len() == 1));
    proxy.cut();
    assert!(
        eventually(WAIT, || conn.generation() == Some(2)),
        "reconnected"
    );
    assert!(eventually(WAIT, || seen.lock().unwrap().contains(&2)));
    consumer.close().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().filter(|a| **a == 2).count(),
        1,
        "one second attempt: {seen:?}"
    );
    assert_eq!(direct.queue_info(&q).unwrap().message_count, 0, "{seen:?}");
}

/// Explicit delays (`retry_after`, `in_progress`) never declare a queue of their own: a wait at
/// or over the threshold goes to the policy's rungs, and with none it is held in the consumer.
/// 100 distinct delays, no new queue.
#[test]
fn a_hundred_distinct_explicit_delays_declare_no_new_queue() {
    let (conn, mut clean, q) = support::declared_consumed_queue("many-delays");
    let delays: Vec<Duration> = (0..100).map(|i| Duration::from_secs(31 + i)).collect();
    for d in &delays {
        clean.queue(&retry_queue(&q, *d));
    }
    let seen = Arc::new(Mutex::new(0usize));
    let s = seen.clone();
    // Two attempts, a 1 s wait: no broker rungs at all.
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .prefetch(200)
                .retry(RetryPolicy::fixed(2, Duration::from_secs(1))),
        )
        .unwrap()
        .start(move |m: &Message| {
            *s.lock().unwrap() += 1;
            let i: u64 = String::from_utf8_lossy(&m.body).parse().unwrap();
            let d = Duration::from_secs(31 + i);
            Ok(if i.is_multiple_of(2) {
                Outcome::retry_after(d, "later")
            } else {
                Outcome::in_progress(d)
            })
        })
        .unwrap();
    let p = conn.publisher().unwrap();
    for i in 0..100 {
        p.publish("", &q, Message::new(i.to_string())).unwrap();
    }
    assert!(eventually(WAIT, || *seen.lock().unwrap() == 100));
    assert!(
        eventually(WAIT, || consumer.in_flight() == 100),
        "all held in the consumer"
    );
    let report = consumer.close().unwrap();
    assert_eq!(
        report.requeued, 100,
        "held retries go back on close: {report:?}"
    );
    for d in &delays {
        let rung = retry_queue(&q, *d);
        assert!(
            matches!(
                conn.queue_info(&rung),
                Err(acemq_amqp::Error::NotFound { .. })
            ),
            "{rung} was declared"
        );
    }
}

/// A foreign producer's message arriving with `x-acemq-attempt` already past the policy's limit
/// — as an integer, and as text, as some of the family's producers write it — is run, as the
/// family's consumers run it (the header counts past failures; it is no budget): accepted, it
/// is acknowledged and nothing is dead-lettered; failed, it is dead-lettered as exhausted with
/// the handler's error, at its own attempt.
#[test]
fn a_message_arriving_past_its_last_attempt_is_run_and_dead_lettered_only_if_it_fails() {
    let (conn, _clean, q) = support::declared_consumed_queue("past-limit");
    let raw = Raw::open();
    for (id, attempt) in [
        ("ok-int", AmqpValue::LongInt(9)),
        ("fail-int", AmqpValue::LongInt(9)),
        ("ok-text", text("2")),
        ("fail-text", text("2")),
    ] {
        let mut table = FieldTable::new();
        table.insert(headers::ID.into(), text(id));
        table.insert(headers::ATTEMPT.into(), attempt);
        raw.publish("", &q, b"{}", AmqpProperties::default().with_headers(table));
    }
    raw.close();
    // The foreign producer publishes without confirms: say so if the broker did not keep all
    // four (a failure below is then the consumer's).
    assert!(
        eventually(WAIT, || conn
            .queue_info(&q)
            .map(|i| i.message_count == 4)
            .unwrap_or(false)),
        "the broker holds the four published messages: {:?}",
        conn.queue_info(&q)
    );
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new().retry(RetryPolicy::fixed(1, Duration::from_millis(10))),
        )
        .unwrap()
        .start(move |m: &Message| {
            c.lock().unwrap().push(m.id().to_string());
            if m.id().starts_with("fail") {
                Err("the handler failed".into())
            } else {
                Ok(Outcome::Accept)
            }
        })
        .unwrap();
    let mut dead = Vec::new();
    let two = eventually(WAIT, || {
        if let Some(m) = conn.get(&dead_letter_queue(&q)).unwrap() {
            dead.push(m);
        }
        dead.len() == 2
    });
    assert!(
        two,
        "two dead letters: got {:?}; the handler ran for {:?}; the queue holds {:?}",
        dead.iter().map(|m| m.id().to_string()).collect::<Vec<_>>(),
        calls.lock().unwrap(),
        conn.queue_info(&q)
    );
    assert!(eventually(WAIT, || calls.lock().unwrap().len() == 4));
    consumer.close().unwrap();
    let mut ran = calls.lock().unwrap().clone();
    ran.sort();
    assert_eq!(
        ran,
        ["fail-int", "fail-text", "ok-int", "ok-text"],
        "each ran once"
    );
    dead.sort_by(|a, b| a.id().cmp(b.id()));
    assert_eq!(dead[0].id(), "fail-int");
    assert_eq!(dead[0].envelope.attempt, 9);
    assert_eq!(dead[1].id(), "fail-text");
    assert_eq!(dead[1].envelope.attempt, 2);
    for d in &dead {
        assert_eq!(
            d.envelope.error.as_deref(),
            Some("exhausted 1 attempt: Error: the handler failed")
        );
    }
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

/// A foreign message without `x-acemq-first-seen` reads as first seen on receipt, and its copies
/// say so (not 1970).
#[test]
fn a_foreign_message_without_first_seen_is_first_seen_on_receipt_and_its_copy_says_so() {
    let (conn, _clean, q) = support::declared_consumed_queue("no-first-seen");
    let raw = Raw::open();
    let before = now_ms();
    raw.publish("", &q, b"{}", AmqpProperties::default());
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(|_: &Message| Ok(Outcome::reject("no")))
        .unwrap();
    let mut dead = None;
    assert!(eventually(WAIT, || {
        dead = raw.get(&dead_letter_queue(&q));
        dead.is_some()
    }));
    consumer.close().unwrap();
    let after = now_ms();
    let (props, _, _) = dead.unwrap();
    let first_seen = props.headers().as_ref().unwrap()[headers::FIRST_SEEN].clone();
    let AmqpValue::LongLongInt(ms) = first_seen else {
        panic!("first-seen is a 64-bit integer: {first_seen:?}")
    };
    assert!(
        (before..=after).contains(&ms),
        "{ms} not in {before}..={after}"
    );
    raw.close();
}

/// A foreign publisher sends a long-string header that is not UTF-8: amiquip drops it and every
/// header after it, the envelope's id among them. The identity falls back to `message_id` (and
/// the truncation is logged at warn), so the message keeps its id.
#[test]
fn a_non_utf8_header_that_truncates_the_table_falls_back_to_message_id() {
    let (direct, _clean, q) = support::declared_consumed_queue("non-utf8");
    let proxy = acemq_amqp::testing::FaultProxy::start(&support::amqp_url()).expect("fault proxy");
    proxy.mangle(
        b"ZZ-NOT-UTF8-ZZ",
        b"\xff\xfe\xff\xfe\xff\xfe\xff\xfe\xff\xfe\xff\xfe\xff\xfe",
    );
    // A foreign writer through the mangling proxy: amiquip writes the table in name order, so
    // the attempt comes before the broken correlation and the id after it.
    let mut raw_conn = amiquip::Connection::insecure_open(&proxy.url()).unwrap();
    let channel = raw_conn.open_channel(None).unwrap();
    let mut table = FieldTable::new();
    table.insert(headers::ATTEMPT.into(), AmqpValue::LongInt(1));
    table.insert(headers::CORRELATION.into(), text("ZZ-NOT-UTF8-ZZ"));
    table.insert(headers::ID.into(), text("hdr-id"));
    table.insert("zz-tenant".into(), text("acme"));
    channel
        .basic_publish(
            "",
            amiquip::Publish {
                body: b"{}",
                routing_key: q.clone(),
                mandatory: false,
                immediate: false,
                properties: AmqpProperties::default()
                    .with_headers(table)
                    .with_message_id("prop-id".into()),
            },
        )
        .unwrap();
    let _ = raw_conn.close();
    let mut got = None;
    assert!(eventually(WAIT, || {
        got = direct.get(&q).unwrap();
        got.is_some()
    }));
    let m = got.unwrap();
    assert!(
        !m.headers.contains_key("zz-tenant"),
        "amiquip truncated the table (the premise of this test)"
    );
    assert_eq!(m.id(), "prop-id", "the identity falls back to message_id");
    assert_eq!(m.envelope.attempt, 1);
}

/// `acemq-replay-count` as each family member writes it — Python the smallest integer that holds
/// it (a one-byte `b` for 1), Go and Java a 32-bit `I`, a 64-bit `l`, unsigned, or text — is read
/// by a replay, which writes the next count as the family's 32-bit integer (the envelope
/// fixture's type, which Go's reader takes; it was a 64-bit `l`).
#[test]
fn replay_counts_in_any_integer_width_are_read_and_the_next_is_written_as_a_32_bit_integer() {
    use acemq_amqp::patterns::replay::{replay, ReplayOptions};
    let (conn, mut clean, target) =
        support::declared_queue_with("replay-width", QueueSpec::classic);
    let dlq = clean.queue(&format!("{target}.dlq"));
    conn.declare_queue(&QueueSpec::new(&dlq).classic()).unwrap();
    let raw = Raw::open();
    let counts = [
        ("python-1", AmqpValue::ShortShortInt(1), 2),
        ("python-300", AmqpValue::ShortInt(300), 301),
        ("go-2", AmqpValue::LongInt(2), 3),
        ("l-3", AmqpValue::LongLongInt(3), 4),
        ("unsigned-4", AmqpValue::LongUInt(4), 5),
        ("text-5", text("5"), 6),
    ];
    for (id, count, _) in &counts {
        let mut table = FieldTable::new();
        table.insert(headers::ID.into(), text(id));
        table.insert(headers::REPLAY_COUNT.into(), count.clone());
        raw.publish(
            "",
            &dlq,
            b"{}",
            AmqpProperties::default().with_headers(table),
        );
    }
    support::wait_for_count(&conn, &dlq, counts.len() as u32, WAIT);
    let report = replay(&conn, &dlq, ReplayOptions::new().routing_key(&target))
        .run()
        .unwrap();
    assert_eq!(report.moved, counts.len() as u64, "{report:?}");
    let mut seen = BTreeMap::new();
    for _ in 0..counts.len() {
        let (props, _, _) = raw.get(&target).expect("a replayed copy");
        let table = props.headers().clone().unwrap_or_default();
        let id = match table.get(headers::ID) {
            Some(AmqpValue::LongString(s)) => s.clone(),
            other => panic!("id: {other:?}"),
        };
        seen.insert(id, table.get(headers::REPLAY_COUNT).cloned());
    }
    raw.close();
    for (id, _, next) in counts {
        assert_eq!(
            seen.get(id),
            Some(&Some(AmqpValue::LongInt(next))),
            "{id}: read, incremented and written as a 32-bit integer"
        );
    }
}
