//! Ordered dispatch, partitions and at-most-once on the real broker: a slow key does not stall
//! the others, keyless messages are not serialised, the family's partition vectors, an
//! at-most-once consumer killed mid-handler. The scenarios that run the same on the `memory://`
//! broker (per-key order with keys in parallel, `hold_on_retry` or not, an at-most-once handler
//! failing, an ordered consumer closing) are written once, in the on-both
//! `equivalence_consume.rs`.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::ordering::{by_header, ordered, partition, partitioned_routing_key};
use acemq_amqp::{ConsumerOptions, Message, Outcome};
use support::keyed::{key_of, publish_keyed, seq_of};
use support::{connect, eventually};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn one_slow_key_does_not_stall_the_others() {
    let (conn, _clean, q) = support::declared_consumed_queue("ordered-hot");
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
    let (conn, _clean, q) = support::declared_consumed_queue("ordered-nokey");
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
fn at_most_once_a_consumer_killed_mid_handler_does_not_see_the_message_again() {
    let (direct, _clean, q) = support::declared_consumed_queue("at-most-once-kill");
    let (proxy, conn) = support::through_proxy(Duration::from_millis(300));
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
    let (conn, _clean, q) = support::declared_consumed_queue("at-most-once-sigkill");
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

/// The ordering set on the consumer's options holds whatever wraps the handler: here a closure
/// around a closure, which would hide an `ordered` handler's `Handler::ordering`.
#[test]
fn ordering_on_the_options_holds_behind_a_wrapper_that_forwards_nothing() {
    use std::collections::{BTreeMap, BTreeSet};
    let (conn, _clean, q) = support::declared_consumed_queue("ordered-options");
    let items: Vec<(String, usize)> = (0..400).map(|i| (format!("key-{}", i % 8), i)).collect();
    publish_keyed(&conn, &q, &items);

    let running: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let order: Arc<Mutex<BTreeMap<String, Vec<usize>>>> = Arc::default();
    let overlaps = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let (r, o, v, d) = (
        running.clone(),
        order.clone(),
        overlaps.clone(),
        done.clone(),
    );
    let inner = move |m: &Message| {
        let key = key_of(m);
        if !r.lock().unwrap().insert(key.clone()) {
            v.fetch_add(1, Ordering::SeqCst);
        }
        o.lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .push(seq_of(m));
        // The handler's work (not a wait for another thread): long enough for a second handler
        // of the same key to overlap it if the ordering let one start.
        std::thread::sleep(Duration::from_micros(500));
        r.lock().unwrap().remove(&key);
        d.fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::Accept)
    };
    let wrapper = move |m: &Message| inner(m);
    let options = ConsumerOptions::new()
        .concurrency(8)
        .prefetch(200)
        .ordering(acemq_amqp::OrderBy::new(by_header("k")));
    let consumer = conn.consumer(&q, options).unwrap().start(wrapper).unwrap();
    assert!(
        eventually(WAIT, || done.load(Ordering::SeqCst) == 400),
        "handled {} of 400",
        done.load(Ordering::SeqCst)
    );
    consumer.close().unwrap();
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two handlers of one key never ran at once"
    );
    for (key, seqs) in order.lock().unwrap().iter() {
        let expected: Vec<usize> = items
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, &expected, "key {key} handled in delivery order");
    }
}
