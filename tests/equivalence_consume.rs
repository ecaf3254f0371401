//! The consumer and the patterns built on it, one body on both transports (RabbitMQ and the
//! in-process `memory://` broker, `tests/support/both.rs`): the outcomes (accept, retry,
//! reject / dead-letter, park; a handler error and a panic) and what reaches `.dlq` and
//! `.parked` with the family's headers; the retry ladder through a TTL rung of 30 s; ordering
//! (`patterns::ordering`); pipelines (`patterns::pipeline`); consumer groups
//! (`patterns::consumer_group`). A body that passes on `amqp` and fails on `memory` is a defect
//! of the memory broker.

#[macro_use]
mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::{Observer, Settlement};
use acemq_amqp::patterns::consumer_group::{ConsumerGroup, ConsumerGroupOptions};
use acemq_amqp::patterns::ordering::{by_header, ordered};
use acemq_amqp::patterns::pipeline::{then, Next, NOTHING};
use acemq_amqp::{
    dead_letter_queue, parked_queue, retry_queue, Connection, ConnectionOptions, ConsumerOptions,
    FatalError, Handler, HandlerResult, HeaderValue, Message, Outcome, PublisherOptions, QueueSpec,
    RetryPolicy, RunningConsumer,
};
use serde_json::json;
use support::keyed::{key_of, publish_keyed, seq_of};
use support::{collect, eventually, publish_n, unique};

const WAIT: Duration = Duration::from_secs(30);

/// The rung of the ladder tests: the broker-wait threshold's default, 30 s.
const RUNG: Duration = Duration::from_secs(30);

/// On RabbitMQ the rung's TTL passes in real time: a deadline that covers it, with room.
const RUNG_WAIT: Duration = Duration::from_secs(90);

/// Three attempts, waiting 100 ms then 200 ms in the consumer (under the broker-wait threshold),
/// without jitter.
fn short_ladder() -> RetryPolicy {
    RetryPolicy::exponential()
        .max_attempts(3)
        .initial_delay(Duration::from_millis(100))
        .max_delay(Duration::from_secs(1))
        .jitter(0.0)
}

/// The settlements an observer saw: (queue, outcome, attempt).
#[derive(Default)]
struct Recorder(Mutex<Vec<(String, String, u32)>>);

impl Observer for Recorder {
    fn settled(&self, s: &Settlement<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((s.queue.to_string(), s.outcome.to_string(), s.attempt));
    }
}

impl Recorder {
    /// The (outcome, attempt) of each settlement on `queue`, in order.
    fn outcomes(&self, queue: &str) -> Vec<(String, u32)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(q, _, _)| q == queue)
            .map(|(_, o, a)| (o.clone(), *a))
            .collect()
    }
}

/// How many messages `queue` holds now.
fn depth(conn: &Connection, queue: &str) -> u32 {
    conn.queue_info(queue).unwrap().message_count
}

/// Publishes `m` to `queue` through the default exchange, confirmed.
fn put(conn: &Connection, queue: &str, m: Message) {
    let publisher = conn.publisher().unwrap();
    publisher.publish("", queue, m).unwrap();
    publisher.close().unwrap();
}

/// A header of a received copy as text (the family's `acemq-*` headers are application
/// headers, its `x-acemq-*` ones engine headers).
fn text_header(m: &Message, name: &str) -> Option<String> {
    m.headers
        .get(name)
        .or_else(|| m.engine_header(name))
        .and_then(|v| match v {
            HeaderValue::Text(s) => Some(s.clone()),
            _ => None,
        })
}

/// On `on`, with `conn`: the clean-up and a consumed queue named after `prefix` (its rungs
/// `rungs` cleaned up too), declared with the defaults.
fn consumed_queue(
    on: &support::both::On,
    conn: &Connection,
    prefix: &str,
    rungs: &[Duration],
) -> (acemq_amqp::testing::Cleanup, String) {
    let mut clean = on.cleanup();
    let q = clean.consumed_queue(&unique(prefix), rungs);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    (clean, q)
}

/// A consumer of `q` with `options` running `handler`, started.
fn consume(
    conn: &Connection,
    q: &str,
    options: ConsumerOptions,
    handler: impl Handler + Send + Sync + 'static,
) -> RunningConsumer {
    conn.consumer(q, options).unwrap().start(handler).unwrap()
}

/// The record of `(id, attempt)` of each call of a handler made by [`recorded`].
type Calls = Arc<Mutex<Vec<(String, u32)>>>;

/// `handler`, recording each call's message id and attempt first, and the record.
fn recorded(
    handler: impl Fn(&Message) -> HandlerResult + Send + Sync + 'static,
) -> (
    Calls,
    impl Fn(&Message) -> HandlerResult + Send + Sync + 'static,
) {
    let calls = Calls::default();
    let c = calls.clone();
    let recording = move |m: &Message| {
        c.lock()
            .unwrap()
            .push((m.id().to_string(), m.envelope.attempt));
        handler(m)
    };
    (calls, recording)
}

/// A handler that fails (`not yet`) before attempt `attempt` and accepts from it on.
fn fails_until(attempt: u32) -> impl Fn(&Message) -> HandlerResult + Send + Sync + 'static {
    move |m: &Message| {
        if m.envelope.attempt < attempt {
            Err("not yet".into())
        } else {
            Ok(Outcome::Accept)
        }
    }
}

/// Takes the messages of `dlq` and asserts there is exactly one, of `id` at attempt `attempt`;
/// returns it.
fn the_dead_letter(conn: &Connection, dlq: &str, id: &str, attempt: u32) -> Message {
    let mut dead = drain(conn, dlq);
    assert_eq!(dead.len(), 1, "dead-lettered once");
    assert_eq!(dead[0].id(), id);
    assert_eq!(dead[0].envelope.attempt, attempt);
    dead.remove(0)
}

/// Closes (by `close`, on a thread of its own) a consumer whose handlers are held until
/// `release` is dropped: waits until `requeued` deliveries are back on `q`, lets the handlers
/// go, and asserts the close's report: `finished` finished in time, `requeued` requeued, none
/// abandoned.
fn close_while_held(
    conn: &Connection,
    q: &str,
    close: impl FnOnce() -> acemq_amqp::Result<acemq_amqp::CloseReport> + Send + 'static,
    release: crossbeam_channel::Sender<()>,
    (finished, requeued): (usize, usize),
) {
    let closing = std::thread::spawn(close);
    assert!(
        eventually(WAIT, || depth(conn, q) == requeued as u32),
        "the {requeued} that never started go back while the {finished} run"
    );
    drop(release);
    let report = closing.join().unwrap().unwrap();
    assert_eq!(
        report.finished_in_time, finished,
        "only those running finished"
    );
    assert_eq!(report.requeued, requeued);
    assert_eq!(report.abandoned, 0);
}

/// On `on`: a connection, the clean-up, and two consumed queues named after `input` and
/// `output`, declared with the defaults (a pipeline step's in and out).
fn step_queues(
    on: &support::both::On,
    input: &str,
    output: &str,
) -> (Connection, acemq_amqp::testing::Cleanup, String, String) {
    let conn = on.connect();
    let mut clean = on.cleanup();
    let (input, output) = (
        clean.consumed_queue(&unique(input), &[]),
        clean.consumed_queue(&unique(output), &[]),
    );
    conn.declare_queue(&QueueSpec::new(&input)).unwrap();
    conn.declare_queue(&QueueSpec::new(&output)).unwrap();
    (conn, clean, input, output)
}

/// Takes every message now on `queue` (`basic.get` until empty).
fn drain(conn: &Connection, queue: &str) -> Vec<Message> {
    let mut got = Vec::new();
    while let Some(m) = conn.get(queue).unwrap() {
        got.push(m);
    }
    got
}

/// Key `k`: seq 0 fails its first attempt, 1 and 2 succeed; key `x`: seq 10 always fails, 11
/// succeeds; an ordered consumer (`hold_on_retry` or not) retries once after 300 ms. Asserts
/// key `x`'s outcome (seq 11 accepted once, seq 10 the one dead letter, at attempt 2); returns
/// the accepted (seq, attempt) of key `k` in the order they were accepted.
fn ordered_retry_scenario(on: &support::both::On, hold: bool) -> Vec<(usize, u32)> {
    let conn = on.connect();
    let prefix = if hold {
        "eq-ordered-hold"
    } else {
        "eq-ordered-free"
    };
    let (_clean, q) = consumed_queue(on, &conn, prefix, &[]);
    let items = [
        ("k".to_string(), 0),
        ("x".to_string(), 10),
        ("k".to_string(), 1),
        ("x".to_string(), 11),
        ("k".to_string(), 2),
    ];
    publish_keyed(&conn, &q, &items);
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let a = accepted.clone();
    let inner = move |m: &Message| {
        let (key, seq, attempt) = (key_of(m), seq_of(m), m.envelope.attempt);
        if (seq == 0 && attempt == 1) || seq == 10 {
            return Err("not now".into());
        }
        a.lock().unwrap().push((key, seq, attempt));
        Ok(Outcome::Accept)
    };
    let handler = if hold {
        ordered(by_header("k"), inner).hold_on_retry()
    } else {
        ordered(by_header("k"), inner)
    };
    let options = ConsumerOptions::new()
        .concurrency(4)
        .prefetch(16)
        .retry(RetryPolicy::fixed(2, Duration::from_millis(300)).jitter(0.0));
    let consumer = consume(&conn, &q, options, handler);
    let dlq = dead_letter_queue(&q);
    assert!(eventually(WAIT, || accepted.lock().unwrap().len() == 4
        && depth(&conn, &dlq) == 1
        && consumer.in_flight() == 0));
    consumer.close().unwrap();
    let seen = accepted.lock().unwrap().clone();
    let dead = drain(&conn, &dlq);
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].envelope.attempt, 2);
    assert_eq!(depth(&conn, &q), 0);
    assert_eq!(
        of_key(&seen, "x"),
        vec![(11, 1)],
        "seq 11 ran once seq 10 was dead-lettered"
    );
    assert_eq!(
        seq_of(&dead[0]),
        10,
        "seq 10 exhausted its attempts and went to .dlq"
    );
    of_key(&seen, "k")
}

/// The (seq, attempt) of key `key`'s accepted messages, in the order they were accepted.
fn of_key(seen: &[(String, usize, u32)], key: &str) -> Vec<(usize, u32)> {
    seen.iter()
        .filter(|(k, _, _)| k == key)
        .map(|(_, s, a)| (*s, *a))
        .collect()
}

on_both! {
    /// Accept acknowledges: every message handled once at attempt 1, nothing left on the queue
    /// or its `.dlq`, nothing abandoned.
    fn accept_acknowledges_and_leaves_nothing_behind(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("eq-accept");
        let ids: HashSet<String> = publish_n(&conn, &q, 20, true).into_iter().collect();
        let (seen, handler) = recorded(|_| Ok(Outcome::Accept));
        let options = ConsumerOptions::new().retry(short_ladder()).concurrency(2);
        let consumer = consume(&conn, &q, options, handler);
        assert!(eventually(WAIT, || seen.lock().unwrap().len() == 20
            && consumer.in_flight() == 0));
        let report = consumer.close().unwrap();
        assert_eq!(report.abandoned, 0);
        let seen = seen.lock().unwrap().clone();
        assert!(seen.iter().all(|(_, a)| *a == 1), "{seen:?}");
        let handled: HashSet<String> = seen.into_iter().map(|(id, _)| id).collect();
        assert_eq!(handled, ids, "each message once");
        assert_eq!(depth(&conn, &q), 0);
        assert_eq!(depth(&conn, &dead_letter_queue(&q)), 0);
    }

    /// A handler error is retried (waits held in the consumer) with the same id and the attempt
    /// counted in `x-acemq-attempt`; the third attempt accepts and nothing is dead-lettered.
    fn a_handler_that_fails_twice_succeeds_on_the_third_attempt(on) {
        let recorder = Arc::new(Recorder::default());
        let conn = on.connect_with(ConnectionOptions::new().observer(recorder.clone()));
        let (_clean, q) = consumed_queue(on, &conn, "eq-third-time", &[]);
        let ids = publish_n(&conn, &q, 1, true);
        let (attempts, handler) = recorded(fails_until(3));
        let consumer = consume(&conn, &q, ConsumerOptions::new().retry(short_ladder()), handler);
        assert!(eventually(WAIT, || attempts.lock().unwrap().len() == 3
            && consumer.in_flight() == 0
            && depth(&conn, &q) == 0));
        consumer.close().unwrap();
        let seen = attempts.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![(ids[0].clone(), 1), (ids[0].clone(), 2), (ids[0].clone(), 3)],
            "the same id, attempts counted in x-acemq-attempt"
        );
        assert_eq!(depth(&conn, &q), 0);
        assert_eq!(depth(&conn, &dead_letter_queue(&q)), 0);
        // The observer saw each settlement: two retries, then the accept.
        assert!(eventually(WAIT, || recorder.outcomes(&q).len() == 3));
        assert_eq!(
            recorder.outcomes(&q),
            vec![("retry".into(), 1), ("retry".into(), 2), ("accept".into(), 3)]
        );
    }

    /// A handler that always fails walks its attempts and ends in `.dlq` once, with its id, its
    /// last attempt, the error and the queue it was consumed from (`acemq-original-queue`).
    fn always_failing_ends_in_the_dlq_with_its_error_and_origin(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("eq-ladder");
        let m = Message::new("body").with_header("app", "kept");
        let id = m.id().to_string();
        put(&conn, &q, m);
        let calls = Arc::new(AtomicUsize::new(0));
        let times = Arc::new(Mutex::new(Vec::new()));
        let (c, t) = (calls.clone(), times.clone());
        let options = ConsumerOptions::new().retry(short_ladder());
        let consumer = consume(&conn, &q, options, move |_: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            t.lock().unwrap().push(Instant::now());
            Err("the database is down".into())
        });
        let dlq = dead_letter_queue(&q);
        assert!(eventually(WAIT, || depth(&conn, &dlq) == 1 && consumer.in_flight() == 0));
        consumer.close().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // The ladder in time: 100 ms before the second attempt, 200 ms before the third.
        let times = times.lock().unwrap().clone();
        assert!(times[1] - times[0] >= Duration::from_millis(100), "{:?}", times[1] - times[0]);
        assert!(times[2] - times[1] >= Duration::from_millis(200), "{:?}", times[2] - times[1]);
        let dead = &the_dead_letter(&conn, &dlq, &id, 3);
        assert_eq!(dead.body, b"body");
        assert_eq!(
            dead.envelope.error.as_deref(),
            Some("exhausted 3 attempts: Error: the database is down")
        );
        assert_eq!(text_header(dead, "acemq-original-queue").as_deref(), Some(q.as_str()));
        assert_eq!(text_header(dead, "app").as_deref(), Some("kept"));
        assert_eq!(depth(&conn, &q), 0);
        assert_eq!(depth(&conn, &parked_queue(&q)), 0);
    }

    /// Reject and a `FatalError` go to `.dlq` at once (attempt 1, no retry), park goes to
    /// `.parked`; each with its reason in `x-acemq-error` and its origin queue.
    fn reject_and_fatal_dead_letter_at_once_and_park_sets_aside(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("eq-reject-park");
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let options = ConsumerOptions::new().retry(short_ladder());
        let consumer = consume(&conn, &q, options, move |m: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            match m.body.as_slice() {
                b"poison" => Err(Box::new(FatalError::new("cannot parse order")) as _),
                b"odd" => Ok(Outcome::park("needs a person")),
                _ => Ok(Outcome::reject("customer unknown")),
            }
        });
        for body in ["poison", "odd", "unknown"] {
            put(&conn, &q, Message::new(body));
        }
        let dlq = dead_letter_queue(&q);
        let parked = parked_queue(&q);
        assert!(eventually(WAIT, || depth(&conn, &dlq) == 2
            && depth(&conn, &parked) == 1
            && consumer.in_flight() == 0));
        consumer.close().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3, "no retries for reject, fatal or park");
        let mut errors = Vec::new();
        for m in drain(&conn, &dlq) {
            assert_eq!(m.envelope.attempt, 1);
            assert_eq!(text_header(&m, "acemq-original-queue").as_deref(), Some(q.as_str()));
            errors.push(m.envelope.error.unwrap());
        }
        errors.sort();
        assert_eq!(
            errors,
            vec![
                "the handler rejected it: customer unknown".to_string(),
                "the handler reported an unprocessable message: FatalError: cannot parse order"
                    .to_string(),
            ]
        );
        let set_aside = drain(&conn, &parked);
        assert_eq!(set_aside.len(), 1);
        assert_eq!(set_aside[0].body, b"odd");
        assert_eq!(
            set_aside[0].envelope.error.as_deref(),
            Some("the handler parked it: needs a person")
        );
        assert_eq!(
            text_header(&set_aside[0], "acemq-original-queue").as_deref(),
            Some(q.as_str())
        );
        assert_eq!(depth(&conn, &q), 0);
    }

    /// A panicking handler is a retry: every message is accepted on its second attempt by the
    /// same single worker; one that always panics ends in `.dlq` with the panic's message.
    fn a_panicking_handler_is_retried_and_the_worker_survives(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("eq-panic");
        let ids: HashSet<String> = publish_n(&conn, &q, 3, true).into_iter().collect();
        let doomed = Message::new("always");
        let doomed_id = doomed.id().to_string();
        put(&conn, &q, doomed);
        let accepted = Arc::new(Mutex::new(HashSet::new()));
        let a = accepted.clone();
        let options = ConsumerOptions::new().concurrency(1).retry(short_ladder());
        let consumer = consume(&conn, &q, options, move |m: &Message| {
            if m.envelope.attempt == 1 || m.body == b"always" {
                panic!("handler bug on {}", m.id());
            }
            a.lock().unwrap().insert(m.id().to_string());
            Ok(Outcome::Accept)
        });
        let dlq = dead_letter_queue(&q);
        assert!(eventually(WAIT, || accepted.lock().unwrap().len() == 3
            && depth(&conn, &dlq) == 1
            && consumer.in_flight() == 0));
        consumer.close().unwrap();
        assert_eq!(*accepted.lock().unwrap(), ids);
        let dead = the_dead_letter(&conn, &dlq, &doomed_id, 3);
        let error = dead.envelope.error.clone().unwrap();
        assert!(error.contains("handler bug on"), "{error}");
        assert_eq!(depth(&conn, &q), 0);
    }

    /// Dead-lettered and parked copies do not keep the original's per-message expiration: no
    /// `expiration` on the wire, and they stay in `.dlq` / `.parked` past it.
    fn dead_lettered_and_parked_copies_do_not_keep_the_originals_expiration(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("eq-no-expiry");
        let consumer = consume(&conn, &q, ConsumerOptions::new(), |m: &Message| {
            Ok(if m.body == b"park" {
                Outcome::park("needs a person")
            } else {
                Outcome::reject("no such customer")
            })
        });
        for body in ["reject", "park"] {
            put(&conn, &q, Message::new(body).with_expiration(Duration::from_secs(600)));
        }
        let (dlq, parked) = (dead_letter_queue(&q), parked_queue(&q));
        assert!(eventually(WAIT, || depth(&conn, &dlq) == 1
            && depth(&conn, &parked) == 1
            && consumer.in_flight() == 0));
        consumer.close().unwrap();
        // Past the original's expiration (at once on RabbitMQ: only the memory clock moves).
        on.let_time_pass(Duration::from_secs(601));
        assert_eq!(depth(&conn, &dlq), 1, "the dead letter did not expire");
        assert_eq!(depth(&conn, &parked), 1, "the parked copy did not expire");
        for copy in [drain(&conn, &dlq), drain(&conn, &parked)].concat() {
            assert_eq!(copy.expiration_ms, None, "{:?}", copy.envelope.error);
            assert_eq!(
                copy.properties.as_ref().unwrap().expiration(),
                &None,
                "no expiration on the wire"
            );
        }
    }

    /// Closing lets the running handlers finish (acknowledged) and requeues the deliveries that
    /// never started; a new consumer then gets each of those once, marked redelivered, and
    /// none of the finished ones again.
    fn close_lets_running_handlers_finish_and_requeues_the_rest(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("eq-close-drain");
        let ids: HashSet<String> = publish_n(&conn, &q, 20, true).into_iter().collect();
        let started = Arc::new(Mutex::new(Vec::new()));
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let s = started.clone();
        let options = || ConsumerOptions::new().prefetch(20).concurrency(2);
        let consumer = consume(&conn, &q, options(), move |m: &Message| {
            s.lock().unwrap().push(m.id().to_string());
            let _ = release_rx.recv_timeout(WAIT);
            Ok(Outcome::Accept)
        });
        assert!(eventually(WAIT, || started.lock().unwrap().len() == 2
            && consumer.in_flight() == 20));
        close_while_held(&conn, &q, move || consumer.close(), release_tx, (2, 18));
        let finished: HashSet<String> = started.lock().unwrap().iter().cloned().collect();
        assert_eq!(finished.len(), 2, "nothing new started while closing");
        let again = Arc::new(Mutex::new(Vec::new()));
        let a = again.clone();
        let consumer = consume(&conn, &q, options(), move |m: &Message| {
            let redelivered = m.received.as_ref().is_some_and(|r| r.redelivered);
            a.lock().unwrap().push((m.id().to_string(), redelivered));
            Ok(Outcome::Accept)
        });
        assert!(eventually(WAIT, || again.lock().unwrap().len() == 18
            && consumer.in_flight() == 0
            && depth(&conn, &q) == 0));
        consumer.close().unwrap();
        let again = again.lock().unwrap().clone();
        assert_eq!(again.len(), 18, "each of the rest once");
        assert!(again.iter().all(|(_, r)| *r), "requeued ones come back redelivered");
        let rest: HashSet<String> = again.into_iter().map(|(id, _)| id).collect();
        assert!(rest.is_disjoint(&finished), "no finished message again");
        let all: HashSet<String> = rest.union(&finished).cloned().collect();
        assert_eq!(all, ids, "none lost");
    }

    /// A wait of 30 s (the broker-wait threshold) is spent on the rung `{queue}.retry.30s`: the
    /// copy sits there, unacknowledged by nobody, until its TTL passes, then comes back through
    /// `acemq.retry` to the queue with the same id and attempt 2, and is accepted.
    fn a_thirty_second_wait_is_spent_on_a_rung_and_comes_back(on) {
        let conn = on.connect();
        let policy = RetryPolicy::fixed(2, RUNG).jitter(0.0);
        assert_eq!(policy.broker_rungs(), vec![RUNG]);
        let (_clean, q) = consumed_queue(on, &conn, "eq-rung", &policy.broker_rungs());
        let m = Message::new("later");
        let id = m.id().to_string();
        let (attempts, handler) = recorded(fails_until(2));
        let consumer = consume(&conn, &q, ConsumerOptions::new().retry(policy), handler);
        put(&conn, &q, m);
        let rung = retry_queue(&q, RUNG);
        assert!(rung.ends_with(".retry.30s"), "{rung}");
        assert!(
            eventually(WAIT, || depth(&conn, &rung) == 1 && consumer.in_flight() == 0),
            "the copy waits on the rung, the original is acknowledged"
        );
        assert_eq!(depth(&conn, &q), 0);
        // Not back before its TTL: a second short of it (on RabbitMQ, read at once, well inside
        // the 30 s), the copy is still on the rung and the handler ran once.
        on.let_time_pass(RUNG - Duration::from_secs(1));
        assert_eq!(depth(&conn, &rung), 1, "the copy left the rung before its TTL");
        assert_eq!(attempts.lock().unwrap().len(), 1);
        on.let_time_pass(Duration::from_secs(1));
        assert!(
            eventually(RUNG_WAIT, || attempts.lock().unwrap().len() == 2
                && consumer.in_flight() == 0),
            "back from the rung: {:?}",
            attempts.lock().unwrap()
        );
        consumer.close().unwrap();
        assert_eq!(
            *attempts.lock().unwrap(),
            vec![(id.clone(), 1), (id, 2)]
        );
        assert_eq!(depth(&conn, &rung), 0);
        assert_eq!(depth(&conn, &q), 0);
        assert_eq!(depth(&conn, &dead_letter_queue(&q)), 0);
    }

    /// Always failing with waits of 30 s: twice on the rung, then `.dlq` with attempt 3 and
    /// the error; the message is never on two queues at once and nothing is left behind.
    fn the_ladder_through_a_thirty_second_rung_ends_in_the_dlq(on) {
        let conn = on.connect();
        let policy = RetryPolicy::fixed(3, RUNG).jitter(0.0);
        let (_clean, q) = consumed_queue(on, &conn, "eq-rung-dlq", &policy.broker_rungs());
        let m = Message::new("never");
        let id = m.id().to_string();
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let a = attempts.clone();
        let options = ConsumerOptions::new().retry(policy);
        let consumer = consume(&conn, &q, options, move |m: &Message| {
            a.lock().unwrap().push(m.envelope.attempt);
            Err("still down".into())
        });
        put(&conn, &q, m);
        let rung = retry_queue(&q, RUNG);
        let dlq = dead_letter_queue(&q);
        for attempt in 1..=2usize {
            assert!(
                eventually(RUNG_WAIT, || attempts.lock().unwrap().len() == attempt
                    && depth(&conn, &rung) == 1
                    && consumer.in_flight() == 0),
                "attempt {attempt} failed and its copy waits on the rung: {:?}",
                attempts.lock().unwrap()
            );
            assert_eq!(depth(&conn, &q), 0);
            assert_eq!(depth(&conn, &dlq), 0);
            on.let_time_pass(RUNG);
        }
        assert!(eventually(RUNG_WAIT, || depth(&conn, &dlq) == 1
            && consumer.in_flight() == 0));
        consumer.close().unwrap();
        assert_eq!(*attempts.lock().unwrap(), vec![1, 2, 3]);
        let dead = the_dead_letter(&conn, &dlq, &id, 3);
        assert_eq!(
            dead.envelope.error.as_deref(),
            Some("exhausted 3 attempts: Error: still down")
        );
        assert_eq!(text_header(&dead, "acemq-original-queue").as_deref(), Some(q.as_str()));
        assert_eq!(depth(&conn, &rung), 0);
        assert_eq!(depth(&conn, &q), 0);
    }

    /// Ordered dispatch: 600 messages over 12 keys at concurrency 8, each key's messages
    /// handled in publish order, never two of one key at once, each message once.
    fn ordered_messages_keep_per_key_order_and_never_overlap_a_key(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("eq-ordered");
        let items: Vec<(String, usize)> =
            (0..600).map(|i| (format!("key-{}", i % 12), i)).collect();
        publish_keyed(&conn, &q, &items);
        let order = Arc::new(Mutex::new(HashMap::<String, Vec<usize>>::new()));
        let running = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let most_keys_at_once = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let (o, r, ov, d) = (order.clone(), running.clone(), overlaps.clone(), done.clone());
        let most = most_keys_at_once.clone();
        let handler = ordered(by_header("k"), move |m: &Message| {
            let key = key_of(m);
            o.lock().unwrap().entry(key.clone()).or_default().push(seq_of(m));
            {
                let mut r = r.lock().unwrap();
                let n = r.entry(key.clone()).or_insert(0);
                *n += 1;
                if *n > 1 {
                    ov.fetch_add(1, Ordering::SeqCst);
                }
                most.fetch_max(r.values().filter(|n| **n > 0).count(), Ordering::SeqCst);
            }
            // The handler's work, long enough for other keys' handlers to run beside it.
            std::thread::sleep(Duration::from_micros(500));
            *r.lock().unwrap().get_mut(&key).unwrap() -= 1;
            d.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        });
        let options = ConsumerOptions::new().concurrency(8).prefetch(100);
        let consumer = consume(&conn, &q, options, handler);
        assert!(
            eventually(WAIT, || done.load(Ordering::SeqCst) == 600 && consumer.in_flight() == 0),
            "handled {} of 600",
            done.load(Ordering::SeqCst)
        );
        let report = consumer.close().unwrap();
        assert_eq!(report.abandoned, 0);
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two of one key never ran at once");
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 12);
        for (key, seqs) in order.iter() {
            let expected: Vec<usize> =
                items.iter().filter(|(k, _)| k == key).map(|(_, s)| *s).collect();
            assert_eq!(seqs, &expected, "key {key} in publish order, each once");
        }
        let most = most_keys_at_once.load(Ordering::SeqCst);
        assert!(most > 1, "different keys ran at once (most at once: {most})");
        assert_eq!(depth(&conn, &q), 0);
    }

    /// Ordered with `hold_on_retry`: a retried message keeps its key, the later ones of the key
    /// wait until it settles; another key's exhausted message goes to `.dlq` and frees its key.
    fn with_hold_on_retry_later_messages_wait_for_the_retried_one(on) {
        assert_eq!(
            ordered_retry_scenario(on, true),
            vec![(0, 2), (1, 1), (2, 1)],
            "seqs 1 and 2 waited behind the retry of seq 0"
        );
    }

    /// Ordered without `hold_on_retry`: while a retried message waits, its key is free, and the
    /// later messages of the key overtake it.
    fn without_hold_on_retry_a_later_message_overtakes_a_retried_one(on) {
        assert_eq!(
            ordered_retry_scenario(on, false),
            vec![(1, 1), (2, 1), (0, 2)],
            "the retry of seq 0 came back after seqs 1 and 2: the key was free while it waited"
        );
    }

    /// At most once (acknowledged before the handler runs): a handler error or panic loses the
    /// message, counted lost; nothing is retried, dead-lettered or left on the queue.
    fn at_most_once_a_failing_handler_neither_retries_nor_dead_letters(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("eq-at-most-once");
        let items: Vec<(String, usize)> = (0..6).map(|i| (String::new(), i)).collect();
        publish_keyed(&conn, &q, &items);
        let calls = Arc::new(Mutex::new(HashMap::<usize, usize>::new()));
        let c = calls.clone();
        let options = ConsumerOptions::new()
            .concurrency(2)
            .retry(RetryPolicy::fixed(2, Duration::from_millis(300)).jitter(0.0))
            .at_most_once();
        let consumer = consume(&conn, &q, options, move |m: &Message| {
            let seq = seq_of(m);
            *c.lock().unwrap().entry(seq).or_insert(0) += 1;
            match seq % 3 {
                0 => Err("boom".into()),
                1 => panic!("a panic loses it too"),
                _ => Ok(Outcome::Accept),
            }
        });
        assert!(eventually(WAIT, || consumer.lost() == 4
            && calls.lock().unwrap().len() == 6
            && consumer.in_flight() == 0));
        let report = consumer.close().unwrap();
        assert_eq!(report.requeued, 0);
        let calls = calls.lock().unwrap().clone();
        assert!(calls.values().all(|n| *n == 1), "each ran once: {calls:?}");
        assert_eq!(depth(&conn, &q), 0);
        assert_eq!(depth(&conn, &dead_letter_queue(&q)), 0, "nothing dead-lettered");
    }

    /// An ordered consumer closing while one message of a key runs and nine wait for the key:
    /// the running one finishes and is acknowledged, the nine go back to the queue.
    fn an_ordered_consumer_closes_and_requeues_what_waits_for_its_key(on) {
        let (conn, _clean, q) = on.declared_consumed_queue("eq-ordered-close");
        let items: Vec<(String, usize)> = (0..10).map(|i| ("one".to_string(), i)).collect();
        publish_keyed(&conn, &q, &items);
        let (started_tx, started_rx) = crossbeam_channel::bounded::<()>(16);
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let handler = ordered(by_header("k"), move |_: &Message| {
            let _ = started_tx.send(());
            let _ = release_rx.recv_timeout(WAIT);
            Ok(Outcome::Accept)
        });
        let options = ConsumerOptions::new().concurrency(4).prefetch(20);
        let consumer = consume(&conn, &q, options, handler);
        started_rx.recv_timeout(WAIT).expect("a handler started");
        assert!(eventually(WAIT, || consumer.in_flight() == 10));
        // The nine waiting for the key go back while its holder runs.
        close_while_held(&conn, &q, move || consumer.close(), release_tx, (1, 9));
        assert!(started_rx.try_recv().is_err(), "nothing else started");
        assert_eq!(depth(&conn, &q), 9);
    }

    /// A pipeline step (`then`) publishes its next message with the consumed message's
    /// correlation and its id as causation, and accepts the consumed one.
    fn the_next_message_carries_the_correlation_and_the_consumed_id_as_causation(on) {
        let (conn, _clean, input, output) = step_queues(on, "eq-then-in", "eq-then-out");
        let step = then(conn.publisher().unwrap(), "", output.clone(), |m: &Message| {
            let order: serde_json::Value = m.payload()?;
            Ok(Next::Publish(json!({ "shipped": order["order_id"] })))
        });
        let stepping = conn.consume(&input, step).unwrap();
        let (collecting, got) = collect(&conn, &output);
        let m = Message::encode(&acemq_amqp::JsonCodec, &json!({"order_id": "o-9"}))
            .unwrap()
            .with_correlation_id("checkout-77");
        let consumed_id = m.id().to_string();
        put(&conn, &input, m);
        assert!(eventually(WAIT, || got.lock().unwrap().len() == 1
            && stepping.in_flight() == 0));
        stepping.close().unwrap();
        collecting.close().unwrap();
        let got = got.lock().unwrap().clone();
        assert_eq!(got.len(), 1, "one next message");
        let next = &got[0];
        assert_eq!(next.envelope.correlation_id.as_deref(), Some("checkout-77"));
        assert_eq!(next.envelope.causation_id.as_deref(), Some(consumed_id.as_str()));
        assert_ne!(next.id(), consumed_id);
        assert_eq!(next.payload::<serde_json::Value>().unwrap(), json!({"shipped": "o-9"}));
        assert_eq!(depth(&conn, &input), 0, "accepted");
        assert_eq!(depth(&conn, &dead_letter_queue(&input)), 0);
    }

    /// `NOTHING` accepts the consumed message and publishes nothing.
    fn nothing_accepts_and_publishes_nothing(on) {
        let (conn, _clean, input, output) =
            step_queues(on, "eq-then-nothing-in", "eq-then-nothing-out");
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let step = then(conn.publisher().unwrap(), "", output.clone(), move |_: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(NOTHING)
        });
        let stepping = conn.consume(&input, step).unwrap();
        put(&conn, &input, Message::new("{}"));
        assert!(eventually(WAIT, || calls.load(Ordering::SeqCst) == 1
            && stepping.in_flight() == 0
            && depth(&conn, &input) == 0));
        stepping.close().unwrap();
        assert_eq!(depth(&conn, &output), 0, "nothing published");
        assert_eq!(depth(&conn, &dead_letter_queue(&input)), 0);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    /// A next hop nobody can route (mandatory, returned) retries the step, the original kept
    /// until then; after the last attempt it is in `.dlq` with its id and the error.
    fn an_unroutable_next_hop_retries_the_step_then_dead_letters(on) {
        let (conn, _clean, input) = on.declared_consumed_queue("eq-then-unroutable");
        let nowhere = unique("eq-then-no-such-queue");
        let publisher = conn
            .publisher_with(PublisherOptions::new().mandatory(false))
            .unwrap();
        let (stepping, attempts) = support::pipe::step_to(&conn, &input, nowhere, publisher);
        let m = Message::new("{}");
        let id = m.id().to_string();
        put(&conn, &input, m);
        let dlq = dead_letter_queue(&input);
        assert!(eventually(WAIT, || depth(&conn, &dlq) == 1 && stepping.in_flight() == 0));
        stepping.close().unwrap();
        assert_eq!(*attempts.lock().unwrap(), vec![1, 2, 3]);
        assert_eq!(depth(&conn, &input), 0);
        let dead = drain(&conn, &dlq);
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].id(), id);
        let error = dead[0].envelope.error.clone().unwrap();
        assert!(
            error.starts_with("exhausted 3 attempts: acemq: the work for message")
                && error.contains("did not go out"),
            "{error}"
        );
    }

    /// A group of four members on one (classic, as the pattern's own tests) queue handles 400
    /// messages each exactly once, spread over more than one member; closing leaves no member
    /// subscribed.
    fn a_group_of_four_handles_each_message_once_spread_over_its_members(on) {
        let (conn, _clean, q) = on.declared_consumed_queue_with("eq-group-spread", QueueSpec::classic);
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let threads = Arc::new(Mutex::new(HashSet::<String>::new()));
        let (s, t) = (seen.clone(), threads.clone());
        let group = ConsumerGroup::new(&conn, &q, ConsumerGroupOptions::new().members(4))
            .and_then(|group| {
                group.start(move |m: &Message| {
                    let name = std::thread::current().name().unwrap_or("?").to_string();
                    t.lock().unwrap().insert(name);
                    s.lock().unwrap().push(m.id().to_string());
                    Ok(Outcome::Accept)
                })
            })
            .unwrap();
        assert_eq!(group.size(), 4);
        assert_eq!(conn.queue_info(&q).unwrap().consumer_count, 4);
        let ids = publish_n(&conn, &q, 400, false);
        assert!(eventually(WAIT, || seen.lock().unwrap().len() >= 400
            && group.in_flight() == 0));
        let report = group.close().unwrap();
        assert_eq!(report.abandoned, 0);
        assert_eq!(report.requeued, 0);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 400, "each message handled exactly once");
        let unique_seen: HashSet<&String> = seen.iter().collect();
        assert_eq!(unique_seen.len(), 400, "no message handled twice");
        let published: HashSet<&String> = ids.iter().collect();
        assert_eq!(unique_seen, published);
        let threads = threads.lock().unwrap().clone();
        assert!(threads.len() > 1, "the work went to one member only: {threads:?}");
        let members: HashSet<String> = (1..=4).map(|k| format!("acemq-worker-{k}-0")).collect();
        assert!(threads.is_subset(&members), "handler threads are named after their member: {threads:?}");
        let info = conn.queue_info(&q).unwrap();
        assert_eq!(info.message_count, 0, "nothing left on the queue");
        assert_eq!(info.consumer_count, 0, "no member left subscribed");
    }

    /// A group whose second member is refused (an exclusive consume on a classic queue) closes
    /// the first and returns the broker's refusal; every message is handled or back.
    fn a_group_whose_second_member_is_refused_closes_the_first(on) {
        let (conn, _clean, q) = on.declared_consumed_queue_with("eq-group-fail", QueueSpec::classic);
        publish_n(&conn, &q, 10, false);
        let handled = Arc::new(AtomicUsize::new(0));
        let h = handled.clone();
        let result = ConsumerGroup::new(
            &conn,
            &q,
            ConsumerGroupOptions::new()
                .members(3)
                .consumer(ConsumerOptions::new().exclusive(true)),
        )
        .and_then(|group| {
            group.start(move |_: &Message| {
                h.fetch_add(1, Ordering::SeqCst);
                Ok(Outcome::Accept)
            })
        });
        let error = result.expect_err("member 2 cannot share an exclusively consumed queue");
        assert!(error.to_string().contains("exclusive use"), "the broker's refusal of member 2: {error}");
        // Member 1 was closed before the error came back: nobody holds the queue or its messages.
        let info = conn.queue_info(&q).unwrap();
        assert_eq!(info.consumer_count, 0, "member 1 was closed");
        assert_eq!(info.message_count as usize + handled.load(Ordering::SeqCst), 10);
        assert!(conn.is_connected());
    }

    /// Closing a group: each member finishes its running handler and requeues what it had not
    /// started; the report sums the members'.
    fn closing_a_group_sums_the_members_reports_and_settles_everything(on) {
        let (conn, _clean, q) = on.declared_consumed_queue_with("eq-group-close", QueueSpec::classic);
        let running = Arc::new(AtomicUsize::new(0));
        let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
        let r = running.clone();
        let group = ConsumerGroup::new(
            &conn,
            &q,
            ConsumerGroupOptions::new()
                .members(2)
                .consumer(ConsumerOptions::new().prefetch(4)),
        )
        .and_then(|group| {
            group.start(move |_: &Message| {
                r.fetch_add(1, Ordering::SeqCst);
                let _ = release_rx.recv_timeout(WAIT);
                Ok(Outcome::Accept)
            })
        })
        .unwrap();
        publish_n(&conn, &q, 8, false);
        assert!(eventually(WAIT, || running.load(Ordering::SeqCst) == 2
            && depth(&conn, &q) == 0
            && group.in_flight() == 8));
        close_while_held(&conn, &q, move || group.close(), release_tx, (2, 6));
        let info = conn.queue_info(&q).unwrap();
        assert_eq!(info.message_count, 6, "the 2 handled were acknowledged");
        assert_eq!(info.consumer_count, 0);
        assert_eq!(running.load(Ordering::SeqCst), 2, "nothing ran after close");
    }
}
