//! The requester's and the connection's edges (issue 35, items 8, 12, 13, 14): the family's
//! failure reply, requests under a memory alarm, a hung channel open, the reply consumer's bound
//! and the supervisor thread left behind by a dropped connection.
//!
//! Two tests here change what every other test would see (a broker-wide memory alarm, a count
//! of the process's threads): they take [`exclusive`], every other test [`shared`], so within
//! this binary they never overlap.

mod support;

use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions, RunningResponder,
};
use acemq_amqp::{
    dead_letter_queue, headers, BoxError, Connection, ConnectionOptions, Error, Message,
    PublisherOptions, QueueSpec,
};
use amiquip::{AmqpProperties, AmqpValue, FieldTable};

use acemq_amqp::testing::FaultProxy;
use support::alarm::Watermark;
use support::raw::{header_text, text, Raw};
use support::{
    amqp_url, connect, connect_with, eventually, rabbitmqctl, request_queue, unique, Cleanup,
};

const WAIT: Duration = Duration::from_secs(20);

static ALONE: RwLock<()> = RwLock::new(());

/// Taken by a test that must not overlap any other test of this binary.
fn exclusive() -> RwLockWriteGuard<'static, ()> {
    ALONE.write().unwrap_or_else(|e| e.into_inner())
}

/// Taken by every other test.
fn shared() -> RwLockReadGuard<'static, ()> {
    ALONE.read().unwrap_or_else(|e| e.into_inner())
}

/// A raw `basic.get` of one message, waited for.
fn raw_get(raw: &Raw, queue: &str) -> (AmqpProperties, String, Vec<u8>) {
    let mut got = None;
    assert!(
        eventually(WAIT, || {
            got = raw.get(queue);
            got.is_some()
        }),
        "nothing arrived on {queue:?}"
    );
    got.expect("a message")
}

/// A request as the Python library's `Requester.ask` writes it: the envelope headers (text,
/// integers), `acemq-reply-to` and the `reply_to` property to the same queue, a JSON body.
fn python_request(raw: &Raw, queue: &str, reply_to: &str) -> (String, String) {
    let id = acemq_amqp::new_id();
    let correlation = acemq_amqp::new_id();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let mut h = FieldTable::new();
    h.insert("x-acemq-id".into(), text(&id));
    h.insert("x-acemq-type".into(), text(queue));
    h.insert("x-acemq-version".into(), AmqpValue::LongInt(1));
    h.insert("x-acemq-correlation".into(), text(&correlation));
    h.insert("x-acemq-attempt".into(), AmqpValue::LongInt(1));
    h.insert("x-acemq-first-seen".into(), AmqpValue::LongLongInt(now_ms));
    h.insert("x-acemq-origin".into(), text("pricing@python-host"));
    h.insert(headers::REPLY_TO.into(), text(reply_to));
    let props = AmqpProperties::default()
        .with_headers(h)
        .with_content_type("application/json".into())
        .with_message_id(id.clone())
        .with_reply_to(reply_to.into())
        .with_delivery_mode(2);
    raw.publish("", queue, br#"{"sku": "A-1"}"#, props);
    (id, correlation)
}

/// A connection to the tests' broker, its clean-up, and a request queue named after `prefix`.
fn request_setup(prefix: &str) -> (Connection, Cleanup, String) {
    let connection = connect();
    let mut clean = Cleanup::new(&connection);
    let q = request_queue(&connection, &mut clean, prefix);
    (connection, clean, q)
}

/// A responder on `q` running `handler`, asked by a Python-style request on a raw connection:
/// the responder, the raw connection, the request's id and correlation, and the reply's
/// properties and body.
fn python_asks(
    connection: &Connection,
    q: &str,
    handler: fn(&Message) -> Result<Vec<u8>, BoxError>,
) -> (
    RunningResponder,
    Raw,
    (String, String),
    AmqpProperties,
    Vec<u8>,
) {
    let responder = Responder::new(connection, q, ResponderOptions::new())
        .and_then(|responder| responder.start(handler))
        .expect("serve");
    let raw = Raw::open();
    let reply_queue = raw.family_reply_queue();
    let request = python_request(&raw, q, &reply_queue);
    let (props, _, body) = raw_get(&raw, &reply_queue);
    (responder, raw, request, props, body)
}

/// Asserts a reply is the family's failure reply (a JSON `null`) with the error text `error`.
fn assert_failure_reply(props: &AmqpProperties, body: &[u8], error: &str) {
    assert_eq!(body, b"null", "the family's failure body is JSON null");
    assert_eq!(props.content_type().as_deref(), Some("application/json"));
    assert_eq!(
        header_text(props, headers::REPLY_ERROR).as_deref(),
        Some(error),
        "the error text carries its type, as `{{type}}: {{message}}`"
    );
}

/// A publisher on `connection` whose publishes time out after `timeout`, its channel opened
/// (by a publish to `q`) before the alarm: a blocked connection's channel open is not read by
/// the broker (amiquip would wait for its answer with no deadline).
fn publisher_opened_before_the_alarm(
    connection: &Connection,
    q: &str,
    timeout: Duration,
) -> acemq_amqp::Publisher {
    let publisher = connection
        .publisher_with(PublisherOptions::new().timeout(timeout))
        .expect("publisher");
    publisher
        .publish("", q, Message::new("before"))
        .expect("published before the alarm");
    publisher
}

/// Asserts `started` is less than `timeout` and 3 s ago, saying `what` took longer.
fn assert_on_time(started: Instant, timeout: Duration, what: &str) {
    assert!(
        started.elapsed() < timeout + Duration::from_secs(3),
        "{what} took {:?}",
        started.elapsed()
    );
}

// ---- item 14: the family's failure reply ------------------------------------------------------

#[test]
fn a_python_style_request_gets_the_familys_failure_reply_and_is_dead_lettered() {
    let _g = shared();
    let (connection, _clean, q) = request_setup("rr-family-failure");
    let (responder, raw, (id, correlation), props, body) =
        python_asks(&connection, &q, |_| Err("no such sku: A-1".into()));
    assert_failure_reply(&props, &body, "Error: no such sku: A-1");
    assert_eq!(
        header_text(&props, "x-acemq-correlation").as_deref(),
        Some(correlation.as_str())
    );
    assert_eq!(
        header_text(&props, "x-acemq-causation").as_deref(),
        Some(id.as_str())
    );

    // As the family's responders do, the failed request is dead-lettered after its reply.
    let mut dead = None;
    assert!(eventually(WAIT, || {
        dead = connection.get(&dead_letter_queue(&q)).expect("get");
        dead.is_some()
    }));
    let dead = dead.expect("the dead-lettered request");
    assert_eq!(dead.id(), id);
    assert_eq!(
        dead.envelope.error.as_deref(),
        Some("the handler rejected it: Error: no such sku: A-1")
    );
    // The failure reply went out, but a failure is not counted answered (issue 47).
    assert_eq!(responder.answered(), 0);
    responder.close().expect("close");
    raw.close();
}

#[test]
fn a_panicking_responder_sends_the_familys_failure_reply() {
    let _g = shared();
    let (connection, _clean, q) = request_setup("rr-family-panic");
    let (responder, raw, _, props, body) =
        python_asks(&connection, &q, |_| panic!("the price list is gone"));
    assert_failure_reply(&props, &body, "panic: the price list is gone");
    responder.close().expect("close");
    raw.close();
}

/// Answers the next request on `queue` raw, with this failure reply.
fn answer_raw(raw: &Raw, queue: &str, body: &[u8], content_type: Option<&str>, error: &str) {
    let (props, _, _) = raw_get(raw, queue);
    let reply_to = props.reply_to().clone().expect("reply_to");
    let correlation = header_text(&props, "x-acemq-correlation").expect("correlation");
    let mut h = FieldTable::new();
    h.insert("x-acemq-id".into(), text(&acemq_amqp::new_id()));
    h.insert("x-acemq-correlation".into(), text(&correlation));
    h.insert(headers::REPLY_ERROR.into(), text(error));
    let mut reply = AmqpProperties::default().with_headers(h);
    if let Some(ct) = content_type {
        reply = reply.with_content_type(ct.into());
    }
    raw.publish("", &reply_to, body, reply);
}

#[test]
fn our_requester_reads_the_old_and_the_new_failure_reply_as_a_failure() {
    let _g = shared();
    let (connection, _clean, q) = request_setup("rr-both-failures");
    let requester = support::requester(&connection, &q);
    let raw = Raw::open();
    for (body, content_type, error) in [
        (&b""[..], None, "no such sku"),
        (
            &b"null"[..],
            Some("application/json"),
            "ValueError: no such sku",
        ),
    ] {
        std::thread::scope(|s| {
            let asked = s.spawn(|| requester.ask_timeout("A-1", WAIT));
            answer_raw(&raw, &q, body, content_type, error);
            match asked.join().expect("the asking thread") {
                Err(Error::Responder { message }) => assert_eq!(message, error),
                other => panic!("expected Error::Responder, got {other:?}"),
            }
        });
    }
    requester.close().expect("close");
    raw.close();
}

// ---- item 12: a hung channel open -------------------------------------------------------------

#[test]
fn a_hung_channel_open_does_not_hold_up_close_or_a_second_open() {
    let _g = shared();
    let setup = connect();
    let (_clean, q) = support::queue_on(&setup, "hung-open", QueueSpec::classic);
    let proxy = FaultProxy::start(&amqp_url()).expect("proxy");
    let deadline = Duration::from_secs(2);
    let connection = connect_with(
        ConnectionOptions::new()
            .address(proxy.url())
            .heartbeat(Duration::from_secs(60))
            .operation_timeout(deadline),
    );
    connection.get(&q).expect("a get through the proxy");
    // The broker no longer hears the client: a channel open waits for an answer that cannot
    // come (until the broker gives up on the heartbeats, a minute or two away).
    proxy.freeze();
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut openers = Vec::new();
    for _ in 0..2 {
        let (c, tx, q) = (connection.clone(), tx.clone(), q.clone());
        openers.push(std::thread::spawn(move || {
            let started = Instant::now();
            let r = c.get(&q).map(|_| ());
            let _ = tx.send((r, started.elapsed()));
        }));
    }
    // The next open's caller returns, failed, within its deadline.
    let returns_failed_in_time = |which: &str| {
        let (r, took) = rx
            .recv_timeout(deadline * 3 + Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{which} returned within its deadline"));
        assert!(r.is_err(), "{r:?}");
        assert!(
            took < deadline * 2 + Duration::from_secs(2),
            "took {took:?}"
        );
    };
    // One of the two opens hangs in amiquip; the other must not queue behind it for ever.
    returns_failed_in_time("the second open");
    // And closing the connection is not held up by the hung open either.
    let started = Instant::now();
    let closed = connection.close();
    let took = started.elapsed();
    assert!(
        took < deadline * 2 + Duration::from_secs(2),
        "close took {took:?} ({closed:?})"
    );
    // The hung open's own caller is not held past its deadline either (amiquip's open goes on
    // on a thread of its own).
    returns_failed_in_time("the hung open's caller");
    proxy.cut();
    for t in openers {
        t.join().expect("opener");
    }
}

// ---- item 13: the reply consumer's bound; the supervisor joined ------------------------------

#[test]
fn a_named_reply_queues_backlog_is_consumed_with_acks_and_a_bounded_prefetch() {
    let _g = shared();
    let (connection, mut clean, q) = request_setup("rr-backlog");
    let replies = clean.queue(&unique("rr-backlog-replies"));
    connection
        .declare_queue(&QueueSpec::new(&replies))
        .expect("declare the named reply queue");
    // A backlog of replies nobody waits for (a requester that crashed with calls out).
    let n = 3000;
    support::publish_n(&connection, &replies, n, false);
    let window = 8;
    let requester = Requester::new(
        &connection,
        RequesterOptions::new()
            .reply_queue(&replies)
            .window(window)
            .routing_key(&q),
    )
    .and_then(Requester::start)
    .expect("requester");
    // The broker hands the reply consumer a bounded number at a time, acknowledged.
    let listing = rabbitmqctl(&[
        "list_consumers",
        "queue_name",
        "ack_required",
        "prefetch_count",
        "-q",
        "--no-table-headers",
    ]);
    let line = listing
        .lines()
        .find(|l| l.split('\t').next() == Some(replies.as_str()))
        .unwrap_or_else(|| panic!("no consumer of {replies:?} in {listing}"));
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields.get(1), Some(&"true"), "acknowledged: {line}");
    let prefetch: usize = fields
        .get(2)
        .and_then(|p| p.trim().parse().ok())
        .expect("a prefetch count");
    assert!(
        prefetch > 0 && prefetch <= 4 * window,
        "prefetch {prefetch} for a window of {window}"
    );
    // The backlog is still read (counted unmatched) and acknowledged, so the queue empties.
    assert!(
        eventually(Duration::from_secs(60), || requester.unmatched()
            == n as u64),
        "unmatched {}",
        requester.unmatched()
    );
    assert!(eventually(WAIT, || connection
        .queue_info(&replies)
        .map(|i| i.message_count == 0)
        .unwrap_or(false)));
    requester.close().expect("close");
    // Nothing was left unacknowledged for the broker to hand back.
    assert_eq!(
        connection.queue_info(&replies).expect("info").message_count,
        0
    );
}

/// The threads of this process whose name starts with `prefix` (Linux truncates names to 15
/// bytes).
fn threads_named(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .filter(|name| name.trim_end().starts_with(prefix))
        .count()
}

#[test]
fn dropping_the_last_connection_clone_without_close_joins_the_supervisor() {
    let _g = exclusive();
    // Supervisors of connections other tests of this binary dropped may still be ending.
    assert!(
        eventually(WAIT, || threads_named("acemq-superviso") == 0),
        "{} supervisors before the test",
        threads_named("acemq-superviso")
    );
    for _ in 0..3 {
        let connection = connect();
        let clone = connection.clone();
        // (A thread names itself when it starts running.)
        assert!(eventually(WAIT, || threads_named("acemq-superviso") == 1));
        drop(connection);
        assert_eq!(threads_named("acemq-superviso"), 1, "a clone is left");
        drop(clone);
        assert_eq!(
            threads_named("acemq-superviso"),
            0,
            "the last clone was dropped: its supervisor thread is joined"
        );
    }
}

// ---- item 8: requests under a memory alarm ----------------------------------------------------

#[test]
fn under_a_memory_alarm_requests_wait_in_the_byte_budget_and_fail_on_time() {
    let _g = exclusive();
    // No responder: every request waits in the queue (or in the client while the broker
    // blocks).
    let (connection, _clean, q) = request_setup("rr-alarm");
    let timeout = Duration::from_millis(500);
    let requester = Requester::new(
        &connection,
        RequesterOptions::new().timeout(timeout).routing_key(&q),
    )
    .and_then(Requester::start)
    .expect("requester");
    let publisher = publisher_opened_before_the_alarm(&connection, &q, timeout);
    let (tx, rx) = crossbeam_channel::unbounded();
    let body = vec![b'r'; 2 << 20];
    // 32 MiB of requests: well past what amiquip buffers (16 MiB) before it blocks a thread.
    let asks = 16;
    std::thread::scope(|s| {
        // Inside the scope: on a failed assertion the alarm ends before the scope joins the
        // asking thread (which may be stuck in amiquip until then).
        let alarm = Watermark::alarm();
        s.spawn(|| {
            for _ in 0..asks {
                let started = Instant::now();
                let r = requester.ask(Message::new(body.clone())).map(|_| ());
                if tx.send((r, started.elapsed())).is_err() {
                    return;
                }
            }
        });
        let mut outcomes = BTreeMap::new();
        for i in 0..asks {
            let (r, took) = rx
                .recv_timeout(timeout + Duration::from_secs(5))
                .unwrap_or_else(|_| {
                    panic!("ask {i} did not return within its timeout (blocked in amiquip?)")
                });
            assert!(
                took < timeout + Duration::from_secs(3),
                "ask {i} took {took:?}"
            );
            let e = r.expect_err("no responder: no reply");
            let kind = match &e {
                Error::RequestTimeout { .. } => "timed out",
                Error::Blocked { .. } => "blocked",
                other => panic!("ask {i}: {other}"),
            };
            *outcomes.entry(kind).or_insert(0) += 1;
        }
        assert!(outcomes.contains_key("blocked"), "{outcomes:?}");
        // The publisher on the same connection: its publish waits for room, and its state
        // stays answerable meanwhile.
        let started = Instant::now();
        let r = publisher.publish_deferred("", &q, Message::new(vec![b'p'; 1 << 20]));
        assert_on_time(started, timeout, "the publish");
        // Handed over (there was room in the budget) or refused as blocked, on time.
        let ticket = match r {
            Ok(t) => Some(t),
            Err(Error::Blocked { .. }) => None,
            Err(e) => panic!("{e}"),
        };
        let started = Instant::now();
        let _ = publisher.in_flight();
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(alarm);
        if let Some(t) = ticket {
            t.wait_timeout(Duration::from_secs(30))
                .expect("confirmed after the alarm");
        }
    });
    assert!(eventually(Duration::from_secs(30), || !connection.is_blocked()));
    // Nothing of the budget was lost: publishing goes on once the broker reads again.
    publisher
        .publish("", &q, Message::new("after"))
        .expect("published after the alarm");
    requester.close().expect("close");
    publisher.close().expect("close");
}

/// `publisher.in_flight()`, asked on a thread of its own; panics when it does not answer within
/// 2 s (the state lock held across a call into amiquip).
fn in_flight_on_time(publisher: &acemq_amqp::Publisher) -> usize {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let p = publisher.clone();
    std::thread::spawn(move || {
        let _ = tx.send(p.in_flight());
    });
    rx.recv_timeout(Duration::from_secs(2))
        .expect("in_flight() answered within 2 s while a publish is stuck in amiquip")
}

#[test]
fn a_publish_stuck_in_amiquip_under_a_memory_alarm_does_not_hold_up_the_publishers_state() {
    let _g = exclusive();
    let (connection, _clean, q) = support::declared_queue_with("stuck-publish", QueueSpec::classic);
    let timeout = Duration::from_secs(1);
    let publisher = publisher_opened_before_the_alarm(&connection, &q, timeout);
    // Another connection tells when the alarm holds (the broker blocks a connection once it
    // publishes), so that this one's byte budget stays empty.
    let probe = connect();
    let probe_publisher = probe.publisher().expect("probe publisher");
    // Larger than the whole byte budget (8 MiB), so it goes alone — and than amiquip's buffer
    // (16 MiB): under the alarm, amiquip blocks the publishing thread part way through it.
    let big = vec![b'b'; 40 << 20];
    std::thread::scope(|s| {
        let alarm = Watermark::alarm();
        let mut nudges = Vec::new();
        assert!(eventually(WAIT, || {
            if let Ok(t) = probe_publisher.publish_deferred("", &q, Message::new("nudge")) {
                nudges.push(t);
            }
            probe.is_blocked()
        }));
        let stuck = s.spawn(|| publisher.publish_deferred("", &q, Message::new(big.clone())));
        // Until the big publish is handed over (counted in flight), the publisher's state
        // answers on time, and afterwards too, while amiquip holds that thread.
        assert!(eventually(WAIT, || in_flight_on_time(&publisher) > 0
            || stuck.is_finished()));
        for _ in 0..3 {
            in_flight_on_time(&publisher);
        }
        let started = Instant::now();
        let other = publisher.publish_deferred("", &q, Message::new("small"));
        assert_on_time(started, timeout, &format!("a second publish ({other:?})"));
        drop(alarm);
        let _ = stuck.join();
        drop(nudges);
    });
    assert!(eventually(Duration::from_secs(30), || !connection.is_blocked()));
    let _ = publisher.close();
    let _ = probe_publisher.close();
}
