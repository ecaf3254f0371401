//! The consumer group against the real broker: work spread over the members, each message once,
//! a failed start closes the members already running, close sums the members' reports.
//!
//! The queues are classic: a classic queue counts a consumer off as soon as its cancel is
//! answered, so `consumer_count` can be asserted right after a close; a quorum queue (RabbitMQ
//! 3.10) applies the cancel through its log and may report it a moment later, and ignores an
//! exclusive consume.

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::consumer_group::{ConsumerGroup, ConsumerGroupOptions};
use acemq_amqp::{ConnectionOptions, ConsumerOptions, Error, Message, Outcome, QueueSpec};
use support::{amqp_url, connect, connect_with, eventually, publish_n, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn a_group_of_four_handles_400_messages_each_once_spread_over_its_members() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("group-spread"), &[]);
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
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
    // Published once every member is subscribed: the broker spreads them round-robin.
    let ids = publish_n(&conn, &q, 400, false);
    assert!(
        eventually(WAIT, || seen.lock().unwrap().len() >= 400),
        "handled {} of 400",
        seen.lock().unwrap().len()
    );
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
    assert!(
        threads.len() > 1,
        "the work went to one member only: {threads:?}"
    );
    let members: HashSet<String> = (1..=4).map(|k| format!("acemq-worker-{k}-0")).collect();
    assert!(
        threads.is_subset(&members),
        "handler threads are named after their member: {threads:?}"
    );

    let info = conn.queue_info(&q).unwrap();
    assert_eq!(info.message_count, 0, "nothing left on the queue");
    assert_eq!(info.consumer_count, 0, "no member left subscribed");
}

#[test]
fn a_group_whose_second_consumer_fails_to_start_closes_the_first_and_returns_the_error() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("group-fail"), &[]);
    // Classic: RabbitMQ 3.10 ignores an exclusive consume on a quorum queue (module docs).
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    publish_n(&conn, &q, 10, false);
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    // Exclusive: member 1 subscribes, member 2 is refused by the broker.
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
    assert!(
        error.to_string().contains("exclusive use"),
        "the broker's refusal of member 2: {error}"
    );
    // Member 1 was closed before the error came back: nobody holds the queue or its messages.
    let info = conn.queue_info(&q).unwrap();
    assert_eq!(info.consumer_count, 0, "member 1 was closed");
    assert_eq!(
        info.message_count as usize + handled.load(Ordering::SeqCst),
        10,
        "every message is either handled and acknowledged or back on the queue"
    );
}

/// A connection allowed at most `channels` channels at once.
fn connect_allowing(channels: u16) -> acemq_amqp::Connection {
    connect_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .channel_max(channels),
    )
}

#[test]
fn a_group_whose_third_consumer_fails_to_start_closes_the_two_running_and_returns_the_error() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("group-third"), &[]);
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let options = ConsumerOptions::new().prefetch(4).declare(false);
    let accept = |_: &Message| -> acemq_amqp::HandlerResult { Ok(Outcome::Accept) };
    // The fewest channels a connection needs to run a group of two (found by trying, on a fresh
    // connection each time, so nothing here assumes how many channels a member holds). On such
    // a connection members 1 and 2 start and member 3 finds no channel left: the broker-agreed
    // channel limit refuses exactly the third.
    let budget = (1..=32u16)
        .find(|&channels| {
            let limited = connect_allowing(channels);
            let started = ConsumerGroup::new(
                &limited,
                &q,
                ConsumerGroupOptions::new()
                    .members(2)
                    .consumer(options.clone()),
            )
            .and_then(|group| group.start(accept));
            let fits = started.map(|group| group.close().unwrap()).is_ok();
            limited.close().unwrap();
            fits
        })
        .expect("a group of two starts within 32 channels");

    publish_n(&conn, &q, 20, false);
    let limited = connect_allowing(budget);
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let result = ConsumerGroup::new(
        &limited,
        &q,
        ConsumerGroupOptions::new().members(3).consumer(options),
    )
    .and_then(|group| {
        group.start(move |_: &Message| {
            h.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        })
    });
    let error = result.expect_err("the third member has no channel to consume on");
    assert!(
        error.to_string().contains("no more channel ids"),
        "member 3's error comes back as it is: {error}"
    );
    // Members 1 and 2 were closed before the error came back: nobody holds the queue or its
    // messages, and the connection is still usable.
    let info = conn.queue_info(&q).unwrap();
    assert_eq!(info.consumer_count, 0, "members 1 and 2 were closed");
    assert_eq!(
        info.message_count as usize + handled.load(Ordering::SeqCst),
        20,
        "every message is either handled and acknowledged or back on the queue"
    );
    assert!(
        limited.is_connected(),
        "a refused channel does not cost the connection"
    );
    let group = ConsumerGroup::new(
        &limited,
        &q,
        ConsumerGroupOptions::new()
            .members(2)
            .consumer(ConsumerOptions::new().prefetch(4).declare(false)),
    )
    .and_then(|group| group.start(|_: &Message| Ok(Outcome::Accept)))
    .expect("the same connection still runs a group of two");
    assert!(eventually(WAIT, || conn
        .queue_info(&q)
        .unwrap()
        .message_count
        == 0));
    group.close().unwrap();
    limited.close().unwrap();
}

#[test]
fn closing_a_group_sums_the_members_reports_and_settles_everything() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("group-close"), &[]);
    conn.declare_queue(&QueueSpec::new(&q).classic()).unwrap();
    let running = Arc::new(AtomicUsize::new(0));
    let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
    let r = running.clone();
    // Two members, one worker and a prefetch of 4 each: 8 messages fill both windows, each
    // member runs one handler (blocked until released) and holds 3 it has not started.
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
            let _ = release_rx.recv();
            Ok(Outcome::Accept)
        })
    })
    .unwrap();
    publish_n(&conn, &q, 8, false);
    assert!(eventually(WAIT, || running.load(Ordering::SeqCst) == 2
        && conn.queue_info(&q).unwrap().message_count == 0));
    assert_eq!(group.in_flight(), 8);

    let closing = std::thread::spawn(move || group.close());
    // Both members requeue what they had not started (3 each) and wait for their handler.
    assert!(eventually(WAIT, || conn
        .queue_info(&q)
        .unwrap()
        .message_count
        == 6));
    drop(release_tx);
    let report = closing.join().unwrap().unwrap();
    assert_eq!(report.finished_in_time, 2);
    assert_eq!(report.requeued, 6);
    assert_eq!(report.abandoned, 0);

    let info = conn.queue_info(&q).unwrap();
    assert_eq!(info.message_count, 6, "the 2 handled were acknowledged");
    assert_eq!(info.consumer_count, 0);
    assert_eq!(running.load(Ordering::SeqCst), 2, "nothing ran after close");
}

#[test]
fn a_group_of_zero_is_refused_and_starts_nothing() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("group-zero"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let result = ConsumerGroup::new(&conn, &q, ConsumerGroupOptions::new().members(0))
        .and_then(|group| group.start(|_: &Message| Ok(Outcome::Accept)));
    assert!(matches!(result, Err(Error::InvalidArgument { .. })));
    assert_eq!(conn.queue_info(&q).unwrap().consumer_count, 0);
}
