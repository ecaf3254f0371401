//! Dead-letter replay on the real broker: filter, limit, deadline, restart, stamps, declined
//! messages kept in order, a deleted target, volume, and a replay killed mid-pass.

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::observe::Observer;
use acemq_amqp::observe::ReplayEvent;
use acemq_amqp::patterns::replay::{replay, ReplayOptions, Stopped};
use acemq_amqp::{
    dead_letter_queue, headers, Binding, Connection, ConsumerOptions, Error, ExchangeSpec,
    HandlerResult, HeaderValue, Message, Outcome, QueueSpec, RetryPolicy,
};
use support::{connect, eventually, publish_n, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

/// Every message on `queue`, taken off it (acknowledged) in order.
fn drain(conn: &Connection, queue: &str) -> Vec<Message> {
    let mut out = Vec::new();
    while let Some(m) = conn.get(queue).expect("get") {
        out.push(m);
    }
    out
}

fn ids_of(messages: &[Message]) -> Vec<String> {
    messages.iter().map(|m| m.id().to_string()).collect()
}

fn count(conn: &Connection, queue: &str) -> u32 {
    conn.queue_info(queue).expect("queue info").message_count
}

/// A work queue `q` bound to a direct exchange on `key`, with its `.dlq`; `n` messages published
/// through the exchange are dead-lettered by a consumer that fails them (two attempts, so they
/// arrive on `.dlq` at attempt 2 with an error). Returns (queue, exchange, ids in order).
fn dead_letters(conn: &Connection, clean: &mut Cleanup, n: usize) -> (String, String, Vec<String>) {
    let q = clean.consumed_queue(&unique("replay"), &[]);
    let x = clean.exchange(&unique("replay-x"));
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    conn.declare_exchange(&ExchangeSpec::direct(&x)).unwrap();
    conn.bind(
        &Binding::new()
            .queue(&q)
            .exchange(&x)
            .routing_key("order.placed"),
    )
    .unwrap();
    let publisher = conn.publisher().unwrap();
    let ids: Vec<String> = (0..n)
        .map(|i| {
            let m = Message::new(format!("{i}"));
            let id = m.id().to_string();
            publisher.publish(&x, "order.placed", m).unwrap();
            id
        })
        .collect();
    let policy = RetryPolicy::fixed(2, Duration::from_millis(10));
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .retry(policy)
                .concurrency(1)
                .prefetch(1),
        )
        .unwrap()
        .start(|_: &Message| -> HandlerResult { Err("the bug".into()) })
        .unwrap();
    let dlq = dead_letter_queue(&q);
    assert!(
        eventually(WAIT, || count(conn, &dlq) == n as u32),
        "every message dead-lettered"
    );
    consumer.close().unwrap();
    publisher.close().unwrap();
    (q, x, ids)
}

#[test]
fn a_replay_sends_dead_letters_back_where_they_were_published_stamped_and_restarted() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, x, ids) = dead_letters(&conn, &mut clean, 3);
    let dlq = dead_letter_queue(&q);
    let before = drain(&conn, &dlq);
    assert_eq!(before[0].envelope.attempt, 2);
    assert!(before[0].envelope.error.is_some());
    assert_eq!(
        before[0].headers.get(headers::ORIGINAL_EXCHANGE),
        Some(&HeaderValue::Text(x.clone())),
        "the consumer recorded where the message was first published"
    );
    // Put them back on `.dlq` as they were, then replay.
    let publisher = conn.publisher().unwrap();
    for m in before {
        let mut copy = m.clone();
        copy.received = None;
        copy.properties = None;
        publisher.publish("", &dlq, copy).unwrap();
    }

    let report = replay(&conn, &dlq, ReplayOptions::default()).run().unwrap();
    assert_eq!((report.moved, report.skipped), (3, 0));
    assert_eq!(report.stopped, Stopped::Drained);
    assert_eq!(report.to_string(), "moved 3, skipped 0 (drained)");
    assert_eq!(count(&conn, &dlq), 0);
    let back = drain(&conn, &q);
    assert_eq!(ids_of(&back), ids, "back on the work queue, in order");
    for m in &back {
        let r = m.received.as_ref().unwrap();
        assert_eq!(
            (r.exchange.as_str(), r.routing_key.as_str()),
            (x.as_str(), "order.placed")
        );
        assert_eq!(m.envelope.attempt, 1, "restarted");
        assert_eq!(m.envelope.error, None, "error cleared");
        assert_eq!(
            m.headers.get(headers::REPLAYED_FROM),
            Some(&HeaderValue::Text(dlq.clone()))
        );
        assert_eq!(
            m.headers.get(headers::REPLAY_COUNT),
            Some(&HeaderValue::Int(1))
        );
        let at = m.headers[headers::REPLAYED_AT]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            at.len() == 20 && at.ends_with('Z') && at.as_bytes()[10] == b'T',
            "RFC 3339 as the family writes it: {at}"
        );
    }

    // Dead-lettered again and replayed without restarting: attempt and error kept, count 2.
    let publisher2 = conn.publisher().unwrap();
    for m in &back {
        let mut copy = m.clone();
        copy.received = None;
        copy.properties = None;
        copy.envelope.attempt = 2;
        copy.envelope.error = Some("exhausted 2 attempts: again".into());
        publisher2.publish("", &dlq, copy).unwrap();
    }
    let report = replay(&conn, &dlq, ReplayOptions::default().restart(false))
        .run()
        .unwrap();
    assert_eq!(report.moved, 3);
    for m in drain(&conn, &q) {
        assert_eq!(m.envelope.attempt, 2);
        assert_eq!(
            m.envelope.error.as_deref(),
            Some("exhausted 2 attempts: again")
        );
        assert_eq!(
            m.headers.get(headers::REPLAY_COUNT),
            Some(&HeaderValue::Int(2))
        );
    }
    publisher.close().unwrap();
    publisher2.close().unwrap();
}

/// A queue and its `.dlq` (classic) holding `n` messages with bodies 0..n.
fn loaded_dlq(conn: &Connection, clean: &mut Cleanup, n: usize) -> (String, String, Vec<String>) {
    let q = clean.consumed_queue(&unique("replay"), &[]);
    let dlq = dead_letter_queue(&q);
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    conn.declare_queue(&QueueSpec::new(&dlq).classic()).unwrap();
    let ids = publish_n(conn, &dlq, n, true);
    (q, dlq, ids)
}

#[test]
fn a_filter_moves_only_what_it_accepts_and_the_rest_stay_in_their_order() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, dlq, ids) = loaded_dlq(&conn, &mut clean, 10);
    let report = replay(
        &conn,
        &dlq,
        ReplayOptions::default()
            .only(|_, body| std::str::from_utf8(body).unwrap().parse::<u32>().unwrap() % 2 == 0),
    )
    .run()
    .unwrap();
    assert_eq!((report.moved, report.skipped), (5, 5));
    assert_eq!(report.stopped, Stopped::Drained);
    let evens: Vec<String> = ids.iter().step_by(2).cloned().collect();
    let odds: Vec<String> = ids.iter().skip(1).step_by(2).cloned().collect();
    assert_eq!(ids_of(&drain(&conn, &q)), evens);
    assert_eq!(
        ids_of(&drain(&conn, &dlq)),
        odds,
        "declined ones kept their order"
    );
}

#[test]
fn a_limit_stops_the_pass_and_a_window_bounds_what_is_held() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, dlq, ids) = loaded_dlq(&conn, &mut clean, 10);
    let report = replay(&conn, &dlq, ReplayOptions::default().limit(4))
        .run()
        .unwrap();
    assert_eq!((report.moved, report.stopped), (4, Stopped::Limit));
    assert_eq!(count(&conn, &q), 4);
    assert_eq!(count(&conn, &dlq), 6);

    // Declining everything, a window of 3 stops after holding 3, and gives them back.
    let report = replay(
        &conn,
        &dlq,
        ReplayOptions::default().only(|_, _| false).window(3),
    )
    .run()
    .unwrap();
    assert_eq!((report.skipped, report.stopped), (3, Stopped::Window));
    assert_eq!(ids_of(&drain(&conn, &dlq)), ids[4..].to_vec());
}

#[test]
fn a_deadline_stops_the_pass_between_messages() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, dlq, _) = loaded_dlq(&conn, &mut clean, 20);
    let report = replay(
        &conn,
        &dlq,
        ReplayOptions::default().deadline(Duration::ZERO),
    )
    .run()
    .unwrap();
    assert_eq!((report.moved, report.stopped), (0, Stopped::Deadline));
    // A filter that takes 50 ms a message against a 300 ms deadline: stops part way.
    let report = replay(
        &conn,
        &dlq,
        ReplayOptions::default()
            .deadline(Duration::from_millis(300))
            .only(|_, _| {
                std::thread::sleep(Duration::from_millis(50));
                true
            }),
    )
    .run()
    .unwrap();
    assert_eq!(report.stopped, Stopped::Deadline);
    assert!(report.moved > 0 && report.moved < 20, "{report}");
    assert_eq!(count(&conn, &q) as u64, report.moved);
    assert_eq!(count(&conn, &dlq) as u64, 20 - report.moved);
}

#[test]
fn a_deleted_target_stops_the_replay_with_its_report_and_nothing_is_lost() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, dlq, ids) = loaded_dlq(&conn, &mut clean, 6);
    conn.delete_queue(&q).unwrap();
    // The first two are declined and held; the third cannot be routed.
    let seen = AtomicUsize::new(0);
    let result = replay(
        &conn,
        &dlq,
        ReplayOptions::default().only(|_, _| seen.fetch_add(1, Ordering::SeqCst) >= 2),
    )
    .run();
    let Err(Error::Replay { report, source }) = result else {
        panic!("expected Error::Replay, got {result:?}");
    };
    assert!(source.is_unroutable(), "{source}");
    assert_eq!((report.moved, report.skipped), (0, 2));
    assert_eq!(report.stopped, Stopped::Failed);
    assert_eq!(
        ids_of(&drain(&conn, &dlq)),
        ids,
        "all still there, in order"
    );
}

#[derive(Default)]
struct Progress(Mutex<Vec<(u64, u64, u64, bool)>>);
impl Observer for Progress {
    fn replay(&self, e: &ReplayEvent<'_>) {
        let r = e.report;
        self.0
            .lock()
            .unwrap()
            .push((r.moved, r.skipped, r.matched, e.finished));
    }
}

#[test]
fn a_dry_run_moves_nothing_and_progress_reaches_the_observer() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, dlq, ids) = loaded_dlq(&conn, &mut clean, 10);
    let progress = Arc::new(Progress::default());
    let report = replay(
        &conn,
        &dlq,
        ReplayOptions::default()
            .dry_run(true)
            .only(|_, body| body != b"3")
            .progress_every(4)
            .observer(progress.clone()),
    )
    .run()
    .unwrap();
    assert_eq!((report.moved, report.matched, report.skipped), (0, 9, 1));
    assert_eq!(
        report.to_string(),
        "dry run: would move 9, skipped 1 (drained)"
    );
    assert_eq!(
        *progress.0.lock().unwrap(),
        vec![(0, 1, 3, false), (0, 1, 7, false), (0, 1, 9, true)]
    );
    assert_eq!(count(&conn, &q), 0);
    assert_eq!(
        ids_of(&drain(&conn, &dlq)),
        ids,
        "everything back, in order"
    );
}

#[test]
fn two_thousand_dead_letters_move_with_none_lost_or_doubled() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, dlq, ids) = loaded_dlq(&conn, &mut clean, 2000);
    let report = replay(&conn, &dlq, ReplayOptions::default()).run().unwrap();
    assert_eq!(report.moved, 2000);
    assert_eq!(count(&conn, &dlq), 0);
    assert_eq!(count(&conn, &q), 2000, "none doubled");
    let got: HashSet<String> = ids_on(&conn, &q, 2000);
    let want: HashSet<String> = ids.into_iter().collect();
    assert_eq!(got, want, "none lost");
}

/// The ids of the `n` messages on `queue`, consumed and acknowledged.
fn ids_on(conn: &Connection, queue: &str, n: usize) -> HashSet<String> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let consumer = conn
        .consumer(queue, ConsumerOptions::new().declare(false).prefetch(200))
        .unwrap()
        .start(move |m: &Message| {
            s.lock().unwrap().push(m.id().to_string());
            Ok(Outcome::Accept)
        })
        .unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().len() >= n));
    consumer.close().unwrap();
    let all = seen.lock().unwrap().clone();
    all.into_iter().collect()
}

/// Runs in a child process (see `a_replay_killed_mid_pass_loses_nothing`).
#[test]
#[ignore = "run as a child process by a_replay_killed_mid_pass_loses_nothing"]
fn replay_child() {
    let Ok(dlq) = std::env::var("ACEMQ_REPLAY_CHILD_DLQ") else {
        return;
    };
    let conn = connect();
    // Slowed so that the parent finds it mid-pass.
    let _ = replay(
        &conn,
        &dlq,
        ReplayOptions::default().only(|_, _| {
            std::thread::sleep(Duration::from_millis(2));
            true
        }),
    )
    .run();
    panic!("the parent should have killed this replay mid-pass");
}

#[test]
fn a_replay_killed_mid_pass_loses_nothing() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (q, dlq, ids) = loaded_dlq(&conn, &mut clean, 2000);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["replay_child", "--exact", "--ignored", "--nocapture"])
        .env("ACEMQ_REPLAY_CHILD_DLQ", &dlq)
        .spawn()
        .unwrap();
    assert!(
        eventually(WAIT, || count(&conn, &q) >= 300),
        "the child is replaying"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(count(&conn, &q) < 2000, "killed mid-pass");
    // The broker takes back what the dead connection held.
    assert!(eventually(WAIT, || {
        count(&conn, &q) + count(&conn, &dlq) >= 2000
            && conn.queue_info(&dlq).unwrap().consumer_count == 0
    }));
    let (moved, left) = (count(&conn, &q) as usize, count(&conn, &dlq) as usize);
    assert!(
        moved + left <= 2001,
        "at most the message in flight doubled"
    );
    let mut got = ids_on(&conn, &q, moved);
    got.extend(ids_on(&conn, &dlq, left));
    let want: HashSet<String> = ids.into_iter().collect();
    assert_eq!(got, want, "nothing lost");
}

#[test]
fn a_message_that_would_go_back_to_its_own_queue_is_refused_and_kept() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("replay-self"));
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    publish_n(&conn, &q, 2, true);
    let result = replay(&conn, &q, ReplayOptions::default()).run();
    let Err(Error::Replay { report, source }) = result else {
        panic!("expected Error::Replay, got {result:?}");
    };
    assert!(matches!(*source, Error::InvalidArgument { .. }), "{source}");
    assert_eq!(report.moved, 0);
    assert_eq!(count(&conn, &q), 2);
    let missing = replay(&conn, &unique("no-such-queue"), ReplayOptions::default()).run();
    assert!(
        matches!(&missing, Err(Error::Replay { source, .. }) if matches!(**source, Error::NotFound { .. })),
        "{missing:?}"
    );
}
