//! A retry held in the consumer (a wait under the broker-wait threshold, spent in the timer
//! thread with the original unacknowledged) whose copy the broker will not take when it comes
//! due: the original must back off and be counted as the worker's own failed copies are, never
//! be put back at once round and round (invariant 5, "nothing spins").

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::Settlement;
use acemq_amqp::{
    ConnectionOptions, ConsumerOptions, Message, Observer, Outcome, QueueSpec, RetryPolicy,
};
use support::{connect_with, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

/// The `copy_failed` settlements the observer hears, with their error text.
#[derive(Default)]
struct CopyFailures(Mutex<Vec<String>>);
impl Observer for CopyFailures {
    fn settled(&self, s: &Settlement<'_>) {
        if s.outcome == "copy_failed" {
            self.0
                .lock()
                .unwrap()
                .push(s.error.unwrap_or_default().to_string());
        }
    }
}

/// The queue holds at most one ready message and refuses (nacks) publishes past that
/// (`x-overflow: reject-publish`). Message A is delivered (prefetch 1) and its handler asks for
/// a retry waited out in the consumer; meanwhile B is published and fills the queue, so A's
/// held copy is nacked when it comes due — for as long as B sits there, and B is never
/// delivered while A holds the only prefetch slot. Before the fix the timer requeued A at
/// once: A came straight back, was handled, held and refused again (hundreds of handler calls
/// a second). Now the original backs off as a failed copy does (1 s, doubling), each failure
/// is reported as `copy_failed`, and once the queue has room again A's retry goes through.
#[test]
fn a_held_retry_the_queue_refuses_backs_off_instead_of_spinning() {
    let _ = env_logger::try_init();
    let observer = Arc::new(CopyFailures::default());
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(observer.clone()),
    );
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("held-refused"), &[]);
    conn.declare_queue(
        &QueueSpec::new(&q)
            .classic()
            .max_length(1)
            .argument("x-overflow", "reject-publish"),
    )
    .unwrap();
    let publisher = conn.publisher().unwrap();
    let a = Message::new("a");
    let a_id = a.id().to_string();
    publisher.publish("", &q, a).unwrap();

    // The first call waits (bounded) until B fills the queue, so A's copy comes due after.
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

    // Six seconds of requeueing at once is hundreds of runs; with the back-off (pauses of at
    // least 0.5 s, 1 s, 2 s, … between runs) at most a handful.
    let started = Instant::now();
    let hot = eventually(Duration::from_secs(6), || calls.load(Ordering::SeqCst) > 6);
    let runs = calls.load(Ordering::SeqCst);
    assert!(
        !hot,
        "A was handled {runs} times in {:?} while its held copy was refused: a hot loop",
        started.elapsed()
    );
    let failures = observer.0.lock().unwrap().clone();
    assert!(
        !failures.is_empty(),
        "the observer heard about the refused copy"
    );
    assert!(
        failures
            .iter()
            .all(|f| f.contains(&a_id) || f.contains("nack")),
        "{failures:?}"
    );

    // Room again (B taken off the queue): A's retry goes through and is handled on attempt 2.
    let b = conn.get(&q).unwrap().expect("B is still on the queue");
    assert_eq!(String::from_utf8_lossy(&b.body), "b");
    assert!(
        eventually(Duration::from_secs(40), || attempts
            .lock()
            .unwrap()
            .iter()
            .any(|(body, attempt)| body == "a" && *attempt == 2)),
        "A's retry arrived: {:?}",
        attempts.lock().unwrap()
    );
    assert!(eventually(WAIT, || consumer.in_flight() == 0
        && conn.queue_info(&q).unwrap().message_count == 0));
    let report = consumer.close().unwrap();
    assert_eq!(report.abandoned, 0);
    // Never dead-lettered: a refusal that may clear is waited out, not given up on.
    assert_eq!(
        conn.queue_info(&acemq_amqp::dead_letter_queue(&q))
            .unwrap()
            .message_count,
        0
    );
}
