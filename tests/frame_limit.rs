//! The frame limit: a message's header frame (its properties and header table) travels as one
//! AMQP frame, which RabbitMQ refuses past the agreed `frame_max` by closing the whole
//! connection. A publish that cannot fit is refused before anything is sent; a consumer's copy
//! that cannot fit is dead-lettered trimmed, or the original rejected to the broker's own
//! dead-lettering — never a lost connection.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::fuzzing::from_amiquip_properties;
use acemq_amqp::observe::Observer;
use acemq_amqp::observe::{ConnectionEvent, Settlement};
use acemq_amqp::patterns::outbox::{
    record_message, OutboxRelay, OutboxRelayOptions, OutboxStore, SqlOutboxStore,
    SqlOutboxStoreOptions,
};
use acemq_amqp::patterns::request_reply::{Requester, RequesterOptions, RunningRequester};
use acemq_amqp::{
    dead_letter_queue, Connection, ConnectionOptions, ConsumerOptions, Message, Outcome, QueueSpec,
    RetryPolicy,
};
use support::db::Db;
use support::{amqp_url, connect_with, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

/// A settlement's outcome label and error.
type Outcomes = (String, Option<String>);

/// Counts the connection's losses and reconnects, and keeps every settlement's outcome and
/// error by message id.
#[derive(Clone, Default)]
struct Watch {
    lost: Arc<AtomicUsize>,
    connected: Arc<AtomicUsize>,
    settled: Arc<Mutex<HashMap<String, Vec<Outcomes>>>>,
}

impl Observer for Watch {
    fn connection(&self, event: &ConnectionEvent<'_>) {
        match event {
            ConnectionEvent::Lost { .. } => {
                self.lost.fetch_add(1, Ordering::SeqCst);
            }
            ConnectionEvent::Connected { .. } => {
                self.connected.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    fn settled(&self, s: &Settlement<'_>) {
        self.settled
            .lock()
            .unwrap()
            .entry(s.message_id.to_string())
            .or_default()
            .push((s.outcome.to_string(), s.error.map(str::to_string)));
    }
}

impl Watch {
    /// The one settlement of message `id` (asserted to be one): its error, empty if none.
    fn the_one_error(&self, id: &str) -> String {
        let settled = self
            .settled
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .unwrap_or_default();
        assert_eq!(settled.len(), 1, "{settled:?}");
        settled[0].1.clone().unwrap_or_default()
    }

    /// The connection was never lost nor made again.
    fn assert_never_lost(&self, conn: &Connection) {
        assert_eq!(
            self.lost.load(Ordering::SeqCst),
            0,
            "the connection was lost"
        );
        assert_eq!(
            self.connected.load(Ordering::SeqCst),
            1,
            "the connection was made again"
        );
        assert_eq!(conn.generation(), Some(1));
    }
}

/// A connection to the tests' broker that reports to a [`Watch`], and the watch.
fn watched() -> (Connection, Watch) {
    let watch = Watch::default();
    let conn = connect_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .observer(watch.clone()),
    );
    (conn, watch)
}

/// `message` with a text header `name` padded so that its header frame, published with
/// `routing_key` on `conn`, is exactly `size` bytes.
fn padded_to(
    conn: &Connection,
    message: Message,
    name: &str,
    routing_key: &str,
    size: usize,
) -> Message {
    let m = message.with_header(name, "");
    let empty = acemq_amqp::fuzzing::header_frame_size(&m, routing_key, conn.origin());
    assert!(empty <= size, "{empty} > {size}");
    let m = m.with_header(name, "p".repeat(size - empty));
    assert_eq!(
        acemq_amqp::fuzzing::header_frame_size(&m, routing_key, conn.origin()),
        size
    );
    m
}

/// After whatever went before, the connection still publishes and reads on its first link.
fn still_works(conn: &Connection, q: &str) {
    conn.publisher()
        .unwrap()
        .publish("", q, Message::new("after"))
        .expect("the connection still publishes");
    let got = conn.get(q).unwrap().expect("and reads");
    assert_eq!(got.body, b"after");
}

#[test]
fn a_header_too_large_for_the_frame_is_refused_before_sending_as_a_message_fault() {
    let (conn, watch) = watched();
    let (_clean, q) = support::queue_on(&conn, "frame-refused", |spec| spec);
    let publisher = conn.publisher().unwrap();
    let limit = conn.frame_max();
    assert_eq!(limit, 131_072, "the frame size asked for by default");

    let big = Message::new("body").with_header("big", "x".repeat(200_000));
    let e = publisher.publish("", &q, big).unwrap_err();
    assert!(e.is_message_fault(), "a fault of the message: {e:?}");
    assert!(!e.is_retriable(), "not retriable as it is: {e:?}");
    assert!(!e.is_connection_lost(), "{e:?}");
    let text = e.to_string();
    assert!(text.contains(&limit.to_string()), "names the limit: {text}");
    assert!(text.contains("200"), "names the size: {text}");
    assert!(matches!(e, acemq_amqp::Error::FrameTooLarge { size, .. } if size > 200_000));
    assert_eq!(
        conn.queue_info(&q).unwrap().message_count,
        0,
        "nothing sent"
    );
    // The same publisher goes on, on the same connection.
    publisher.publish("", &q, Message::new("next")).unwrap();
    assert_eq!(conn.get(&q).unwrap().unwrap().body, b"next");
    still_works(&conn, &q);
    watch.assert_never_lost(&conn);
    publisher.close().unwrap();
}

/// The size computed before sending is the broker's: a header frame of exactly the limit goes
/// through, one byte more is refused here, and the connection stays up.
#[test]
fn a_header_frame_of_exactly_the_frame_limit_goes_through_and_one_byte_more_is_refused() {
    let (conn, watch) = watched();
    let (_clean, q) = support::queue_on(&conn, "frame-exact", |spec| spec);
    let publisher = conn.publisher().unwrap();
    let limit = conn.frame_max();

    let exact = padded_to(&conn, Message::new("b"), "pad", &q, limit);
    publisher
        .publish("", &q, exact)
        .expect("exactly the limit fits");
    let over = padded_to(&conn, Message::new("b"), "pad", &q, limit + 1);
    let e = publisher.publish("", &q, over).unwrap_err();
    assert!(
        matches!(e, acemq_amqp::Error::FrameTooLarge { size, limit: l, .. } if size == limit + 1 && l == limit),
        "{e:?}"
    );
    // A message of a header frame near the limit and a body many frames long.
    let long_body = padded_to(
        &conn,
        Message::new(vec![7u8; 3 * limit]),
        "pad",
        &q,
        limit - 10,
    );
    publisher.publish("", &q, long_body).unwrap();
    support::wait_for_count(&conn, &q, 2, WAIT);
    watch.assert_never_lost(&conn);
    publisher.close().unwrap();
}

fn an_outbox_row_too_large_for_the_frame_is_counted_and_retired(db: &Db) {
    let (conn, watch) = watched();
    let (_clean, q) = support::queue_on(&conn, "frame-outbox", |spec| spec);
    let store = SqlOutboxStore::open(
        db.factory(),
        SqlOutboxStoreOptions::default()
            .table(db.table("outbox"))
            .max_attempts(3),
    )
    .unwrap();
    store.create_table().unwrap();
    let relay_store = SqlOutboxStore::open(
        db.factory(),
        SqlOutboxStoreOptions::default()
            .table(store.table())
            .max_attempts(3),
    )
    .unwrap();
    let relay = OutboxRelay::new(&conn, relay_store, OutboxRelayOptions::new()).unwrap();
    let big = Message::new("big").with_header("big", "x".repeat(200_000));
    let big_id = db.in_tx(true, |tx| {
        store
            .add(tx, &record_message("", &q, &big).unwrap())
            .unwrap()
    });
    let behind = Message::new("behind");
    db.in_tx(true, |tx| {
        store
            .add(tx, &record_message("", &q, &behind).unwrap())
            .unwrap()
    });
    for attempt in 1..=3 {
        let e = relay.sweep().unwrap_err();
        assert!(
            e.is_message_fault() && !e.is_retriable(),
            "sweep {attempt}: {e:?}"
        );
        assert!(e.to_string().contains("frame limit"), "{e}");
    }
    let retired = store.retired().unwrap();
    assert_eq!(retired.len(), 1, "retired after max_attempts");
    assert_eq!(retired[0].id, big_id);
    assert_eq!(retired[0].attempts, 3, "each sweep counted");
    let last_error = retired[0].last_error.clone().unwrap_or_default();
    assert!(last_error.contains("frame limit"), "{last_error}");
    // Retired, it no longer holds the one behind it.
    let mut published = 0;
    assert!(eventually(WAIT, || {
        published += relay.sweep().unwrap();
        published >= 1
    }));
    assert_eq!(conn.get(&q).unwrap().unwrap().body, b"behind");
    assert!(conn.get(&q).unwrap().is_none());
    watch.assert_never_lost(&conn);
    relay.close().unwrap();
}

#[test]
fn an_outbox_row_too_large_for_the_frame_is_counted_and_retired_on_sqlite() {
    an_outbox_row_too_large_for_the_frame_is_counted_and_retired(&Db::sqlite());
}

#[test]
fn an_outbox_row_too_large_for_the_frame_is_counted_and_retired_on_postgres() {
    an_outbox_row_too_large_for_the_frame_is_counted_and_retired(&Db::postgres());
}

/// What the consumer of `q` did by now: how often the handler ran per body.
type Calls = Arc<Mutex<HashMap<String, usize>>>;

/// A consumer of `q` whose handler answers `outcome` for the message with body `b"big"` and
/// accepts every other.
fn consume(
    conn: &Connection,
    q: &str,
    options: ConsumerOptions,
    outcome: fn() -> Outcome,
) -> (acemq_amqp::RunningConsumer, Calls) {
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let consumer = conn
        .consumer(q, options)
        .unwrap()
        .start(move |m: &Message| {
            *c.lock()
                .unwrap()
                .entry(String::from_utf8_lossy(&m.body).into_owned())
                .or_insert(0) += 1;
            Ok(if m.body == b"big" {
                outcome()
            } else {
                Outcome::Accept
            })
        })
        .unwrap();
    (consumer, calls)
}

/// Publishes the big message (its header frame `size` bytes) and a small one behind it.
fn publish_big_then_small(conn: &Connection, q: &str, size: usize) -> String {
    let big = padded_to(conn, Message::new("big"), "app-pad", q, size).with_header("kept-small", 1);
    publish_then_small(conn, q, padded_to(conn, big, "app-pad", q, size))
}

/// Publishes `big` and a small message behind it to `q`; returns `big`'s id.
fn publish_then_small(conn: &Connection, q: &str, big: Message) -> String {
    let id = big.id().to_string();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", q, big).unwrap();
    publisher.publish("", q, Message::new("small")).unwrap();
    publisher.close().unwrap();
    id
}

/// Waits (up to `WAIT`) until `q`'s `.dlq` holds a message and the small one was handled (it
/// is in `calls`); fails showing the calls and the connection's losses. Returns the `.dlq`.
fn wait_for_a_dead_letter_and_the_small_one(
    conn: &Connection,
    q: &str,
    calls: &Calls,
    watch: &Watch,
) -> String {
    let dlq = dead_letter_queue(q);
    assert!(
        eventually(WAIT, || conn.queue_info(&dlq).unwrap().message_count >= 1
            && calls.lock().unwrap().contains_key("small")),
        "the copy that cannot fit ends in .dlq; seen {:?}, {} lost",
        calls.lock().unwrap(),
        watch.lost.load(Ordering::SeqCst)
    );
    dlq
}

/// The trimmed copy in `.dlq`: the body and the family's headers kept, application headers
/// dropped and named in the reason, which says why.
fn assert_trimmed(conn: &Connection, q: &str, id: &str, reason_part: &str) {
    let dlq = dead_letter_queue(q);
    let copy = conn.get(&dlq).unwrap().expect("the trimmed copy");
    assert!(conn.get(&dlq).unwrap().is_none(), "exactly one copy");
    assert_eq!(copy.id(), id, "its identity kept");
    assert_eq!(copy.body, b"big", "its body kept");
    assert!(
        !copy.headers.contains_key("app-pad"),
        "application headers dropped"
    );
    assert!(!copy.headers.contains_key("kept-small"), "all of them");
    assert_eq!(
        copy.headers
            .get("acemq-original-queue")
            .and_then(|v| v.as_str()),
        Some(q),
        "the family's headers kept"
    );
    let error = copy.envelope.error.clone().unwrap_or_default();
    assert!(error.contains(reason_part), "the handler's reason: {error}");
    assert!(error.contains("frame limit"), "why it was trimmed: {error}");
    assert!(
        error.contains("app-pad") && error.contains("kept-small"),
        "the dropped headers named: {error}"
    );
}

/// A message near the frame limit and a small one behind it, published to `q` and handled by
/// `consumer`: the copy that cannot fit ends in `.dlq` trimmed, with `reason_part` in its error;
/// each was handled once, then `also` holds, the queue still works and nothing was lost.
fn big_then_small_ends_trimmed(
    conn: &Connection,
    watch: &Watch,
    q: &str,
    consumer: acemq_amqp::RunningConsumer,
    calls: &Calls,
    reason_part: &str,
    also: impl FnOnce(),
) {
    let id = publish_big_then_small(conn, q, conn.frame_max() - 40);
    wait_for_a_dead_letter_and_the_small_one(conn, q, calls, watch);
    consumer.close().unwrap();
    assert_trimmed(conn, q, &id, reason_part);
    let seen = calls.lock().unwrap().clone();
    assert_eq!(seen.get("big"), Some(&1), "handled once: {seen:?}");
    assert_eq!(
        seen.get("small"),
        Some(&1),
        "the one behind it once: {seen:?}"
    );
    also();
    still_works(conn, q);
    watch.assert_never_lost(conn);
}

/// The retry copy of a message near the limit, waiting in the consumer (`rung` `None`) or on a
/// broker rung, cannot fit: the message goes to `.dlq` trimmed.
fn a_retry_copy_near_the_frame_limit_dead_letters_a_trimmed_copy(rung: Option<Duration>) {
    let (conn, watch) = watched();
    let mut clean = Cleanup::new(&conn);
    let rungs: Vec<Duration> = rung.into_iter().collect();
    let q = clean.consumed_queue(&unique("frame-near-limit-retry"), &rungs);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let policy = match rung {
        Some(wait) => RetryPolicy::fixed(3, wait).broker_wait_threshold(wait),
        None => RetryPolicy::fixed(3, Duration::from_millis(20)),
    };
    assert_eq!(policy.broker_rungs(), rungs);
    let (consumer, calls) = consume(&conn, &q, ConsumerOptions::new().retry(policy), || {
        Outcome::retry("downstream said no")
    });
    // The original fits; its retry copy, with the consumer's `acemq-original-*` headers, does
    // not.
    big_then_small_ends_trimmed(
        &conn,
        &watch,
        &q,
        consumer,
        &calls,
        "downstream said no",
        || {
            assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
            for rung in &rungs {
                let rung = acemq_amqp::retry_queue(&q, *rung);
                assert_eq!(conn.queue_info(&rung).unwrap().message_count, 0);
            }
        },
    );
}

#[test]
fn a_header_near_the_frame_limit_dead_letters_a_trimmed_copy() {
    a_retry_copy_near_the_frame_limit_dead_letters_a_trimmed_copy(None);
}

#[test]
fn a_header_near_the_frame_limit_dead_letters_a_trimmed_copy_instead_of_a_rung() {
    a_retry_copy_near_the_frame_limit_dead_letters_a_trimmed_copy(Some(Duration::from_secs(1)));
}

/// The size computed is the broker's own: RabbitMQ takes a frame payload of up to `frame_max`
/// bytes (it allows the 8 bytes of framing on top, though AMQP counts them in), so a raw
/// publish whose computed header frame is `frame_max + 8` is taken and one byte more makes it
/// close the connection (`FRAME_ERROR`). The library checks the stricter AMQP limit.
#[test]
fn the_computed_header_frame_size_is_the_one_the_broker_measures() {
    use amiquip::{AmqpProperties, AmqpValue, FieldTable, Publish};
    let (conn, _clean, q) = support::declared_queue("frame-raw");
    let limit = conn.frame_max(); // RabbitMQ's, which raw amiquip takes as it is
    let props = |size: usize| {
        let with = |pad: usize| {
            let mut t = FieldTable::new();
            t.insert("pad".into(), AmqpValue::LongString("p".repeat(pad)));
            AmqpProperties::default()
                .with_headers(t)
                .with_message_id("raw-1".into())
        };
        let empty = acemq_amqp::fuzzing::properties_frame_size(&from_amiquip_properties(&with(0)));
        let p = with(size - empty);
        assert_eq!(
            acemq_amqp::fuzzing::properties_frame_size(&from_amiquip_properties(&p)),
            size
        );
        p
    };
    let publish = |raw: &support::raw::Raw, size: usize| {
        raw.channel.basic_publish(
            "",
            Publish {
                body: b"raw",
                routing_key: q.clone(),
                mandatory: false,
                immediate: false,
                properties: props(size),
            },
        )
    };
    let raw = support::raw::Raw::open();
    publish(&raw, limit + 8).unwrap();
    assert!(
        eventually(WAIT, || raw.get(&q).is_some()),
        "the broker took a payload of frame_max bytes"
    );
    // Queued for the socket. The broker reads frames in order: once it answers the next call,
    // or closes the connection instead, it has dealt with the frame.
    publish(&raw, limit + 9).unwrap();
    let next = raw.channel.basic_get(q.as_str(), false);
    assert!(next.is_err(), "the broker closed the connection: {next:?}");
    assert_eq!(
        conn.queue_info(&q).unwrap().message_count,
        0,
        "nothing arrived"
    );
}

#[test]
fn a_dead_letter_copy_over_the_frame_limit_goes_to_the_dlq_trimmed() {
    let (conn, watch) = watched();
    let (_clean, q) = support::consumed_queue_on(&conn, "frame-near-limit-reject", |spec| spec);
    let (consumer, calls) = consume(&conn, &q, ConsumerOptions::new(), || {
        Outcome::reject("not for us")
    });
    big_then_small_ends_trimmed(&conn, &watch, &q, consumer, &calls, "not for us", || {});
}

/// Even trimmed the copy cannot fit (the family's own headers fill the frame): the original is
/// rejected without requeueing, to the queue's own dead-lettering (here `{q}.dlq` through
/// `acemq.dlx`), and the reason is reported.
#[test]
fn a_copy_that_cannot_fit_even_trimmed_is_rejected_to_the_brokers_dead_lettering() {
    let (conn, watch) = watched();
    let (_clean, q) =
        support::consumed_queue_on(&conn, "frame-untrimmable", QueueSpec::with_dead_letter);
    let (consumer, calls) = consume(&conn, &q, ConsumerOptions::new(), || {
        Outcome::reject("not for us")
    });
    // A family header (kept by any trim) fills the frame.
    let big = padded_to(
        &conn,
        Message::new("big"),
        "acemq-pad",
        &q,
        conn.frame_max() - 40,
    );
    let id = publish_then_small(&conn, &q, big);
    let dlq = wait_for_a_dead_letter_and_the_small_one(&conn, &q, &calls, &watch);
    consumer.close().unwrap();
    // The broker dead-lettered the original itself (its copy, with `x-death`, is not read
    // here: its header frame is over the limit now).
    assert_eq!(conn.queue_info(&dlq).unwrap().message_count, 1);
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.get("big"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("small"), Some(&1), "{calls:?}");
    let error = watch.the_one_error(&id);
    assert!(
        error.contains("frame limit") && error.contains("rejected"),
        "the reason reported: {error}"
    );
    watch.assert_never_lost(&conn);
}

// ---- the request/reply paths, which build their own properties ----------------------------

/// A responder on `q` (its own connection, watched) answering `pong`, with a 200 KB header on
/// the reply to a request whose body is `big`; and how often it ran per body.
fn pong_responder(
    q: &str,
) -> (
    acemq_amqp::patterns::request_reply::RunningResponder,
    Connection,
    Watch,
    Calls,
) {
    let (conn, watch) = watched();
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let responder = acemq_amqp::patterns::request_reply::Responder::new(
        &conn,
        q,
        acemq_amqp::patterns::request_reply::ResponderOptions::new(),
    )
    .and_then(|responder| {
        responder.start(move |m: &Message| {
            let body = String::from_utf8_lossy(&m.body).into_owned();
            *c.lock().unwrap().entry(body.clone()).or_insert(0) += 1;
            let reply = Message::new("pong");
            Ok::<_, acemq_amqp::BoxError>(if body == "big" {
                reply.with_header("big", "x".repeat(200_000))
            } else {
                reply
            })
        })
    })
    .unwrap();
    (responder, conn, watch, calls)
}

/// A started requester on `conn` with `options`, its requests to `q`.
fn requester(conn: &Connection, q: &str, options: RequesterOptions) -> RunningRequester {
    Requester::new(conn, options.routing_key(q))
        .and_then(Requester::start)
        .unwrap()
}

/// Waits (up to `WAIT`) until the request is dead-lettered to `q`'s `.dlq`; fails showing the
/// responder's `calls` and lost connections if it is not. Returns the `.dlq`.
fn wait_dead_lettered(conn: &Connection, q: &str, calls: &Calls, responder: &Watch) -> String {
    let dlq = dead_letter_queue(q);
    assert!(
        eventually(WAIT, || conn.queue_info(&dlq).unwrap().message_count >= 1),
        "the request is dead-lettered; seen {:?}, {} lost",
        calls.lock().unwrap(),
        responder.lost.load(Ordering::SeqCst)
    );
    dlq
}

/// A request whose header frame cannot fit is refused at once, before anything is sent: the
/// connection stays up, the call is forgotten (with a window of one, the next call finds room)
/// and the next request is answered.
#[test]
fn a_request_too_large_for_the_frame_is_refused_at_once_and_the_requester_goes_on() {
    let (conn, watch) = watched();
    let (_clean, q) = support::consumed_queue_on(&conn, "frame-request", |spec| spec);
    let (responder, responder_conn, responder_watch, calls) = pong_responder(&q);
    let options = RequesterOptions::new()
        .window(1)
        .timeout(Duration::from_secs(10));
    let requester = requester(&conn, &q, options);

    let big = Message::new("small").with_header("big", "x".repeat(200_000));
    let e = requester.ask(big).unwrap_err();
    assert!(
        matches!(e, acemq_amqp::Error::FrameTooLarge { size, limit, .. }
            if size > 200_000 && limit == conn.frame_max()),
        "refused before sending: {e:?}"
    );
    assert!(e.is_message_fault() && !e.is_retriable(), "{e:?}");
    assert_eq!(requester.timed_out(), 0);

    // Forgotten: with a window of one a leaked call would leave no room for this one.
    let reply = requester
        .ask_timeout(Message::new("small"), Duration::from_secs(10))
        .expect("the next request is answered");
    assert_eq!(reply.body, b"pong");
    let reply = requester
        .ask_timeout(Message::new("small"), Duration::from_secs(10))
        .expect("and the one after it");
    assert_eq!(reply.body, b"pong");
    requester.close().unwrap();
    responder.close().unwrap();
    assert_eq!(calls.lock().unwrap().get("small"), Some(&2));
    assert_eq!(
        conn.queue_info(&q).unwrap().message_count,
        0,
        "nothing sent"
    );
    watch.assert_never_lost(&conn);
    responder_watch.assert_never_lost(&responder_conn);
}

/// A responder whose reply cannot fit in a frame: the reply is never sent as is (RabbitMQ would
/// close the responder's connection, and the request would come back and go round again). The
/// caller gets the family's failure reply naming the frame limit at once, rather than a
/// timeout, and the request, handled once, is dead-lettered with that reason — as any request
/// whose reply is a failure.
///
/// `named`: replies go to a durable reply queue of that name (confirmed by the responder's
/// publisher) rather than to the requester's transient one (staged, sent on the request's
/// channel).
fn a_reply_too_large_for_the_frame_sends_the_failure_reply(named: bool) {
    let (conn, watch) = watched();
    let (mut clean, q) = support::consumed_queue_on(&conn, "frame-reply", |spec| spec);
    let (responder, responder_conn, responder_watch, calls) = pong_responder(&q);
    let mut options = RequesterOptions::new().timeout(Duration::from_secs(10));
    if named {
        options = options.reply_queue(clean.queue(&unique("frame-reply-to")));
    }
    let requester = requester(&conn, &q, options);

    let request = Message::new("big");
    let id = request.id().to_string();
    let e = requester.ask(request).unwrap_err();
    match &e {
        acemq_amqp::Error::Responder { message } => {
            assert!(
                message.contains("frame limit") && message.contains("reply"),
                "the failure reply says why: {message}"
            );
        }
        other => panic!("the family's failure reply, at once: {other:?}"),
    }
    let reply = requester
        .ask(Message::new("small"))
        .expect("the next request is answered");
    assert_eq!(reply.body, b"pong");

    let dlq = wait_dead_lettered(&conn, &q, &calls, &responder_watch);
    requester.close().unwrap();
    responder.close().unwrap();
    let copy = conn.get(&dlq).unwrap().expect("the request's copy");
    assert!(conn.get(&dlq).unwrap().is_none(), "exactly one copy");
    assert_eq!(copy.id(), id);
    assert_eq!(copy.body, b"big");
    let error = copy.envelope.error.clone().unwrap_or_default();
    assert!(
        error.contains("frame limit") && error.contains("reply"),
        "the reason: {error}"
    );
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.get("big"), Some(&1), "handled once: {calls:?}");
    assert_eq!(calls.get("small"), Some(&1), "{calls:?}");
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    watch.assert_never_lost(&conn);
    responder_watch.assert_never_lost(&responder_conn);
}

#[test]
fn a_reply_too_large_for_the_frame_sends_the_failure_reply_and_dead_letters_the_request() {
    a_reply_too_large_for_the_frame_sends_the_failure_reply(false);
}

#[test]
fn a_reply_too_large_for_a_named_reply_queue_sends_the_failure_reply_and_dead_letters_it() {
    a_reply_too_large_for_the_frame_sends_the_failure_reply(true);
}

/// A request whose correlation id (copied onto every reply, the failure reply too) leaves no
/// room for a reply: none is sent — neither the reply nor the failure reply fits — and the
/// request, handled once, is dead-lettered with the reason (here by the broker: even its
/// trimmed copy keeps the family's `x-acemq-correlation`, too large), with no connection lost.
#[test]
fn a_request_whose_correlation_id_leaves_no_room_for_a_reply_is_dead_lettered_unanswered() {
    use acemq_amqp::headers;
    use amiquip::{AmqpProperties, AmqpValue, FieldTable};
    let (conn, watch) = watched();
    let (_clean, q) = support::consumed_queue_on(
        &conn,
        "frame-reply-correlation",
        QueueSpec::with_dead_letter,
    );
    let (responder, responder_conn, responder_watch, calls) = pong_responder(&q);
    let raw = support::raw::Raw::open();
    // A transient reply queue as the family's requesters declare theirs.
    let reply_queue = raw.family_reply_queue();
    let id = acemq_amqp::new_id();
    let props = |pad: usize| {
        let mut h = FieldTable::new();
        h.insert("x-acemq-id".into(), support::raw::text(&id));
        h.insert(
            "x-acemq-correlation".into(),
            AmqpValue::LongString("c".repeat(pad)),
        );
        h.insert(headers::REPLY_TO.into(), support::raw::text(&reply_queue));
        AmqpProperties::default()
            .with_headers(h)
            .with_message_id(id.clone())
            .with_reply_to(reply_queue.clone())
    };
    // The request fits, 100 bytes under the limit; a reply, with its own envelope, does not.
    let empty = acemq_amqp::fuzzing::properties_frame_size(&from_amiquip_properties(&props(0)));
    let request = props(conn.frame_max() - 100 - empty);
    assert_eq!(
        acemq_amqp::fuzzing::properties_frame_size(&from_amiquip_properties(&request)),
        conn.frame_max() - 100
    );
    raw.publish("", &q, b"huge-correlation", request);

    let dlq = wait_dead_lettered(&conn, &q, &calls, &responder_watch);
    // The responder goes on.
    let requester = support::requester(&conn, &q);
    let reply = requester
        .ask_timeout(Message::new("small"), WAIT)
        .expect("the next request is answered");
    assert_eq!(reply.body, b"pong");
    requester.close().unwrap();
    responder.close().unwrap();
    assert!(raw.get(&reply_queue).is_none(), "no reply was sent");
    assert_eq!(conn.queue_info(&dlq).unwrap().message_count, 1);
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.get("huge-correlation"),
        Some(&1),
        "handled once: {calls:?}"
    );
    let error = responder_watch.the_one_error(&id);
    assert!(
        error.contains("reply could not be sent") && error.contains("frame limit"),
        "the reason reported: {error}"
    );
    watch.assert_never_lost(&conn);
    responder_watch.assert_never_lost(&responder_conn);
}
