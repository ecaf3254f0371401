//! `ConsumerOptions::inline`: the handler runs on the consumer's own thread. The same
//! guarantees as on a worker (settled, retried, dead-lettered, recovered), the documented
//! difference on close, and the combinations it refuses — on the real broker.

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::ordering::ordered;
use acemq_amqp::{ConsumerOptions, Error, Message, Outcome, RetryPolicy};
use support::{eventually, publish_n};

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn an_inline_consumer_handles_every_message_on_its_own_thread_and_acknowledges_it() {
    let (conn, _clean, q) = support::declared_consumed_queue("inline-accept");
    let ids = publish_n(&conn, &q, 300, false);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let threads = Arc::new(Mutex::new(HashSet::new()));
    let (s, t) = (seen.clone(), threads.clone());
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().prefetch(50).inline(true))
        .unwrap()
        .start(move |m: &Message| {
            s.lock().unwrap().push(m.id().to_string());
            let name = std::thread::current().name().map(str::to_string);
            t.lock().unwrap().insert(name);
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(
        eventually(WAIT, || seen.lock().unwrap().len() == 300
            && consumer.in_flight() == 0),
        "handled {} of 300",
        seen.lock().unwrap().len()
    );
    let report = consumer.close().unwrap();
    assert_eq!((report.abandoned, report.requeued), (0, 0), "{report:?}");
    assert_eq!(*seen.lock().unwrap(), ids, "in order, each once");
    assert_eq!(
        *threads.lock().unwrap(),
        HashSet::from([Some("acemq-consumer".to_string())]),
        "the handler ran on the consumer's own thread"
    );
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

/// A retry held in the consumer (the timer's settlement reaches the owner between handlers)
/// and a dead letter after the last attempt, as on a worker.
#[test]
fn an_inline_consumer_retries_in_the_consumer_and_dead_letters_the_last_attempt() {
    let (conn, _clean, q) = support::declared_consumed_queue("inline-retry");
    let ids = publish_n(&conn, &q, 2, true);
    let (flaky, doomed) = (ids[0].clone(), ids[1].clone());
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    let policy = RetryPolicy::exponential()
        .max_attempts(3)
        .initial_delay(Duration::from_millis(50))
        .max_delay(Duration::from_millis(100))
        .jitter(0.0);
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(policy).inline(true))
        .unwrap()
        .start(move |m: &Message| {
            c.lock()
                .unwrap()
                .push((m.id().to_string(), m.envelope.attempt));
            if m.id() == doomed || m.envelope.attempt == 1 {
                return Err("the ledger is locked".into());
            }
            Ok(Outcome::Accept)
        })
        .unwrap();
    let dead = support::first_dead_letter(&conn, &q, WAIT);
    assert!(eventually(WAIT, || consumer.in_flight() == 0));
    let report = consumer.close().unwrap();
    assert_eq!(report.abandoned, 0, "{report:?}");
    assert_eq!(dead.id(), ids[1]);
    assert_eq!(dead.envelope.attempt, 3);
    assert_eq!(
        dead.envelope.error.as_deref(),
        Some("exhausted 3 attempts: Error: the ledger is locked")
    );
    let calls = calls.lock().unwrap().clone();
    let of = |id: &str| -> Vec<u32> {
        calls
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, a)| *a)
            .collect()
    };
    assert_eq!(of(&flaky), vec![1, 2], "failed once, accepted on the retry");
    assert_eq!(of(&ids[1]), vec![1, 2, 3]);
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

/// The documented price: closing waits for the handler running on the consumer's thread,
/// past the shutdown timeout, then settles it and requeues what never started.
#[test]
fn closing_an_inline_consumer_waits_for_its_running_handler_and_requeues_the_rest() {
    let (conn, _clean, q) = support::declared_consumed_queue("inline-close");
    let (open, shut) = crossbeam_channel::bounded::<()>(0);
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .prefetch(4)
                .inline(true)
                .shutdown_timeout(Duration::from_millis(100)),
        )
        .unwrap()
        .start(move |_: &Message| {
            s.fetch_add(1, Ordering::SeqCst);
            let _ = shut.recv_timeout(WAIT);
            Ok(Outcome::Accept)
        })
        .unwrap();
    publish_n(&conn, &q, 4, true);
    assert!(eventually(WAIT, || started.load(Ordering::SeqCst) == 1
        && consumer.in_flight() == 4));
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let _ = done_tx.send(consumer.close());
        });
        // Well past the shutdown timeout, the close is still waiting for the handler.
        assert!(
            done_rx.recv_timeout(Duration::from_millis(800)).is_err(),
            "close returned while the handler still ran"
        );
        drop(open);
        let report = done_rx
            .recv_timeout(WAIT)
            .expect("close returns once the handler does")
            .unwrap();
        assert_eq!(
            (report.finished_in_time, report.requeued, report.abandoned),
            (1, 3, 0),
            "{report:?}"
        );
    });
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "the others never started"
    );
    assert!(
        eventually(WAIT, || conn.queue_info(&q).unwrap().message_count == 3),
        "the finished one acknowledged, the three behind it back on the queue"
    );
}

#[test]
fn an_inline_consumer_resumes_after_a_connection_cut_and_loses_nothing() {
    let (direct, _clean, q) = support::declared_consumed_queue("inline-cut");
    let (proxy, conn) = support::through_proxy(Duration::from_millis(300));
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let s = seen.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().prefetch(20).inline(true))
        .unwrap()
        .start(move |m: &Message| {
            s.lock().unwrap().insert(m.id().to_string());
            Ok(Outcome::Accept)
        })
        .unwrap();
    let first = publish_n(&direct, &q, 100, true);
    assert!(eventually(WAIT, || seen.lock().unwrap().len() >= 30));
    proxy.cut();
    let second = publish_n(&direct, &q, 100, true);
    let all: HashSet<String> = first.into_iter().chain(second).collect();
    assert!(
        eventually(WAIT, || all.is_subset(&seen.lock().unwrap())
            && direct.queue_info(&q).unwrap().message_count == 0),
        "handled {} of 200 after the cut",
        seen.lock().unwrap().len()
    );
    assert!(
        eventually(WAIT, || consumer.in_flight() == 0),
        "everything taken is settled ({} in flight)",
        consumer.in_flight()
    );
    consumer.close().unwrap();
    let _ = conn.close();
    assert!(
        eventually(WAIT, || {
            let info = direct.queue_info(&q).unwrap();
            info.message_count == 0 && info.consumer_count == 0
        }),
        "everything acknowledged, nothing left unsettled"
    );
}

#[test]
fn inline_handling_refuses_what_needs_a_worker_with_a_clear_error() {
    let (conn, _clean, q) = support::declared_consumed_queue("inline-refused");
    let expect_invalid = |r: Result<acemq_amqp::Consumer, Error>, says: &str| match r {
        Err(e @ Error::InvalidArgument { .. }) => {
            assert!(e.to_string().contains(says), "{e}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    expect_invalid(
        conn.consumer(&q, ConsumerOptions::new().concurrency(4).inline(true)),
        "concurrency must be 1, not 4",
    );
    expect_invalid(
        conn.consumer(&q, ConsumerOptions::new().at_most_once().inline(true)),
        "cannot be at most once",
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().inline(true))
        .unwrap();
    let by_body = ordered(
        |m: &Message| Some(String::from_utf8_lossy(&m.body).into_owned()),
        |_: &Message| Ok(Outcome::Accept),
    );
    match consumer.start(by_body) {
        Err(e @ Error::InvalidArgument { .. }) => {
            assert!(e.to_string().contains("ordered handler"), "{e}")
        }
        Err(e) => panic!("expected InvalidArgument, got {e}"),
        Ok(_) => panic!("an ordered handler started inline"),
    }
    assert_eq!(
        conn.queue_info(&q).unwrap().consumer_count,
        0,
        "nothing subscribed"
    );
}

/// The scoped form: the handler, borrowing local state, runs on the thread that called `run`,
/// and a stop ends it with everything settled.
#[test]
fn the_scoped_form_runs_an_inline_handler_on_the_calling_thread() {
    let (conn, _clean, q) = support::declared_consumed_queue("inline-scoped");
    let ids = publish_n(&conn, &q, 50, true);
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().inline(true))
        .unwrap();
    let stop = consumer.stop_handle();
    let seen = Mutex::new(Vec::new()); // a local, borrowed by the handler
    let handler = |m: &Message| {
        let on = std::thread::current().id();
        seen.lock().unwrap().push((m.id().to_string(), on));
        Ok(Outcome::Accept)
    };
    let (report, runner) = std::thread::scope(|s| {
        let running = s.spawn(|| (consumer.run(&handler), std::thread::current().id()));
        assert!(eventually(WAIT, || seen.lock().unwrap().len() == 50));
        stop.stop();
        running.join().unwrap()
    });
    let report = report.unwrap();
    assert_eq!((report.abandoned, report.requeued), (0, 0), "{report:?}");
    let seen = seen.into_inner().unwrap();
    assert!(
        seen.iter().all(|(_, on)| *on == runner),
        "every handler ran on the thread that called run"
    );
    let got: Vec<String> = seen.into_iter().map(|(id, _)| id).collect();
    assert_eq!(got, ids, "in order, each once");
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}
