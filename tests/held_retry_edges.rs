//! A retry held in the consumer (a wait under the broker-wait threshold, spent in the timer
//! thread with the original unacknowledged) whose copy the broker will not take when it comes
//! due: the original must back off and be counted as the worker's own failed copies are, never
//! be put back at once round and round (invariant 5, "nothing spins").

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::{ConsumerOptions, Message, Outcome, RetryPolicy};
use support::observe::CopyFailures;
use support::{eventually, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

/// A consumer of a queue that holds at most one ready message and refuses (nacks) publishes
/// past that (`x-overflow: reject-publish`), with message A's retry held in the consumer and B
/// filling the queue before A's copy comes due.
struct Refused {
    // (Fields drop in this order: the consumer, then the clean-up of its queues.)
    consumer: acemq_amqp::RunningConsumer,
    _clean: Cleanup,
    conn: acemq_amqp::Connection,
    q: String,
    a_id: String,
    calls: Arc<AtomicUsize>,
    /// (body, attempt) of each handler call.
    attempts: Arc<Mutex<Vec<(String, u32)>>>,
    observer: Arc<CopyFailures>,
}

/// A is delivered (prefetch 1) and its handler asks for a retry waited out in the consumer; its
/// first call waits (bounded) until B is published, so that A's held copy comes due with the
/// queue full — and it stays full: B is never delivered while A holds the only prefetch slot.
/// The handler accepts from attempt 2 on.
fn refused_held_retry(what: &str, shutdown_timeout: Duration) -> Refused {
    let _ = env_logger::try_init();
    let observer = Arc::new(CopyFailures::default());
    let conn = support::connect_observed(observer.clone());
    let (clean, q) = support::consumed_queue_on(&conn, what, support::full_at_one);
    let publisher = conn.publisher().unwrap();
    let a = Message::new("a");
    let a_id = a.id().to_string();
    publisher.publish("", &q, a).unwrap();

    let (filled, wait_filled) = crossbeam_channel::bounded::<()>(1);
    let calls = Arc::new(AtomicUsize::new(0));
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let (c, seen) = (calls.clone(), attempts.clone());
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .prefetch(1)
                .concurrency(1)
                .shutdown_timeout(shutdown_timeout)
                .retry(RetryPolicy::fixed(5, Duration::from_millis(50)).jitter(0.0)),
        )
        .unwrap()
        .start(move |m: &Message| {
            if c.fetch_add(1, Ordering::SeqCst) == 0 {
                let _ = wait_filled.recv_timeout(WAIT);
            }
            seen.lock().unwrap().push((
                String::from_utf8_lossy(&m.body).into_owned(),
                m.envelope.attempt,
            ));
            if m.envelope.attempt >= 2 {
                Ok(Outcome::Accept)
            } else {
                Ok(Outcome::retry("not yet"))
            }
        })
        .unwrap();
    assert!(eventually(WAIT, || calls.load(Ordering::SeqCst) >= 1));
    publisher.publish("", &q, Message::new("b")).unwrap();
    filled.send(()).unwrap();
    Refused {
        conn,
        _clean: clean,
        q,
        a_id,
        consumer,
        calls,
        attempts,
        observer,
    }
}

/// A's held copy is nacked for as long as B sits on the queue. Before the fix the timer
/// requeued A at once: A came straight back, was handled, held and refused again (the bound of
/// 6 handler calls was passed in under half a second). Now the original backs off as a failed
/// copy does (1 s, doubling), each failure is reported as `copy_failed`, and once the queue has
/// room again A's retry goes through — never dead-lettered, as a refusal that may clear is
/// waited out.
#[test]
fn a_held_retry_the_queue_refuses_backs_off_instead_of_spinning() {
    let r = refused_held_retry("held-refused", Duration::from_secs(30));
    // Six seconds of requeueing at once is hundreds of runs; with the back-off (pauses of at
    // least 0.5 s, 1 s, 2 s, … between runs) at most a handful.
    let started = Instant::now();
    let hot = eventually(Duration::from_secs(6), || {
        r.calls.load(Ordering::SeqCst) > 6
    });
    let runs = r.calls.load(Ordering::SeqCst);
    assert!(
        !hot,
        "A was handled {runs} times in {:?} while its held copy was refused: a hot loop",
        started.elapsed()
    );
    let failures = r.observer.0.lock().unwrap().clone();
    assert!(
        !failures.is_empty(),
        "the observer heard about the refused copy"
    );
    assert!(
        failures
            .iter()
            .all(|f| f.contains(&r.a_id) && f.contains("nacked")),
        "{failures:?}"
    );

    // Room again (B taken off the queue): A's retry goes through and is handled on attempt 2.
    let b = r.conn.get(&r.q).unwrap().expect("B is still on the queue");
    assert_eq!(String::from_utf8_lossy(&b.body), "b");
    assert!(
        eventually(Duration::from_secs(40), || r
            .attempts
            .lock()
            .unwrap()
            .iter()
            .any(|(body, attempt)| body == "a" && *attempt == 2)),
        "A's retry arrived: {:?}",
        r.attempts.lock().unwrap()
    );
    assert!(eventually(WAIT, || r.consumer.in_flight() == 0
        && r.conn.queue_info(&r.q).unwrap().message_count == 0));
    let report = r.consumer.close().unwrap();
    assert_eq!(report.abandoned, 0);
    assert_eq!(
        r.conn
            .queue_info(&acemq_amqp::dead_letter_queue(&r.q))
            .unwrap()
            .message_count,
        0,
        "not dead-lettered"
    );
}

/// Closing while A's original is held for its copy-failure pause puts it back at once (the
/// timer's stop requeues what it holds), unchanged: the close does not wait out the pause nor
/// the shutdown timeout, and nothing is lost or copied.
#[test]
fn closing_while_a_refused_held_retry_backs_off_puts_the_original_back() {
    let r = refused_held_retry("held-refused-close", Duration::from_secs(20));
    assert!(
        eventually(WAIT, || r.observer.0.lock().unwrap().len() >= 2),
        "A's held copy was refused twice"
    );
    let started = Instant::now();
    let report = r.consumer.close().unwrap();
    let took = started.elapsed();
    assert_eq!(report.abandoned, 0);
    assert!(took < Duration::from_secs(10), "the close took {took:?}");
    // A (back, unacknowledged no more) and B.
    assert!(
        eventually(WAIT, || r.conn.queue_info(&r.q).unwrap().message_count == 2),
        "{:?}",
        r.conn.queue_info(&r.q).unwrap()
    );
    let first = r.conn.get(&r.q).unwrap().expect("A");
    assert_eq!(first.id(), r.a_id);
    assert_eq!(first.envelope.attempt, 1, "put back unchanged");
    assert_eq!(
        r.conn
            .queue_info(&acemq_amqp::dead_letter_queue(&r.q))
            .unwrap()
            .message_count,
        0
    );
}
