//! Edges of the consumer found by review (issue 35): an at-most-once ack whose answer comes
//! late, a consumer of another queue's dead letters, and where a copy says it was first
//! published. On the real broker.

mod support;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::Observer;
use acemq_amqp::observe::Settlement;
use acemq_amqp::{
    dead_letter_queue, headers, retry_queue, Connection, ConnectionOptions, ConsumerOptions,
    Message, Outcome, QueueSpec, RetryPolicy,
};
use support::raw::Raw;
use support::{connect, connect_with, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

/// Every settlement the consumers of one connection report: `(outcome, message id, error)`.
#[derive(Default)]
struct Seen(Mutex<Vec<(String, String, Option<String>)>>);

impl Observer for Seen {
    fn settled(&self, s: &Settlement<'_>) {
        self.0.lock().unwrap().push((
            s.outcome.to_string(),
            s.message_id.to_string(),
            s.error.map(str::to_string),
        ));
    }
}

impl Seen {
    fn outcomes_of(&self, id: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, i, _)| i == id)
            .map(|(o, _, _)| o.clone())
            .collect()
    }

    fn any(&self, outcome: &str) -> bool {
        self.0.lock().unwrap().iter().any(|(o, _, _)| o == outcome)
    }
}

fn capture_logs() {
    support::logs::capture(log::LevelFilter::Debug);
}

/// Whether the library (`acemq…` targets) logged a line with `id` and `text`.
fn logged(id: &str, text: &str) -> bool {
    support::logs::lines()
        .iter()
        .any(|l| l.starts_with("acemq") && l.contains(id) && l.contains(text))
}

/// The header tables of the first `n` messages on `queue`, read (and acknowledged) by a raw
/// client: what is on the wire, whatever a consumer of ours would make of it.
fn raw_headers(queue: &str, n: usize) -> Vec<amiquip::FieldTable> {
    let raw = Raw::open();
    let mut got = Vec::new();
    let done = eventually(WAIT, || {
        if let Some((props, _, _)) = raw.get(queue) {
            got.push(props.headers().clone().unwrap_or_default());
        }
        got.len() >= n
    });
    raw.close();
    assert!(done, "{} of {n} messages on {queue:?}", got.len());
    got
}

fn text<'t>(table: &'t amiquip::FieldTable, name: &str) -> Option<&'t str> {
    match table.get(name) {
        Some(amiquip::AmqpValue::LongString(s)) => Some(s.as_str()),
        _ => None,
    }
}

/// A rung of one second: waits of 1 s go to `{queue}.retry.1s` (TTL 1 s) and come back through
/// `acemq.retry`.
fn one_second_rung() -> RetryPolicy {
    RetryPolicy::fixed(3, Duration::from_secs(1)).broker_wait_threshold(Duration::from_secs(1))
}

/// Publishes `m` to `queue` through the default exchange, confirmed.
fn put(conn: &Connection, queue: &str, m: Message) {
    let publisher = conn.publisher().unwrap();
    publisher.publish("", queue, m).unwrap();
    publisher.close().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Item 9: at most once, the owner's answer late.

/// At most once, the consumer's outgoing traffic held by the fault proxy (the broker's still
/// flows): the delivery arrives, its worker asks for the ack, and its wait for the answer runs
/// out before the ack (and the round trip after it) reaches the broker. Once the link lets go,
/// the ack does go out: the message is gone from the queue and its handler never ran. It must
/// be counted lost and reported to the observer, nothing may stay counted in flight, and
/// closing must not wait out its timeout for it.
///
/// The proxy makes the owner's answer late for real (the ack and the `basic.qos` round trip
/// that confirms it sit in the proxy); the `internals` hook only shortens the worker's wait
/// from its 30 s floor, so that the test does not take 30 s.
#[cfg(feature = "internals")]
#[test]
fn at_most_once_an_ack_answered_after_the_worker_gave_up_is_counted_lost() {
    use acemq_amqp::testing::FaultProxy;
    capture_logs();
    let (direct, _clean, q) = support::declared_consumed_queue("amo-late-ack");
    let proxy = FaultProxy::start(&support::amqp_url()).expect("fault proxy");
    let seen = Arc::new(Seen::default());
    let conn = connect_with(
        ConnectionOptions::new()
            .address(proxy.url())
            .heartbeat(Duration::from_secs(30))
            .observer(seen.clone()),
    );
    let (calls, handler) = support::counted(|_: &Message| Ok(Outcome::Accept));
    let options = ConsumerOptions::new()
        .at_most_once()
        .shutdown_timeout(Duration::from_secs(20))
        .ack_first_wait_for_tests(Duration::from_millis(300));
    let consumer = conn.consumer(&q, options).unwrap().start(handler).unwrap();
    proxy.freeze();
    let m = Message::new("late");
    let id = m.id().to_string();
    put(&direct, &q, m);
    // The worker took it, asked for the ack and gave up waiting for the answer.
    assert!(
        eventually(WAIT, || logged(&id, "not running it")),
        "the worker never gave up waiting"
    );
    proxy.resume();
    assert!(
        eventually(WAIT, || direct.queue_info(&q).unwrap().message_count == 0
            && consumer.in_flight() == 0
            && consumer.lost() == 1),
        "acked but not handled must be counted lost and leave nothing in flight: lost {}, in \
         flight {}, queued {}",
        consumer.lost(),
        consumer.in_flight(),
        direct.queue_info(&q).unwrap().message_count
    );
    assert!(
        eventually(WAIT, || seen.outcomes_of(&id) == ["lost"]),
        "the observer hears it lost: {:?}",
        seen.outcomes_of(&id)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "its handler never ran");
    let closing = Instant::now();
    let report = consumer.close().unwrap();
    assert!(
        closing.elapsed() < Duration::from_secs(10),
        "closing waited {:?} for a delivery that was settled",
        closing.elapsed()
    );
    assert_eq!(report.abandoned, 0);
    assert_eq!(direct.queue_info(&q).unwrap().message_count, 0, "not back");
}

// ---------------------------------------------------------------------------------------------
// Item 15: the attempt limit only for this queue's own ladder.

/// A consumer of `orders.dlq` with no retries (an alerting or archiving consumer) gets the
/// dead letters of `orders` in its handler — here one that `orders`' own consumer dead-lettered
/// on its second of two attempts, so past this consumer's limit of one — and accepting it
/// settles it: nothing is copied on to `orders.dlq.dlq`.
#[test]
fn a_dead_letter_queue_consumer_gets_its_messages_in_its_handler_and_can_accept_them() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("dlq-reader"), &[]);
    let dlq = clean.consumed_queue(&dead_letter_queue(&q), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    // `orders`' own consumer: two attempts, then the dead letter.
    let failing = conn
        .consumer(
            &q,
            ConsumerOptions::new().retry(RetryPolicy::fixed(2, Duration::from_millis(20))),
        )
        .unwrap()
        .start(|_: &Message| Err("the payment service is down".into()))
        .unwrap();
    let m = Message::new("order 17");
    let id = m.id().to_string();
    put(&conn, &q, m);
    support::wait_for_count(&conn, &dlq, 1, WAIT);
    failing.close().unwrap();
    // The dead-letter queue's own consumer (declaring its failure topology, as by default).
    let got = Arc::new(Mutex::new(Vec::<Message>::new()));
    let g = got.clone();
    let reader = conn
        .consumer(&dlq, ConsumerOptions::new().retry(RetryPolicy::none()))
        .unwrap()
        .start(move |m: &Message| {
            g.lock().unwrap().push(m.clone());
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(
        eventually(WAIT, || !got.lock().unwrap().is_empty()),
        "the dead-letter queue's consumer never saw its message (copied on to {:?}: {})",
        dead_letter_queue(&dlq),
        conn.queue_info(&dead_letter_queue(&dlq))
            .unwrap()
            .message_count
    );
    support::wait_for_count(&conn, &dlq, 0, WAIT);
    reader.close().unwrap();
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id(), id);
    assert_eq!(
        got[0].envelope.attempt, 2,
        "it arrives as it was dead-lettered"
    );
    assert!(got[0].envelope.error.is_some());
    assert_eq!(
        conn.queue_info(&dead_letter_queue(&dlq))
            .unwrap()
            .message_count,
        0,
        "nothing copied on to the dead-letter queue's own dead-letter queue"
    );
}

/// The same consumer with `declare(false)` (no `orders.dlq.dlq` exists), reading a dead letter
/// as another library writes it (attempt 5, `x-acemq-error`, no `acemq-original-*`): before,
/// every such message was dead-lettered ahead of the handler into a queue that does not exist,
/// failed and went back to the queue, round and round. Now the handler gets it, once, and
/// accepts it.
#[test]
fn a_dead_letter_queue_consumer_without_declarations_handles_its_messages_instead_of_requeueing_them(
) {
    let seen = Arc::new(Seen::default());
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(seen.clone()),
    );
    let mut clean = Cleanup::new(&conn);
    let q = unique("dlq-undeclared");
    let dlq = clean.consumed_queue(&dead_letter_queue(&q), &[]);
    conn.declare_queue(&QueueSpec::new(&dlq).classic()).unwrap();
    let mut m = Message::new("order 18");
    m.envelope.attempt = 5;
    m.envelope.error = Some("exhausted 5 attempts: TimeoutError: the payment service".into());
    let id = m.id().to_string();
    put(&conn, &dlq, m);
    let (calls, handler) = support::counted(|_: &Message| Ok(Outcome::Accept));
    let options = ConsumerOptions::new()
        .retry(RetryPolicy::none())
        .declare(false);
    let reader = conn
        .consumer(&dlq, options)
        .unwrap()
        .start(handler)
        .unwrap();
    assert!(
        eventually(WAIT, || calls.load(Ordering::SeqCst) == 1
            && conn.queue_info(&dlq).unwrap().message_count == 0
            && reader.in_flight() == 0),
        "handled {} times; outcomes {:?}",
        calls.load(Ordering::SeqCst),
        seen.outcomes_of(&id)
    );
    reader.close().unwrap();
    assert_eq!(seen.outcomes_of(&id), ["accept"]);
    assert!(!seen.any("copy_failed"), "no copy was tried");
    assert!(
        conn.queue_info(&dead_letter_queue(&dlq)).is_err(),
        "nothing declared"
    );
}

/// The family's rule (issue 47): the attempt header counts past failures, it is no budget. A
/// message back on this queue past this policy's last attempt — after going round this queue's
/// own ladder under a consumer with a longer policy, or a policy shortened since — is run once
/// more; accepted, it is done; failed, it is dead-lettered as exhausted (no further rung). Both
/// shapes: one carrying this queue as its `acemq-original-queue` (this crate's copies), and one
/// that came back from one of this queue's rungs through `acemq.retry` (any family library's).
#[test]
fn a_message_back_from_this_queues_own_ladder_past_the_last_attempt_is_run_once_more() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("own-ladder"), &[Duration::from_secs(1)]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(one_second_rung()))
        .unwrap()
        .start(move |m: &Message| {
            let body = String::from_utf8_lossy(&m.body).into_owned();
            c.lock().unwrap().push(body.clone());
            if body.ends_with("fail") {
                Err("still broken".into())
            } else {
                Ok(Outcome::Accept)
            }
        })
        .unwrap();
    for body in ["own-ok", "own-fail", "rung-ok", "rung-fail"] {
        let mut m = Message::new(body);
        m.envelope.attempt = 4;
        if body.starts_with("own") {
            // Our own consumer-side retry copy, as it arrives: through the default exchange.
            let m = m.with_header(headers::ORIGINAL_QUEUE, q.as_str());
            put(&conn, &q, m);
        } else {
            // A family library's rung copy (no `acemq-original-*`): back through `acemq.retry`.
            put(&conn, &retry_queue(&q, Duration::from_secs(1)), m);
        }
    }
    let dlq = dead_letter_queue(&q);
    support::wait_for_count(&conn, &dlq, 2, WAIT);
    assert!(eventually(WAIT, || calls.lock().unwrap().len() == 4));
    consumer.close().unwrap();
    let mut ran = calls.lock().unwrap().clone();
    ran.sort();
    // Each ran exactly once: the failures were not sent round the ladder again.
    assert_eq!(ran, ["own-fail", "own-ok", "rung-fail", "rung-ok"]);
    for copy in raw_headers(&dlq, 2) {
        assert_eq!(
            text(&copy, "x-acemq-error"),
            Some("exhausted 3 attempts: Error: still broken")
        );
    }
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    let rung = retry_queue(&q, Duration::from_secs(1));
    assert_eq!(conn.queue_info(&rung).unwrap().message_count, 0);
}

/// Two consumers of one queue whose policies allow different numbers of attempts (5 and 2, each
/// with a 1 s rung), every message failing: under the family's rule each message is run at most
/// five times in all and ends in `.dlq` — nothing cycles between the queue and its rungs, in
/// either order of meeting the two policies (a message first run by the short policy's consumer
/// is exhausted at its first failure past attempt 2; one first run by the long policy's is sent
/// round until one of them finds it exhausted).
#[test]
fn two_consumers_with_different_attempt_limits_on_one_queue_never_cycle_a_message() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("two-limits"), &[Duration::from_secs(1)]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    // Per message id: which policy ran it, at which attempt.
    type Runs = std::collections::HashMap<String, Vec<(&'static str, u32)>>;
    let runs: Arc<Mutex<Runs>> = Arc::default();
    let start = |who: &'static str, attempts: u32| {
        let runs = runs.clone();
        conn.consumer(
            &q,
            ConsumerOptions::new().prefetch(1).retry(
                RetryPolicy::fixed(attempts, Duration::from_secs(1))
                    .broker_wait_threshold(Duration::from_secs(1)),
            ),
        )
        .unwrap()
        .start(move |m: &Message| {
            runs.lock()
                .unwrap()
                .entry(m.id().to_string())
                .or_default()
                .push((who, m.envelope.attempt));
            Err("always fails".into())
        })
        .unwrap()
    };
    let long = start("long", 5);
    let short = start("short", 2);
    const N: usize = 12;
    for i in 0..N {
        put(&conn, &q, Message::new(format!("m{i}")));
    }
    let dlq = dead_letter_queue(&q);
    assert!(
        eventually(Duration::from_secs(60), || conn
            .queue_info(&dlq)
            .unwrap()
            .message_count
            == N as u32),
        "every message ends in {dlq} (found {:?})",
        conn.queue_info(&dlq).map(|i| i.message_count)
    );
    long.close().unwrap();
    short.close().unwrap();
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), N);
    let mut first_short = 0;
    let mut first_long = 0;
    for (id, seen) in runs.iter() {
        assert!(seen.len() <= 5, "{id} ran {} times: {seen:?}", seen.len());
        let attempts: Vec<u32> = seen.iter().map(|(_, a)| *a).collect();
        let expected: Vec<u32> = (1..=seen.len() as u32).collect();
        assert_eq!(attempts, expected, "{id}: one run per attempt, in order");
        // The run that exhausted it: the short policy's at attempt 2 or later, or the long
        // policy's at attempt 5.
        let (last_who, last) = *seen.last().unwrap();
        assert!(
            (last_who == "short" && last >= 2) || (last_who == "long" && last == 5),
            "{id} was dead-lettered by the {last_who} policy at attempt {last}: {seen:?}"
        );
        match seen[0].0 {
            "short" => first_short += 1,
            _ => first_long += 1,
        }
    }
    assert!(
        first_short > 0 && first_long > 0,
        "both orders met ({first_short} first run by the short policy, {first_long} by the long)"
    );
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    let rung = retry_queue(&q, Duration::from_secs(1));
    assert_eq!(conn.queue_info(&rung).unwrap().message_count, 0);
}

// ---------------------------------------------------------------------------------------------
// Item 16: the first publish, not a rung's.

/// A queue with one 1 s rung, consumed by a handler that rejects every message (so each
/// message it gets is dead-lettered at once, its copy stamped with where it came from).
fn rejecting_behind_a_rung(
    conn: &Connection,
    clean: &mut Cleanup,
    name: &str,
) -> (String, acemq_amqp::RunningConsumer) {
    let q = clean.consumed_queue(&unique(name), &[Duration::from_secs(1)]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(one_second_rung()))
        .unwrap()
        .start(|_: &Message| Ok(Outcome::reject("no such customer")))
        .unwrap();
    (q, consumer)
}

/// A consumer that handles attempt 2 of a message another library sent round one of this
/// queue's rungs (the family's copies carry no `acemq-original-*`) and dead-letters it: the
/// copy records the queue, and not `acemq.retry` (the rung's way back) as the exchange the
/// message was published to.
#[test]
fn a_dead_letter_copy_of_a_message_back_from_a_rung_does_not_name_the_rung_as_its_origin() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, consumer) = rejecting_behind_a_rung(&conn, &mut clean, "rung-origin");
    let mut m = Message::new("from python");
    m.envelope.attempt = 2;
    put(&conn, &retry_queue(&q, Duration::from_secs(1)), m);
    let copy = raw_headers(&dead_letter_queue(&q), 1).remove(0);
    consumer.close().unwrap();
    assert_eq!(text(&copy, headers::ORIGINAL_QUEUE), Some(q.as_str()));
    assert_ne!(
        text(&copy, headers::ORIGINAL_EXCHANGE),
        Some("acemq.retry"),
        "the rung's return path is not where the message was published"
    );
    assert_eq!(text(&copy, headers::ORIGINAL_EXCHANGE), None, "not known");
    assert_eq!(
        text(&copy, headers::ORIGINAL_ROUTING_KEY),
        None,
        "not known"
    );
}

/// A message that arrives on attempt 2 through a rung already carrying `acemq-original-*`
/// (recorded by whoever handled attempt 1): its dead-letter copy keeps them as they came —
/// all three, and also when only some were recorded (the missing one is added, the others
/// are not overwritten).
#[test]
fn a_dead_letter_copy_keeps_the_original_headers_the_message_arrived_with() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, consumer) = rejecting_behind_a_rung(&conn, &mut clean, "kept-origin");
    let rung = retry_queue(&q, Duration::from_secs(1));
    let mut all = Message::new("all three")
        .with_header(headers::ORIGINAL_EXCHANGE, "orders.events")
        .with_header(headers::ORIGINAL_ROUTING_KEY, "orders.placed")
        .with_header(headers::ORIGINAL_QUEUE, q.as_str());
    all.envelope.attempt = 2;
    let all_id = all.id().to_string();
    put(&conn, &rung, all);
    let mut some = Message::new("two of them")
        .with_header(headers::ORIGINAL_EXCHANGE, "orders.events")
        .with_header(headers::ORIGINAL_ROUTING_KEY, "orders.placed");
    some.envelope.attempt = 2;
    put(&conn, &rung, some);
    let copies = raw_headers(&dead_letter_queue(&q), 2);
    consumer.close().unwrap();
    for copy in &copies {
        let which = if text(copy, "x-acemq-id") == Some(all_id.as_str()) {
            "all three"
        } else {
            "two of them"
        };
        assert_eq!(
            text(copy, headers::ORIGINAL_EXCHANGE),
            Some("orders.events"),
            "{which}"
        );
        assert_eq!(
            text(copy, headers::ORIGINAL_ROUTING_KEY),
            Some("orders.placed"),
            "{which}"
        );
        assert_eq!(
            text(copy, headers::ORIGINAL_QUEUE),
            Some(q.as_str()),
            "{which}"
        );
    }
}
