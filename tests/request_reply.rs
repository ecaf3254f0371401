//! Request/reply on the real broker: the requester, the responder, the wire between them and
//! recovery from a connection cut. The scenarios that hold on both transports — a reply, a
//! responder's error, a timed-out request and its late reply, concurrent calls, an unroutable
//! request — are written once, in `tests/equivalence_patterns.rs`.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::intercept::{PublishContext, PublishNext};
use acemq_amqp::observe::Observer;
use acemq_amqp::observe::PublishOutcome;
use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions, RunningResponder,
};
use acemq_amqp::{
    headers, BoxError, Connection, ConnectionOptions, ConsumerOptions, Error, Message, QueueSpec,
    Ticket,
};
use amiquip::{AmqpProperties, AmqpValue, FieldTable};

use support::raw::{text_of, Raw};
use support::{connect, connect_with, eventually, request_queue, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

fn echo(connection: &Connection, queue: &str, workers: usize) -> RunningResponder {
    echo_with(
        connection,
        queue,
        ConsumerOptions::new().concurrency(workers),
    )
}

fn echo_with(connection: &Connection, queue: &str, options: ConsumerOptions) -> RunningResponder {
    Responder::new(connection, queue, ResponderOptions::new().consumer(options))
        .and_then(|responder| {
            responder.start(|m: &Message| {
                Ok::<_, BoxError>(format!("answer:{}", String::from_utf8_lossy(&m.body)))
            })
        })
        .expect("serve")
}

/// What the responder saw of a request: header address, property address, correlation.
type Seen = (Option<String>, Option<String>, Option<String>);

#[test]
fn a_request_gets_its_reply_with_the_family_wire() {
    let connection = connect();
    let mut clean = Cleanup::new(&connection);
    let q = request_queue(&connection, &mut clean, "rr-round-trip");
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let s = seen.clone();
    let responder = Responder::new(&connection, &q, ResponderOptions::new())
        .and_then(|responder| {
            responder.start(move |m: &Message| {
                let header = m
                    .headers
                    .get(headers::REPLY_TO)
                    .and_then(|v| v.as_str().map(String::from));
                s.lock().unwrap().push((
                    header,
                    m.reply_to.clone(),
                    m.envelope.correlation_id.clone(),
                ));
                Ok::<_, BoxError>(support::pong(m))
            })
        })
        .expect("serve");
    let requester = support::requester(&connection, &q);
    let reply_queue = requester.reply_queue().expect("a reply queue");
    assert!(reply_queue.starts_with("acemq-reply-"), "{reply_queue}");
    let info = connection
        .queue_info(&reply_queue)
        .expect("the reply queue exists");
    assert_eq!(info.consumer_count, 1);

    let request = Message::new("ping").with_id(unique("request-id"));
    let request_id = request.id().to_string();
    let started = Instant::now();
    let reply = requester.ask(request).expect("a reply");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(reply.body, b"pong:ping");
    assert_eq!(
        reply.envelope.causation_id.as_deref(),
        Some(request_id.as_str())
    );
    let (header, property, correlation) = seen.lock().unwrap()[0].clone();
    assert_eq!(header.as_deref(), Some(reply_queue.as_str()));
    assert_eq!(property.as_deref(), Some(reply_queue.as_str()));
    let correlation = correlation.expect("a correlation id");
    assert_ne!(correlation, request_id, "a fresh correlation per request");
    assert_eq!(reply.envelope.correlation_id, Some(correlation));
    // Each request gets a fresh correlation.
    requester.ask("again").expect("a second reply");
    let second = seen.lock().unwrap()[1].2.clone();
    assert_ne!(second, seen.lock().unwrap()[0].2);
    assert_eq!(responder.answered(), 2);
    assert_eq!(requester.unmatched(), 0);
    requester.close().expect("close the requester");
    // Transient, auto-delete: gone with its consumer.
    assert!(eventually(WAIT, || connection
        .queue_info(&reply_queue)
        .is_err()));
    responder.close().expect("close the responder");
}

#[test]
fn sixteen_threads_asking_through_one_requester_each_get_their_own_answer() {
    sixteen_threads_ask(ConsumerOptions::new().concurrency(4));
}

/// The same through a responder that handles on its consumer's own thread.
#[test]
fn sixteen_threads_asking_an_inline_responder_each_get_their_own_answer() {
    sixteen_threads_ask(ConsumerOptions::new().inline(true));
}

fn sixteen_threads_ask(options: ConsumerOptions) {
    let connection = connect();
    let mut clean = Cleanup::new(&connection);
    let q = request_queue(&connection, &mut clean, "rr-threads");
    let responder = echo_with(&connection, &q, options);
    let requester = support::requester(&connection, &q);
    std::thread::scope(|s| {
        for t in 0..16 {
            let requester = &requester;
            s.spawn(move || {
                for i in 0..50 {
                    let question = format!("t{t}-q{i}");
                    let reply = requester
                        .ask_timeout(question.clone(), WAIT)
                        .expect("a reply");
                    assert_eq!(reply.body, format!("answer:{question}").into_bytes());
                }
            });
        }
    });
    assert_eq!(responder.answered(), 16 * 50);
    assert_eq!(requester.unmatched(), 0);
    assert_eq!(requester.timed_out(), 0);
    requester.close().unwrap();
    responder.close().unwrap();
}

/// A request from a plain AMQP client (raw amiquip) with its reply address in one place only.
fn raw_request(raw: &Raw, queue: &str, correlation: &str, id: &str, reply: Reply<'_>) {
    let mut table = FieldTable::new();
    table.insert(
        headers::CORRELATION.to_string(),
        AmqpValue::LongString(correlation.to_string()),
    );
    table.insert(
        headers::ID.to_string(),
        AmqpValue::LongString(id.to_string()),
    );
    let mut props = AmqpProperties::default().with_message_id(id.to_string());
    match reply {
        Reply::Property(q) => props = props.with_reply_to(q.to_string()),
        Reply::HeaderBytes(q) => {
            table.insert(
                headers::REPLY_TO.to_string(),
                AmqpValue::ByteArray(q.as_bytes().to_vec()),
            );
        }
        Reply::Nowhere => {}
    }
    raw.publish("", queue, b"question", props.with_headers(table));
}

enum Reply<'a> {
    Property(&'a str),
    HeaderBytes(&'a str),
    Nowhere,
}

#[test]
fn requests_with_only_the_property_or_only_the_header_are_both_answered() {
    let connection = connect();
    let mut clean = Cleanup::new(&connection);
    let q = request_queue(&connection, &mut clean, "rr-address");
    let replies = clean.queue(&unique("rr-address-replies"));
    connection
        .declare_queue(&QueueSpec::new(&replies).classic())
        .unwrap();
    let responder = echo(&connection, &q, 1);
    let raw = Raw::open();
    let id_p = unique("by-property");
    let id_h = unique("by-header");
    raw_request(&raw, &q, "corr-property", &id_p, Reply::Property(&replies));
    raw_request(&raw, &q, "corr-header", &id_h, Reply::HeaderBytes(&replies));
    let mut got: BTreeMap<String, (String, Vec<u8>)> = BTreeMap::new();
    assert!(eventually(WAIT, || {
        while let Some((props, _, body)) = raw.get(&replies) {
            let h = props.headers().clone().unwrap_or_default();
            let correlation = text_of(h.get(headers::CORRELATION)).unwrap_or_default();
            let causation = text_of(h.get(headers::CAUSATION)).unwrap_or_default();
            got.insert(correlation, (causation, body));
        }
        got.len() == 2
    }));
    assert_eq!(
        got["corr-property"],
        (id_p.clone(), b"answer:question".to_vec())
    );
    assert_eq!(
        got["corr-header"],
        (id_h.clone(), b"answer:question".to_vec())
    );
    assert_eq!(responder.answered(), 2);
    assert_eq!(responder.unanswerable(), 0);
    raw.close();
    responder.close().unwrap();
}

#[test]
fn a_request_without_a_reply_address_is_counted_unanswerable_and_dead_lettered() {
    let connection = connect();
    let mut clean = Cleanup::new(&connection);
    let q = request_queue(&connection, &mut clean, "rr-unanswerable");
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let responder = Responder::new(&connection, &q, ResponderOptions::new())
        .and_then(|responder| {
            responder.start(move |_: &Message| {
                r.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>("never")
            })
        })
        .expect("serve");
    let raw = Raw::open();
    let id = unique("nowhere");
    raw_request(&raw, &q, "corr-nowhere", &id, Reply::Nowhere);
    assert!(eventually(WAIT, || responder.unanswerable() == 1));
    let mut dead = None;
    assert!(eventually(WAIT, || {
        dead = connection.get(&acemq_amqp::dead_letter_queue(&q)).unwrap();
        dead.is_some()
    }));
    let dead = dead.unwrap();
    assert_eq!(dead.id(), id);
    assert_eq!(dead.envelope.attempt, 1, "never retried");
    let error = dead.envelope.error.clone().unwrap_or_default();
    assert!(error.contains("reply address"), "{error}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never ran");
    assert_eq!(responder.answered(), 0);
    assert_eq!(responder.unanswerable(), 1);
    raw.close();
    responder.close().unwrap();
}

#[test]
fn answered_already_counts_a_reply_when_the_caller_holds_it() {
    let connection = connect();
    let mut clean = Cleanup::new(&connection);
    let q = request_queue(&connection, &mut clean, "rr-answered");
    let responder = echo(&connection, &q, 1);
    let requester = support::requester(&connection, &q);
    for i in 1..=20u64 {
        requester.ask(format!("{i}")).expect("a reply");
        assert_eq!(responder.answered(), i);
    }
    requester.close().unwrap();
    responder.close().unwrap();
}

#[test]
fn a_named_reply_queue_is_durable_and_kept() {
    let connection = connect();
    let mut clean = Cleanup::new(&connection);
    let q = request_queue(&connection, &mut clean, "rr-named");
    let replies = clean.queue(&unique("rr-named-replies"));
    let responder = echo(&connection, &q, 1);
    let requester = Requester::new(
        &connection,
        RequesterOptions::new()
            .reply_queue(&replies)
            .routing_key(&q),
    )
    .and_then(Requester::start)
    .expect("requester");
    assert_eq!(requester.reply_queue().as_deref(), Some(replies.as_str()));
    assert_eq!(requester.ask("x").unwrap().body, b"answer:x");
    requester.close().unwrap();
    assert!(connection.queue_info(&replies).is_ok(), "kept after close");
    responder.close().unwrap();
}

#[test]
fn requester_and_responder_survive_a_connection_cut() {
    survive_a_cut(ConsumerOptions::new().concurrency(4));
}

/// The same with the responder's handler on its consumer's own thread: the request running at
/// the cut holds that thread until it is released, then the responder resubscribes.
#[test]
fn requester_and_an_inline_responder_survive_a_connection_cut() {
    survive_a_cut(ConsumerOptions::new().inline(true));
}

fn survive_a_cut(options: ConsumerOptions) {
    let direct = connect();
    let mut clean = Cleanup::new(&direct);
    let q = request_queue(&direct, &mut clean, "rr-cut");
    let (proxy, connection) = support::through_proxy(Duration::from_millis(300));
    let (release, gate) = crossbeam_channel::bounded::<()>(0);
    let blocked = Arc::new(AtomicUsize::new(0));
    let b = blocked.clone();
    let responder = Responder::new(&connection, &q, ResponderOptions::new().consumer(options))
        .and_then(|responder| {
            responder.start(move |m: &Message| {
                if m.body == b"block" {
                    b.fetch_add(1, Ordering::SeqCst);
                    // Ends when the sender is dropped.
                    let _ = gate.recv_timeout(WAIT);
                }
                Ok::<_, BoxError>(format!("answer:{}", String::from_utf8_lossy(&m.body)))
            })
        })
        .expect("serve");
    let requester = support::requester(&connection, &q);
    assert_eq!(requester.ask("before").unwrap().body, b"answer:before");
    let first_queue = requester.reply_queue().unwrap();

    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            let started = Instant::now();
            (requester.ask_timeout("block", WAIT), started.elapsed())
        });
        assert!(eventually(WAIT, || blocked.load(Ordering::SeqCst) >= 1));
        proxy.cut();
        let (result, took) = waiting.join().unwrap();
        let e = result.expect_err("the call waiting at the cut fails");
        assert!(e.is_connection_lost() && e.is_retriable(), "{e}");
        assert!(took < Duration::from_secs(10), "took {took:?}");
    });
    drop(release);

    // After recovery: a new reply queue, and both sides work again.
    let reply = requester
        .ask_timeout("after", WAIT)
        .expect("a reply after the cut");
    assert_eq!(reply.body, b"answer:after");
    let second_queue = requester.reply_queue().unwrap();
    assert_ne!(first_queue, second_queue);
    for i in 0..10 {
        let q = format!("again-{i}");
        assert_eq!(
            requester.ask_timeout(q.clone(), WAIT).unwrap().body,
            format!("answer:{q}").into_bytes()
        );
    }
    // The request whose handler was running at the cut is the broker's again: answered once
    // more on the new connection — to its caller's reply queue, which went with the old
    // connection, so the reply comes back unroutable. The reply of its first run never went
    // out (its channel was gone) and is not counted.
    assert!(eventually(WAIT, || blocked.load(Ordering::SeqCst) >= 2));
    assert!(eventually(WAIT, || responder.unroutable() == 1));
    assert_eq!(responder.answered(), 12, "before, after and 10 again");
    requester.close().unwrap();
    responder.close().unwrap();
    let _ = connection.close();
}

/// Connections the responder replies through: plain (replies go out on the request's own
/// connection without confirms) and with a publish interceptor (replies go through a
/// confirming publisher, so that the interceptor hears the broker's answer).
fn reply_paths() -> Vec<(&'static str, Connection)> {
    let intercepted = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .intercept_publish(
                |context: PublishContext, next: PublishNext<'_>| -> Result<Ticket, Error> {
                    next.run(context)
                },
            ),
    );
    vec![("plain", connect()), ("intercepted", intercepted)]
}

/// Sends a request (raw, as another library would) whose reply queue `gone` no longer exists
/// (its requester closed before the answer came) and waits until `responder` has counted the
/// reply the broker returned.
fn ask_for_a_requester_that_went_away(queue: &str, gone: &str, responder: &RunningResponder) {
    let raw = Raw::open();
    raw_request(
        &raw,
        queue,
        "corr-gone",
        &unique("gone"),
        Reply::Property(gone),
    );
    assert!(
        eventually(WAIT, || responder.unroutable() == 1),
        "the unroutable reply to {gone} is counted (unroutable: {})",
        responder.unroutable()
    );
    raw.close();
}

/// Both ways a reply goes out: to a generated (transient) reply queue on the request's channel
/// before its ack, to a named one through a confirming publisher — and with publish
/// interceptors always the latter.
#[test]
fn a_reply_to_a_requester_that_went_away_is_counted_unroutable_and_its_request_acknowledged() {
    for (path, connection) in reply_paths() {
        let generated = format!("acemq-reply-{}", unique("gone"));
        for gone in [generated, unique("rr-gone-named-replies")] {
            let mut clean = Cleanup::new(&connection);
            let q = request_queue(&connection, &mut clean, "rr-gone");
            let responder = echo(&connection, &q, 2);
            ask_for_a_requester_that_went_away(&q, &gone, &responder);
            assert_eq!(responder.answered(), 0, "{path}, {gone}: not answered");
            // Still answering the next one.
            let requester = support::requester(&connection, &q);
            assert_eq!(requester.ask("next").unwrap().body, b"answer:next");
            assert_eq!(responder.answered(), 1, "{path}, {gone}");
            requester.close().unwrap();
            responder.close().unwrap();
            // Acknowledged: nothing went back to the queue when the responder closed, and
            // nothing was dead-lettered.
            let left = connection.queue_info(&q).unwrap().message_count;
            assert_eq!(left, 0, "{path}, {gone}");
            let dead = connection.get(&acemq_amqp::dead_letter_queue(&q)).unwrap();
            assert!(dead.is_none(), "{path}, {gone}");
        }
    }
}

/// A publish interceptor sees every reply and hears the broker's answer to it, as it does any
/// publish.
#[test]
fn replies_pass_through_the_connections_publish_interceptors() {
    let heard: Arc<Mutex<Vec<String>>> = Arc::default();
    let h = heard.clone();
    let connection = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .intercept_publish(
                move |mut context: PublishContext,
                      next: PublishNext<'_>|
                      -> Result<Ticket, Error> {
                    context.message = context.message.with_header("x-test-stamped", "yes");
                    let (h, key) = (h.clone(), context.routing_key.clone());
                    context.when_answered(move |answer| {
                        h.lock().unwrap().push(format!("{key}: {}", answer.is_ok()));
                    });
                    next.run(context)
                },
            ),
    );
    let mut clean = Cleanup::new(&connection);
    let q = request_queue(&connection, &mut clean, "rr-intercepted");
    let responder = echo(&connection, &q, 1);
    let requester = support::requester(&connection, &q);
    let reply = requester.ask("stamp me").expect("a reply");
    assert_eq!(reply.body, b"answer:stamp me");
    assert_eq!(
        reply.headers.get("x-test-stamped"),
        Some(&acemq_amqp::HeaderValue::Text("yes".into()))
    );
    let reply_queue = requester.reply_queue().unwrap();
    assert!(eventually(WAIT, || heard
        .lock()
        .unwrap()
        .contains(&format!("{reply_queue}: true"))));
    requester.close().unwrap();
    responder.close().unwrap();
}

/// A named reply queue is durable: responders confirm replies to it. The generated transient
/// queues' prefix is theirs alone (responders send replies to those unconfirmed).
#[test]
fn a_named_reply_queue_may_not_take_the_generated_prefix() {
    let connection = connect();
    let e = Requester::new(
        &connection,
        RequesterOptions::new()
            .reply_queue("acemq-reply-mine")
            .routing_key("anywhere"),
    )
    .and_then(Requester::start)
    .expect_err("refused");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("acemq-reply-"), "{e}");
}

/// A request that cannot be sent (a header in the engine's reserved prefix) fails at once with a
/// clear error and leaves no waiting call behind: with room for one waiting call, the next
/// request still gets its answer.
#[test]
fn a_request_with_a_reserved_header_is_refused_at_once_and_leaves_no_call_waiting() {
    let connection = connect();
    let mut clean = Cleanup::new(&connection);
    let q = request_queue(&connection, &mut clean, "rr-bad");
    let responder = echo(&connection, &q, 1);
    let requester = Requester::new(
        &connection,
        RequesterOptions::new().window(1).routing_key(&q),
    )
    .and_then(Requester::start)
    .expect("requester");
    let started = Instant::now();
    let bad = Message::new("bad").with_header("x-acemq-mine", "not mine to set");
    match requester.ask_timeout(bad, WAIT) {
        Err(e @ Error::InvalidHeader { .. }) => {
            assert!(e.to_string().contains("x-acemq-"), "{e}")
        }
        other => panic!("expected InvalidHeader, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );
    let reply = requester.ask_timeout("good", WAIT).expect("the next one");
    assert_eq!(reply.body, b"answer:good");
    assert_eq!(
        responder.answered(),
        1,
        "the bad one never reached the responder"
    );
    requester.close().unwrap();
    responder.close().unwrap();
}

/// What a connection's observer hears of publishes (`acemq.publish.total`).
#[derive(Clone, Default)]
struct Publishes(Arc<Mutex<Vec<(String, PublishOutcome)>>>);

impl Observer for Publishes {
    fn published(&self, exchange: &str, outcome: PublishOutcome) {
        self.0.lock().unwrap().push((exchange.to_string(), outcome));
    }
}

impl Publishes {
    fn connection(&self) -> Connection {
        connect_with(
            ConnectionOptions::new()
                .address(support::amqp_url())
                .observer(self.clone()),
        )
    }

    fn seen(&self) -> Vec<PublishOutcome> {
        self.0.lock().unwrap().iter().map(|(_, o)| *o).collect()
    }
}

/// Requests and replies go out without publisher confirms, but every one reaches the
/// connection's observer: `unconfirmed` when sent, and `unroutable` as well when the broker
/// returns it (a request to no queue, a reply whose requester went away).
#[test]
fn requests_and_replies_sent_without_confirms_reach_the_observer() {
    use PublishOutcome::{Unconfirmed, Unroutable};
    let (asking, answering) = (Publishes::default(), Publishes::default());
    let (requests, replies) = (asking.connection(), answering.connection());
    let mut clean = Cleanup::new(&requests);
    let q = request_queue(&requests, &mut clean, "rr-observed");
    let responder = echo(&replies, &q, 1);
    let requester = support::requester(&requests, &q);
    for i in 0..3 {
        requester.ask(format!("q{i}")).expect("a reply");
    }
    assert_eq!(asking.seen(), vec![Unconfirmed; 3], "three requests");
    assert!(
        eventually(WAIT, || answering.seen() == vec![Unconfirmed; 3]),
        "three replies: {:?}",
        answering.seen()
    );
    assert!(answering
        .0
        .lock()
        .unwrap()
        .iter()
        .all(|(x, _)| x.is_empty()));

    // Both events, in either order: the broker's return can be heard (on the I/O side) before
    // the sending thread reports its send.
    let sent_and_returned = |seen: &[PublishOutcome]| {
        seen.len() == 2 && seen.contains(&Unconfirmed) && seen.contains(&Unroutable)
    };
    let nowhere = Requester::new(
        &requests,
        RequesterOptions::new().routing_key(unique("rr-no-queue")),
    )
    .and_then(Requester::start)
    .expect("requester");
    let e = nowhere.ask("lost").expect_err("no queue takes it");
    assert!(e.is_unroutable(), "{e}");
    assert!(
        eventually(WAIT, || sent_and_returned(&asking.seen()[3..])),
        "the unroutable request: {:?}",
        asking.seen()
    );

    let gone = format!("acemq-reply-{}", unique("gone"));
    ask_for_a_requester_that_went_away(&q, &gone, &responder);
    assert!(
        eventually(WAIT, || sent_and_returned(&answering.seen()[3..])),
        "the reply nobody waits for: {:?}",
        answering.seen()
    );
    nowhere.close().unwrap();
    requester.close().unwrap();
    responder.close().unwrap();
}
