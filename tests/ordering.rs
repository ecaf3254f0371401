//! Ordered dispatch, partitions and at-most-once on the real broker.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::patterns::ordering::{by_header, ordered, partition, partitioned_routing_key};
use acemq_amqp::testing::FaultProxy;
use acemq_amqp::{
    dead_letter_queue, ConnectionOptions, ConsumerOptions, Message, Outcome, PublisherOptions,
    QueueSpec, RetryPolicy,
};
use support::{connect, connect_with, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

/// Publishes one message per `(key, seq)` to `queue`, body = seq, header `k` = key (none when
/// the key is empty), confirmed; returns the ids in order.
fn publish_keyed(
    conn: &acemq_amqp::Connection,
    queue: &str,
    items: &[(String, usize)],
) -> Vec<String> {
    let publisher = conn
        .publisher_with(PublisherOptions::new().window(1000))
        .unwrap();
    let mut tickets = Vec::new();
    let mut ids = Vec::new();
    for (key, seq) in items {
        let mut m = Message::new(seq.to_string());
        if !key.is_empty() {
            m = m.with_header("k", key.as_str());
        }
        ids.push(m.id().to_string());
        tickets.push(publisher.publish_deferred("", queue, m).unwrap());
        if tickets.len() >= 500 {
            for t in tickets.drain(..) {
                t.wait().unwrap();
            }
        }
    }
    for t in tickets {
        t.wait().unwrap();
    }
    publisher.close().unwrap();
    ids
}

fn key_of(m: &Message) -> String {
    m.headers
        .get("k")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string()
}

fn seq_of(m: &Message) -> usize {
    String::from_utf8_lossy(&m.body).parse().unwrap()
}

/// What the handlers of one test saw.
#[derive(Default)]
struct Trace {
    /// Per key, the seqs in the order their handlers started.
    order: Mutex<HashMap<String, Vec<usize>>>,
    /// Handlers running now per key, and the most keys running at once.
    running: Mutex<HashMap<String, usize>>,
    max_keys_at_once: AtomicUsize,
    same_key_overlaps: AtomicUsize,
    done: AtomicUsize,
}

impl Trace {
    fn enter(&self, key: &str, seq: usize) {
        self.order
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .push(seq);
        let mut running = self.running.lock().unwrap();
        let n = running.entry(key.to_string()).or_insert(0);
        *n += 1;
        if *n > 1 {
            self.same_key_overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let keys = running.values().filter(|n| **n > 0).count();
        self.max_keys_at_once.fetch_max(keys, Ordering::SeqCst);
    }

    fn leave(&self, key: &str) {
        *self.running.lock().unwrap().get_mut(key).unwrap() -= 1;
        self.done.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn two_thousand_messages_over_twenty_keys_keep_per_key_order_with_keys_in_parallel() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("ordered-2000"), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let items: Vec<(String, usize)> = (0..2000).map(|i| (format!("key-{}", i % 20), i)).collect();
    publish_keyed(&conn, &q, &items);

    let trace = Arc::new(Trace::default());
    let t = trace.clone();
    let handler = ordered(by_header("k"), move |m: &Message| {
        let key = key_of(m);
        t.enter(&key, seq_of(m));
        std::thread::sleep(Duration::from_micros(500));
        t.leave(&key);
        Ok(Outcome::Accept)
    });
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(8).prefetch(200))
        .unwrap()
        .start(handler)
        .unwrap();
    assert!(
        eventually(WAIT, || trace.done.load(Ordering::SeqCst) == 2000),
        "handled {} of 2000",
        trace.done.load(Ordering::SeqCst)
    );
    let report = consumer.close().unwrap();
    assert_eq!(report.abandoned, 0);

    assert_eq!(
        trace.same_key_overlaps.load(Ordering::SeqCst),
        0,
        "two handlers of one key never ran at once"
    );
    let order = trace.order.lock().unwrap();
    assert_eq!(order.len(), 20);
    for (key, seqs) in order.iter() {
        let expected: Vec<usize> = items
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, &expected, "key {key} handled in delivery order");
    }
    let overlap = trace.max_keys_at_once.load(Ordering::SeqCst);
    println!("most keys in flight at once: {overlap}");
    assert!(
        overlap > 1,
        "different keys ran at once (most at once: {overlap})"
    );
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

/// The ordering set on the consumer's options holds whatever wraps the handler: here a closure
/// around a closure, which would hide an `ordered` handler's `Handler::ordering`.
#[test]
fn ordering_on_the_options_holds_behind_a_wrapper_that_forwards_nothing() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("ordered-options"), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let items: Vec<(String, usize)> = (0..400).map(|i| (format!("key-{}", i % 8), i)).collect();
    publish_keyed(&conn, &q, &items);

    let trace = Arc::new(Trace::default());
    let t = trace.clone();
    let inner = move |m: &Message| {
        let key = key_of(m);
        t.enter(&key, seq_of(m));
        std::thread::sleep(Duration::from_micros(500));
        t.leave(&key);
        Ok(Outcome::Accept)
    };
    let wrapper = move |m: &Message| inner(m);
    let options = ConsumerOptions::new()
        .concurrency(8)
        .prefetch(200)
        .ordering(acemq_amqp::OrderBy::new(by_header("k")));
    let consumer = conn.consumer(&q, options).unwrap().start(wrapper).unwrap();
    assert!(
        eventually(WAIT, || trace.done.load(Ordering::SeqCst) == 400),
        "handled {} of 400",
        trace.done.load(Ordering::SeqCst)
    );
    consumer.close().unwrap();
    assert_eq!(
        trace.same_key_overlaps.load(Ordering::SeqCst),
        0,
        "two handlers of one key never ran at once"
    );
    let order = trace.order.lock().unwrap();
    for (key, seqs) in order.iter() {
        let expected: Vec<usize> = items
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, &expected, "key {key} handled in delivery order");
    }
}

#[test]
fn one_slow_key_does_not_stall_the_others() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("ordered-hot"), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    // The slow key's hundred first: a blocking wrapper would sit its workers on key A.
    let mut items: Vec<(String, usize)> = (0..100).map(|i| ("A".to_string(), i)).collect();
    items.extend((100..200).map(|i| ("B".to_string(), i)));
    publish_keyed(&conn, &q, &items);

    let a_done = Arc::new(AtomicUsize::new(0));
    let b_done = Arc::new(AtomicUsize::new(0));
    let a_done_when_b_finished = Arc::new(Mutex::new(None));
    let (a, b, w) = (
        a_done.clone(),
        b_done.clone(),
        a_done_when_b_finished.clone(),
    );
    let handler = ordered(by_header("k"), move |m: &Message| {
        if key_of(m) == "A" {
            std::thread::sleep(Duration::from_millis(10));
            a.fetch_add(1, Ordering::SeqCst);
        } else if b.fetch_add(1, Ordering::SeqCst) + 1 == 100 {
            *w.lock().unwrap() = Some(a.load(Ordering::SeqCst));
        }
        Ok(Outcome::Accept)
    });
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(4).prefetch(250))
        .unwrap()
        .start(handler)
        .unwrap();
    assert!(eventually(WAIT, || a_done.load(Ordering::SeqCst) == 100));
    consumer.close().unwrap();
    let at = a_done_when_b_finished.lock().unwrap().expect("B finished");
    println!("key A had finished {at} of 100 when key B finished its 100");
    assert!(
        at < 50,
        "key B's 100 finished while key A was still early on ({at} of 100 done)"
    );
}

#[test]
fn messages_without_a_key_are_not_serialised() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("ordered-nokey"), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    // Half without the header, half with it empty: neither is one shared key.
    let items: Vec<(String, usize)> = (0..20).map(|i| (String::new(), i)).collect();
    publish_keyed(&conn, &q, &items);
    let publisher = conn.publisher().unwrap();
    for i in 20..40 {
        publisher
            .publish("", &q, Message::new(i.to_string()).with_header("k", ""))
            .unwrap();
    }

    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let (r, mo, d) = (running.clone(), most.clone(), done.clone());
    let handler = ordered(by_header("k"), move |_: &Message| {
        let now = r.fetch_add(1, Ordering::SeqCst) + 1;
        mo.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        r.fetch_sub(1, Ordering::SeqCst);
        d.fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::Accept)
    });
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(8).prefetch(64))
        .unwrap()
        .start(handler)
        .unwrap();
    assert!(eventually(WAIT, || done.load(Ordering::SeqCst) == 40));
    consumer.close().unwrap();
    let most = most.load(Ordering::SeqCst);
    assert!(
        most >= 4,
        "messages with no key run in parallel, never as one shared key (most at once: {most})"
    );
}

/// One consumer-side wait of 300 ms, two attempts, no jitter.
fn one_retry() -> RetryPolicy {
    RetryPolicy::fixed(2, Duration::from_millis(300)).jitter(0.0)
}

/// Key `k`: seq 0 fails its first attempt, 1 and 2 succeed; key `x`: seq 10 always fails, 11
/// succeeds. Returns the accepted (key, seq, attempt) in the order they were accepted, and the
/// queue's `.dlq` count.
fn retry_scenario(hold: bool) -> (Vec<(String, usize, u32)>, u32) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(
        &unique(if hold { "ordered-hold" } else { "ordered-free" }),
        &[],
    );
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
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
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .concurrency(4)
                .prefetch(16)
                .retry(one_retry()),
        )
        .unwrap()
        .start(handler)
        .unwrap();
    let dlq = dead_letter_queue(&q);
    assert!(eventually(WAIT, || accepted.lock().unwrap().len() == 4
        && conn.queue_info(&dlq).unwrap().message_count == 1));
    consumer.close().unwrap();
    let dead = conn.queue_info(&dlq).unwrap().message_count;
    let seen = accepted.lock().unwrap().clone();
    (seen, dead)
}

fn of_key(seen: &[(String, usize, u32)], key: &str) -> Vec<(usize, u32)> {
    seen.iter()
        .filter(|(k, _, _)| k == key)
        .map(|(_, s, a)| (*s, *a))
        .collect()
}

#[test]
fn without_hold_on_retry_a_later_message_overtakes_a_retried_one() {
    let (seen, dead) = retry_scenario(false);
    assert_eq!(
        of_key(&seen, "k"),
        vec![(1, 1), (2, 1), (0, 2)],
        "the retry of seq 0 came back after seqs 1 and 2: the key was free while it waited"
    );
    assert_eq!(of_key(&seen, "x"), vec![(11, 1)]);
    assert_eq!(dead, 1, "seq 10 exhausted its attempts");
}

#[test]
fn with_hold_on_retry_later_messages_wait_until_the_retried_one_settles() {
    let (seen, dead) = retry_scenario(true);
    assert_eq!(
        of_key(&seen, "k"),
        vec![(0, 2), (1, 1), (2, 1)],
        "seqs 1 and 2 waited behind the retry of seq 0"
    );
    assert_eq!(
        of_key(&seen, "x"),
        vec![(11, 1)],
        "seq 11 ran once seq 10 was dead-lettered"
    );
    assert_eq!(dead, 1, "seq 10 exhausted its attempts and went to .dlq");
}

#[test]
fn partition_vectors_match_the_family() {
    let text = std::fs::read_to_string("tests/fixtures/partition.json").unwrap();
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let key = case["key"].as_str().unwrap();
        let n = u32::try_from(case["partitions"].as_u64().unwrap()).unwrap();
        let expected = case["partition"].as_u64().unwrap();
        assert_eq!(
            u64::from(partition(key, n)),
            expected,
            "partition({key:?}, {n})"
        );
        assert_eq!(
            partitioned_routing_key("orders", key, n),
            case["routing_key_of_orders"].as_str().unwrap(),
        );
    }
    assert_eq!(partition("o-1", 8), 0);
    assert_eq!(partition("Ωmega", 7), 3);
}

#[test]
fn at_most_once_a_failing_handler_neither_retries_nor_dead_letters() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("at-most-once"), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let items: Vec<(String, usize)> = (0..6).map(|i| (String::new(), i)).collect();
    publish_keyed(&conn, &q, &items);
    let calls = Arc::new(Mutex::new(BTreeMap::new()));
    let c = calls.clone();
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .concurrency(2)
                .retry(one_retry())
                .at_most_once(),
        )
        .unwrap()
        .start(move |m: &Message| {
            let seq = seq_of(m);
            *c.lock().unwrap().entry(seq).or_insert(0) += 1;
            match seq % 3 {
                0 => Err("boom".into()),
                1 => panic!("a panic loses it too"),
                _ => Ok(Outcome::Accept),
            }
        })
        .unwrap();
    assert!(eventually(WAIT, || consumer.lost() == 4));
    assert!(eventually(WAIT, || calls.lock().unwrap().len() == 6));
    let report = consumer.close().unwrap();
    assert_eq!(report.requeued, 0);
    let calls = calls.lock().unwrap().clone();
    assert!(
        calls.values().all(|n| *n == 1),
        "each message ran once, failures were not retried: {calls:?}"
    );
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    assert_eq!(
        conn.queue_info(&dead_letter_queue(&q))
            .unwrap()
            .message_count,
        0,
        "nothing dead-lettered"
    );
}

#[test]
fn at_most_once_a_consumer_killed_mid_handler_does_not_see_the_message_again() {
    let direct = connect();
    let mut clean = Cleanup::new(&direct);
    let q = clean.consumed_queue(&unique("at-most-once-kill"), &[]);
    direct.declare_queue(&QueueSpec::new(&q)).unwrap();
    let proxy = FaultProxy::start(&support::amqp_url()).expect("fault proxy");
    let conn = connect_with(
        ConnectionOptions::new()
            .address(proxy.url())
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(300)),
    );
    let (started_tx, started_rx) = crossbeam_channel::bounded::<()>(4);
    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(4);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(2).at_most_once())
        .unwrap()
        .start(move |m: &Message| {
            let seq = seq_of(m);
            s.lock().unwrap().push(seq);
            if seq == 0 {
                let _ = started_tx.send(());
                let _ = release_rx.recv_timeout(Duration::from_secs(30));
            }
            Ok(Outcome::Accept)
        })
        .unwrap();
    publish_keyed(&direct, &q, &[(String::new(), 0)]);
    started_rx
        .recv_timeout(WAIT)
        .expect("the handler of message 0 started");
    // Killed mid-handler: the connection is cut while the handler runs.
    proxy.cut();
    assert!(
        eventually(WAIT, || conn.generation() == Some(2)),
        "reconnected"
    );
    // A marker behind it: a requeued message 0 would be delivered before it.
    publish_keyed(&direct, &q, &[(String::new(), 1)]);
    assert!(eventually(WAIT, || seen.lock().unwrap().contains(&1)));
    let _ = release_tx.send(());
    consumer.close().unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![0, 1],
        "message 0 was not delivered again after the consumer died under it"
    );
    assert_eq!(direct.queue_info(&q).unwrap().message_count, 0);
}

#[test]
fn an_ordered_consumer_closes_and_requeues_what_waits_for_its_key() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("ordered-close"), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let items: Vec<(String, usize)> = (0..10).map(|i| ("one".to_string(), i)).collect();
    publish_keyed(&conn, &q, &items);
    let (started_tx, started_rx) = crossbeam_channel::bounded::<()>(16);
    let handler = ordered(by_header("k"), move |_: &Message| {
        let _ = started_tx.send(());
        std::thread::sleep(Duration::from_millis(200));
        Ok(Outcome::Accept)
    });
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(4).prefetch(20))
        .unwrap()
        .start(handler)
        .unwrap();
    started_rx.recv_timeout(WAIT).expect("a handler started");
    assert!(eventually(WAIT, || consumer.in_flight() == 10));
    let began = Instant::now();
    let report = consumer.close().unwrap();
    assert!(began.elapsed() < Duration::from_secs(5));
    assert_eq!(report.abandoned, 0);
    assert_eq!(
        report.finished_in_time, 1,
        "only the key's holder was running"
    );
    assert_eq!(
        report.finished_in_time + report.requeued,
        10,
        "the rest waited for the key and went back: {report:?}"
    );
    assert!(eventually(WAIT, || conn
        .queue_info(&q)
        .unwrap()
        .message_count
        == 9));
}

const KILL_CHILD_QUEUE: &str = "ACEMQ_AT_MOST_ONCE_CHILD_QUEUE";
const KILL_CHILD_MARK: &str = "ACEMQ_AT_MOST_ONCE_CHILD_MARK";

/// The child of the test below (run only by it, with its environment): an at-most-once consumer
/// whose handler marks that it started, then works until the process is killed.
#[test]
#[ignore = "a child process of at_most_once_a_consumer_process_killed_mid_handler_never_sees_the_message_again"]
fn at_most_once_kill_child() {
    let (Ok(q), Ok(mark)) = (
        std::env::var(KILL_CHILD_QUEUE),
        std::env::var(KILL_CHILD_MARK),
    ) else {
        panic!("run only by its parent test, which sets {KILL_CHILD_QUEUE} and {KILL_CHILD_MARK}");
    };
    let conn = connect();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(2).at_most_once())
        .unwrap()
        .start(move |_: &Message| {
            std::fs::write(&mark, b"started").unwrap();
            // Working until killed.
            std::thread::sleep(Duration::from_secs(120));
            Ok(Outcome::Accept)
        })
        .unwrap();
    std::thread::sleep(Duration::from_secs(120));
    drop(consumer);
}

/// At most once, for real: the consumer's process is killed with SIGKILL while the handler
/// runs. The delivery was acknowledged before the handler started, so the broker does not hand
/// it out again: the queue is empty and a new consumer sees only what comes after.
#[test]
fn at_most_once_a_consumer_process_killed_mid_handler_never_sees_the_message_again() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("at-most-once-sigkill"), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("started");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "at_most_once_kill_child",
            "--ignored",
            "--nocapture",
        ])
        .env(KILL_CHILD_QUEUE, &q)
        .env(KILL_CHILD_MARK, &mark)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("the child consumer");
    publish_keyed(&conn, &q, &[(String::new(), 0)]);
    let started = eventually(WAIT, || mark.exists());
    child.kill().expect("SIGKILL the child");
    let _ = child.wait();
    assert!(started, "the child's handler started on message 0");
    // The killed process's connection is gone once the broker has dropped its consumer.
    assert!(
        eventually(WAIT, || conn.queue_info(&q).unwrap().consumer_count == 0),
        "the broker noticed the child's death"
    );
    assert_eq!(
        conn.queue_info(&q).unwrap().message_count,
        0,
        "message 0 is not back in the queue"
    );
    // A new consumer sees what comes after, and never message 0.
    publish_keyed(&conn, &q, &[(String::new(), 1)]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().at_most_once())
        .unwrap()
        .start(move |m: &Message| {
            s.lock().unwrap().push(seq_of(m));
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().contains(&1)));
    consumer.close().unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![1], "message 0 never came back");
}
