//! The consumer runtime against the real broker: in-progress, volume, bounded memory, shutdown,
//! recovery, the scoped form, copies that cannot be published. The scenarios that hold on both
//! transports (accept, a retried handler and the observer's settlements, the ladder in time to
//! the `.dlq`, reject / fatal / park, a panicking handler, a close that lets running handlers
//! finish, the copies' expiration, …) are written once, in `tests/equivalence_consume.rs`.

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::Observer;
use acemq_amqp::observe::Settlement;
use acemq_amqp::{
    dead_letter_queue, ConnectionOptions, ConsumerOptions, Error, Message, Outcome, QueueSpec,
    RetryPolicy,
};
use support::observe::CopyFailures;
use support::{connect, connect_with, eventually, publish_n, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

/// A gate handlers block at until the test opens it (drops `open`), at most `limit` each: no
/// handler spins while it waits.
fn gate() -> (
    crossbeam_channel::Sender<()>,
    impl Fn(Duration) + Clone + Send + Sync + 'static,
) {
    let (open, shut) = crossbeam_channel::bounded::<()>(0);
    (open, move |limit| {
        let _ = shut.recv_timeout(limit);
    })
}

/// A consumer of `q` with one worker and a prefetch of 4 whose handler counts its starts and
/// waits at a gate (at most `hold`) until the test opens it; shutting down waits `shutdown` for
/// it. Returns the consumer, the gate's opener (dropped: open) and the count of starts.
fn one_at_a_time_at_a_gate(
    conn: &acemq_amqp::Connection,
    q: &str,
    shutdown: Duration,
    hold: Duration,
) -> (
    acemq_amqp::RunningConsumer,
    crossbeam_channel::Sender<()>,
    Arc<AtomicUsize>,
) {
    let (open, wait_at_gate) = gate();
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let consumer = conn
        .consumer(
            q,
            ConsumerOptions::new()
                .concurrency(1)
                .prefetch(4)
                .shutdown_timeout(shutdown),
        )
        .unwrap()
        .start(move |_: &Message| {
            s.fetch_add(1, Ordering::SeqCst);
            wait_at_gate(hold);
            Ok(Outcome::Accept)
        })
        .unwrap();
    (consumer, open, started)
}

fn rungs() -> Vec<Duration> {
    vec![
        Duration::from_millis(100),
        Duration::from_millis(200),
        Duration::from_millis(150),
    ]
}

#[test]
fn in_progress_comes_back_later_with_its_attempt_unchanged_and_is_never_dead_lettered() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("in-progress"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    publish_n(&conn, &q, 1, true);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    // no_retry: a single failure would dead-letter, but in-progress never does.
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(RetryPolicy::none()))
        .unwrap()
        .start(move |m: &Message| {
            let mut s = s.lock().unwrap();
            s.push((Instant::now(), m.envelope.attempt));
            if s.len() < 4 {
                Ok(Outcome::in_progress(Duration::from_millis(150)))
            } else {
                Ok(Outcome::Accept)
            }
        })
        .unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().len() == 4));
    consumer.close().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|(_, a)| *a == 1),
        "attempt unchanged: {seen:?}"
    );
    for w in seen.windows(2) {
        assert!(w[1].0 - w[0].0 >= Duration::from_millis(150));
    }
    assert_eq!(
        conn.queue_info(&dead_letter_queue(&q))
            .unwrap()
            .message_count,
        0
    );
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

#[test]
fn ten_thousand_messages_at_concurrency_eight_are_all_handled_and_acked() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("tenk-consume"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let ids: HashSet<String> = publish_n(&conn, &q, 10_000, false).into_iter().collect();
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let s = seen.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(8).prefetch(64))
        .unwrap()
        .start(move |m: &Message| {
            s.lock().unwrap().insert(m.id().to_string());
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(eventually(Duration::from_secs(60), || seen
        .lock()
        .unwrap()
        .len()
        == 10_000));
    assert!(consumer.max_in_flight() <= 64);
    let report = consumer.close().unwrap();
    assert_eq!(report.abandoned, 0);
    assert_eq!(*seen.lock().unwrap(), ids);
    assert_eq!(
        conn.queue_info(&q).unwrap().message_count,
        0,
        "every one was acked"
    );
}

#[test]
fn a_large_backlog_is_consumed_with_in_flight_bounded_by_prefetch() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("backlog"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    publish_n(&conn, &q, 100_000, false);
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 100_000);
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().prefetch(50).concurrency(4))
        .unwrap()
        .start(move |_: &Message| {
            h.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        })
        .unwrap();
    let mut peak = 0;
    let done = eventually(Duration::from_secs(120), || {
        peak = peak.max(consumer.in_flight());
        handled.load(Ordering::SeqCst) >= 100_000
    });
    assert!(done, "handled {}", handled.load(Ordering::SeqCst));
    assert!(peak <= 50, "sampled in flight {peak}");
    assert!(
        consumer.max_in_flight() <= 50,
        "in flight reached {} with prefetch 50",
        consumer.max_in_flight()
    );
    consumer.close().unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

#[test]
fn a_connection_cut_in_the_middle_loses_nothing_and_the_consumer_resumes() {
    let direct = connect();
    let mut clean = Cleanup::new(&direct);
    let q = clean.consumed_queue(&unique("cut-consume"), &rungs());
    direct.declare_queue(&QueueSpec::new(&q)).unwrap();
    let ids: HashSet<String> = publish_n(&direct, &q, 5_000, true).into_iter().collect();

    let (proxy, conn) = support::through_proxy(Duration::from_millis(300));
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let handled = Arc::new(AtomicUsize::new(0));
    let (s, h) = (seen.clone(), handled.clone());
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(4).prefetch(50))
        .unwrap()
        .start(move |m: &Message| {
            std::thread::sleep(Duration::from_micros(200));
            s.lock().unwrap().insert(m.id().to_string());
            h.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(eventually(WAIT, || handled.load(Ordering::SeqCst) >= 1_000));
    proxy.cut();
    assert!(
        eventually(WAIT, || conn.generation() == Some(2)),
        "reconnected"
    );
    assert!(
        eventually(Duration::from_secs(60), || seen.lock().unwrap().len()
            == 5_000),
        "handled {} of 5000",
        seen.lock().unwrap().len()
    );
    consumer.close().unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        ids,
        "every message handled at least once"
    );
    assert_eq!(
        direct.queue_info(&q).unwrap().message_count,
        0,
        "none left behind"
    );
    assert!(handled.load(Ordering::SeqCst) >= 5_000);
}

#[test]
fn scoped_run_borrows_local_state_inside_thread_scope() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("scoped"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    publish_n(&conn, &q, 50, true);
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(3))
        .unwrap();
    let stop = consumer.stop_handle();
    let bodies = Mutex::new(Vec::new()); // a local, borrowed by the handler
    let handler = |m: &Message| {
        bodies
            .lock()
            .unwrap()
            .push(String::from_utf8(m.body.clone()).unwrap());
        Ok(Outcome::Accept)
    };
    let report = std::thread::scope(|s| {
        let running = s.spawn(|| consumer.run(&handler));
        assert!(eventually(WAIT, || bodies.lock().unwrap().len() == 50));
        stop.stop();
        running.join().unwrap()
    })
    .unwrap();
    assert_eq!(report.abandoned, 0);
    let mut got = bodies.into_inner().unwrap();
    got.sort_by_key(|b| b.parse::<u32>().unwrap());
    assert_eq!(got, (0..50).map(|i| i.to_string()).collect::<Vec<_>>());
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

#[test]
fn deleting_the_queue_ends_the_consumer_with_a_clear_error() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("deleted"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(|_: &Message| Ok(Outcome::Accept))
        .unwrap();
    conn.delete_queue(&q).unwrap();
    let e = consumer.wait().unwrap_err();
    assert!(
        matches!(&e, Error::Cancelled { queue } if *queue == q),
        "{e:?}"
    );
    assert!(e.to_string().contains("deleted"), "{e}");
}

#[test]
fn consuming_a_missing_queue_fails_at_start() {
    let conn = connect();
    let q = unique("missing-consume");
    let e = conn
        .consumer(&q, ConsumerOptions::new().declare(false))
        .unwrap()
        .start(|_: &Message| Ok(Outcome::Accept))
        .unwrap_err();
    assert!(matches!(e, Error::NotFound { kind: "queue", .. }), "{e:?}");
    assert!(conn.is_connected());
    let e = conn
        .consumer(&q, ConsumerOptions::new().prefetch(0))
        .unwrap_err();
    assert!(e.to_string().contains("prefetch"), "{e}");
}

/// The original comes back after its copy-failure pause as a fresh copy of itself (same id),
/// never requeued: on RabbitMQ 4.x each requeue is a return the broker counts, and a quorum
/// queue drops a message past its delivery limit.
#[test]
fn when_the_copy_cannot_be_published_the_original_comes_back_not_lost() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("no-dlq"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let ids = publish_n(&conn, &q, 1, true);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    // declare(false) and no `.dlq`: the reject copy is unroutable, so it cannot be published.
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().declare(false))
        .unwrap()
        .start(move |m: &Message| {
            let mut calls = c.lock().unwrap();
            calls.push(m.id().to_string());
            if calls.len() > 1 {
                Ok(Outcome::Accept)
            } else {
                Ok(Outcome::reject("nowhere to put it"))
            }
        })
        .unwrap();
    assert!(eventually(WAIT, || calls.lock().unwrap().len() == 2));
    consumer.close().unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        vec![ids[0].clone(), ids[0].clone()],
        "the original came back"
    );
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

#[test]
fn a_foreign_message_without_id_and_with_an_unsendable_header_still_reaches_the_dlq() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("foreign"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    // Another client's message: no message_id, no x-acemq headers, a header with an empty name
    // (which we never send). (A NaN double, which we also refuse, closes the connection at the
    // broker with 541 INTERNAL_ERROR, so it cannot arrive.)
    {
        let s = std::net::TcpStream::connect(support::broker_addr()).unwrap();
        let mut raw = amiquip::Connection::insecure_open_stream(
            mio::net::TcpStream::from_stream(s).unwrap(),
            amiquip::ConnectionOptions::<amiquip::Auth>::default(),
            amiquip::ConnectionTuning::default(),
        )
        .unwrap();
        let ch = raw.open_channel(None).unwrap();
        let mut headers = amiquip::FieldTable::new();
        headers.insert(String::new(), amiquip::AmqpValue::LongString("odd".into()));
        headers.insert("kept".into(), amiquip::AmqpValue::LongString("yes".into()));
        let props = amiquip::AmqpProperties::default().with_headers(headers);
        ch.basic_publish(
            "",
            amiquip::Publish::with_properties(b"legacy", q.clone(), props),
        )
        .unwrap();
        ch.close().unwrap();
        raw.close().unwrap();
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(RetryPolicy::none()))
        .unwrap()
        .start(move |m: &Message| {
            assert!(
                !m.id().is_empty(),
                "an id is given to a message without one"
            );
            c.fetch_add(1, Ordering::SeqCst);
            Err("cannot handle legacy messages".into())
        })
        .unwrap();
    let dead = support::first_dead_letter(&conn, &q, WAIT);
    consumer.close().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "not round and round");
    assert_eq!(dead.body, b"legacy");
    assert!(dead
        .envelope
        .error
        .unwrap()
        .contains("cannot handle legacy messages"));
    assert!(
        !dead.headers.contains_key(""),
        "the unsendable header was dropped"
    );
    assert_eq!(
        dead.headers.get("kept").and_then(|v| v.as_str()),
        Some("yes")
    );
}

/// The `.dlq` is deleted under a running consumer: the reject copy cannot be published. The
/// original is put back after a growing pause — not at once, round and round — each failure is
/// reported to the observer, and once the `.dlq` exists again the message reaches it.
#[test]
fn a_copy_that_cannot_be_published_backs_off_instead_of_spinning() {
    let observer = Arc::new(CopyFailures::default());
    let conn = support::connect_observed(observer.clone());
    let (_clean, q) = support::consumed_queue_on(&conn, "spin", |spec| spec);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(move |_: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::reject("no such customer"))
        })
        .unwrap();
    let dlq = dead_letter_queue(&q);
    conn.delete_queue(&dlq).unwrap();
    conn.publisher()
        .unwrap()
        .publish("", &q, Message::new("x"))
        .unwrap();
    // Three seconds of a hot loop would be thousands of runs; with back-off, a handful.
    let started = Instant::now();
    assert!(eventually(WAIT, || calls.load(Ordering::SeqCst) >= 1));
    while started.elapsed() < Duration::from_secs(3) {
        std::thread::yield_now();
    }
    let runs = calls.load(Ordering::SeqCst);
    assert!(runs <= 5, "ran {runs} times in 3 s: a hot loop");
    let failures = observer.0.lock().unwrap().clone();
    assert!(!failures.is_empty(), "the observer heard about it");
    assert!(failures[0].contains("unroutable"), "{failures:?}");
    // The dead-letter queue is back: the message gets there.
    conn.declare_queue(&QueueSpec::new(&dlq).classic()).unwrap();
    assert!(eventually(Duration::from_secs(40), || conn
        .queue_info(&dlq)
        .unwrap()
        .message_count
        == 1));
    consumer.close().unwrap();
}

/// After a reconnect, jobs from the old channel still wait in the hand-off to the workers while
/// every worker runs a long handler: the owner must not block handing over the redelivered
/// ones, so a close still answers (abandoning the long handler at the shutdown timeout).
#[test]
fn after_a_reconnect_stale_jobs_do_not_block_the_owner() {
    let (direct, _clean, q) = support::declared_consumed_queue("stale-jobs");
    publish_n(&direct, &q, 8, true);
    let (proxy, conn) = support::through_proxy(Duration::from_millis(200));
    let (consumer, open, started) =
        one_at_a_time_at_a_gate(&conn, &q, Duration::from_secs(1), Duration::from_secs(60));
    assert!(eventually(WAIT, || started.load(Ordering::SeqCst) == 1));
    assert!(eventually(WAIT, || consumer.in_flight() == 4));
    proxy.cut();
    assert!(
        eventually(WAIT, || conn.generation() == Some(2)),
        "reconnected"
    );
    // The broker redelivers up to the prefetch on the new channel.
    assert!(eventually(WAIT, || consumer.in_flight() >= 1));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(consumer.close());
    });
    let closed = rx.recv_timeout(Duration::from_secs(15));
    drop(open);
    assert!(
        closed.is_ok(),
        "close() did not answer: the owner is blocked"
    );
}

struct PanickingObserver;
impl Observer for PanickingObserver {
    fn settled(&self, _: &Settlement<'_>) {
        panic!("a bug in the application's observer");
    }
}

/// An observer that panics must not take the consumer's threads with it: every message is still
/// handled and acknowledged (the panic is caught and logged).
#[test]
fn a_panicking_observer_does_not_kill_the_workers() {
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(PanickingObserver),
    );
    let (_clean, q) = support::consumed_queue_on(&conn, "observer-panic", |spec| spec);
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(2).prefetch(4))
        .unwrap()
        .start(move |_: &Message| {
            h.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        })
        .unwrap();
    publish_n(&conn, &q, 20, false);
    assert!(
        eventually(WAIT, || handled.load(Ordering::SeqCst) == 20),
        "handled {} of 20",
        handled.load(Ordering::SeqCst)
    );
    assert!(eventually(WAIT, || consumer.in_flight() == 0));
    consumer.close().unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

/// Closing while one long handler runs and three deliveries wait behind it: the report counts
/// one abandoned (started, still running at the deadline) and three requeued (never started).
#[test]
fn close_reports_abandoned_handlers_apart_from_deliveries_that_never_started() {
    let (conn, _clean, q) = support::declared_consumed_queue("close-report");
    let (consumer, open, started) = one_at_a_time_at_a_gate(
        &conn,
        &q,
        Duration::from_millis(500),
        Duration::from_secs(30),
    );
    publish_n(&conn, &q, 4, true);
    assert!(eventually(WAIT, || started.load(Ordering::SeqCst) == 1
        && consumer.in_flight() == 4));
    let report = consumer.close().unwrap();
    drop(open);
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "the others never started"
    );
    assert_eq!((report.abandoned, report.requeued), (1, 3), "{report:?}");
}

/// Invariant 3 with the workers reading the deliveries themselves: the first delivery's handler
/// is still running while the nine behind it are done and acknowledged. No acknowledgement of
/// theirs may cover it (a `multiple` ack up to a later tag would): when the consumer closes with
/// that handler still running, the broker must have it back.
#[test]
fn a_running_delivery_is_never_covered_by_the_acks_of_those_behind_it() {
    let (conn, _clean, q) = support::declared_consumed_queue("ack-cover");
    publish_n(&conn, &q, 10, true);
    let (open, wait_at_gate) = gate();
    let fast = Arc::new(AtomicUsize::new(0));
    let slow = Arc::new(AtomicUsize::new(0));
    let (g, f, s) = (wait_at_gate, fast.clone(), slow.clone());
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .concurrency(3)
                .prefetch(10)
                .shutdown_timeout(Duration::from_millis(300)),
        )
        .unwrap()
        .start(move |m: &Message| {
            if m.body == b"0" {
                s.fetch_add(1, Ordering::SeqCst);
                g(Duration::from_secs(60));
            } else {
                f.fetch_add(1, Ordering::SeqCst);
            }
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(
        eventually(WAIT, || fast.load(Ordering::SeqCst) == 9
            && slow.load(Ordering::SeqCst) == 1
            && consumer.in_flight() == 1),
        "the nine behind it were handled and settled (fast {}, slow {}, in flight {})",
        fast.load(Ordering::SeqCst),
        slow.load(Ordering::SeqCst),
        consumer.in_flight()
    );
    let report = consumer.close().unwrap();
    drop(open);
    assert_eq!(report.abandoned, 1, "{report:?}");
    assert!(
        eventually(WAIT, || conn.queue_info(&q).unwrap().message_count == 1),
        "the running delivery went back to the queue when the channel closed (ready: {})",
        conn.queue_info(&q).unwrap().message_count
    );
}

/// A newcomer's reading of a report (issue 48): after three messages handled and nothing
/// running, `finished_in_time` is 0 — it counts handlers that were running when the close began —
/// and `handled` counts what the consumer handled in its whole life: 3.
#[test]
fn a_close_report_counts_what_the_consumer_handled_in_its_life() {
    let (conn, _clean, q) = support::declared_queue("report-handled");
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(move |_: &Message| {
            h.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        })
        .unwrap();
    let publisher = conn.publisher().unwrap();
    for i in 0..3 {
        publisher
            .publish("", &q, Message::new(format!("{i}")))
            .unwrap();
    }
    assert!(eventually(WAIT, || handled.load(Ordering::SeqCst) == 3
        && consumer.in_flight() == 0));
    let report = consumer.close().unwrap();
    assert_eq!(report.handled, 3, "{report:?}");
    assert_eq!(report.finished_in_time, 0, "{report:?}");
    assert_eq!((report.requeued, report.abandoned), (0, 0), "{report:?}");
}
